// The vectorised elementwise kernels (kernels/cpu/elementwise.h) against the
// reference ops: SiLU's polynomial exp against double precision, SwiGLU and
// the GDN causal conv against kernels/ref at odd sizes and several tap counts,
// and the CPU backend's threaded ssm_conv at 1 and 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/ref/ops.h"
#include "runtime/cpu_features.h"

#include "test_util.h"

namespace bonsai {
namespace {

using testing_util::randn;

bool have_avx2() { return isa_supported(Isa::Avx2); }

// exp8 is within ~2 ulp (2.4e-7 relative) of exp; silu = x / (1 + e) adds a
// division and an addition (1 ulp each, and 1 + e only damps e's error), so
// 1e-6 relative (~8 ulp) bounds it with margin. Below −87.3 the input is
// clamped: both the kernel and the exact value are below 1e-35 in magnitude.
TEST(ElementwiseAvx2, SiluTracksDoublePrecision) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2";
  std::vector<float> x;
  for (float v = -100.0f; v <= 100.0f; v += 0.01953125f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.0f, 89.0f, -87.0f, -88.0f, 1e30f, -1e30f}) x.push_back(v);
  x.push_back(std::nanf(""));
  const int64_t n = static_cast<int64_t>(x.size());
  x.resize(n + 3, 1.0f);  // past n: must stay unwritten (n is odd: the masked tail runs)
  ASSERT_EQ(n % 8 == 0, false);
  std::vector<float> y(x.size(), 7.0f);
  cpu::silu_avx2(x.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double exact = x[i] / (1.0 + std::exp(-static_cast<double>(x[i])));
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]));
    } else if (x[i] < -87.0f) {
      EXPECT_LT(std::fabs(y[i]), 1e-35) << "x = " << x[i];
    } else {
      EXPECT_LE(std::fabs(y[i] - exact), 1e-6 * std::fabs(exact) + 1e-38) << "x = " << x[i];
    }
  }
  EXPECT_EQ(y[n], 7.0f);  // nothing written past n
}

TEST(ElementwiseAvx2, SwigluMatchesReference) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2";
  for (int64_t n : {1, 7, 8, 13, 17408 + 5}) {
    auto g = randn(n, 1, 4.0f), u = randn(n, 2);
    std::vector<float> a(n + 1, 3.0f);
    cpu::swiglu_avx2(g.data(), u.data(), a.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float r = ref::silu(g[i]) * u[i];
      // silu within 1e-6 relative (above) plus the product's rounding.
      EXPECT_LE(std::fabs(a[i] - r), 1.2e-6f * std::fabs(r) + 1e-37f) << "n " << n << " i " << i;
    }
    EXPECT_EQ(a[n], 3.0f);
  }
}

// x·sigmoid(gate): exp8 within ~2 ulp (2.4e-7 relative) of e = exp(−gate); 1 / (1 + e) passes
// at most that relative error on (e / (1 + e) < 1) and adds two roundings, the product one more:
// ≤ ~4.2e-7 relative, so 1e-6 bounds it with margin. Below gate = −87.3 the clamp makes both the
// kernel's and the exact sigmoid < 2e-38. NaN in either input gives NaN; ±0 and ±1e30 in x pass.
TEST(ElementwiseAvx2, SigmoidMulTracksDoublePrecision) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2";
  std::vector<float> gate;
  for (float v = -100.0f; v <= 100.0f; v += 0.01953125f) gate.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.0f, 89.0f, -87.0f, -88.0f, 1e30f, -1e30f})
    gate.push_back(v);
  gate.push_back(std::nanf(""));
  const int64_t n = static_cast<int64_t>(gate.size());
  ASSERT_NE(n % 8, 0);  // the tail runs
  auto x = randn(n, 9, 3.0f);
  x[1] = 0.0f, x[2] = -0.0f, x[3] = 1e30f, x[4] = -1e30f, x[5] = std::nanf("");
  for (bool in_place : {false, true}) {
    std::vector<float> y(n + 1, 7.0f);
    if (in_place) std::copy(x.begin(), x.end(), y.begin());
    cpu::sigmoid_mul_avx2(in_place ? y.data() : x.data(), gate.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double exact = x[i] / (1.0 + std::exp(-static_cast<double>(gate[i])));
      if (std::isnan(x[i]) || std::isnan(gate[i])) {
        EXPECT_TRUE(std::isnan(y[i])) << i;
      } else if (gate[i] < -87.0f) {
        EXPECT_LE(std::fabs(y[i]), std::fabs(x[i]) * 2e-38 + 1e-45) << "gate = " << gate[i];
      } else {
        EXPECT_LE(std::fabs(y[i] - exact), 1e-6 * std::fabs(exact) + 1e-38)
            << "gate = " << gate[i] << " x = " << x[i];
      }
    }
    EXPECT_EQ(y[n], 7.0f) << "in place " << in_place;  // nothing written past n
  }
}

// The backend's sigmoid_mul: one token's gate on the calling thread, a prompt's in pieces on the
// pool; each element's result does not depend on the split (same lanes, same instructions), so
// every thread count gives the same floats, within the bound above of the reference.
TEST(ElementwiseAvx2, BackendSigmoidMulEveryThreadCount) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2";
  for (int64_t n : {int64_t{6144}, int64_t{9 * 4096 + 13}}) {
    auto x = randn(n, 10, 2.0f), g = randn(n, 11, 4.0f);
    std::vector<float> want(n), first;
    ref::sigmoid_mul(x.data(), g.data(), want.data(), n);
    for (int threads : {1, 2, 3}) {
      CpuBackend be(threads, Isa::Avx2, cpu::Precision::Faithful);
      std::vector<float> y = x;  // in place, as the graph calls it
      be.sigmoid_mul(y.data(), g.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_LE(std::fabs(y[i] - want[i]), 1e-6f * std::fabs(want[i]) + 1e-38f) << "n " << n << " i " << i;
      if (first.empty())
        first = y;
      else
        EXPECT_EQ(y, first) << "n " << n << " threads " << threads;
    }
  }
}

// The conv sum of taps products in FMA vs the reference's mul + add: each
// step rounds once instead of twice, so the two differ by ≤ 2·taps ulp of
// Σ_j |w_j·input_j| ≤ M·Σ_j |w_j| (M: the largest input magnitude the channel
// has seen), not of the possibly cancelling sum; silu then adds ≤ 1e-6
// relative and passes input differences through with slope ≤ 1.1.
void expect_conv_matches(int64_t channels, int taps, int t, const std::vector<float>& out,
                         const std::vector<float>& ref_out, const std::vector<float>& st,
                         const std::vector<float>& ref_st, const std::vector<float>& x,
                         const std::vector<float>& w, const std::vector<float>& st0) {
  EXPECT_EQ(st, ref_st);  // the state is only shifted: exact
  for (int64_t c = 0; c < channels; ++c) {
    double m = 0, wsum = 0;
    for (int j = 0; j + 1 < taps; ++j) m = std::max(m, std::fabs(static_cast<double>(st0[j * channels + c])));
    for (int i = 0; i < t; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i * channels + c])));
    for (int j = 0; j < taps; ++j) wsum += std::fabs(w[c * taps + j]);
    for (int i = 0; i < t; ++i) {
      const double r = ref_out[i * channels + c];
      const double tol = 1.1 * (2.0 * taps * 1.2e-7 * m * wsum) + 1e-6 * std::fabs(r) + 1e-37;
      ASSERT_LE(std::fabs(out[i * channels + c] - r), tol)
          << "channel " << c << " step " << i << " taps " << taps;
    }
  }
}

TEST(ElementwiseAvx2, SsmConvMatchesReference) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2";
  for (int taps : {1, 2, 4, 5})
    for (int64_t channels : {8, 13, 264}) {
      const int t = 3;
      auto x = randn(t * channels, 3, 2.0f), w = randn(channels * taps, 4, 0.5f);
      auto st0 = randn((taps - 1) * channels, 5, 2.0f);
      std::vector<float> sa = st0, sb = st0, oa(t * channels), ob(t * channels);
      // Two channel ranges, as the backend splits them across threads.
      const int64_t mid = channels / 16 * 8;
      cpu::ssm_conv_avx2(x.data(), sa.data(), w.data(), oa.data(), t, channels, taps, 0, mid);
      cpu::ssm_conv_avx2(x.data(), sa.data(), w.data(), oa.data(), t, channels, taps, mid, channels);
      ref::ssm_conv(x.data(), sb.data(), w.data(), ob.data(), t, channels, taps);
      expect_conv_matches(channels, taps, t, oa, ob, sa, sb, x, w, st0);
    }
}

TEST(ElementwiseAvx2, BackendSsmConvEveryThreadCount) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2";
  const int64_t channels = 2 * 1024 + 24;  // more than one 1024-channel task, plus a partial one
  const int taps = 4, t = 2;
  auto x = randn(t * channels, 6), wv = randn(channels * taps, 7, 0.5f),
       st0 = randn((taps - 1) * channels, 8);
  Weight w;
  w.type = DType::F32;
  w.k = taps;
  w.n = channels;
  w.data = reinterpret_cast<const uint8_t*>(wv.data());
  for (int threads : {1, 2})
    for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
      if (!isa_supported(isa)) continue;
      CpuBackend be(threads, isa, cpu::Precision::Faithful);
      std::vector<float> sa = st0, sb = st0, oa(t * channels), ob(t * channels);
      be.ssm_conv(x.data(), sa.data(), w, oa.data(), t, channels, taps);
      ref::ssm_conv(x.data(), sb.data(), wv.data(), ob.data(), t, channels, taps);
      expect_conv_matches(channels, taps, t, oa, ob, sa, sb, x, wv, st0);
    }
}

// The backend's delta rule (AVX-512 head step where d_v % 16 == 0, AVX2 where
// d_v % 8 == 0, the scalar loop otherwise) against the reference at the 27B's
// head size, at partial column tiles (48, 24) and at an odd size (20). The SIMD step computes decay·(Sᵀk)
// instead of (decay·S)ᵀk and fuses multiply-adds: per output a sum of d_k = 128 products with a few roundings
// each, so ~1e-6 relative to the largest output; 1e-5 leaves margin.
TEST(ElementwiseAvx2, DeltaRuleHeadStepMatchesReference) {
  for (int dv : {128, 48, 24, 20})
    for (int threads : {1, 2})
      for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
        if (!isa_supported(isa)) continue;
        const GdnShape s{2, 4, 128, dv, 1e-6f};
        const int t = 3, width = 2 * 2 * 128 + 4 * dv;
        auto conv = randn(t * width, 30), g = randn(t * 4, 31, 0.3f), beta = randn(t * 4, 32);
        for (auto& v : g) v = -std::fabs(v);
        for (auto& v : beta) v = 1.0f / (1.0f + std::exp(-v));
        const auto st0 = randn(4 * 128 * dv, 33, 0.1f);
        std::vector<float> sa = st0, sb = st0, oa(t * 4 * dv), ob(oa.size());
        CpuBackend be(threads, isa, cpu::Precision::Faithful);
        be.gdn_recurrence(conv.data(), g.data(), beta.data(), sa.data(), oa.data(), t, s);
        ref::gdn_recurrence(conv.data(), g.data(), beta.data(), sb.data(), ob.data(), t, s);
        double mo = 0, ms = 0, dO = 0, dS = 0;
        for (size_t i = 0; i < oa.size(); ++i)
          mo = std::max(mo, std::fabs(double(ob[i]))), dO = std::max(dO, std::fabs(double(oa[i]) - ob[i]));
        for (size_t i = 0; i < sa.size(); ++i)
          ms = std::max(ms, std::fabs(double(sb[i]))), dS = std::max(dS, std::fabs(double(sa[i]) - sb[i]));
        EXPECT_LT(dO, 1e-5 * mo) << "d_v " << dv << " threads " << threads << " " << isa_name(isa);
        EXPECT_LT(dS, 1e-5 * ms) << "d_v " << dv << " threads " << threads << " " << isa_name(isa);
      }
}

// gated_rmsnorm = the reference's RMSNorm, then silu(z)· in place with the
// vector SiLU (≤ 1.2e-6 relative per element, see SwigluMatchesReference).
TEST(ElementwiseAvx2, GatedRmsnormMatchesReference) {
  const int64_t rows = 5, d = 128;
  auto o = randn(rows * d, 40, 3.0f), z = randn(rows * d, 41, 2.0f), g = randn(d, 42);
  Weight w;
  w.type = DType::F32, w.k = d, w.n = 1, w.data = reinterpret_cast<const uint8_t*>(g.data());
  std::vector<float> want(rows * d);
  ref::gated_rmsnorm(o.data(), z.data(), g.data(), want.data(), rows, d, 1e-6f);
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if (!isa_supported(isa)) continue;
    CpuBackend be(1, isa, cpu::Precision::Faithful);
    std::vector<float> got(rows * d);
    be.gated_rmsnorm(o.data(), z.data(), w, got.data(), rows, d, 1e-6f);
    for (int64_t i = 0; i < rows * d; ++i)
      EXPECT_LE(std::fabs(got[i] - want[i]), 1.2e-6f * std::fabs(want[i]) + 1e-37f)
          << isa_name(isa) << " " << i;
  }
}

}  // namespace
}  // namespace bonsai
