// The generation loop and the pieces `bonsai run` and `bonsai chat` share:
// the common flags (model, context, threads, sampling), loading a model with
// its tokenizer, streaming tokens to the terminal (with the thinking block
// dimmed or hidden) and the timing line.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>

#include <CLI/CLI.hpp>

#include "bonsai/chat.h"
#include "bonsai/model.h"
#include "bonsai/sampler.h"
#include "bonsai/session.h"
#include "bonsai/tokenizer.h"

namespace bonsai::cli {

// Flags common to run and chat (llama.cpp names).
struct TextOptions {
  std::string model;
  int n_predict = -1;  // -n: -1 = until a stop token or the context is full
  int n_ctx = 4096;    // -c: 0 = the model's trained context
  int n_threads = 0;   // -t: 0 = physical cores
  int main_gpu = 0;    // -mg: CUDA device of the cuda and auto paths
  int n_ubatch = 0;    // -ub: tokens per batched prefill step; 0 = the backend's choice
  std::string path = "auto";
  std::string cache_type_k = "auto", cache_type_v = "auto";  // -ctk / -ctv
  std::optional<KvType> kv_type;  // both, after validate(); none: the backend's default
  int64_t seed = -1;              // -s: -1 = random
  SamplerParams sampling;
  std::string system_prompt;
  std::string reasoning = "on";  // on | off
  bool reasoning_hide = false;
  bool ignore_eos = false;

  bool thinking() const { return reasoning == "on"; }
  // Range checks of every value above (UsageError naming the flag); also
  // resolves the seed into `sampling`.
  void validate();
};

void add_text_options(CLI::App* cmd, TextOptions& o);

// A loaded model with its tokenizer and chat format. The tokenizer is read
// (and a missing vocabulary reported) before the weights are loaded.
struct TextModel {
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Model> model;
  std::unique_ptr<ChatFormat> chat;
};
// Throws UsageError for a missing file, Error for a bad one; prints load
// progress on stderr.
TextModel load_text_model(const TextOptions& o);
SessionOptions session_options(const TextOptions& o);
// "KV cache f16, 268.4 MB": the session's cache type and size, for the start-up line of run and chat.
std::string kv_cache_summary(const Session& s);

// Writes generated text to stdout as it arrives. Inside the thinking block
// (between <think> and </think>) text is dimmed on a terminal, or dropped
// when `hide_thinking`. Control tokens are not shown.
class TokenStreamer {
 public:
  TokenStreamer(const Tokenizer& tok, const ChatFormat& chat, bool in_thinking, bool hide_thinking,
                bool color);
  void push(int32_t id);
  void finish();  // flushes held-back bytes and resets the colour
  const std::string& text() const {
    return text_;
  }  // everything decoded (thinking included, specials rendered)
  const Tokenizer& tokenizer() const { return tok_; }

 private:
  void emit(const std::string& s);
  const Tokenizer& tok_;
  const ChatFormat& chat_;
  Detokenizer shown_;  // render_special = false: what the user sees
  Detokenizer raw_;    // render_special = true: the exact text (for the chat history)
  bool thinking_, hide_, color_, dimmed_ = false;
  bool skip_ws_ = false;  // drop the blank lines after a hidden thinking block
  std::string text_;
};

struct GenerationStats {
  int prompt_tokens = 0;
  double prompt_s = 0;
  int generated = 0;
  double gen_s = 0;
  enum class End { Stop, Limit, ContextFull, Interrupted } end = End::Stop;
};

struct GenerationRequest {
  int n_predict = -1;
  bool ignore_eos = false;
  // Decode the last generated token too (chat: the KV cache must hold the
  // whole answer for the next turn).
  bool decode_last = false;
  const std::atomic<bool>* interrupt = nullptr;  // set by the SIGINT handler
};

// Feeds `prompt` (may be empty when `logits` are already current), then
// samples until a stop token (unless ignored), n_predict tokens, a full
// context or an interrupt. Every prompt and generated token is accepted into
// the sampler. Throws UsageError when the prompt does not fit in the context.
GenerationStats generate(Session& s, Sampler& sampler, const ChatFormat& chat,
                         std::span<const int32_t> prompt, const GenerationRequest& req, TokenStreamer& out);

// While alive, SIGINT (Ctrl-C) sets flag() instead of killing the process;
// the previous handler comes back on destruction. The flag is the one piece
// of static state here: a signal handler can reach nothing else, and a
// lock-free std::atomic<bool> is async-signal-safe.
class SigintGuard {
 public:
  SigintGuard();
  ~SigintGuard();
  SigintGuard(const SigintGuard&) = delete;
  SigintGuard& operator=(const SigintGuard&) = delete;
  static std::atomic<bool>& flag();

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;
};

// "timing: prompt 12 tokens, 95.2 tok/s | generated 8 tokens, 40.1 tok/s"
std::string timing_line(const GenerationStats& st);

}  // namespace bonsai::cli
