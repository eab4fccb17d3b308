// The activation quantizer of the ternary matvec (layout: tile_layout.h), shared by the
// standalone quantize kernel and the Hadamard site that quantizes its own output.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {

__device__ __forceinline__ int quant_q(float v) {
  return min(max(__float2int_rn(v), -static_cast<int>(kActQMax)), static_cast<int>(kActQMax));
}

// One warp quantizes one 128-column block; the lane holds natural columns 4·lane .. 4·lane+3.
// One scale per 128 columns (like the CPU path for 128-groups), stored for both 64-column
// halves, and Σq per half (64-groups of Q2_0 g64 need each half's sum).
__device__ __forceinline__ void quantize_block(float4 v, int lane, uint32_t* out, float4* meta) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, o));
  const float inv = amax > 0.0f ? kActQMax / amax : 0.0f;
  const float scale = amax / kActQMax;
  const int q[4] = {quant_q(v.x * inv), quant_q(v.y * inv), quant_q(v.z * inv), quant_q(v.w * inv)};
  uint32_t hi = 0, lo = 0;
  int sum = 0;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    hi |= static_cast<uint32_t>(act_hi(q[b]) & 0xff) << (8 * b);
    lo |= static_cast<uint32_t>(act_lo(q[b]) & 0xff) << (8 * b);
    sum += q[b];
  }
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(kFullMask, sum, o);  // within each half
  const int w = act_word(lane * 4);
  out[w] = hi;
  out[32 + w] = lo;
  const int sum1 = __shfl_sync(kFullMask, sum, 16);
  if (lane == 0) *meta = make_float4(scale, scale, __int_as_float(sum), __int_as_float(sum1));
}

}  // namespace bonsai::cuda
