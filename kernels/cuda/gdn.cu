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
  pdl_trigger();
  pdl_wait();
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

// The whole per-token GDN core in one launch, block per value head h with all d_v columns:
// warp w holds rows 32·(w % RG) .. +31 of column 32·(w / RG) + lane (RG = d_k/32). Optional
// parts, each the same arithmetic as its separate op: the gates from alpha/beta_in
// (gdn_gates), the gated RMSNorm of the head's output (gated_rmsnorm), and writing head h
// at its grouped position (transpose_heads with a = n_v/n_k, b = n_k).
__global__ void __launch_bounds__(512) gdn_fused_kernel(GdnFused p) {
  extern __shared__ float sm[];  // qn[d_k], kn[d_k], red[RG][d_v]
  __shared__ float scal[2];
  pdl_trigger();
  pdl_wait();
  const int d_k = p.d_k, d_v = p.d_v, RG = d_k / 32;
  float* qn = sm;
  float* kn = sm + d_k;
  float* red = sm + 2 * d_k;
  const int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rg = warp % RG, col = (warp / RG) * 32 + lane, hk = h % p.n_k, tid = threadIdx.x;
  const int64_t qk = static_cast<int64_t>(p.n_k) * d_k, width = 2 * qk + static_cast<int64_t>(p.n_v) * d_v;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(d_k));
  float* S = p.state + static_cast<int64_t>(h) * d_k * d_v;
  const int rep = p.n_v / p.n_k;
  const int out_head = p.transpose ? (h % p.n_k) * rep + h / p.n_k : h;

  float s[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) s[j] = S[static_cast<int64_t>(rg * 32 + j) * d_v + col];

  for (int i = 0; i < p.t; ++i) {
    const float* ci = p.conv + static_cast<int64_t>(i) * width;
    const int64_t ih = static_cast<int64_t>(i) * p.n_v + h;
    const float qv = tid < d_k ? ci[hk * d_k + tid] : 0.0f, kv = tid < d_k ? ci[qk + hk * d_k + tid] : 0.0f;
    const float v = ci[2 * qk + static_cast<int64_t>(h) * d_v + col];
    float decay, b;
    if (p.alpha) {  // gdn_gates in place
      decay = expf(p.ssm_a[h] * softplus(p.alpha[ih] + p.dt_bias[h]));
      b = sigmoid(p.beta_in[ih]);
    } else {
      decay = expf(p.g[ih]);
      b = p.beta[ih];
    }
    const float ssq = block_sum(qv * qv), ssk = block_sum(kv * kv);
    if (tid < d_k) {
      qn[tid] = qv * (q_scale / fmaxf(sqrtf(ssq), p.eps));
      kn[tid] = kv * (1.0f / fmaxf(sqrtf(ssk), p.eps));
    }
    __syncthreads();
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      s[j] *= decay;
      part += s[j] * kn[rg * 32 + j];
    }
    red[rg * d_v + col] = part;
    __syncthreads();
    float kvb = 0.0f;
    for (int r = 0; r < RG; ++r) kvb += red[r * d_v + col];
    const float delta = b * (v - kvb);
    __syncthreads();  // red is reused below
    part = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      s[j] += kn[rg * 32 + j] * delta;
      part += s[j] * qn[rg * 32 + j];
    }
    red[rg * d_v + col] = part;
    __syncthreads();
    float o = 0.0f;
    if (rg == 0)
      for (int r = 0; r < RG; ++r) o += red[r * d_v + col];
    if (p.norm_w) {  // gated_rmsnorm over the head's d_v outputs (rg == 0 threads hold them)
      const float ss = block_sum(rg == 0 ? o * o : 0.0f);
      if (tid == 0) scal[0] = 1.0f / sqrtf(ss / static_cast<float>(d_v) + p.norm_eps);
      __syncthreads();
      if (rg == 0) {
        const float z = p.z[ih * d_v + col];
        p.out[(static_cast<int64_t>(i) * p.n_v + out_head) * d_v + col] =
            o * scal[0] * p.norm_w[col] * silu(z);
      }
    } else if (rg == 0) {
      p.out[ih * d_v + col] = o;
    }
    __syncthreads();  // qn, kn, red and scal are rewritten by the next token
  }
#pragma unroll
  for (int j = 0; j < 32; ++j) S[static_cast<int64_t>(rg * 32 + j) * d_v + col] = s[j];
}

}  // namespace

void gdn_recurrence(const float* conv, const float* g, const float* beta, float* state, float* out, int t,
                    int n_k, int n_v, int d_k, int d_v, float eps, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(n_v), static_cast<unsigned>((d_v + 31) / 32));
  launch(gdn_recurrence_kernel, grid, d_k, 2 * d_k * sizeof(float), s, conv, g, beta, state, out, t, n_k, n_v,
         d_k, d_v, eps);
}

}  // namespace bonsai::cuda

namespace bonsai::cuda {

void gdn_fused(const GdnFused& p, cudaStream_t s) {
  const int threads = (p.d_k / 32) * p.d_v;
  const size_t smem = (2 * p.d_k + (p.d_k / 32) * p.d_v) * sizeof(float);
  launch(gdn_fused_kernel, static_cast<unsigned>(p.n_v), static_cast<unsigned>(threads), smem, s, p);
}

}  // namespace bonsai::cuda
