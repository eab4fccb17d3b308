// Causal GQA attention over the KV cache (f32 or f16 elements), flash-decoding style: the split kernels
// (attention_split.cu) cut the positions of each (token, KV head) into `splits` ranges and compute
// an online-softmax partial per range; here the merge of the partials (with the output gate of the
// attention site, and the FWHT site of its output), the attention prep (q/k norms, RoPE, the cache
// rows) and attention() over both.
#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/site_fwht.cuh"
#include "kernels/cuda/split_sums.cuh"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {
namespace {

// Block per (token, head), thread per dim: the splits merged, times the output gate
// sigmoid(gate) when given (the attention site). Warp 0 turns the splits' maxima into
// weights first (splits <= 32), so each thread's loop over the splits is loads and FMAs
// only, all in flight together. S > 0: the split count known at compile time (32, every
// decode step): each thread loads its S partial values and its gate value right after the
// wait, together with warp 0's maxima and sums, so the kernel makes one memory round trip
// instead of three (weights, then the values in rounds of 8, then the gate); the same sum in
// the same order (bit-identical).
// More than 32 splits (S = 0; the long-context decode counts of attention_decode_splits, up to
// kAttentionMaxSplits): the block finds the maximum and the denominator (each thread's splits
// tid, tid + blockDim, ... in order, then warp_max / warp_sum, then the warps' values in warp
// order: a fixed order, so the result is deterministic), and the value sum keeps 32 loads in
// flight per thread.
template <int S>
__global__ void attention_merge_kernel(const float* __restrict__ part, float* __restrict__ out, int splits,
                                       int head_dim, const float* __restrict__ gate, int64_t gate_stride) {
  __shared__ float fac[kAttentionMaxSplits], inv_den, red[32];
  pdl_trigger();
  pdl_wait();
  if (S) splits = S;
  const int64_t th = blockIdx.x;  // token * n_head + head
  const int row = head_dim + 2;
  const float* pr = part + th * splits * row;
  // One dim per thread: the launch gives 128 threads up to head_dim 128, else 256 (head_dim <= 256).
  const int d = threadIdx.x;
  const bool has_d = d < head_dim;
  float pv[S > 0 ? S : 1];
  float g = 0.0f;
  if (S > 0 && has_d) {
#pragma unroll
    for (int sp = 0; sp < (S > 0 ? S : 1); ++sp) pv[sp] = pr[sp * row + 2 + d];
    if (gate) g = gate[th * gate_stride + d];
  }
  if (S == 0 && splits > 32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float mloc = -INFINITY;
    for (int sp = threadIdx.x; sp < splits; sp += blockDim.x) {
      fac[sp] = pr[sp * row];  // the maxima first, turned into weights below
      mloc = fmaxf(mloc, fac[sp]);
    }
    mloc = warp_max(mloc);
    if (lane == 0) red[warp] = mloc;
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < nw; ++w) mx = fmaxf(mx, red[w]);
    __syncthreads();  // red[] is reused for the sums
    float dloc = 0.0f;
    for (int sp = threadIdx.x; sp < splits; sp += blockDim.x) {
      const float m = fac[sp];
      const float f = m == -INFINITY ? 0.0f : expf(m - mx);  // 0 for an empty split
      dloc += f * pr[sp * row + 1];
      fac[sp] = f;
    }
    dloc = warp_sum(dloc);
    if (lane == 0) red[warp] = dloc;
    __syncthreads();
    if (threadIdx.x == 0) {
      float den = 0.0f;
      for (int w = 0; w < nw; ++w) den += red[w];
      inv_den = 1.0f / den;
    }
  } else if (threadIdx.x < 32) {
    const int sp = threadIdx.x;
    const float m = sp < splits ? pr[sp * row] : -INFINITY;
    const float lm = sp < splits ? pr[sp * row + 1] : 0.0f;  // loaded with m, not after the max
    const float mx = warp_max(m);
    const float f = m == -INFINITY ? 0.0f : expf(m - mx);  // 0 for an empty split
    const float den = warp_sum(sp < splits ? f * lm : 0.0f);
    fac[sp] = f;
    if (sp == 0) inv_den = 1.0f / den;
  }
  __syncthreads();
  if (!has_d) return;
  float num = 0.0f;
  if constexpr (S > 0) {
#pragma unroll
    for (int sp = 0; sp < (S > 0 ? S : 1); ++sp) num += fac[sp] * pv[sp];
  } else if (splits > 32) {
#pragma unroll 32
    for (int sp = 0; sp < splits; ++sp) num += fac[sp] * pr[sp * row + 2 + d];
    if (gate) g = gate[th * gate_stride + d];
  } else {
#pragma unroll 8
    for (int sp = 0; sp < splits; ++sp) num += fac[sp] * pr[sp * row + 2 + d];
    if (gate) g = gate[th * gate_stride + d];
  }
  const float o = num * inv_den;
  out[th * head_dim + d] = gate ? o * sigmoid(g) : o;
}

// attention_merge_kernel<32> and hadamard_kernel's forward register path (signs, FWHT of B = C·D
// columns, 1/√B, the int8 quantization) in one launch: block per (token, head) with one thread per
// dim, as the merge; a Hadamard block is C consecutive heads, run as a cluster of C blocks (rank q
// = head % C holds columns q·D .. of it). Each element sees the same operations on the same
// operands as in the two launches (out is still written), so the floats and bytes are the same:
// h = 1 .. 16 across lanes (shuffles), h = 32 .. D/2 across warps after one barrier (each thread
// reads the same float4 of every warp and runs the NW-point butterflies in the reference's order),
// by then in hadamard_kernel's layout (a thread per float4: slice s = d / (D/4) of the block
// computes float4 d % (D/4)); h = D .. B/2 across the cluster: slice s pushes its float4 into the
// blocks r ≡ s (mod 4) but its own with st.async, counted on the receiver's mbarrier
// (residual_norm_split_kernel<2>'s one-way exchange, no release fence), and slice 0 waits for the
// C - 1 others, runs the C-point butterflies, scales, stores y and quantizes (a warp per 128
// columns, as hadamard_kernel).
template <int D, int C>
__global__ void __launch_bounds__(D)
    attention_merge_fwht_kernel(const float* __restrict__ part, float* __restrict__ out,
                                const float* __restrict__ gate, int64_t gate_stride,
                                const float* __restrict__ signs, float* __restrict__ y,
                                uint8_t* __restrict__ xq, float4* __restrict__ meta, int n_head) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int S = 32, NW = D / 32, G = D / 4, row = D + 2;
  __shared__ float fac[32], inv_den;
  __shared__ __align__(16) float xw[D];
  __shared__ __align__(16) float4 recv[C][G];  // recv[r]: block r's float4s (C > 1)
  __shared__ __align__(8) uint64_t bar;
  pdl_trigger();
  const int d = static_cast<int>(threadIdx.x), lane = d & 31;
  const int64_t th = blockIdx.x;  // token * n_head + head
  const int head = static_cast<int>(th % n_head), q = head % C;
  const int64_t col0 = (th / n_head) * n_head * D + static_cast<int64_t>(head) * D;  // y's row offset + head
  const float sgn = signs ? signs[head * D + d] : 1.0f;  // a weight: not written by any kernel
  [[maybe_unused]] uint32_t bar_a = 0;
  if constexpr (C > 1) {
    bar_a = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
    if (d == 0) push_init(bar_a, (C - 1) * D * 4);  // the other blocks' float4s
    // published to the cluster (own shared memory only: no PDL hazard before the wait); the
    // matching wait precedes the first push
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  }
  pdl_wait();
  // ---- the merge (attention_merge_kernel<32>) ----
  const float* pr = part + th * S * row;
  float pv[S];
#pragma unroll
  for (int sp = 0; sp < S; ++sp) pv[sp] = pr[sp * row + 2 + d];
  const float g = gate ? gate[th * gate_stride + d] : 0.0f;
  if (d < 32) {
    const float m = pr[d * row];
    const float lm = pr[d * row + 1];
    const float mx = warp_max(m);
    const float f = m == -INFINITY ? 0.0f : expf(m - mx);  // 0 for an empty split
    const float den = warp_sum(f * lm);
    fac[d] = f;
    if (d == 0) inv_den = 1.0f / den;
  }
  __syncthreads();
  float num = 0.0f;
#pragma unroll
  for (int sp = 0; sp < S; ++sp) num += fac[sp] * pv[sp];
  const float o = num * inv_den;
  const float a = gate ? o * sigmoid(g) : o;
  out[th * D + d] = a;
  // ---- the FWHT: h = 1 .. 16 across lanes ----
  float v = signs ? a * sgn : a;
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    const float w = __shfl_xor_sync(kFullMask, v, m);
    v = lane & m ? w - v : v + w;
  }
  // h = 32 .. D/2 across warps, into hadamard_kernel's layout: float4 gi (elements 4·gi ..) of the head
  const int gi = d % G, slice = d / G, jw = gi / 8;  // jw: the warp that held those elements
  xw[d] = v;
  __syncthreads();
  float4 z[NW];
#pragma unroll
  for (int j = 0; j < NW; ++j) z[j] = *reinterpret_cast<const float4*>(xw + (4 * gi) % 32 + 32 * j);
  float4 f = butterflies_own(z, jw);
  // ---- h = D .. B/2 across the cluster's blocks ----
  if constexpr (C > 1) {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // every mbarrier is initialised
    const uint32_t src = static_cast<uint32_t>(__cvta_generic_to_shared(&recv[q][gi]));
    for (int r = slice; r < C; r += 4)
      if (r != q) push4(src, bar_a, r, f);
  }
  if (slice != 0) return;
  if constexpr (C > 1) {
    push_wait(bar_a);  // every other block's float4s have landed here
    float4 c[C];
#pragma unroll
    for (int r = 0; r < C; ++r) c[r] = r == q ? f : recv[r][gi];
    f = butterflies_own(c, q);  // stage h = m·D: block r's element with block r + m's
  }
  const float sc = 1.0f / sqrtf(static_cast<float>(C * D));
  const float4 ov = make_float4(f.x * sc, f.y * sc, f.z * sc, f.w * sc);
  const int64_t at = col0 + 4 * gi;
  *reinterpret_cast<float4*>(y + at) = ov;
  // warp w of slice 0 holds the head's columns 128·w .. (one activation block), lane its 4·lane ..
  quantize_block(ov, lane, reinterpret_cast<uint32_t*>(xq + (at / kBlockK) * kActBytes), meta + at / kBlockK);
#else
  __trap();  // launched only on compute capability 9.x (attention_merge_fwht)
#endif
}

// Block per (head slot, token): slots [0, n_head) are query heads (from qf's query half),
// [n_head, n_head + n_head_kv) key heads, then value heads; thread per dim (blockDim = d).
// Queries and keys: RMSNorm with their gain, then NeoX RoPE on the first n_rot dims, the
// same arithmetic as rmsnorm_kernel and rope_kernel; keys and values go to their cache rows.
// kSplit: qf, k and v are the unsummed outputs of the deferred q/k/v matvec (sq, sk, sv;
// launch.h, SplitSums): each thread adds its element's slots (a query head's thread its query
// and its gate element together; split::sum_slots, the matvec fix-up's additions: the same
// floats) and writes the sums back to qf / k / v (the merge reads the gate from qf); the gain
// is loaded and the slot addresses formed before the dependency wait.
// Element idx of a cache row of type kv (uniform across the grid: one predictable branch).
__device__ __forceinline__ void put_cache(void* cache, KvType kv, int64_t idx, float x) {
  if (kv == KvType::F16)
    static_cast<__half*>(cache)[idx] = to_cache<__half>(x);
  else
    static_cast<float*>(cache)[idx] = x;
}

template <bool kSplit>
__global__ void attention_prep_kernel(AttnPrep p, int pos0, const int* pos_dev, SplitSums sq, SplitSums sk,
                                      SplitSums sv, int weak) {
  extern __shared__ float row[];  // [head_dim]
  pdl_trigger();
  const int slot = blockIdx.x, i = blockIdx.y, d = p.head_dim, e = threadIdx.x;
  const bool is_v = slot >= p.n_head + p.n_head_kv, is_q = slot < p.n_head;
  float gain = 0.0f;
  // kSplit: the element's slots (a query head's thread: its query and its gate, d rows on) and
  // where its sum goes back
  const int h = is_v ? slot - p.n_head - p.n_head_kv : is_q ? slot : slot - p.n_head;
  split::Slots el[2];
  float* ysum = nullptr;
  if constexpr (kSplit) {
    if (!is_v) gain = (is_q ? p.q_norm : p.k_norm)[e];
    const int r = is_q ? h * 2 * d + e : h * d + e;
    const SplitSums& sj = is_q ? sq : is_v ? sv : sk;
    el[0] = split::slots_of(sj, i, r);
    if (is_q) el[1] = split::slots_of(sq, i, r + d);
    ysum = sj.y + static_cast<int64_t>(i) * sj.n + r;
  }
  pdl_wait();
  const int pos = position(pos0, pos_dev) + i;
  const int64_t kv = static_cast<int64_t>(p.n_head_kv) * d;
  if (is_v) {  // value head: a copy into the cache
    const int hv = h;
    float x;
    if constexpr (kSplit) {
      const split::Slots ev[1] = {el[0]};
      float v1[1];
      if (weak)  // (see split::sum_slots)
        split::sum_slots<1, split::kBatchN, true>(ev, v1);
      else
        split::sum_slots(ev, v1);
      x = v1[0];
      if (el[0].nr > 1) ysum[0] = x;
    } else {
      x = p.v[static_cast<int64_t>(i) * kv + hv * d + e];
    }
    put_cache(p.v_cache, p.kv, pos * kv + static_cast<int64_t>(hv) * d + e, x);
    return;
  }
  float x;
  if constexpr (kSplit) {  // (a key head's el[1] has nr 0: skipped)
    float v2[2];
    if (weak)
      split::sum_slots<2, split::kBatchN, true>(el, v2);
    else
      split::sum_slots(el, v2);
    x = v2[0];
    if (el[0].nr > 1) ysum[0] = x;
    if (is_q && el[1].nr > 1) ysum[d] = v2[1];
  } else {
    x = is_q ? p.qf[(static_cast<int64_t>(i) * p.n_head + h) * 2 * d + e]
             : p.k[static_cast<int64_t>(i) * kv + static_cast<int64_t>(h) * d + e];
  }
  const float ss = block_sum(x * x);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(d) + p.eps);
  if constexpr (!kSplit) gain = (is_q ? p.q_norm : p.k_norm)[e];
  row[e] = x * scale * gain;
  __syncthreads();
  const int half = p.n_rot / 2;
  float y = row[e];
  if (e < p.n_rot) {
    const int j = e < half ? e : e - half;
    const float theta =
        static_cast<float>(pos) * powf(p.base, -2.0f * static_cast<float>(j) / static_cast<float>(p.n_rot));
    float sn, cs;
    sincosf(theta, &sn, &cs);
    const float a = row[j], b = row[j + half];
    y = e < half ? a * cs - b * sn : a * sn + b * cs;
  }
  if (is_q)
    p.q[(static_cast<int64_t>(i) * p.n_head + h) * d + e] = y;
  else
    put_cache(p.k_cache, p.kv, pos * kv + static_cast<int64_t>(h) * d + e, y);
}

}  // namespace

void attention(const float* q, const void* k_cache, const void* v_cache, KvType kv, float* out, float* part,
               int t, int pos0, const int* pos_dev, int splits, bool batch, int n_head, int n_head_kv,
               int head_dim, float scale, const float* gate, int64_t gate_stride, cudaStream_t s) {
  attention_splits(q, k_cache, v_cache, kv, part, t, pos0, pos_dev, splits, batch, n_head, n_head_kv,
                   head_dim, scale, s);
  attention_merge(part, out, t, n_head, splits, head_dim, gate, gate_stride, s);
}

void attention_merge(const float* part, float* out, int t, int n_head, int splits, int head_dim,
                     const float* gate, int64_t gate_stride, cudaStream_t s) {
  launch(splits == 32 ? attention_merge_kernel<32> : attention_merge_kernel<0>,
         static_cast<unsigned>(t) * n_head, head_dim <= 128 ? 128 : 256, 0, s, part, out, splits, head_dim,
         gate, gate_stride);
}

bool attention_merge_fwht(const float* part, float* out, int t, int n_head, int splits, int head_dim,
                          const float* gate, int64_t gate_stride, const float* signs, float* y, int64_t block,
                          uint8_t* xq, float4* meta, cudaStream_t s) {
  if (splits != 32 || (head_dim != 128 && head_dim != 256) || block % head_dim || !xq || !meta ||
      !clusters_available())
    return false;
  const int64_t c = block / head_dim;
  if ((c != 1 && c != 2 && c != 4 && c != 8) || n_head % c) return false;
  using Kernel =
      void (*)(const float*, float*, const float*, int64_t, const float*, float*, uint8_t*, float4*, int);
  static const Kernel kernels[2][4] = {
      {attention_merge_fwht_kernel<128, 1>, attention_merge_fwht_kernel<128, 2>,
       attention_merge_fwht_kernel<128, 4>, attention_merge_fwht_kernel<128, 8>},
      {attention_merge_fwht_kernel<256, 1>, attention_merge_fwht_kernel<256, 2>,
       attention_merge_fwht_kernel<256, 4>, attention_merge_fwht_kernel<256, 8>}};
  const Kernel kernel = kernels[head_dim == 256 ? 1 : 0][c == 1 ? 0 : c == 2 ? 1 : c == 4 ? 2 : 3];
  const unsigned grid = static_cast<unsigned>(t) * n_head, threads = static_cast<unsigned>(head_dim);
  if (c == 1) {
    launch(kernel, grid, threads, 0, s, part, out, gate, gate_stride, signs, y, xq, meta, n_head);
    return true;
  }
  return launch_cluster(kernel, dim3(grid), dim3(threads), dim3(static_cast<unsigned>(c), 1, 1), 0, s, part,
                        out, gate, gate_stride, signs, y, xq, meta, n_head) == cudaSuccess;
}

void attention_prep(const AttnPrep& p, int t, int pos0, const int* pos_dev, cudaStream_t s,
                    const SplitSums* split, bool weak) {
  const SplitSums none{};
  launch(split ? attention_prep_kernel<true> : attention_prep_kernel<false>,
         dim3(p.n_head + 2 * p.n_head_kv, t), p.head_dim, p.head_dim * sizeof(float), s, p, pos0, pos_dev,
         split ? split[0] : none, split ? split[1] : none, split ? split[2] : none, weak ? 1 : 0);
}

}  // namespace bonsai::cuda
