// Plain loops written so the compiler vectorises the d_v-contiguous inner
// loops (this file is built with AVX2/FMA).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/gdn_chunked.h"

namespace bonsai::cpu {

void gdn_recurrence_chunked(const float* conv, const float* g, const float* beta, float* state, float* out,
                            int t, const GdnShape& s, int chunk, ThreadPool& pool) {
  const int dk = s.d_k, dv = s.d_v;
  const int64_t qk = static_cast<int64_t>(s.n_k) * dk;
  const int64_t width = 2 * qk + static_cast<int64_t>(s.n_v) * dv;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  pool.parallel_for(s.n_v, [&](int64_t h, int) {
    const int hk = static_cast<int>(h % s.n_k);
    float* S = state + h * dk * dv;
    std::vector<float> Q(static_cast<size_t>(chunk) * dk), K(Q.size()), U(static_cast<size_t>(chunk) * dv),
        SQ(U.size()), G(chunk), B(chunk), A(static_cast<size_t>(chunk) * chunk), KQ(A.size());
    for (int c0 = 0; c0 < t; c0 += chunk) {
      const int C = std::min(chunk, t - c0);
      // Normalised q, k; cumulative decay; β.
      for (int i = 0; i < C; ++i) {
        const float* ci = conv + static_cast<int64_t>(c0 + i) * width;
        for (int which = 0; which < 2; ++which) {
          const float* src = ci + which * qk + hk * dk;
          float ss = 0;
          for (int a = 0; a < dk; ++a) ss += src[a] * src[a];
          const float sc = (which == 0 ? q_scale : 1.0f) / std::max(std::sqrt(ss), s.eps);
          float* dst = (which == 0 ? Q.data() : K.data()) + static_cast<size_t>(i) * dk;
          for (int a = 0; a < dk; ++a) dst[a] = src[a] * sc;
        }
        G[i] = (i ? G[i - 1] : 0.0f) + g[static_cast<int64_t>(c0 + i) * s.n_v + h];
        B[i] = beta[static_cast<int64_t>(c0 + i) * s.n_v + h];
      }
      // U_t = β_t (v_t − e^{G_t} S0ᵀ k_t), SQ_t = e^{G_t} S0ᵀ q_t  (one sweep over S0 per token).
      for (int i = 0; i < C; ++i) {
        float* u = U.data() + static_cast<size_t>(i) * dv;
        float* sq = SQ.data() + static_cast<size_t>(i) * dv;
        std::fill(u, u + dv, 0.0f);
        std::fill(sq, sq + dv, 0.0f);
        const float* ki = K.data() + static_cast<size_t>(i) * dk;
        const float* qi = Q.data() + static_cast<size_t>(i) * dk;
        for (int a = 0; a < dk; ++a) {
          const float* Sa = S + static_cast<int64_t>(a) * dv;
          const float ka = ki[a], qa = qi[a];
          for (int e = 0; e < dv; ++e) {
            u[e] += Sa[e] * ka;
            sq[e] += Sa[e] * qa;
          }
        }
        const float gi = std::exp(G[i]);
        const float* v = conv + static_cast<int64_t>(c0 + i) * width + 2 * qk + h * dv;
        for (int e = 0; e < dv; ++e) {
          u[e] = B[i] * (v[e] - gi * u[e]);
          sq[e] *= gi;
        }
      }
      // A[i][j] = β_i e^{G_i−G_j} k_i·k_j (j < i); KQ[i][j] = e^{G_i−G_j} k_j·q_i (j ≤ i).
      for (int i = 0; i < C; ++i)
        for (int j = 0; j <= i; ++j) {
          const float* ki = K.data() + static_cast<size_t>(i) * dk;
          const float* kj = K.data() + static_cast<size_t>(j) * dk;
          const float* qi = Q.data() + static_cast<size_t>(i) * dk;
          float kk = 0, kq = 0;
          for (int a = 0; a < dk; ++a) {
            kk += ki[a] * kj[a];
            kq += kj[a] * qi[a];
          }
          const float decay = std::exp(G[i] - G[j]);
          A[static_cast<size_t>(i) * chunk + j] = B[i] * decay * kk;
          KQ[static_cast<size_t>(i) * chunk + j] = decay * kq;
        }
      // Forward substitution: u_i -= Σ_{j<i} A[i][j] u_j.
      for (int i = 1; i < C; ++i) {
        float* ui = U.data() + static_cast<size_t>(i) * dv;
        for (int j = 0; j < i; ++j) {
          const float aij = A[static_cast<size_t>(i) * chunk + j];
          const float* uj = U.data() + static_cast<size_t>(j) * dv;
          for (int e = 0; e < dv; ++e) ui[e] -= aij * uj[e];
        }
      }
      // Outputs.
      for (int i = 0; i < C; ++i) {
        float* o = out + (static_cast<int64_t>(c0 + i) * s.n_v + h) * dv;
        const float* sq = SQ.data() + static_cast<size_t>(i) * dv;
        std::copy(sq, sq + dv, o);
        for (int j = 0; j <= i; ++j) {
          const float w = KQ[static_cast<size_t>(i) * chunk + j];
          const float* uj = U.data() + static_cast<size_t>(j) * dv;
          for (int e = 0; e < dv; ++e) o[e] += w * uj[e];
        }
      }
      // State: S = e^{G_C} S0 + Σ_j e^{G_C−G_j} k_j u_jᵀ (one read-modify-write sweep).
      const float gC = std::exp(G[C - 1]);
      for (int a = 0; a < dk; ++a) {
        float* Sa = S + static_cast<int64_t>(a) * dv;
        for (int e = 0; e < dv; ++e) Sa[e] *= gC;
        for (int j = 0; j < C; ++j) {
          const float w = std::exp(G[C - 1] - G[j]) * K[static_cast<size_t>(j) * dk + a];
          const float* uj = U.data() + static_cast<size_t>(j) * dv;
          for (int e = 0; e < dv; ++e) Sa[e] += w * uj[e];
        }
      }
    }
  });
}

}  // namespace bonsai::cpu
