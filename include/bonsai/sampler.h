// Next-token sampling with llama.cpp's semantics and defaults. The chain, in
// llama.cpp's default order:
//
//   penalties (repeat / presence / frequency over the last repeat_last_n accepted tokens)
//   -> top-k -> top-p -> min-p -> temperature -> draw from the softmax
//
// temp <= 0 is greedy: the highest penalised logit, the lowest id on ties.
// The RNG is per Sampler (std::mt19937_64 seeded from `seed`), so the same
// seed and the same logits give the same tokens.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <random>
#include <span>
#include <vector>

namespace bonsai {

struct SamplerParams {
  static constexpr uint64_t kRandomSeed =
      std::numeric_limits<uint64_t>::max();  // seed from std::random_device

  float temp = 0.8f;               // --temp: <= 0 greedy
  int32_t top_k = 40;              // --top-k: 0 = off
  float top_p = 0.95f;             // --top-p: 1 = off
  float min_p = 0.05f;             // --min-p: 0 = off
  float repeat_penalty = 1.0f;     // --repeat-penalty: 1 = off
  int32_t repeat_last_n = 64;      // --repeat-last-n: 0 = off, -1 = context size
  float presence_penalty = 0.0f;   // --presence-penalty: 0 = off
  float frequency_penalty = 0.0f;  // --frequency-penalty: 0 = off
  uint64_t seed = kRandomSeed;     // -s/--seed

  // Throws UsageError naming the flag and its valid range.
  void validate() const;
};

// One of the best logits, as Session::decode_top_k returns them.
struct TokenLogit {
  int32_t id;
  float logit;
};

struct TokenProb {
  int32_t id;
  float logit;  // after penalties and temperature
  float p;      // probability of being drawn
};

class Sampler {
 public:
  // Validates `params`; n_ctx resolves repeat_last_n = -1.
  explicit Sampler(const SamplerParams& params, int n_ctx = 0);

  // Picks the next token from `logits` (n_vocab values). Does not record it:
  // call accept() with the token actually used.
  int32_t sample(std::span<const float> logits);
  // The distribution sample() draws from: the surviving candidates, sorted
  // by probability (descending; ties by id), probabilities summing to 1.
  std::vector<TokenProb> distribution(std::span<const float> logits) const;

  // How many of the best logits sample() reads, for the current parameters and history:
  // 1 when greedy, top_k when top-k is on (top-p and min-p then see only those), 0 when it
  // needs them all (top-k off, or a penalty active: it may move any recorded id).
  int32_t candidates_needed() const;
  // sample() from the best candidates_needed() or more logits of the vocabulary (in any
  // order; NaN counts as -inf): the same token, and the same RNG draws, as sample() of
  // the full logits. Throws bonsai::Error when the full logits are needed or too few are given.
  int32_t sample_best(std::span<const TokenLogit> best);

  // Records a token (prompt or generated) for the penalties.
  void accept(int32_t id);
  // Forgets the recorded tokens (a new conversation); the RNG continues.
  void reset_history() { history_.clear(); }
  void reseed(uint64_t seed);
  uint64_t seed() const { return seed_; }  // the seed in use (resolved when random)
  const SamplerParams& params() const { return p_; }
  size_t history_size() const { return history_.size(); }
  // The recorded tokens, oldest first (chat's /regen saves and restores them).
  const std::deque<int32_t>& history() const { return history_; }
  void set_history(std::deque<int32_t> h);

 private:
  bool penalties_active() const;
  void apply_penalties(std::vector<TokenProb>& c) const;
  // distribution() after the top-k cut: c holds the survivors, sorted best first.
  std::vector<TokenProb> shape(std::vector<TokenProb> c) const;
  int32_t draw(const std::vector<TokenProb>& d);

  SamplerParams p_;
  size_t last_n_ = 0;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::deque<int32_t> history_;  // the last last_n_ accepted tokens
};

}  // namespace bonsai
