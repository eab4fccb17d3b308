// The prefill GDN alpha/beta rows on the tensor cores (kernels/cuda/gdn_ab_mma.cu), next to
// the fp32 SIMT kernel (cuda::gdn_ab_batch, kernels/cuda/gdn.cu). Same contract: alpha /
// beta_in [t][n_v] = x [t][k] · rows 0..n_v-1 of wa / wb (raw F32, F16 or BF16 rows of
// row_bytes, the file layout).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace bonsai::cuda {

// Which kernel computes the prefill alpha/beta rows: simt (gdn_ab_batch, fp32 dot products in
// blocks of 8 rows x 8 tokens) or mma (gdn_ab_mma). BONSAI_CUDA_GDN_AB=simt|mma (any other
// value is an error); the default is mma. Read once per process.
enum class GdnAbKernel { simt, mma };
GdnAbKernel gdn_ab_kernel();

// The fewest tokens gdn_ab_rows runs on the tensor cores (one m16 tile of tokens per block;
// below it the SIMT kernel's 8-token tiles waste less).
inline constexpr int kGdnAbMmaMinTokens = 16;

// Whether gdn_ab_mma takes these operands: F32 / F16 / BF16, k % 4 == 0, x 16-byte aligned,
// weight rows 16-byte (F32) or 8-byte (F16, BF16) aligned.
bool gdn_ab_mma_fits(const float* x, const uint8_t* wa, const uint8_t* wb, size_t row_bytes, RawType type,
                     int k);
// mma.sync m16n8k8 on TF32 in the split form (3xTF32 for F32 weights, 2xTF32 for F16 / BF16,
// which TF32 holds exactly): about fp32's accuracy (the error analysis in gdn_ab_mma.cu).
// Requires gdn_ab_mma_fits.
// variant: one of kGdnAbMmaVariants layouts (n8 tiles of rows per block, chunks of loads in flight,
// pipelined or not; gdn_ab_mma.cu), all bit-identical; < 0: gdn_ab_mma_variant().
void gdn_ab_mma(const float* x, const uint8_t* wa, const uint8_t* wb, size_t row_bytes, RawType type, int k,
                int n_v, int t, float* alpha, float* beta_in, cudaStream_t s, int variant = -1);
// BONSAI_CUDA_GDN_AB_VARIANT (default kGdnAbMmaDefaultVariant); read once per process.
inline constexpr int kGdnAbMmaVariants = 6, kGdnAbMmaDefaultVariant = 2;
int gdn_ab_mma_variant();
// The prefill alpha/beta rows by `kernel`: gdn_ab_mma where it fits and t >= kGdnAbMmaMinTokens,
// else gdn_ab_batch.
void gdn_ab_rows(const float* x, const uint8_t* wa, const uint8_t* wb, size_t row_bytes, RawType type, int k,
                 int n_v, int t, float* alpha, float* beta_in, GdnAbKernel kernel, cudaStream_t s);

}  // namespace bonsai::cuda
