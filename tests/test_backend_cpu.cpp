// The fast CPU backend's own ops against the reference backend, per ISA and
// thread count, on random and odd-sized inputs. (The ternary matvec kernels
// themselves are covered in depth by test_kernels_matvec.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "bonsai/formats.h"
#include "bonsai/model.h"
#include "bonsai/session.h"
#include "bonsai/synth.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/ref/ops.h"
#include "runtime/cpu_features.h"

#include "temp_path.h"
#include "test_util.h"

namespace bonsai {
namespace {

using testing_util::randn;

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double mx = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    mx = std::max(mx, std::fabs(static_cast<double>(b[i])));
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return d / std::max(mx, 1e-30);
}

using Param = std::tuple<Isa, int>;
class CpuBackendOps : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (!isa_supported(std::get<0>(GetParam())))
      GTEST_SKIP() << "this CPU lacks " << isa_name(std::get<0>(GetParam()));
    be_ = std::make_unique<CpuBackend>(std::get<1>(GetParam()), std::get<0>(GetParam()),
                                       cpu::Precision::Faithful);
  }
  std::unique_ptr<CpuBackend> be_;
};

TEST_P(CpuBackendOps, HadamardIsBitIdenticalToReference) {
  for (int64_t block : {8, 64, 1024}) {
    const int64_t k = block * 3, rows = 3;
    auto x = randn(k * rows, 1, 10.0f), s = randn(k, 2);
    for (auto& v : s) v = v < 0 ? -1.0f : 1.0f;
    for (bool inverse : {false, true}) {
      std::vector<float> a(k * rows), b(k * rows);
      be_->hadamard(x.data(), s.data(), a.data(), rows, k, block, inverse);
      ref::hadamard(x.data(), s.data(), b.data(), rows, k, block, inverse);
      EXPECT_EQ(a, b) << "block " << block << " inverse " << inverse;  // same butterfly order
    }
  }
}

TEST_P(CpuBackendOps, AttentionMatchesReference) {
  AttentionShape s{6, 2, 40, 1.0f / std::sqrt(40.0f)};
  const int pos0 = 37, t = 3, ctx = 64;
  auto kc = randn(ctx * 2 * 40, 3), vc = randn(ctx * 2 * 40, 4), q = randn(t * 6 * 40, 5, 3.0f);
  std::vector<float> a(t * 6 * 40), b(a.size());
  be_->attention(q.data(), kc.data(), vc.data(), a.data(), t, pos0, s);
  ref::attention(q.data(), kc.data(), vc.data(), b.data(), t, pos0, s);
  // Same f32 formula; only the compiler's vectorised reduction order differs: ~1e-6 relative.
  EXPECT_LT(max_rel_diff(a, b), 1e-5);
}

// A decode step past 512 positions runs in chunks of 512 (BONSAI_CPU_ATTN_CHUNK's default) merged
// afterwards: the same scores, another summation order (~1e-6 relative), and the same floats at
// any thread count, since the chunks do not depend on it. The last chunk holds one position at
// 1025 and 1537; 1500 leaves a partial one.
TEST_P(CpuBackendOps, AttentionDecodeChunksMatchReference) {
  AttentionShape s{6, 2, 40, 1.0f / std::sqrt(40.0f)};
  CpuBackend one(1, std::get<0>(GetParam()), cpu::Precision::Faithful);
  for (int pos0 : {1024, 1499, 1536}) {
    const int ctx = pos0 + 1;
    auto kc = randn(ctx * 2 * 40, 30 + pos0), vc = randn(ctx * 2 * 40, 31 + pos0),
         q = randn(6 * 40, 32, 3.0f);
    std::vector<float> a(6 * 40), b(a.size()), c(a.size());
    be_->attention(q.data(), kc.data(), vc.data(), a.data(), 1, pos0, s);
    ref::attention(q.data(), kc.data(), vc.data(), b.data(), 1, pos0, s);
    one.attention(q.data(), kc.data(), vc.data(), c.data(), 1, pos0, s);
    EXPECT_LT(max_rel_diff(a, b), 1e-5) << pos0;
    EXPECT_EQ(a, c) << pos0 << ": the thread count changed the result";
  }
}

// A batch runs in tiles of 8 tokens over blocks of 32 positions with an online softmax: a partial
// tile (11, 20 tokens), a first block shorter than the tile's rows need (pos0 0), a partial last
// block (70 + 11), against the reference and bitwise across thread counts.
TEST_P(CpuBackendOps, AttentionBatchTilesMatchReference) {
  AttentionShape s{6, 2, 40, 1.0f / std::sqrt(40.0f)};
  CpuBackend one(1, std::get<0>(GetParam()), cpu::Precision::Faithful);
  for (auto [t, pos0] : {std::pair{11, 70}, std::pair{20, 0}, std::pair{2, 31}}) {
    const int ctx = pos0 + t;
    auto kc = randn(ctx * 2 * 40, 40 + t), vc = randn(ctx * 2 * 40, 41 + t), q = randn(t * 6 * 40, 42, 3.0f);
    std::vector<float> a(t * 6 * 40), b(a.size()), c(a.size());
    be_->attention(q.data(), kc.data(), vc.data(), a.data(), t, pos0, s);
    ref::attention(q.data(), kc.data(), vc.data(), b.data(), t, pos0, s);
    one.attention(q.data(), kc.data(), vc.data(), c.data(), t, pos0, s);
    EXPECT_LT(max_rel_diff(a, b), 1e-5) << t << " tokens at " << pos0;
    EXPECT_EQ(a, c) << t << " tokens at " << pos0 << ": the thread count changed the result";
  }
}

// f32 values rounded to an f16 cache element and widened back (what an f16 cache holds).
std::vector<float> rounded_to_f16(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = fp16_to_f32(f32_to_fp16(x[i]));
  return r;
}

// An f16 KV cache (AttentionShape::kv = F16): every path (one task per (token, KV head), the decode
// chunks past 512 positions, the batch tiles) widens each half exactly (F16C) where it loads it and
// then runs the f32 path's arithmetic, so its output equals the f32 path's over the rounded rows bit
// for bit, at any thread count; the reference likewise. The rows come from the backend's store_rows.
TEST_P(CpuBackendOps, AttentionOverAnF16CacheEqualsTheF32PathOverRoundedRows) {
  const AttentionShape s{6, 2, 40, 1.0f / std::sqrt(40.0f)};
  AttentionShape h = s;
  h.kv = KvType::F16;
  const int64_t width = 2 * 40;
  for (auto [t, pos0] : {std::pair{3, 37}, std::pair{1, 1499}, std::pair{11, 70}}) {
    const int ctx = pos0 + t;
    auto kc = randn(ctx * width, 50 + t), vc = randn(ctx * width, 51 + t), q = randn(t * 6 * 40, 52, 3.0f);
    std::vector<uint16_t> kh(kc.size()), vh(vc.size());
    be_->store_rows(kh.data(), kc.data(), width, ctx, 0, KvType::F16);
    be_->store_rows(vh.data(), vc.data(), width, ctx, 0, KvType::F16);
    const auto kr = rounded_to_f16(kc), vr = rounded_to_f16(vc);
    std::vector<float> a(t * 6 * 40), b(a.size()), c(a.size()), d(a.size());
    be_->attention(q.data(), kh.data(), vh.data(), a.data(), t, pos0, h);
    be_->attention(q.data(), kr.data(), vr.data(), b.data(), t, pos0, s);
    EXPECT_EQ(a, b) << t << " tokens at " << pos0;
    ref::attention(q.data(), kh.data(), vh.data(), c.data(), t, pos0, h);
    ref::attention(q.data(), kr.data(), vr.data(), d.data(), t, pos0, s);
    EXPECT_EQ(c, d) << t << " tokens at " << pos0 << " (reference)";
    EXPECT_LT(max_rel_diff(a, c), 1e-5) << t << " tokens at " << pos0;  // as AttentionMatchesReference
  }
}

// store_rows into an f16 cache rounds to nearest even exactly as f32_to_fp16 (bonsai/formats.h): ties,
// the largest finite half and the first value that overflows to inf, subnormals and the halfway point
// below the smallest one, signed zeros and infinities; a width that leaves a tail of 8-wide blocks; the
// rows outside [pos0, pos0 + t) untouched.
TEST_P(CpuBackendOps, StoreRowsIntoAnF16CacheRoundsLikeTheReference) {
  const int64_t width = 13;
  const int t = 3, pos0 = 2, rows = 6;
  std::vector<float> src = randn(width * t, 60, 100.0f);
  const float special[] = {65504.0f, 65519.99f, 65520.0f,   -65520.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                           0x1p-24f, 0x1p-25f,  0x1.8p-25f, 0x1p-14f,  0x1.ffcp-15f,    -0.0f,
                           INFINITY, -INFINITY, 1e30f,      1e-30f,    -3.14159f,       2049.0f};
  std::copy(std::begin(special), std::end(special), src.begin());
  std::vector<uint16_t> a(width * rows, 0x7777), b(a.size(), 0x7777);
  be_->store_rows(a.data(), src.data(), width, t, pos0, KvType::F16);
  ref::store_rows(b.data(), src.data(), width, t, pos0, KvType::F16);
  EXPECT_EQ(a, b);
  for (int64_t i = 0; i < width * t; ++i) ASSERT_EQ(b[pos0 * width + i], f32_to_fp16(src[i])) << i;
  for (int64_t i = 0; i < width * rows; ++i) {
    if (i < pos0 * width || i >= (pos0 + t) * width) {
      ASSERT_EQ(a[i], 0x7777) << i;
    }
  }
  EXPECT_EQ(b[pos0 * width + 0], 0x7bff);  // 65504
  EXPECT_EQ(b[pos0 * width + 1], 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(b[pos0 * width + 2], 0x7c00);  // the halfway point rounds (to even) to inf
  EXPECT_EQ(b[pos0 * width + 7], 0x0000);  // half the smallest subnormal: a tie, to even (0)
}

TEST_P(CpuBackendOps, DeltaRuleMatchesReference) {
  GdnShape s{2, 6, 16, 24, 1e-6f};
  const int t = 4, width = 2 * 2 * 16 + 6 * 24;
  auto conv = randn(t * width, 6), g = randn(t * 6, 7, 0.3f), beta = randn(t * 6, 8);
  for (auto& v : g) v = -std::fabs(v);
  for (auto& v : beta) v = 1.0f / (1.0f + std::exp(-v));
  auto st0 = randn(6 * 16 * 24, 9, 0.1f);
  std::vector<float> sa = st0, sb = st0, oa(t * 6 * 24), ob(oa.size());
  be_->gdn_recurrence(conv.data(), g.data(), beta.data(), sa.data(), oa.data(), t, s);
  ref::gdn_recurrence(conv.data(), g.data(), beta.data(), sb.data(), ob.data(), t, s);
  // The fast path fuses decay with Sᵀk and update with Sᵀq; every product is
  // the same f32 operation, only summation order may differ.
  EXPECT_LT(max_rel_diff(oa, ob), 1e-5);
  EXPECT_LT(max_rel_diff(sa, sb), 1e-5);
}

TEST_P(CpuBackendOps, FusedSitesMatchComposedReference) {
  RefBackend ref_be;
  const int64_t n = 384, rows = 3, block = 128;
  auto x = randn(rows * n, 20), d = randn(rows * n, 21), g = randn(n, 22), s = randn(n, 23);
  for (auto& v : s) v = v < 0 ? -1.0f : 1.0f;
  const Weight gain = Weight::f32_view(g.data(), n);
  for (bool with_delta : {true, false})
    for (int64_t b : {block, int64_t{0}}) {
      std::vector<float> xo1(rows * n), xo2(rows * n), n1(rows * n), n2(rows * n), r1(rows * n), r2(rows * n);
      be_->residual_norm_site(x.data(), with_delta ? d.data() : nullptr, xo1.data(), gain, s.data(), b,
                              n1.data(), r1.data(), rows, n, 1e-6f);
      ref_be.residual_norm_site(x.data(), with_delta ? d.data() : nullptr, xo2.data(), gain, s.data(), b,
                                n2.data(), r2.data(), rows, n, 1e-6f);
      EXPECT_EQ(xo1, xo2);  // same f32 operations in the same order
      EXPECT_EQ(n1, n2);
      EXPECT_EQ(r1, r2);
    }
  std::vector<float> a1(rows * n), a2(rows * n), r1(rows * n), r2(rows * n);
  be_->swiglu_site(x.data(), d.data(), a1.data(), s.data(), block, r1.data(), rows, n);
  ref_be.swiglu_site(x.data(), d.data(), a2.data(), s.data(), block, r2.data(), rows, n);
  // SwiGLU's vector exp is within 1.2e-6 relative per element of the reference
  // (test_kernels_elementwise.cpp); the normalised 128-point FWHT sums those
  // errors over a block: ≤ 1.2e-6·Σ|a|/√128 ≤ 1.2e-6·√128·max|a| ≈ 1.4e-5 of
  // the largest |a|, itself of the order of the largest output.
  EXPECT_LT(max_rel_diff(a1, a2), 2e-6);
  EXPECT_LT(max_rel_diff(r1, r2), 1e-4);
  // Without act (the graph's form when it does not dump): the same operations in place, so the
  // same rotated bit for bit, on both backends and with no transform (block 0).
  for (int64_t b : {block, int64_t{0}}) {
    std::vector<float> a3(rows * n), r3(rows * n), r4(rows * n, -7.0f), r5(rows * n), r6(rows * n, -7.0f);
    be_->swiglu_site(x.data(), d.data(), a3.data(), s.data(), b, r3.data(), rows, n);
    be_->swiglu_site(x.data(), d.data(), nullptr, s.data(), b, r4.data(), rows, n);
    EXPECT_EQ(r3, r4) << "block " << b;
    ref_be.swiglu_site(x.data(), d.data(), a3.data(), s.data(), b, r5.data(), rows, n);
    ref_be.swiglu_site(x.data(), d.data(), nullptr, s.data(), b, r6.data(), rows, n);
    EXPECT_EQ(r5, r6) << "block " << b;
  }
}

// Sites large enough to run on the pool (>= 4096 elements and >= 8 tasks: split at Hadamard
// blocks or rows) give the floats of one thread's pass, bit for bit: single rows (17 blocks
// split, 5 or 6 not), batches of rows (the residual site from 8 rows), blocks of 8 .. 1024, no
// transform (block 0), and with and without act.
TEST_P(CpuBackendOps, SitesOnThePoolEqualOneThread) {
  CpuBackend one(1, std::get<0>(GetParam()), cpu::Precision::Faithful);
  struct Case {
    int64_t rows, n, block;
  };
  for (const Case c :
       {Case{1, 5120, 1024}, Case{3, 2048, 1024}, Case{1, 17408, 1024}, Case{5, 1024, 64}, Case{2, 4096, 8},
        Case{1, 6144, 0}, Case{4, 1536, 512}, Case{9, 1024, 1024}, Case{12, 512, 0}}) {
    const int64_t rows = c.rows, n = c.n, m = rows * n;
    const std::string what =
        "rows " + std::to_string(rows) + " n " + std::to_string(n) + " block " + std::to_string(c.block);
    auto x = randn(m, 30), d = randn(m, 31), g = randn(n, 32), s = randn(n, 33);
    for (auto& v : s) v = v < 0 ? -1.0f : 1.0f;
    const Weight gain = Weight::f32_view(g.data(), n);
    for (bool with_delta : {true, false}) {
      std::vector<float> xo1(m), xo2(m), n1(m), n2(m), r1(m), r2(m);
      be_->residual_norm_site(x.data(), with_delta ? d.data() : nullptr, xo1.data(), gain, s.data(), c.block,
                              n1.data(), r1.data(), rows, n, 1e-6f);
      one.residual_norm_site(x.data(), with_delta ? d.data() : nullptr, xo2.data(), gain, s.data(), c.block,
                             n2.data(), r2.data(), rows, n, 1e-6f);
      EXPECT_EQ(xo1, xo2) << what;
      EXPECT_EQ(n1, n2) << what;
      EXPECT_EQ(r1, r2) << what;
    }
    for (bool with_act : {true, false}) {
      std::vector<float> a1(m, -3.0f), a2(m, -3.0f), r1(m), r2(m);
      be_->swiglu_site(x.data(), d.data(), with_act ? a1.data() : nullptr, s.data(), c.block, r1.data(), rows,
                       n);
      one.swiglu_site(x.data(), d.data(), with_act ? a2.data() : nullptr, s.data(), c.block, r2.data(), rows,
                      n);
      EXPECT_EQ(a1, a2) << what;
      EXPECT_EQ(r1, r2) << what << (with_act ? " act" : " in place");
    }
    if (c.block > 0)
      for (bool inverse : {false, true}) {
        std::vector<float> h1(m), h2(m);
        be_->hadamard(x.data(), s.data(), h1.data(), rows, n, c.block, inverse);
        one.hadamard(x.data(), s.data(), h2.data(), rows, n, c.block, inverse);
        EXPECT_EQ(h1, h2) << what << " inverse " << inverse;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(IsaThreads, CpuBackendOps,
                         ::testing::Combine(::testing::Values(Isa::Avx2, Isa::Avx512),
                                            ::testing::Values(1, 2, 3)),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           return std::string(isa_name(std::get<0>(p.param))) + "_t" +
                                  std::to_string(std::get<1>(p.param));
                         });

// Whole model: the fast path against the reference on a synthetic model, for
// every ISA and 1/2 threads. Faithful activations give ~3e-5 relative error per
// matvec (kernels/cpu/matvec.h), so logits agree to cosine > 0.9999.
TEST(CpuBackendModel, FastPathTracksReferenceEveryIsaAndThreadCount) {
  SynthOptions o = synth_preset("tiny");
  o.with_vocab = false;
  o.seed = 5;
  const auto path = bonsai::testing::unique_temp_path("fast_vs_ref.gguf").string();
  write_synthetic_model(o, path);
  auto model = Model::load(path);
  const int32_t tokens[] = {3, 100, 7, 900, 42, 5};
  auto run = [&](const std::string& p, int threads) {
    SessionOptions so;
    so.n_ctx = 8;
    so.path = p;
    so.n_threads = threads;
    Session s(*model, so);
    std::vector<std::vector<float>> out;
    for (int32_t t : tokens) {
      auto l = s.decode(t);
      out.emplace_back(l.begin(), l.end());
    }
    return out;
  };
  const auto ref = run("ref", 1);
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!isa_supported(isa)) continue;
    setenv("BONSAI_ISA", std::string(isa_name(isa)).c_str(), 1);
    for (int threads : {1, 2}) {
      const auto fast = run("fast", threads);
      for (size_t i = 0; i < ref.size(); ++i) {
        double dot = 0, na = 0, nb = 0;
        for (size_t v = 0; v < ref[i].size(); ++v) {
          dot += double(fast[i][v]) * ref[i][v];
          na += double(fast[i][v]) * fast[i][v];
          nb += double(ref[i][v]) * ref[i][v];
        }
        EXPECT_GT(dot / std::sqrt(na * nb), 0.9999)
            << isa_name(isa) << " threads " << threads << " pos " << i;
      }
    }
    unsetenv("BONSAI_ISA");
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace bonsai
