// The prefill GDN pipeline around the token walk (kernels/cuda/gdn_pipe.h).
//
// gdn_conv_norm (gdn.cu) runs a block of 128 threads per (token, head slot): each block loads the
// slot's taps x 128 conv weights again (512 tokens x 160 KB per layer through L1/L2), reads every
// input row taps times and pays two barriers for the q/k norm on ~4 loads per thread. Here a
// warp owns (head slot, tile of tokens): the weights and the taps-1 previous inputs sit in
// registers (loaded once per tile, the weights before the grid-dependency wait), a row of the
// tile is loaded once, kSub tokens' loads are in flight together, and the slot's sum of squares
// is a warp reduction. Lane l holds channels l, l+32, l+64, ... of its slot: exactly the
// (warp, lane) placement of the block kernel, so the per-component warp sums added in
// component order are its block_sum bit for bit (the block's extra warps past d_k only add
// +0 to a sum of squares), and the conv is ConvChannel's arithmetic in the same order.
// H200, 27B layer at t = 512 (docs/performance.md, session 7: the GDN pipeline): 52.6 -> 19.7 us
// (tiles of 16 tokens; 8: 20.7, 32: 32.7, 64: 59.6: fewer warps than the SMs hold), and the gated
// norm + transpose_heads 30.7 -> 9.3 us.
#include <algorithm>
#include <cstdlib>

#include "bonsai/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gdn_pipe.h"
#include "kernels/cuda/knobs.h"

namespace bonsai::cuda {
namespace {

constexpr int kTaps = 4;       // the most taps (Qwen3.5: 4)
constexpr int kConvWarps = 4;  // warps (head slots) per block
constexpr int kSub = 8;        // tokens whose loads are issued together
constexpr int kConvTile = 16;  // default tokens per warp

// NC: the most channels per lane (max(d_k, d_v) / 32); a slot of width d uses d / 32 of them.
// TAPS: the conv's taps (a template argument: a runtime tap index would put the weight and
// window arrays in local memory).
template <int NC, int TAPS>
__global__ void __launch_bounds__(kConvWarps * 32)
    gdn_conv_norm_tiled_kernel(const float* __restrict__ qkv, const float* __restrict__ conv_state,
                               const float* __restrict__ conv_w, float* __restrict__ conv, int t, int tile,
                               int n_k, int n_v, int d_k, int d_v, float eps) {
  constexpr int taps = TAPS;
  pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = blockIdx.x * kConvWarps + warp;
  if (slot >= 2 * n_k + n_v) return;  // no barriers below: a warp may leave
  const int64_t qk = static_cast<int64_t>(n_k) * d_k, width = 2 * qk + static_cast<int64_t>(n_v) * d_v;
  const bool is_qk = slot < 2 * n_k;
  const int nc = (is_qk ? d_k : d_v) / 32;
  const int64_t c0 =
      (is_qk ? static_cast<int64_t>(slot) * d_k : 2 * qk + static_cast<int64_t>(slot - 2 * n_k) * d_v) + lane;
  float w[NC][TAPS];  // w[k][j]: tap j of channel c0 + 32k
#pragma unroll
  for (int k = 0; k < NC; ++k)
#pragma unroll
    for (int j = 0; j < TAPS; ++j) w[k][j] = k < nc ? conv_w[(c0 + 32 * k) * taps + j] : 0.0f;
  pdl_wait();

  const int i0 = blockIdx.y * tile, i1 = min(i0 + tile, t);
  // prev[k][j]: the input at time i - (taps-1) + j for the next token i (the conv state before 0)
  float prev[NC][TAPS > 1 ? TAPS - 1 : 1];
#pragma unroll
  for (int k = 0; k < NC; ++k)
#pragma unroll
    for (int j = 0; j < TAPS - 1; ++j) {
      prev[k][j] = 0.0f;
      if (k < nc) {
        const int tau = i0 - (taps - 1) + j;
        const int64_t c = c0 + 32 * k;
        prev[k][j] =
            tau >= 0 ? qkv[static_cast<int64_t>(tau) * width + c] : conv_state[(tau + taps - 1) * width + c];
      }
    }
  const float q_scale = slot < n_k ? 1.0f / sqrtf(static_cast<float>(d_k)) : 1.0f;
  for (int b = i0; b < i1; b += kSub) {
    float x[kSub][NC];
#pragma unroll
    for (int u = 0; u < kSub; ++u)
#pragma unroll
      for (int k = 0; k < NC; ++k)
        x[u][k] = b + u < i1 && k < nc ? qkv[static_cast<int64_t>(b + u) * width + c0 + 32 * k] : 0.0f;
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      if (b + u >= i1) break;  // warp-uniform
      float out[NC];
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        // gdn_conv_norm_kernel's sum: the previous inputs in time order, then the new one
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < TAPS - 1; ++j) acc += w[k][j] * prev[k][j];
        acc += w[k][TAPS - 1] * x[u][k];
#pragma unroll
        for (int j = 0; j + 1 < TAPS - 1; ++j) prev[k][j] = prev[k][j + 1];
        if constexpr (TAPS > 1) prev[k][TAPS - 2] = x[u][k];
        out[k] = silu(acc);
      }
      if (is_qk) {
        float ss = 0.0f;  // block_sum's order: warp (here component) sums added in order
#pragma unroll
        for (int k = 0; k < NC; ++k)
          if (k < nc) ss += warp_sum(out[k] * out[k]);
        const float f = q_scale / fmaxf(sqrtf(ss), eps);
#pragma unroll
        for (int k = 0; k < NC; ++k) out[k] *= f;
      }
      float* row = conv + static_cast<int64_t>(b + u) * width + c0;
#pragma unroll
      for (int k = 0; k < NC; ++k)
        if (k < nc) row[32 * k] = out[k];
    }
  }
}

// gated_rmsnorm_kernel (norm_fwht.cu) with the destination row of the grouped head order: warp per
// (token, head) row of d values, the same sums in the same order. NC = d / 32 holds the row in
// registers (all loads in flight together); NC = 0 loops over any d.
template <int NC>
__global__ void gated_rmsnorm_heads_kernel(const float* __restrict__ o, const float* __restrict__ z,
                                           const float* __restrict__ w, float* __restrict__ y, int64_t rows,
                                           int n_v, int n_k, int64_t d, float eps, bool grouped) {
  pdl_trigger();
  pdl_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t i = row / n_v;
  const int h = static_cast<int>(row % n_v);
  const int oh = grouped ? (h % n_k) * (n_v / n_k) + h / n_k : h;
  const float* orow = o + row * d;
  const float* zrow = z + row * d;
  float* yrow = y + (i * n_v + oh) * d;
  float ss = 0.0f;
  if constexpr (NC > 0) {
    float ov[NC], zv[NC];
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      ov[k] = orow[lane + 32 * k];
      zv[k] = zrow[lane + 32 * k];
    }
#pragma unroll
    for (int k = 0; k < NC; ++k) ss += ov[k] * ov[k];
    ss = warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
#pragma unroll
    for (int k = 0; k < NC; ++k) yrow[lane + 32 * k] = ov[k] * scale * w[lane + 32 * k] * silu(zv[k]);
  } else {
    for (int64_t e = lane; e < d; e += 32) ss += orow[e] * orow[e];
    ss = warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    for (int64_t e = lane; e < d; e += 32) yrow[e] = orow[e] * scale * w[e] * silu(zrow[e]);
  }
}

}  // namespace

int gdn_pipe_mask() {
  static const int mask = knob::gdn_pipe();  // 0..3 (kernels/cuda/knobs.cpp)
  return mask;
}

bool gdn_conv_norm_tiled_fits(int taps, int d_k, int d_v) {
  return taps >= 1 && taps <= kTaps && d_k > 0 && d_v > 0 && d_k % 32 == 0 && d_v % 32 == 0 && d_k <= 256 &&
         d_v <= 256;
}

void gdn_conv_norm_tiled(const float* qkv, const float* conv_state, const float* conv_w, float* conv, int t,
                         int taps, int n_k, int n_v, int d_k, int d_v, float eps, cudaStream_t s, int tile) {
  if (!gdn_conv_norm_tiled_fits(taps, d_k, d_v))
    fail("cuda: gdn_conv_norm_tiled with {} taps, d_k {} and d_v {} is not supported", taps, d_k, d_v);
  if (tile <= 0) tile = kConvTile;
  tile = (tile + kSub - 1) / kSub * kSub;
  const dim3 grid(static_cast<unsigned>((2 * n_k + n_v + kConvWarps - 1) / kConvWarps),
                  static_cast<unsigned>((t + tile - 1) / tile));
  const auto run = [&](auto kernel) {
    launch(kernel, grid, kConvWarps * 32, 0, s, qkv, conv_state, conv_w, conv, t, tile, n_k, n_v, d_k, d_v,
           eps);
  };
  const bool wide = std::max(d_k, d_v) > 128;
  switch (taps) {
    case 1:
      return wide ? run(gdn_conv_norm_tiled_kernel<8, 1>) : run(gdn_conv_norm_tiled_kernel<4, 1>);
    case 2:
      return wide ? run(gdn_conv_norm_tiled_kernel<8, 2>) : run(gdn_conv_norm_tiled_kernel<4, 2>);
    case 3:
      return wide ? run(gdn_conv_norm_tiled_kernel<8, 3>) : run(gdn_conv_norm_tiled_kernel<4, 3>);
    default:
      return wide ? run(gdn_conv_norm_tiled_kernel<8, 4>) : run(gdn_conv_norm_tiled_kernel<4, 4>);
  }
}

void gated_rmsnorm_heads(const float* o, const float* z, const float* w, float* y, int t, int n_v, int n_k,
                         int64_t d, float eps, bool grouped, cudaStream_t s) {
  const int64_t rows = static_cast<int64_t>(t) * n_v;
  const unsigned blocks = static_cast<unsigned>((rows + 7) / 8);
  if (d == 128)
    launch(gated_rmsnorm_heads_kernel<4>, blocks, 256, 0, s, o, z, w, y, rows, n_v, n_k, d, eps, grouped);
  else
    launch(gated_rmsnorm_heads_kernel<0>, blocks, 256, 0, s, o, z, w, y, rows, n_v, n_k, d, eps, grouped);
}

}  // namespace bonsai::cuda
