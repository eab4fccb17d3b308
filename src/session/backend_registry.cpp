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

void check_main_gpu(const std::string& path, int main_gpu) {
  if (main_gpu < 0) usage_fail("-mg/--main-gpu must be >= 0 (a CUDA device index), got {}", main_gpu);
#if BONSAI_HAVE_CUDA
  if (path != "cuda" && path != "auto") return;  // the CPU and reference paths ignore it
  // Without a usable device, auto runs on the CPU and cuda fails here, before a model loads, with the
  // reason CudaBackend would give.
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0 && path == "cuda") fail("cuda: no usable device ({})", why);
  if (n > 0 && main_gpu >= n)
    usage_fail("-mg/--main-gpu {}: this machine has {} CUDA device{} (valid: 0..{})", main_gpu, n,
               n == 1 ? "" : "s", n - 1);
#else
  (void)path;
#endif
}

std::unique_ptr<Backend> create_backend(const std::string& path, int n_threads, int main_gpu) {
  check_main_gpu(path, main_gpu);
  if (path == "ref") return std::make_unique<RefBackend>();
  // "auto": CUDA when a usable device exists, else the fast CPU path.
  if (path == "auto") {
#if BONSAI_HAVE_CUDA
    if (cuda_device_count() > 0) return std::make_unique<CudaBackend>(main_gpu);
#endif
    return create_backend("fast", n_threads);
  }
  // "fast": the CPU kernels at the best ISA this CPU has (BONSAI_ISA=scalar|avx2|avx512 forces one),
  // with faithful (int16-accurate) activations; "fast-int8" trades fidelity for speed.
  if (path == "fast" || path == "cpu")
    return std::make_unique<CpuBackend>(n_threads, select_isa(), cpu::Precision::Faithful);
  if (path == "fast-int8") return std::make_unique<CpuBackend>(n_threads, select_isa(), cpu::Precision::Int8);
#if BONSAI_HAVE_CUDA
  // "cuda": device main_gpu (numbered as CUDA_VISIBLE_DEVICES leaves them); fails when no device is
  // usable (CudaBackend says why).
  if (path == "cuda") return std::make_unique<CudaBackend>(main_gpu);
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
