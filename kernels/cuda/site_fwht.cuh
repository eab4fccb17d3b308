// Pieces shared by the decode sites that run a Hadamard block's FWHT (norm_fwht.cu, gdn_decode.cu,
// swiglu_site.cu, attention.cu): the FWHT of a block held as one float4 per thread, the N-point
// butterflies over values gathered from N warps or N blocks, and the one-way cluster exchange.
// Every butterfly is the reference's (kernels/ref/fwht.cpp): stage h pairs element i with i + h for
// i without bit h, (a, b) -> (a + b, a - b), so every site built from these gives the reference's
// floats bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace bonsai::cuda {

// FWHT of one Hadamard block held as one float4 per thread (elements 4·tid .. 4·tid + 3,
// blockDim.x >= block / 4), stage by stage h = 1, 2, 4, ...: h = 1, 2 inside the thread,
// h = 4 .. 64 across lanes (shuffles), h >= 128 across warps through `buf` (2·block floats: two
// buffers alternate, so each of those stages needs a single barrier). Threads with `active`
// false (at or past block / 4; warp-uniform, block / 4 being a multiple of 32 where it matters)
// hold nothing but take part in the barriers. The caller's previous use of buf must be fenced by
// a barrier; the result stays in registers.
__device__ __forceinline__ float4 fwht_regs(float4 v, float* buf, int block, bool active = true) {
  const int lane = threadIdx.x & 31;
  if (active) {
    const float a0 = v.x + v.y, a1 = v.x - v.y, a2 = v.z + v.w, a3 = v.z - v.w;
    v = make_float4(a0 + a2, a1 + a3, a0 - a2, a1 - a3);
    for (int m = 1; m < 32 && 4 * m < block; m <<= 1) {
      const float4 o = make_float4(__shfl_xor_sync(kFullMask, v.x, m), __shfl_xor_sync(kFullMask, v.y, m),
                                   __shfl_xor_sync(kFullMask, v.z, m), __shfl_xor_sync(kFullMask, v.w, m));
      v = lane & m ? make_float4(o.x - v.x, o.y - v.y, o.z - v.z, o.w - v.w)
                   : make_float4(v.x + o.x, v.y + o.y, v.z + o.z, v.w + o.w);
    }
  }
  int par = 0;
  for (int m = 32; 4 * m < block; m <<= 1, par ^= 1) {
    float* b = buf + par * block;
    if (active) *reinterpret_cast<float4*>(b + 4 * threadIdx.x) = v;
    __syncthreads();
    if (active) {
      const float4 o = *reinterpret_cast<const float4*>(b + 4 * (threadIdx.x ^ m));
      v = threadIdx.x & m ? make_float4(o.x - v.x, o.y - v.y, o.z - v.z, o.w - v.w)
                          : make_float4(v.x + o.x, v.y + o.y, v.z + o.z, v.w + o.w);
    }
  }
  return v;
}

// The N-point butterflies over z[0 .. N) (z[j]: the same element of warp or block j, j's index bits
// being the high bits of the element's position), then z[own].
template <int N>
__device__ __forceinline__ float4 butterflies_own(float4 (&z)[N], int own) {
#pragma unroll
  for (int m = 1; m < N; m <<= 1)
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (!(j & m)) {
        const float4 a = z[j], b = z[j + m];
        z[j] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        z[j + m] = make_float4(a.x - b.x, a.y - b.y, a.z - b.z, a.w - b.w);
      }
  float4 f = z[0];
#pragma unroll
  for (int j = 1; j < N; ++j)
    if (j == own) f = z[j];
  return f;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// One-way cluster exchange: each block receives its peers' float4s in its own shared memory through
// st.async, counted on one mbarrier of its own, so no release fence waits for the block's earlier
// stores and the receiver needs one wait. Every caller:
//   before griddepcontrol.wait: push_init(bar, the peers' bytes) by one thread, then
//     barrier.cluster.arrive.release (publishes the initialised mbarrier; the cluster's own shared
//     memory only, so no PDL hazard);
//   before its first push: barrier.cluster.wait.acquire (every peer's mbarrier is initialised);
//   push4 into each peer; push_wait on its own mbarrier before reading what arrived.
// Shared-memory addresses are this block's (__cvta_generic_to_shared); mapa finds the peer's.
__device__ __forceinline__ void push_init(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");  // one arrival: this one
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void push4(uint32_t local, uint32_t bar, int rank, float4 v) {
  uint32_t dst, rbar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(local), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rbar) : "r"(bar), "r"(rank));
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(dst),
      "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rbar)
      : "memory");
}
__device__ __forceinline__ void push_wait(uint32_t bar) {
  asm volatile(
      "{\n .reg .pred p;\n PUSH_WAIT_%=:\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, "
      "[%0], 0;\n @!p bra PUSH_WAIT_%=;\n}\n" ::"r"(bar)
      : "memory");
}
#endif

}  // namespace bonsai::cuda
