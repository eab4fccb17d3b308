// The GDN site's decode step (t = 1; kernels/cuda/gdn_decode.h).
//
// gdn_fused (gdn.cu) runs a block of 512 threads per value head (48 blocks on 132 SMs for the
// 27B) with ~6 block barriers after its dependency wait: conv, q/k norms (2), alpha/beta rows and
// gates (1), the delta rule's sums over d_k (1) and the gated norm (1), with the gates, the
// norms and the state sums each waiting for the one before. Here:
//   - a value head is split over a cluster of C CTAs by its d_v columns (C = 1, 2, 4), so C
//     times as many SMs load and store the 64 KB of state per head;
//   - a warp owns CW = 32 / R whole columns (R = d_k / 32 lanes per column; lane = rgi·CW + cs
//     holds rows 32·rgi .. 32·rgi + 31 of column cs), so the sums over d_k are R-lane shuffles,
//     not a block barrier;
//   - every warp computes the head's conv + q/k L2 norms itself (2·d_k channels, R per lane), so
//     the state dot products need no block barrier; the conv windows Σ w_j·prev_j of the taps
//     before the new input are formed before the wait by the CTA's threads together and published
//     by one barrier after the wait, whose wait overlaps the input loads;
//   - the dot products use the state before the decay: s'·k = decay·(s·k), s'·q = decay·(s·q),
//     so they need neither the gates nor each other; the alpha/beta rows (every CTA computes the
//     whole two dot products over ab_k, its first weights loaded before the wait) meet them at
//     the second block barrier; the gated norm's Σ o² is the third (when C > 1 the per-warp
//     partial sums pushed into every CTA of the cluster by st.async on an mbarrier, or with
//     BONSAI_CUDA_GDN_DEC_PUSH=0 read through distributed shared memory after a cluster barrier;
//     added in rank order either way, so every CTA forms the same sum);
//   - the state is stored right after its update, before the norm's exchange (without the fold).
//     (Measured after the fact: cg's cluster.sync() arrives with release semantics, a
//     MEMBAR.ALL.GPU that waits for those 32 stores per thread first: docs/performance.md,
//     "Session 8: GDN decode step"; the pushed exchange has no release.)
// H200, 27B: 14.8 -> 11.3 us per launch (ncu, serialized), tg128 +3.9 %.
// With the qkv+z matvec deferred (split, CudaBackend's BONSAI_CUDA_QKV_DEFER) the step adds
// qkv's and z's split sums itself: each CTA sums a q/k channel once (thread e), not once per warp.
// Measured slower in two rounds (15.4 us per launch against 11.2, tg128 -1.6 .. -2.0 %), so off
// by default (docs/performance.md, "Session 8: q/k/v split sums in their sites").
// The conv is ConvChannel's arithmetic (gdn.cu) in the same order; the dot products, the
// decay's placement and the norms' sums run in another order than gdn_fused's: the results agree
// to a few fp32 roundings (tests/test_backend_cuda_gdn_dec.cpp).
#include <cooperative_groups.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "bonsai/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gdn_decode.h"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/site_fwht.cuh"
#include "kernels/cuda/split_sums.cuh"

namespace bonsai::cuda {
namespace {

constexpr int kTaps = 4;       // the most conv taps
constexpr int kMaxR = 8;       // d_k / 32 <= 8
constexpr int kMaxWarps = 16;  // (d_k / 32)·d_v <= 512 threads per head
constexpr int kPad = 36;  // shared row group pitch (floats): float4 reads of the R groups hit other banks

// Four consecutive elements of a raw F16 / BF16 row (8-byte aligned), as loaded / as floats.
__device__ __forceinline__ uint2 raw4(const uint8_t* row, int c) {
  return __ldg(reinterpret_cast<const uint2*>(row + 2 * static_cast<size_t>(c)));
}
__device__ __forceinline__ float4 raw4_float(uint2 u, bool bf16) {
  if (bf16)
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
  __half2 a, b;
  memcpy(&a, &u.x, 4);
  memcpy(&b, &u.y, 4);
  const float2 fa = __half22float2(a), fb = __half22float2(b);
  return make_float4(fa.x, fa.y, fb.x, fb.y);
}
__device__ __forceinline__ float dot4(float4 x, float4 w, float acc) {
  return fmaf(x.w, w.w, fmaf(x.z, w.z, fmaf(x.y, w.y, fmaf(x.x, w.x, acc))));
}

// The polled hand-off's empty word (GdnDecodeFwht.poll): a NaN that FMUL never returns (sm_70+
// arithmetic gives the canonical NaN 0x7FFFFFFF), as the matvec's kSlotEmpty.
constexpr uint32_t kPollEmpty = 0xFFFFFFFFu;
__device__ __forceinline__ void st_relaxed(float* p, float v) {
  asm volatile("st.relaxed.gpu.global.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed4(float* p, float4 v) {
  asm volatile("st.relaxed.gpu.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w)
               : "memory");
}
__device__ __forceinline__ float4 ld_relaxed4(const float* p) {
  float4 v;
  asm volatile("ld.relaxed.gpu.global.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ bool poll_empty(float4 v) {
  return __float_as_uint(v.x) == kPollEmpty || __float_as_uint(v.y) == kPollEmpty ||
         __float_as_uint(v.z) == kPollEmpty || __float_as_uint(v.w) == kPollEmpty;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// site_fwht.cuh's push4 for one float: v into CTA `rank`'s word at this CTA's shared address
// `local`, counted on that CTA's mbarrier at `bar`.
__device__ __forceinline__ void push1(uint32_t local, uint32_t bar, int rank, float v) {
  uint32_t dst, rbar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(local), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rbar) : "r"(bar), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(dst),
               "r"(__float_as_uint(v)), "r"(rbar)
               : "memory");
}
#endif

// The folded Hadamard site's FWHT: site_fwht.cuh's fwht_regs (what hadamard_kernel runs at blockDim ==
// block / 4) with threads at or past block / 4 inactive: the same additions, the same floats.

// Grid n_v·kC CTAs in clusters of kC (rank = blockIdx.x % kC), blockDim (d_k/32)·d_v/kC.
// ab_early: the alpha/beta rows' first kAb float4 groups per thread loaded before the wait.
// membar_free (kC > 1): the state's stores after the cluster barrier's release arrive, and a
// relaxed arrive for the done-reading signal (the gated norm below).
// kSplit: qkv and z are the unsummed outputs of the deferred qkv+z matvec (qkv_s, z_s; launch.h,
// SplitSums): each element is added from its slots here (split::sum_slots, the matvec fix-up's
// additions: the same floats), and written back to qkv / z (what matmul promised). A q/k channel
// is then summed once per CTA, not once per warp: thread e sums channel e (one round trip with
// its column's v channel and z; the slot addresses formed before the wait), applies the conv
// (the same fmaf / silu as the warps' below) and publishes the result in `win` and the raw input
// in `wlast` through the barrier that already published the windows; the warps read both from
// there. The conv hand-off's count (a release: a MEMBAR that waits for the thread's outstanding
// memory operations) stays off that chain: count_early, right after the states' loads (before
// the wait when p.state_early) behind a barrier of its own; else after the publishing barrier,
// with the sums' write-backs issued after it. (Round 1 summed before the barrier and wrote back
// before the count: 11.2 -> 15.3 us per launch; round 2's placements: 15.4 / 15.5 us, the cost
// is the slot round trip itself; docs/performance.md, "Session 8: q/k/v split sums in their
// sites".)
//
// kFold (without split; GdnDecodeFwht f): the out-projection's input site too. Each CTA stores
// its outputs, then thread 0 counts the CTA in f.counters[its Hadamard block] (after a barrier:
// a release cumulative over the CTA's stores, and an acquire; inc wraps the counter back to zero
// for the next step); the last of the block's f.ctas CTAs reads the block's outputs from L2 and
// runs hadamard_kernel's register path on them (signs, fwht_regs, 1/√block, quantize_block):
// the same floats. So that the release waits for the outputs' stores alone, the state's stores
// (and the conv state's) go after the count. With f.poll (the default where the grid fits the
// device at once, BONSAI_CUDA_GDN_FWHT_POLL) the hand-off is polled instead: every CTA also
// stores its outputs into f.poll (relaxed; each word its own flag, 0xFFFFFFFF empty) and goes
// on to the state's stores; the CTA holding the block's first columns loads the block's words
// (one float4 per thread), reloads until none is empty and empties them again. The chain after
// the gated norm loses the release's wait for the stores, the atomic's round trip, the two CTA
// barriers around it and the second read of the outputs: the first poll load that sees the
// last store has the data. The same floats as the counted hand-off.
template <int kC, bool kSplit, bool kWeak, bool kFold>
__global__ void __launch_bounds__(512 / kC)
    gdn_decode_kernel(GdnFused p, int ab_early, int membar_free, int push, int count_early, SplitSums qkv_s,
                      SplitSums z_s, GdnDecodeFwht f, int fold_ctas) {
  // [W][2][R·kPad] per-warp qn | kn (row 32·g + j at kPad·g + j); [2·d_k] the q/k conv windows
  // Σ_{j < taps-1} w_j·prev_j (q channels, then k); [2·d_k] their last taps; [taps-2][2·d_k]
  // the windows' inputs 1 .. taps-2 (the new conv state's first rows, for its writer)
  extern __shared__ __align__(16) float dsm[];
  __shared__ float2 ab_part[kMaxWarps];
  __shared__ float norm_part[kMaxWarps];
  pdl_trigger();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // push (kC > 1): the gated norm's partial sums pushed to the other CTAs of the cluster
  // (site_fwht.cuh's one-way exchange): norm_all[r·W + w] = CTA r's warp w's, counted on nbar
  __shared__ float norm_all[kMaxWarps];
  __shared__ __align__(8) uint64_t nbar;
  [[maybe_unused]] const uint32_t nbar_a = static_cast<uint32_t>(__cvta_generic_to_shared(&nbar));
  if (kC > 1 && push) {
    if (threadIdx.x == 0) push_init(nbar_a, (kC - 1) * (blockDim.x >> 5) * 4);
    // published to the cluster (own shared memory only: no PDL hazard before the wait; nothing
    // outstanding yet for the release to wait for); the matching wait precedes the first push
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  }
#endif
  constexpr int kAb = 3 * kC;  // float4 groups of the alpha/beta rows per thread and pass: 5120 at 27B
  const int d_k = p.d_k, d_v = p.d_v, R = d_k >> 5, CW = 32 / R, taps = p.taps;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, W = blockDim.x >> 5, T = blockDim.x;
  const int h = blockIdx.x / kC, rank = blockIdx.x % kC;
  const int rgi = lane / CW, col = (rank * W + warp) * CW + lane % CW;
  const int hk = h % p.n_k, rep = p.n_v / p.n_k;
  const int64_t qk = static_cast<int64_t>(p.n_k) * d_k, width = 2 * qk + static_cast<int64_t>(p.n_v) * d_v;
  const int64_t ch_v = 2 * qk + static_cast<int64_t>(h) * d_v + col;
  float* S = p.state + (static_cast<int64_t>(h) * d_k + 32 * rgi) * d_v + col;  // row 32·rgi + j: S[j·d_v]
  const int pitch = kPad * R;
  float* qn_w = dsm + warp * 2 * pitch;
  float* kn_w = qn_w + pitch;
  float* win = dsm + W * 2 * pitch;
  float* wlast = win + 2 * d_k;
  float* shifted = wlast + 2 * d_k;
  auto qk_channel = [&](int e) {  // e < 2·d_k: q channels of key head hk, then its k channels
    return e < d_k ? static_cast<int64_t>(hk) * d_k + e : qk + static_cast<int64_t>(hk) * d_k + (e - d_k);
  };

  // ---- weights before the dependency wait ----
  const float ssm_a = p.ssm_a[h], dt_bias = p.dt_bias[h], norm_w = p.norm_w[col];
  const int out_head = p.transpose ? hk * rep + h / p.n_k : h;
  // kFold: this CTA's Hadamard block, its first column, and thread i's float4 of it (a weight)
  const int fb0 = kFold ? (out_head * d_v) / f.block * f.block : 0, fi = 4 * threadIdx.x;
  const bool f_active = kFold && fi < f.block;
  float4 f_sg = make_float4(1, 1, 1, 1);
  if (kFold && f_active && f.signs) f_sg = *reinterpret_cast<const float4*>(f.signs + fb0 + fi);
  const bool bf16 = p.ab_type == RawType::BF16;
  const uint8_t* wa = p.alpha_w + static_cast<size_t>(h) * p.ab_row_bytes;
  const uint8_t* wb = p.beta_w + static_cast<size_t>(h) * p.ab_row_bytes;
  const int ng = p.ab_k >> 2;  // float4 groups
  uint2 ea[kAb] = {}, eb[kAb] = {};
#pragma unroll
  for (int m = 0; m < kAb; ++m) {
    const int g = threadIdx.x + T * m;
    if (ab_early && g < ng) {
      ea[m] = raw4(wa, 4 * g);
      eb[m] = raw4(wb, 4 * g);
    }
  }

  // ---- the recurrent and conv states (before the wait when p.state_early) ----
  float s[32], vprev[kTaps - 1], vwin = 0.0f, vlast = 0.0f;
  auto load_states = [&] {
    if (p.state_stream) {  // first: the window stores below wait for their loads
#pragma unroll
      for (int j = 0; j < 32; ++j) s[j] = __ldcs(S + static_cast<int64_t>(j) * d_v);
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) s[j] = S[static_cast<int64_t>(j) * d_v];
    }
    float vw[kTaps - 1];  // this column's v channel
#pragma unroll
    for (int j = 0; j < kTaps - 1; ++j)
      if (j < taps - 1) {
        vprev[j] = p.conv_state[j * width + ch_v];
        vw[j] = p.conv_w[ch_v * taps + j];
      }
    vlast = p.conv_w[ch_v * taps + taps - 1];
    // the q/k conv windows of the head, spread over the CTA's threads (published by the barrier
    // after the wait)
    for (int e = threadIdx.x; e < 2 * d_k; e += T) {
      const int64_t c = qk_channel(e);
      float acc = 0.0f, pv[kTaps - 1];
#pragma unroll
      for (int j = 0; j < kTaps - 1; ++j)
        if (j < taps - 1) {
          pv[j] = p.conv_state[j * width + c];
          acc += p.conv_w[c * taps + j] * pv[j];
        }
      win[e] = acc;
      wlast[e] = p.conv_w[c * taps + taps - 1];
#pragma unroll
      for (int j = 0; j + 1 < kTaps - 1; ++j)
        if (j + 1 < taps - 1) shifted[j * 2 * d_k + e] = pv[j + 1];
    }
#pragma unroll
    for (int j = 0; j < kTaps - 1; ++j)
      if (j < taps - 1) vwin += vw[j] * vprev[j];  // ConvChannel's order
  };
  // kSplit: this thread's q/k channel(s) (thread e sums channel e; the CTA's first key-head CTA
  // writes their sums back), its column's v channel and z (written back by the column's first
  // lane); the addresses depend on the launch only
  const int64_t ch_z = static_cast<int64_t>(h) * d_v + col;
  const int e0 = threadIdx.x;
  split::Slots el[3];
  if constexpr (kSplit) {
    if (e0 < 2 * d_k) el[0] = split::slots_of(qkv_s, 0, static_cast<int>(qk_channel(e0)));
    el[1] = split::slots_of(qkv_s, 0, static_cast<int>(ch_v));
    el[2] = split::slots_of(z_s, 0, static_cast<int>(ch_z));
  }
  // The conv hand-off's count: the barrier orders every thread's reads of the q/k conv state
  // (load_states: their values consumed) before it; the last of the rep·kC CTAs of key head hk
  // to count itself writes that state at the very end (a release at GPU scope, cumulative over
  // the barrier; inc wraps the counter back to zero for the next step).
  unsigned last = 0;
  auto count = [&] {
    if (threadIdx.x == 0)
      asm volatile("atom.release.gpu.global.inc.u32 %0, [%1], %2;"
                   : "=r"(last)
                   : "l"(p.conv_counters + hk), "r"(static_cast<unsigned>(rep * kC - 1))
                   : "memory");
  };
  if (!p.state_early) pdl_wait();
  load_states();
  if (kSplit && count_early) {
    __syncthreads();
    count();
  }
  if (p.state_early) pdl_wait();

  // ---- after the wait: every input load at once, then the count ----
  float xq[kMaxR], xk[kMaxR], xv, z;
  if constexpr (!kSplit) {
#pragma unroll
    for (int m = 0; m < kMaxR; ++m)
      if (m < R) {
        xq[m] = p.qkv[qk_channel(lane + 32 * m)];
        xk[m] = p.qkv[qk_channel(d_k + lane + 32 * m)];
      }
    xv = p.qkv[ch_v];
    z = p.z[ch_z];
  }
  const float4* normed = reinterpret_cast<const float4*>(p.normed);
  float4 xn[kAb];
#pragma unroll
  for (int m = 0; m < kAb; ++m) {
    const int g = threadIdx.x + T * m;
    if (g < ng) {
      xn[m] = normed[g];
      if (!ab_early) {
        ea[m] = raw4(wa, 4 * g);
        eb[m] = raw4(wb, 4 * g);
      }
    }
  }
  const bool qk_writer = kSplit && h < p.n_k && rank == 0;
  float x0 = 0.0f;
  if constexpr (kSplit) {
    auto conv_qk = [&](int e, float x) {  // e < 2·d_k; win / wlast are this thread's
      win[e] = silu(fmaf(wlast[e], x, win[e]));
      wlast[e] = x;
    };
    float v3[3];
    split::sum_slots<3, split::kBatchN, kWeak>(el, v3);  // kWeak: plain loads (see there)
    x0 = v3[0];
    xv = v3[1];
    z = v3[2];
    if (e0 < 2 * d_k) conv_qk(e0, x0);
    for (int e = e0 + T; e < 2 * d_k; e += T) {  // fewer threads than channels (4 CTAs per head)
      split::Slots one[1] = {split::slots_of(qkv_s, 0, static_cast<int>(qk_channel(e)))};
      float x[1];
      split::sum_slots<1, split::kBatchN, kWeak>(one, x);
      conv_qk(e, x[0]);
      if (qk_writer && one[0].nr > 1) qkv_s.y[qk_channel(e)] = x[0];
    }
  }

  // The barrier publishes win, wlast and shifted (its wait overlaps the loads above; kSplit: the
  // sums' round trip and the q/k conv) and, unless counted already, orders every warp's reads of
  // the shared q/k conv state before this CTA's count (above).
  __syncthreads();
  if (!(kSplit && count_early)) count();
  if constexpr (kSplit) {  // the write-backs, after the count's release
    if (qk_writer && e0 < 2 * d_k && el[0].nr > 1) qkv_s.y[qk_channel(e0)] = x0;
    if (rgi == 0 && el[1].nr > 1) qkv_s.y[ch_v] = xv;
    if (rgi == 0 && el[2].nr > 1) z_s.y[ch_z] = z;
  }

  // ---- alpha/beta rows: this warp's partial sums ----
  float pa = 0.0f, pb = 0.0f;
#pragma unroll
  for (int m = 0; m < kAb; ++m)
    if (threadIdx.x + T * m < ng) {
      pa = dot4(xn[m], raw4_float(ea[m], bf16), pa);
      pb = dot4(xn[m], raw4_float(eb[m], bf16), pb);
    }
  for (int g = threadIdx.x + T * kAb; g < ng; g += T) {  // shapes wider than one pass
    const float4 x = normed[g];
    pa = dot4(x, raw4_float(raw4(wa, 4 * g), bf16), pa);
    pb = dot4(x, raw4_float(raw4(wb, 4 * g), bf16), pb);
  }
  pa = warp_sum(pa);
  pb = warp_sum(pb);
  if (lane == 0) ab_part[warp] = make_float2(pa, pb);

  // ---- conv + q/k L2 norms of the head, in every warp ----
  float ssq = 0.0f, ssk = 0.0f, cq[kMaxR], ck[kMaxR];
#pragma unroll
  for (int m = 0; m < kMaxR; ++m)
    if (m < R) {
      const int e = lane + 32 * m;
      if constexpr (kSplit) {  // formed by thread e (and d_k + e) before the barrier
        cq[m] = win[e];
        ck[m] = win[d_k + e];
      } else {
        cq[m] = silu(fmaf(wlast[e], xq[m], win[e]));
        ck[m] = silu(fmaf(wlast[d_k + e], xk[m], win[d_k + e]));
      }
      ssq += cq[m] * cq[m];
      ssk += ck[m] * ck[m];
    }
  ssq = warp_sum(ssq);
  ssk = warp_sum(ssk);
  const float q_mul = (1.0f / sqrtf(static_cast<float>(d_k))) / fmaxf(sqrtf(ssq), p.eps);
  const float k_mul = 1.0f / fmaxf(sqrtf(ssk), p.eps);
  float kq = 0.0f;
#pragma unroll
  for (int m = 0; m < kMaxR; ++m)
    if (m < R) {
      const float qn = cq[m] * q_mul, kn = ck[m] * k_mul;
      qn_w[kPad * m + lane] = qn;
      kn_w[kPad * m + lane] = kn;
      kq += kn * qn;
    }
  kq = warp_sum(kq);  // k·q over d_k
  __syncwarp();

  // ---- s·k and s·q of this column over d_k, before the decay ----
  const float4* k4 = reinterpret_cast<const float4*>(kn_w + kPad * rgi);
  const float4* q4 = reinterpret_cast<const float4*>(qn_w + kPad * rgi);
  float ak[4] = {}, aq[4] = {};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 k = k4[i], q = q4[i];
    ak[0] = fmaf(s[4 * i], k.x, ak[0]);
    ak[1] = fmaf(s[4 * i + 1], k.y, ak[1]);
    ak[2] = fmaf(s[4 * i + 2], k.z, ak[2]);
    ak[3] = fmaf(s[4 * i + 3], k.w, ak[3]);
    aq[0] = fmaf(s[4 * i], q.x, aq[0]);
    aq[1] = fmaf(s[4 * i + 1], q.y, aq[1]);
    aq[2] = fmaf(s[4 * i + 2], q.z, aq[2]);
    aq[3] = fmaf(s[4 * i + 3], q.w, aq[3]);
  }
  float sk = (ak[0] + ak[1]) + (ak[2] + ak[3]), sq = (aq[0] + aq[1]) + (aq[2] + aq[3]);
  for (int o = CW; o < 32; o <<= 1) {  // over the column's R row groups (every lane gets the same sum)
    sk += __shfl_xor_sync(kFullMask, sk, o);
    sq += __shfl_xor_sync(kFullMask, sq, o);
  }

  // ---- gates (the one block barrier before the update) ----
  __syncthreads();
  float a = 0.0f, b = 0.0f;
  for (int w = 0; w < W; ++w) {
    a += ab_part[w].x;
    b += ab_part[w].y;
  }
  const float decay = expf(ssm_a * softplus(a + dt_bias)), beta = sigmoid(b);

  // ---- delta rule: o, the state update and its store ----
  const float v = silu(fmaf(vlast, xv, vwin));
  const float delta = beta * (v - decay * sk);
  const float o = fmaf(delta, kq, decay * sq);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 k = k4[i];
    s[4 * i] = fmaf(k.x, delta, s[4 * i] * decay);
    s[4 * i + 1] = fmaf(k.y, delta, s[4 * i + 1] * decay);
    s[4 * i + 2] = fmaf(k.z, delta, s[4 * i + 2] * decay);
    s[4 * i + 3] = fmaf(k.w, delta, s[4 * i + 3] * decay);
  }
  auto store_state = [&] {
    if (p.state_stream) {
#pragma unroll
      for (int j = 0; j < 32; ++j) __stcs(S + static_cast<int64_t>(j) * d_v, s[j]);
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) S[static_cast<int64_t>(j) * d_v] = s[j];
    }
  };
  if (!kFold && (kC == 1 || push || !membar_free)) store_state();

  // ---- gated RMSNorm over the head's d_v outputs ----
  float oo = o * o;
  for (int w = 1; w < CW; w <<= 1) oo += __shfl_xor_sync(kFullMask, oo, w);  // this warp's columns
  if (lane == 0) norm_part[warp] = oo;
  float ss_o = 0.0f;
  if constexpr (kC == 1) {
    __syncthreads();
    for (int w = 0; w < W; ++w) ss_o += norm_part[w];
  } else if (push) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Each warp's partial sum pushed into the other CTAs' norm_all (st.async, counted on their
    // nbar) and stored into this CTA's own: no cluster barrier (its release arrive is a
    // MEMBAR.ALL.GPU), no remote loads' round trip, no done-reading barrier before the exit (a
    // CTA reads only its own shared memory, after every push into it has landed). The same
    // additions in the same order (rank, then warp) as the barrier's form below: the same floats.
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // every nbar is initialised
    if (lane == 0) {
      norm_all[rank * W + warp] = oo;
      const uint32_t src = static_cast<uint32_t>(__cvta_generic_to_shared(&norm_all[rank * W + warp]));
#pragma unroll
      for (int r = 0; r < kC; ++r)
        if (r != rank) push1(src, nbar_a, r, oo);
    }
    __syncthreads();    // this CTA's own partial sums
    push_wait(nbar_a);  // the other CTAs' have landed here
    for (int r = 0; r < kC; ++r)
      for (int w = 0; w < W; ++w) ss_o += norm_all[r * W + w];
#else
    __trap();  // launched only on compute capability 9.x (gdn_decode)
#endif
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    // every CTA's partial sums are in its shared memory after the barrier (release / acquire);
    // membar_free: the state's stores issued after this CTA's release arrive (a release is a
    // MEMBAR.ALL.GPU that would first wait for the 32 stores per thread), so that they drain
    // under the barrier's wait and the norm (branch gdn8-membar, bd21088)
    if (membar_free) {
      asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
      if (!kFold) store_state();
      asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    } else {
      cluster.sync();
    }
    for (int r = 0; r < kC; ++r) {
      const float* np = cluster.map_shared_rank(norm_part, r);
      for (int w = 0; w < W; ++w) ss_o += np[w];
    }
    // done reading the other CTAs' shared memory; the matching wait is before the exit, so no
    // CTA's shared memory goes while another may still read it. membar_free: a relaxed arrive
    // (no fence behind the state's stores) that depends on the sum, i.e. on the remote loads
    if (membar_free)
      asm volatile("barrier.cluster.arrive.relaxed.aligned;" : : "f"(ss_o) : "memory");
    else
      asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#else
    __trap();  // launched only on compute capability 9.x (gdn_decode)
#endif
  }
  const float scale = 1.0f / sqrtf(ss_o / static_cast<float>(d_v) + p.norm_eps);
  const float out_v = o * scale * norm_w * silu(z);  // an FMUL: a NaN is the canonical one
  if (rgi == 0) p.out[static_cast<int64_t>(out_head) * d_v + col] = out_v;
  bool f_last = false;
  float4 f_v = make_float4(0, 0, 0, 0);
  if (kFold && f.poll) {
    // The polled hand-off (GdnDecodeFwht.poll): each word is written once per launch, by one
    // thread, and is its own flag, so single-location coherence of the relaxed (.gpu) accesses
    // is all the reader needs (the argument of the matvec's flag-free fix-up, matvec_common.cuh,
    // finish_pair): a load that returns a value other than kPollEmpty returns the writer's store,
    // and the reset, after that load in program order, leaves the word empty. The next launch's
    // writers store only after their griddepcontrol.wait, i.e. after this grid has completed.
    if (rgi == 0) st_relaxed(f.poll + static_cast<int64_t>(out_head) * d_v + col, out_v);
    f_last = out_head * d_v + rank * W * CW == fb0;  // CTA-uniform: the block's first columns
    float* fw = f.poll + fb0 + fi;
    if (f_last && f_active) f_v = ld_relaxed4(fw);  // its first round trip under the stores below
    store_state();
    if (f_last && f_active) {
      while (poll_empty(f_v)) f_v = ld_relaxed4(fw);
      const float e = __uint_as_float(kPollEmpty);
      st_relaxed4(fw, make_float4(e, e, e, e));
    }
  } else if constexpr (kFold) {
    __shared__ unsigned f_count;
    __syncthreads();  // the CTA's output stores before thread 0's release
    if (threadIdx.x == 0) {
      unsigned old;
      asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;"
                   : "=r"(old)
                   : "l"(f.counters + fb0 / f.block), "r"(static_cast<unsigned>(fold_ctas - 1))
                   : "memory");
      f_count = old;
    }
    __syncthreads();  // thread 0's acquire before every thread's loads below
    f_last = f_count == static_cast<unsigned>(fold_ctas - 1);
    // every output of the block (the other CTAs' from L2), before the state's stores are issued
    if (f_last && f_active) f_v = __ldcg(reinterpret_cast<const float4*>(p.out + fb0 + fi));
    store_state();
  }

  // ---- the new conv state: the v channel by its column's first lane, q/k by the last CTA ----
  if (rgi == 0) {
#pragma unroll
    for (int j = 0; j < kTaps - 1; ++j)
      if (j < taps - 1) p.conv_state[j * width + ch_v] = j + 1 < taps - 1 ? vprev[j + 1] : xv;
  }
  if (warp == 0 && __shfl_sync(kFullMask, last, 0) == static_cast<unsigned>(rep * kC - 1)) {
#pragma unroll
    for (int m = 0; m < kMaxR; ++m)
      if (m < R) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int e = lane + 32 * m + half * d_k;
          const int64_t c = qk_channel(e);
#pragma unroll
          for (int j = 0; j < kTaps - 1; ++j)
            if (j < taps - 1)
              p.conv_state[j * width + c] = j + 1 < taps - 1 ? shifted[j * 2 * d_k + e]
                                            : kSplit         ? wlast[e]
                                                             : (half ? xk[m] : xq[m]);
        }
      }
  }
  if (kFold && f_last) {  // CTA-uniform: hadamard_kernel's register path on the block's outputs
    float* fbuf = shifted + (kTaps - 2) * 2 * d_k;
    float4 r =
        fwht_regs(f.signs ? make_float4(f_v.x * f_sg.x, f_v.y * f_sg.y, f_v.z * f_sg.z, f_v.w * f_sg.w) : f_v,
                  fbuf, f.block, f_active);
    const float rs = 1.0f / sqrtf(static_cast<float>(f.block));
    r = make_float4(r.x * rs, r.y * rs, r.z * rs, r.w * rs);
    if (f_active) {
      *reinterpret_cast<float4*>(f.rotated + fb0 + fi) = r;
      // warp w holds the 128 columns of activation block (fb0 + 128·w) / 128, lane its 4·lane..
      const int kb = (fb0 + fi) / kBlockK;
      quantize_block(r, lane, reinterpret_cast<uint32_t*>(f.xq + static_cast<size_t>(kb) * kActBytes),
                     f.meta + kb);
    }
  }
  if constexpr (kC > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (!push) asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
  }
}

}  // namespace

// gdn_decode_config: kernels/cuda/knobs.cpp (host code parsing the BONSAI_CUDA_GDN_* knobs).

bool gdn_decode_fits(const GdnFused& p) {
  const bool dk_ok = p.d_k == 32 || p.d_k == 64 || p.d_k == 128 || p.d_k == 256;
  return p.t == 1 && p.qkv && p.conv_w && p.conv_state && p.conv_counters && p.alpha_w && p.beta_w &&
         p.normed && p.norm_w && p.z && p.ssm_a && p.dt_bias && p.taps >= 1 && p.taps <= kTaps && dk_ok &&
         p.d_v > 0 && p.d_v % 32 == 0 && (p.d_k / 32) * p.d_v <= 32 * kMaxWarps && p.n_k > 0 &&
         p.n_v % p.n_k == 0 && (p.ab_type == RawType::F16 || p.ab_type == RawType::BF16) && p.ab_k > 0 &&
         p.ab_k % 4 == 0 && p.ab_row_bytes % 8 == 0 && reinterpret_cast<uintptr_t>(p.alpha_w) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.beta_w) % 8 == 0 && reinterpret_cast<uintptr_t>(p.normed) % 16 == 0;
}

namespace {
// CTAs per value head that gdn_decode launches (c.cluster where the head's warps divide).
int decode_ctas(const GdnFused& p, const GdnDecodeConfig& c) {
  const int warps = p.d_v * (p.d_k / 32) / 32;
  int C = clusters_available() ? c.cluster : 1;
  while (C > 1 && warps % C) C /= 2;
  return C;
}
}  // namespace

bool gdn_decode_folds(const GdnFused& p, const GdnDecodeConfig& c, int block) {
  // one float4 per thread of a Hadamard block of whole heads; the 2·block floats of fwht_regs'
  // buffers in shared memory beside the step's
  const int C = decode_ctas(p, c), threads = p.d_v * (p.d_k / 32) / C;
  const int64_t width = static_cast<int64_t>(p.n_v) * p.d_v;
  return C <= 2 && block > 0 && block % kBlockK == 0 && block % p.d_v == 0 && width % block == 0 &&
         block <= 4 * threads;
}

bool gdn_decode(const GdnFused& p, const GdnDecodeConfig& c, cudaStream_t s, const SplitSums* split,
                const GdnDecodeFwht* fwht) {
  const int R = p.d_k / 32, warps = p.d_v * R / 32;
  const int C = decode_ctas(p, c);
  const int W = warps / C;
  const int fblock = fwht ? fwht->block : 0;
  const bool fold = fwht && !split && fwht->rotated && fwht->xq && fwht->meta && fwht->counters &&
                    gdn_decode_folds(p, c, fblock);
  const size_t smem =
      (static_cast<size_t>(W) * 2 * kPad * R + 2 * p.d_k * kTaps + (fold ? 2 * fblock : 0)) * sizeof(float);
  const unsigned grid = static_cast<unsigned>(p.n_v * C), block = static_cast<unsigned>(32 * W);
  const int ab = c.ab_early ? 1 : 0, mb = c.membar_free ? 1 : 0, ce = c.count_early ? 1 : 0,
            pu = c.push && C > 1 ? 1 : 0;
  const SplitSums sq = split ? split[0] : SplitSums{}, sz = split ? split[1] : SplitSums{};
  GdnDecodeFwht f = fold ? *fwht : GdnDecodeFwht{};
  if (!c.fwht_poll || static_cast<int>(grid) > f.sm_count) f.poll = nullptr;  // the counted hand-off
  const int fold_ctas = fold ? fblock / p.d_v * C : 0;
  // <C, split, weak loads, fold> (split::sum_slots); without split the third parameter is unused
  auto pick = [&](auto k1, auto k1w, auto k0, auto k0f) {
    return split ? (c.split_weak ? k1w : k1) : fold ? k0f : k0;
  };
  cudaError_t e = cudaSuccess;
  if (C == 1)
    launch(pick(gdn_decode_kernel<1, true, false, false>, gdn_decode_kernel<1, true, true, false>,
                gdn_decode_kernel<1, false, false, false>, gdn_decode_kernel<1, false, false, true>),
           grid, block, smem, s, p, ab, mb, pu, ce, sq, sz, f, fold_ctas);
  else if (C == 2)
    e = launch_cluster(
        pick(gdn_decode_kernel<2, true, false, false>, gdn_decode_kernel<2, true, true, false>,
             gdn_decode_kernel<2, false, false, false>, gdn_decode_kernel<2, false, false, true>),
        grid, block, 2, smem, s, p, ab, mb, pu, ce, sq, sz, f, fold_ctas);
  else
    e = launch_cluster(
        pick(gdn_decode_kernel<4, true, false, false>, gdn_decode_kernel<4, true, true, false>,
             gdn_decode_kernel<4, false, false, false>, gdn_decode_kernel<4, false, false, false>),
        grid, block, 4, smem, s, p, ab, mb, pu, ce, sq, sz, f, fold_ctas);
  if (e != cudaSuccess) fail("cuda: gdn_decode over clusters of {}: {}", C, cudaGetErrorString(e));
  return fold;
}

}  // namespace bonsai::cuda
