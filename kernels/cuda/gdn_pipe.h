// The prefill GDN pipeline around the token walk (kernels/cuda/gdn_pipe.cu): the causal conv +
// q/k L2 norms with a warp per (head slot, token tile), and the gated RMSNorm writing the grouped
// head order itself (no transpose_heads pass). Same arithmetic, in the same order, as
// cuda::gdn_conv_norm (gdn.cu) and cuda::gated_rmsnorm + cuda::transpose_heads: bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bonsai::cuda {

// Which of the pipeline's new kernels the CUDA backend's prefill GDN site runs: a bit mask,
// BONSAI_CUDA_GDN_PIPE (default kGdnPipeDefault): 1 = gdn_conv_norm_tiled instead of
// gdn_conv_norm, 2 = gated_rmsnorm_heads instead of gated_rmsnorm + transpose_heads. Read once
// per process.
inline constexpr int kGdnPipeConv = 1, kGdnPipeNorm = 2, kGdnPipeDefault = 3;
int gdn_pipe_mask();

// Whether gdn_conv_norm_tiled takes this shape: d_k and d_v multiples of 32, at most 256, taps 1..4.
bool gdn_conv_norm_tiled_fits(int taps, int d_k, int d_v);
// conv [t][channels] = silu(causal conv of qkv) with q (times 1/√d_k) and k L2-normalised per
// (token, key head), as gdn_conv_norm; conv_state [taps-1][channels] is read, not updated. A warp
// per (head slot, `tile` tokens; tile a multiple of 8, 0: the default): the taps' weights and the
// window of previous inputs stay in registers, lane l holds channels l, l+32, ... of its slot.
void gdn_conv_norm_tiled(const float* qkv, const float* conv_state, const float* conv_w, float* conv, int t,
                         int taps, int n_k, int n_v, int d_k, int d_v, float eps, cudaStream_t s,
                         int tile = 0);

// y = gated_rmsnorm(o, z) (o, z [t][n_v][d]) written at head (h % n_k)·(n_v/n_k) + h / n_k of
// token i when grouped (transpose_heads(·, t, n_v/n_k, n_k, d)), at h otherwise.
void gated_rmsnorm_heads(const float* o, const float* z, const float* w, float* y, int t, int n_v, int n_k,
                         int64_t d, float eps, bool grouped, cudaStream_t s);

}  // namespace bonsai::cuda
