#include "session/profiling_backend.h"

namespace bonsai {

ProfilingBackend::ProfilingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

std::string weight_kind(const std::string& name) {
  std::string s = name;
  if (s.rfind("blk.", 0) == 0) {
    size_t dot = s.find('.', 4);
    if (dot != std::string::npos) s = s.substr(dot + 1);
  }
  for (const char* suffix : {".weight", ".bias"})
    if (s.size() > std::char_traits<char>::length(suffix) &&
        s.compare(s.size() - std::char_traits<char>::length(suffix), std::string::npos, suffix) == 0)
      s.resize(s.size() - std::char_traits<char>::length(suffix));
  return s;
}

template <class F>
void ProfilingBackend::timed(const std::string& key, uint64_t bytes, F&& f) {
  inner_->sync();
  auto t0 = std::chrono::steady_clock::now();
  f();
  inner_->sync();
  OpStat& s = stats_[key];
  s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.calls++;
  s.weight_bytes += bytes;
}

void ProfilingBackend::to_host(float* d, const float* s, size_t n) {
  timed("to_host", 0, [&] { inner_->to_host(d, s, n); });
}
void ProfilingBackend::from_host(float* d, const float* s, size_t n) {
  timed("from_host", 0, [&] { inner_->from_host(d, s, n); });
}
void ProfilingBackend::copy(float* d, const float* s, size_t n) {
  timed("copy", 0, [&] { inner_->copy(d, s, n); });
}
void ProfilingBackend::zero(float* p, size_t n) {
  timed("zero", 0, [&] { inner_->zero(p, n); });
}
void ProfilingBackend::top_k(const float* x, int64_t n, int k, int32_t* ids, float* values) {
  timed("top_k", 0, [&] { inner_->top_k(x, n, k, ids, values); });
}
void ProfilingBackend::embed(const Weight& table, const int32_t* tokens, int t, float* out) {
  timed("embed", 0, [&] { inner_->embed(table, tokens, t, out); });
}
void ProfilingBackend::rmsnorm(const float* x, const Weight& gain, float* y, int64_t rows, int64_t n,
                               float eps) {
  timed("rmsnorm", 0, [&] { inner_->rmsnorm(x, gain, y, rows, n, eps); });
}
void ProfilingBackend::hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k,
                                int64_t block, bool inverse) {
  timed(inverse ? "hadamard (embedding inverse)" : "hadamard", 0,
        [&] { inner_->hadamard(x, signs, y, rows, k, block, inverse); });
}
void ProfilingBackend::matmul(const Weight& w, const float* x, float* y, int t) {
  timed("matmul " + weight_kind(w.name), w.nbytes, [&] { inner_->matmul(w, x, y, t); });
}
void ProfilingBackend::matmul_multi(std::span<const Weight* const> ws, const float* x,
                                    std::span<float* const> ys, int t) {
  std::string key = "matmul ";
  uint64_t bytes = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    if (i) key += '+';
    key += weight_kind(ws[i]->name);
    bytes += ws[i]->nbytes;
  }
  timed(key, bytes, [&] { inner_->matmul_multi(ws, x, ys, t); });
}
void ProfilingBackend::add(const float* a, const float* b, float* y, int64_t n) {
  timed("add", 0, [&] { inner_->add(a, b, y, n); });
}
void ProfilingBackend::swiglu(const float* g, const float* u, float* y, int64_t n) {
  timed("swiglu", 0, [&] { inner_->swiglu(g, u, y, n); });
}
void ProfilingBackend::sigmoid_mul(const float* x, const float* g, float* y, int64_t n) {
  timed("sigmoid_mul", 0, [&] { inner_->sigmoid_mul(x, g, y, n); });
}
void ProfilingBackend::transpose_heads(const float* x, float* y, int64_t rows, int a, int b, int64_t d) {
  timed("transpose_heads", 0, [&] { inner_->transpose_heads(x, y, rows, a, b, d); });
}
void ProfilingBackend::take_part(const float* x, float* y, int64_t rows, int parts, int part, int64_t d) {
  timed("take_part", 0, [&] { inner_->take_part(x, y, rows, parts, part, d); });
}
void ProfilingBackend::residual_norm_site(const float* x, const float* delta, float* x_out,
                                          const Weight& gain, const float* signs, int64_t block,
                                          float* normed, float* rotated, int64_t rows, int64_t n, float eps) {
  timed("residual_norm_site", 0, [&] {
    inner_->residual_norm_site(x, delta, x_out, gain, signs, block, normed, rotated, rows, n, eps);
  });
}
void ProfilingBackend::swiglu_site(const float* gate, const float* up, float* act, const float* signs,
                                   int64_t block, float* rotated, int64_t rows, int64_t n) {
  timed("swiglu_site", 0, [&] { inner_->swiglu_site(gate, up, act, signs, block, rotated, rows, n); });
}
void ProfilingBackend::store_rows(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv) {
  timed("store_rows", 0, [&] { inner_->store_rows(cache, src, width, t, pos0, kv); });
}
void ProfilingBackend::rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0) {
  timed("rope", 0, [&] { inner_->rope(x, t, n_head, head_dim, n_rot, base, pos0); });
}
void ProfilingBackend::attention(const float* q, const void* k, const void* v, float* out, int t, int pos0,
                                 const AttentionShape& s) {
  timed("attention", 0, [&] { inner_->attention(q, k, v, out, t, pos0, s); });
}
void ProfilingBackend::ssm_conv(const float* x, float* state, const Weight& w, float* out, int t,
                                int64_t channels, int taps) {
  timed("ssm_conv", 0, [&] { inner_->ssm_conv(x, state, w, out, t, channels, taps); });
}
void ProfilingBackend::gdn_gates(const float* alpha, const float* beta_in, const Weight& a, const Weight& dt,
                                 float* g, float* beta, int t, int n_v) {
  timed("gdn_gates", 0, [&] { inner_->gdn_gates(alpha, beta_in, a, dt, g, beta, t, n_v); });
}
void ProfilingBackend::gdn_recurrence(const float* conv, const float* g, const float* beta, float* state,
                                      float* out, int t, const GdnShape& s) {
  timed("gdn_recurrence", 0, [&] { inner_->gdn_recurrence(conv, g, beta, state, out, t, s); });
}
void ProfilingBackend::gated_rmsnorm(const float* o, const float* z, const Weight& w, float* y, int64_t rows,
                                     int64_t d, float eps) {
  timed("gated_rmsnorm", 0, [&] { inner_->gated_rmsnorm(o, z, w, y, rows, d, eps); });
}

}  // namespace bonsai
