// Throughput ceiling of the prefill GEMM's tensor-core instruction on one GPU:
// mma.sync.m16n8k32 u8 x s8 -> s32 in CH independent accumulator chains per warp, nothing else
// (docs/performance.md, "Prefill GEMM"). Standalone, not part of the CMake build:
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o imma_peak tools/cuda/imma_peak.cu && ./imma_peak
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

__device__ __forceinline__ void mma(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Each warp: iters x 4 x CH MMAs; the sums are stored so that nothing is dead code.
template <int CH>
__global__ void imma_chains(int iters, int* out) {
  const uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
  const uint32_t b0 = threadIdx.x * 11u, b1 = threadIdx.x * 13u;
  int d[CH][4] = {};
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int c = 0; c < CH; ++c) mma(d[c], a, b0 + s, b1);
  int sum = 0;
#pragma unroll
  for (int c = 0; c < CH; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) sum += d[c][e];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

template <int CH>
void run(int blocks_per_sm, int threads, int sms) {
  const int iters = 2048, nb = sms * blocks_per_sm;
  int* out = nullptr;
  cudaMalloc(&out, sizeof(int) * nb * threads);
  imma_chains<CH><<<nb, threads>>>(16, out);  // warm-up
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  imma_chains<CH><<<nb, threads>>>(iters, out);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  const double mmas = static_cast<double>(nb) * (threads / 32) * iters * 4 * CH;
  std::printf("%2d chains per warp, %3d threads x %d blocks per SM: %.3f ms, %.1f T int8 MAC/s (%s)\n", CH,
              threads, blocks_per_sm, ms, mmas * 4096 / (ms * 1e-3) / 1e12,
              cudaGetErrorString(cudaGetLastError()));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(out);
}

}  // namespace

int main() {
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  std::printf("%s, %d SMs\n", p.name, p.multiProcessorCount);
  run<16>(1, 256, p.multiProcessorCount);
  run<16>(2, 256, p.multiProcessorCount);
  run<8>(2, 256, p.multiProcessorCount);
  run<4>(2, 256, p.multiProcessorCount);
  run<4>(4, 256, p.multiProcessorCount);
  return 0;
}
