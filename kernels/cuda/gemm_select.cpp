// BONSAI_CUDA_GEMM: which kernel runs the prefill GEMM (kernels/cuda/gemm.h, gemm_kernel);
// BONSAI_CUDA_GEMM_STAGE: the mma.sync kernel's activation staging (gemm_stage).
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string_view>

#include "bonsai/error.h"
#include "kernels/cuda/gemm.h"

namespace bonsai::cuda {

GemmKernel gemm_kernel() {
  static const GemmKernel choice = [] {
    // The wgmma kernel has a body only in the sm_90a build, which the driver runs on compute
    // capability 9.0 exactly; any other device runs the portable PTX, whose wgmma kernel traps.
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    const bool available = major == 9 && minor == 0;
    const char* e = std::getenv("BONSAI_CUDA_GEMM");
    const std::string_view v = e ? e : "";
    // Default mma: the wgmma kernel is correct (bit-identical) but not yet faster on the H200
    // (docs/performance.md, "Prefill GEMM").
    if (v.empty()) return GemmKernel::mma;
    if (v == "mma") return GemmKernel::mma;
    if (v != "wgmma") fail("BONSAI_CUDA_GEMM: '{}' is not a prefill GEMM kernel (wgmma or mma)", v);
    if (!available)
      fail("BONSAI_CUDA_GEMM=wgmma: the device has compute capability {}.{}; the wgmma kernel needs 9.0",
           major, minor);
    return GemmKernel::wgmma;
  }();
  return choice;
}

int gemm_stage() {
  static const int stage = [] {
    const char* e = std::getenv("BONSAI_CUDA_GEMM_STAGE");
    const std::string_view v = e ? e : "";
    // Default 1 (256-byte rows, no split sectors): all 27B matmuls at t = 512 1 % faster, pp512
    // +0.9 % on the H200 (docs/performance.md, "Prefill GEMM"); 0 keeps the padded rows.
    if (v.empty() || v == "1") return 1;
    if (v == "0") return 0;
    fail("BONSAI_CUDA_GEMM_STAGE: '{}' is not an activation staging of the mma.sync GEMM (0 or 1)", v);
  }();
  return stage;
}

}  // namespace bonsai::cuda
