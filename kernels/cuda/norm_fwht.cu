// RMS norms and the blockwise Walsh–Hadamard site (optionally quantizing its
// output for the ternary matvec in the same pass).
#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>

#include <cooperative_groups.h>

#include "bonsai/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/knobs.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/site_fwht.cuh"
#include "kernels/cuda/split_sums.cuh"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {

namespace {

__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ gain, float* y,
                               int64_t n, float eps) {
  pdl_trigger();
  pdl_wait();
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * gain[i];
}

// Warp per row of d values.
__global__ void gated_rmsnorm_kernel(const float* __restrict__ o, const float* __restrict__ z,
                                     const float* __restrict__ w, float* __restrict__ y, int64_t rows,
                                     int64_t d, float eps) {
  pdl_trigger();
  pdl_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const float* orow = o + row * d;
  float ss = 0.0f;
  for (int64_t i = lane; i < d; i += 32) ss += orow[i] * orow[i];
  ss = warp_sum(ss);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  for (int64_t i = lane; i < d; i += 32) y[row * d + i] = orow[i] * scale * w[i] * silu(z[row * d + i]);
}

// In-place blockwise FWHT of buf[0, n) (blocks of `block`), the reference's butterfly
// order; all threads of the block take part.
__device__ void fwht_shared(float* buf, int n, int block) {
  for (int h = 1; h < block; h <<= 1) {
    for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
      const int jj = ((i & ~(h - 1)) << 1) | (i & (h - 1));  // pairs never cross blocks: h < block
      const float a = buf[jj], b = buf[jj + h];
      buf[jj] = a + b;
      buf[jj + h] = a - b;
    }
    __syncthreads();
  }
}

// Quantize buf[0, n) (n % 128 == 0) as activation blocks first_blk, first_blk + 1, ...
__device__ void quantize_shared(const float* buf, int n, int64_t first_blk, uint8_t* xq, float4* meta) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  for (int c = warp; c < n / kBlockK; c += nwarps) {
    const float4 v = *reinterpret_cast<const float4*>(buf + c * kBlockK + lane * 4);
    quantize_block(v, lane, reinterpret_cast<uint32_t*>(xq + (first_blk + c) * kActBytes),
                   meta + first_blk + c);
  }
}

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
  return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}
__device__ __forceinline__ float4 scale4(float4 a, float s) {
  return make_float4(a.x * s, a.y * s, a.z * s, a.w * s);
}

// *dst = max |o| over the block's threads (one float4 each), every thread of the block taking
// part: fmaxf from 0, so NaN is ignored as act_f16_kernel's amax ignores it (the fp16 record's
// per-token exponent is then formed from the row's blocks: cuda::site_f16_two_pass).
__device__ __forceinline__ void store_block_amax(float4 o, float* dst, float* red) {
  float m = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float a = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) a = fmaxf(a, red[w]);
    *dst = a;
  }
}

constexpr int kMaxVec = 2;  // float4s per thread: blocks up to 8192 with 1024 threads

// fwht_regs: site_fwht.cuh.

// Block per (row, Hadamard block); thread i holds float4s i, i + blockDim, ... of the block,
// all loaded in one round trip. The reference's butterfly order (bit-identical to
// kernels/ref/fwht.cpp), then the optional quantization. With `up`, the input is
// silu(x) ⊙ up, also written to `act` (the SwiGLU site).
__global__ void hadamard_kernel(const float* x, const float* up, float* act, const float* __restrict__ signs,
                                float* y, int64_t k, int block, bool inverse, uint8_t* __restrict__ xq,
                                float4* __restrict__ meta, float* __restrict__ bamax) {
  extern __shared__ float buf[];
  __shared__ float red[32];
  pdl_trigger();
  pdl_wait();
  const int64_t off = blockIdx.x * k + static_cast<int64_t>(blockIdx.y) * block;
  const int b0 = blockIdx.y * block;
  if (4 * static_cast<int>(blockDim.x) == block) {  // one float4 per thread: FWHT in registers
    const int i = 4 * threadIdx.x;
    float4 v1 = ld4(x + off + i);
    const float4 sg1 = signs ? ld4(signs + b0 + i) : make_float4(1, 1, 1, 1);
    if (up) {
      const float4 u1 = ld4(up + off + i);
      v1 = make_float4(silu(v1.x) * u1.x, silu(v1.y) * u1.y, silu(v1.z) * u1.z, silu(v1.w) * u1.w);
      if (act) st4(act + off + i, v1);  // null: nobody reads it (Backend::swiglu_site)
    }
    float4 o = fwht_regs(!inverse && signs ? mul4(v1, sg1) : v1, buf, block);
    o = scale4(o, 1.0f / sqrtf(static_cast<float>(block)));
    if (inverse && signs) o = mul4(o, sg1);
    st4(y + off + i, o);
    // warp w holds the 128 columns of activation block (off + 128 w) / 128, lane its 4·lane..
    if (xq)
      quantize_block(o, threadIdx.x & 31, reinterpret_cast<uint32_t*>(xq + ((off + i) / kBlockK) * kActBytes),
                     meta + (off + i) / kBlockK);
    // [rows][k / block]: the register path only (block <= 4096; swiglu_hadamard checks)
    if (bamax) store_block_amax(o, bamax + static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y, red);
    return;
  }
  float4 v[kMaxVec], sg[kMaxVec], u[kMaxVec];
#pragma unroll
  for (int r = 0; r < kMaxVec; ++r) {
    const int i = (threadIdx.x + r * blockDim.x) * 4;
    if (i >= block) break;
    v[r] = ld4(x + off + i);
    if (up) u[r] = ld4(up + off + i);
    if (signs) sg[r] = ld4(signs + b0 + i);
  }
#pragma unroll
  for (int r = 0; r < kMaxVec; ++r) {
    const int i = (threadIdx.x + r * blockDim.x) * 4;
    if (i >= block) break;
    if (up) {
      v[r] = make_float4(silu(v[r].x) * u[r].x, silu(v[r].y) * u[r].y, silu(v[r].z) * u[r].z,
                         silu(v[r].w) * u[r].w);
      if (act) st4(act + off + i, v[r]);  // null: nobody reads it (Backend::swiglu_site)
    }
    st4(buf + i, !inverse && signs ? mul4(v[r], sg[r]) : v[r]);
  }
  __syncthreads();
  fwht_shared(buf, block, block);
  const float scale = 1.0f / sqrtf(static_cast<float>(block));
#pragma unroll
  for (int r = 0; r < kMaxVec; ++r) {
    const int i = (threadIdx.x + r * blockDim.x) * 4;
    if (i >= block) break;
    float4 o = scale4(ld4(buf + i), scale);
    if (inverse && signs) o = mul4(o, sg[r]);
    st4(y + off + i, o);
    st4(buf + i, o);
  }
  if (!xq) return;
  __syncthreads();
  quantize_shared(buf, block, off / kBlockK, xq, meta);
}

// The decode SwiGLU site (kUp: act = silu(x) ⊙ up) or plain FWHT site (forward, quantized) with
// x and up read through SplitSums: the unsummed outputs of a deferred matvec, each float4 the
// sum of its slots in rank order (split_sums.cuh; gate and up's loads in one round trip), or
// plain inputs (split_whole). Split float4s are written back to x.y / up.y (what matmul
// promised). C thread blocks of block / (4·C) threads per (row, Hadamard block): C == 1 is
// hadamard_kernel's register path; C > 1 runs as a cluster of (1, C): block q holds columns
// [q·bq, (q+1)·bq) of the Hadamard block (bq = block / C), runs the FWHT stages h < bq in
// registers and shared memory (fwht_regs over bq), publishes them in its shared memory, and
// after a cluster barrier reads the same float4 of the C blocks (distributed shared memory) and
// runs the stages h = bq, 2·bq, .. block/2 on them (butterflies (r, r + m) over the blocks in the
// reference's order), keeping its own. Every element sees the same additions as in
// hadamard_kernel: the same floats. The signs (a weight) are loaded before the dependency wait.
template <int C, bool kUp>
__global__ void fwht_split_kernel(SplitSums x, SplitSums up, float* act, const float* __restrict__ signs,
                                  float* y, int64_t k, int block, uint8_t* __restrict__ xq,
                                  float4* __restrict__ meta) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ float buf[];  // [2 · bq] fwht_regs' buffers, C > 1: [bq] the published stages
  pdl_trigger();
  const int bq = block / C, q = static_cast<int>(blockIdx.y) % C, tok = static_cast<int>(blockIdx.x);
  const int col = (static_cast<int>(blockIdx.y) / C) * block + q * bq + 4 * static_cast<int>(threadIdx.x);
  const int64_t off = static_cast<int64_t>(tok) * k + col;
  const float4 sg = signs ? ld4(signs + col) : make_float4(1, 1, 1, 1);  // not written by any kernel
  pdl_wait();                                                            // the matvec's slots and y
  float4 v;
  bool xs = false;
  if (kUp) {
    float4 u;
    bool us = false;
    split::load4x2(x, up, tok, col, &v, &u, &xs, &us);
    if (us) st4(up.y + off, u);
    if (xs) st4(x.y + off, v);
    v = make_float4(silu(v.x) * u.x, silu(v.y) * u.y, silu(v.z) * u.z, silu(v.w) * u.w);
    if (act) st4(act + off, v);  // null: nobody reads it (Backend::swiglu_site)
  } else {
    // The plain FWHT site: up unused; 8 slots per round trip (load4's 32 take 168 registers)
    (void)up;
    v = split::load4<split::kBatch2>(x, tok, col, &xs);
    if (xs) st4(x.y + off, v);
  }
  float4 o = fwht_regs(signs ? mul4(v, sg) : v, buf, bq);
  if constexpr (C > 1) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    float* pub = buf + 2 * bq;
    st4(pub + 4 * threadIdx.x, o);
    cluster.sync();  // every block's stages h < bq are in its shared memory
    float4 z[C];
#pragma unroll
    for (int r = 0; r < C; ++r) z[r] = ld4(cluster.map_shared_rank(pub, r) + 4 * threadIdx.x);
    // Done reading the other blocks' shared memory; the matching wait before the block exits
    // keeps each block's memory alive until every block of the cluster has read it.
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#pragma unroll
    for (int m = 1; m < C; m <<= 1)  // stage h = m·bq: element (r, i) with (r + m, i), r & m == 0
#pragma unroll
      for (int r = 0; r < C; ++r)
        if (!(r & m)) {
          const float4 a = z[r], b = z[r + m];
          z[r] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
          z[r + m] = make_float4(a.x - b.x, a.y - b.y, a.z - b.z, a.w - b.w);
        }
#pragma unroll
    for (int r = 0; r < C; ++r)
      if (r == q) o = z[r];
  }
  o = scale4(o, 1.0f / sqrtf(static_cast<float>(block)));
  st4(y + off, o);
  // warp w holds 128 columns of one activation block (bq % 128 == 0), lane its 4·lane..
  if (xq)
    quantize_block(o, threadIdx.x & 31, reinterpret_cast<uint32_t*>(xq + (off / kBlockK) * kActBytes),
                   meta + off / kBlockK);
  if constexpr (C > 1) asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __trap();  // launched only on compute capability 9.x (fwht_site_split)
#endif
}

// Block per (row, Hadamard block), blockDim = block/4: x_out = x + delta, normed =
// rmsnorm(x_out)·gain, rotated = FWHT(s ⊙ normed)/√B, quantized; the same arithmetic as
// add, rmsnorm and hadamard_kernel in sequence. Each block sums the squares of the whole
// row (every load in flight at once) and keeps its own float4 of it.
__global__ void residual_norm_kernel(const float* x, const float* delta, float* x_out,
                                     const float* __restrict__ gain, const float* __restrict__ signs,
                                     float* __restrict__ normed, float* __restrict__ rotated, int n,
                                     int block, float eps, uint8_t* __restrict__ xq,
                                     float4* __restrict__ meta, float* __restrict__ bamax) {
  extern __shared__ float buf[];
  __shared__ float red[32];
  pdl_trigger();
  pdl_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * n;
  const int n4 = n / 4, own = blockIdx.y;  // own float4 = iteration `own` of the loop below
  float ss = 0.0f;
  float4 mine = make_float4(0, 0, 0, 0);
#pragma unroll 8
  for (int r = 0; r * static_cast<int>(blockDim.x) < n4; ++r) {
    const int j = threadIdx.x + r * blockDim.x;
    float4 v = ld4(x + row + 4 * j);
    if (delta) {
      const float4 d = ld4(delta + row + 4 * j);
      v = make_float4(v.x + d.x, v.y + d.y, v.z + d.z, v.w + d.w);
    }
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    if (r == own) mine = v;
  }
  const int i = 4 * threadIdx.x, col = own * block + i;
  const float4 gn = ld4(gain + col);
  const float4 sg = signs ? ld4(signs + col) : make_float4(1, 1, 1, 1);
  st4(x_out + row + col, mine);
  ss = block_sum(ss);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  const float4 nv =
      make_float4(mine.x * scale * gn.x, mine.y * scale * gn.y, mine.z * scale * gn.z, mine.w * scale * gn.w);
  st4(normed + row + col, nv);
  const float4 o =
      scale4(fwht_regs(signs ? mul4(nv, sg) : nv, buf, block), 1.0f / sqrtf(static_cast<float>(block)));
  st4(rotated + row + col, o);
  // warp w holds the 128 columns of activation block (row + col) / 128, lane its 4·lane..
  if (xq)
    quantize_block(o, threadIdx.x & 31, reinterpret_cast<uint32_t*>(xq + ((row + col) / kBlockK) * kActBytes),
                   meta + (row + col) / kBlockK);
  if (bamax) store_block_amax(o, bamax + static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y, red);
}

// residual_norm_kernel with delta the unsummed output of a deferred matvec (launch.h,
// SplitSums). Grid (rows, nb = n / block) in clusters of (1, nb): block b adds only its own
// float4 of x + delta (its Hadamard block's columns: nr slot loads per float4 instead of the
// whole row), writes the summed delta to delta.y, and hands the row's x·x terms around the
// cluster, so that thread i forms Σx² over Hadamard blocks 0, 1, ... at float4 i with the same
// expression as residual_norm_kernel's loop, then block_sum: the same floats. The rest is
// residual_norm_kernel. kForm (BONSAI_CUDA_RES_SPLIT; the chain after griddepcontrol.wait is
// this site's share of the step's critical path):
//   0 (session 6): x + delta through shared memory, cluster.sync() (its release arrive waits in a
//     MEMBAR for the delta.y store issued before it), the other blocks' float4s read through
//     distributed shared memory, a release "done reading" arrive, block_sum.
//   1 (lean): each thread publishes its float4's x·x term (one float); the barrier is split so that
//     the delta.y / x_out stores go between its arrive and its wait; the done-reading arrive is
//     relaxed (it orders no memory); the block sum has no leading barrier.
//   2 (lean + pushes): the terms pushed into every other block's shared memory with
//     st.async, counted on the receiver's mbarrier (one one-way trip, no MEMBAR after the wait):
//     the mbarrier's init and the cluster arrive that publishes it run before griddepcontrol.wait.
//   3 (form 2's code, with its registers capped at 128, the default): __launch_bounds__(256, 2) and 16
//     slots per load round trip instead of 32, so that a block of 256 threads fits beside one ws
//     matvec block on an SM (the matvec's 2 blocks of 320 threads at 96 registers take 61440 of
//     the 65536; form 2 at 168 registers needs an SM without any, i.e. its cluster becomes
//     resident only as the matvec drains, its launch then on the chain). The same floats: the
//     batch changes only how many slot loads are in flight, not the order of the additions.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // the kernel's only caller exists for sm_90 alone
__device__ __forceinline__ float xx_term(float4 v) {
  // residual_norm_kernel's `ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w` compiles to this
  // contraction (x·x rounded, then three FMAs, then the add; its PTX); spelled out, since the
  // same expression here was contracted from y·y instead: other floats.
  return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmul_rn(v.x, v.x))));
}
#endif

template <int kForm, int kB>
__device__ __forceinline__ void residual_norm_split_body(
    const float* x, SplitSums delta, float* x_out, const float* __restrict__ gain,
    const float* __restrict__ signs, float* __restrict__ normed, float* __restrict__ rotated, int n,
    int block, float eps, uint8_t* __restrict__ xq, float4* __restrict__ meta) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // [2 · block] the FWHT's buffers; then form 0: [block] this block's x + delta, form 1: [block / 4]
  // its x·x terms, forms 2, 3: [nb][block / 4] the row's x·x terms (Hadamard block r at r · block / 4)
  extern __shared__ __align__(16) float buf[];
  pdl_trigger();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * n;
  const int own = blockIdx.y, nb = static_cast<int>(gridDim.y), T = static_cast<int>(blockDim.x);
  const int i = 4 * threadIdx.x, col = own * block + i;
  const float4 gn = ld4(gain + col);  // weights: not written by any kernel
  const float4 sg = signs ? ld4(signs + col) : make_float4(1, 1, 1, 1);
  float* sum_s = buf + 2 * block;
  [[maybe_unused]] uint32_t bar_a = 0;
  if constexpr (kForm == 2) {
    __shared__ __align__(8) uint64_t bar;
    bar_a = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
    if (threadIdx.x == 0) push_init(bar_a, (nb - 1) * T * 4);  // the other blocks' terms
    // Published to the cluster (its own shared memory only: no PDL hazard before the wait); the
    // matching wait precedes the first push.
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  }
  pdl_wait();  // the matvec's slots (and x, written before it)
  float4 v = ld4(x + row + col);
  bool split = false;
  const float4 d = split::load4<kB>(delta, static_cast<int>(blockIdx.x), col, &split);
  v = make_float4(v.x + d.x, v.y + d.y, v.z + d.z, v.w + d.w);
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  float ss = 0.0f;
  if constexpr (kForm == 0) {
    st4(sum_s + i, v);
    if (split) st4(delta.y + row + col, d);  // y as matmul would have left it
    cluster.sync();                          // every block's x + delta is in its shared memory
    for (int r = 0; r < nb; ++r)             // the cluster's rank r is the row's Hadamard block r
      ss = __fadd_rn(ss, xx_term(ld4(cluster.map_shared_rank(sum_s, r) + i)));
    // Done reading the other blocks' shared memory; the matching wait below, before the block
    // exits, keeps each block's memory alive until every block of the cluster has read it.
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    st4(x_out + row + col, v);
    ss = block_sum(ss);
  } else {
    const float q = xx_term(v);
    if constexpr (kForm == 1) {
      sum_s[threadIdx.x] = q;
      asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
      if (split) st4(delta.y + row + col, d);  // y as matmul would have left it
      st4(x_out + row + col, v);
      asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // every block's terms
      for (int r = 0; r < nb; ++r)
        ss = __fadd_rn(ss, r == own ? q : *(cluster.map_shared_rank(sum_s, r) + threadIdx.x));
      // Done reading (the values are in ss): relaxed, it orders no memory; the matching wait at
      // the end keeps each block's memory alive until every block of the cluster has read it.
      asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    } else {
      // lanes 4j .. 4j + 3 gather their terms into one float4; lane 4j + m pushes it to the
      // blocks r ≡ m (mod 4) but this one, at qs[own][4j ..] there
      const int lane = threadIdx.x & 31, g0 = lane & ~3;
      const float4 q4 = make_float4(__shfl_sync(kFullMask, q, g0), __shfl_sync(kFullMask, q, g0 + 1),
                                    __shfl_sync(kFullMask, q, g0 + 2), __shfl_sync(kFullMask, q, g0 + 3));
      const uint32_t q_a =
          static_cast<uint32_t>(__cvta_generic_to_shared(sum_s + own * T + (threadIdx.x & ~3)));
      __syncwarp();  // the .aligned wait: the warp's lanes together again after the slot loads
      asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // every mbarrier is initialised
      for (int r = lane & 3; r < nb; r += 4)
        if (r != own) push4(q_a, bar_a, r, q4);
      if (split) st4(delta.y + row + col, d);  // y as matmul would have left it
      st4(x_out + row + col, v);
      push_wait(bar_a);  // every other block's terms have landed here
      for (int r = 0; r < nb; ++r) ss = __fadd_rn(ss, r == own ? q : sum_s[r * T + threadIdx.x]);
    }
    __shared__ float red[32];  // common.cuh's block_sum without its leading barrier: red is used once
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    ss = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) ss += red[w];
  }
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  const float4 nv =
      make_float4(v.x * scale * gn.x, v.y * scale * gn.y, v.z * scale * gn.z, v.w * scale * gn.w);
  st4(normed + row + col, nv);
  const float4 o =
      scale4(fwht_regs(signs ? mul4(nv, sg) : nv, buf, block), 1.0f / sqrtf(static_cast<float>(block)));
  st4(rotated + row + col, o);
  if (xq)
    quantize_block(o, threadIdx.x & 31, reinterpret_cast<uint32_t*>(xq + ((row + col) / kBlockK) * kActBytes),
                   meta + (row + col) / kBlockK);
  // forms 0, 1: the done-reading arrive's wait; form 2 exits freely: each block waited on its
  // mbarrier for every push into it, and its own pushes need nothing of it (register sources)
  if constexpr (kForm != 2) asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __trap();  // launched only on compute capability 9.x (residual_norm_site_split)
#endif
}

template <int kForm>
__global__ void residual_norm_split_kernel(const float* x, SplitSums delta, float* x_out,
                                           const float* __restrict__ gain, const float* __restrict__ signs,
                                           float* __restrict__ normed, float* __restrict__ rotated, int n,
                                           int block, float eps, uint8_t* __restrict__ xq,
                                           float4* __restrict__ meta) {
  residual_norm_split_body<kForm, split::kBatch>(x, delta, x_out, gain, signs, normed, rotated, n, block, eps,
                                                 xq, meta);
}
__global__ void __launch_bounds__(256, 2)
    residual_norm_split_capped_kernel(const float* x, SplitSums delta, float* x_out,
                                      const float* __restrict__ gain, const float* __restrict__ signs,
                                      float* __restrict__ normed, float* __restrict__ rotated, int n,
                                      int block, float eps, uint8_t* __restrict__ xq,
                                      float4* __restrict__ meta) {
  residual_norm_split_body<2, 16>(x, delta, x_out, gain, signs, normed, rotated, n, block, eps, xq, meta);
}

}  // namespace

void rmsnorm(const float* x, const float* gain, float* y, int64_t rows, int64_t n, float eps,
             cudaStream_t s) {
  const int threads = n >= 1024 ? 512 : 128;
  launch(rmsnorm_kernel, static_cast<unsigned>(rows), threads, 0, s, x, gain, y, n, eps);
}

void gated_rmsnorm(const float* o, const float* z, const float* w, float* y, int64_t rows, int64_t d,
                   float eps, cudaStream_t s) {
  launch(gated_rmsnorm_kernel, blocks_for(rows, 8), 256, 0, s, o, z, w, y, rows, d, eps);
}

void hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k, int64_t block,
              bool inverse, uint8_t* xq, float4* meta, cudaStream_t s, float* bamax) {
  swiglu_hadamard(x, nullptr, nullptr, signs, y, rows, k, block, inverse, xq, meta, s, bamax);
}

void swiglu_hadamard(const float* x, const float* up, float* act, const float* signs, float* y, int64_t rows,
                     int64_t k, int64_t block, bool inverse, uint8_t* xq, float4* meta, cudaStream_t s,
                     float* bamax) {
  const int threads = static_cast<int>(std::clamp<int64_t>(block / 4, 32, 1024));
  if (bamax && 4 * threads != block)
    fail("cuda: Hadamard block amaxes need 128 <= block <= 4096, not {}", block);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(k / block));
  launch(hadamard_kernel, grid, threads, 2 * block * sizeof(float), s, x, up, act, signs, y, k,
         static_cast<int>(block), inverse, xq, meta, bamax);
}

void residual_norm_site(const float* x, const float* delta, float* x_out, const float* gain,
                        const float* signs, int64_t block, float* normed, float* rotated, int64_t rows,
                        int64_t n, float eps, uint8_t* xq, float4* meta, cudaStream_t s, float* bamax) {
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(n / block));
  launch(residual_norm_kernel, grid, static_cast<unsigned>(block / 4), 2 * block * sizeof(float), s, x, delta,
         x_out, gain, signs, normed, rotated, static_cast<int>(n), static_cast<int>(block), eps, xq, meta,
         bamax);
}

}  // namespace bonsai::cuda

namespace bonsai::cuda {

bool residual_norm_site_split(const float* x, const SplitSums& delta, float* x_out, const float* gain,
                              const float* signs, int64_t block, float* normed, float* rotated, int64_t rows,
                              int64_t n, float eps, uint8_t* xq, float4* meta, cudaStream_t s, int form) {
  if (block < 128 || block > 4096 || block % kBlockK || n % block || n / block > 8 || delta.t != rows ||
      delta.n != n || form < 0 || form > 3 || !clusters_available())
    return false;
  using Kernel = void (*)(const float*, SplitSums, float*, const float*, const float*, float*, float*, int,
                          int, float, uint8_t*, float4*);
  const Kernel kernels[] = {residual_norm_split_kernel<0>, residual_norm_split_kernel<1>,
                            residual_norm_split_kernel<2>, residual_norm_split_capped_kernel};
  // The slot loads in flight take registers (168 at sm_90a): blocks of 1024 columns (256
  // threads) fit, the largest ones may not (form 3: at most 256 threads by its launch bounds).
  static const auto max_threads = [&kernels] {
    std::array<int, 4> m{};
    for (int f = 0; f < 4; ++f) {
      cudaFuncAttributes fa{};
      const bool ok = cudaFuncGetAttributes(&fa, kernels[f]) == cudaSuccess;
      cudaGetLastError();  // a failed query is not an error of the next launch
      m[f] = ok ? fa.maxThreadsPerBlock : 0;
    }
    return m;
  }();
  if (block / 4 > max_threads[form]) return false;
  const unsigned nb = static_cast<unsigned>(n / block);
  const dim3 grid(static_cast<unsigned>(rows), nb);
  // shared memory: see the kernel (form 2: the row's n / 4 terms after the FWHT's buffers)
  const size_t smem = (2 * block + (form >= 2 ? std::max<int64_t>(block, n / 4) : block)) * sizeof(float);
  return launch_cluster(kernels[form], grid, static_cast<unsigned>(block / 4), dim3(1, nb, 1), smem, s, x,
                        delta, x_out, gain, signs, normed, rotated, static_cast<int>(n),
                        static_cast<int>(block), eps, xq, meta) == cudaSuccess;
}

int residual_split_form() {
  // 0 the session-6 site, 1 lean, 2 lean with st.async pushes, 3 (default) 2 with its registers
  // capped at 128 (launch.h); parsed in kernels/cuda/knobs.cpp.
  static const int form = knob::res_split();
  return form;
}

}  // namespace bonsai::cuda

namespace bonsai::cuda {

bool fwht_site_split(const SplitSums& x, const SplitSums& up, float* act, const float* signs, float* y,
                     int64_t rows, int64_t k, int64_t block, int ctas, uint8_t* xq, float4* meta,
                     cudaStream_t s) {
  if (ctas != 1 && ctas != 2 && ctas != 4 && ctas != 8) return false;
  const int64_t bq = block / std::max(ctas, 1);
  if (block > 4096 || k % block || bq < kBlockK || bq % kBlockK || x.t != rows || x.n != k ||
      (up.y && (up.t != rows || up.n != k)) || !clusters_available())
    return false;
  using Kernel =
      void (*)(SplitSums, SplitSums, float*, const float*, float*, int64_t, int, uint8_t*, float4*);
  static const Kernel kernels[2][4] = {{fwht_split_kernel<1, false>, fwht_split_kernel<2, false>,
                                        fwht_split_kernel<4, false>, fwht_split_kernel<8, false>},
                                       {fwht_split_kernel<1, true>, fwht_split_kernel<2, true>,
                                        fwht_split_kernel<4, true>, fwht_split_kernel<8, true>}};
  const int ci = ctas == 1 ? 0 : ctas == 2 ? 1 : ctas == 4 ? 2 : 3;
  const int ui = up.y ? 1 : 0;
  const Kernel kernel = kernels[ui][ci];
  // The slot loads in flight take registers: the largest blocks may not fit.
  struct Limits {
    int threads[2][4] = {};
  };
  static const Limits max_threads = [] {
    Limits l;
    for (int u = 0; u < 2; ++u)
      for (int c = 0; c < 4; ++c) {
        cudaFuncAttributes fa{};
        const bool ok = cudaFuncGetAttributes(&fa, kernels[u][c]) == cudaSuccess;
        cudaGetLastError();  // a failed query is not an error of the next launch
        l.threads[u][c] = ok ? fa.maxThreadsPerBlock : 0;
      }
    return l;
  }();
  if (bq / 4 > max_threads.threads[ui][ci]) return false;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(k / block * ctas));
  const size_t smem = (ctas > 1 ? 3 : 2) * bq * sizeof(float);
  const int kb = static_cast<int>(block);
  if (ctas == 1) {
    launch(kernel, grid, static_cast<unsigned>(bq / 4), smem, s, x, up, act, signs, y, k, kb, xq, meta);
    return true;
  }
  return launch_cluster(kernel, grid, dim3(static_cast<unsigned>(bq / 4)),
                        dim3(1, static_cast<unsigned>(ctas), 1), smem, s, x, up, act, signs, y, k, kb, xq,
                        meta) == cudaSuccess;
}

}  // namespace bonsai::cuda
