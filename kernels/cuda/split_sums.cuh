// Reading the unsummed output of a deferred matvec (launch.h, SplitSums; the writer is
// finish_pair's kFixupDefer in matvec_common.cuh): a consumer adds each element's slots in
// rank order from 0.0f, the same additions the matvec's own fix-ups make, so the floats are
// the same bit for bit.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda::split {

inline constexpr int kTokens = 4;                        // tokens per token group (mv::kTok)
inline constexpr int kSlotFloats = kPairRows * kTokens;  // one rank's slot: [4 tokens][64 rows]
inline constexpr int kBatch = 32;  // slots loaded before the first add: one round trip for nr <= 32

// Ranks sharing global row group gpair (finish_pair's first .. last).
__device__ __forceinline__ int ranks(const SplitSums& s, int gpair) {
  const int p_lo = gpair * s.kblocks;
  return (p_lo + s.kblocks - 1) / s.per_warp - p_lo / s.per_warp + 1;
}

// Rank 0's word of (token, row) in the slots of its row group.
__device__ __forceinline__ const float* slot0(const SplitSums& s, int tok, int row) {
  const int gpair = s.pair0 + row / kPairRows;
  return s.partial + (static_cast<size_t>(tok / kTokens) * s.pairs + gpair) * s.slots * kSlotFloats +
         (tok % kTokens) * kPairRows + row % kPairRows;
}

// y[tok][row]; whether it is a sum of slots (else y holds it already) in *split.
__device__ __forceinline__ float load1(const SplitSums& s, int tok, int row, bool* split) {
  const int nr = ranks(s, s.pair0 + row / kPairRows);
  *split = nr > 1;
  if (nr == 1) return s.y[static_cast<size_t>(tok) * s.n + row];
  const float* p = slot0(s, tok, row);
  float sum = 0.0f;
  for (int r0 = 0; r0 < nr; r0 += kBatch) {
    float a[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (r0 + j < nr) a[j] = __ldcg(p + static_cast<size_t>(r0 + j) * kSlotFloats);
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (r0 + j < nr) sum += a[j];
  }
  return sum;
}

// y[tok][row .. row + 3] (row % 4 == 0, row + 3 < n: the four share a row group), each the
// sum of its slots in rank order from 0.0f, or y itself where one warp covered the group.
__device__ __forceinline__ float4 load4(const SplitSums& s, int tok, int row, bool* split) {
  const int nr = ranks(s, s.pair0 + row / kPairRows);
  *split = nr > 1;
  if (nr == 1) return __ldcg(reinterpret_cast<const float4*>(s.y + static_cast<size_t>(tok) * s.n + row));
  const float4* p = reinterpret_cast<const float4*>(slot0(s, tok, row));
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int r0 = 0; r0 < nr; r0 += kBatch) {
    float4 a[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (r0 + j < nr) a[j] = __ldcg(p + static_cast<size_t>(r0 + j) * (kSlotFloats / 4));
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (r0 + j < nr) {
        sum.x += a[j].x;
        sum.y += a[j].y;
        sum.z += a[j].z;
        sum.w += a[j].w;
      }
  }
  return sum;
}

}  // namespace bonsai::cuda::split
