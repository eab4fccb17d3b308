// RMS norms and the blockwise Walsh–Hadamard site (optionally quantizing its
// output for the ternary matvec in the same pass).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {

namespace {

__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ gain, float* y,
                               int64_t n, float eps) {
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
// order, then the 1/√B scale; all threads of the block take part.
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

// Block per (row, Hadamard block): the block in shared memory, the reference's butterfly
// order (so the result is bit-identical to kernels/ref/fwht.cpp), then the optional
// quantization. With `up`, the input is silu(x) ⊙ up, also written to `act` (swiglu site).
__global__ void hadamard_kernel(const float* x, const float* __restrict__ up, float* __restrict__ act,
                                const float* __restrict__ signs, float* y, int64_t k, int block, bool inverse,
                                uint8_t* __restrict__ xq, float4* __restrict__ meta) {
  extern __shared__ float buf[];
  const int64_t row = blockIdx.x, b0 = static_cast<int64_t>(blockIdx.y) * block;
  const float* xr = x + row * k + b0;
  for (int i = threadIdx.x; i < block; i += blockDim.x) {
    float v = xr[i];
    if (up) {
      v = silu(v) * up[row * k + b0 + i];
      act[row * k + b0 + i] = v;
    }
    if (!inverse && signs) v *= signs[b0 + i];
    buf[i] = v;
  }
  __syncthreads();
  fwht_shared(buf, block, block);
  const float scale = 1.0f / sqrtf(static_cast<float>(block));
  float* yr = y + row * k + b0;
  for (int i = threadIdx.x; i < block; i += blockDim.x) {
    float v = buf[i] * scale;
    if (inverse && signs) v *= signs[b0 + i];
    yr[i] = v;
    buf[i] = v;
  }
  if (!xq) return;
  __syncthreads();
  quantize_shared(buf, block, row * (k / kBlockK) + b0 / kBlockK, xq, meta);
}

// Block per row: x_out = x + delta, normed = rmsnorm(x_out)·gain, rotated = FWHT(s ⊙ normed)/√B,
// quantized. The same arithmetic as add, rmsnorm and hadamard_kernel in sequence.
__global__ void residual_norm_kernel(const float* x, const float* delta, float* x_out,
                                     const float* __restrict__ gain, const float* __restrict__ signs,
                                     float* __restrict__ normed, float* __restrict__ rotated, int n,
                                     int block, float eps, uint8_t* __restrict__ xq,
                                     float4* __restrict__ meta) {
  extern __shared__ float buf[];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = x[base + i];
    if (delta) v = v + delta[base + i];
    x_out[base + i] = v;
    buf[i] = v;
    ss += v * v;
  }
  ss = block_sum(ss);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = buf[i] * scale * gain[i];
    normed[base + i] = v;
    buf[i] = signs ? v * signs[i] : v;
  }
  __syncthreads();
  fwht_shared(buf, n, block);
  const float bscale = 1.0f / sqrtf(static_cast<float>(block));
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = buf[i] * bscale;
    rotated[base + i] = v;
    buf[i] = v;
  }
  if (!xq) return;
  __syncthreads();
  quantize_shared(buf, n, static_cast<int64_t>(blockIdx.x) * (n / kBlockK), xq, meta);
}

}  // namespace

void rmsnorm(const float* x, const float* gain, float* y, int64_t rows, int64_t n, float eps,
             cudaStream_t s) {
  const int threads = n >= 1024 ? 512 : 128;
  rmsnorm_kernel<<<static_cast<unsigned>(rows), threads, 0, s>>>(x, gain, y, n, eps);
}

void gated_rmsnorm(const float* o, const float* z, const float* w, float* y, int64_t rows, int64_t d,
                   float eps, cudaStream_t s) {
  gated_rmsnorm_kernel<<<blocks_for(rows, 8), 256, 0, s>>>(o, z, w, y, rows, d, eps);
}

void hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k, int64_t block,
              bool inverse, uint8_t* xq, float4* meta, cudaStream_t s) {
  swiglu_hadamard(x, nullptr, nullptr, signs, y, rows, k, block, inverse, xq, meta, s);
}

void swiglu_hadamard(const float* x, const float* up, float* act, const float* signs, float* y, int64_t rows,
                     int64_t k, int64_t block, bool inverse, uint8_t* xq, float4* meta, cudaStream_t s) {
  const int threads = static_cast<int>(block >= 512 ? 256 : block >= 64 ? block / 2 : 32);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(k / block));
  hadamard_kernel<<<grid, threads, block * sizeof(float), s>>>(x, up, act, signs, y, k,
                                                               static_cast<int>(block), inverse, xq, meta);
}

void residual_norm_site(const float* x, const float* delta, float* x_out, const float* gain,
                        const float* signs, int64_t block, float* normed, float* rotated, int64_t rows,
                        int64_t n, float eps, uint8_t* xq, float4* meta, cudaStream_t s) {
  residual_norm_kernel<<<static_cast<unsigned>(rows), 1024, n * sizeof(float), s>>>(
      x, delta, x_out, gain, signs, normed, rotated, static_cast<int>(n), static_cast<int>(block), eps, xq,
      meta);
}

}  // namespace bonsai::cuda
