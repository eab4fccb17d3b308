// Sampler: each filter's effect on a known distribution, penalties, greedy
// ties, seeding and parameter validation.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "bonsai/error.h"
#include "bonsai/sampler.h"

namespace bonsai {
namespace {

// Probabilities 0.4, 0.3, 0.15, 0.1, 0.05 for ids 0..4, as logits (+ offset).
std::vector<float> known(float offset = 0.0f) {
  return {std::log(0.4f) + offset, std::log(0.3f) + offset, std::log(0.15f) + offset, std::log(0.1f) + offset,
          std::log(0.05f) + offset};
}

// Every filter off, temperature 1: the distribution is the softmax.
SamplerParams neutral() {
  SamplerParams p;
  p.temp = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 1;
  return p;
}

std::map<int32_t, float> probs(const Sampler& s, const std::vector<float>& logits) {
  std::map<int32_t, float> m;
  for (const auto& t : s.distribution(logits)) m[t.id] = t.p;
  return m;
}

// Probabilities come from float softmax of float logits: relative error a
// few ulp (~1e-6); 1e-5 leaves margin.
constexpr float kTol = 1e-5f;

void expect_probs(const std::map<int32_t, float>& got, const std::map<int32_t, double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, p] : want) {
    ASSERT_TRUE(got.count(id)) << "id " << id;
    EXPECT_NEAR(got.at(id), p, kTol) << "id " << id;
  }
}

TEST(Sampler, NeutralIsSoftmax) {
  Sampler s(neutral());
  expect_probs(probs(s, known(3.0f)), {{0, 0.4}, {1, 0.3}, {2, 0.15}, {3, 0.1}, {4, 0.05}});
  const auto d = s.distribution(known());
  EXPECT_EQ(d[0].id, 0);  // sorted by probability
  EXPECT_EQ(d[4].id, 4);
}

TEST(Sampler, TopK) {
  SamplerParams p = neutral();
  p.top_k = 2;
  expect_probs(probs(Sampler(p), known()), {{0, 0.4 / 0.7}, {1, 0.3 / 0.7}});
  p.top_k = 10;  // more than the vocabulary: no effect
  EXPECT_EQ(probs(Sampler(p), known()).size(), 5u);
}

TEST(Sampler, TopP) {
  SamplerParams p = neutral();
  p.top_p = 0.5f;  // 0.4 < 0.5 <= 0.7: two tokens
  expect_probs(probs(Sampler(p), known()), {{0, 0.4 / 0.7}, {1, 0.3 / 0.7}});
  p.top_p = 0.8f;  // 0.7 < 0.8 <= 0.85: three
  expect_probs(probs(Sampler(p), known()), {{0, 0.4 / 0.85}, {1, 0.3 / 0.85}, {2, 0.15 / 0.85}});
  p.top_p = 0.0f;  // at least one token is kept
  expect_probs(probs(Sampler(p), known()), {{0, 1.0}});
}

TEST(Sampler, MinP) {
  SamplerParams p = neutral();
  p.min_p = 0.3f;  // threshold 0.12: keeps 0.4, 0.3, 0.15
  expect_probs(probs(Sampler(p), known()), {{0, 0.4 / 0.85}, {1, 0.3 / 0.85}, {2, 0.15 / 0.85}});
  p.min_p = 0.5f;  // threshold 0.2
  expect_probs(probs(Sampler(p), known()), {{0, 0.4 / 0.7}, {1, 0.3 / 0.7}});
  p.min_p = 1.0f;
  expect_probs(probs(Sampler(p), known()), {{0, 1.0}});
}

TEST(Sampler, TemperatureIsAppliedLast) {
  SamplerParams p = neutral();
  p.temp = 0.5f;  // p_i^2, renormalised
  const double z = 0.16 + 0.09 + 0.0225 + 0.01 + 0.0025;
  expect_probs(probs(Sampler(p), known()),
               {{0, 0.16 / z}, {1, 0.09 / z}, {2, 0.0225 / z}, {3, 0.01 / z}, {4, 0.0025 / z}});
  // min-p sees the temperature-1 distribution (llama.cpp order): with
  // min_p = 0.3 the 0.15 token survives although at temp 0.5 it would be
  // below 0.3 x the top probability.
  p.min_p = 0.3f;
  const double z3 = 0.16 + 0.09 + 0.0225;
  expect_probs(probs(Sampler(p), known()), {{0, 0.16 / z3}, {1, 0.09 / z3}, {2, 0.0225 / z3}});
}

TEST(Sampler, RepeatPenaltyDividesPositiveAndMultipliesNegative) {
  SamplerParams p = neutral();
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  s.accept(0);
  // Negative logit log(0.4): doubled -> weight 0.4^2 = 0.16.
  const double z = 0.16 + 0.3 + 0.15 + 0.1 + 0.05;
  expect_probs(probs(s, known()), {{0, 0.16 / z}, {1, 0.3 / z}, {2, 0.15 / z}, {3, 0.1 / z}, {4, 0.05 / z}});
  // Positive logit: halved.
  std::vector<float> pos = {4.0f, 2.0f};
  for (const auto& t : s.distribution(pos)) {
    if (t.id == 0) {
      EXPECT_FLOAT_EQ(t.logit, 2.0f);
    }
  }
}

TEST(Sampler, PresenceFrequencyAndWindow) {
  SamplerParams p = neutral();
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  p.repeat_last_n = 3;
  Sampler s(p);
  for (int32_t id : {0, 1, 1, 1}) s.accept(id);  // the window holds 1, 1, 1
  EXPECT_EQ(s.history_size(), 3u);
  std::vector<float> flat(4, 0.0f);
  std::map<int32_t, float> logit;
  for (const auto& t : s.distribution(flat)) logit[t.id] = t.logit;
  EXPECT_FLOAT_EQ(logit[0], 0.0f);                 // out of the window
  EXPECT_FLOAT_EQ(logit[1], -(3 * 0.5f + 0.25f));  // count 3
  EXPECT_FLOAT_EQ(logit[2], 0.0f);
  p.repeat_last_n = 0;  // off
  Sampler off(p);
  off.accept(1);
  EXPECT_EQ(off.history_size(), 0u);
  p.repeat_last_n = -1;  // context size
  Sampler ctx(p, 2);
  for (int32_t id : {0, 1, 2}) ctx.accept(id);
  EXPECT_EQ(ctx.history_size(), 2u);
}

TEST(Sampler, GreedyPicksLowestIdOnTies) {
  SamplerParams p;
  p.temp = 0.0f;
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 3.0f, 2.0f, 3.0f}), 1);
  p.temp = -1.0f;
  Sampler neg(p);
  EXPECT_EQ(neg.sample(std::vector<float>{5.0f, 5.0f}), 0);
  EXPECT_EQ(neg.sample(std::vector<float>{NAN, 1.0f}), 1);
  // Greedy sees the penalties.
  p.repeat_penalty = 10.0f;
  Sampler pen(p);
  pen.accept(1);
  EXPECT_EQ(pen.sample(std::vector<float>{1.0f, 3.0f, 2.0f}), 2);
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  SamplerParams p = neutral();
  p.seed = 12345;
  Sampler s(p);
  const int n = 20000;
  std::vector<int> hits(5, 0);
  for (int i = 0; i < n; ++i) ++hits[s.sample(known())];
  // Binomial standard deviation sqrt(p(1-p)/n) <= 0.0035 for n = 20000; five
  // sigma is 0.018 (a false failure has probability ~1e-6 per token, and the
  // seed is fixed anyway).
  const double want[] = {0.4, 0.3, 0.15, 0.1, 0.05};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(hits[i] / static_cast<double>(n), want[i], 0.018) << i;
}

TEST(Sampler, SameSeedSameTokens) {
  SamplerParams p = neutral();
  p.seed = 42;
  Sampler a(p), b(p);
  p.seed = 43;
  Sampler c(p);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 200; ++i) {
    ta.push_back(a.sample(known()));
    tb.push_back(b.sample(known()));
    tc.push_back(c.sample(known()));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);  // 200 draws from 5 tokens: equal by chance with probability < 0.6^200
  a.reseed(42);
  EXPECT_EQ(a.sample(known()), ta[0]);
  EXPECT_EQ(a.seed(), 42u);
  p.seed = SamplerParams::kRandomSeed;
  Sampler r(p);
  EXPECT_NE(r.seed(), SamplerParams::kRandomSeed);
}

TEST(Sampler, DefaultsAreLlamaCpp) {
  SamplerParams p;
  EXPECT_FLOAT_EQ(p.temp, 0.8f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_FLOAT_EQ(p.repeat_penalty, 1.0f);
  EXPECT_EQ(p.repeat_last_n, 64);
}

TEST(Sampler, Validation) {
  auto bad = [](auto edit, const char* flag) {
    SamplerParams p;
    edit(p);
    try {
      Sampler s(p);
      ADD_FAILURE() << flag << ": no error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  bad([](SamplerParams& p) { p.temp = NAN; }, "--temp");
  bad([](SamplerParams& p) { p.temp = INFINITY; }, "--temp");
  bad([](SamplerParams& p) { p.top_k = -1; }, "--top-k");
  bad([](SamplerParams& p) { p.top_p = 1.5f; }, "--top-p");
  bad([](SamplerParams& p) { p.top_p = -0.1f; }, "--top-p");
  bad([](SamplerParams& p) { p.min_p = 2.0f; }, "--min-p");
  bad([](SamplerParams& p) { p.repeat_penalty = 0.0f; }, "--repeat-penalty");
  bad([](SamplerParams& p) { p.repeat_last_n = -2; }, "--repeat-last-n");
  bad([](SamplerParams& p) { p.presence_penalty = 3.0f; }, "--presence-penalty");
  bad([](SamplerParams& p) { p.frequency_penalty = -2.5f; }, "--frequency-penalty");
  SamplerParams ok;
  ok.top_p = 1.0f;
  ok.min_p = 0.0f;
  ok.top_k = 0;
  EXPECT_NO_THROW(Sampler{ok});
}

}  // namespace
}  // namespace bonsai
