// The gated delta rule on fp32 states [n_v][d_k][d_v].
//
// Columns of a head's state are independent (kv[b], the update of column b and
// o[b] only mix rows), so a block owns one value head and 32 columns: warp w
// holds rows 32w..32w+31 of those columns in registers (lane = column) for all
// t tokens, and the sums over rows go through shared memory.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace bonsai::cuda {
namespace {

constexpr int kMaxWarps = 32;  // d_k <= 1024

__global__ void gdn_recurrence_kernel(const float* __restrict__ conv, const float* __restrict__ g,
                                      const float* __restrict__ beta, float* __restrict__ state,
                                      float* __restrict__ out, int t, int n_k, int n_v, int d_k, int d_v,
                                      float eps) {
  extern __shared__ float sm[];  // qn[d_k], kn[d_k]
  __shared__ float red[kMaxWarps][32];
  float* qn = sm;
  float* kn = sm + d_k;
  const int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  const int col = blockIdx.y * 32 + lane, hk = h % n_k, a = threadIdx.x;  // blockDim.x == d_k
  const bool col_ok = col < d_v;
  const int64_t qk = static_cast<int64_t>(n_k) * d_k, width = 2 * qk + static_cast<int64_t>(n_v) * d_v;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(d_k));
  float* S = state + static_cast<int64_t>(h) * d_k * d_v;

  float s[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) s[j] = col_ok ? S[static_cast<int64_t>(warp * 32 + j) * d_v + col] : 0.0f;

  for (int i = 0; i < t; ++i) {
    const float* ci = conv + static_cast<int64_t>(i) * width;
    const float qv = ci[hk * d_k + a], kv = ci[qk + hk * d_k + a];
    const float ssq = block_sum(qv * qv), ssk = block_sum(kv * kv);
    qn[a] = qv * (q_scale / fmaxf(sqrtf(ssq), eps));
    kn[a] = kv * (1.0f / fmaxf(sqrtf(ssk), eps));
    __syncthreads();
    const float decay = expf(g[static_cast<int64_t>(i) * n_v + h]);
    const float b = beta[static_cast<int64_t>(i) * n_v + h];
    const float v = col_ok ? ci[2 * qk + static_cast<int64_t>(h) * d_v + col] : 0.0f;
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      s[j] *= decay;
      part += s[j] * kn[warp * 32 + j];
    }
    red[warp][lane] = part;
    __syncthreads();
    float kvb = 0.0f;
    for (int w = 0; w < nwarps; ++w) kvb += red[w][lane];
    const float delta = b * (v - kvb);
    __syncthreads();  // everyone has read red before it is reused
    part = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      s[j] += kn[warp * 32 + j] * delta;
      part += s[j] * qn[warp * 32 + j];
    }
    red[warp][lane] = part;
    __syncthreads();
    if (warp == 0 && col_ok) {
      float o = 0.0f;
      for (int w = 0; w < nwarps; ++w) o += red[w][lane];
      out[(static_cast<int64_t>(i) * n_v + h) * d_v + col] = o;
    }
    __syncthreads();  // qn, kn and red are rewritten by the next token
  }
#pragma unroll
  for (int j = 0; j < 32; ++j)
    if (col_ok) S[static_cast<int64_t>(warp * 32 + j) * d_v + col] = s[j];
}

}  // namespace

void gdn_recurrence(const float* conv, const float* g, const float* beta, float* state, float* out, int t,
                    int n_k, int n_v, int d_k, int d_v, float eps, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(n_v), static_cast<unsigned>((d_v + 31) / 32));
  gdn_recurrence_kernel<<<grid, d_k, 2 * d_k * sizeof(float), s>>>(conv, g, beta, state, out, t, n_k, n_v,
                                                                   d_k, d_v, eps);
}

}  // namespace bonsai::cuda
