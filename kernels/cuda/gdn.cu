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

// One channel of the depthwise causal conv (ssm_conv_kernel's arithmetic): the taps-1
// previous inputs and the taps weights in registers.
constexpr int kMaxTaps = 4;  // the fused conv (Qwen3.5: 4 taps); larger ones run as ssm_conv
struct ConvChannel {
  float prev[kMaxTaps - 1], w[kMaxTaps];
  __device__ void load(const float* state, const float* wt, int64_t c, int64_t channels, int taps) {
#pragma unroll
    for (int j = 0; j < kMaxTaps - 1; ++j) prev[j] = j < taps - 1 ? state[j * channels + c] : 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxTaps; ++j) w[j] = j < taps ? wt[c * taps + j] : 0.0f;
  }
  // silu(conv) for the new input x; x joins the window.
  __device__ float step(float x, int taps) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxTaps - 1; ++j)
      if (j < taps - 1) acc += w[j] * prev[j];
#pragma unroll
    for (int j = 0; j < kMaxTaps; ++j)
      if (j == taps - 1) acc += w[j] * x;
#pragma unroll
    for (int j = 0; j + 1 < kMaxTaps - 1; ++j)
      if (j + 1 < taps - 1) prev[j] = prev[j + 1];
#pragma unroll
    for (int j = 0; j < kMaxTaps - 1; ++j)
      if (j == taps - 2) prev[j] = x;
    return silu(acc);
  }
  __device__ void store(float* state, int64_t c, int64_t channels, int taps) const {
#pragma unroll
    for (int j = 0; j < kMaxTaps - 1; ++j)
      if (j < taps - 1) state[j * channels + c] = prev[j];
  }
};

// Element c of a raw F32 / F16 / BF16 row.
__device__ __forceinline__ float raw_at(const uint8_t* row, int64_t c, RawType t) {
  if (t == RawType::F32) return reinterpret_cast<const float*>(row)[c];
  const unsigned short b = reinterpret_cast<const unsigned short*>(row)[c];
  if (t == RawType::F16) return __half2float(__ushort_as_half(b));
  return __uint_as_float(static_cast<uint32_t>(b) << 16);  // BF16
}

// The whole per-token GDN core in one launch, block per value head h with all d_v columns:
// warp w holds rows 32·(w % RG) .. +31 of column 32·(w / RG) + lane (RG = d_k/32). Optional
// parts, each the same arithmetic as its separate op: the gates from alpha/beta_in
// (gdn_gates), the gated RMSNorm of the head's output (gated_rmsnorm), and writing head h
// at its grouped position (transpose_heads with a = n_v/n_k, b = n_k).
__global__ void __launch_bounds__(512) gdn_fused_kernel(GdnFused p) {
  extern __shared__ float sm[];  // qn[d_k], kn[d_k], red[RG][d_v], then gates decay[t], b[t] (alpha_w)
  __shared__ float scal[2];
  __shared__ bool conv_last;
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

  float* gate_decay = red + RG * d_v;  // [t] when alpha_w
  float* gate_b = gate_decay + p.t;
  if (p.alpha_w) {  // ssm_alpha / ssm_beta rows h over the normed input, then gdn_gates
    const uint8_t* wa = p.alpha_w + static_cast<size_t>(h) * p.ab_row_bytes;
    const uint8_t* wb = p.beta_w + static_cast<size_t>(h) * p.ab_row_bytes;
    for (int i = 0; i < p.t; ++i) {
      const float* x = p.normed + static_cast<int64_t>(i) * p.ab_k;
      float sa = 0.0f, sb = 0.0f;
      for (int c = tid; c < p.ab_k; c += blockDim.x) {
        const float xv = x[c];
        sa += xv * raw_at(wa, c, p.ab_type);
        sb += xv * raw_at(wb, c, p.ab_type);
      }
      sa = block_sum(sa);
      sb = block_sum(sb);
      if (tid == 0) {
        gate_decay[i] = expf(p.ssm_a[h] * softplus(sa + p.dt_bias[h]));
        gate_b[i] = sigmoid(sb);
      }
    }
  }

  // The conv windows: q and k channels of key head hk (threads < d_k), v channel `col`.
  const bool conv_in = p.qkv != nullptr;
  ConvChannel cq, ck, cv;
  const int64_t ch_q = hk * d_k + tid, ch_k = qk + hk * d_k + tid,
                ch_v = 2 * qk + static_cast<int64_t>(h) * d_v + col;
  if (conv_in) {
    if (tid < d_k) {
      cq.load(p.conv_state, p.conv_w, ch_q, width, p.taps);
      ck.load(p.conv_state, p.conv_w, ch_k, width, p.taps);
    }
    cv.load(p.conv_state, p.conv_w, ch_v, width, p.taps);
    // Every value head of key head hk has read the q/k state once `rep` blocks have counted
    // themselves: the last one writes the new state (the fence orders this block's reads
    // before its count).
    __threadfence();
    __syncthreads();
    if (tid == 0) {
      conv_last = atomicAdd(p.conv_counters + hk, 1) == rep - 1;
      if (conv_last) p.conv_counters[hk] = 0;
    }
  }
  __syncthreads();

  for (int i = 0; i < p.t; ++i) {
    const int64_t ih = static_cast<int64_t>(i) * p.n_v + h;
    float qv = 0.0f, kv = 0.0f, v;
    if (conv_in) {
      const float* xi = p.qkv + static_cast<int64_t>(i) * width;
      if (tid < d_k) {
        qv = cq.step(xi[ch_q], p.taps);
        kv = ck.step(xi[ch_k], p.taps);
      }
      v = cv.step(xi[ch_v], p.taps);
    } else {
      const float* ci = p.conv + static_cast<int64_t>(i) * width;
      if (tid < d_k) {
        qv = ci[hk * d_k + tid];
        kv = ci[qk + hk * d_k + tid];
      }
      v = ci[2 * qk + static_cast<int64_t>(h) * d_v + col];
    }
    float decay, b;
    if (p.alpha_w) {
      decay = gate_decay[i];
      b = gate_b[i];
    } else if (p.alpha) {  // gdn_gates in place
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
  if (conv_in) {
    if (conv_last && tid < d_k) {
      cq.store(p.conv_state, ch_q, width, p.taps);
      ck.store(p.conv_state, ch_k, width, p.taps);
    }
    if (rg == 0) cv.store(p.conv_state, ch_v, width, p.taps);
  }
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
  const size_t smem = (2 * p.d_k + (p.d_k / 32) * p.d_v + (p.alpha_w ? 2 * p.t : 0)) * sizeof(float);
  launch(gdn_fused_kernel, static_cast<unsigned>(p.n_v), static_cast<unsigned>(threads), smem, s, p);
}

}  // namespace bonsai::cuda
