// Prefill: the gated delta rule over t tokens in the chunked form with its products on the tensor
// cores (BONSAI_CUDA_WALK=5), the structure of flash-linear-attention's chunk_gated_delta_rule
// fused into one kernel. Per chunk of C = 32 tokens, with S0 the state [d_k][d_v] at the chunk
// start, G_i the cumulative log-decay inside the chunk (G_i = Σ_{m<=i} log decay_m) and β_i:
//     A_ij = β_i e^{G_i−G_j} k_i·k_j (j < i),   T = (I + A)^{-1}           (unit lower triangular)
//     R_i  = β_i (v_i − e^{G_i} S0ᵀk_i),        u = T·R                    (the walk's δ_i)
//     o_i  = e^{G_i} S0ᵀq_i + Σ_{j<=i} e^{G_i−G_j} (q_i·k_j) u_j
//     S_C  = e^{G_C} S0 + Σ_j (e^{G_C−G_j} k_j) u_jᵀ
// (kernels/cpu/gdn_chunked.h derives it: δ_i = β_i (v_i − S_{i−1}'ᵀk_i) with the state before token
// i's update written through S0 and the earlier δ_j). Decays appear only as e^{G_i−G_j}, j <= i,
// e^{G_i} and e^{G_C} (all <= 1); G is summed in double so that e^{G_i−G_j} carries only the
// rounding of the per-token log-decays, as the walk's product of decays does.
//
// Block per (value head h, 64 state columns), 8 warps; the state slice stays in shared memory in
// fp32 for all t tokens. Per chunk, between barriers:
//   P1  (all warps) the gates in registers (every warp, lane = token, prefix sum by shuffles);
//       k_i·k_j and q_i·k_j as 16x8 tiles on and below the diagonal, gated into A and Mq;
//       [K; Q]·S0 (warp w: columns 8w..8w+7, the 4 row tiles), gated into R and e^{G}·S0ᵀq.
//   P2  T's diagonal 16x16 blocks by forward substitution (warp 0, lane = column).
//   P3  T21 = −T22·(A21·T11) (all threads, two steps).
//   P4  u = T·R.   P5  o = e^{G}·S0ᵀq + Mq·u (to global), S ← e^{G_C} S + (e^{G_C−G} ⊙ K)ᵀ·u.
// The next chunk's q, k, v and raw gates are staged by cp.async during the current one.
//
// Numerics. Every product is an mma.sync m16n8k8 TF32 in the split form of gdn_ab_mma.cu ("3xTF32"):
// x = hi + lo + r with hi = tf32(x), lo = tf32(x − hi), |r| <= 2^-22|x|; x·y is formed as
// lo_x·hi_y + hi_x·lo_y + hi_x·hi_y (each exact in fp32), dropping lo_x·lo_y and the residues:
// <= 3·2^-22 |x y| per term, then fp32 accumulation. So every dot product is within
// (3·2^-22 + n·2^-23)·Σ|x_k y_k| of the exact one (2^-23 for the tensor core's accumulation,
// which need not round to nearest), the fp32 SIMT form's n·2^-24 up to a constant factor; the
// state is fp32 throughout (read as split B operands, updated in fp32 accumulators).
// tests/test_backend_cuda_wy.cpp holds the outputs and state to the token kernel's within a bound
// derived from this.
//
// Not the default: one 27B layer at t = 512 takes 211 us on the H200 against the chunked walk's
// 191 us (docs/performance.md, "What limits it", Prefill, session 7). Likely limit (from the
// figures, not profiled further): issue and latency with 2 warps per scheduler (one block of 8
// warps per SM, 165 KB of shared memory); every fragment is loaded and split (cvt, sub, cvt) per
// use, ~3000 instructions per warp and chunk, and 96 blocks leave 36 of the 132 SMs idle.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tf32_split.cuh"

namespace bonsai::cuda {
namespace {

constexpr int kC = 32;                 // tokens per chunk
constexpr int kNC = 64;                // state columns per block
constexpr int kWarps = kNC / 8;        // one n8 column tile per warp in the column-sliced products
constexpr int kThreads = 32 * kWarps;  // 256: also the 16x16 outputs of the T21 steps
constexpr unsigned kFull = 0xffffffffu;
// Row strides (floats). Fragment reads of a row-major operand at (row g, column q) hit banks
// (stride·g + q) mod 32: distinct for stride ≡ 4 (mod 32); a k-major B operand read at
// (row q, column g) hits (stride·q + g): distinct for stride ≡ 8 (mod 32).
constexpr int kTS = kC + 4;   // A, Mq, T [C][kTS]
constexpr int kRS = kNC + 8;  // R, e^{G}S0ᵀq, u [C][kRS]
constexpr int kSS = kNC + 8;  // the state slice [d_k][kSS]
constexpr int kVS = kNC + 4;  // v [C][kVS] (16-byte rows for cp.async)
constexpr int kXS = 17;       // A21·T11 [16][kXS]

// Shared memory in floats: two stage buffers (q [C][KS], k [C][KS], v [C][kVS], raw gates [2][C];
// KS = d_k + 4 ≡ 4 mod 32 for d_k % 32 == 0), then the state slice, A, Mq, T, X, R, Oq, U.
struct TcSmem {
  int ks, q, k, v, graw, buf, s, a, mq, t, x, r, oq, u, total;
  __host__ __device__ explicit TcSmem(int d_k) {
    ks = d_k + 4;
    q = 0;
    k = kC * ks;
    v = 2 * kC * ks;
    graw = v + kC * kVS;
    buf = graw + 2 * kC;  // a multiple of 4: the second buffer stays 16-byte aligned
    s = 2 * buf;
    a = s + d_k * kSS;
    mq = a + kC * kTS;
    t = mq + kC * kTS;
    x = t + kC * kTS;
    r = x + 16 * kXS;  // 272 floats: 16-byte alignment kept
    oq = r + kC * kRS;
    u = oq + kC * kRS;
    total = u + kC * kRS;
  }
};

using namespace tc;

__global__ void __launch_bounds__(kThreads) gdn_tc_kernel(GdnFused p) {
  extern __shared__ __align__(16) float sm[];
  pdl_trigger();
  pdl_wait();
  const int d_k = p.d_k, d_v = p.d_v;
  const int h = blockIdx.x, hk = h % p.n_k, col0 = blockIdx.y * kNC;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int64_t qk = static_cast<int64_t>(p.n_k) * d_k, width = 2 * qk + static_cast<int64_t>(p.n_v) * d_v;
  const TcSmem L(d_k);
  float* S = sm + L.s;
  float* Am = sm + L.a;
  float* Mq = sm + L.mq;
  float* Tm = sm + L.t;
  float* Xs = sm + L.x;
  float* R = sm + L.r;
  float* Oq = sm + L.oq;
  float* U = sm + L.u;
  const float* ga_src = p.alpha ? p.alpha : p.g;
  const float* gb_src = p.alpha ? p.beta_in : p.beta;
  const float ssm_a = p.alpha ? p.ssm_a[h] : 0.0f, dt_bias = p.alpha ? p.dt_bias[h] : 0.0f;
  float* Sg = p.state + static_cast<int64_t>(h) * d_k * d_v;

  for (int e = tid; e < d_k * kNC; e += kThreads) {  // columns past d_v: zeros
    const int r = e / kNC, c = e - r * kNC;
    S[r * kSS + c] = col0 + c < d_v ? Sg[static_cast<int64_t>(r) * d_v + col0 + c] : 0.0f;
  }

  // Tokens base.. of the chunk into buffer b: all C rows of q, k, v, the rows past the last
  // token zero-filled (so the padded rows add exact zeros), v's columns past d_v zero; the raw
  // gates of the valid tokens.
  auto stage = [&](int base, int b) {
    const int nt = min(kC, p.t - base);
    const uint32_t buf = smem_u32(sm + b * L.buf);
    const int pieces = d_k / 4;
    for (int idx = tid; idx < kC * 2 * pieces; idx += kThreads) {
      const int j = idx / (2 * pieces), e = idx - j * 2 * pieces;
      const bool isk = e >= pieces;
      const int ee = isk ? e - pieces : e;
      const float* row = p.conv + static_cast<int64_t>(base + min(j, nt - 1)) * width + (isk ? qk : 0) +
                         static_cast<int64_t>(hk) * d_k + 4 * ee;
      cp_async16(buf + ((isk ? L.k : L.q) + j * L.ks + 4 * ee) * 4, row, j < nt ? 16 : 0);
    }
    constexpr int vpieces = kNC / 4;
    for (int idx = tid; idx < kC * vpieces; idx += kThreads) {
      const int j = idx / vpieces, e = idx - j * vpieces, col = col0 + 4 * e;
      const float* row = p.conv + static_cast<int64_t>(base + min(j, nt - 1)) * width + 2 * qk +
                         static_cast<int64_t>(h) * d_v + (col < d_v ? col : 0);
      cp_async16(buf + (L.v + j * kVS + 4 * e) * 4, row, j < nt && col < d_v ? 16 : 0);
    }
    for (int idx = tid; idx < 2 * nt; idx += kThreads) {
      const int j = idx < nt ? idx : idx - nt;
      const int64_t ih = static_cast<int64_t>(base + j) * p.n_v + h;
      cp_async4(buf + (L.graw + (idx < nt ? j : kC + j)) * 4, (idx < nt ? ga_src : gb_src) + ih);
    }
    cp_commit();
  };

  stage(0, 0);
  for (int base = 0, n = 0; base < p.t; base += kC, ++n) {
    const int nt = min(kC, p.t - base);
    const float* Qc = sm + (n & 1) * L.buf + L.q;
    const float* Kc = sm + (n & 1) * L.buf + L.k;
    const float* Vc = sm + (n & 1) * L.buf + L.v;
    const float* Gr = sm + (n & 1) * L.buf + L.graw;
    cp_wait_all();
    __syncthreads();  // chunk n has landed; every thread is done with chunk n-1 (buffer, S, U)
    if (base + kC < p.t) stage(base + kC, (n + 1) & 1);

    // ---- P1: gates (each warp, lane = token; padded tokens: log-decay 0, β 0) ----
    float lg = 0.0f, bt = 0.0f;
    if (lane < nt) {
      const float a = Gr[lane], b = Gr[kC + lane];
      if (p.alpha) {
        lg = ssm_a * softplus(a + dt_bias);  // the walk's decay is expf of this
        bt = sigmoid(b);
      } else {
        lg = a;
        bt = b;
      }
    }
    double G = lg;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const double y = __shfl_up_sync(kFull, G, off);
      if (lane >= off) G += y;
    }
    const double GC = __shfl_sync(kFull, G, 31);  // = G of the last valid token

    // One pass over d_k per warp: the A fragments of k's and q's two row tiles (tokens 0..15,
    // 16..31) serve both products below.
    //  - [K; Q]·S0, warp w: state columns 8w..8w+7, the 4 row tiles;
    //  - k_i·k_j (A) or q_i·k_j (Mq) (src = w & 1), column tile nt8 = w >> 1 (tokens 8nt8..),
    //    the row tiles on and below the diagonal: tile 1 (tokens 16..31), and tile 0 for nt8 < 2.
    const int src = warp & 1, nt8 = warp >> 1, n0 = 8 * warp;
    float pb[4][4] = {}, ps[4][4] = {}, db[2][4] = {}, ds[2][4] = {};
#pragma unroll 2
    for (int k0 = 0; k0 < d_k; k0 += 8) {
      const FragA a0 = load_a(Kc, L.ks, 0, k0, g, q), a1 = load_a(Kc, L.ks, 16, k0, g, q);
      const FragA a2 = load_a(Qc, L.ks, 0, k0, g, q), a3 = load_a(Qc, L.ks, 16, k0, g, q);
      const FragB bs = load_b(S, kSS, k0, n0, g, q), bk = load_bt(Kc, L.ks, k0, 8 * nt8, g, q);
      mma3(pb[0], ps[0], a0, bs);
      mma3(pb[1], ps[1], a1, bs);
      mma3(pb[2], ps[2], a2, bs);
      mma3(pb[3], ps[3], a3, bs);
      if (src == 0) {
        mma3(db[1], ds[1], a1, bk);
        if (nt8 < 2) mma3(db[0], ds[0], a0, bk);
      } else {
        mma3(db[1], ds[1], a3, bk);
        if (nt8 < 2) mma3(db[0], ds[0], a2, bk);
      }
    }
    // A_ij = β_i e^{G_i−G_j} k_i·k_j (j < i), Mq_ij = e^{G_i−G_j} q_i·k_j (j <= i), else 0
    {
      float* D = src ? Mq : Am;
      const int j0 = 8 * nt8 + 2 * q;
      const double Gj[2] = {__shfl_sync(kFull, G, j0), __shfl_sync(kFull, G, j0 + 1)};
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        if (mt == 0 && nt8 >= 2) continue;  // warp-uniform
        const int i0 = 16 * mt + g;
        const double Gi[2] = {__shfl_sync(kFull, G, i0), __shfl_sync(kFull, G, i0 + 8)};
        const float bi[2] = {__shfl_sync(kFull, bt, i0), __shfl_sync(kFull, bt, i0 + 8)};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, cc = e & 1, i = i0 + 8 * r, j = j0 + cc;
          const bool keep = src ? j <= i : j < i;
          const float w = (src ? 1.0f : bi[r]) * expf(static_cast<float>(Gi[r] - Gj[cc]));
          D[i * kTS + j] = keep ? w * (db[mt][e] + ds[mt][e]) : 0.0f;
        }
      }
    }
    // R = β(v − e^{G}·S0ᵀk), Oq = e^{G}·S0ᵀq
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = 16 * (m & 1) + g + 8 * r, cc = n0 + 2 * q;
        const float eg = expf(static_cast<float>(__shfl_sync(kFull, G, i)));
        const float bi = __shfl_sync(kFull, bt, i);
        const float x0 = pb[m][2 * r] + ps[m][2 * r], x1 = pb[m][2 * r + 1] + ps[m][2 * r + 1];
        if (m < 2) {
          R[i * kRS + cc] = bi * (Vc[i * kVS + cc] - eg * x0);
          R[i * kRS + cc + 1] = bi * (Vc[i * kVS + cc + 1] - eg * x1);
        } else {
          Oq[i * kRS + cc] = eg * x0;
          Oq[i * kRS + cc + 1] = eg * x1;
        }
      }
    __syncthreads();

    // ---- P2: T's diagonal blocks, T_ii = 1, T_ij = −Σ_{j<=m<i} A_im T_mj (lane: column) ----
    if (warp == 0) {
      const int o = 16 * (lane >> 4), jj = lane & 15;
      float tc[16];
#pragma unroll
      for (int ii = 0; ii < 16; ++ii) {
        // rows above the diagonal come out 0; two chains (even, odd m) halve the latency
        float acc0 = ii == jj ? 1.0f : 0.0f, acc1 = 0.0f;
#pragma unroll
        for (int m = 0; m < ii; ++m) {
          const float x = Am[(o + ii) * kTS + o + m] * tc[m];
          if (m & 1)
            acc1 -= x;
          else
            acc0 -= x;
        }
        tc[ii] = acc0 + acc1;
      }
#pragma unroll
      for (int ii = 0; ii < 16; ++ii) Tm[(o + ii) * kTS + o + jj] = tc[ii];
    }
    __syncthreads();
    // ---- P3: T21 = −T22·(A21·T11), thread = one of the 16x16 outputs ----
    {
      const int a = tid >> 4, b = tid & 15;
      float acc = 0.0f;
#pragma unroll
      for (int m = 0; m < 16; ++m) acc += Am[(16 + a) * kTS + m] * Tm[m * kTS + b];
      Xs[a * kXS + b] = acc;
      __syncthreads();
      acc = 0.0f;
#pragma unroll
      for (int m = 0; m < 16; ++m) acc += Tm[(16 + a) * kTS + 16 + m] * Xs[m * kXS + b];
      Tm[(16 + a) * kTS + b] = -acc;
    }
    __syncthreads();

    // ---- P4: u = T·R (T lower triangular: row tile 0 needs k < 16) ----
    {
      float c[2][4] = {}, cs[2][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < kC; k0 += 8) {
        const FragB b = load_b(R, kRS, k0, n0, g, q);
        mma3(c[1], cs[1], load_a(Tm, kTS, 16, k0, g, q), b);
        if (k0 < 16) mma3(c[0], cs[0], load_a(Tm, kTS, 0, k0, g, q), b);
      }
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<float2*>(U + (16 * m + g + 8 * r) * kRS + n0 + 2 * q) =
              make_float2(c[m][2 * r] + cs[m][2 * r], c[m][2 * r + 1] + cs[m][2 * r + 1]);
    }
    __syncthreads();

    // ---- P5: outputs o = Oq + Mq·u (Mq lower triangular with its diagonal) ----
    {
      float c[2][4], cs[2][4] = {};
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float2 o = *reinterpret_cast<const float2*>(Oq + (16 * m + g + 8 * r) * kRS + n0 + 2 * q);
          c[m][2 * r] = o.x;
          c[m][2 * r + 1] = o.y;
        }
#pragma unroll
      for (int k0 = 0; k0 < kC; k0 += 8) {
        const FragB b = load_b(U, kRS, k0, n0, g, q);
        mma3(c[1], cs[1], load_a(Mq, kTS, 16, k0, g, q), b);
        if (k0 < 16) mma3(c[0], cs[0], load_a(Mq, kTS, 0, k0, g, q), b);
      }
      const int col = col0 + n0 + 2 * q;
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = 16 * m + g + 8 * r;
          if (i < nt && col < d_v)
            *reinterpret_cast<float2*>(p.out + (static_cast<int64_t>(base + i) * p.n_v + h) * d_v + col) =
                make_float2(c[m][2 * r] + cs[m][2 * r], c[m][2 * r + 1] + cs[m][2 * r + 1]);
        }
    }
    // ---- the state: S = e^{G_C} S + Σ_j (e^{G_C−G_j} k_j) u_jᵀ; warp w: rows 16w.. (+128..) ----
    {
      const float eC = expf(static_cast<float>(GC));
      float ec[8];  // e^{G_C−G_j} for j = 8ks + q (even entries) and 8ks + q + 4 (odd)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        ec[e] = expf(static_cast<float>(GC - __shfl_sync(kFull, G, 8 * (e >> 1) + q + 4 * (e & 1))));
      for (int mt = warp; mt < d_k / 16; mt += kWarps) {
        const int r0 = 16 * mt;
        float c[8][4], cs[8][4] = {};
#pragma unroll
        for (int nn = 0; nn < 8; ++nn)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float2 s = *reinterpret_cast<const float2*>(S + (r0 + g + 8 * r) * kSS + 8 * nn + 2 * q);
            c[nn][2 * r] = eC * s.x;
            c[nn][2 * r + 1] = eC * s.y;
          }
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          // A(m = row r, k = token j) = e^{G_C−G_j} k_j[r]
          const float* k0p = Kc + (8 * ks + q) * L.ks + r0 + g;
          const float* k1p = k0p + 4 * L.ks;
          const FragA a = frag_a(ec[2 * ks] * k0p[0], ec[2 * ks] * k0p[8], ec[2 * ks + 1] * k1p[0],
                                 ec[2 * ks + 1] * k1p[8]);
#pragma unroll
          for (int nn = 0; nn < 8; ++nn) mma3(c[nn], cs[nn], a, load_b(U, kRS, 8 * ks, 8 * nn, g, q));
        }
#pragma unroll
        for (int nn = 0; nn < 8; ++nn)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            *reinterpret_cast<float2*>(S + (r0 + g + 8 * r) * kSS + 8 * nn + 2 * q) =
                make_float2(c[nn][2 * r] + cs[nn][2 * r], c[nn][2 * r + 1] + cs[nn][2 * r + 1]);
      }
    }
  }
  __syncthreads();
  for (int e = tid; e < d_k * kNC; e += kThreads) {
    const int r = e / kNC, c = e - r * kNC;
    if (col0 + c < d_v) Sg[static_cast<int64_t>(r) * d_v + col0 + c] = S[r * kSS + c];
  }
  if (p.qkv) {  // the conv state: the last taps-1 inputs (t >= taps-1); key head h's by block (h, 0)
    const int64_t first = static_cast<int64_t>(p.t - (p.taps - 1)) * width;
    for (int j = 0; j < p.taps - 1; ++j) {
      const float* xj = p.qkv + first + j * width;
      float* st = p.conv_state + static_cast<int64_t>(j) * width;
      if (h < p.n_k && blockIdx.y == 0)
        for (int e = tid; e < 2 * d_k; e += kThreads) {
          const int64_t off = (e < d_k ? 0 : qk) + static_cast<int64_t>(hk) * d_k + (e < d_k ? e : e - d_k);
          st[off] = xj[off];
        }
      for (int c = tid; c < kNC; c += kThreads)
        if (col0 + c < d_v) {
          const int64_t cc = 2 * qk + static_cast<int64_t>(h) * d_v + col0 + c;
          st[cc] = xj[cc];
        }
    }
  }
}

// The opt-in shared memory of one block on sm_90 (227 KB).
constexpr size_t kTcSmemMax = 227 * 1024;

}  // namespace

bool gdn_walk_tc_supported(const GdnFused& p) {
  return (p.d_k == 32 || p.d_k == 64 || p.d_k == 128) && p.d_v % 32 == 0 && p.t >= 1 &&
         TcSmem(p.d_k).total * sizeof(float) <= kTcSmemMax && reinterpret_cast<uintptr_t>(p.conv) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.out) % 8 == 0;
}

void gdn_walk_tc(const GdnFused& p, cudaStream_t s) {
  const size_t smem = TcSmem(p.d_k).total * sizeof(float);
  cudaFuncSetAttribute(gdn_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  launch(gdn_tc_kernel, dim3(static_cast<unsigned>(p.n_v), static_cast<unsigned>((p.d_v + kNC - 1) / kNC)),
         static_cast<unsigned>(kThreads), smem, s, p);
}

}  // namespace bonsai::cuda
