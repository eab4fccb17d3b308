#include "bonsai/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "bonsai/error.h"

namespace bonsai {

void SamplerParams::validate() const {
  if (!std::isfinite(temp)) usage_fail("--temp must be a finite number (<= 0: greedy), got {}", temp);
  if (top_k < 0) usage_fail("--top-k must be >= 0 (0: off), got {}", top_k);
  if (!(top_p >= 0.0f && top_p <= 1.0f)) usage_fail("--top-p must be in [0, 1] (1: off), got {}", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) usage_fail("--min-p must be in [0, 1] (0: off), got {}", min_p);
  if (!(repeat_penalty > 0.0f && std::isfinite(repeat_penalty)))
    usage_fail("--repeat-penalty must be a finite number > 0 (1: off), got {}", repeat_penalty);
  if (repeat_last_n < -1)
    usage_fail("--repeat-last-n must be >= -1 (0: off, -1: context size), got {}", repeat_last_n);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    usage_fail("--presence-penalty must be in [-2, 2] (0: off), got {}", presence_penalty);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    usage_fail("--frequency-penalty must be in [-2, 2] (0: off), got {}", frequency_penalty);
}

Sampler::Sampler(const SamplerParams& params, int n_ctx) : p_(params) {
  p_.validate();
  last_n_ =
      p_.repeat_last_n < 0 ? static_cast<size_t>(std::max(n_ctx, 0)) : static_cast<size_t>(p_.repeat_last_n);
  reseed(p_.seed);
}

void Sampler::reseed(uint64_t seed) {
  if (seed == SamplerParams::kRandomSeed) {
    std::random_device rd;
    seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (seed == SamplerParams::kRandomSeed) seed = 0;
  }
  seed_ = seed;
  rng_.seed(seed);
}

void Sampler::accept(int32_t id) {
  if (last_n_ == 0) return;
  history_.push_back(id);
  while (history_.size() > last_n_) history_.pop_front();
}

void Sampler::set_history(std::deque<int32_t> h) {
  history_ = std::move(h);
  while (history_.size() > last_n_) history_.pop_front();
}

bool Sampler::penalties_active() const {
  return last_n_ > 0 && !history_.empty() &&
         (p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f);
}

// llama.cpp's llama_sampler_penalties: a repeated token's logit is divided by
// the repeat penalty when positive and multiplied when not (so the penalty
// always lowers it), then count * frequency + presence is subtracted.
void Sampler::apply_penalties(std::vector<TokenProb>& c) const {
  std::unordered_map<int32_t, int> count;
  for (int32_t id : history_) ++count[id];
  for (auto& [id, n] : count) {
    if (id < 0 || static_cast<size_t>(id) >= c.size()) continue;
    float& l = c[id].logit;  // c is still indexed by id here
    l = l <= 0.0f ? l * p_.repeat_penalty : l / p_.repeat_penalty;
    l -= static_cast<float>(n) * p_.frequency_penalty + p_.presence_penalty;
  }
}

namespace {
bool better(const TokenProb& a, const TokenProb& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}
// A NaN logit can never be chosen.
float sane(float l) { return std::isnan(l) ? -std::numeric_limits<float>::infinity() : l; }
}  // namespace

std::vector<TokenProb> Sampler::distribution(std::span<const float> logits) const {
  if (logits.empty()) fail("sampler: no logits");
  std::vector<TokenProb> c(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c[i] = {static_cast<int32_t>(i), sane(logits[i]), 0.0f};
  if (penalties_active()) apply_penalties(c);

  if (p_.temp <= 0.0f) {
    const TokenProb best = *std::min_element(c.begin(), c.end(), better);
    return {{best.id, best.logit, 1.0f}};
  }

  // top-k (sorted), else a full sort: top-p and the final order need it.
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < c.size()) {
    const size_t n = static_cast<size_t>(p_.top_k);
    std::partial_sort(c.begin(), c.begin() + n, c.end(), better);
    c.resize(n);
  } else {
    std::sort(c.begin(), c.end(), better);
  }
  return shape(std::move(c));
}

int32_t Sampler::candidates_needed() const {
  if (penalties_active()) return 0;
  if (p_.temp <= 0.0f) return 1;
  return p_.top_k;  // 0: off, every logit takes part
}

// Identical to distribution() of the full logits: `better` is a strict total order (ids
// are distinct), so the full path's min_element / partial_sort picks exactly the first
// one / top_k of the best ones sorted the same way, and nothing after the top-k cut
// looks beyond it. (With top_k >= n_vocab the full path sorts everything; then the
// caller has passed every logit.)
int32_t Sampler::sample_best(std::span<const TokenLogit> best) {
  const int32_t need = candidates_needed();
  if (need <= 0) fail("sampler: these settings need the full logits, not the best few");
  if (best.size() < static_cast<size_t>(need))
    fail("sampler: {} candidates given, {} needed", best.size(), need);
  std::vector<TokenProb> c(best.size());
  for (size_t i = 0; i < best.size(); ++i) c[i] = {best[i].id, sane(best[i].logit), 0.0f};
  std::sort(c.begin(), c.end(), better);
  c.resize(static_cast<size_t>(need));
  if (p_.temp <= 0.0f) return c[0].id;
  return draw(shape(std::move(c)));
}

std::vector<TokenProb> Sampler::shape(std::vector<TokenProb> c) const {
  auto softmax = [](std::vector<TokenProb>& v, float scale) {
    const float mx = v[0].logit;  // v is sorted: the maximum comes first
    double sum = 0.0;
    for (auto& t : v) {
      t.p = std::exp((t.logit - mx) * scale);
      sum += t.p;
    }
    for (auto& t : v) t.p = static_cast<float>(t.p / sum);
  };

  // top-p: the smallest prefix whose probability reaches p (at least one token).
  if (p_.top_p < 1.0f) {
    softmax(c, 1.0f);
    double cum = 0.0;
    size_t keep = c.size();
    for (size_t i = 0; i < c.size(); ++i) {
      cum += c[i].p;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    c.resize(keep);
  }
  // min-p: tokens whose probability is at least min_p times the top one's,
  // i.e. logit >= max + log(min_p).
  if (p_.min_p > 0.0f) {
    const float min_logit = c[0].logit + std::log(p_.min_p);
    size_t keep = 1;
    while (keep < c.size() && c[keep].logit >= min_logit) ++keep;
    c.resize(keep);
  }
  for (auto& t : c) t.logit /= p_.temp;
  softmax(c, 1.0f);
  return c;
}

int32_t Sampler::sample(std::span<const float> logits) { return draw(distribution(logits)); }

int32_t Sampler::draw(const std::vector<TokenProb>& d) {
  if (d.size() == 1) return d[0].id;
  // u in [0, 1) from the top 53 bits; walk the cumulative distribution.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  double cum = 0.0;
  for (const auto& t : d) {
    cum += t.p;
    if (u < cum) return t.id;
  }
  return d.back().id;  // rounding: u beyond the accumulated sum
}

}  // namespace bonsai
