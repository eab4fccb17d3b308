// BONSAI_CUDA_GEMM: which kernel runs the prefill GEMM (kernels/cuda/gemm.h, gemm_kernel);
// BONSAI_CUDA_GEMM_STAGE: the mma.sync kernel's activation staging (gemm_stage);
// BONSAI_CUDA_GEMM_WG_STAGES: the wgmma producer kernel's ring depth; its tensor maps.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "bonsai/error.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/tile_layout.h"

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
    // Default mma: the wgmma producer-warp kernel is bit-identical and as fast at t = 512, but
    // pp512 was 0.5 % slower with it on the H200 (docs/performance.md, "Prefill GEMM").
    if (v.empty()) return GemmKernel::mma;
    if (v == "mma") return GemmKernel::mma;
    if (v != "wgmma" && v != "wgmma_cp")
      fail("BONSAI_CUDA_GEMM: '{}' is not a prefill GEMM kernel (mma, wgmma or wgmma_cp)", v);
    if (!available)
      fail("BONSAI_CUDA_GEMM={}: the device has compute capability {}.{}; the wgmma kernels need 9.0", v,
           major, minor);
    return v == "wgmma" ? GemmKernel::wgmma : GemmKernel::wgmma_cp;
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

int gemm_wg_stages() {
  static const int stages = [] {
    const char* e = std::getenv("BONSAI_CUDA_GEMM_WG_STAGES");
    const std::string_view v = e ? e : "";
    // Default 8: the producer keeps the whole ring in flight ahead of the consumers.
    if (v.empty() || v == "8") return 8;
    if (v == "4") return 4;
    fail("BONSAI_CUDA_GEMM_WG_STAGES: '{}' is not a ring depth of the wgmma producer kernel (4 or 8)", v);
  }();
  return stages;
}

namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                 CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                 CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess || p == nullptr)
      fail("BONSAI_CUDA_GEMM=wgmma: the CUDA driver has no cuTensorMapEncodeTiled (needs 12.0 or later)");
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A 2-D map over rows x cols elements of esize bytes (rows cols·esize bytes apart), box bx x by.
void encode_2d(unsigned char (&out)[128], const void* base, CUtensorMapDataType type, uint64_t esize,
               uint64_t cols, uint64_t rows, uint32_t bx, uint32_t by, CUtensorMapSwizzle swizzle,
               const char* what) {
  static_assert(sizeof(CUtensorMap) == sizeof out);
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cols, rows}, strides[1] = {cols * esize};
  const cuuint32_t box[2] = {bx, by}, estride[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, type, 2, const_cast<void*>(base), dims, strides, box, estride,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail("BONSAI_CUDA_GEMM=wgmma: cuTensorMapEncodeTiled failed (CUresult {}) for the {} ({} x {})",
         static_cast<int>(r), what, rows, cols);
  std::memcpy(out, &map, sizeof out);
}

}  // namespace

GemmTensorMaps gemm_tensor_maps(const uint8_t* xq, const float4* meta, int t, int kblocks) {
  GemmTensorMaps m{};
  const auto rows = static_cast<uint64_t>(t), kb = static_cast<uint64_t>(kblocks);
  // The activation: region r of a k-block = bytes [32r, 32r + 32) of 64 tokens' 256-byte records.
  encode_2d(m.act, xq, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, kb * kActBytes, rows, 32, kGemmTokens,
            CU_TENSOR_MAP_SWIZZLE_32B, "GEMM activation");
  encode_2d(m.meta, meta, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kb * 4, rows, 4, kGemmTokens,
            CU_TENSOR_MAP_SWIZZLE_NONE, "GEMM activation meta");
  return m;
}

}  // namespace bonsai::cuda
