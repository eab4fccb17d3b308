// Plain-loop reference of every backend op (kernels/backend.h documents the
// semantics and shapes). f32 arithmetic, no SIMD, no threads: this is the
// specification the fast kernels are tested against.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace bonsai::ref {

void embed(const Weight& table, const int32_t* tokens, int t, float* out);
void rmsnorm(const float* x, const float* gain, float* y, int64_t rows, int64_t n, float eps);
void hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k, int64_t block,
              bool inverse);
void matmul(const Weight& w, const float* x, float* y, int t);
void add(const float* a, const float* b, float* y, int64_t n);
void swiglu(const float* gate, const float* up, float* y, int64_t n);
void sigmoid_mul(const float* x, const float* gate, float* y, int64_t n);
void transpose_heads(const float* x, float* y, int64_t rows, int a, int b, int64_t d);
void take_part(const float* x, float* y, int64_t rows, int parts, int part, int64_t d);
void rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0);
// k_cache / v_cache hold elements of type s.kv; an F16 element is converted to f32 where it is read.
void attention(const float* q, const void* k_cache, const void* v_cache, float* out, int t, int pos0,
               const AttentionShape& s);
// cache rows [pos0, pos0 + t) of width `width` = src [t][width], rounded to nearest even for F16.
void store_rows(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv);
void ssm_conv(const float* x, float* state, const float* w, float* out, int t, int64_t channels, int taps);
void gdn_gates(const float* alpha, const float* beta_in, const float* ssm_a, const float* dt_bias, float* g,
               float* beta, int t, int n_v);
void gdn_recurrence(const float* conv, const float* g, const float* beta, float* state, float* out, int t,
                    const GdnShape& s);
void gated_rmsnorm(const float* o, const float* z, const float* w, float* y, int64_t rows, int64_t d,
                   float eps);

inline float silu(float x) { return x / (1.0f + __builtin_expf(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
inline float softplus(float x) { return x > 20.0f ? x : __builtin_log1pf(__builtin_expf(x)); }

}  // namespace bonsai::ref
