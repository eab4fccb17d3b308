#include "text_generate.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/core.h>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/session.h"
#include "commands.h"
#include "text_cli.h"

namespace bonsai::cli {

void TextOptions::validate() {
  if (n_predict < -1) usage_fail("-n/--n-predict must be >= -1 (-1: until a stop token), got {}", n_predict);
  if (n_ctx < 0) usage_fail("-c/--ctx-size must be >= 0 (0: the model's trained context), got {}", n_ctx);
  if (n_threads < 0 || n_threads > 1024)
    usage_fail("-t/--threads must be in [0, 1024] (0: auto), got {}", n_threads);
  if (n_ubatch < 0 || n_ubatch > 4096)
    usage_fail("-ub/--ubatch-size must be in [1, 4096], or 0 for the backend's choice, got {}", n_ubatch);
  if (seed < -1) usage_fail("-s/--seed must be >= 0, or -1 for a random seed, got {}", seed);
  check_backend_name(path);
  check_main_gpu(path, main_gpu);
  kv_type = parse_kv_types(cache_type_k, cache_type_v);
  if (reasoning != "on" && reasoning != "off")
    usage_fail("--reasoning must be on or off, got '{}'", reasoning);
  sampling.seed = seed < 0 ? SamplerParams::kRandomSeed : static_cast<uint64_t>(seed);
  sampling.validate();
}

void add_text_options(CLI::App* cmd, TextOptions& o) {
  cmd->add_option("-m,--model", o.model, "GGUF model file (with a vocabulary)")->required();
  cmd->add_option("-n,--n-predict", o.n_predict, "Tokens to generate per answer (-1: until a stop token)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o.n_ctx, "Context size in tokens (0: the model's trained context)")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o.n_threads, "Threads (0: physical cores)")->capture_default_str();
  cmd->add_option(
         "--ubatch-size", o.n_ubatch,
         "Prompt tokens per batched forward step, also -ub (0: the backend's choice: 1024 on CUDA, 64 on "
         "the CPU)")
      ->capture_default_str();
  cmd->add_option(
         "--path,--backend", o.path,
         "Compute path: auto (cuda when a device exists, else fast), fast/cpu (CPU kernels, faithful), "
         "fast-int8, cuda, ref (scalar reference)")
      ->capture_default_str();
  add_main_gpu_option(cmd, o.main_gpu);
  add_cache_type_options(cmd, o.cache_type_k, o.cache_type_v);
  cmd->add_option("-s,--seed", o.seed, "Sampling seed (-1: random)")->capture_default_str();
  auto* g = "Sampling";
  SamplerParams& s = o.sampling;
  cmd->add_option("--temp", s.temp, "Temperature (<= 0: greedy)")->capture_default_str()->group(g);
  cmd->add_option("--top-k", s.top_k, "Top-k (0: off)")->capture_default_str()->group(g);
  cmd->add_option("--top-p", s.top_p, "Top-p (1: off)")->capture_default_str()->group(g);
  cmd->add_option("--min-p", s.min_p, "Min-p (0: off)")->capture_default_str()->group(g);
  cmd->add_option("--repeat-penalty", s.repeat_penalty, "Repeat penalty (1: off)")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--repeat-last-n", s.repeat_last_n,
                  "Tokens the penalties look at (0: off, -1: context size)")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--presence-penalty", s.presence_penalty, "Presence penalty (0: off)")
      ->capture_default_str()
      ->group(g);
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "Frequency penalty (0: off)")
      ->capture_default_str()
      ->group(g);
  // "-sys" (llama.cpp's spelling) is rewritten to --system-prompt in main.cpp:
  // CLI11 has no multi-letter single-dash options.
  cmd->add_option("--system-prompt", o.system_prompt, "System prompt (also -sys)");
  cmd->add_option("--reasoning", o.reasoning, "Thinking block: on | off")->capture_default_str();
  cmd->add_flag("--ignore-eos", o.ignore_eos, "Never stop on a stop token (they are never sampled)");
}

TextModel load_text_model(const TextOptions& o) {
  require_model_file(o.model);
  TextModel tm;
  {
    // Tokenizer first: a logits-only file is refused before any weight is touched.
    GgufFile f = GgufFile::open(o.model);
    tm.tok = Tokenizer::from_gguf(f);
    tm.chat = std::make_unique<ChatFormat>(ChatFormat::from_gguf(f, *tm.tok));
  }
  const bool tty = ::isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  LoadOptions lo;
  if (tty) {
    lo.progress = [&](size_t done, size_t total) {
      fmt::print(stderr, "\rloading {}: {}/{} tensors", o.model, done, total);
      std::fflush(stderr);
    };
  }
  tm.model = Model::load(o.model, lo);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto si = [](double v, const char* unit) {
    if (v >= 1e9) return fmt::format("{:.2f} G{}", v / 1e9, unit);
    if (v >= 1e6) return fmt::format("{:.2f} M{}", v / 1e6, unit);
    return fmt::format("{:.1f} k{}", v / 1e3, unit);
  };
  fmt::print(stderr, "{}loaded {}: {} parameters, {}, {:.2f} s\n", tty ? "\r\033[K" : "", o.model,
             si(static_cast<double>(tm.model->n_params()), ""),
             si(static_cast<double>(tm.model->weight_bytes()), "B"), s);
  if (static_cast<uint32_t>(tm.tok->n_vocab()) > tm.model->config().n_vocab)
    fail("{}: the vocabulary has {} tokens but the model produces {} logits", o.model, tm.tok->n_vocab(),
         tm.model->config().n_vocab);
  return tm;
}

SessionOptions session_options(const TextOptions& o) {
  SessionOptions so;
  so.n_ctx = o.n_ctx;
  so.n_threads = o.n_threads;
  so.main_gpu = o.main_gpu;
  so.prefill_chunk = o.n_ubatch;
  so.path = o.path;
  so.kv_type = o.kv_type;
  return so;
}

std::string kv_cache_summary(const Session& s) {
  const double b = static_cast<double>(s.kv_cache_bytes());
  return fmt::format("KV cache {}, {}", kv_type_name(s.kv_type()),
                     b >= 1e9 ? fmt::format("{:.2f} GB", b / 1e9) : fmt::format("{:.1f} MB", b / 1e6));
}

TokenStreamer::TokenStreamer(const Tokenizer& tok, const ChatFormat& chat, bool in_thinking,
                             bool hide_thinking, bool color)
    : tok_(tok),
      chat_(chat),
      shown_(tok, false),
      raw_(tok, true),
      thinking_(in_thinking),
      hide_(hide_thinking),
      color_(color) {}

void TokenStreamer::emit(const std::string& s) {
  if (s.empty()) return;
  if (thinking_) {
    if (hide_) return;
    if (color_ && !dimmed_) {
      std::fputs("\033[2m", stdout);
      dimmed_ = true;
    }
  } else if (dimmed_) {
    std::fputs("\033[0m", stdout);
    dimmed_ = false;
  }
  std::string_view v = s;
  if (skip_ws_) {
    // After a hidden thinking block, the blank lines that follow </think>.
    while (!v.empty() && (v.front() == '\n' || v.front() == ' ')) v.remove_prefix(1);
    if (v.empty()) return;
    skip_ws_ = false;
  }
  std::fwrite(v.data(), 1, v.size(), stdout);
  std::fflush(stdout);
}

void TokenStreamer::push(int32_t id) {
  text_ += raw_.push(id);
  if (id == chat_.think_open() && id >= 0) {
    emit(shown_.flush());
    thinking_ = true;
    emit(shown_.push(id));
    return;
  }
  if (id == chat_.think_close() && id >= 0) {
    emit(shown_.flush());  // still inside the block
    emit(shown_.push(id));
    thinking_ = false;
    skip_ws_ = hide_;
    return;
  }
  emit(shown_.push(id));
}

void TokenStreamer::finish() {
  emit(shown_.flush());
  text_ += raw_.flush();
  if (dimmed_) {
    std::fputs("\033[0m", stdout);
    dimmed_ = false;
  }
  std::fflush(stdout);
}

GenerationStats generate(Session& s, Sampler& sampler, const ChatFormat& chat,
                         std::span<const int32_t> prompt, const GenerationRequest& req, TokenStreamer& out) {
  using clock = std::chrono::steady_clock;
  GenerationStats st;
  st.prompt_tokens = static_cast<int>(prompt.size());
  if (s.position() + static_cast<int64_t>(prompt.size()) > s.n_ctx())
    usage_fail("the prompt needs {} tokens at position {} but the context (-c) holds {}", prompt.size(),
               s.position(), s.n_ctx());
  const auto t0 = clock::now();
  std::span<const float> logits = s.prefill(prompt);
  for (int32_t t : prompt) sampler.accept(t);
  const auto t1 = clock::now();
  st.prompt_s = std::chrono::duration<double>(t1 - t0).count();

  // Logits past the vocabulary (padded output rows) are never sampled.
  const size_t n_tok = std::min(logits.size(), static_cast<size_t>(out.tokenizer().n_vocab()));
  std::vector<float> masked;
  // With --ignore-eos the stop tokens are -inf in the full logits; when only the best few
  // logits are fetched (below) they are fetched as extra candidates and put back as -inf,
  // which leaves the sampler's top candidates exactly those of the masked row.
  std::vector<int32_t> masked_ids;
  if (req.ignore_eos)
    for (int32_t id : chat.stop_tokens())
      if (id >= 0 && static_cast<size_t>(id) < n_tok) masked_ids.push_back(id);
  std::sort(masked_ids.begin(), masked_ids.end());
  masked_ids.erase(std::unique(masked_ids.begin(), masked_ids.end()), masked_ids.end());
  std::span<const TokenLogit> best;  // this step's candidates when non-empty, else `logits`
  std::vector<TokenLogit> cand;
  for (;;) {
    if (req.n_predict >= 0 && st.generated >= req.n_predict) {
      st.end = GenerationStats::End::Limit;
      break;
    }
    if (req.interrupt && req.interrupt->load()) {
      st.end = GenerationStats::End::Interrupted;
      break;
    }
    int32_t tok = 0;
    if (!best.empty()) {
      cand.clear();
      for (const TokenLogit& b : best)
        if (!std::binary_search(masked_ids.begin(), masked_ids.end(), b.id)) cand.push_back(b);
      for (int32_t id : masked_ids) cand.push_back({id, -std::numeric_limits<float>::infinity()});
      tok = sampler.sample_best(cand);
    } else {
      std::span<const float> l = logits.first(n_tok);
      if (req.ignore_eos) {
        masked.assign(l.begin(), l.end());
        for (int32_t id : chat.stop_tokens())
          if (static_cast<size_t>(id) < masked.size()) masked[id] = -std::numeric_limits<float>::infinity();
        l = masked;
      }
      tok = sampler.sample(l);
    }
    if (!req.ignore_eos && chat.is_stop(tok)) {
      st.end = GenerationStats::End::Stop;
      break;
    }
    sampler.accept(tok);
    out.push(tok);
    ++st.generated;
    const bool last = req.n_predict >= 0 && st.generated >= req.n_predict;
    if (last && !req.decode_last) {
      st.end = GenerationStats::End::Limit;
      break;
    }
    if (s.position() >= s.n_ctx()) {
      st.end = GenerationStats::End::ContextFull;
      break;
    }
    // Only the best few logits cross from the backend when they are all the sampler reads.
    const int32_t need = sampler.candidates_needed();
    const size_t k = static_cast<size_t>(need) + masked_ids.size();
    if (need > 0 && k <= static_cast<size_t>(Session::kMaxTopK) && k <= n_tok) {
      best = s.decode_top_k(tok, static_cast<int>(k), static_cast<int64_t>(n_tok));
    } else {
      best = {};
      logits = s.decode(tok);
    }
  }
  out.finish();
  st.gen_s = std::chrono::duration<double>(clock::now() - t1).count();
  return st;
}

namespace {
std::atomic<bool> g_sigint{false};  // see SigintGuard
static_assert(std::atomic<bool>::is_always_lock_free);
extern "C" void on_sigint(int) { g_sigint.store(true); }
}  // namespace

struct SigintGuard::Saved {
  struct sigaction old {};
};

SigintGuard::SigintGuard() : saved_(std::make_unique<Saved>()) {
  g_sigint.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &saved_->old);
}

SigintGuard::~SigintGuard() { sigaction(SIGINT, &saved_->old, nullptr); }

std::atomic<bool>& SigintGuard::flag() { return g_sigint; }

std::string timing_line(const GenerationStats& st) {
  auto rate = [](int n, double s) { return s > 0 ? n / s : 0.0; };
  return fmt::format("timing: prompt {} tokens, {:.2f} tok/s | generated {} tokens, {:.2f} tok/s",
                     st.prompt_tokens, rate(st.prompt_tokens, st.prompt_s), st.generated,
                     rate(st.generated, st.gen_s));
}

}  // namespace bonsai::cli
