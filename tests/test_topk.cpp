// The head's candidate path: ref::top_k against a full sort, the Sampler fed only the
// best few logits against the Sampler fed all of them, and a Session decoding through
// decode_top_k against one decoding the full logits (CPU backend; the CUDA kernel is
// checked against ref::top_k in test_backend_cuda_topk.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "bonsai/error.h"
#include "bonsai/model.h"
#include "bonsai/sampler.h"
#include "bonsai/session.h"
#include "bonsai/synth.h"
#include "kernels/ref/ref_backend.h"
#include "kernels/ref/topk.h"
#include "temp_path.h"

namespace bonsai {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The specification, independently of ref::top_k's insertion scheme: a stable sort of
// all indices by value, descending, NaN as -inf.
void sorted_top_k(const std::vector<float>& x, int k, std::vector<int32_t>& ids, std::vector<float>& vals) {
  std::vector<int32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto key = [&](int32_t i) { return std::isnan(x[i]) ? -kInf : x[i]; };
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
  ids.assign(idx.begin(), idx.begin() + k);
  vals.clear();
  for (int32_t i : ids) vals.push_back(key(i));
}

// Random logits with many exact ties (a few levels) and the extremes: ±inf, ±FLT_MAX,
// ±0, denormals. nan_every > 0 puts a NaN at every nan_every-th index.
std::vector<float> hostile(size_t n, uint32_t seed, int nan_every = 0) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> level(-6, 6), pick(0, 15);
  const float special[] = {
      kInf, -kInf, std::numeric_limits<float>::max(),        -std::numeric_limits<float>::max(),
      0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -1e-40f};
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const int p = pick(rng);
    x[i] = p == 0 ? special[level(rng) & 7] : static_cast<float>(level(rng)) * 0.25f;
    if (nan_every > 0 && i % static_cast<size_t>(nan_every) == 3) x[i] = std::nanf("");
  }
  return x;
}

void expect_same(const std::vector<int32_t>& ids, const std::vector<float>& vals,
                 const std::vector<int32_t>& want_ids, const std::vector<float>& want_vals,
                 const std::string& what) {
  ASSERT_EQ(ids, want_ids) << what;
  for (size_t i = 0; i < vals.size(); ++i)  // bitwise: the values are copies, -0.0 stays -0.0
    EXPECT_EQ(std::signbit(vals[i]), std::signbit(want_vals[i])) << what << " at " << i;
  EXPECT_EQ(vals, want_vals) << what;
}

TEST(RefTopK, MatchesAFullSortWithTiesAndExtremes) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{64}, size_t{1000}, size_t{5003}})
    for (int k : {1, 2, 7, 40, 64}) {
      if (static_cast<size_t>(k) > n) continue;
      for (int nan_every : {0, 5}) {
        const auto x = hostile(n, static_cast<uint32_t>(n * 131 + k), nan_every);
        std::vector<int32_t> ids(k), want_ids;
        std::vector<float> vals(k), want_vals;
        ref::top_k(x.data(), static_cast<int64_t>(n), k, ids.data(), vals.data());
        sorted_top_k(x, k, want_ids, want_vals);
        expect_same(ids, vals, want_ids, want_vals, fmt::format("n {} k {} nan_every {}", n, k, nan_every));
      }
    }
}

TEST(RefTopK, TiesGoToTheLowestIdAndNanRanksAsMinusInfinity) {
  std::vector<float> x(100, 1.5f);
  std::vector<int32_t> ids(5);
  std::vector<float> vals(5);
  ref::top_k(x.data(), 100, 5, ids.data(), vals.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  // NaN everywhere but two -inf: the -inf ties with the NaNs (all -inf), lowest ids win.
  std::vector<float> y(10, std::nanf(""));
  y[6] = -kInf;
  y[2] = 3.0f;
  ref::top_k(y.data(), 10, 3, ids.data(), vals.data());
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 0);
  EXPECT_EQ(ids[2], 1);
  EXPECT_EQ(vals[1], -kInf);
}

TEST(RefTopK, RejectsBadK) {
  std::vector<float> x(100, 0.0f);
  int32_t ids[kMaxTopK + 1];
  float vals[kMaxTopK + 1];
  EXPECT_THROW(ref::top_k(x.data(), 100, 0, ids, vals), Error);
  EXPECT_THROW(ref::top_k(x.data(), 100, kMaxTopK + 1, ids, vals), Error);
  EXPECT_THROW(ref::top_k(x.data(), 3, 4, ids, vals), Error);
}

// The Backend default (host copy + ref::top_k, what a backend without its own selection
// runs) and RefBackend's in-place override, through a backend's own memory.
struct DefaultTopK : RefBackend {
  void top_k(const float* x, int64_t n, int k, int32_t* ids, float* values) override {
    Backend::top_k(x, n, k, ids, values);
  }
};

TEST(RefTopK, BackendDefaultAndRefBackendSelectOnTheHost) {
  DefaultTopK def;
  RefBackend ref;
  const auto x = hostile(3000, 4, 7);
  std::vector<int32_t> want_ids;
  std::vector<float> want_vals;
  sorted_top_k(x, 40, want_ids, want_vals);
  for (Backend* be : {static_cast<Backend*>(&def), static_cast<Backend*>(&ref)}) {
    float* p = be->alloc(x.size());
    be->from_host(p, x.data(), x.size());
    std::vector<int32_t> ids(40);
    std::vector<float> vals(40);
    be->top_k(p, static_cast<int64_t>(x.size()), 40, ids.data(), vals.data());
    expect_same(ids, vals, want_ids, want_vals, be == &def ? "Backend::top_k" : "RefBackend::top_k");
    EXPECT_THROW(be->top_k(p, static_cast<int64_t>(x.size()), 0, ids.data(), vals.data()), Error);
    be->release(p);
  }
}

std::vector<TokenLogit> best_of(const std::vector<float>& x, int k) {
  std::vector<int32_t> ids;
  std::vector<float> vals;
  sorted_top_k(x, k, ids, vals);
  std::vector<TokenLogit> out;
  for (int i = 0; i < k; ++i) out.push_back({ids[i], vals[i]});
  // Any order is accepted: hand them over reversed.
  std::reverse(out.begin(), out.end());
  return out;
}

SamplerParams params(float temp, int top_k, float top_p, float min_p) {
  SamplerParams p;
  p.temp = temp;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = 11;
  return p;
}

TEST(SamplerBest, SamplingTheBestFewEqualsSamplingAll) {
  const SamplerParams cases[] = {params(0.0f, 40, 0.95f, 0.05f), params(0.8f, 40, 0.95f, 0.05f),
                                 params(1.0f, 5, 1.0f, 0.0f), params(1.5f, 64, 0.5f, 0.0f),
                                 params(0.7f, 1, 1.0f, 0.0f)};
  for (const SamplerParams& p : cases) {
    Sampler full(p), best(p);
    ASSERT_EQ(best.candidates_needed(), p.temp <= 0.0f ? 1 : p.top_k);
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 2.0f);
    for (int step = 0; step < 200; ++step) {
      std::vector<float> x(500);
      for (auto& v : x) v = std::round(d(rng) * 4.0f) / 4.0f;  // coarse: ties in the top few
      if (step % 7 == 0) x[step % 500] = std::nanf("");
      const int32_t a = full.sample(x);
      // More than needed is fine too (the caller may fetch extra).
      const int32_t b = best.sample_best(best_of(x, best.candidates_needed() + step % 3));
      ASSERT_EQ(a, b) << "temp " << p.temp << " top_k " << p.top_k << " step " << step;
      full.accept(a);
      best.accept(b);
    }
  }
}

TEST(SamplerBest, FullLogitsNeededWhenTopKIsOffOrAPenaltyActs) {
  Sampler off(params(0.8f, 0, 0.95f, 0.05f));
  EXPECT_EQ(off.candidates_needed(), 0);
  EXPECT_THROW(off.sample_best(best_of(std::vector<float>(100, 0.0f), 10)), Error);
  SamplerParams p = params(0.0f, 40, 1.0f, 0.0f);
  p.repeat_penalty = 1.3f;
  Sampler pen(p);
  EXPECT_EQ(pen.candidates_needed(), 1);  // no history yet: no penalty applies
  pen.accept(5);
  EXPECT_EQ(pen.candidates_needed(), 0);
  Sampler topk(params(0.8f, 40, 0.95f, 0.05f));
  EXPECT_THROW(topk.sample_best(best_of(std::vector<float>(100, 0.0f), 39)), Error);
}

// Greedy and top-k sampling through Session::decode_top_k give the tokens of the same
// walk over the full logits; the candidates are the full row's best, bit for bit (same
// backend, same ops), and snapshot() still sees the full row.
TEST(SessionTopK, CandidatePathDecodesLikeTheFullLogits) {
  SynthOptions o = synth_preset("tiny");
  o.with_vocab = false;
  o.seed = 21;
  const auto path = bonsai::testing::unique_temp_path("topk_session.gguf").string();
  write_synthetic_model(o, path);
  auto model = Model::load(path);
  const int64_t V = model->config().n_vocab;
  for (const SamplerParams& p : {params(0.0f, 40, 1.0f, 0.0f), params(1.0f, 40, 0.95f, 0.05f)}) {
    SessionOptions so;
    so.n_ctx = 24;
    so.path = "cpu";
    so.n_threads = 1;
    Session full(*model, so), cand(*model, so);
    Sampler sf(p), sc(p);
    const std::vector<int32_t> prompt = {3, 100, 7, 900};
    auto lf = full.prefill(prompt);
    auto lc = cand.prefill(prompt);
    int32_t tf = sf.sample(lf), tc = sc.sample(lc);
    for (int step = 0; step < 12; ++step) {
      ASSERT_EQ(tf, tc) << "step " << step;
      sf.accept(tf);
      sc.accept(tc);
      const int k = sc.candidates_needed();
      ASSERT_GT(k, 0);
      lf = full.decode(tf);
      const auto best = cand.decode_top_k(tc, k);
      std::vector<int32_t> want_ids;
      std::vector<float> want_vals;
      sorted_top_k(std::vector<float>(lf.begin(), lf.end()), k, want_ids, want_vals);
      ASSERT_EQ(best.size(), static_cast<size_t>(k));
      for (int i = 0; i < k; ++i) {
        EXPECT_EQ(best[i].id, want_ids[i]) << "step " << step << " rank " << i;
        EXPECT_EQ(best[i].logit, want_vals[i]) << "step " << step << " rank " << i;
      }
      tf = sf.sample(lf);
      tc = sc.sample_best(best);
    }
    const auto snap = cand.snapshot();
    ASSERT_EQ(snap->logits.size(), static_cast<size_t>(V));
    EXPECT_TRUE(std::equal(lf.begin(), lf.end(), snap->logits.begin())) << "snapshot after decode_top_k";
    EXPECT_THROW(cand.decode_top_k(1, kMaxTopK + 1), Error);
    EXPECT_THROW(cand.decode_top_k(1, 5, V + 1), Error);
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace bonsai
