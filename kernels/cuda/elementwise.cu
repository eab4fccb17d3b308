// Elementwise and layout ops, RoPE, the KV-cache store, the GDN conv and gates.
#include <algorithm>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/knobs.h"
#include "kernels/cuda/launch.h"

namespace bonsai::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
  pdl_trigger();
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] + b[i];
}

__global__ void swiglu_kernel(const float* gate, const float* up, float* y, int64_t n) {
  pdl_trigger();
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = silu(gate[i]) * up[i];
}

__global__ void sigmoid_mul_kernel(const float* x, const float* gate, float* y, int64_t n) {
  pdl_trigger();
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * sigmoid(gate[i]);
}

// Thread per output element: y[r][j][i][e] = x[r][i][j][e].
__global__ void transpose_heads_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t total,
                                       int a, int b, int64_t d) {
  pdl_trigger();
  pdl_wait();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= total) return;
  const int64_t e = o % d, i = (o / d) % a, j = (o / d / a) % b, r = o / d / a / b;
  y[o] = x[((r * a + i) * b + j) * d + e];
}

__global__ void take_part_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t total, int parts,
                                 int part, int64_t d) {
  pdl_trigger();
  pdl_wait();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= total) return;
  const int64_t r = o / d, e = o % d;
  y[o] = x[(r * parts + part) * d + e];
}

// Thread per rotated pair (token i, head h, j < n_rot/2), NeoX rotate-half like the reference.
__global__ void rope_kernel(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0,
                            const int* pos_dev) {
  pdl_trigger();
  pdl_wait();
  const int half = n_rot / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(t) * n_head * half) return;
  const int j = static_cast<int>(idx % half);
  const int64_t ih = idx / half;  // i * n_head + h
  const int i = static_cast<int>(ih / n_head);
  const float pos = static_cast<float>(position(pos0, pos_dev) + i);
  const float theta = pos * powf(base, -2.0f * static_cast<float>(j) / static_cast<float>(n_rot));
  float s, c;
  sincosf(theta, &s, &c);
  float* v = x + ih * head_dim;
  const float a = v[j], b = v[j + half];
  v[j] = a * c - b * s;
  v[j + half] = a * s + b * c;
}

// T = __half: the KV cache's f16 rows, rounded to nearest even (__float2half_rn, as f32_to_fp16).
template <class T>
__global__ void store_rows_kernel(T* __restrict__ cache, const float* __restrict__ src, int64_t total,
                                  int64_t width, int pos0, const int* pos_dev) {
  pdl_trigger();
  pdl_wait();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o < total) cache[static_cast<int64_t>(position(pos0, pos_dev)) * width + o] = to_cache<T>(src[o]);
}

// Thread per channel; the taps-1 previous inputs live in registers across the t tokens.
constexpr int kMaxTaps = 8;
__global__ void ssm_conv_kernel(const float* __restrict__ x, float* __restrict__ state,
                                const float* __restrict__ w, float* __restrict__ out, int t, int64_t channels,
                                int taps) {
  pdl_trigger();
  pdl_wait();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float prev[kMaxTaps - 1], wc[kMaxTaps];
#pragma unroll
  for (int j = 0; j < kMaxTaps - 1; ++j) prev[j] = j < taps - 1 ? state[j * channels + c] : 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxTaps; ++j) wc[j] = j < taps ? w[c * taps + j] : 0.0f;
  for (int i = 0; i < t; ++i) {
    const float xi = x[static_cast<int64_t>(i) * channels + c];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxTaps - 1; ++j)
      if (j < taps - 1) acc += wc[j] * prev[j];
        // the newest input multiplies the last tap
#pragma unroll
    for (int j = 0; j < kMaxTaps; ++j)
      if (j == taps - 1) acc += wc[j] * xi;
    out[static_cast<int64_t>(i) * channels + c] = silu(acc);
#pragma unroll
    for (int j = 0; j + 1 < kMaxTaps - 1; ++j)
      if (j + 1 < taps - 1) prev[j] = prev[j + 1];
#pragma unroll
    for (int j = 0; j < kMaxTaps - 1; ++j)
      if (j == taps - 2) prev[j] = xi;
  }
#pragma unroll
  for (int j = 0; j < kMaxTaps - 1; ++j)
    if (j < taps - 1) state[j * channels + c] = prev[j];
}

__global__ void gdn_gates_kernel(const float* alpha, const float* beta_in, const float* __restrict__ ssm_a,
                                 const float* __restrict__ dt_bias, float* g, float* beta, int t, int n_v) {
  pdl_trigger();
  pdl_wait();
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= static_cast<int64_t>(t) * n_v) return;
  const int h = static_cast<int>(j % n_v);
  g[j] = ssm_a[h] * softplus(alpha[j] + dt_bias[h]);
  beta[j] = sigmoid(beta_in[j]);
}

}  // namespace

void add(const float* a, const float* b, float* y, int64_t n, cudaStream_t s) {
  launch(add_kernel, blocks_for(n, kThreads), kThreads, 0, s, a, b, y, n);
}

void swiglu(const float* gate, const float* up, float* y, int64_t n, cudaStream_t s) {
  launch(swiglu_kernel, blocks_for(n, kThreads), kThreads, 0, s, gate, up, y, n);
}

void sigmoid_mul(const float* x, const float* gate, float* y, int64_t n, cudaStream_t s) {
  launch(sigmoid_mul_kernel, blocks_for(n, kThreads), kThreads, 0, s, x, gate, y, n);
}

void transpose_heads(const float* x, float* y, int64_t rows, int a, int b, int64_t d, cudaStream_t s) {
  const int64_t total = rows * a * b * d;
  launch(transpose_heads_kernel, blocks_for(total, kThreads), kThreads, 0, s, x, y, total, a, b, d);
}

void take_part(const float* x, float* y, int64_t rows, int parts, int part, int64_t d, cudaStream_t s) {
  const int64_t total = rows * d;
  launch(take_part_kernel, blocks_for(total, kThreads), kThreads, 0, s, x, y, total, parts, part, d);
}

void rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0, const int* pos_dev,
          cudaStream_t s) {
  const int64_t total = static_cast<int64_t>(t) * n_head * (n_rot / 2);
  if (total == 0) return;
  launch(rope_kernel, blocks_for(total, kThreads), kThreads, 0, s, x, t, n_head, head_dim, n_rot, base, pos0,
         pos_dev);
}

void store_rows(void* cache, const float* src, int64_t width, int t, int pos0, const int* pos_dev, KvType kv,
                cudaStream_t s) {
  const int64_t total = width * t;
  if (kv == KvType::F16)
    launch(store_rows_kernel<__half>, blocks_for(total, kThreads), kThreads, 0, s,
           static_cast<__half*>(cache), src, total, width, pos0, pos_dev);
  else
    launch(store_rows_kernel<float>, blocks_for(total, kThreads), kThreads, 0, s, static_cast<float*>(cache),
           src, total, width, pos0, pos_dev);
}

void ssm_conv(const float* x, float* state, const float* w, float* out, int t, int64_t channels, int taps,
              cudaStream_t s) {
  launch(ssm_conv_kernel, blocks_for(channels, 128), 128, 0, s, x, state, w, out, t, channels, taps);
}

void gdn_gates(const float* alpha, const float* beta_in, const float* ssm_a, const float* dt_bias, float* g,
               float* beta, int t, int n_v, cudaStream_t s) {
  const int64_t total = static_cast<int64_t>(t) * n_v;
  launch(gdn_gates_kernel, blocks_for(total, kThreads), kThreads, 0, s, alpha, beta_in, ssm_a, dt_bias, g,
         beta, t, n_v);
}

bool pdl_enabled() {
  static const bool on = [] {
    if (!knob::pdl()) return false;  // BONSAI_CUDA_PDL=0
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return on;
}

bool clusters_available() {
  static const bool ok = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major == 9;
  }();
  return ok;
}

namespace {
// The yardstick of the matvec benchmark (measure_read_chain): streams n16 16-byte words with four
// independent non-allocating loads in flight per thread, then, after the dependency wait, writes
// one word per block, so that a chain of launches is ordered like the decode matvecs' (weights read
// before the wait, the result after it).
__global__ void read_stream_kernel(const uint4* __restrict__ src, int64_t n16, uint32_t* out) {
  pdl_trigger();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = __ldcs(src + i + j * stride);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = __ldcs(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  pdl_wait();
  if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, acc);
}
}  // namespace

double measure_read_chain(size_t bytes, int copies, int reps, int blocks, cudaStream_t s) {
  const size_t n16 = bytes / 16;
  std::vector<void*> bufs(static_cast<size_t>(copies), nullptr);
  uint32_t* out = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  double result = 0.0;
  bool ok = n16 > 0 && cudaMalloc(reinterpret_cast<void**>(&out), 4 * 1024 * sizeof(uint32_t)) == cudaSuccess;
  for (void*& b : bufs)
    ok = ok && cudaMalloc(&b, n16 * 16) == cudaSuccess && cudaMemsetAsync(b, 1, n16 * 16, s) == cudaSuccess;
  const unsigned grid = static_cast<unsigned>(blocks);
  if (ok && cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    for (void* b : bufs)
      launch(read_stream_kernel, grid, 512, 0, s, static_cast<const uint4*>(b), static_cast<int64_t>(n16),
             out);
    ok = cudaStreamEndCapture(s, &graph) == cudaSuccess &&
         cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  }
  if (ok && exec && cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
    cudaGraphLaunch(exec, s);  // warm-up
    cudaEventRecord(e0, s);
    for (int r = 0; r < reps; ++r) cudaGraphLaunch(exec, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    if (ms > 0.0f) result = ms * 1e-3 / (static_cast<double>(reps) * copies);
  }
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  for (void* b : bufs)
    if (b) cudaFree(b);
  if (out) cudaFree(out);
  cudaGetLastError();
  return result;
}

double measure_copy_bandwidth(size_t bytes, int reps, cudaStream_t s) {
  void *a = nullptr, *b = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  double result = 0.0;
  if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess &&
      cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
    cudaMemsetAsync(a, 1, bytes, s);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);  // warm-up
    cudaEventRecord(e0, s);
    for (int r = 0; r < reps; ++r)
      cudaMemcpyAsync(r % 2 ? a : b, r % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    if (ms > 0.0f) result = 2.0 * static_cast<double>(bytes) * reps / (ms * 1e-3);
  }
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (a) cudaFree(a);
  if (b) cudaFree(b);
  return result;
}

}  // namespace bonsai::cuda
