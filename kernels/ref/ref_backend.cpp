#include "kernels/ref/ref_backend.h"

#include <cstring>

#include "kernels/ref/ops.h"

namespace bonsai {

float* HostArena::alloc(size_t n) {
  auto block = std::make_unique<float[]>(n == 0 ? 1 : n);  // value-initialised: zero
  float* p = block.get();
  blocks_.emplace(p, std::move(block));
  return p;
}

void HostArena::release(float* p) { blocks_.erase(p); }

void RefBackend::to_host(float* dst, const float* src, size_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void RefBackend::from_host(float* dst, const float* src, size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}
void RefBackend::copy(float* dst, const float* src, size_t n) { std::memmove(dst, src, n * sizeof(float)); }
void RefBackend::zero(float* p, size_t n) { std::memset(p, 0, n * sizeof(float)); }

void RefBackend::embed(const Weight& table, const int32_t* tokens, int t, float* out) {
  ref::embed(table, tokens, t, out);
}
void RefBackend::rmsnorm(const float* x, const Weight& gain, float* y, int64_t rows, int64_t n, float eps) {
  ref::rmsnorm(x, gain.f32(), y, rows, n, eps);
}
void RefBackend::hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k,
                          int64_t block, bool inverse) {
  ref::hadamard(x, signs, y, rows, k, block, inverse);
}
void RefBackend::matmul(const Weight& w, const float* x, float* y, int t) { ref::matmul(w, x, y, t); }
void RefBackend::add(const float* a, const float* b, float* y, int64_t n) { ref::add(a, b, y, n); }
void RefBackend::swiglu(const float* gate, const float* up, float* y, int64_t n) {
  ref::swiglu(gate, up, y, n);
}
void RefBackend::sigmoid_mul(const float* x, const float* gate, float* y, int64_t n) {
  ref::sigmoid_mul(x, gate, y, n);
}
void RefBackend::transpose_heads(const float* x, float* y, int64_t rows, int a, int b, int64_t d) {
  ref::transpose_heads(x, y, rows, a, b, d);
}
void RefBackend::take_part(const float* x, float* y, int64_t rows, int parts, int part, int64_t d) {
  ref::take_part(x, y, rows, parts, part, d);
}
void RefBackend::rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0) {
  ref::rope(x, t, n_head, head_dim, n_rot, base, pos0);
}
void RefBackend::attention(const float* q, const void* k_cache, const void* v_cache, float* out, int t,
                           int pos0, const AttentionShape& s) {
  ref::attention(q, k_cache, v_cache, out, t, pos0, s);
}
void RefBackend::store_rows(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv) {
  ref::store_rows(cache, src, width, t, pos0, kv);
}
void RefBackend::ssm_conv(const float* x, float* state, const Weight& w, float* out, int t, int64_t channels,
                          int taps) {
  ref::ssm_conv(x, state, w.f32(), out, t, channels, taps);
}
void RefBackend::gdn_gates(const float* alpha, const float* beta_in, const Weight& ssm_a,
                           const Weight& dt_bias, float* g, float* beta, int t, int n_v) {
  ref::gdn_gates(alpha, beta_in, ssm_a.f32(), dt_bias.f32(), g, beta, t, n_v);
}
void RefBackend::gdn_recurrence(const float* conv, const float* g, const float* beta, float* state,
                                float* out, int t, const GdnShape& s) {
  ref::gdn_recurrence(conv, g, beta, state, out, t, s);
}
void RefBackend::gated_rmsnorm(const float* o, const float* z, const Weight& w, float* y, int64_t rows,
                               int64_t d, float eps) {
  ref::gated_rmsnorm(o, z, w.f32(), y, rows, d, eps);
}

}  // namespace bonsai
