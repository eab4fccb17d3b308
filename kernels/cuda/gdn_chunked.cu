// Prefill: the gated delta rule over t tokens in the chunked (WY) form, the CUDA counterpart of
// kernels/cpu/gdn_chunked.h (whose header derives it). Per chunk of C = 32 tokens, with S0 the
// state at the chunk start, G_i the cumulative log-decay inside the chunk and β_i the gates:
//     u_i + Σ_{j<i} β_i e^{G_i−G_j} (k_i·k_j) u_j = β_i (v_i − e^{G_i} S0ᵀk_i)   (forward substitution)
//     o_i = e^{G_i} S0ᵀq_i + Σ_{j≤i} e^{G_i−G_j} (k_j·q_i) u_j
//     S_C = e^{G_C} S0 + Σ_j k_j (e^{G_C−G_j} u_j)ᵀ
// so the per-token chain of the walk (s'k over 32 rows, a barrier, the update) becomes per chunk
// independent products: S0ᵀ[k;q] for all 32 tokens at once, the substitution (a chain over the
// tokens, but per column and without barriers), the outputs and one state update.
// Numerics: fp32 throughout, as the CPU's chunked form; decays only as e^{G_i−G_j}, j <= i (<= 1).
// The results equal the token walk's up to summation order (tests/test_backend_cuda_wy.cpp).
//
// Block per (value head h, W = 32·CS state columns), CS·d_k threads: thread (warp, lane) holds
// rows 32·rg..32·rg+31 of one column in registers, rg = lane % RG (RG = d_k/32 row groups side
// by side in a warp, so the sums over rows are warp shuffles), local column
// lc = 32·(warp / RG) + (warp % RG)·(32/RG) + lane/RG. Per chunk, four phases between barriers:
//   P1  the chunk's gates and prefix sum G (last warp); the raw k_i·k_j, q_i·k_j (j <= i) over
//       4x4 token tiles split into RG 32-row segments (all threads); S0ᵀk_i, S0ᵀq_i (all).
//   P2  the dot matrices gated: A[i][j] = β_i e^{G_i−G_j} k_i·k_j, KQ[i][j] = e^{G_i−G_j} q_i·k_j.
//   P3  per column (threads < W): u from v, β, e^{G}·S0ᵀk, the forward substitution.
//   P4  the state update (all) and the outputs o_i (all: tokens rg, rg+RG, ...).
// The inputs of the next chunk are staged by cp.async during the current one (two buffers).
//
// Not the default (BONSAI_CUDA_WALK=3|4): one 27B layer at t = 256 takes 189 µs (=4) / 207 µs
// (=3) on the H200 against the chunked walk's 98.7 µs (docs/performance.md, "What limits it",
// Prefill). Likely limit (not profiled): shared-memory wavefronts. With the row groups side by
// side in a warp, a warp's 16-byte k/q reads hit RG distinct addresses, so S0ᵀk / S0ᵀq and the
// update move RG times the operand bytes per FMA of the walk's layout (row group = warp, pure
// broadcasts); the next step is that layout with the partial sums reduced through shared memory
// once per chunk (one barrier for 32 tokens instead of one per token).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace bonsai::cuda {
namespace {

constexpr int kC = 32;                               // tokens per chunk
constexpr int kTiles = (kC / 4) * (kC / 4 + 1) / 2;  // 4x4 token tiles on and below the diagonal
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Shared memory in floats. Two stage buffers, each q|k [C][QS] as 2·RG segments of 32 rows
// (q's then k's), each followed by 4 floats of pad (SEG = 36: the RG segments a warp reads at
// once, and the tiles' segments, lie in distinct banks; QS = 2·RG·SEG + 4 puts consecutive
// tokens 16 bytes apart), v [C][W], raw gates [2][C]; then G, β, e^{G}, e^{G_C−G} [C] each and
// e^{G_C}; A transposed [C][AS] (rows 16-byte aligned for the substitution's float4 reads),
// KQ [C][C+1]; S0ᵀk, S0ᵀq, u, e^{G_C−G}·u [C][WS] (WS = W + 8). The raw dots [2][C][C+1]
// alias u | ud: they are read in P2, u is written in P3.
struct WySmem {
  static constexpr int AS = kC + 4, DS = kC + 1, SEG = 36;
  int qs, ws, buf, gates, at, kq, sk, sq, u, ud, kkr, kqr, total;
  __host__ __device__ WySmem(int d_k, int w) {
    qs = 2 * (d_k / 32) * SEG + 4;
    ws = w + 8;
    buf = kC * qs + kC * w + 2 * kC;
    gates = 2 * buf;
    at = gates + 4 * kC + 4;
    kq = at + kC * AS;
    sk = kq + kC * DS + 3;  // 16-byte aligned rows below (ws, w multiples of 4)
    sk -= sk % 4;
    sq = sk + kC * ws;
    u = sq + kC * ws;
    ud = u + kC * ws;
    kkr = u;
    kqr = u + kC * DS;
    total = ud + kC * ws;
  }
};

template <int CS, int RG>
__global__ void __launch_bounds__(32 * RG * CS) gdn_wy_kernel(GdnFused p) {
  extern __shared__ __align__(16) float sm[];
  pdl_trigger();
  pdl_wait();
  constexpr int W = 32 * CS, nthr = 32 * RG * CS, d_k = 32 * RG, CPW = 32 / RG;  // columns per warp
  constexpr int SEG = WySmem::SEG;
  const int d_v = p.d_v, h = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rg = lane % RG, lc = 32 * (warp / RG) + (warp % RG) * CPW + lane / RG;  // local column
  const int hk = h % p.n_k, col0 = blockIdx.y * W, col = col0 + lc;
  const int64_t qk = static_cast<int64_t>(p.n_k) * d_k, width = 2 * qk + static_cast<int64_t>(p.n_v) * d_v;
  const WySmem L(d_k, W);
  float* Gs = sm + L.gates;
  float* Bs = Gs + kC;
  float* eG = Bs + kC;
  float* dC = eG + kC;
  float* eGC = dC + kC;
  float* At = sm + L.at;
  float* KQ = sm + L.kq;
  float* SK = sm + L.sk;
  float* SQ = sm + L.sq;
  float* U = sm + L.u;
  float* Ud = sm + L.ud;
  float* KKr = sm + L.kkr;
  float* KQr = sm + L.kqr;
  const float* ga_src = p.alpha ? p.alpha : p.g;
  const float* gb_src = p.alpha ? p.beta_in : p.beta;
  const float ssm_a = p.alpha ? p.ssm_a[h] : 0.0f, dt_bias = p.alpha ? p.dt_bias[h] : 0.0f;

  float* S = p.state + static_cast<int64_t>(h) * d_k * d_v;
  float s[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) s[j] = col < d_v ? S[static_cast<int64_t>(rg * 32 + j) * d_v + col] : 0.0f;

  // Tokens base..base+nt-1 into stage buffer b (as gdn_walk_chunk_kernel stages them).
  auto stage = [&](int base, int b) {
    const int nt = min(kC, p.t - base);
    const uint32_t buf = smem_addr(sm + b * L.buf);
    constexpr int pieces = d_k / 2, qpieces = d_k / 4;
    for (int idx = tid; idx < nt * pieces; idx += nthr) {
      const int j = idx / pieces, e = idx - j * pieces;  // piece e: segment e / 8
      const float* row = p.conv + static_cast<int64_t>(base + j) * width + hk * d_k;
      cp16(buf + (j * L.qs + (e / 8) * SEG + 4 * (e % 8)) * 4,
           e < qpieces ? row + 4 * e : row + qk + 4 * (e - qpieces), 16);
    }
    constexpr int vpieces = W / 4;
    for (int idx = tid; idx < nt * vpieces; idx += nthr) {
      const int j = idx / vpieces, e = idx - j * vpieces, cv = col0 + 4 * e;
      const float* row =
          p.conv + static_cast<int64_t>(base + j) * width + 2 * qk + static_cast<int64_t>(h) * d_v;
      cp16(buf + (kC * L.qs + j * W + 4 * e) * 4, row + (cv < d_v ? cv : 0), cv < d_v ? 16 : 0);
    }
    for (int idx = tid; idx < 2 * nt; idx += nthr) {
      const int j = idx < nt ? idx : idx - nt;
      const int64_t ih = static_cast<int64_t>(base + j) * p.n_v + h;
      cp4(buf + (kC * L.qs + kC * W + (idx < nt ? j : kC + j)) * 4, (idx < nt ? ga_src : gb_src) + ih);
    }
    cp_commit();
  };

  stage(0, 0);
  for (int base = 0, n = 0; base < p.t; base += kC, ++n) {
    const int nt = min(kC, p.t - base);
    const float* qkc = sm + (n & 1) * L.buf;
    const float* vc = qkc + kC * L.qs;
    const float* graw = vc + kC * W;
    cp_wait();
    __syncthreads();  // chunk n has landed; every thread is done with chunk n-1
    if (base + kC < p.t) stage(base + kC, (n + 1) & 1);

    // ---- P1: gates (last warp), raw dots (tiles), S0ᵀk and S0ᵀq (all) -----------------------
    if (warp == nthr / 32 - 1) {
      float gl = 0.0f, b = 0.0f;  // tokens past nt: no decay, no update
      if (lane < nt) {
        const float ga = graw[lane], gb = graw[kC + lane];
        if (p.alpha) {
          gl = ssm_a * softplus(ga + dt_bias);
          b = sigmoid(gb);
        } else {
          gl = ga;
          b = gb;
        }
      }
      float G = gl;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const float o = __shfl_up_sync(kFull, G, off);
        if (lane >= off) G += o;
      }
      const float Gl = __shfl_sync(kFull, G, nt - 1);
      Gs[lane] = G;
      Bs[lane] = b;
      eG[lane] = expf(G);
      dC[lane] = expf(Gl - G);
      if (lane == 0) eGC[0] = expf(Gl);
    }
    // Tile tasks: (tile, segment) with the RG segments of a tile in adjacent lanes; the rounds
    // are uniform per warp (the shuffles need every lane), tasks past the end compute tile 0.
    for (int w0 = warp * 32; w0 < kTiles * RG; w0 += nthr) {
      const int task = w0 + lane, seg = task % RG;
      const bool valid = task < kTiles * RG;
      const int tile = valid ? task / RG : 0;
      int ti = 0;
      while ((ti + 1) * (ti + 2) / 2 <= tile) ++ti;
      const int tj = tile - ti * (ti + 1) / 2;
      float kk[4][4], kq[4][4];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) kk[r][c] = kq[r][c] = 0.0f;
      const float* qi0 = qkc + 4 * ti * L.qs + seg * SEG;
      const float* kj0 = qkc + 4 * tj * L.qs + (RG + seg) * SEG;
#pragma unroll 2
      for (int e = 0; e < 8; ++e) {
        float4 qi[4], ki[4], kj[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          qi[r] = reinterpret_cast<const float4*>(qi0 + r * L.qs)[e];
          ki[r] = reinterpret_cast<const float4*>(qi0 + r * L.qs + RG * SEG)[e];
          kj[r] = reinterpret_cast<const float4*>(kj0 + r * L.qs)[e];
        }
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            kk[r][c] += ki[r].x * kj[c].x;
            kk[r][c] += ki[r].y * kj[c].y;
            kk[r][c] += ki[r].z * kj[c].z;
            kk[r][c] += ki[r].w * kj[c].w;
            kq[r][c] += qi[r].x * kj[c].x;
            kq[r][c] += qi[r].y * kj[c].y;
            kq[r][c] += qi[r].z * kj[c].z;
            kq[r][c] += qi[r].w * kj[c].w;
          }
      }
#pragma unroll
      for (int off = 1; off < RG; off <<= 1)
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            kk[r][c] += __shfl_xor_sync(kFull, kk[r][c], off);
            kq[r][c] += __shfl_xor_sync(kFull, kq[r][c], off);
          }
      if (valid && seg == 0)
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            KKr[(4 * ti + r) * WySmem::DS + 4 * tj + c] = kk[r][c];
            KQr[(4 * ti + r) * WySmem::DS + 4 * tj + c] = kq[r][c];
          }
    }
    // S0ᵀk_i and S0ᵀq_i: the thread's 32 rows, then the RG row groups summed across lanes.
#pragma unroll 2
    for (int i = 0; i < nt; ++i) {
      const float4* k4 = reinterpret_cast<const float4*>(qkc + i * L.qs + (RG + rg) * SEG);
      const float4* q4 = reinterpret_cast<const float4*>(qkc + i * L.qs + rg * SEG);
      float pk = 0.0f, pq = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float4 kv = k4[e], qv = q4[e];
        const float kk[4] = {kv.x, kv.y, kv.z, kv.w}, qq[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          pk += s[4 * e + u] * kk[u];
          pq += s[4 * e + u] * qq[u];
        }
      }
#pragma unroll
      for (int off = 1; off < RG; off <<= 1) {
        pk += __shfl_xor_sync(kFull, pk, off);
        pq += __shfl_xor_sync(kFull, pq, off);
      }
      if (rg == 0) {
        SK[i * L.ws + lc] = pk;
        SQ[i * L.ws + lc] = pq;
      }
    }
    __syncthreads();

    // ---- P2: gated dot matrices (zero above the diagonal and past nt) ------------------------
    for (int e = tid; e < kC * kC; e += nthr) {
      const int i = e / kC, j = e - i * kC;
      float a = 0.0f, w = 0.0f;
      if (i < nt && j <= i) {
        const float d = expf(Gs[i] - Gs[j]);
        w = d * KQr[i * WySmem::DS + j];
        if (j < i) a = Bs[i] * d * KKr[i * WySmem::DS + j];
      }
      At[j * WySmem::AS + i] = a;
      KQ[i * WySmem::DS + j] = w;
    }
    __syncthreads();

    // ---- P3: per column, u = β(v − e^{G}·S0ᵀk), then u_i -= Σ_{j<i} A[i][j] u_j ---------------
    if (tid < W) {
      float u[kC];
#pragma unroll
      for (int i = 0; i < kC; ++i)
        u[i] = i < nt ? Bs[i] * (vc[i * W + tid] - eG[i] * SK[i * L.ws + tid]) : 0.0f;
#pragma unroll
      for (int j = 0; j < kC - 1; ++j) {
#pragma unroll
        for (int g4 = (j + 1) / 4; g4 < kC / 4; ++g4) {
          const float4 a = reinterpret_cast<const float4*>(At + j * WySmem::AS)[g4];
          const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
          for (int q = 0; q < 4; ++q)
            if (4 * g4 + q > j) u[4 * g4 + q] -= av[q] * u[j];
        }
      }
#pragma unroll
      for (int j = 0; j < kC; ++j) {
        U[j * L.ws + tid] = u[j];
        Ud[j * L.ws + tid] = dC[j] * u[j];
      }
    }
    __syncthreads();

    // ---- P4: S = e^{G_C} S0 + Σ_j k_j ud_jᵀ; o_i = e^{G_i} S0ᵀq_i + Σ_{j≤i} KQ[i][j] u_j ---------
    const float gC = eGC[0];
#pragma unroll
    for (int j = 0; j < 32; ++j) s[j] *= gC;
#pragma unroll 2
    for (int j = 0; j < nt; ++j) {
      const float4* k4 = reinterpret_cast<const float4*>(qkc + j * L.qs + (RG + rg) * SEG);
      const float ud = Ud[j * L.ws + lc];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float4 kv = k4[e];
        s[4 * e] += kv.x * ud;
        s[4 * e + 1] += kv.y * ud;
        s[4 * e + 2] += kv.z * ud;
        s[4 * e + 3] += kv.w * ud;
      }
    }
    for (int i = rg; i < nt; i += RG) {
      const float* kqi = KQ + i * WySmem::DS;
      float o = eG[i] * SQ[i * L.ws + lc];
#pragma unroll 4
      for (int j = 0; j <= i; ++j) o += kqi[j] * U[j * L.ws + lc];
      if (col < d_v) p.out[(static_cast<int64_t>(base + i) * p.n_v + h) * d_v + col] = o;
    }
  }

  if (col < d_v)
#pragma unroll
    for (int j = 0; j < 32; ++j) S[static_cast<int64_t>(rg * 32 + j) * d_v + col] = s[j];
  if (p.qkv) {  // the conv state: the last taps-1 inputs (t >= taps-1); key head hk's by block hk
    const int64_t first = static_cast<int64_t>(p.t - (p.taps - 1)) * width;
    for (int j = 0; j < p.taps - 1; ++j) {
      const float* xj = p.qkv + first + j * width;
      float* st = p.conv_state + static_cast<int64_t>(j) * width;
      if (h < p.n_k && blockIdx.y == 0 && tid < d_k) {
        st[hk * d_k + tid] = xj[hk * d_k + tid];
        st[qk + hk * d_k + tid] = xj[qk + hk * d_k + tid];
      }
      if (tid < W && col0 + tid < d_v) {
        const int64_t cc = 2 * qk + static_cast<int64_t>(h) * d_v + col0 + tid;
        st[cc] = xj[cc];
      }
    }
  }
}

template <int CS, int RG>
void launch_wy(const GdnFused& p, size_t smem, cudaStream_t s) {
  cudaFuncSetAttribute(gdn_wy_kernel<CS, RG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem));
  launch(gdn_wy_kernel<CS, RG>,
         dim3(static_cast<unsigned>(p.n_v), static_cast<unsigned>((p.d_v + 32 * CS - 1) / (32 * CS))),
         static_cast<unsigned>(32 * RG * CS), smem, s, p);
}

template <int CS>
void launch_wy_rg(const GdnFused& p, size_t smem, cudaStream_t s) {
  switch (p.d_k) {
    case 32:
      return launch_wy<CS, 1>(p, smem, s);
    case 64:
      return launch_wy<CS, 2>(p, smem, s);
    case 128:
      return launch_wy<CS, 4>(p, smem, s);
    default:
      return launch_wy<CS, 8>(p, smem, s);
  }
}

// The opt-in shared memory of one block on sm_90 (227 KB).
constexpr size_t kWySmemMax = 227 * 1024;

}  // namespace

bool gdn_walk_wy_supported(const GdnFused& p, int cs) {
  const bool dk_ok = p.d_k == 32 || p.d_k == 64 || p.d_k == 128 || p.d_k == 256;
  return dk_ok && p.d_v % 32 == 0 && (cs == 1 || cs == 2) &&
         WySmem(p.d_k, 32 * cs).total * sizeof(float) <= kWySmemMax &&
         reinterpret_cast<uintptr_t>(p.conv) % 16 == 0;
}

void gdn_walk_wy(const GdnFused& p, cudaStream_t s, int cs) {
  const size_t smem = WySmem(p.d_k, 32 * cs).total * sizeof(float);
  cs == 2 ? launch_wy_rg<2>(p, smem, s) : launch_wy_rg<1>(p, smem, s);
}

}  // namespace bonsai::cuda
