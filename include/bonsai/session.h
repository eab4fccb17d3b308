// A Session is one conversation's mutable state over a loaded Model: the KV
// cache of the full-attention layers, the GatedDeltaNet conv and recurrent
// states, and the position. decode() feeds one token and returns the logits
// for the next one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bonsai/kv_type.h"
#include "bonsai/model.h"
#include "bonsai/sampler.h"

namespace bonsai {

struct SessionOptions {
  int n_ctx = 4096;          // context limit (positions); 0 = the model's trained context
  std::string path = "ref";  // compute path: "ref" (scalar reference); fast paths add names
  int n_threads = 0;         // 0 = physical cores
  int main_gpu = 0;          // CUDA device (-mg) of the cuda and auto paths; the others ignore it
  std::string dump_dir;      // when set, every named activation is written as raw f32 per position
  bool profile = false;      // time every backend op (see Session::profile())
  int prefill_chunk = 0;     // tokens per batched forward in prefill(); 0 = the backend's choice
  // Element type of the KV cache (-ctk / -ctv); unset: the backend's default (f16 on CUDA, as
  // llama.cpp; f32, the reference's type, on the reference and CPU paths). Session::kv_type() says
  // which one a session has.
  std::optional<KvType> kv_type;
};

// The compute-path names SessionOptions::path takes in this build ("auto", "ref", "fast", ...).
std::vector<std::string> backend_names();
// Refuses (UsageError) a name this build would not take, listing the valid ones, so that a front end
// can reject a typo before it loads a model of several GB.
void check_backend_name(const std::string& path);
// Refuses (UsageError) a CUDA device index the path could not use: negative, or, for the cuda and
// auto paths on a machine with CUDA devices, past the last one (the message names -mg/--main-gpu and
// the valid range); and the cuda path on a machine without a usable device (Error, with the reason).
// Front ends call it before loading a model; Session calls it too.
void check_main_gpu(const std::string& path, int main_gpu);

// Time spent per backend op since the last clear (SessionOptions::profile).
struct OpProfile {
  std::string op;  // e.g. "matmul ffn_gate+ffn_up", "gdn_recurrence"
  double seconds = 0;
  uint64_t calls = 0;
  uint64_t weight_bytes = 0;  // weight bytes streamed by the op
};

// A host-memory copy of a session's state (for /regen: restore and decode again).
struct SessionSnapshot {
  int pos = 0;
  std::vector<float> state;   // KV rows [0, pos) and GDN conv/recurrent states, layer by layer
  std::vector<float> logits;  // logits after the last token
};

class Session {
 public:
  Session(const Model& model, const SessionOptions& opts = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Feeds one token at the current position; returns the n_vocab logits for
  // the next token (valid until the next call). Throws bonsai::Error when the
  // context is full or the token id is out of range.
  std::span<const float> decode(int32_t token);
  // Feeds one token like decode() but returns only the k best of the first n logits
  // (n = 0: all n_vocab), best first (larger logit, then lower id; NaN as -inf), selected
  // by the backend so that a GPU copies 2k words instead of the row
  // (Sampler::candidates_needed says when that is enough). 1 <= k <= min(n, kMaxTopK).
  // The full logits stay available to snapshot() / the prefill() that follows.
  std::span<const TokenLogit> decode_top_k(int32_t token, int k, int64_t n = 0);
  static constexpr int kMaxTopK = 64;
  // Feeds several tokens (the prompt) in batches of prefill_chunk(); returns the
  // logits after the last one. Leaves the session in the state a token-by-token
  // walk would.
  std::span<const float> prefill(std::span<const int32_t> tokens);
  // Same, and writes the logits of every fed position ([tokens.size()][n_vocab]).
  void prefill(std::span<const int32_t> tokens, std::span<float> all_logits);
  int prefill_chunk() const;

  void reset();
  int position() const;
  int n_ctx() const;
  KvType kv_type() const;
  uint64_t kv_cache_bytes() const;  // the attention layers' K and V caches for n_ctx() positions
  const Model& model() const;
  std::string backend_name() const;   // the backend actually running (e.g. cpu-avx512, cuda)
  uint64_t tokens_processed() const;  // counts every token ever fed (test hook: cache reuse)

  std::vector<OpProfile> profile() const;  // empty unless SessionOptions::profile
  void clear_profile();

  std::unique_ptr<SessionSnapshot> snapshot() const;
  void restore(const SessionSnapshot& s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bonsai
