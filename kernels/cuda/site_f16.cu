// The Hadamard sites writing the fp16 GEMM's activation (kernels/cuda/site_f16.h).
//
// Why a block per row: the fp16 record's exponent is the token's amax over the whole row, i.e.
// over all of its Hadamard blocks, so the row must be complete before the first fp16 value can be
// written. hadamard() / residual_norm_site() run a block per (row, Hadamard block); here thread i
// holds float4 i of every Hadamard block of the row in registers (float4s i, i + block/4, ...:
// exactly the float4s residual_norm_kernel's thread i loads for Σx², in the same order), so the
// FWHTs of all blocks run together: the in-thread and shuffle stages as fwht_regs, the cross-warp
// stages (h >= 128) with one shared-memory exchange of all blocks per stage. Every butterfly is the
// same a + b / a − b of the same operands in the reference's stage order, so rotated is
// bit-identical to the per-block kernels; the fp16 record repeats act_f16_kernel's arithmetic
// (same amax, same exponent, same x·2^-e, same rounding) on those floats.
#include <cooperative_groups.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_f16_layout.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/site_f16.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {

namespace {

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
  return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}

// blockDim = block / 4. CL = false: a block per row, nb = k / block <= NB Hadamard blocks.
// CL = true: a cluster of gridDim.y blocks per row, block j taking the row's Hadamard blocks
// j·NB .. j·NB + NB − 1 (fewer in the last one); what needs the whole row goes through the
// cluster's shared memory (distributed shared memory): the residual's Σx² (thread i reads float4
// i of every Hadamard block from its owner, blocks 0, 1, ... in order: the same floats as one
// block per row) and the row's amax (each block's max, then the max over the cluster: exact).
// Every other float is computed by the same code either way.
template <SiteF16Kind KIND, int NB, bool CL>
__global__ void __launch_bounds__(256) site_f16_kernel(SiteF16Args a, int k, int block, int nb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (CL) {
    __trap();  // launched only on compute capability 9.x (site_f16_cluster)
  }
#endif
  // [NB][blockDim]: the cross-warp FWHT stages; CL residual: then [NB][blockDim] x + delta
  extern __shared__ float4 stage[];
  __shared__ float red[32];
  pdl_trigger();
  pdl_wait();
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * k;
  const int b0 = CL ? static_cast<int>(blockIdx.y) * NB : 0;  // first Hadamard block of this block
  const int nbl = CL ? min(NB, nb - b0) : nb;                 // how many it takes
  float4 v[NB];
  if constexpr (KIND == SiteF16Kind::residual) {
#pragma unroll
    for (int b = 0; b < NB; ++b)
      if (b < nbl) {
        const int64_t at = row + (b0 + b) * block + 4 * tid;
        float4 w = ld4(a.x + at);
        if (a.delta) {
          const float4 d = ld4(a.delta + at);
          w = make_float4(w.x + d.x, w.y + d.y, w.z + d.z, w.w + d.w);
        }
        v[b] = w;
      }
    float ss = 0.0f;
    // residual_norm_kernel's `ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w` as it
    // compiles there (x·x rounded, three FMAs, then the add; residual_norm_split_kernel).
    const auto sq = [](float s, float4 w) {
      return __fadd_rn(s, __fmaf_rn(w.w, w.w, __fmaf_rn(w.z, w.z, __fmaf_rn(w.y, w.y, __fmul_rn(w.x, w.x)))));
    };
    if constexpr (CL) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      float4* sum_s = stage + NB * nt;
#pragma unroll
      for (int b = 0; b < NB; ++b)
        if (b < nbl) sum_s[b * nt + tid] = v[b];
      namespace cg = cooperative_groups;
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();               // every block's x + delta is in its shared memory
      for (int r = 0; r < nb; ++r)  // Hadamard block r lives in cluster rank r / NB
        ss = sq(ss, cluster.map_shared_rank(sum_s, r / NB)[(r % NB) * nt + tid]);
#endif
    } else {
#pragma unroll
      for (int b = 0; b < NB; ++b)
        if (b < nbl) ss = sq(ss, v[b]);
    }
#pragma unroll
    for (int b = 0; b < NB; ++b)
      if (b < nbl) st4(a.x_out + row + (b0 + b) * block + 4 * tid, v[b]);
    ss = block_sum(ss);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(k) + a.eps);
#pragma unroll
    for (int b = 0; b < NB; ++b)
      if (b < nbl) {
        const int col = (b0 + b) * block + 4 * tid;
        const float4 gn = ld4(a.gain + col);
        const float4 nv = make_float4(v[b].x * scale * gn.x, v[b].y * scale * gn.y, v[b].z * scale * gn.z,
                                      v[b].w * scale * gn.w);
        st4(a.normed + row + col, nv);
        v[b] = a.signs ? mul4(nv, ld4(a.signs + col)) : nv;
      }
  } else {
#pragma unroll
    for (int b = 0; b < NB; ++b)
      if (b < nbl) {
        const int col = (b0 + b) * block + 4 * tid;
        float4 w = ld4(a.x + row + col);
        if constexpr (KIND == SiteF16Kind::swiglu) {
          const float4 u = ld4(a.up + row + col);
          w = make_float4(silu(w.x) * u.x, silu(w.y) * u.y, silu(w.z) * u.z, silu(w.w) * u.w);
          if (a.act) st4(a.act + row + col, w);  // null: nobody reads it (Backend::swiglu_site)
        }
        v[b] = a.signs ? mul4(w, ld4(a.signs + col)) : w;
      }
  }
  // FWHT of every Hadamard block (fwht_regs's stages, all blocks at once).
#pragma unroll
  for (int b = 0; b < NB; ++b)
    if (b < nbl) {
      const float a0 = v[b].x + v[b].y, a1 = v[b].x - v[b].y, a2 = v[b].z + v[b].w, a3 = v[b].z - v[b].w;
      v[b] = make_float4(a0 + a2, a1 + a3, a0 - a2, a1 - a3);
    }
  const int lane = tid & 31;
  for (int m = 1; m < 32 && 4 * m < block; m <<= 1) {
#pragma unroll
    for (int b = 0; b < NB; ++b)
      if (b < nbl) {
        const float4 o =
            make_float4(__shfl_xor_sync(kFullMask, v[b].x, m), __shfl_xor_sync(kFullMask, v[b].y, m),
                        __shfl_xor_sync(kFullMask, v[b].z, m), __shfl_xor_sync(kFullMask, v[b].w, m));
        v[b] = lane & m ? make_float4(o.x - v[b].x, o.y - v[b].y, o.z - v[b].z, o.w - v[b].w)
                        : make_float4(v[b].x + o.x, v[b].y + o.y, v[b].z + o.z, v[b].w + o.w);
      }
  }
  for (int m = 32; 4 * m < block; m <<= 1) {
#pragma unroll
    for (int b = 0; b < NB; ++b)
      if (b < nbl) stage[b * nt + tid] = v[b];
    __syncthreads();
#pragma unroll
    for (int b = 0; b < NB; ++b)
      if (b < nbl) {
        const float4 o = stage[b * nt + (tid ^ m)];
        v[b] = tid & m ? make_float4(o.x - v[b].x, o.y - v[b].y, o.z - v[b].z, o.w - v[b].w)
                       : make_float4(v[b].x + o.x, v[b].y + o.y, v[b].z + o.z, v[b].w + o.w);
      }
    __syncthreads();  // (the next stage overwrites the partners' values)
  }
  const float inv = 1.0f / sqrtf(static_cast<float>(block));
  float amax = 0.0f;
#pragma unroll
  for (int b = 0; b < NB; ++b)
    if (b < nbl) {
      v[b] = make_float4(v[b].x * inv, v[b].y * inv, v[b].z * inv, v[b].w * inv);
      st4(a.rotated + row + (b0 + b) * block + 4 * tid, v[b]);
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[b].x), fabsf(v[b].y)), fmaxf(fabsf(v[b].z), fabsf(v[b].w))));
    }
  // act_f16_kernel's exponent: max is exact and ignores NaN in any order, so the same amax.
  amax = warp_max(amax);
  if (lane == 0) red[tid >> 5] = amax;
  __syncthreads();
  amax = red[0];
  for (int w = 1; w < (nt >> 5); ++w) amax = fmaxf(amax, red[w]);
  if constexpr (CL) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ float cl_amax;  // this block's amax, read by the cluster
    if (tid == 0) cl_amax = amax;
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's amax is in its shared memory (and the Σx² reads are done)
    for (int r = 0; r < static_cast<int>(gridDim.y); ++r)
      amax = fmaxf(amax, *cluster.map_shared_rank(&cl_amax, r));
    // Done reading the others' shared memory; the matching wait below, before the block exits,
    // keeps each block's memory alive until every block of the cluster has read it.
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
  }
  int fe = 0;
  if (amax > 0.0f && amax <= 3.402823466e38f) frexpf(amax, &fe);
  const int e = amax > 0.0f && amax <= 3.402823466e38f ? f16_token_exp(fe) : 0;
  const float down = __int_as_float((127 - e) << 23);  // 2^-e
  if (b0 == 0 && tid == 0) a.tscale[blockIdx.x] = __int_as_float((127 + e) << 23);
  // float4 i of block b holds natural columns c = b·block + 4i .. +3: k-block c / 128, its
  // float4 (c % 128) / 4 = i % 32 (block % 128 == 0), written as act_f16_kernel writes it.
  __half2* out =
      reinterpret_cast<__half2*>(a.xh + static_cast<size_t>(blockIdx.x) * (k / kBlockK) * kActBytes);
  const int p = f16_act_index(4 * lane);  // even: a half2 boundary
#pragma unroll
  for (int b = 0; b < NB; ++b)
    if (b < nbl) {
      const int kb = ((b0 + b) * block + 4 * tid) / kBlockK;
      __half2* o = out + kb * 64 + p / 2;
      const float2 lo = make_float2(v[b].x * down, v[b].z * down),
                   hi = make_float2(v[b].y * down, v[b].w * down);
      o[0] = __float22half2_rn(lo);
      o[4] = __float22half2_rn(hi);
    }
  if constexpr (CL) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
  }
}

// The second pass of site_f16_two_pass: grid (rows, k / 1024 rounded up), 256 threads, a float4
// of natural columns 4u..4u+3 per thread, written as act_f16_kernel writes it (TERMS = 1).
__global__ void __launch_bounds__(256)
    f16_from_amax_kernel(const float* __restrict__ x, const float* __restrict__ bamax, int nb,
                         uint8_t* __restrict__ xh, float* __restrict__ tscale, int k) {
  pdl_trigger();
  pdl_wait();
  const int tok = static_cast<int>(blockIdx.x);
  float amax = 0.0f;
  for (int b = 0; b < nb; ++b) amax = fmaxf(amax, bamax[static_cast<int64_t>(tok) * nb + b]);
  int fe = 0;
  if (amax > 0.0f && amax <= 3.402823466e38f) frexpf(amax, &fe);
  const int e = amax > 0.0f && amax <= 3.402823466e38f ? f16_token_exp(fe) : 0;
  if (blockIdx.y == 0 && threadIdx.x == 0) tscale[tok] = __int_as_float((127 + e) << 23);
  const int u = static_cast<int>(blockIdx.y) * 256 + static_cast<int>(threadIdx.x);
  if (u >= k / 4) return;
  const float down = __int_as_float((127 - e) << 23);  // 2^-e
  const float4 v = ld4(x + static_cast<int64_t>(tok) * k + 4 * u);
  __half2* o = reinterpret_cast<__half2*>(xh + static_cast<size_t>(tok) * (k / kBlockK) * kActBytes) +
               (u >> 5) * 64 + f16_act_index((u & 31) * 4) / 2;
  o[0] = __float22half2_rn(make_float2(v.x * down, v.z * down));
  o[4] = __float22half2_rn(make_float2(v.y * down, v.w * down));
}

template <SiteF16Kind KIND, int NB>
void run_site_f16(const SiteF16Args& a, int64_t rows, int64_t k, int64_t block, cudaStream_t s) {
  const int threads = static_cast<int>(block / 4), nb = static_cast<int>(k / block);
  const size_t smem = static_cast<size_t>(nb) * threads * sizeof(float4);
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(site_f16_kernel<KIND, NB, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
  launch(site_f16_kernel<KIND, NB, false>, static_cast<unsigned>(rows), threads, smem, s, a,
         static_cast<int>(k), static_cast<int>(block), nb);
}

template <SiteF16Kind KIND>
void run_site_f16(const SiteF16Args& a, int64_t rows, int64_t k, int64_t block, cudaStream_t s) {
  // The register array covers the row: 8 float4s for the 27B's residual and projection sites
  // (5 and 6 blocks of 1024), 24 for its SwiGLU site (17).
  if (k / block <= 8)
    run_site_f16<KIND, 8>(a, rows, k, block, s);
  else
    run_site_f16<KIND, kSiteF16MaxBlocks>(a, rows, k, block, s);
}

// site_f16_kernel<KIND, NB, true>: grid (rows, c) in clusters of (1, c) blocks.
template <SiteF16Kind KIND, int NB>
bool run_site_f16_cluster(const SiteF16Args& a, int64_t rows, int64_t k, int64_t block, cudaStream_t s) {
  const int threads = static_cast<int>(block / 4), nb = static_cast<int>(k / block);
  const int c = (nb + NB - 1) / NB;
  const size_t smem =
      (KIND == SiteF16Kind::residual ? 2 : 1) * static_cast<size_t>(NB) * threads * sizeof(float4);
  void (*kernel)(SiteF16Args, int, int, int) = site_f16_kernel<KIND, NB, true>;
  if (c > 8 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (launch_cluster(kernel, dim3(static_cast<unsigned>(rows), static_cast<unsigned>(c)),
                     dim3(static_cast<unsigned>(threads)), dim3(1, static_cast<unsigned>(c), 1), smem, s, a,
                     static_cast<int>(k), static_cast<int>(block), nb) == cudaSuccess)
    return true;
  cudaGetLastError();  // a refused cluster launch is not an error of the next launch
  return false;
}

template <SiteF16Kind KIND>
bool run_site_f16_cluster(const SiteF16Args& a, int64_t rows, int64_t k, int64_t block, int per_block,
                          cudaStream_t s) {
  switch (per_block) {
    case 1:
      return run_site_f16_cluster<KIND, 1>(a, rows, k, block, s);
    case 2:
      return run_site_f16_cluster<KIND, 2>(a, rows, k, block, s);
    case 3:
      return run_site_f16_cluster<KIND, 3>(a, rows, k, block, s);
    default:
      return run_site_f16_cluster<KIND, 4>(a, rows, k, block, s);
  }
}

}  // namespace

bool site_f16_fits(int64_t k, int64_t block) {
  return block >= 128 && block <= 1024 && block % kBlockK == 0 && k % block == 0 &&
         k / block <= kSiteF16MaxBlocks;
}

bool site_f16_two_pass_fits(int64_t k, int64_t block) {
  return block >= 128 && block <= 4096 && block % kBlockK == 0 && k % block == 0;
}

void site_f16_two_pass(SiteF16Kind kind, const SiteF16Args& a, float* bamax, int64_t rows, int64_t k,
                       int64_t block, cudaStream_t s) {
  if (rows <= 0) return;
  switch (kind) {
    case SiteF16Kind::hadamard:
      hadamard(a.x, a.signs, a.rotated, rows, k, block, false, nullptr, nullptr, s, bamax);
      break;
    case SiteF16Kind::swiglu:
      swiglu_hadamard(a.x, a.up, a.act, a.signs, a.rotated, rows, k, block, false, nullptr, nullptr, s,
                      bamax);
      break;
    case SiteF16Kind::residual:
      residual_norm_site(a.x, a.delta, a.x_out, a.gain, a.signs, block, a.normed, a.rotated, rows, k, a.eps,
                         nullptr, nullptr, s, bamax);
      break;
  }
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((k / 4 + 255) / 256));
  launch(f16_from_amax_kernel, grid, 256, 0, s, static_cast<const float*>(a.rotated),
         static_cast<const float*>(bamax), static_cast<int>(k / block), a.xh, a.tscale, static_cast<int>(k));
}

void site_f16(SiteF16Kind kind, const SiteF16Args& a, int64_t rows, int64_t k, int64_t block,
              cudaStream_t s) {
  if (rows <= 0) return;
  switch (kind) {
    case SiteF16Kind::hadamard:
      run_site_f16<SiteF16Kind::hadamard>(a, rows, k, block, s);
      break;
    case SiteF16Kind::swiglu:
      run_site_f16<SiteF16Kind::swiglu>(a, rows, k, block, s);
      break;
    case SiteF16Kind::residual:
      run_site_f16<SiteF16Kind::residual>(a, rows, k, block, s);
      break;
  }
}

bool site_f16_cluster_fits(int64_t k, int64_t block, int per_block) {
  if (block < 128 || block > 1024 || block % kBlockK || k % block || per_block < 1 || per_block > 4)
    return false;
  const int64_t c = (k / block + per_block - 1) / per_block;
  return c <= kSiteF16MaxCluster && clusters_available();
}

bool site_f16_cluster(SiteF16Kind kind, const SiteF16Args& a, int64_t rows, int64_t k, int64_t block,
                      int per_block, cudaStream_t s) {
  if (!site_f16_cluster_fits(k, block, per_block)) return false;
  if (rows <= 0) return true;
  switch (kind) {
    case SiteF16Kind::hadamard:
      return run_site_f16_cluster<SiteF16Kind::hadamard>(a, rows, k, block, per_block, s);
    case SiteF16Kind::swiglu:
      return run_site_f16_cluster<SiteF16Kind::swiglu>(a, rows, k, block, per_block, s);
    case SiteF16Kind::residual:
      return run_site_f16_cluster<SiteF16Kind::residual>(a, rows, k, block, per_block, s);
  }
  return false;
}

}  // namespace bonsai::cuda
