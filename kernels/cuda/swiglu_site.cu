// The decode SwiGLU site, lean form (BONSAI_CUDA_SWI_SITE=1): fwht_split_kernel<1, true>'s work
// (norm_fwht.cu) with less after griddepcontrol.wait. docs/performance.md, "Session 9: the
// SwiGLU site and the attention output FWHT".
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/site_fwht.cuh"
#include "kernels/cuda/split_sums.cuh"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {
namespace {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // the kernel's only caller exists for sm_90 alone
__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ float4 sub4(float4 a, float4 b) {
  return make_float4(a.x - b.x, a.y - b.y, a.z - b.z, a.w - b.w);
}
#endif

// Block per (token, Hadamard block of B = 128·NW·C columns) when C == 1, thread per float4 (4·tid
// ..), as fwht_split_kernel<1, true>; the same floats (every sum, product and butterfly the same
// operation on the same operands), with less on the chain after the dependency wait:
// - the slot addresses and rank counts (kernel parameters only) are formed before the wait, so
//   the loads issue right after it; gate and up's slots in one round trip (kBatch2 of each per
//   trip, load4x2's rank-order sums from 0.0f);
// - writeback == 0: the split sums are not stored back to gate / up (the graph reads neither
//   after the site when act is null: CudaBackend::swiglu_site);
// - the FWHT stages across warps (h = 128 .. BQ/2) after one barrier: each thread publishes its
//   float4, reads the same float4 of every warp and runs the NW-point butterflies (the
//   reference's order), keeping its own warp's element, instead of one barrier per stage.
// LR: the registers capped at 64 per thread (5 slots of each per load round trip, a few bytes
// spilled) so that two 256-thread site blocks fit beside one ws matvec block on an SM (the ws
// kernel's 2 blocks of 320 threads at ~100 registers fill a register file; a site block of 256
// threads at 104 registers needs an SM holding at most one of them, so some site blocks may
// become resident only as the matvec drains, their prologue then on the chain).
// C > 1: the Hadamard block spread over a cluster of C blocks (rank q = blockIdx.y % C holds
// columns q·BQ .. of it), so each SM loads 1/C of the slots; after the in-block stages each
// thread pushes its float4 into the C - 1 other blocks with st.async, counted on the receiver's
// mbarrier (residual_norm_split_kernel<2>'s one-way exchange: no release fence waits for the
// stores before it), waits for theirs and runs the stages h = BQ .. B/2 (the C-point
// butterflies in the reference's order), keeping its own.
template <int NW, int C, bool LR>
__global__ void __launch_bounds__(NW * 32, LR ? 32 / NW : 1)
    swiglu_site_kernel(SplitSums x, SplitSums up, float* act, const float* __restrict__ signs, float* y,
                       int64_t k, uint8_t* __restrict__ xq, float4* __restrict__ meta, int writeback) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int BQ = 128 * NW, B = BQ * C;
  __shared__ __align__(16) float4 xw[NW * 32];
  __shared__ __align__(16) float4 recv[C][NW * 32];  // recv[r]: block r's float4s (C > 1)
  __shared__ __align__(8) uint64_t bar;
  pdl_trigger();
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int q = static_cast<int>(blockIdx.y) % C, tok = static_cast<int>(blockIdx.x);
  const int col = (static_cast<int>(blockIdx.y) / C) * B + q * BQ + 4 * tid;
  const int64_t off = static_cast<int64_t>(tok) * k + col;
  const float4 sg = signs ? *reinterpret_cast<const float4*>(signs + col) : make_float4(1, 1, 1, 1);
  // split::load4x2's addresses: nr == 1 reads y itself as the only "slot"
  const int na = split::ranks(x, x.pair0 + col / kPairRows),
            nb = split::ranks(up, up.pair0 + col / kPairRows);
  const float4* pa = reinterpret_cast<const float4*>(na > 1 ? split::slot0(x, tok, col)
                                                            : x.y + static_cast<size_t>(tok) * x.n + col);
  const float4* pb = reinterpret_cast<const float4*>(nb > 1 ? split::slot0(up, tok, col)
                                                            : up.y + static_cast<size_t>(tok) * up.n + col);
  constexpr size_t kStride = split::kSlotFloats / 4;  // float4s between ranks
  [[maybe_unused]] uint32_t bar_a = 0;
  if constexpr (C > 1) {
    bar_a = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
    if (tid == 0) push_init(bar_a, (C - 1) * BQ * 4);  // the other blocks' float4s
    // published to the cluster (own shared memory only: no PDL hazard before the wait); the
    // matching wait precedes the first push
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  }
  pdl_wait();  // the matvec's slots
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f), u = v;
  const int n = na > nb ? na : nb;
  constexpr int kB = LR ? 5 : split::kBatch2;  // slots of each per round trip
  for (int r0 = 0; r0 < n; r0 += kB) {
    float4 a[kB], b[kB];
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      a[j] = b[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r0 + j < na) a[j] = __ldcg(pa + (r0 + j) * kStride);
      if (r0 + j < nb) b[j] = __ldcg(pb + (r0 + j) * kStride);
    }
    // selects, not branches (ptxas made each add a branch region); a slot past nr leaves the
    // sum as it was, nr == 1 takes y itself (-0.0f stays)
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      const float4 sv = add4(v, a[j]), su = add4(u, b[j]);
      v = r0 + j < na ? (na == 1 ? a[j] : sv) : v;
      u = r0 + j < nb ? (nb == 1 ? b[j] : su) : u;
    }
  }
  if (writeback) {  // y as matmul would have left it
    if (na > 1) *reinterpret_cast<float4*>(x.y + off) = v;
    if (nb > 1) *reinterpret_cast<float4*>(up.y + off) = u;
  }
  v = make_float4(silu(v.x) * u.x, silu(v.y) * u.y, silu(v.z) * u.z, silu(v.w) * u.w);
  if (act) *reinterpret_cast<float4*>(act + off) = v;  // null: nobody reads it
  if (signs) v = make_float4(v.x * sg.x, v.y * sg.y, v.z * sg.z, v.w * sg.w);
  // h = 1, 2 inside the thread, h = 4 .. 64 across lanes: fwht_regs' butterflies
  {
    const float a0 = v.x + v.y, a1 = v.x - v.y, a2 = v.z + v.w, a3 = v.z - v.w;
    v = make_float4(a0 + a2, a1 + a3, a0 - a2, a1 - a3);
  }
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    const float4 o = make_float4(__shfl_xor_sync(kFullMask, v.x, m), __shfl_xor_sync(kFullMask, v.y, m),
                                 __shfl_xor_sync(kFullMask, v.z, m), __shfl_xor_sync(kFullMask, v.w, m));
    v = lane & m ? sub4(o, v) : add4(v, o);
  }
  if constexpr (NW > 1) {  // h = 128 .. BQ/2: warp j's element with warp j ^ m's, m = 1, 2, ..
    xw[tid] = v;
    __syncthreads();
    float4 z[NW];
#pragma unroll
    for (int j = 0; j < NW; ++j) z[j] = xw[lane + 32 * j];
    v = butterflies_own(z, warp);
  }
  if constexpr (C > 1) {  // h = BQ .. B/2: block r's element with block r ^ m's
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // every mbarrier is initialised
    const uint32_t src = static_cast<uint32_t>(__cvta_generic_to_shared(&recv[q][tid]));
#pragma unroll
    for (int r = 0; r < C; ++r)
      if (r != q) push4(src, bar_a, r, v);
    push_wait(bar_a);  // every other block's float4s have landed here
    float4 z[C];
#pragma unroll
    for (int r = 0; r < C; ++r) z[r] = r == q ? v : recv[r][tid];
    v = butterflies_own(z, q);
  }
  const float s = 1.0f / sqrtf(static_cast<float>(B));
  const float4 o = make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
  *reinterpret_cast<float4*>(y + off) = o;
  // warp w holds the 128 columns of one activation block, lane its 4·lane ..
  quantize_block(o, lane, reinterpret_cast<uint32_t*>(xq + (off / kBlockK) * kActBytes),
                 meta + off / kBlockK);
#else
  __trap();  // launched only on compute capability 9.x (swiglu_site_lean)
#endif
}

}  // namespace

bool swiglu_site_lean(const SplitSums& x, const SplitSums& up, float* act, const float* signs, float* y,
                      int64_t rows, int64_t k, int64_t block, uint8_t* xq, float4* meta, bool writeback,
                      cudaStream_t s, int ctas, bool low_regs) {
  const int64_t bq = block / std::max(ctas, 1);
  if ((ctas != 1 && ctas != 2 && ctas != 4) || block > 4096 ||
      (bq != 128 && bq != 256 && bq != 512 && bq != 1024) || k % block || !up.y || !xq || !meta ||
      x.t != rows || x.n != k || up.t != rows || up.n != k || !clusters_available())
    return false;
  using Kernel =
      void (*)(SplitSums, SplitSums, float*, const float*, float*, int64_t, uint8_t*, float4*, int);
  // [low_regs][ctas 1, 2, 4][block / ctas 128 .. 1024]
  static const Kernel kernels[2][3][4] = {
      {{swiglu_site_kernel<1, 1, false>, swiglu_site_kernel<2, 1, false>, swiglu_site_kernel<4, 1, false>,
        swiglu_site_kernel<8, 1, false>},
       {swiglu_site_kernel<1, 2, false>, swiglu_site_kernel<2, 2, false>, swiglu_site_kernel<4, 2, false>,
        swiglu_site_kernel<8, 2, false>},
       {swiglu_site_kernel<1, 4, false>, swiglu_site_kernel<2, 4, false>, swiglu_site_kernel<4, 4, false>,
        swiglu_site_kernel<8, 4, false>}},
      {{swiglu_site_kernel<1, 1, true>, swiglu_site_kernel<2, 1, true>, swiglu_site_kernel<4, 1, true>,
        swiglu_site_kernel<8, 1, true>},
       {swiglu_site_kernel<1, 2, true>, swiglu_site_kernel<2, 2, true>, swiglu_site_kernel<4, 2, true>,
        swiglu_site_kernel<8, 2, true>},
       {swiglu_site_kernel<1, 4, true>, swiglu_site_kernel<2, 4, true>, swiglu_site_kernel<4, 4, true>,
        swiglu_site_kernel<8, 4, true>}}};
  const int ci = ctas == 1 ? 0 : ctas == 2 ? 1 : 2;
  const int wi = bq == 128 ? 0 : bq == 256 ? 1 : bq == 512 ? 2 : 3;
  const Kernel kernel = kernels[low_regs ? 1 : 0][ci][wi];
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(k / block * ctas));
  const unsigned threads = static_cast<unsigned>(bq / 4);
  if (ctas == 1) {
    launch(kernel, grid, threads, 0, s, x, up, act, signs, y, k, xq, meta, writeback ? 1 : 0);
    return true;
  }
  return launch_cluster(kernel, grid, dim3(threads), dim3(1, static_cast<unsigned>(ctas), 1), 0, s, x, up,
                        act, signs, y, k, xq, meta, writeback ? 1 : 0) == cudaSuccess;
}

}  // namespace bonsai::cuda
