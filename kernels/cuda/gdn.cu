// The gated delta rule on fp32 states [n_v][d_k][d_v].
//
// Columns of a head's state are independent (kv[b], the update of column b and
// o[b] only mix rows), so a block owns one value head and 32 columns: warp w
// holds rows 32w..32w+31 of those columns in registers (lane = column) for all
// t tokens, and the sums over rows go through shared memory.
#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/knobs.h"
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
  __device__ void load_w(const float* wt, int64_t c, int taps) {  // the taps (a weight)
#pragma unroll
    for (int j = 0; j < kMaxTaps; ++j) w[j] = j < taps ? wt[c * taps + j] : 0.0f;
  }
  __device__ void load_prev(const float* state, int64_t c, int64_t channels, int taps) {
#pragma unroll
    for (int j = 0; j < kMaxTaps - 1; ++j) prev[j] = j < taps - 1 ? state[j * channels + c] : 0.0f;
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

// Sums of two values over the whole block (blockDim.x a multiple of 32); one barrier pair.
__device__ __forceinline__ float2 block_sum2(float a, float b) {
  __shared__ float2 scratch2[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  a = warp_sum(a);
  b = warp_sum(b);
  __syncthreads();
  if (lane == 0) scratch2[warp] = make_float2(a, b);
  __syncthreads();
  float2 total = make_float2(0.0f, 0.0f);
  for (int w = 0; w < nwarps; ++w) {
    total.x += scratch2[w].x;
    total.y += scratch2[w].y;
  }
  return total;
}

constexpr int kAbTokens = 4;  // the most tokens whose alpha/beta rows the kernel computes itself

// The whole per-token GDN core in one launch, block per value head h with all d_v columns:
// warp w holds rows 32·(w % RG) .. +31 of column 32·(w / RG) + lane (RG = d_k/32). Optional
// parts, each the same arithmetic as its separate op up to summation order: the conv (from
// qkv), the alpha/beta rows and the gates (alpha_w) or the gates alone (alpha), the gated
// RMSNorm of the head's output (gated_rmsnorm), and writing head h at its grouped position
// (transpose_heads with a = n_v/n_k, b = n_k).
//
// Latency is what counts at t = 1 (48 blocks on 132 SMs), so the small weights (conv taps,
// ssm_a, dt_bias, norm gain) are loaded before the grid-dependency wait, and the recurrent and
// conv states too when p.state_early (a recorded decode step: no kernel that may still be
// running writes them); every other independent load is issued before the first barrier, the
// next token's inputs are loaded while the current one is processed, and a token needs one
// cross-warp reduction: with s' = decay·s, o = Σ_a (s' + k δ) q = Σ s'q + δ (k·q), so s'k, s'q
// and k·q are reduced together, plus one barrier for the gated norm's sum of squares. (The
// alpha/beta rows' 2·5120 weights loaded before the wait as well measured 1.7 % slower end to
// end on the H200, docs/performance.md.)
__global__ void __launch_bounds__(512) gdn_fused_kernel(GdnFused p) {
  // qn[d_k], kn[d_k], red[3][RG][d_v] (s'k | s'q | k·q partials), then gates decay[t], b[t]
  extern __shared__ float sm[];
  __shared__ float ab_part[16][2 * kAbTokens], norm_part[2][16];
  __shared__ bool conv_last;
  pdl_trigger();
  const int d_k = p.d_k, d_v = p.d_v, RG = d_k / 32;
  float* qn = sm;
  float* kn = sm + d_k;
  float* red = sm + 2 * d_k;
  float* gate_decay = red + 3 * RG * d_v;  // [t] when alpha_w
  float* gate_b = gate_decay + p.t;
  const int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  const int rg = warp % RG, cg = warp / RG, col = cg * 32 + lane, hk = h % p.n_k, tid = threadIdx.x;
  const int64_t qk = static_cast<int64_t>(p.n_k) * d_k, width = 2 * qk + static_cast<int64_t>(p.n_v) * d_v;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(d_k));
  float* S = p.state + static_cast<int64_t>(h) * d_k * d_v;
  const int rep = p.n_v / p.n_k;
  const int out_head = p.transpose ? (h % p.n_k) * rep + h / p.n_k : h;
  const bool conv_in = p.qkv != nullptr, qk_thread = tid < d_k;
  const int64_t ch_q = hk * d_k + tid, ch_k = qk + hk * d_k + tid,
                ch_v = 2 * qk + static_cast<int64_t>(h) * d_v + col;

  // ---- weights (and, when allowed, the recurrent state) before the dependency wait ----
  float s[32];
  ConvChannel cq, ck, cv;
  auto load_state = [&] {
    if (p.state_stream) {
#pragma unroll
      for (int j = 0; j < 32; ++j) s[j] = __ldcs(S + static_cast<int64_t>(rg * 32 + j) * d_v + col);
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) s[j] = S[static_cast<int64_t>(rg * 32 + j) * d_v + col];
    }
    if (conv_in) {
      if (qk_thread) {
        cq.load_prev(p.conv_state, ch_q, width, p.taps);
        ck.load_prev(p.conv_state, ch_k, width, p.taps);
      }
      cv.load_prev(p.conv_state, ch_v, width, p.taps);
    }
  };
  if (conv_in) {
    if (qk_thread) {
      cq.load_w(p.conv_w, ch_q, p.taps);
      ck.load_w(p.conv_w, ch_k, p.taps);
    }
    cv.load_w(p.conv_w, ch_v, p.taps);
  }
  if (p.state_early) load_state();
  const bool gates = p.alpha_w || p.alpha;
  const float ssm_a = gates ? p.ssm_a[h] : 0.0f, dt_bias = gates ? p.dt_bias[h] : 0.0f;
  const float norm_w = p.norm_w && rg == 0 ? p.norm_w[col] : 0.0f;
  pdl_wait();

  // ---- every other independent load ----
  if (!p.state_early) load_state();
  // token i's mixer inputs: conv inputs (conv_in) or conv outputs
  auto load_in = [&](int i, float& a, float& b, float& c) {
    const float* xi = (conv_in ? p.qkv : p.conv) + static_cast<int64_t>(i) * width;
    a = qk_thread ? xi[ch_q] : 0.0f;
    b = qk_thread ? xi[ch_k] : 0.0f;
    c = xi[ch_v];
  };
  float in_q, in_k, in_v;
  load_in(0, in_q, in_k, in_v);
  if (p.alpha_w) {  // ssm_alpha / ssm_beta rows h over the normed input (t <= kAbTokens)
    const uint8_t* wa = p.alpha_w + static_cast<size_t>(h) * p.ab_row_bytes;
    const uint8_t* wb = p.beta_w + static_cast<size_t>(h) * p.ab_row_bytes;
    float pa[kAbTokens] = {}, pb[kAbTokens] = {};
    auto dot = [&](auto at) {
#pragma unroll 4
      for (int c = tid; c < p.ab_k; c += blockDim.x) {
        const float a = at(wa, c), b = at(wb, c);
#pragma unroll
        for (int i = 0; i < kAbTokens; ++i) {
          if (i >= p.t) break;
          const float xv = p.normed[static_cast<int64_t>(i) * p.ab_k + c];
          pa[i] += xv * a;
          pb[i] += xv * b;
        }
      }
    };
    if (p.ab_type == RawType::F32)
      dot([](const uint8_t* r, int c) { return raw_at(r, c, RawType::F32); });
    else if (p.ab_type == RawType::F16)
      dot([](const uint8_t* r, int c) { return raw_at(r, c, RawType::F16); });
    else
      dot([](const uint8_t* r, int c) { return raw_at(r, c, RawType::BF16); });
#pragma unroll
    for (int i = 0; i < kAbTokens; ++i) {
      const float a = warp_sum(pa[i]), b = warp_sum(pb[i]);
      if (lane == 0) {
        ab_part[warp][2 * i] = a;
        ab_part[warp][2 * i + 1] = b;
      }
    }
  }
  // Every value head of key head hk has read the shared q/k conv state once `rep` blocks
  // have counted themselves: the last one writes the new state at the end (the fence
  // orders this thread's state reads before the count).
  if (conv_in && qk_thread) __threadfence();
  __syncthreads();
  if (conv_in && tid == 0) {
    conv_last = atomicAdd(p.conv_counters + hk, 1) == rep - 1;
    if (conv_last) p.conv_counters[hk] = 0;
  }
  if (p.alpha_w && tid < p.t) {  // thread i: token i's gates (read after the loop's first barrier)
    float a = 0.0f, b = 0.0f;
    for (int w = 0; w < nwarps; ++w) {
      a += ab_part[w][2 * tid];
      b += ab_part[w][2 * tid + 1];
    }
    gate_decay[tid] = expf(ssm_a * softplus(a + dt_bias));
    gate_b[tid] = sigmoid(b);
  }

  for (int i = 0; i < p.t; ++i) {
    const int64_t ih = static_cast<int64_t>(i) * p.n_v + h;
    // loads for later in this token and for the next one, in flight during the reductions
    float nq = 0.0f, nk = 0.0f, nv = 0.0f;
    if (i + 1 < p.t) load_in(i + 1, nq, nk, nv);
    const float z = p.norm_w && rg == 0 ? p.z[ih * d_v + col] : 0.0f;
    float ga = 0.0f, gb = 0.0f;
    if (!p.alpha_w) {
      ga = p.alpha ? p.alpha[ih] : p.g[ih];
      gb = p.alpha ? p.beta_in[ih] : p.beta[ih];
    }
    float qv = in_q, kv = in_k, v = in_v;
    if (conv_in) {
      if (qk_thread) {
        qv = cq.step(in_q, p.taps);
        kv = ck.step(in_k, p.taps);
      }
      v = cv.step(in_v, p.taps);
    }
    const float2 ss = block_sum2(qv * qv, kv * kv);
    if (qk_thread) {
      qn[tid] = qv * (q_scale / fmaxf(sqrtf(ss.x), p.eps));
      kn[tid] = kv * (1.0f / fmaxf(sqrtf(ss.y), p.eps));
    }
    __syncthreads();
    float decay, b;
    if (p.alpha_w) {
      decay = gate_decay[i];
      b = gate_b[i];
    } else if (p.alpha) {  // gdn_gates in place
      decay = expf(ssm_a * softplus(ga + dt_bias));
      b = sigmoid(gb);
    } else {
      decay = expf(ga);
      b = gb;
    }
    float pk = 0.0f, pq = 0.0f, kq = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      s[j] *= decay;
      pk += s[j] * kn[rg * 32 + j];
      pq += s[j] * qn[rg * 32 + j];
      kq += kn[rg * 32 + j] * qn[rg * 32 + j];
    }
    red[rg * d_v + col] = pk;
    red[(RG + rg) * d_v + col] = pq;
    red[(2 * RG + rg) * d_v + col] = kq;
    __syncthreads();
    float kvb = 0.0f, sq = 0.0f, kq_all = 0.0f;
    for (int r = 0; r < RG; ++r) {
      kvb += red[r * d_v + col];
      sq += red[(RG + r) * d_v + col];
      kq_all += red[(2 * RG + r) * d_v + col];
    }
    const float delta = b * (v - kvb);
#pragma unroll
    for (int j = 0; j < 32; ++j) s[j] += kn[rg * 32 + j] * delta;
    const float o = sq + delta * kq_all;
    if (p.norm_w) {  // gated_rmsnorm over the head's d_v outputs (the rg == 0 warps)
      // Σ o² as block_sum formed it: the per-warp sums added in warp (column group) order;
      // norm_part alternates between tokens, so one barrier suffices
      if (rg == 0) {
        const float ws = warp_sum(o * o);
        if (lane == 0) norm_part[i & 1][cg] = ws;
      }
      __syncthreads();
      if (rg == 0) {
        float ss_o = 0.0f;
        for (int c = 0; c < d_v / 32; ++c) ss_o += norm_part[i & 1][c];
        const float scale = 1.0f / sqrtf(ss_o / static_cast<float>(d_v) + p.norm_eps);
        p.out[(static_cast<int64_t>(i) * p.n_v + out_head) * d_v + col] = o * scale * norm_w * silu(z);
      }
    } else if (rg == 0) {
      p.out[ih * d_v + col] = o;
    }
    in_q = nq;
    in_k = nk;
    in_v = nv;
    if (i + 1 < p.t) __syncthreads();  // qn, kn and red are rewritten by the next token
  }
  if (p.state_stream) {
#pragma unroll
    for (int j = 0; j < 32; ++j) __stcs(S + static_cast<int64_t>(rg * 32 + j) * d_v + col, s[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 32; ++j) S[static_cast<int64_t>(rg * 32 + j) * d_v + col] = s[j];
  }
  if (conv_in) {
    if (conv_last && qk_thread) {
      cq.store(p.conv_state, ch_q, width, p.taps);
      ck.store(p.conv_state, ch_k, width, p.taps);
    }
    if (rg == 0) cv.store(p.conv_state, ch_v, width, p.taps);
  }
}

// Prefill, before gdn_walk: conv [t][channels] = silu(ssm_conv(qkv)) for every (token,
// channel) at once (the previous inputs from conv_state, [taps-1][channels], which is not
// updated here: gdn_walk does it), then q (times 1/√d_k) and k L2-normalised per (token, key
// head); the arithmetic of ConvChannel::step and the fused kernel. Block per (token, head
// slot: n_k q heads, n_k k heads, n_v v heads), thread per channel.
__global__ void gdn_conv_norm_kernel(const float* __restrict__ qkv, const float* __restrict__ conv_state,
                                     const float* __restrict__ conv_w, float* __restrict__ conv, int taps,
                                     int n_k, int n_v, int d_k, int d_v, float eps) {
  pdl_trigger();
  pdl_wait();
  const int i = blockIdx.x, slot = blockIdx.y, e = threadIdx.x;
  const int64_t qk = static_cast<int64_t>(n_k) * d_k, width = 2 * qk + static_cast<int64_t>(n_v) * d_v;
  const bool is_qk = slot < 2 * n_k;
  const int w = is_qk ? d_k : d_v;
  const int64_t c =
      is_qk ? static_cast<int64_t>(slot) * d_k + e : 2 * qk + static_cast<int64_t>(slot - 2 * n_k) * d_v + e;
  float out = 0.0f;
  if (e < w) {
    float acc = 0.0f;
    for (int j = 0; j < taps - 1; ++j) {
      const int tau = i - (taps - 1) + j;  // the input time of tap j
      const float xp =
          tau >= 0 ? qkv[static_cast<int64_t>(tau) * width + c] : conv_state[(tau + taps - 1) * width + c];
      acc += conv_w[c * taps + j] * xp;
    }
    acc += conv_w[c * taps + taps - 1] * qkv[static_cast<int64_t>(i) * width + c];
    out = silu(acc);
  }
  if (is_qk) {
    const float ss = block_sum(out * out);
    const float scale = slot < n_k ? 1.0f / sqrtf(static_cast<float>(d_k)) : 1.0f;
    out *= scale / fmaxf(sqrtf(ss), eps);
  }
  if (e < w) conv[static_cast<int64_t>(i) * width + c] = out;
}

// Prefill: alpha / beta_in [t][n_v] = x [t][k] · rows 0..n_v-1 of wa / wb (raw F32, F16 or
// BF16 rows of row_bytes). Block per (kAbRows of the 2·n_v rows, kAbTile tokens): each x load
// feeds kAbRows FMAs and each weight load kAbTile (one row per block read x 2·n_v times over,
// ~0.5 GB of L2 traffic per layer at t = 256). Thread c sums columns c, c+256, ... in order, the
// 8 warps' partial sums are added in warp order (deterministic).
constexpr int kAbTile = 8;
constexpr int kAbRows = 8;
__global__ void __launch_bounds__(256)
    gdn_ab_batch_kernel(const float* __restrict__ x, const uint8_t* wa, const uint8_t* wb, size_t row_bytes,
                        RawType type, int k, int n_v, int t, float* alpha, float* beta_in) {
  __shared__ float part[8][kAbRows * kAbTile];
  pdl_trigger();
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = blockIdx.x * kAbRows, i0 = blockIdx.y * kAbTile;
  const int nt = min(kAbTile, t - i0), nr = min(kAbRows, 2 * n_v - r0);
  const uint8_t* rows[kAbRows];
#pragma unroll
  for (int r = 0; r < kAbRows; ++r) {
    const int rr = r < nr ? r0 + r : r0;  // rows past 2·n_v read row r0 and are not stored
    rows[r] = (rr >= n_v ? wb + static_cast<size_t>(rr - n_v) * row_bytes
                         : wa + static_cast<size_t>(rr) * row_bytes);
  }
  const float* xs[kAbTile];
#pragma unroll
  for (int j = 0; j < kAbTile; ++j) xs[j] = x + static_cast<int64_t>(i0 + (j < nt ? j : 0)) * k;
  float acc[kAbRows][kAbTile] = {};
  auto dot = [&](auto at) {
#pragma unroll 2
    for (int c = threadIdx.x; c < k; c += 256) {
      float wv[kAbRows], xv[kAbTile];
#pragma unroll
      for (int r = 0; r < kAbRows; ++r) wv[r] = at(rows[r], c);
#pragma unroll
      for (int j = 0; j < kAbTile; ++j) xv[j] = xs[j][c];
#pragma unroll
      for (int r = 0; r < kAbRows; ++r)
#pragma unroll
        for (int j = 0; j < kAbTile; ++j) acc[r][j] += xv[j] * wv[r];
    }
  };
  if (type == RawType::F32)
    dot([](const uint8_t* p, int c) { return raw_at(p, c, RawType::F32); });
  else if (type == RawType::F16)
    dot([](const uint8_t* p, int c) { return raw_at(p, c, RawType::F16); });
  else
    dot([](const uint8_t* p, int c) { return raw_at(p, c, RawType::BF16); });
#pragma unroll
  for (int r = 0; r < kAbRows; ++r)
#pragma unroll
    for (int j = 0; j < kAbTile; ++j) {
      const float v = warp_sum(acc[r][j]);
      if (lane == 0) part[warp][r * kAbTile + j] = v;
    }
  __syncthreads();
  const int r = static_cast<int>(threadIdx.x) / kAbTile, j = static_cast<int>(threadIdx.x) % kAbTile;
  if (r < nr && j < nt) {
    float v = 0.0f;
    for (int w = 0; w < 8; ++w) v += part[w][threadIdx.x];
    const int rr = r0 + r;
    (rr >= n_v ? beta_in : alpha)[static_cast<int64_t>(i0 + j) * n_v + (rr >= n_v ? rr - n_v : rr)] = v;
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

namespace {

// BONSAI_CUDA_GDN_EARLY=0: the recurrent state is never loaded before the dependency wait
// (for measurements). Read once per process.
bool gdn_early() {
  static const bool on = knob::gdn_early();
  return on;
}

}  // namespace

void gdn_fused(const GdnFused& p, cudaStream_t s) {
  GdnFused q = p;
  q.state_early = p.state_early && gdn_early();
  const int threads = (p.d_k / 32) * p.d_v;
  const size_t smem = (2 * p.d_k + 3 * (p.d_k / 32) * p.d_v + (p.alpha_w ? 2 * p.t : 0)) * sizeof(float);
  launch(gdn_fused_kernel, static_cast<unsigned>(p.n_v), static_cast<unsigned>(threads), smem, s, q);
}

void gdn_conv_norm(const float* qkv, const float* conv_state, const float* conv_w, float* conv, int t,
                   int taps, int n_k, int n_v, int d_k, int d_v, float eps, cudaStream_t s) {
  const int threads = (std::max(d_k, d_v) + 31) / 32 * 32;
  launch(gdn_conv_norm_kernel, dim3(static_cast<unsigned>(t), static_cast<unsigned>(2 * n_k + n_v)), threads,
         0, s, qkv, conv_state, conv_w, conv, taps, n_k, n_v, d_k, d_v, eps);
}

void gdn_ab_batch(const float* x, const uint8_t* wa, const uint8_t* wb, size_t row_bytes, RawType type, int k,
                  int n_v, int t, float* alpha, float* beta_in, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((2 * n_v + kAbRows - 1) / kAbRows),
                  static_cast<unsigned>((t + kAbTile - 1) / kAbTile));
  launch(gdn_ab_batch_kernel, grid, 256, 0, s, x, wa, wb, row_bytes, type, k, n_v, t, alpha, beta_in);
}

}  // namespace bonsai::cuda
