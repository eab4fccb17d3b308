#include "bonsai/session.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "bonsai/error.h"
#include "model/graph.h"
#include "session/backend_registry.h"
#include "session/profiling_backend.h"

namespace bonsai {

struct Session::Impl {
  const Model& model;
  std::unique_ptr<Backend> backend;
  ProfilingBackend* profiler = nullptr;  // == backend.get() when profiling
  std::unique_ptr<Graph> graph;
  int n_ctx = 0;
  int pos = 0;
  int chunk = 64;
  uint64_t processed = 0;
  std::vector<float> logits;      // [n_vocab] after the last token (when logits_on_host)
  bool logits_on_host = true;     // false after decode_top_k: the row is still in backend memory
  std::vector<int32_t> best_ids;  // decode_top_k's result
  std::vector<float> best_values;
  std::vector<TokenLogit> best;

  Impl(const Model& m, const SessionOptions& o) : model(m) {
    const ModelConfig& c = m.config();
    n_ctx = o.n_ctx > 0 ? o.n_ctx : static_cast<int>(c.n_ctx_train);
    if (n_ctx <= 0) usage_fail("context size must be positive (got {})", n_ctx);
    if (c.n_ctx_train > 0 && static_cast<uint32_t>(n_ctx) > c.n_ctx_train)
      spdlog::warn(
          "context size {} is larger than the model's trained context {}: positions past it were "
          "never trained",
          n_ctx, c.n_ctx_train);
    if (o.prefill_chunk < 0 || o.prefill_chunk > 4096)
      usage_fail("prefill chunk must be in [1, 4096], or 0 for the backend's choice (got {})",
                 o.prefill_chunk);
    backend = create_backend(o.path, o.n_threads, o.main_gpu);
    // 0: the backend's preference (a GPU amortises each weight pass over more tokens), else 64
    chunk = o.prefill_chunk > 0 ? o.prefill_chunk : backend->preferred_prefill_chunk();
    if (chunk <= 0) chunk = 64;
    if (o.profile) {
      auto p = std::make_unique<ProfilingBackend>(std::move(backend));
      profiler = p.get();
      backend = std::move(p);
    }
    graph = std::make_unique<Graph>(m, *backend, n_ctx, o.kv_type.value_or(backend->default_kv_type()));
    if (!o.dump_dir.empty()) graph->set_dump_dir(o.dump_dir);
    logits.assign(c.n_vocab, 0.0f);
  }

  std::vector<float>& host_logits() {
    if (!logits_on_host) graph->logits_to_host(logits.data());
    logits_on_host = true;
    return logits;
  }

  void check_token(int32_t tok) const {
    if (tok < 0 || static_cast<uint32_t>(tok) >= model.config().n_vocab)
      fail("token id {} is out of range [0, {})", tok, model.config().n_vocab);
  }
};

Session::Session(const Model& model, const SessionOptions& opts)
    : impl_(std::make_unique<Impl>(model, opts)) {}
Session::~Session() = default;

std::span<const float> Session::decode(int32_t token) {
  Impl& s = *impl_;
  s.check_token(token);
  if (s.pos >= s.n_ctx)
    fail("context full: all {} positions are used (reset the session or raise -c)", s.n_ctx);
  s.graph->forward(&token, 1, s.pos, s.logits.data(), false);
  s.logits_on_host = true;
  ++s.pos;
  ++s.processed;
  return s.logits;
}

std::span<const TokenLogit> Session::decode_top_k(int32_t token, int k, int64_t n) {
  static_assert(kMaxTopK == bonsai::kMaxTopK);
  Impl& s = *impl_;
  s.check_token(token);
  const int64_t V = s.model.config().n_vocab;
  if (n == 0) n = V;
  if (k < 1 || k > kMaxTopK || n < k || n > V)
    fail("decode_top_k: k = {} of n = {} logits (need 1 <= k <= min(n, {}), n <= n_vocab = {})", k, n,
         kMaxTopK, V);
  if (s.pos >= s.n_ctx)
    fail("context full: all {} positions are used (reset the session or raise -c)", s.n_ctx);
  s.best_ids.resize(static_cast<size_t>(k));
  s.best_values.resize(static_cast<size_t>(k));
  s.graph->forward_top_k(token, s.pos, k, n, s.best_ids.data(), s.best_values.data());
  s.logits_on_host = false;
  ++s.pos;
  ++s.processed;
  s.best.resize(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) s.best[i] = {s.best_ids[i], s.best_values[i]};
  return s.best;
}

std::span<const float> Session::prefill(std::span<const int32_t> tokens) {
  prefill(tokens, {});
  return impl_->host_logits();  // (no tokens: the logits of the last decode)
}

void Session::prefill(std::span<const int32_t> tokens, std::span<float> all_logits) {
  Impl& s = *impl_;
  const size_t V = s.model.config().n_vocab;
  if (tokens.empty()) return;
  if (!all_logits.empty() && all_logits.size() != tokens.size() * V)
    fail("prefill: logits buffer holds {} floats, {} tokens need {}", all_logits.size(), tokens.size(),
         tokens.size() * V);
  for (int32_t t : tokens) s.check_token(t);
  if (s.pos + static_cast<int64_t>(tokens.size()) > s.n_ctx)
    fail("context full: {} prompt tokens at position {} exceed n_ctx = {}", tokens.size(), s.pos, s.n_ctx);
  // Chunks bound the activation memory ([chunk][width] per buffer) while each
  // weight is still streamed once per chunk instead of once per token.
  for (size_t at = 0; at < tokens.size(); at += static_cast<size_t>(s.chunk)) {
    const int t = static_cast<int>(std::min(tokens.size() - at, static_cast<size_t>(s.chunk)));
    const bool last = at + static_cast<size_t>(t) == tokens.size();
    if (!all_logits.empty()) {
      s.graph->forward(tokens.data() + at, t, s.pos, all_logits.data() + at * V, true);
      if (last) std::copy_n(all_logits.data() + (at + t - 1) * V, V, s.logits.data());
      if (last) s.logits_on_host = true;
    } else if (last) {
      s.graph->forward(tokens.data() + at, t, s.pos, s.logits.data(), false);
      s.logits_on_host = true;
    } else {
      s.graph->forward(tokens.data() + at, t, s.pos, nullptr, false);
    }
    s.pos += t;
    s.processed += static_cast<uint64_t>(t);
  }
}

int Session::prefill_chunk() const { return impl_->chunk; }

void Session::reset() {
  impl_->graph->reset_state();
  impl_->pos = 0;
}

int Session::position() const { return impl_->pos; }
int Session::n_ctx() const { return impl_->n_ctx; }
KvType Session::kv_type() const { return impl_->graph->state().kv; }
uint64_t Session::kv_cache_bytes() const { return impl_->graph->kv_cache_bytes(); }
const Model& Session::model() const { return impl_->model; }
std::string Session::backend_name() const { return std::string(impl_->backend->name()); }
uint64_t Session::tokens_processed() const { return impl_->processed; }

std::vector<OpProfile> Session::profile() const {
  std::vector<OpProfile> out;
  if (!impl_->profiler) return out;
  for (const auto& [op, st] : impl_->profiler->stats())
    out.push_back({op, st.seconds, st.calls, st.weight_bytes});
  return out;
}

void Session::clear_profile() {
  if (impl_->profiler) impl_->profiler->clear();
}

std::unique_ptr<SessionSnapshot> Session::snapshot() const {
  auto snap = std::make_unique<SessionSnapshot>();
  snap->pos = impl_->pos;
  snap->state = impl_->graph->save_state(impl_->pos);
  snap->logits = impl_->host_logits();
  return snap;
}

void Session::restore(const SessionSnapshot& snap) {
  impl_->graph->load_state(snap.state, snap.pos);
  impl_->pos = snap.pos;
  impl_->logits = snap.logits;
  impl_->logits_on_host = true;
}

}  // namespace bonsai
