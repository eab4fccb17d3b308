// The head's candidate selection on the device (Backend::top_k): the k best logits of
// the n_vocab row in two passes, so that only 2k words cross to the host.
//
//   pass 1: B blocks, each the k best of its contiguous slice of x (B * k candidates);
//   pass 2: one block, the k best of those candidates.
//
// Every global top-k element is among its slice's top k, so pass 2 sees all of them.
// Within a block the k best come out one per round: round r takes the best element
// strictly worse than the pick of round r-1 under the total order (value desc, index
// asc) — keys are distinct (indices are), so k rounds give the k best in order. NaN is
// read as -inf, which makes the order total and matches ref::top_k / the Sampler.
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace bonsai::cuda {
namespace {

constexpr int kPass1Threads = 256;
constexpr int kPass2Threads = 1024;
constexpr int kMaxBlocks = 128;         // pass-1 blocks: at most kMaxBlocks * 64 candidates
constexpr int64_t kMinPerBlock = 2048;  // fewer elements per block would not pay a block

// (va, ia) ranks before (vb, ib).
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// The k best of `count` elements (load(j, v, id), j < count) with the whole block, best
// first, written by thread 0 to out_v / out_i[0..k). When fewer than k exist, the rest
// are the sentinel (-inf, INT_MAX), which ranks after every real element (ids < INT_MAX).
template <class Load>
__device__ void select_k(int64_t count, int k, Load load, float* out_v, int* out_i) {
  __shared__ float warp_v[32];
  __shared__ int warp_i[32];
  __shared__ float pick_v;
  __shared__ int pick_i;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  float last_v = INFINITY;  // the previous round's pick; (+inf, -1) ranks before everything
  int last_i = -1;
  for (int r = 0; r < k; ++r) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
      float v;
      int id;
      load(j, v, id);
      if (better(last_v, last_i, v, id) && better(v, id, bv, bi)) {
        bv = v;
        bi = id;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFullMask, bv, o);
      const int oi = __shfl_xor_sync(kFullMask, bi, o);
      if (better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      warp_v[warp] = bv;
      warp_i[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
      bv = lane < nwarps ? warp_v[lane] : -INFINITY;
      bi = lane < nwarps ? warp_i[lane] : INT_MAX;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(kFullMask, bv, o);
        const int oi = __shfl_xor_sync(kFullMask, bi, o);
        if (better(ov, oi, bv, bi)) {
          bv = ov;
          bi = oi;
        }
      }
      if (lane == 0) {
        pick_v = bv;
        pick_i = bi;
        out_v[r] = bv;
        out_i[r] = bi;
      }
    }
    // Also orders this round's reads of warp_v/warp_i before the next round's writes, and
    // every thread reads pick_* below before thread 0 can pass the next round's first barrier.
    __syncthreads();
    last_v = pick_v;
    last_i = pick_i;
  }
}

__device__ __forceinline__ float sanitize(float v) { return v != v ? -INFINITY : v; }

// Block b: the k best of x[b * per_block, min(n, (b + 1) * per_block)) into cand[b * k ...).
__global__ void __launch_bounds__(kPass1Threads)
    topk_slices_kernel(const float* __restrict__ x, int64_t n, int64_t per_block, int k,
                       float* __restrict__ cand_v, int* __restrict__ cand_i) {
  pdl_trigger();
  pdl_wait();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * per_block;
  const int64_t end = begin + per_block < n ? begin + per_block : n;
  const int64_t count = end > begin ? end - begin : 0;
  select_k(
      count, k,
      [&](int64_t j, float& v, int& id) {
        v = sanitize(x[begin + j]);
        id = static_cast<int>(begin + j);
      },
      cand_v + static_cast<int64_t>(blockIdx.x) * k, cand_i + static_cast<int64_t>(blockIdx.x) * k);
}

// The k best of `count` candidates into out: ids[k] then values[k] (f32 bits).
__global__ void __launch_bounds__(kPass2Threads)
    topk_merge_kernel(const float* __restrict__ cand_v, const int* __restrict__ cand_i, int64_t count, int k,
                      uint32_t* __restrict__ out) {
  pdl_trigger();
  pdl_wait();
  select_k(
      count, k,
      [&](int64_t j, float& v, int& id) {
        v = cand_v[j];
        id = cand_i[j];
      },
      reinterpret_cast<float*>(out + k), reinterpret_cast<int*>(out));
}

int slice_blocks(int64_t n) {
  const int64_t b = (n + kMinPerBlock - 1) / kMinPerBlock;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

}  // namespace

size_t top_k_scratch_words(int64_t n, int k) { return 2 * static_cast<size_t>(slice_blocks(n)) * k; }

void top_k(const float* x, int64_t n, int k, uint32_t* scratch, uint32_t* out, cudaStream_t s) {
  const int blocks = slice_blocks(n);
  const int64_t per_block = (n + blocks - 1) / blocks;
  const int64_t cands = static_cast<int64_t>(blocks) * k;
  float* cand_v = reinterpret_cast<float*>(scratch);
  int* cand_i = reinterpret_cast<int*>(scratch + cands);
  launch(topk_slices_kernel, static_cast<unsigned>(blocks), kPass1Threads, 0, s, x, n, per_block, k, cand_v,
         cand_i);
  launch(topk_merge_kernel, 1u, kPass2Threads, 0, s, cand_v, cand_i, cands, k, out);
}

}  // namespace bonsai::cuda
