// The prefill attention on the tensor cores, flash-attention style (BONSAI_CUDA_ATTN=3|4,
// attention_select.cpp; docs/performance.md, "The prefill attention").
//
// A block owns 16 query tokens × the g query heads of one KV head (warp w: head hk·g + w, its
// 16 tokens are the m16 rows of the mma) and one range of KV tiles (a split). The tiles of K
// and V (KT positions × D dims, fp16) are staged in shared memory by cp.async, two stages;
// S = Q·Kᵀ and O += P·V run as mma.sync m16n8k16 with fp16 operands and fp32 accumulation, the
// online softmax in fp32 on the S fragments. The fp32 KV cache rows are first converted into an
// fp16 copy [2][n_head_kv][pos0 + t][D] (one pass, ~4 MB read at the 27B's 512 positions), so
// the tile loads are plain 16-byte copies. A split's result goes to the same partial layout as
// attention_split_kernel's (max, sum, unnormalized O), merged by attention_merge; with one
// split the block writes the output (and the gate) itself.
//
// Numerics: q, k, v and the softmax weights p are rounded to fp16 (relative 2^-11 each); the
// scores, maxima, sums and O are fp32. Tests: CudaAttentionMma (test_backend_cuda_attn.cpp).
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace bonsai::cuda {
namespace {

using namespace attn_mma;

constexpr int kTok = 16;  // query tokens per block: the 16 rows of each warp's fragments

// kv16 [2][n_head_kv][n][d] (K then V) from the cache rows [0, n) ([n][n_head_kv][d]): f32 rows
// rounded to fp16, f16 rows (T = __half) copied as they are.
template <class T>
__global__ void kv_to_half_kernel(const T* __restrict__ k, const T* __restrict__ v, __half* kv16, int n,
                                  int n_head_kv, int d) {
  pdl_trigger();
  pdl_wait();
  const int64_t row = static_cast<int64_t>(n_head_kv) * d;  // floats per position
  const int64_t per = static_cast<int64_t>(n) * row / 8;    // 8-float chunks per cache
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= 2 * per) return;
  const int which = idx >= per;
  const int64_t e = (idx - which * per) * 8;
  const int64_t pos = e / row, h = (e % row) / d, dd = e % d;
  uint4 o;
  if constexpr (sizeof(T) == 2) {
    o = *reinterpret_cast<const uint4*>((which ? v : k) + e);
  } else {
    const float4* src = reinterpret_cast<const float4*>((which ? v : k) + e);
    const float4 a = src[0], b = src[1];
    o.x = pack_half2(a.x, a.y);
    o.y = pack_half2(a.z, a.w);
    o.z = pack_half2(b.x, b.y);
    o.w = pack_half2(b.z, b.w);
  }
  *reinterpret_cast<uint4*>(kv16 + ((which * n_head_kv + h) * n + pos) * d + dd) = o;
}

struct MmaArgs {
  const float* q;      // [t][n_head][D]
  const __half* kv16;  // [2][n_head_kv][n_rows][D]
  float* part;         // [t][n_head][splits][D + 2] (splits > 1)
  float* out;          // [t][n_head][D] (splits == 1)
  const float* gate;   // sigmoid(gate[(token·n_head + head)·gate_stride + dim]) times out, or null
  int64_t gate_stride;
  int t, pos0, n_rows, n_head, n_head_kv, splits;
  float scale;
};

// grid (token tiles, n_head_kv, splits), 32·g threads (g = n_head / n_head_kv <= 8 warps).
// Dynamic shared memory: Q [16·g rows][D], then 2 stages of K [KT][D] and V [KT][D], fp16.
template <int D, int KT, int MINB>
__global__ void __launch_bounds__(MINB == 2 ? 192 : 256, MINB) attention_mma_kernel(MmaArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  pdl_trigger();
  pdl_wait();
  const int g = a.n_head / a.n_head_kv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nthr = blockDim.x;
  const int tile = gridDim.x - 1 - blockIdx.x;  // the longest causal rows first
  const int hk = blockIdx.y, split = blockIdx.z;
  const int i0 = tile * kTok, nt = min(kTok, a.t - i0);
  const int n_max = a.pos0 + i0 + nt;  // positions seen by any token of the tile
  const int n_tiles = (n_max + KT - 1) / KT;
  const int per = (n_tiles + a.splits - 1) / a.splits;
  const int kt0 = split * per, kt1 = min(n_tiles, kt0 + per);  // may be empty (kt0 >= kt1)

  constexpr int kRowBytes = D * 2, kChunks = D / 8, kTileBytes = KT * kRowBytes;
  uint8_t* q_s = smem;
  uint8_t* kv_s = smem + g * kTok * kRowBytes;
  const __half* kh = a.kv16 + static_cast<int64_t>(hk) * a.n_rows * D;
  const __half* vh = a.kv16 + static_cast<int64_t>(a.n_head_kv + hk) * a.n_rows * D;

  auto load_tile = [&](int kt, int stage) {
    const uint32_t ks = smem_addr(kv_s + stage * 2 * kTileBytes);
    stage_kv_tile<D, KT>(ks, ks + kTileBytes, kh, vh, D, kt * KT, n_max, nthr);
  };
  if (kt0 < kt1) {
    load_tile(kt0, 0);
    cp_commit();
  }
  // Q rows of the tile as fp16 (rows past t zero): row w·16 + r is token i0 + r, head hk·g + w.
  for (int c = threadIdx.x; c < g * kTok * kChunks; c += nthr) {
    const int r = c / kChunks, cc = c % kChunks, w = r / kTok, row = r % kTok;
    store_q_chunk<D>(
        q_s, r, cc,
        row < nt ? a.q + (static_cast<int64_t>(i0 + row) * a.n_head + hk * g + w) * D + cc * 8 : nullptr);
  }

  // Fragment rows of this thread: gq (token i0 + gq) and gq + 8; columns 2·tq, 2·tq + 1.
  const int gq = lane >> 2, tq = lane & 3;
  const int lim0 = a.pos0 + i0 + gq + 1, lim1 = lim0 + 8;  // causal: positions < lim
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f,
        l1 = 0.0f;  // max of score·scale; sums (this thread's columns)
  const uint32_t q_base = smem_addr(q_s);

  for (int kt = kt0; kt < kt1; ++kt) {
    const int stage = (kt - kt0) & 1;
    tile_ready(kt + 1 < kt1, [&] { load_tile(kt + 1, stage ^ 1); });
    const uint32_t k_base = smem_addr(kv_s + stage * 2 * kTileBytes), v_base = k_base + kTileBytes;

    // S = Q Kᵀ: ldmatrix x4 of Q gives the A fragment (rows 0-7 / 8-15 × dims +0 / +8); of K
    // (rows = positions) the B fragments of two position octets (dims +0 / +8 each).
    float s[KT / 8][4];
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4];
      ldsm_x4(qa, q_base + swz<D>(warp * kTok + (lane & 7) + ((lane >> 3) & 1) * 8, kk * 2 + (lane >> 4)));
#pragma unroll
      for (int np = 0; np < KT / 16; ++np) {
        uint32_t kb[4];
        ldsm_x4(kb, k_base + swz<D>(np * 16 + (lane & 7) + (lane >> 4) * 8, kk * 2 + ((lane >> 3) & 1)));
        mma16816(s[2 * np], qa, kb[0], kb[1]);
        mma16816(s[2 * np + 1], qa, kb[2], kb[3]);
      }
    }

    // Online softmax per row (the 4 threads of a quad share a row): mask, scale, max.
    const int pb = kt * KT;
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int p = pb + n * 8 + 2 * tq + e;
        s[n][e] = p < lim0 ? s[n][e] * a.scale : -INFINITY;
        s[n][2 + e] = p < lim1 ? s[n][2 + e] * a.scale : -INFINITY;
        mx0 = fmaxf(mx0, s[n][e]);
        mx1 = fmaxf(mx1, s[n][2 + e]);
      }
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(kFullMask, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(kFullMask, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(kFullMask, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(kFullMask, mx1, 2));
    // A row with no position yet keeps max -inf: exponents taken against 0 then (every p is 0).
    const float mu0 = mx0 == -INFINITY ? 0.0f : mx0, mu1 = mx1 == -INFINITY ? 0.0f : mx1;
    const float c0 = exp2f((m0 - mu0) * kLog2e), c1 = exp2f((m1 - mu1) * kLog2e);  // 0 from -inf
    m0 = mx0;
    m1 = mx1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= c0;
      o[n][1] *= c0;
      o[n][2] *= c1;
      o[n][3] *= c1;
    }
    // P as A fragments (the C layout of position octets 2j, 2j + 1 is the A layout of k-step j);
    // the sums take the fp32 weights.
    uint32_t pa[KT / 16][4];
#pragma unroll
    for (int j = 0; j < KT / 16; ++j) {
      float w[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        w[h][0] = exp2f((s[2 * j + h][0] - mu0) * kLog2e);
        w[h][1] = exp2f((s[2 * j + h][1] - mu0) * kLog2e);
        w[h][2] = exp2f((s[2 * j + h][2] - mu1) * kLog2e);
        w[h][3] = exp2f((s[2 * j + h][3] - mu1) * kLog2e);
        l0 += w[h][0] + w[h][1];
        l1 += w[h][2] + w[h][3];
      }
      pa[j][0] = pack_half2(w[0][0], w[0][1]);
      pa[j][1] = pack_half2(w[0][2], w[0][3]);
      pa[j][2] = pack_half2(w[1][0], w[1][1]);
      pa[j][3] = pack_half2(w[1][2], w[1][3]);
    }
    // O += P V: ldmatrix x4.trans of V (rows = positions) gives the B fragments of two dim octets
    // (positions +0 / +8 each).
#pragma unroll
    for (int j = 0; j < KT / 16; ++j) {
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t vb[4];
        ldsm_x4_t(vb, v_base + swz<D>(j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dn * 2 + (lane >> 4)));
        mma16816(o[2 * dn], pa[j], vb[0], vb[1]);
        mma16816(o[2 * dn + 1], pa[j], vb[2], vb[3]);
      }
    }
    __syncthreads();  // this stage may be refilled next
  }

  l0 += __shfl_xor_sync(kFullMask, l0, 1);
  l0 += __shfl_xor_sync(kFullMask, l0, 2);
  l1 += __shfl_xor_sync(kFullMask, l1, 1);
  l1 += __shfl_xor_sync(kFullMask, l1, 2);
  const int h = hk * g + warp;
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int r = gq + hi * 8;
    if (r >= nt) continue;
    const int64_t th = static_cast<int64_t>(i0 + r) * a.n_head + h;
    const float m = hi ? m1 : m0, l = hi ? l1 : l0;
    if (a.splits == 1) {  // every position of the row is in this block: l >= 1
      const float inv = 1.0f / l;
      float* y = a.out + th * D;
      const float* gt = a.gate ? a.gate + th * a.gate_stride : nullptr;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int d = n * 8 + 2 * tq;
        float2 v = make_float2(o[n][2 * hi] * inv, o[n][2 * hi + 1] * inv);
        if (gt) {
          v.x *= sigmoid(gt[d]);
          v.y *= sigmoid(gt[d + 1]);
        }
        *reinterpret_cast<float2*>(y + d) = v;
      }
    } else {  // the partial of attention_split_kernel: max, sum, unnormalized O (max -inf: empty)
      float* pr = a.part + (th * a.splits + split) * (D + 2);
      if (tq == 0) {
        pr[0] = m;
        pr[1] = l;
      }
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<float2*>(pr + 2 + n * 8 + 2 * tq) = make_float2(o[n][2 * hi], o[n][2 * hi + 1]);
    }
  }
}

template <int D, int KT, int MINB>
void launch_mma(const MmaArgs& a, int g, cudaStream_t s) {
  const size_t smem = static_cast<size_t>(g * kTok + 4 * KT) * D * 2;
  auto kernel = attention_mma_kernel<D, KT, MINB>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  // MINB = 2: two blocks of 6 warps (2 × 113 KB) fit only in the largest carveout.
  cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                       cudaSharedmemCarveoutMaxShared);
  const dim3 grid((a.t + kTok - 1) / kTok, a.n_head_kv, a.splits);
  launch(kernel, grid, 32 * g, smem, s, a);
}

// Tiles of 32 positions (2 blocks per SM, group <= 6) for BONSAI_CUDA_ATTN=4, else 64.
bool small_tiles(int n_head, int n_head_kv) { return attention_mode() == 4 && n_head / n_head_kv <= 6; }

}  // namespace

bool attention_mma_fits(const float* q, const void* k_cache, const void* v_cache, int t, int n_head,
                        int n_head_kv, int head_dim) {
  const int mode = attention_mode();
  if (mode < 3 || t < kAttentionMmaMinTokens) return false;
  if (head_dim != 128 && head_dim != 256) return false;
  if (n_head_kv <= 0 || n_head % n_head_kv || n_head / n_head_kv > 8) return false;
  // float4 loads of q and the cache rows
  for (const void* p : {static_cast<const void*>(q), k_cache, v_cache})
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  return true;
}

int attention_mma_splits(int t, int pos0, int n_head, int n_head_kv, int sm_count) {
  if (const int forced = attention_mma_forced_splits()) return forced;
  const int kt = small_tiles(n_head, n_head_kv) ? 32 : 64, per_sm = kt == 32 ? 2 : 1;
  const int blocks = (t + kTok - 1) / kTok * n_head_kv;
  // As many splits as ONE wave holds (blocks · splits <= SMs · blocks per SM), not the fewest that
  // fill it: a split beyond that starts a second round of blocks, and with the merge's partials
  // it costs more than a fuller wave gains (27B, t = 256 after 256 positions: 64 blocks on 132
  // SMs; 1 split 41.1 us, 2 40.6, 3 53.7); and each split at least four KV tiles of the longest
  // token tile: the merge (partials written and read, one more launch) costs about what four
  // tiles of the longest block do (after 0 positions, 4 tiles: 1 split 25.9 us, 2 32.1; after
  // 256, 8 tiles: 41.1 against 40.6; docs/performance.md, prefill attention, session 6).
  const int want = std::max(1, sm_count * per_sm / blocks);
  const int cap = std::max(1, (pos0 + t + kt - 1) / kt / 4);
  return std::max(1, std::min({want, cap, 32}));
}

size_t attention_mma_scratch(int t, int pos0, int n_head, int n_head_kv, int head_dim, int splits) {
  const size_t part =
      splits > 1 ? static_cast<size_t>(t) * n_head * splits * (head_dim + 2) * sizeof(float) : 0;
  const size_t kv = 2 * static_cast<size_t>(pos0 + t) * n_head_kv * head_dim * sizeof(__half);
  return (part + 255) / 256 * 256 + kv;
}

void attention_mma(const float* q, const void* k_cache, const void* v_cache, KvType kv, float* out,
                   void* scratch, int t, int pos0, int splits, int n_head, int n_head_kv, int head_dim,
                   float scale, const float* gate, int64_t gate_stride, cudaStream_t s) {
  const size_t part_bytes =
      splits > 1 ? static_cast<size_t>(t) * n_head * splits * (head_dim + 2) * sizeof(float) : 0;
  auto* kv16 = reinterpret_cast<__half*>(static_cast<uint8_t*>(scratch) + (part_bytes + 255) / 256 * 256);
  const int n_rows = pos0 + t;
  const int64_t chunks = 2 * static_cast<int64_t>(n_rows) * n_head_kv * head_dim / 8;
  if (kv == KvType::F16)
    launch(kv_to_half_kernel<__half>, blocks_for(chunks, 256), 256, 0, s, static_cast<const __half*>(k_cache),
           static_cast<const __half*>(v_cache), kv16, n_rows, n_head_kv, head_dim);
  else
    launch(kv_to_half_kernel<float>, blocks_for(chunks, 256), 256, 0, s, static_cast<const float*>(k_cache),
           static_cast<const float*>(v_cache), kv16, n_rows, n_head_kv, head_dim);
  MmaArgs a{
      q,      kv16, static_cast<float*>(scratch), out, gate, gate_stride, t, pos0, n_rows, n_head, n_head_kv,
      splits, scale};
  const int g = n_head / n_head_kv;
  const bool small = small_tiles(n_head, n_head_kv);
  if (head_dim == 256)
    small ? launch_mma<256, 32, 2>(a, g, s) : launch_mma<256, 64, 1>(a, g, s);
  else
    small ? launch_mma<128, 32, 2>(a, g, s) : launch_mma<128, 64, 1>(a, g, s);
  if (splits > 1)
    attention_merge(static_cast<const float*>(scratch), out, t, n_head, splits, head_dim, gate, gate_stride,
                    s);
}

}  // namespace bonsai::cuda
