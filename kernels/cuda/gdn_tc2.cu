// Prefill: the gated delta rule in the chunked form on the tensor cores, split into two kernels
// as flash-linear-attention's chunk_gated_delta_rule (BONSAI_CUDA_WALK=6). Per chunk of C = 32
// tokens, with S0 the state [d_k][d_v] at the chunk start, G_i the cumulative log-decay inside
// the chunk (G_i = Σ_{m<=i} log decay_m) and β_i:
//     A_ij = β_i e^{G_i−G_j} k_i·k_j (j < i),  T = (I + A)^{-1},  Mq_ij = e^{G_i−G_j} q_i·k_j (j <= i)
//     W = T·(β e^{G} K),  U = T·(β V)                              (no state: kernel A)
//     u = U − W·S0,  o = e^{G} (Q·S0) + Mq·u,  S_C = e^{G_C} S0 + (e^{G_C−G} ⊙ K)ᵀ·u   (kernel B)
// (kernels/cpu/gdn_chunked.h derives the chunked form: the walk's δ_i = β_i (v_i − S_{i−1}ᵀk_i)
// with the state before token i's update written through S0 and the earlier δ_j gives
// u = T·β(V − e^{G} K·S0); here the product by T comes before the one by S0, so that it needs no
// state.) Decays appear only as e^{G_i−G_j}, j <= i, e^{G_i} and e^{G_C} (all <= 1); G is summed
// in double so that e^{G_i−G_j} carries only the rounding of the per-token log-decays, as the
// walk's product of decays does.
//
// Kernel A (gdn_tc2_prep_kernel): block per (value head, chunk), 768 blocks at t = 512 for the
// 27B. Gates and G (prefix sum in double), the k·k / q·k tiles, T blockwise (its 16x16 diagonal
// blocks by forward substitution, T21 = −T22·(A21·T11)), W | U = T·[β e^{G} K | β V]; writes
// W [C][d_k], U [C][d_v], Mq [C][C] and the decay factors e^{G_i}, e^{G_C−G_j}, e^{G_C} (floats of
// the double G) to the per-(head, chunk) scratch.
//
// Kernel B (gdn_tc2_walk_kernel): block per (value head, 64 state columns), 8 warps, serial over
// the chunks, staging chunk n+1's W, q, k (from conv), U slice, Mq and factors by cp.async during
// chunk n. The state: warp w owns rows 16w..16w+15 in fp32 registers (the accumulators of the
// state product) and writes them split (hi / lo TF32) into shared memory once per chunk, the
// B operand of [W; Q]·S0 for every warp without a split per use; u is stored split the same way.
//   P1  [W; Q]·S0: warp (row tile w & 3, column tiles 4(w >> 2)..+3); W rows give u = U − W·S0
//       (to shared memory, split), Q rows e^{G}·Q·S0 (kept in registers).   (barrier)
//   P2  the Q warps: o = e^{G} Q·S0 + Mq·u (to global); every warp: its state rows
//       S ← e^{G_C} S + Kdᵀ·u, then their split copy.                       (barrier: next chunk)
//
// Numerics. Every product is an mma.sync m16n8k8 TF32 in the split form ("3xTF32",
// tf32_split.cuh): x = hi + lo + r with hi = tf32(x), lo = tf32(x − hi), |r| <= 2^-22|x|; x·y is
// formed as lo_x·hi_y + hi_x·lo_y + hi_x·hi_y (each exact in fp32), dropping lo_x·lo_y and the
// residues: <= 3·2^-22 |x y| per term, then fp32 accumulation (<= 2^-23 per add: the tensor core
// need not round to nearest). So every dot product is within (3·2^-22 + n·2^-23)·Σ|x_k y_k| of the
// exact one, the fp32 SIMT form's n·2^-24 up to a constant factor; the state is fp32 throughout.
// Each output / state element sums d_k terms in the products with S0 and C in those with T and
// Mq; tests/test_backend_cuda_wy.cpp holds outputs and state to the token kernel's within the
// bound derived from this.
//
// The default walk from 512 tokens (gdn_walk.cu). H200, one 27B layer at t = 512 (ncu): kernel A
// 45.6 us (3 blocks per SM), kernel B 117.0 us, against the chunked walk's 191 us. What limits B
// (ncu, same run): 8 warps per SM (one block: 220 KB of shared memory, 167 registers), 0.59
// eligible warps per scheduler, tensor pipe 29 % and LSU 42 % of peak: latency-bound between
// the mma.sync fragments' shared-memory loads and the three mmas of each split product, one
// chunk's phases separated by two barriers (docs/performance.md, session 7, round 2).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tf32_split.cuh"

namespace bonsai::cuda {
namespace {

using namespace tc;

constexpr int kC = 32;         // tokens per chunk
constexpr int kNC = 64;        // state columns per block of kernel B
constexpr int kThreads = 256;  // 8 warps, both kernels (also the 16x16 outputs of T21)
constexpr unsigned kFull = 0xffffffffu;
constexpr int kTS = kC + 4;       // A, Mq, T [C][kTS] (row-major A operands: stride ≡ 4 mod 32)
constexpr int kXS = 17;           // A21·T11 [16][kXS]
constexpr int kSS = kNC + 8;      // split state [d_k][kSS], split u [C][kSS] (k-major B: ≡ 8 mod 32)
constexpr int kUS = kNC + 4;      // U slice [C][kUS]
constexpr int kFac = 2 * kC + 4;  // e^{G_i} [C], e^{G_C−G_j} [C], e^{G_C}, 3 zeros

// Scratch floats per (head, chunk): W [C][d_k], U [C][d_v], Mq [C][C], factors [kFac]; every part
// a multiple of 4 floats (16-byte cp.async pieces).
__host__ __device__ inline int64_t chunk_floats(int d_k, int d_v) {
  return static_cast<int64_t>(kC) * (d_k + d_v + kC) + kFac;
}

// Kernel A's shared memory (floats): q, k [C][d_k + 4], v [C][d_v + 8], raw gates [2][C], β and
// β e^{G} [2][C], A, Mq, T [C][kTS], X [16][kXS].
struct PrepSmem {
  int ks, vs, q, k, v, graw, bf, a, mq, t, x, total;
  explicit PrepSmem(int d_k, int d_v) {
    ks = d_k + 4;
    vs = d_v + 8;
    q = 0;
    k = kC * ks;
    v = 2 * kC * ks;
    graw = v + kC * vs;
    bf = graw + 2 * kC;
    a = bf + 2 * kC;
    mq = a + kC * kTS;
    t = mq + kC * kTS;
    x = t + kC * kTS;
    total = x + 16 * kXS;
  }
};

// Kernel B's shared memory (floats): two stage buffers (W, q, k [C][d_k + 4], U [C][kUS], Mq
// [C][kTS], factors [kFac]), the split state (hi, lo [d_k][kSS]) and the split u (hi, lo [C][kSS]).
struct WalkSmem {
  int ks, w, q, k, u, mq, fac, buf, shi, slo, uhi, ulo, total;
  explicit WalkSmem(int d_k) {
    ks = d_k + 4;
    w = 0;
    q = kC * ks;
    k = 2 * kC * ks;
    u = 3 * kC * ks;
    mq = u + kC * kUS;
    fac = mq + kC * kTS;
    buf = fac + kFac;
    shi = 2 * buf;
    slo = shi + d_k * kSS;
    uhi = slo + d_k * kSS;
    ulo = uhi + kC * kSS;
    total = ulo + kC * kSS;
  }
};

template <int DK>
__global__ void __launch_bounds__(kThreads, 3) gdn_tc2_prep_kernel(GdnFused p, PrepSmem L) {
  extern __shared__ __align__(16) float sm[];
  pdl_trigger();
  pdl_wait();
  constexpr int d_k = DK;
  const int d_v = p.d_v;
  const int h = blockIdx.x, n = blockIdx.y, hk = h % p.n_k, base = n * kC, nt = min(kC, p.t - base);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int64_t qk = static_cast<int64_t>(p.n_k) * d_k, width = 2 * qk + static_cast<int64_t>(p.n_v) * d_v;
  float* Qs = sm + L.q;
  float* Ks = sm + L.k;
  float* Vs = sm + L.v;
  const float* Gr = sm + L.graw;
  float* Bf = sm + L.bf;
  float* Am = sm + L.a;
  float* Mq = sm + L.mq;
  float* Tm = sm + L.t;
  float* Xs = sm + L.x;
  const int nchunks = (p.t + kC - 1) / kC;
  float* dst = p.scratch + (static_cast<int64_t>(h) * nchunks + n) * chunk_floats(d_k, d_v);
  const float* ga_src = p.alpha ? p.alpha : p.g;
  const float* gb_src = p.alpha ? p.beta_in : p.beta;

  {  // the chunk's q, k, v rows (rows past the last token zero) and raw gates
    const uint32_t b = smem_u32(sm);
    constexpr int pieces = d_k / 4;
    const int vpieces = d_v / 4;
    for (int j = warp; j < kC; j += kThreads / 32) {  // row per warp: no index division
      const float* row = p.conv + static_cast<int64_t>(base + min(j, nt - 1)) * width;
      const int bytes = j < nt ? 16 : 0;
      for (int e = lane; e < 2 * pieces; e += 32) {
        const bool isk = e >= pieces;
        const int ee = isk ? e - pieces : e;
        cp_async16(b + ((isk ? L.k : L.q) + j * L.ks + 4 * ee) * 4,
                   row + (isk ? qk : 0) + static_cast<int64_t>(hk) * d_k + 4 * ee, bytes);
      }
      for (int e = lane; e < vpieces; e += 32)
        cp_async16(b + (L.v + j * L.vs + 4 * e) * 4, row + 2 * qk + static_cast<int64_t>(h) * d_v + 4 * e,
                   bytes);
    }
    for (int idx = tid; idx < 2 * nt; idx += kThreads) {
      const int j = idx < nt ? idx : idx - nt;
      const int64_t ih = static_cast<int64_t>(base + j) * p.n_v + h;
      cp_async4(b + (L.graw + (idx < nt ? j : kC + j)) * 4, (idx < nt ? ga_src : gb_src) + ih);
    }
    cp_commit();
    cp_wait_all();
    __syncthreads();
  }

  // gates (each warp, lane = token; padded tokens: log-decay 0, β 0), G in double
  float lg = 0.0f, bt = 0.0f;
  if (lane < nt) {
    const float a = Gr[lane], b = Gr[kC + lane];
    if (p.alpha) {
      lg = p.ssm_a[h] * softplus(a + p.dt_bias[h]);  // the walk's decay is expf of this
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
  if (warp == 0) {
    const float eg = expf(static_cast<float>(G));
    Bf[lane] = bt;
    Bf[kC + lane] = bt * eg;
    float* fac = dst + kC * static_cast<int64_t>(d_k + d_v + kC);
    fac[lane] = eg;
    fac[kC + lane] = expf(static_cast<float>(GC - G));
    if (lane < 4) fac[2 * kC + lane] = lane == 0 ? expf(static_cast<float>(GC)) : 0.0f;
  }

  // k_i·k_j (A, src 0) and q_i·k_j (Mq, src 1), warp: src = w & 1, column tile nt8 = w >> 1, the
  // row tiles on and below the diagonal (tile 1, and tile 0 for nt8 < 2; the others stay zero)
  {
    const int src = warp & 1, nt8 = warp >> 1;
    const float* X = src ? Qs : Ks;
    float db[2][4] = {}, ds[2][4] = {};
#pragma unroll 2
    for (int k0 = 0; k0 < d_k; k0 += 8) {
      const FragB bk = load_bt(Ks, L.ks, k0, 8 * nt8, g, q);
      mma3(db[1], ds[1], load_a(X, L.ks, 16, k0, g, q), bk);
      if (nt8 < 2) mma3(db[0], ds[0], load_a(X, L.ks, 0, k0, g, q), bk);
    }
    float* D = src ? Mq : Am;
    const int j0 = 8 * nt8 + 2 * q;
    const double Gj[2] = {__shfl_sync(kFull, G, j0), __shfl_sync(kFull, G, j0 + 1)};
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int i0 = 16 * mt + g;
      const double Gi[2] = {__shfl_sync(kFull, G, i0), __shfl_sync(kFull, G, i0 + 8)};
      const float bi[2] = {__shfl_sync(kFull, bt, i0), __shfl_sync(kFull, bt, i0 + 8)};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, cc = e & 1, i = i0 + 8 * r, j = j0 + cc;
        const bool keep = src ? j <= i : j < i;  // false in the tiles above the diagonal
        const float w = (src ? 1.0f : bi[r]) * expf(static_cast<float>(Gi[r] - Gj[cc]));
        D[i * kTS + j] = keep ? w * (db[mt][e] + ds[mt][e]) : 0.0f;
      }
    }
  }
  __syncthreads();

  if (warp == 0) {  // T's diagonal blocks, T_ii = 1, T_ij = −Σ_{j<=m<i} A_im T_mj (lane: column)
    const int o = 16 * (lane >> 4), jj = lane & 15;
    float tc[16];
#pragma unroll
    for (int ii = 0; ii < 16; ++ii) {
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
  } else {  // meanwhile: k_j ← β_j e^{G_j} k_j, v_j ← β_j v_j in place; Mq to the scratch
    float* mq_dst = dst + kC * static_cast<int64_t>(d_k + d_v);
    for (int e = tid - 32; e < kC * kC; e += kThreads - 32) mq_dst[e] = Mq[(e / kC) * kTS + e % kC];
    for (int j = warp - 1; j < kC; j += kThreads / 32 - 1) {
      const float bk = Bf[kC + j], bv = Bf[j];
      for (int c = lane; c < d_k; c += 32) Ks[j * L.ks + c] *= bk;
      for (int c = lane; c < d_v; c += 32) Vs[j * L.vs + c] *= bv;
    }
  }
  __syncthreads();
  {  // T21 = −T22·(A21·T11), thread = one of the 16x16 outputs
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

  // W | U = T·[β e^{G} K | β V] (T lower triangular: row tile 0 needs k < 16); warp: column tiles
  // w, w + 8, ... of the d_k + d_v columns
  FragA t1[kC / 8], t0[2];
#pragma unroll
  for (int s = 0; s < kC / 8; ++s) t1[s] = load_a(Tm, kTS, 16, 8 * s, g, q);
#pragma unroll
  for (int s = 0; s < 2; ++s) t0[s] = load_a(Tm, kTS, 0, 8 * s, g, q);
  for (int ct = warp; ct < (d_k + d_v) / 8; ct += kThreads / 32) {
    const bool isk = 8 * ct < d_k;
    const int cc = isk ? 8 * ct : 8 * ct - d_k, ld = isk ? L.ks : L.vs, ldo = isk ? d_k : d_v;
    const float* Bm = isk ? Ks : Vs;
    float c[2][4] = {}, cs[2][4] = {};
#pragma unroll
    for (int s = 0; s < kC / 8; ++s) {
      const FragB b = load_b(Bm, ld, 8 * s, cc, g, q);
      mma3(c[1], cs[1], t1[s], b);
      if (s < 2) mma3(c[0], cs[0], t0[s], b);
    }
    float* o = dst + (isk ? 0 : static_cast<int64_t>(kC) * d_k);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<float2*>(o + (16 * m + g + 8 * r) * ldo + cc + 2 * q) =
            make_float2(c[m][2 * r] + cs[m][2 * r], c[m][2 * r + 1] + cs[m][2 * r + 1]);
  }
}

template <int DK>
__global__ void __launch_bounds__(kThreads, 1) gdn_tc2_walk_kernel(GdnFused p, WalkSmem L) {
  extern __shared__ __align__(16) float sm[];
  pdl_trigger();
  pdl_wait();
  constexpr int d_k = DK;
  const int d_v = p.d_v;
  const int h = blockIdx.x, hk = h % p.n_k, col0 = blockIdx.y * kNC;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int64_t qk = static_cast<int64_t>(p.n_k) * d_k, width = 2 * qk + static_cast<int64_t>(p.n_v) * d_v;
  uint32_t* Shi = reinterpret_cast<uint32_t*>(sm + L.shi);
  uint32_t* Slo = reinterpret_cast<uint32_t*>(sm + L.slo);
  uint32_t* Uhi = reinterpret_cast<uint32_t*>(sm + L.uhi);
  uint32_t* Ulo = reinterpret_cast<uint32_t*>(sm + L.ulo);
  const int nchunks = (p.t + kC - 1) / kC;
  const int64_t per = chunk_floats(d_k, d_v);
  const float* scr = p.scratch + static_cast<int64_t>(h) * nchunks * per;
  float* Sg = p.state + static_cast<int64_t>(h) * d_k * d_v;

  // The state, warp w: rows r0 + g (+8) of row tile w (none for w >= d_k / 16), columns
  // 8nn + 2q (+1) of the slice; columns past d_v are zeros.
  const bool has_rows = warp < d_k / 16;
  const int r0 = 16 * warp;
  float st[kNC / 8][4];
#pragma unroll
  for (int nn = 0; nn < kNC / 8; ++nn)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = r0 + g + 8 * (e >> 1), col = col0 + 8 * nn + 2 * q + (e & 1);
      st[nn][e] = has_rows && col < d_v ? Sg[static_cast<int64_t>(row) * d_v + col] : 0.0f;
    }
  auto put_state = [&] {
    if (!has_rows) return;
#pragma unroll
    for (int nn = 0; nn < kNC / 8; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int o = (r0 + g + 8 * (e >> 1)) * kSS + 8 * nn + 2 * q + (e & 1);
        split_tf32(st[nn][e], Shi[o], Slo[o]);
      }
  };
  put_state();

  // Chunk n into buffer b: W, U slice, Mq, factors from the scratch (padded rows hold zeros),
  // q, k rows from conv (rows past the last token zero-filled), U's columns past d_v zero.
  auto stage = [&](int n, int b) {
    const int base = n * kC, nt = min(kC, p.t - base);
    const uint32_t buf = smem_u32(sm + b * L.buf);
    const float* src = scr + n * per;
    constexpr int pieces = d_k / 4;
    for (int j = warp; j < kC; j += kThreads / 32) {  // row per warp: no index division
      const float* crow =
          p.conv + static_cast<int64_t>(base + min(j, nt - 1)) * width + static_cast<int64_t>(hk) * d_k;
      const int bytes = j < nt ? 16 : 0;
      for (int e = lane; e < pieces; e += 32) {
        cp_async16(buf + (L.w + j * L.ks + 4 * e) * 4, src + j * d_k + 4 * e, 16);
        cp_async16(buf + (L.q + j * L.ks + 4 * e) * 4, crow + 4 * e, bytes);
        cp_async16(buf + (L.k + j * L.ks + 4 * e) * 4, crow + qk + 4 * e, bytes);
      }
    }
    constexpr int upieces = kNC / 4;
    for (int idx = tid; idx < kC * upieces; idx += kThreads) {
      const int j = idx / upieces, e = idx - j * upieces, col = col0 + 4 * e;
      const float* row = src + static_cast<int64_t>(kC) * d_k + j * d_v + (col < d_v ? col : 0);
      cp_async16(buf + (L.u + j * kUS + 4 * e) * 4, row, col < d_v ? 16 : 0);
    }
    const float* mq = src + static_cast<int64_t>(kC) * (d_k + d_v);
    for (int idx = tid; idx < kC * kC / 4; idx += kThreads) {
      const int j = idx / (kC / 4), e = idx - j * (kC / 4);
      cp_async16(buf + (L.mq + j * kTS + 4 * e) * 4, mq + j * kC + 4 * e, 16);
    }
    for (int idx = tid; idx < kFac / 4; idx += kThreads)
      cp_async16(buf + (L.fac + 4 * idx) * 4, mq + kC * kC + 4 * idx, 16);
    cp_commit();
  };

  const int rt = warp & 3, nh = warp >> 2, xr = 16 * (rt & 1);
  stage(0, 0);
  for (int base = 0, n = 0; base < p.t; base += kC, ++n) {
    const int nt = min(kC, p.t - base);
    const float* B0 = sm + (n & 1) * L.buf;
    const float* Wc = B0 + L.w;
    const float* Qc = B0 + L.q;
    const float* Kc = B0 + L.k;
    const float* Uc = B0 + L.u;
    const float* Mc = B0 + L.mq;
    const float* Fc = B0 + L.fac;
    cp_wait_all();
    __syncthreads();  // chunk n has landed and the split state is written; chunk n-1 is done
    if (base + kC < p.t) stage(n + 1, (n + 1) & 1);

    // ---- P1: [W; Q]·S0; warp: row tile rt (0, 1: W's, 2, 3: Q's), column tiles 4nh.. ----
    const float* X = rt < 2 ? Wc : Qc;
    float c[4][4] = {}, cs[4][4] = {};
#pragma unroll 4
    for (int k0 = 0; k0 < d_k; k0 += 8) {
      const FragA a = load_a(X, L.ks, xr, k0, g, q);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        mma3(c[j], cs[j], a, load_b_split(Shi, Slo, kSS, k0, 8 * (4 * nh + j), g, q));
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = xr + g + 8 * (e >> 1), col = 8 * (4 * nh + j) + 2 * q + (e & 1);
        const float x = c[j][e] + cs[j][e];
        if (rt < 2) {  // u = U − W·S0, split once: the B operand of both products below
          split_tf32(Uc[i * kUS + col] - x, Uhi[i * kSS + col], Ulo[i * kSS + col]);
        } else {  // e^{G} Q·S0: the outputs' first term
          c[j][e] = Fc[i] * x;
          cs[j][e] = 0.0f;
        }
      }
    __syncthreads();

    // ---- P2: o = e^{G} Q·S0 + Mq·u (Mq lower triangular with its diagonal: row tile 0 needs
    // tokens < 16) ----
    if (rt >= 2) {
      const int mt = rt - 2;
#pragma unroll
      for (int k0 = 0; k0 < kC; k0 += 8) {
        if (mt == 0 && k0 >= 16) break;
        const FragA a = load_a(Mc, kTS, 16 * mt, k0, g, q);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          mma3(c[j], cs[j], a, load_b_split(Uhi, Ulo, kSS, k0, 8 * (4 * nh + j), g, q));
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = 16 * mt + g + 8 * r, col = col0 + 8 * (4 * nh + j) + 2 * q;
          if (i < nt && col < d_v)
            *reinterpret_cast<float2*>(p.out + (static_cast<int64_t>(base + i) * p.n_v + h) * d_v + col) =
                make_float2(c[j][2 * r] + cs[j][2 * r], c[j][2 * r + 1] + cs[j][2 * r + 1]);
        }
    }
    // ---- the state rows: S ← e^{G_C} S + Σ_j (e^{G_C−G_j} k_j) u_jᵀ, then their split copy ----
    if (has_rows) {
      const float eC = Fc[2 * kC];
      float sc[kNC / 8][4] = {};
#pragma unroll
      for (int nn = 0; nn < kNC / 8; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nn][e] *= eC;
#pragma unroll
      for (int ks = 0; ks < kC / 8; ++ks) {
        // A(m = row r, k = token j) = e^{G_C−G_j} k_j[r]
        const int j0 = 8 * ks + q, j1 = j0 + 4;
        const float e0 = Fc[kC + j0], e1 = Fc[kC + j1];
        const float* k0p = Kc + j0 * L.ks + r0 + g;
        const float* k1p = Kc + j1 * L.ks + r0 + g;
        const FragA a = frag_a(e0 * k0p[0], e0 * k0p[8], e1 * k1p[0], e1 * k1p[8]);
#pragma unroll
        for (int nn = 0; nn < kNC / 8; ++nn)
          mma3(st[nn], sc[nn], a, load_b_split(Uhi, Ulo, kSS, 8 * ks, 8 * nn, g, q));
      }
#pragma unroll
      for (int nn = 0; nn < kNC / 8; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nn][e] += sc[nn][e];
      put_state();
    }
  }
  if (has_rows)
#pragma unroll
    for (int nn = 0; nn < kNC / 8; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = r0 + g + 8 * (e >> 1), col = col0 + 8 * nn + 2 * q + (e & 1);
        if (col < d_v) Sg[static_cast<int64_t>(row) * d_v + col] = st[nn][e];
      }
  if (p.qkv) {  // the conv state: the last taps-1 inputs (t >= taps-1); key head h's by block (h, 0)
    const int64_t first = static_cast<int64_t>(p.t - (p.taps - 1)) * width;
    for (int j = 0; j < p.taps - 1; ++j) {
      const float* xj = p.qkv + first + j * width;
      float* stc = p.conv_state + static_cast<int64_t>(j) * width;
      if (h < p.n_k && blockIdx.y == 0)
        for (int e = tid; e < 2 * d_k; e += kThreads) {
          const int64_t off = (e < d_k ? 0 : qk) + static_cast<int64_t>(hk) * d_k + (e < d_k ? e : e - d_k);
          stc[off] = xj[off];
        }
      for (int c = tid; c < kNC; c += kThreads)
        if (col0 + c < d_v) {
          const int64_t cc = 2 * qk + static_cast<int64_t>(h) * d_v + col0 + c;
          stc[cc] = xj[cc];
        }
    }
  }
}

// The opt-in shared memory of one block on sm_90 (227 KB).
constexpr size_t kSmemMax = 227 * 1024;

}  // namespace

bool gdn_walk_tc2_supported(const GdnFused& p) {
  return (p.d_k == 32 || p.d_k == 64 || p.d_k == 128) && p.d_v % 32 == 0 && p.t >= 1 &&
         WalkSmem(p.d_k).total * sizeof(float) <= kSmemMax &&
         PrepSmem(p.d_k, p.d_v).total * sizeof(float) <= kSmemMax &&
         reinterpret_cast<uintptr_t>(p.conv) % 16 == 0 && reinterpret_cast<uintptr_t>(p.out) % 8 == 0;
}

size_t gdn_walk_tc2_scratch_floats(const GdnFused& p) {
  return static_cast<size_t>(p.n_v) * ((p.t + kC - 1) / kC) * static_cast<size_t>(chunk_floats(p.d_k, p.d_v));
}

namespace {

template <int DK>
void launch_tc2(const GdnFused& p, cudaStream_t s) {
  const PrepSmem lp(p.d_k, p.d_v);
  const WalkSmem lw(p.d_k);
  const size_t sp = lp.total * sizeof(float), sw = lw.total * sizeof(float);
  cudaFuncSetAttribute(gdn_tc2_prep_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(sp));
  cudaFuncSetAttribute(gdn_tc2_walk_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(sw));
  launch(gdn_tc2_prep_kernel<DK>,
         dim3(static_cast<unsigned>(p.n_v), static_cast<unsigned>((p.t + kC - 1) / kC)),
         static_cast<unsigned>(kThreads), sp, s, p, lp);
  launch(gdn_tc2_walk_kernel<DK>,
         dim3(static_cast<unsigned>(p.n_v), static_cast<unsigned>((p.d_v + kNC - 1) / kNC)),
         static_cast<unsigned>(kThreads), sw, s, p, lw);
}

}  // namespace

void gdn_walk_tc2(const GdnFused& p, cudaStream_t s) {
  if (p.d_k == 32) return launch_tc2<32>(p, s);
  if (p.d_k == 64) return launch_tc2<64>(p, s);
  launch_tc2<128>(p, s);
}

}  // namespace bonsai::cuda
