#include "session/backend_registry.h"

#include "bonsai/error.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/ref/ref_backend.h"
#if BONSAI_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace bonsai {

std::vector<std::string> backend_names() {
#if BONSAI_HAVE_CUDA
  return {"auto", "ref", "fast", "cpu", "fast-int8", "cuda"};
#else
  return {"auto", "ref", "fast", "cpu", "fast-int8"};
#endif
}

std::unique_ptr<Backend> create_backend(const std::string& path, int n_threads) {
  if (path == "ref") return std::make_unique<RefBackend>();
  // "auto": CUDA when a usable device exists, else the fast CPU path.
  if (path == "auto") {
#if BONSAI_HAVE_CUDA
    if (cuda_device_count() > 0) return std::make_unique<CudaBackend>(0);
#endif
    return create_backend("fast", n_threads);
  }
  // "fast": the CPU kernels at the best ISA this CPU has (BONSAI_ISA=scalar|avx2|avx512 forces one),
  // with faithful (int16-accurate) activations; "fast-int8" trades fidelity for speed.
  if (path == "fast" || path == "cpu")
    return std::make_unique<CpuBackend>(n_threads, select_isa(), cpu::Precision::Faithful);
  if (path == "fast-int8") return std::make_unique<CpuBackend>(n_threads, select_isa(), cpu::Precision::Int8);
#if BONSAI_HAVE_CUDA
  // "cuda": device 0 (CUDA_VISIBLE_DEVICES picks another); fails when no device is usable.
  if (path == "cuda") return std::make_unique<CudaBackend>(0);
#endif
  check_backend_name(path);
  fail("create_backend: path '{}' is listed but not handled", path);  // a bug, not bad input
}

void check_backend_name(const std::string& path) {
  const std::vector<std::string> names = backend_names();
  for (const auto& n : names)
    if (n == path) return;
  std::string list;
  for (const auto& n : names) list += fmt::format("{}{}", list.empty() ? "" : ", ", n);
  if (path == "cuda") usage_fail("compute path 'cuda': this build has no CUDA backend (available: {})", list);
  usage_fail("unknown compute path '{}' (available: {})", path, list);
}

}  // namespace bonsai
