// Prefill: the gated delta rule walked over t tokens (the batch form of the GDN site, after
// gdn_ab_batch and gdn_conv_norm in kernels/cuda/gdn.cu). Columns of a head's state are
// independent (kv[b], the update of column b and o[b] only mix rows), so a block owns one value
// head and 32 (or 64) columns: warp w holds rows 32w..32w+31 of them in registers for all t
// tokens, and the sums over rows go through shared memory, one barrier per token.
//
// Two kernels with the same arithmetic per state column (bit-identical results):
//  - gdn_walk_token_kernel, one token at a time: every thread loads and gates each token
//    itself and forms k·q over its rows (the same value in every column).
//  - gdn_walk_chunk_kernel (default below 512 tokens; from 512 tokens the chunked form on the
//    tensor cores runs instead: BONSAI_CUDA_WALK=6, gdn_tc2.cu):
//    the inputs of 32 tokens at a time copied into shared
//    memory by cp.async one chunk ahead; per chunk the block forms each token's gates and k·q
//    partials once; q and k read as 16-byte broadcasts. Per token and thread: 32 FMULs (the
//    decay), 96 FFMAs (s'k, s'q, the update), 24 16-byte shared loads, one barrier.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "bonsai/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/knobs.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tf32_split.cuh"

namespace bonsai::cuda {
namespace {

// One token at a time, block per (value head, 32 columns), the fused kernel's one-reduction
// step. Inputs are loaded two tokens ahead, q/k staged into shared memory one token ahead
// (three buffers), and the partial sums alternate between two buffers, so a token costs a
// single barrier and no wait on memory. (BONSAI_CUDA_WALK=0.)
__global__ void __launch_bounds__(512) gdn_walk_token_kernel(GdnFused p) {
  extern __shared__ float sm[];  // qk[3][2][d_k], red[2][3][RG][d_v]
  pdl_trigger();
  pdl_wait();
  const int d_k = p.d_k, d_v = p.d_v, RG = d_k / 32;
  const int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // block (value head, 32-column group): the state's columns are independent, and d_v/32
  // blocks per head spread the walk's per-token work over 4x the SMs; warp = row group.
  const int rg = warp, col = blockIdx.y * 32 + lane, hk = h % p.n_k, tid = threadIdx.x;
  const int64_t qk = static_cast<int64_t>(p.n_k) * d_k, width = 2 * qk + static_cast<int64_t>(p.n_v) * d_v;
  const bool qk_thread = tid < d_k;
  float* S = p.state + static_cast<int64_t>(h) * d_k * d_v;
  float* qkb = sm;
  float* redb = sm + 6 * d_k;
  float s[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) s[j] = S[static_cast<int64_t>(rg * 32 + j) * d_v + col];
  // token i's inputs as loaded (the gates' raw alpha/beta_in, or g/beta)
  auto load_tok = [&](int i, float& q, float& k, float& v, float& ga, float& gb) {
    const float* cn = p.conv + static_cast<int64_t>(i) * width;
    if (qk_thread) {
      q = cn[hk * d_k + tid];
      k = cn[qk + hk * d_k + tid];
    }
    v = cn[2 * qk + static_cast<int64_t>(h) * d_v + col];
    const int64_t ih = static_cast<int64_t>(i) * p.n_v + h;
    ga = p.alpha ? p.alpha[ih] : p.g[ih];
    gb = p.alpha ? p.beta_in[ih] : p.beta[ih];
  };
  auto gate = [&](float ga, float gb, float& decay, float& b) {
    if (p.alpha) {
      decay = expf(p.ssm_a[h] * softplus(ga + p.dt_bias[h]));
      b = sigmoid(gb);
    } else {
      decay = expf(ga);
      b = gb;
    }
  };
  // Two tokens ahead: token i+2 is loaded into registers while token i is processed, token
  // i+1 (loaded one step earlier, so its values have arrived) goes to shared memory.
  float q0 = 0.0f, k0 = 0.0f, v, ga, gb, decay, b;
  load_tok(0, q0, k0, v, ga, gb);
  if (qk_thread) {
    qkb[tid] = q0;
    qkb[d_k + tid] = k0;
  }
  gate(ga, gb, decay, b);
  // Two register sets, alternating: token i+1's (loaded one step earlier) and token i+2's
  // (loaded now). Rotating one set into the other (q1 = q2) would be a register move that
  // waits for the load just issued, i.e. one memory latency per token.
  float q1 = 0.0f, k1 = 0.0f, v1 = 0.0f, ga1 = 0.0f, gb1 = 0.0f;
  float q2 = 0.0f, k2 = 0.0f, v2 = 0.0f, ga2 = 0.0f, gb2 = 0.0f;
  if (p.t > 1) load_tok(1, q1, k1, v1, ga1, gb1);
  __syncthreads();
  // step i: (qa..gba) hold token i+1, token i+2 is loaded into (qb..gbb)
  auto step = [&](int i, float& qa, float& ka, float& va, float& gaa, float& gba, float& qb, float& kb,
                  float& vb, float& gab, float& gbb) {
    if (i + 2 < p.t) load_tok(i + 2, qb, kb, vb, gab, gbb);
    const float* qn = qkb + (i % 3) * 2 * d_k;
    const float* kn = qn + d_k;
    float pk = 0.0f, pq = 0.0f, kq = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      s[j] *= decay;
      pk += s[j] * kn[rg * 32 + j];
      pq += s[j] * qn[rg * 32 + j];
      kq += kn[rg * 32 + j] * qn[rg * 32 + j];
    }
    float* red = redb + (i & 1) * 3 * RG * d_v;
    red[rg * d_v + col] = pk;
    red[(RG + rg) * d_v + col] = pq;
    red[(2 * RG + rg) * d_v + col] = kq;
    if (i + 1 < p.t && qk_thread) {
      float* nxt = qkb + ((i + 1) % 3) * 2 * d_k;
      nxt[tid] = qa;
      nxt[d_k + tid] = ka;
    }
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
    if (rg == 0) p.out[(static_cast<int64_t>(i) * p.n_v + h) * d_v + col] = sq + delta * kq_all;
    v = va;
    gate(gaa, gba, decay, b);
  };
  for (int i = 0; i < p.t; i += 2) {
    step(i, q1, k1, v1, ga1, gb1, q2, k2, v2, ga2, gb2);
    if (i + 1 < p.t) step(i + 1, q2, k2, v2, ga2, gb2, q1, k1, v1, ga1, gb1);
  }
#pragma unroll
  for (int j = 0; j < 32; ++j) S[static_cast<int64_t>(rg * 32 + j) * d_v + col] = s[j];
  if (p.qkv) {  // the conv state: the last taps-1 inputs (t >= taps-1); key head hk's by block hk
    const int64_t first = static_cast<int64_t>(p.t - (p.taps - 1)) * width;
    for (int j = 0; j < p.taps - 1; ++j) {
      const float* xj = p.qkv + first + j * width;
      float* st = p.conv_state + static_cast<int64_t>(j) * width;
      if (h < p.n_k && blockIdx.y == 0 && qk_thread) {
        st[hk * d_k + tid] = xj[hk * d_k + tid];
        st[qk + hk * d_k + tid] = xj[qk + hk * d_k + tid];
      }
      if (rg == 0)
        st[2 * qk + static_cast<int64_t>(h) * d_v + col] = xj[2 * qk + static_cast<int64_t>(h) * d_v + col];
    }
  }
}

using tc::cp_async16;  // cp.async staging (kernels/cuda/tf32_split.cuh)
using tc::cp_async4;
using tc::cp_commit;
using tc::cp_wait_all;
using tc::smem_u32;

// Shared memory of gdn_walk_chunk_kernel, in floats, for chunks of C tokens (C even, <= 32):
// two chunk buffers, each q|k [C][QS] (QS = 2·d_k + 4: the 16-byte pad puts the rows of
// consecutive tokens in distinct banks for the per-token k·q pass), v [C][W] (the block's
// columns), raw gates [2][C]; then gates [C] (decay, b), kq [C], kq partials [RG][C], and the
// partial sums s'k | s'q [2 tokens][2][RG][W].
struct WalkSmem {
  int qs, buf, gates, kqa, kqp, red, total;
  __host__ __device__ WalkSmem(int d_k, int w, int c) {
    qs = 2 * d_k + 4;
    buf = c * qs + c * w + 2 * c;
    gates = 2 * buf;
    kqa = gates + 2 * c;
    kqp = kqa + c;
    red = kqp + (d_k / 32) * c;
    total = red + 4 * (d_k / 32) * w;
  }
};

// Block per (value head, CPT·32 columns), thread (row group rg = warp, lane): rows
// 32·rg..+31 of columns col0 + lane + 32·c, c < CPT. RGT > 0: d_k = 32·RGT at compile time.
// Per column, exactly gdn_walk_token_kernel's operations in its order: s *= decay, then the
// chains s'k and s'q over the thread's 32 rows from 0, their RG partials added in row-group
// order from 0; k·q as the same per-row-group chain (formed once per block here instead of in
// every column), added likewise; delta = b·(v − kvb); s += k·delta; o = s'q + delta·k·q.
template <int CPT, int RGT>
__global__ void __launch_bounds__(RGT > 0 ? 32 * RGT : 512) gdn_walk_chunk_kernel(GdnFused p, int C) {
  extern __shared__ __align__(16) float sm[];
  pdl_trigger();
  pdl_wait();
  constexpr int W = 32 * CPT;
  const int d_k = RGT > 0 ? 32 * RGT : p.d_k, RG = RGT > 0 ? RGT : p.d_k / 32, d_v = p.d_v;
  const int h = blockIdx.x, rg = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  const int nthr = 32 * RG, hk = h % p.n_k, col0 = blockIdx.y * W;
  const int64_t qk = static_cast<int64_t>(p.n_k) * d_k, width = 2 * qk + static_cast<int64_t>(p.n_v) * d_v;
  const WalkSmem L(d_k, W, C);
  float2* gates = reinterpret_cast<float2*>(sm + L.gates);
  float* kqa = sm + L.kqa;
  float* kqp = sm + L.kqp;
  const float* ga_src = p.alpha ? p.alpha : p.g;
  const float* gb_src = p.alpha ? p.beta_in : p.beta;
  const float ssm_a = p.alpha ? p.ssm_a[h] : 0.0f, dt_bias = p.alpha ? p.dt_bias[h] : 0.0f;

  float* S = p.state + static_cast<int64_t>(h) * d_k * d_v;
  float s[CPT][32];
#pragma unroll
  for (int c = 0; c < CPT; ++c) {
    const int col = col0 + 32 * c + lane;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      s[c][j] = col < d_v ? S[static_cast<int64_t>(rg * 32 + j) * d_v + col] : 0.0f;
  }

  // Chunk of tokens base..base+nt-1 into buffer b: q and k of key head hk, v of the block's
  // columns (zeros past d_v), the raw gates. One commit group per thread and chunk.
  auto stage = [&](int base, int b) {
    const int nt = min(C, p.t - base);
    const uint32_t buf = smem_u32(sm + b * L.buf);
    const int pieces = d_k / 2, qpieces = d_k / 4;  // 16-byte pieces of a token's q|k, of q
    for (int idx = tid; idx < nt * pieces; idx += nthr) {
      const int j = idx / pieces, e = idx - j * pieces;
      const float* row = p.conv + static_cast<int64_t>(base + j) * width + hk * d_k;
      cp_async16(buf + (j * L.qs + 4 * e) * 4, e < qpieces ? row + 4 * e : row + qk + 4 * (e - qpieces), 16);
    }
    constexpr int vpieces = W / 4;
    for (int idx = tid; idx < nt * vpieces; idx += nthr) {
      const int j = idx / vpieces, e = idx - j * vpieces, col = col0 + 4 * e;
      const float* row =
          p.conv + static_cast<int64_t>(base + j) * width + 2 * qk + static_cast<int64_t>(h) * d_v;
      cp_async16(buf + (C * L.qs + j * W + 4 * e) * 4, row + (col < d_v ? col : 0), col < d_v ? 16 : 0);
    }
    for (int idx = tid; idx < 2 * nt; idx += nthr) {
      const int j = idx < nt ? idx : idx - nt;
      const int64_t ih = static_cast<int64_t>(base + j) * p.n_v + h;
      cp_async4(buf + (C * L.qs + C * W + (idx < nt ? j : C + j)) * 4, (idx < nt ? ga_src : gb_src) + ih);
    }
    cp_commit();
  };

  stage(0, 0);
  for (int base = 0, n = 0; base < p.t; base += C, ++n) {
    const int nt = min(C, p.t - base);
    const float* qkc = sm + (n & 1) * L.buf;
    const float* vc = qkc + C * L.qs;
    const float* graw = vc + C * W;
    cp_wait_all();
    __syncthreads();  // chunk n has landed; every thread is done with chunk n-1 (buffer, gates, kq)
    if (base + C < p.t) stage(base + C, (n + 1) & 1);
    // Once per block and token: k·q over row group rg (warp rg, lane = token), the gates.
    if (lane < nt) {
      const float4* q4 = reinterpret_cast<const float4*>(qkc + lane * L.qs + rg * 32);
      const float4* k4 = reinterpret_cast<const float4*>(qkc + lane * L.qs + d_k + rg * 32);
      float kq = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float4 kv = k4[e], qv = q4[e];
        kq += kv.x * qv.x;
        kq += kv.y * qv.y;
        kq += kv.z * qv.z;
        kq += kv.w * qv.w;
      }
      kqp[rg * C + lane] = kq;
    }
    if (tid >= nthr - 32 && lane < nt) {  // the last warp: token lane's gates (gdn_gates)
      const float ga = graw[lane], gb = graw[C + lane];
      float2 g;
      if (p.alpha) {
        g.x = expf(ssm_a * softplus(ga + dt_bias));
        g.y = sigmoid(gb);
      } else {
        g.x = expf(ga);
        g.y = gb;
      }
      gates[lane] = g;
    }
    __syncthreads();
    if (tid < nt) {  // read after token tid's barrier below
      float kq = 0.0f;
      for (int r = 0; r < RG; ++r) kq += kqp[r * C + tid];
      kqa[tid] = kq;
    }
    float2 g = gates[0];
    for (int j = 0; j < nt; ++j) {
      const int i = base + j;
      const float* qn = qkc + j * L.qs + rg * 32;
      const float* kn = qn + d_k;
      float kr[CPT == 1 ? 32 : 1];  // one column: k stays in registers for the update
      float pk[CPT], pq[CPT];
#pragma unroll
      for (int c = 0; c < CPT; ++c) pk[c] = pq[c] = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float4 k4 = reinterpret_cast<const float4*>(kn)[e], q4 = reinterpret_cast<const float4*>(qn)[e];
        const float kk[4] = {k4.x, k4.y, k4.z, k4.w}, qq[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if constexpr (CPT == 1) kr[4 * e + u] = kk[u];
#pragma unroll
          for (int c = 0; c < CPT; ++c) {
            s[c][4 * e + u] *= g.x;
            pk[c] += s[c][4 * e + u] * kk[u];
            pq[c] += s[c][4 * e + u] * qq[u];
          }
        }
      }
      float* red = sm + L.red + (i & 1) * 2 * RG * W;
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        red[rg * W + 32 * c + lane] = pk[c];
        red[(RG + rg) * W + 32 * c + lane] = pq[c];
      }
      const float b = g.y;
      if (j + 1 < nt) g = gates[j + 1];  // the next token's, ahead of the barrier
      __syncthreads();
      const float kq_all = kqa[j];
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        float kvb = 0.0f, sq = 0.0f;
#pragma unroll 4
        for (int r = 0; r < RG; ++r) {
          kvb += red[r * W + 32 * c + lane];
          sq += red[(RG + r) * W + 32 * c + lane];
        }
        const float delta = b * (vc[j * W + 32 * c + lane] - kvb);
        if constexpr (CPT == 1) {
#pragma unroll
          for (int u = 0; u < 32; ++u) s[c][u] += kr[u] * delta;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float4 k4 = reinterpret_cast<const float4*>(kn)[e];
            s[c][4 * e] += k4.x * delta;
            s[c][4 * e + 1] += k4.y * delta;
            s[c][4 * e + 2] += k4.z * delta;
            s[c][4 * e + 3] += k4.w * delta;
          }
        }
        const int col = col0 + 32 * c + lane;
        if (rg == 0 && col < d_v)
          p.out[(static_cast<int64_t>(i) * p.n_v + h) * d_v + col] = sq + delta * kq_all;
      }
    }
  }
#pragma unroll
  for (int c = 0; c < CPT; ++c) {
    const int col = col0 + 32 * c + lane;
    if (col < d_v)
#pragma unroll
      for (int j = 0; j < 32; ++j) S[static_cast<int64_t>(rg * 32 + j) * d_v + col] = s[c][j];
  }
  if (p.qkv) {  // the conv state: the last taps-1 inputs (t >= taps-1); key head hk's by block hk
    const int64_t first = static_cast<int64_t>(p.t - (p.taps - 1)) * width;
    for (int j = 0; j < p.taps - 1; ++j) {
      const float* xj = p.qkv + first + j * width;
      float* st = p.conv_state + static_cast<int64_t>(j) * width;
      if (h < p.n_k && blockIdx.y == 0) {
        st[hk * d_k + tid] = xj[hk * d_k + tid];
        st[qk + hk * d_k + tid] = xj[qk + hk * d_k + tid];
      }
      if (rg == 0)
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
          const int64_t cc = 2 * qk + static_cast<int64_t>(h) * d_v + col0 + 32 * c + lane;
          if (col0 + 32 * c + lane < d_v) st[cc] = xj[cc];
        }
    }
  }
}

// Chunks of 32 tokens unless the shared memory would keep two blocks off an SM.
constexpr size_t kWalkSmemMax = 100 * 1024;

template <int CPT, int RGT>
void launch_chunked(const GdnFused& p, cudaStream_t s) {
  int c = 32;
  while (c > 2 && WalkSmem(p.d_k, 32 * CPT, c).total * sizeof(float) > kWalkSmemMax) c /= 2;
  const size_t smem = WalkSmem(p.d_k, 32 * CPT, c).total * sizeof(float);
  cudaFuncSetAttribute(gdn_walk_chunk_kernel<CPT, RGT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem));
  launch(gdn_walk_chunk_kernel<CPT, RGT>,
         dim3(static_cast<unsigned>(p.n_v), static_cast<unsigned>((p.d_v + 32 * CPT - 1) / (32 * CPT))),
         static_cast<unsigned>(p.d_k), smem, s, p, c);
}

// BONSAI_CUDA_WALK: 0 the token kernel, 1 the chunked kernel with one column per thread, 2 with
// two, 6 the chunked form on the tensor cores in two kernels (kernels/cuda/gdn_tc2.cu); unset or
// empty: the default (6 from kTc2MinTokens tokens when the caller gives the scratch, else
// kWalkDefault). Anything else is an error. Read once per process. (3 / 4, the fp32 WY form of
// session 6, and 5, the one-kernel tensor-core form, were measured slower and removed in session 7:
// git history, gdn_chunked.cu and gdn_tc.cu; docs/performance.md keeps their figures.)
constexpr int kWalkDefault = 1;
// The two-kernel tensor-core form from this many tokens on: measured faster at t = 512 and 1024 on
// the H200 (27B layer at t = 512: 45.6 + 117.0 us against 191 us; docs/performance.md, session 7);
// shorter batches are not measured and keep kWalkDefault.
constexpr int kTc2MinTokens = 512;

int walk_kernel_env() {
  // 0 token walk, 1 / 2 chunked walk with 1 or 2 columns per thread, 6 the chunked form on the
  // tensor cores; parsed in kernels/cuda/knobs.cpp.
  static const int k = knob::walk();
  return k;
}

int pick_kernel(const GdnFused& p, int kernel) {
  if (kernel < 0) {
    kernel = walk_kernel_env();
    if (kernel < 0) kernel = p.t >= kTc2MinTokens ? 6 : kWalkDefault;
  }
  return kernel;
}

}  // namespace

size_t gdn_walk_scratch_bytes(const GdnFused& p) {
  return pick_kernel(p, -1) == 6 && gdn_walk_tc2_supported(p) ? gdn_walk_tc2_scratch_floats(p) * sizeof(float)
                                                              : 0;
}

void gdn_walk(const GdnFused& p, cudaStream_t s, int kernel) {
  kernel = pick_kernel(p, kernel);
  if (kernel == 6) {
    if (p.scratch && gdn_walk_tc2_supported(p)) return gdn_walk_tc2(p, s);
    kernel = 1;
  }
  // cp.async needs 16-byte aligned rows (d_k, d_v multiples of 32 keep the offsets aligned)
  if (reinterpret_cast<uintptr_t>(p.conv) % 16 != 0) kernel = 0;
  if (kernel == 0) {
    const size_t smem = (6 * p.d_k + 6 * (p.d_k / 32) * p.d_v) * sizeof(float);
    launch(gdn_walk_token_kernel, dim3(static_cast<unsigned>(p.n_v), static_cast<unsigned>(p.d_v / 32)),
           static_cast<unsigned>(p.d_k), smem, s, p);
  } else if (kernel == 1) {
    p.d_k == 128 ? launch_chunked<1, 4>(p, s) : launch_chunked<1, 0>(p, s);
  } else {
    p.d_k == 128 ? launch_chunked<2, 4>(p, s) : launch_chunked<2, 0>(p, s);
  }
}

void gdn_walk(const GdnFused& p, cudaStream_t s) { gdn_walk(p, s, -1); }

}  // namespace bonsai::cuda
