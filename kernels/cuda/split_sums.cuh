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
// B slots loaded per round trip.
template <int B = kBatch>
__device__ __forceinline__ float4 load4(const SplitSums& s, int tok, int row, bool* split) {
  const int nr = ranks(s, s.pair0 + row / kPairRows);
  *split = nr > 1;
  if (nr == 1) return __ldcg(reinterpret_cast<const float4*>(s.y + static_cast<size_t>(tok) * s.n + row));
  const float4* p = reinterpret_cast<const float4*>(slot0(s, tok, row));
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int r0 = 0; r0 < nr; r0 += B) {
    float4 a[B];
#pragma unroll
    for (int j = 0; j < B; ++j)
      if (r0 + j < nr) a[j] = __ldcg(p + static_cast<size_t>(r0 + j) * (kSlotFloats / 4));
#pragma unroll
    for (int j = 0; j < B; ++j)
      if (r0 + j < nr) {
        sum.x += a[j].x;
        sum.y += a[j].y;
        sum.z += a[j].z;
        sum.w += a[j].w;
      }
  }
  return sum;
}

// load4 of two deferred outputs at the same (token, row) (the FFN's gate and up: two jobs of
// one launch), their slot loads issued together (kBatch2 of each per round trip) instead of one
// round trip after the other: each sum the same additions as load4's, the same floats.
inline constexpr int kBatch2 = 8;
__device__ __forceinline__ void load4x2(const SplitSums& a, const SplitSums& b, int tok, int row, float4* va,
                                        float4* vb, bool* split_a, bool* split_b) {
  const int na = ranks(a, a.pair0 + row / kPairRows), nb = ranks(b, b.pair0 + row / kPairRows);
  *split_a = na > 1;
  *split_b = nb > 1;
  // nr == 1: y itself, as the first (only) "slot"
  const float4* pa = reinterpret_cast<const float4*>(na > 1 ? slot0(a, tok, row)
                                                            : a.y + static_cast<size_t>(tok) * a.n + row);
  const float4* pb = reinterpret_cast<const float4*>(nb > 1 ? slot0(b, tok, row)
                                                            : b.y + static_cast<size_t>(tok) * b.n + row);
  float4 sa = make_float4(0.0f, 0.0f, 0.0f, 0.0f), sb = sa;
  const int n = na > nb ? na : nb;
  for (int r0 = 0; r0 < n; r0 += kBatch2) {
    float4 x[kBatch2], y[kBatch2];
#pragma unroll
    for (int j = 0; j < kBatch2; ++j) {
      if (r0 + j < na) x[j] = __ldcg(pa + static_cast<size_t>(r0 + j) * (kSlotFloats / 4));
      if (r0 + j < nb) y[j] = __ldcg(pb + static_cast<size_t>(r0 + j) * (kSlotFloats / 4));
    }
#pragma unroll
    for (int j = 0; j < kBatch2; ++j) {
      if (r0 + j < na) {
        if (na == 1) {
          sa = x[j];  // not 0.0f + y: -0.0f would come back as +0.0f
        } else {
          sa.x += x[j].x;
          sa.y += x[j].y;
          sa.z += x[j].z;
          sa.w += x[j].w;
        }
      }
      if (r0 + j < nb) {
        if (nb == 1) {
          sb = y[j];
        } else {
          sb.x += y[j].x;
          sb.y += y[j].y;
          sb.z += y[j].z;
          sb.w += y[j].w;
        }
      }
    }
  }
  *va = sa;
  *vb = sb;
}

// Scalar elements of deferred outputs read together (the GDN decode step's q/k channel, v channel
// and z; the attention prep's query and gate): each element's first word and its rank count
// (slots_of), then every element's slot loads issued at once, kBatchN of each per round trip,
// and each summed in rank order from 0.0f (nr == 1: y itself, taken as loaded): load1's
// additions, the same floats. An element with nr == 0 is skipped (its value 0.0f).
struct Slots {
  const float* p = nullptr;  // slot 0's word (nr > 1) or y's (nr == 1)
  int nr = 0;
};
__device__ __forceinline__ Slots slots_of(const SplitSums& s, int tok, int row) {
  Slots e;
  e.nr = ranks(s, s.pair0 + row / kPairRows);
  e.p = e.nr > 1 ? slot0(s, tok, row) : s.y + static_cast<size_t>(tok) * s.n + row;
  return e;
}
// kWeak: plain (weak) loads; else ld.global.cg, which sm_90 runs as LDG.E.STRONG.GPU, and which
// ptxas interleaved with the additions in gdn_decode_kernel<2, true> (ncu source counters: a
// long-scoreboard stall on nearly every add). Plain loads did not make that kernel faster
// (15.49 against 15.41 us per launch, H200 ncu) nor the attention prep slower (4.75 against
// 4.96 us): docs/performance.md, "Session 8: q/k/v split sums in their sites". They read what
// the matvec wrote: its grid completed before the reader's griddepcontrol.wait, and the slots
// are not written while a reader runs (as the sites' plain loads of a matvec's summed y).
inline constexpr int kBatchN = 8;
template <int N, int B = kBatchN, bool kWeak = false>
__device__ __forceinline__ void sum_slots(const Slots (&e)[N], float (&v)[N]) {
  int n = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) n = e[i].nr > n ? e[i].nr : n;
  float sum[N];
#pragma unroll
  for (int i = 0; i < N; ++i) sum[i] = 0.0f;
  for (int r0 = 0; r0 < n; r0 += B) {
    float x[N][B];
#pragma unroll
    for (int j = 0; j < B; ++j)
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (r0 + j < e[i].nr) {
          const float* a = e[i].p + static_cast<size_t>(r0 + j) * kSlotFloats;
          x[i][j] = kWeak ? *a : __ldcg(a);
        }
#pragma unroll
    for (int j = 0; j < B; ++j)
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (r0 + j < e[i].nr) sum[i] = e[i].nr == 1 ? x[i][j] : sum[i] + x[i][j];  // (-0.0f stays)
  }
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = sum[i];
}

}  // namespace bonsai::cuda::split
