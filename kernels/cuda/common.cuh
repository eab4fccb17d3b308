// Device helpers shared by the CUDA kernels.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

namespace bonsai::cuda {

inline constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, <= 1024); every thread gets the total.
// Safe to call repeatedly: the leading barrier protects the scratch from the previous call.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float scratch[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < nwarps; ++w) total += scratch[w];
  return total;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// KV cache elements (T = float, or __half for an f16 cache): stored rounded to nearest even, read
// back widened exactly.
template <class T>
__device__ __forceinline__ T to_cache(float x) {
  if constexpr (sizeof(T) == 2)
    return __float2half_rn(x);
  else
    return x;
}
__device__ __forceinline__ float from_cache(float x) { return x; }
__device__ __forceinline__ float from_cache(__half x) { return __half2float(x); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// fp16 stored at a 2-byte aligned address.
__device__ __forceinline__ float load_half(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}

// Position argument of a recordable op: the device value when given.
__device__ __forceinline__ int position(int pos0, const int* pos_dev) { return pos_dev ? *pos_dev : pos0; }

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// ---- programmatic dependent launch (Hopper) ------------------------------------------
// Kernels are launched with programmatic stream serialization, so a kernel may start
// while its predecessor is still running. Every kernel calls pdl_wait() before it
// touches memory a predecessor writes or reads (activations, states): griddepcontrol.wait
// returns once the preceding grid has completed and its writes are visible. Work that
// only reads weights (the matvec's first loads) goes before it. pdl_trigger() lets the
// next kernel be scheduled early. Both are no-ops before sm_90 and without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Programmatic serialization on devices that have it (compute capability >= 9.0), unless
// BONSAI_CUDA_PDL=0. Read once per process; the answer never changes afterwards.
bool pdl_enabled();

// Whether thread-block clusters can be launched: a device of compute capability 9.x, which runs the
// sm_90a build (other devices run the portable PTX, whose cluster kernels are stubs). Read once per
// process; the answer never changes afterwards.
bool clusters_available();

// kernel<<<grid, block, smem, s>>>(args...) with the programmatic-serialization attribute and, when
// `cluster` is given, that cluster shape. Returns the launch's status.
template <class... KArgs, class... Args>
cudaError_t launch_config(void (*kernel)(KArgs...), dim3 grid, dim3 block, const dim3* cluster, size_t smem,
                          cudaStream_t s, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  if (cluster) {
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = cluster->x;
    attr[1].val.clusterDim.y = cluster->y;
    attr[1].val.clusterDim.z = cluster->z;
  }
  cfg.attrs = attr;
  cfg.numAttrs = cluster ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

// The usual launch: errors surface at the next synchronizing call, as with <<<>>>.
template <class... KArgs, class... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args... args) {
  launch_config(kernel, grid, block, nullptr, smem, s, args...);
}

// launch() with a cluster shape. Returns the launch's status: a refused cluster launch (e.g. a shape
// the device cannot co-schedule) is for the caller to handle.
template <class... KArgs, class... Args>
cudaError_t launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, dim3 cluster, size_t smem,
                           cudaStream_t s, Args... args) {
  return launch_config(kernel, grid, block, &cluster, smem, s, args...);
}

}  // namespace bonsai::cuda
