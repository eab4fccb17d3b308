// A decode step's attention over an f16 KV cache on the tensor cores (session 17; attention_decode_mma
// in launch.h). Why: the decode split kernels (attention_split.cu) are issue-bound at long contexts,
// a third of their instructions the FMAs of the dots and of the weighted V sum (96 per position and
// lane for the 27B's 6 query heads per KV head), so an f16 cache saved them only its loads
// (docs/performance.md, session 17). Here the group's query heads are the rows of an mma.sync
// m16n8k16 (6 of the 16 used), so 16 positions cost a warp 32 MMAs for the scores and 32 for P·V.
//
// grid (n_head_kv, splits), 4 warps. A block takes the positions [p0, p1) of its split (the cut of
// the split kernels) in tiles of kTile = 64, staged straight from the cache rows by cp.async in two
// stages (the rows of one KV head are n_head_kv·D halves apart); warp w scores positions w·16 ..
// w·16 + 15 of each tile against the group's query rows (fp16, rows past the group zero) and keeps
// its own online softmax and O over them; at the end the 4 warps' (max, sum, O) of each head are
// merged through shared memory into the split's partial, the layout of attention_split_kernel's,
// which attention_merge (or attention_merge_fwht) turns into the output.
//
// Numerics as the prefill's attention_mma_kernel: q, k, v and the softmax weights are fp16 (q rounded
// here; k and v are the cache's halves as they are), scores, maxima, sums and O fp32. Tests:
// CudaAttentionDecodeMma (test_backend_cuda_attn.cpp).
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace bonsai::cuda {
namespace {

using namespace attn_mma;

constexpr int kWarps = 4, kTile = 16 * kWarps;  // positions per tile: 16 per warp

template <int D>
constexpr int dec_mma_smem() {  // Q [16][D] and two stages of K [kTile][D], V [kTile][D], fp16
  return (16 + 4 * kTile) * D * 2;
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32, 1)
    attention_decode_mma_kernel(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                const __half* __restrict__ v_cache, float* __restrict__ part, int pos0,
                                const int* pos_dev, int n_head, int n_head_kv, float scale) {
  extern __shared__ __align__(128) uint8_t smem[];
  pdl_trigger();
  pdl_wait();
  constexpr int kRowBytes = D * 2, kChunks = D / 8, kTileBytes = kTile * kRowBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hk = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int g = n_head / n_head_kv;
  const int n_kv = position(pos0, pos_dev) + 1;
  const int per = (n_kv + splits - 1) / splits;
  const int p0 = split * per, p1 = min(n_kv, p0 + per);
  const int n_tiles = p1 > p0 ? (p1 - p0 + kTile - 1) / kTile : 0;
  uint8_t* q_s = smem;
  uint8_t* kv_s = smem + 16 * kRowBytes;
  const int64_t stride = static_cast<int64_t>(n_head_kv) * D;  // halves from one position to the next
  const __half* kh = k_cache + static_cast<int64_t>(hk) * D;
  const __half* vh = v_cache + static_cast<int64_t>(hk) * D;

  auto load_tile = [&](int tile, int stage) {
    const uint32_t ks = smem_addr(kv_s + stage * 2 * kTileBytes);
    stage_kv_tile<D, kTile>(ks, ks + kTileBytes, kh, vh, stride, p0 + tile * kTile, p1, kWarps * 32);
  };
  if (n_tiles > 0) {
    load_tile(0, 0);
    cp_commit();
  }
  // Q rows as fp16: row r < g is query head hk·g + r of the token, rows g .. 15 zero.
  for (int c = threadIdx.x; c < 16 * kChunks; c += kWarps * 32) {
    const int r = c / kChunks, cc = c % kChunks;
    store_q_chunk<D>(q_s, r, cc, r < g ? q + (static_cast<int64_t>(hk) * g + r) * D + cc * 8 : nullptr);
  }

  // Fragment row of this thread: gq (query head hk·g + gq when gq < g); its columns 2·tq, 2·tq + 1.
  // Rows gq + 8 (the fragments' second half) are past any group (g <= 8): their P is zero, so their
  // O stays zero and is never read.
  const int gq = lane >> 2, tq = lane & 3;
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, l0 = 0.0f;  // max of score·scale over this warp's positions; sum (own columns)
  const uint32_t q_base = smem_addr(q_s);

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int stage = tile & 1;
    tile_ready(tile + 1 < n_tiles, [&] { load_tile(tile + 1, stage ^ 1); });
    const uint32_t k_base = smem_addr(kv_s + stage * 2 * kTileBytes), v_base = k_base + kTileBytes;

    // S = Q Kᵀ over this warp's 16 positions: two position octets, dims in steps of 16.
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4], kb[4];
      ldsm_x4(qa, q_base + swz<D>((lane & 7) + ((lane >> 3) & 1) * 8, kk * 2 + (lane >> 4)));
      ldsm_x4(kb, k_base + swz<D>(warp * 16 + (lane & 7) + (lane >> 4) * 8, kk * 2 + ((lane >> 3) & 1)));
      mma16816(s[0], qa, kb[0], kb[1]);
      mma16816(s[1], qa, kb[2], kb[3]);
    }
    // Online softmax of row gq (the 4 threads of a quad share it): mask past p1, scale, max.
    const int pb = p0 + tile * kTile + warp * 16;
    float mx = m0;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int p = pb + n * 8 + 2 * tq + e;
        s[n][e] = p < p1 ? s[n][e] * scale : -INFINITY;
        mx = fmaxf(mx, s[n][e]);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
    // A warp with no position yet keeps max -inf: exponents taken against 0 then (every p is 0).
    const float mu = mx == -INFINITY ? 0.0f : mx;
    const float c0 = exp2f((m0 - mu) * kLog2e);  // 0 from -inf
    m0 = mx;
    l0 *= c0;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= c0;
      o[n][1] *= c0;
    }
    float w[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      w[n][0] = exp2f((s[n][0] - mu) * kLog2e);
      w[n][1] = exp2f((s[n][1] - mu) * kLog2e);
      l0 += w[n][0] + w[n][1];
    }
    // P as the A fragment of one k-step (positions 0-7: octet 0, 8-15: octet 1); rows gq + 8 zero.
    const uint32_t pa[4] = {pack_half2(w[0][0], w[0][1]), 0u, pack_half2(w[1][0], w[1][1]), 0u};
    // O += P V: ldmatrix x4.trans of the warp's 16 V rows gives the B fragments of two dim octets.
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t vb[4];
      ldsm_x4_t(vb, v_base + swz<D>(warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dn * 2 + (lane >> 4)));
      mma16816(o[2 * dn], pa, vb[0], vb[1]);
      mma16816(o[2 * dn + 1], pa, vb[2], vb[3]);
    }
    __syncthreads();  // this stage may be refilled next
  }
  l0 += __shfl_xor_sync(kFullMask, l0, 1);
  l0 += __shfl_xor_sync(kFullMask, l0, 2);

  // The warps' (max, sum, O) of each row through shared memory (the tiles' bytes: no copy is in
  // flight after the loop's last wait and barrier), merged per (head, dim) in warp order.
  float* sm_o = reinterpret_cast<float*>(kv_s);  // [kWarps][8][D]
  float* sm_m = sm_o + kWarps * 8 * D;           // [kWarps][8]
  float* sm_l = sm_m + kWarps * 8;
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    *reinterpret_cast<float2*>(sm_o + (warp * 8 + gq) * D + n * 8 + 2 * tq) = make_float2(o[n][0], o[n][1]);
  if (tq == 0) {
    sm_m[warp * 8 + gq] = m0;
    sm_l[warp * 8 + gq] = l0;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < g * D; idx += kWarps * 32) {
    const int r = idx / D, d = idx % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w * 8 + r]);
    float sum_l = 0.0f, sum_o = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = expf(sm_m[w * 8 + r] - mx);  // 0 for a warp without positions (m = -inf)
        sum_l += f * sm_l[w * 8 + r];
        sum_o += f * sm_o[(w * 8 + r) * D + d];
      }
    }
    float* pr = part + ((static_cast<int64_t>(hk) * g + r) * splits + split) * (D + 2);
    pr[2 + d] = sum_o;
    if (d == 0) {
      pr[0] = mx;
      pr[1] = sum_l;
    }
  }
}

template <int D>
auto dec_mma_kernel() {
  static const bool sized =
      cudaFuncSetAttribute(attention_decode_mma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           dec_mma_smem<D>()) == cudaSuccess;
  return sized ? attention_decode_mma_kernel<D> : nullptr;
}

}  // namespace

bool attention_decode_mma_shape(int n_head, int n_head_kv, int head_dim) {
  return (head_dim == 128 || head_dim == 256) && n_head_kv > 0 && n_head % n_head_kv == 0 &&
         n_head / n_head_kv <= 8;
}

int attention_decode_mma_wave(int n_head, int n_head_kv, int head_dim) {
  if (!attention_decode_mma_shape(n_head, n_head_kv, head_dim)) return 0;
  int device = 0, sms = 0, per_sm = 0;
  const auto kernel = head_dim == 256 ? dec_mma_kernel<256>() : dec_mma_kernel<128>();
  const int smem = head_dim == 256 ? dec_mma_smem<256>() : dec_mma_smem<128>();
  if (!kernel || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32, smem) != cudaSuccess) {
    cudaGetLastError();  // not available here: the split kernels run
    return 0;
  }
  return per_sm * sms / n_head_kv;
}

void attention_decode_mma(const float* q, const void* k_cache, const void* v_cache, float* part, int pos0,
                          const int* pos_dev, int splits, int n_head, int n_head_kv, int head_dim,
                          float scale, cudaStream_t s) {
  const auto kernel = head_dim == 256 ? dec_mma_kernel<256>() : dec_mma_kernel<128>();
  const int smem = head_dim == 256 ? dec_mma_smem<256>() : dec_mma_smem<128>();
  launch(kernel, dim3(n_head_kv, splits), kWarps * 32, smem, s, q, static_cast<const __half*>(k_cache),
         static_cast<const __half*>(v_cache), part, pos0, pos_dev, n_head, n_head_kv, scale);
}

}  // namespace bonsai::cuda
