// The chunked (WY) delta rule against the reference token walk.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/gdn_chunked.h"
#include "kernels/ref/ops.h"
#include "runtime/cpu_features.h"

namespace bonsai {
namespace {

TEST(GdnChunked, MatchesTokenWalk) {
  if (!isa_supported(Isa::Avx2)) GTEST_SKIP() << "chunked kernel is built for AVX2";
  GdnShape s{2, 6, 32, 24, 1e-6f};
  const int width = 2 * 2 * 32 + 6 * 24;
  ThreadPool pool(2);
  for (int t : {1, 7, 64, 100}) {
    for (int chunk : {1, 16, 64}) {
      std::mt19937 rng(t * 131 + chunk);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> conv(static_cast<size_t>(t) * width), g(t * 6), beta(t * 6), st0(6 * 32 * 24);
      for (auto& v : conv) v = nd(rng);
      // Realistic gates: strong and weak decay (g down to -8), β over (0, 1).
      for (auto& v : g) v = -std::fabs(nd(rng)) * 3.0f;
      for (auto& v : beta) v = 1.0f / (1.0f + std::exp(-nd(rng)));
      for (auto& v : st0) v = 0.3f * nd(rng);
      std::vector<float> sa = st0, sb = st0, oa(static_cast<size_t>(t) * 6 * 24), ob(oa.size());
      cpu::gdn_recurrence_chunked(conv.data(), g.data(), beta.data(), sa.data(), oa.data(), t, s, chunk,
                                  pool);
      ref::gdn_recurrence(conv.data(), g.data(), beta.data(), sb.data(), ob.data(), t, s);
      double d = 0, mx = 0, ds = 0, ms = 0;
      for (size_t i = 0; i < oa.size(); ++i) {
        d = std::max(d, std::fabs(double(oa[i]) - ob[i]));
        mx = std::max(mx, std::fabs(double(ob[i])));
      }
      for (size_t i = 0; i < sa.size(); ++i) {
        ds = std::max(ds, std::fabs(double(sa[i]) - sb[i]));
        ms = std::max(ms, std::fabs(double(sb[i])));
      }
      // fp32 both ways; the chunked form sums the same terms in another order
      // (and through the triangular solve), a few ulps per term over <= 100 steps.
      EXPECT_LE(d, 2e-5 * std::max(1.0, mx)) << "t " << t << " chunk " << chunk;
      EXPECT_LE(ds, 2e-5 * std::max(1.0, ms)) << "t " << t << " chunk " << chunk;
    }
  }
}

}  // namespace
}  // namespace bonsai
