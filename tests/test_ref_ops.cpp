// Reference ops against straightforward math (explicit matrices, closed forms).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "bonsai/formats.h"
#include "kernels/ref/fwht.h"
#include "kernels/ref/ops.h"

#include "test_util.h"

namespace bonsai {
namespace {

using testing_util::randn;

std::vector<float> signs(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> s(n);
  for (auto& x : s) x = (rng() & 1) ? 1.0f : -1.0f;
  return s;
}

// Explicit blockwise R = H_B·S/√B applied as a dense matrix, in double.
std::vector<double> dense_forward(const std::vector<float>& x, const std::vector<float>& s, int64_t B) {
  std::vector<double> y(x.size(), 0.0);
  for (size_t b0 = 0; b0 < x.size(); b0 += B)
    for (int64_t r = 0; r < B; ++r)
      for (int64_t c = 0; c < B; ++c) {
        double h = (std::popcount(static_cast<uint64_t>(r & c)) & 1) ? -1.0 : 1.0;
        y[b0 + r] += h * s[b0 + c] * x[b0 + c] / std::sqrt(static_cast<double>(B));
      }
  return y;
}

TEST(RefOps, HadamardMatchesExplicitMatrix) {
  for (int64_t B : {2, 8, 128}) {
    const int64_t K = 3 * B;
    auto x = randn(K, 1), s = signs(K, 2);
    std::vector<float> y(K);
    ref::hadamard(x.data(), s.data(), y.data(), 1, K, B, false);
    auto want = dense_forward(x, s, B);
    // FWHT: log2(B) stages, each adds/subtracts two values: error <= log2(B)·ε·Σ|x| / √B.
    for (int64_t i = 0; i < K; ++i) EXPECT_NEAR(y[i], want[i], 1e-5) << B << " " << i;
    // Inverse (transform first, then sign) undoes forward exactly up to rounding.
    std::vector<float> back(K);
    ref::hadamard(y.data(), s.data(), back.data(), 1, K, B, true);
    for (int64_t i = 0; i < K; ++i) EXPECT_NEAR(back[i], x[i], 1e-5);
  }
}

TEST(RefOps, FoldedLinearEqualsExplicitUnfoldedLinear) {
  // y = W_stored · R x must equal (W_stored · R) x with R explicit.
  const int64_t K = 256, N = 7, B = 128;
  std::mt19937 rng(3);
  std::vector<uint8_t> codes(K * N);
  for (auto& c : codes) c = rng() % 3;
  std::vector<float> scales(K * N / 128, 0.02f);
  std::vector<uint8_t> bytes(row_bytes(DType::PQ2_0, K) * N);
  encode_ternary_row(DType::PQ2_0, codes.data(), scales.data(), bytes.data(), K * N);
  Weight w;
  w.type = DType::PQ2_0;
  w.k = K;
  w.n = N;
  w.data = bytes.data();
  auto x = randn(K, 4), s = signs(K, 5);
  std::vector<float> xr(K), y(N);
  ref::hadamard(x.data(), s.data(), xr.data(), 1, K, B, false);
  ref::matmul(w, xr.data(), y.data(), 1);
  for (int64_t n = 0; n < N; ++n) {
    // Unfolded row u = Rᵀ w = s ⊙ H w / √B; y = u · x.
    std::vector<float> row(K);
    dequantize_row(DType::PQ2_0, bytes.data() + n * row_bytes(DType::PQ2_0, K), row.data(), K);
    double acc = 0;
    for (int64_t b0 = 0; b0 < K; b0 += B)
      for (int64_t c = 0; c < B; ++c) {
        double u = 0;
        for (int64_t r = 0; r < B; ++r)
          u += ((std::popcount(static_cast<uint64_t>(r & c)) & 1) ? -1.0 : 1.0) * row[b0 + r];
        acc += s[b0 + c] * u / std::sqrt(static_cast<double>(B)) * x[b0 + c];
      }
    EXPECT_NEAR(y[n], acc, 1e-4) << n;
  }
}

TEST(RefOps, RmsNorm) {
  auto x = randn(2 * 40, 6), g = randn(40, 7);
  std::vector<float> y(80);
  ref::rmsnorm(x.data(), g.data(), y.data(), 2, 40, 1e-6f);
  for (int r = 0; r < 2; ++r) {
    double ss = 0;
    for (int i = 0; i < 40; ++i) ss += double(x[r * 40 + i]) * x[r * 40 + i];
    double sc = 1.0 / std::sqrt(ss / 40 + 1e-6);
    for (int i = 0; i < 40; ++i) EXPECT_NEAR(y[r * 40 + i], x[r * 40 + i] * sc * g[i], 1e-5);
  }
}

TEST(RefOps, RopeRotatesPairsAndLeavesTheRest) {
  const int D = 16, R = 8, H = 2;
  auto x = randn(H * D, 8);
  auto y = x;
  const int pos = 5;
  const float base = 1e4f;
  ref::rope(y.data(), 1, H, D, R, base, pos);
  for (int h = 0; h < H; ++h) {
    for (int j = 0; j < R / 2; ++j) {
      double th = pos * std::pow(double(base), -2.0 * j / R);
      double a = x[h * D + j], b = x[h * D + j + R / 2];
      EXPECT_NEAR(y[h * D + j], a * std::cos(th) - b * std::sin(th), 1e-5);
      EXPECT_NEAR(y[h * D + j + R / 2], a * std::sin(th) + b * std::cos(th), 1e-5);
    }
    for (int j = R; j < D; ++j) EXPECT_EQ(y[h * D + j], x[h * D + j]);
  }
  auto z = x;
  ref::rope(z.data(), 1, H, D, R, base, 0);
  EXPECT_EQ(z, x);  // position 0 is the identity
}

TEST(RefOps, AttentionMatchesSoftmaxInDouble) {
  AttentionShape s{4, 2, 8, 0.35f};
  const int P = 5;  // cached positions
  auto kc = randn(P * 2 * 8, 9), vc = randn(P * 2 * 8, 10), q = randn(2 * 4 * 8, 11);
  std::vector<float> out(2 * 4 * 8);
  ref::attention(q.data(), kc.data(), vc.data(), out.data(), 2, P - 2, s);
  for (int i = 0; i < 2; ++i)
    for (int h = 0; h < 4; ++h) {
      const int hk = h / 2, n = P - 2 + i + 1;
      std::vector<double> w(n);
      double mx = -1e300, sum = 0;
      for (int p = 0; p < n; ++p) {
        double d = 0;
        for (int e = 0; e < 8; ++e) d += double(q[(i * 4 + h) * 8 + e]) * kc[(p * 2 + hk) * 8 + e];
        w[p] = d * s.scale;
        mx = std::max(mx, w[p]);
      }
      for (auto& v : w) sum += (v = std::exp(v - mx));
      for (int e = 0; e < 8; ++e) {
        double o = 0;
        for (int p = 0; p < n; ++p) o += w[p] / sum * vc[(p * 2 + hk) * 8 + e];
        EXPECT_NEAR(out[(i * 4 + h) * 8 + e], o, 1e-5);
      }
    }
}

TEST(RefOps, ConvIsCausalOverTheLastTaps) {
  const int C = 3, taps = 4, T = 6;
  auto x = randn(T * C, 12), w = randn(C * taps, 13);
  std::vector<float> state((taps - 1) * C, 0.0f), out(T * C);
  // Feed in two calls to exercise the carried state.
  ref::ssm_conv(x.data(), state.data(), w.data(), out.data(), 2, C, taps);
  ref::ssm_conv(x.data() + 2 * C, state.data(), w.data(), out.data() + 2 * C, T - 2, C, taps);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) {
      double acc = 0;
      for (int j = 0; j < taps; ++j) {
        int src = t - (taps - 1) + j;
        if (src >= 0) acc += double(w[c * taps + j]) * x[src * C + c];
      }
      EXPECT_NEAR(out[t * C + c], acc / (1 + std::exp(-acc)), 1e-5);
    }
}

TEST(RefOps, DeltaRuleStoresAndOverwritesAnAssociation) {
  // With decay 1 (g = 0) and β = 1, one step from a zero state stores v under key k:
  // o = Sᵀq = (k·q̂) v. A second step with the same key replaces v1 by v2 exactly.
  GdnShape s{1, 1, 8, 4, 1e-6f};
  const int W = 2 * 8 + 4;
  auto k = randn(8, 14);
  std::vector<float> conv(2 * W);
  for (int t = 0; t < 2; ++t) {
    for (int e = 0; e < 8; ++e) conv[t * W + e] = k[e];      // q = k
    for (int e = 0; e < 8; ++e) conv[t * W + 8 + e] = k[e];  // k
  }
  auto v1 = randn(4, 15), v2 = randn(4, 16);
  for (int e = 0; e < 4; ++e) conv[16 + e] = v1[e], conv[W + 16 + e] = v2[e];
  std::vector<float> g(2, 0.0f), beta(2, 1.0f), state(8 * 4, 0.0f), out(2 * 4);
  ref::gdn_recurrence(conv.data(), g.data(), beta.data(), state.data(), out.data(), 2, s);
  // q̂ = k̂/√8, so k̂·q̂ = 1/√8.
  for (int e = 0; e < 4; ++e) {
    EXPECT_NEAR(out[e], v1[e] / std::sqrt(8.0), 1e-5);
    EXPECT_NEAR(out[4 + e], v2[e] / std::sqrt(8.0), 1e-5);
  }
  // Decay: g = log(0.5) halves the old state before the update.
  std::vector<float> st2(8 * 4, 0.0f), o2(4);
  std::vector<float> gg{std::log(0.5f)}, bb{0.0f};  // β = 0: no write, only decay
  ref::gdn_recurrence(conv.data(), gg.data(), bb.data(), state.data(), o2.data(), 1, s);
  for (int e = 0; e < 4; ++e) EXPECT_NEAR(o2[e], 0.5 * v2[e] / std::sqrt(8.0), 1e-5);
}

TEST(RefOps, TransposeHeadsTiledToGrouped) {
  // tiled head t = r·n_k + k -> grouped g = k·rep + r, rep = 3, n_k = 2, d = 2.
  const int rep = 3, nk = 2, d = 2;
  std::vector<float> x(rep * nk * d), y(x.size());
  for (int t = 0; t < rep * nk; ++t)
    for (int e = 0; e < d; ++e) x[t * d + e] = float(t * 10 + e);
  ref::transpose_heads(x.data(), y.data(), 1, rep, nk, d);
  for (int r = 0; r < rep; ++r)
    for (int k = 0; k < nk; ++k)
      for (int e = 0; e < d; ++e) EXPECT_EQ(y[(k * rep + r) * d + e], x[(r * nk + k) * d + e]);
}

TEST(RefOps, GatesAndGatedNorm) {
  std::vector<float> alpha{0.3f, -2.0f}, bin{0.5f, -1.0f}, a{-2.0f, -0.5f}, dt{0.1f, 0.2f}, g(2), b(2);
  ref::gdn_gates(alpha.data(), bin.data(), a.data(), dt.data(), g.data(), b.data(), 1, 2);
  for (int h = 0; h < 2; ++h) {
    EXPECT_NEAR(g[h], a[h] * std::log1p(std::exp(double(alpha[h]) + dt[h])), 1e-6);
    EXPECT_NEAR(b[h], 1.0 / (1.0 + std::exp(-double(bin[h]))), 1e-6);
  }
  auto o = randn(8, 17), z = randn(8, 18), w = randn(4, 19);
  std::vector<float> y(8);
  ref::gated_rmsnorm(o.data(), z.data(), w.data(), y.data(), 2, 4, 1e-6f);
  for (int r = 0; r < 2; ++r) {
    double ss = 0;
    for (int i = 0; i < 4; ++i) ss += double(o[r * 4 + i]) * o[r * 4 + i];
    for (int i = 0; i < 4; ++i) {
      double zz = z[r * 4 + i];
      EXPECT_NEAR(y[r * 4 + i], o[r * 4 + i] / std::sqrt(ss / 4 + 1e-6) * w[i] * zz / (1 + std::exp(-zz)),
                  1e-5);
    }
  }
}

}  // namespace
}  // namespace bonsai
