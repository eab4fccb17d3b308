// The prefill GEMM of the CUDA backend: y_j [t][n_j] = x [t][k] · W_jᵀ for tiled ternary
// weights (kernels/cuda/tile_layout.h) and several tokens at once, on the int8 tensor
// cores. Same numerics as matvec_tiled: each weight tile is decoded once per tile of
// kGemmTokens tokens instead of once per 4 tokens.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace bonsai::cuda {

inline constexpr int kGemmRows = 128;   // weight rows per block (8 tiles, two row groups)
inline constexpr int kGemmTokens = 64;  // tokens per block
// Below this many tokens the matvec (weights streamed once per 4 tokens) is as fast.
inline constexpr int kGemmMinTokens = 12;

// Floats of split-K partial sums gemm_tiled needs for these jobs (0: none).
size_t gemm_tiled_scratch(const TiledJobs& jobs, int t, int64_t k, int sm_count);
// jobs: same k and scale grouping (groups 1 or 2); xq/meta: quantize_act of x [t][k]. With
// few row blocks x token blocks, or a last round of blocks that would leave SMs idle, the
// k-blocks are split over blockIdx.z (gemm.cu, plan_gemm); the ranges' sums go to `partial`
// (gemm_tiled_scratch floats) and are added in a fixed order by a second launch.
void gemm_tiled(const TiledJobs& jobs, int groups, const uint8_t* xq, const float4* meta, int t, int64_t k,
                int sm_count, float* partial, cudaStream_t s);

}  // namespace bonsai::cuda
