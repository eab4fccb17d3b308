// The prefill GEMM's wgmma building blocks on one Hopper GPU (docs/performance.md, "Prefill
// GEMM"): (1) layout checks against the CPU: A u8 from registers, B s8 from shared memory
// (kernels/cuda/wgmma.cuh), once with natural operands and once exactly as the GEMM feeds one
// 128-column k-block (the stored tiled codes gathered per lane, the quantized activation's hi/lo
// words as stored, magic-initialized accumulators); (2) throughput: wgmma alone at several N and
// warpgroups per SM, and the GEMM's inner loop without memory traffic (A gathered from shared
// memory, two accumulator sets, the per-element flush of tile_layout.h). Standalone:
//   nvcc -O3 -std=c++20 -I. -gencode arch=compute_90a,code=sm_90a -o wgmma_peak tools/cuda/wgmma_peak.cu
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/cuda/tile_layout.h"
#include "kernels/cuda/wgmma.cuh"

#include "tools/cuda/probe_ck.h"

using namespace bonsai::cuda;

namespace {

// (1a) natural operands: A [64][32] u8, B [64 tokens][32] s8 -> D [64][64].
__global__ void check_natural(const uint8_t* A, const int8_t* B, int* D) {
  __shared__ __align__(128) uint8_t sb[2 * 64 * 16];
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  for (int i = tid; i < 64 * 32; i += 128) {
    const int n = i / 32, k = i % 32;
    sb[((k / 16) * 64 + n) * 16 + k % 16] = static_cast<uint8_t>(B[i]);
  }
  __syncthreads();
  fence_proxy_async_smem();
  uint32_t a[4];
  for (int r = 0; r < 4; ++r) {
    const int row = 16 * w + g + 8 * (r & 1), k0 = 16 * (r >> 1) + 4 * t;
    a[r] = A[row * 32 + k0] | (A[row * 32 + k0 + 1] << 8) | (A[row * 32 + k0 + 2] << 16) |
           (static_cast<uint32_t>(A[row * 32 + k0 + 3]) << 24);
  }
  int d[32];
  for (int i = 0; i < 32; ++i) d[i] = 0;
  const uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(sb));
  wgmma_fence();
  wgmma_m64n64k32_u8s8(d, a, wgmma_desc(sa, 64 * 16, 128), 0);
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < 32; ++i) {
    const int row = 16 * w + g + 8 * ((i & 3) >> 1), n = 8 * (i >> 2) + 2 * t + (i & 1);
    D[row * 64 + n] = d[i];
  }
}

// The GEMM's A gather for k-step j of a 128-column block (one warp = one 16-row tile): lane
// 4g + t' takes the stored words of lane 4g + j, steps t'/2 and 2 + t'/2, and the bit pairs
// of half t' & 1 (tile_layout.h: register p of a step in bit pair p; the activation's k
// order puts natural columns 32s + 16h + 4j + b of the step at k = 4(2s + h) + b).
__device__ __forceinline__ void gather_a(uint32_t (&a)[4], const uint8_t* chunk, int g, int t, int j) {
  const uint4 w4 = *reinterpret_cast<const uint4*>(chunk + 16 * (4 * g + j));
  const uint32_t lo = (t >> 1) ? w4.y : w4.x, hi = (t >> 1) ? w4.w : w4.z;
  const int sh = 4 * (t & 1);
  constexpr uint32_t m = 0x03030303u;
  a[0] = (lo >> sh) & m;
  a[1] = (lo >> (sh + 2)) & m;
  a[2] = (hi >> sh) & m;
  a[3] = (hi >> (sh + 2)) & m;
}

// (1b) one k-block as the GEMM runs it: codes [4 tiles][512 B] (stored chunks' code bytes),
// act [64 tokens][256 B] (hi | lo as quantize_act stores them), staged with the activation's
// 16-byte piece u of token n at (u·64 + n)·16. hi chains start at 0 (scale_d = 0), lo chains at
// kFlushMagicBits. Out: hi [64][64], lo [64][64].
__global__ void check_kblock(const uint8_t* codes, const uint8_t* act, int* hi_out, int* lo_out) {
  __shared__ __align__(128) uint8_t sw[4 * 512];
  __shared__ __align__(128) uint8_t sx[16 * 64 * 16];
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  for (int i = tid; i < 4 * 512 / 16; i += 128)
    reinterpret_cast<uint4*>(sw)[i] = reinterpret_cast<const uint4*>(codes)[i];
  for (int i = tid; i < 64 * 16; i += 128) {
    const int n = i / 16, u = i % 16;
    reinterpret_cast<uint4*>(sx)[u * 64 + n] = reinterpret_cast<const uint4*>(act + n * 256)[u];
  }
  __syncthreads();
  fence_proxy_async_smem();
  const uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(sx));
  int h[32], l[32];
  for (int i = 0; i < 32; ++i) {
    h[i] = 0;
    l[i] = kFlushMagicBits;
  }
  uint32_t a[4][4];
  for (int j = 0; j < 4; ++j) gather_a(a[j], sw + 512 * w, g, t, j);
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    wgmma_m64n64k32_u8s8(h, a[j], wgmma_desc(sa + 2 * j * 1024, 1024, 128), j > 0);
    wgmma_m64n64k32_u8s8(l, a[j], wgmma_desc(sa + (8 + 2 * j) * 1024, 1024, 128), 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < 32; ++i) {
    const int row = 16 * w + g + 8 * ((i & 3) >> 1), n = 8 * (i >> 2) + 2 * t + (i & 1);
    hi_out[row * 64 + n] = h[i];
    lo_out[row * 64 + n] = l[i];
  }
}

// (2a) wgmma alone: per iteration one k-block's 8 wgmmas (4 steps x hi/lo) into one
// accumulator, A fixed in registers, B from shared memory.
template <int N>
__global__ void __launch_bounds__(128) peak_wgmma(int iters, int* out) {
  extern __shared__ __align__(128) uint8_t sx[];  // 16 pieces x N tokens x 16 B
  const uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(sx));
  for (int i = threadIdx.x; i < 16 * N; i += 128)
    reinterpret_cast<uint4*>(sx)[i] = make_uint4(i, i * 3, i * 5, i * 7);
  __syncthreads();
  fence_proxy_async_smem();
  const uint32_t a[4] = {threadIdx.x & 0x03030303u, 1u, 2u, 3u};
  int d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0;
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint64_t desc = wgmma_desc(sa + 2 * j * N * 16, N * 16, 128);
      if constexpr (N == 64) wgmma_m64n64k32_u8s8(*reinterpret_cast<int(*)[32]>(d), a, desc, 1);
      if constexpr (N == 128) wgmma_m64n128k32_u8s8(*reinterpret_cast<int(*)[64]>(d), a, desc, 1);
      if constexpr (N == 192) wgmma_m64n192k32_u8s8(*reinterpret_cast<int(*)[96]>(d), a, desc, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
  }
  int s = 0;
  for (int i = 0; i < N / 2; ++i) s += d[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// (2b) the GEMM's compute loop without global memory: 2 warpgroups x 64 rows x 64 tokens per
// block; per k-block each warp gathers its A from a shared code chunk, issues 8 wgmmas into
// accumulator set kb & 1 (magic-initialized), and flushes set (kb - 1) & 1 once its group is
// done: T = 256·(hi − M) + (lo − mq), acc += T·(d·s) (tile_layout.h flush_value). ptxas
// serializes these wgmmas (C7514: a set is in flight across the loop's back edge and its copies
// there read it); kept to show what that costs. (2d) is the form that stays asynchronous.
__global__ void __launch_bounds__(256, 1) peak_flush(int iters, const float* scales, float* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sw = smem;            // 8 tiles x 512 B codes
  uint8_t* sx = smem + 8 * 512;  // 16 pieces x 64 tokens x 16 B
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
            t = lane & 3;
  for (int i = tid; i < (8 * 512 + 16 * 64 * 16) / 16; i += 256)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(i * 0x01010101u, i * 7, i * 0x03030303u, i);
  __syncthreads();
  fence_proxy_async_smem();
  const uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(sx));
  const uint8_t* chunk = sw + 512 * (wg * 4 + w);
  float dr[2], sc[16], mq[16];
  dr[0] = scales[g];
  dr[1] = scales[g + 8];
  for (int i = 0; i < 16; ++i) {
    sc[i] = scales[16 + i];
    mq[i] = kFlushMagic + scales[32 + i];
  }
  float acc[32];
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  int h[2][32], l[2][32];
  uint32_t a[2][4][4];
  auto issue = [&](int set) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      h[set][i] = kFlushMagicBits;
      l[set][i] = kFlushMagicBits;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) gather_a(a[set][j], chunk, g, t, j);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      wgmma_reg_fence(h[set][i]);
      wgmma_reg_fence(l[set][i]);
    }
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      wgmma_m64n64k32_u8s8(h[set], a[set][j], wgmma_desc(sa + 2 * j * 1024, 1024, 128), 1);
      wgmma_m64n64k32_u8s8(l[set], a[set][j], wgmma_desc(sa + (8 + 2 * j) * 1024, 1024, 128), 1);
    }
    wgmma_commit();
  };
  auto flush = [&](int set) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      wgmma_reg_fence(h[set][i]);
      wgmma_reg_fence(l[set][i]);
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int c = ((i >> 2) << 1) | (i & 1);
      const float T = flush_value(h[set][i], l[set][i], mq[c]);
      acc[i] = fmaf(T, dr[(i >> 1) & 1] * sc[c], acc[i]);
    }
  };
  issue(0);
  for (int it = 0; it < iters; ++it) {
    issue(1);
    wgmma_wait<1>();
    flush(0);
    issue(0);
    wgmma_wait<1>();
    flush(1);
  }
  wgmma_wait<0>();
  flush(0);
  float s = 0.0f;
  for (int i = 0; i < 32; ++i) s += acc[i];
  out[blockIdx.x * blockDim.x + tid] = s;
}

// (2c) as (2b) with one accumulator set per warpgroup and no overlap inside it (issue, wait,
// flush): the other warpgroups of the SM keep the tensor cores busy meanwhile. Blocks of one
// warpgroup (64 rows x 64 tokens).
template <int OCC>
__global__ void __launch_bounds__(128, OCC) peak_flush1(int iters, const float* scales, float* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sw = smem;            // 4 tiles x 512 B codes
  uint8_t* sx = smem + 4 * 512;  // 16 pieces x 64 tokens x 16 B
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  for (int i = tid; i < (4 * 512 + 16 * 64 * 16) / 16; i += 128)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(i * 0x01010101u, i * 7, i * 0x03030303u, i);
  __syncthreads();
  fence_proxy_async_smem();
  const uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(sx));
  const uint8_t* chunk = sw + 512 * w;
  float dr[2], sc[16], mq[16];
  dr[0] = scales[g];
  dr[1] = scales[g + 8];
  for (int i = 0; i < 16; ++i) {
    sc[i] = scales[16 + i];
    mq[i] = kFlushMagic + scales[32 + i];
  }
  float acc[32];
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  for (int it = 0; it < iters; ++it) {
    int h[32], l[32];
    uint32_t a[4][4];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      h[i] = kFlushMagicBits;
      l[i] = kFlushMagicBits;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) gather_a(a[j], chunk + (it & 1) * 16, g, t, j);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      wgmma_m64n64k32_u8s8(h, a[j], wgmma_desc(sa + 2 * j * 1024, 1024, 128), 1);
      wgmma_m64n64k32_u8s8(l, a[j], wgmma_desc(sa + (8 + 2 * j) * 1024, 1024, 128), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int c = ((i >> 2) << 1) | (i & 1);
      const float T = flush_value(h[i], l[i], mq[c]);
      acc[i] = fmaf(T, dr[(i >> 1) & 1] * sc[c], acc[i]);
    }
  }
  float s = 0.0f;
  for (int i = 0; i < 32; ++i) s += acc[i];
  out[blockIdx.x * blockDim.x + tid] = s;
}

// (2d) two accumulator sets, each half-iteration: issue set X's batch, flush set Y (the
// previous batch, already complete), wait for X (the first batch issued and waited before the loop). Nothing
// is in flight across the loop's back edge, so ptxas keeps the wgmmas asynchronous; the flush still overlaps
// the next batch.
template <int OCC>
__global__ void __launch_bounds__(128, OCC) peak_flush2(int iters, const float* scales, float* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sw = smem;
  uint8_t* sx = smem + 4 * 512;
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  for (int i = tid; i < (4 * 512 + 16 * 64 * 16) / 16; i += 128)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(i * 0x01010101u, i * 7, i * 0x03030303u, i);
  __syncthreads();
  fence_proxy_async_smem();
  const uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(sx));
  const uint8_t* chunk = sw + 512 * w;
  float dr[2], sc[16], mq[16];
  dr[0] = scales[g];
  dr[1] = scales[g + 8];
  for (int i = 0; i < 16; ++i) {
    sc[i] = scales[16 + i];
    mq[i] = kFlushMagic + scales[32 + i];
  }
  float acc[32];
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  int h[2][32], l[2][32];
  auto issue = [&](int set, int it) {
    uint32_t a[4][4];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      h[set][i] = kFlushMagicBits;
      l[set][i] = kFlushMagicBits;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) gather_a(a[j], chunk + (it & 1) * 16, g, t, j);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      wgmma_m64n64k32_u8s8(h[set], a[j], wgmma_desc(sa + 2 * j * 1024, 1024, 128), 1);
      wgmma_m64n64k32_u8s8(l[set], a[j], wgmma_desc(sa + (8 + 2 * j) * 1024, 1024, 128), 1);
    }
    wgmma_commit();
  };
  auto flush = [&](int set) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int c = ((i >> 2) << 1) | (i & 1);
      const float T = flush_value(h[set][i], l[set][i], mq[c]);
      acc[i] = fmaf(T, dr[(i >> 1) & 1] * sc[c], acc[i]);
    }
  };
  issue(0, 0);
  wgmma_wait<0>();
  for (int it = 0; it < iters; ++it) {
    issue(1, it + 1);
    flush(0);
    wgmma_wait<0>();
    issue(0, it);
    flush(1);
    wgmma_wait<0>();
  }
  flush(0);
  float s = 0.0f;
  for (int i = 0; i < 32; ++i) s += acc[i];
  out[blockIdx.x * blockDim.x + tid] = s;
}

int check(const char* what, const std::vector<int>& got, const std::vector<int>& want) {
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ < 5)
      std::printf("  %s mismatch at %zu (row %zu, col %zu): got %d want %d\n", what, i, i / 64, i % 64,
                  got[i], want[i]);
  std::printf("%s: %s (%d of %zu differ)\n", what, bad ? "FAIL" : "ok", bad, got.size());
  return bad;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
  std::mt19937 rng(7);
  int fails = 0;
  {  // (1a)
    std::vector<uint8_t> A(64 * 32);
    std::vector<int8_t> B(64 * 32);
    for (auto& v : A) v = static_cast<uint8_t>(rng());
    for (auto& v : B) v = static_cast<int8_t>(rng());
    std::vector<int> want(64 * 64), got(64 * 64);
    for (int r = 0; r < 64; ++r)
      for (int n = 0; n < 64; ++n) {
        int s = 0;
        for (int k = 0; k < 32; ++k) s += A[r * 32 + k] * B[n * 32 + k];
        want[r * 64 + n] = s;
      }
    uint8_t *dA, *dB;
    int* dD;
    CK(cudaMalloc(&dA, A.size()));
    CK(cudaMalloc(&dB, B.size()));
    CK(cudaMalloc(&dD, got.size() * 4));
    CK(cudaMemcpy(dA, A.data(), A.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B.data(), B.size(), cudaMemcpyHostToDevice));
    check_natural<<<1, 128>>>(dA, reinterpret_cast<int8_t*>(dB), dD);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got.data(), dD, got.size() * 4, cudaMemcpyDeviceToHost));
    fails += check("natural m64n64k32 u8 x s8", got, want);
  }
  {  // (1b)
    std::vector<uint8_t> codes(4 * 512), act(64 * 256);
    for (auto& v : codes) v = static_cast<uint8_t>(rng());
    for (auto& v : act) v = static_cast<uint8_t>(rng());
    std::vector<int> wh(64 * 64), wl(64 * 64), gh(64 * 64), gl(64 * 64);
    for (int r = 0; r < 64; ++r)
      for (int n = 0; n < 64; ++n) {
        int sh = 0, sl = 0;
        for (int k = 0; k < 128; ++k) {
          const CodePos p = code_pos(r % 16, k);
          const int c = (codes[(r / 16) * 512 + p.byte] >> p.shift) & 3;
          const int byte = act_word(k) * 4 + (k & 3);
          sh += c * static_cast<int8_t>(act[n * 256 + byte]);
          sl += c * static_cast<int8_t>(act[n * 256 + 128 + byte]);
        }
        wh[r * 64 + n] = sh;
        wl[r * 64 + n] = sl + kFlushMagicBits;
      }
    uint8_t *dc, *da;
    int *dh, *dl;
    CK(cudaMalloc(&dc, codes.size()));
    CK(cudaMalloc(&da, act.size()));
    CK(cudaMalloc(&dh, 64 * 64 * 4));
    CK(cudaMalloc(&dl, 64 * 64 * 4));
    CK(cudaMemcpy(dc, codes.data(), codes.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(da, act.data(), act.size(), cudaMemcpyHostToDevice));
    check_kblock<<<1, 128>>>(dc, da, dh, dl);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(gh.data(), dh, gh.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gl.data(), dl, gl.size() * 4, cudaMemcpyDeviceToHost));
    fails += check("k-block hi (tiled codes gathered, act as stored)", gh, wh);
    fails += check("k-block lo (magic-initialized)", gl, wl);
  }
  const int sms = prop.multiProcessorCount;
  int* dout;
  CK(cudaMalloc(&dout, 16 * sms * 256 * 4));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto time_it = [&](auto&& launch) {
    launch();
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return static_cast<double>(ms);
  };
  auto peak = [&](auto kernel, int n, int per_sm) {
    const int smem = 16 * n * 16, iters = 4000, blocks = sms * per_sm;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const double ms = time_it([&] { kernel<<<blocks, 128, smem>>>(iters, dout); });
    const double macs = static_cast<double>(blocks) * iters * 8 * 64.0 * n * 32;
    std::printf("wgmma m64n%dk32 alone, %d warpgroups/SM: %.3f ms, %.1f T int8 MAC/s\n", n, per_sm, ms,
                macs / ms * 1e-9);
  };
  for (int per_sm : {1, 2, 3, 4}) peak(peak_wgmma<64>, 64, per_sm);
  for (int per_sm : {1, 2}) peak(peak_wgmma<128>, 128, per_sm);
  peak(peak_wgmma<192>, 192, 1);
  {
    float* dsc;
    CK(cudaMalloc(&dsc, 64 * 4));
    std::vector<float> s(64);
    for (int i = 0; i < 64; ++i) s[i] = (i < 32) ? 0.001f * (i + 1) : static_cast<float>(i * 37 % 1000);
    CK(cudaMemcpy(dsc, s.data(), 64 * 4, cudaMemcpyHostToDevice));
    const int smem = 8 * 512 + 16 * 64 * 16, iters = 2000;
    CK(cudaFuncSetAttribute(peak_flush, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    for (int per_sm : {1, 2}) {
      const int blocks = sms * per_sm;
      const double ms =
          time_it([&] { peak_flush<<<blocks, 256, smem>>>(iters, dsc, reinterpret_cast<float*>(dout)); });
      const double macs = static_cast<double>(blocks) * 2 * (2.0 * iters + 1) * 8 * 64.0 * 64 * 32;
      std::printf(
          "GEMM loop (gather + 8 wgmma m64n64k32 + flush, 2 sets), %d blocks of 2 WGs per SM launched: %.3f "
          "ms, "
          "%.1f T int8 MAC/s (%.1f T weight x token)\n",
          per_sm, ms, macs / ms * 1e-9, macs / ms * 0.5e-9);
    }
  }
  {
    float* dsc;
    CK(cudaMalloc(&dsc, 64 * 4));
    std::vector<float> s(64);
    for (int i = 0; i < 64; ++i) s[i] = (i < 32) ? 0.001f * (i + 1) : static_cast<float>(i * 37 % 1000);
    CK(cudaMemcpy(dsc, s.data(), 64 * 4, cudaMemcpyHostToDevice));
    const int smem = 4 * 512 + 16 * 64 * 16, iters = 4000;
    auto run1 = [&](auto kernel, int per_sm) {
      CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      const int blocks = sms * per_sm;
      const double ms =
          time_it([&] { kernel<<<blocks, 128, smem>>>(iters, dsc, reinterpret_cast<float*>(dout)); });
      const double macs = static_cast<double>(blocks) * iters * 8 * 64.0 * 64 * 32;
      std::printf(
          "GEMM loop, one set per warpgroup (issue, wait, flush), %d warpgroups/SM: %.3f ms, %.1f T int8 "
          "MAC/s (%.1f T weight x token)\n",
          per_sm, ms, macs / ms * 1e-9, macs / ms * 0.5e-9);
    };
    run1(peak_flush1<2>, 2);
    run1(peak_flush1<3>, 3);
    run1(peak_flush1<4>, 4);
    auto run2 = [&](auto kernel, int per_sm) {
      CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      const int blocks = sms * per_sm;
      const double ms =
          time_it([&] { kernel<<<blocks, 128, smem>>>(iters / 2, dsc, reinterpret_cast<float*>(dout)); });
      const double macs = static_cast<double>(blocks) * iters * 8 * 64.0 * 64 * 32;
      std::printf(
          "GEMM loop, two sets (issue X, flush Y, wait), %d warpgroups/SM: %.3f ms, %.1f T int8 "
          "MAC/s (%.1f T weight x token)\n",
          per_sm, ms, macs / ms * 1e-9, macs / ms * 0.5e-9);
    };
    run2(peak_flush2<1>, 1);
    run2(peak_flush2<2>, 2);
  }
  std::printf("%s\n", fails ? "LAYOUT CHECKS FAILED" : "layout checks passed");
  return fails ? 1 : 0;
}
