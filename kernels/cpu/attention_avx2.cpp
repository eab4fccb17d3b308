#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/ref/ops.h"
#include "runtime/env.h"

namespace bonsai::cpu {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

inline float dot(const float* a, const float* b, int d) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int e = 0;
  for (; e + 16 <= d; e += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), _mm256_loadu_ps(b + e), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e + 8), _mm256_loadu_ps(b + e + 8), acc1);
  }
  for (; e < d; e += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), _mm256_loadu_ps(b + e), acc0);
  return hsum(_mm256_add_ps(acc0, acc1));
}

// A decode step (one token) over n_kv > chunk positions, flash-decoding style: one task per (KV
// head, chunk of `chunk` positions) computes for each query head of the group its chunk's maximum
// score m, the sum l of exp(score - m) and the sum of exp(score - m)·v; then one task per query
// head merges the chunks in order: out = Σ_c e^(m_c - M) acc_c / Σ_c e^(m_c - M) l_c (M = max m_c).
// Why: one task per (token, KV head) gives a decode step only n_head_kv tasks (4 on the 27B), so at
// long contexts most threads idled while 4 streamed the whole cache. The chunk size is fixed (not
// derived from the thread count), so the result does not depend on -t.
void attention_decode_chunked(const float* q, const float* k_cache, const float* v_cache, float* out,
                              int pos0, const AttentionShape& s, int chunk, ThreadPool& pool) {
  const int d = s.head_dim, group = s.n_head / s.n_head_kv, n_kv = pos0 + 1;
  const int chunks = (n_kv + chunk - 1) / chunk;
  const int64_t kv_stride = static_cast<int64_t>(s.n_head_kv) * d;
  const int64_t stride = 2 * group + static_cast<int64_t>(group) * d;  // per (KV head, chunk): m, l, acc
  // [n_head_kv][chunks][m[group] l[group] acc[group][d]]; every element is written by its task
  std::unique_ptr<float[]> part(new float[static_cast<size_t>(s.n_head_kv) * chunks * stride]);
  pool.parallel_for(static_cast<int64_t>(s.n_head_kv) * chunks, [&](int64_t task, int) {
    const int hk = static_cast<int>(task / chunks), c = static_cast<int>(task % chunks);
    const int p0 = c * chunk, p1 = std::min(n_kv, p0 + chunk);
    float* m = part.get() + task * stride;
    float *l = m + group, *acc = m + 2 * group;
    const float* qg = q + static_cast<int64_t>(hk) * group * d;
    std::vector<float> w(static_cast<size_t>(p1 - p0) * group);  // [p][g] scores, then exp(score - m)
    for (int p = p0; p < p1; ++p) {
      const float* kp = k_cache + p * kv_stride + hk * d;
      for (int g = 0; g < group; ++g)
        w[static_cast<size_t>(p - p0) * group + g] = dot(qg + g * d, kp, d) * s.scale;
    }
    for (int g = 0; g < group; ++g) {
      float mx = -INFINITY, sum = 0;
      for (int p = 0; p < p1 - p0; ++p) mx = std::max(mx, w[static_cast<size_t>(p) * group + g]);
      for (int p = 0; p < p1 - p0; ++p)
        sum += (w[static_cast<size_t>(p) * group + g] = std::exp(w[static_cast<size_t>(p) * group + g] - mx));
      m[g] = mx;
      l[g] = sum;
    }
    std::fill(acc, acc + static_cast<int64_t>(group) * d, 0.0f);
    for (int p = p0; p < p1; ++p) {
      const float* vp = v_cache + p * kv_stride + hk * d;
      for (int g = 0; g < group; ++g) {
        const __m256 wp = _mm256_set1_ps(w[static_cast<size_t>(p - p0) * group + g]);
        float* o = acc + g * d;
        for (int e = 0; e < d; e += 8)
          _mm256_storeu_ps(o + e, _mm256_fmadd_ps(wp, _mm256_loadu_ps(vp + e), _mm256_loadu_ps(o + e)));
      }
    }
  });
  pool.parallel_for(static_cast<int64_t>(s.n_head_kv) * group, [&](int64_t task, int) {
    const int hk = static_cast<int>(task / group), g = static_cast<int>(task % group);
    const float* base = part.get() + static_cast<int64_t>(hk) * chunks * stride;
    float mx = -INFINITY;
    for (int c = 0; c < chunks; ++c) mx = std::max(mx, base[c * stride + g]);
    float* o = out + (static_cast<int64_t>(hk) * group + g) * d;
    std::fill(o, o + d, 0.0f);
    float den = 0;
    for (int c = 0; c < chunks; ++c) {
      const float* pc = base + c * stride;
      const float f = std::exp(pc[g] - mx);  // every chunk has a position: its m is finite
      den += f * pc[group + g];
      const __m256 fv = _mm256_set1_ps(f);
      const float* a = pc + 2 * group + static_cast<int64_t>(g) * d;
      for (int e = 0; e < d; e += 8)
        _mm256_storeu_ps(o + e, _mm256_fmadd_ps(fv, _mm256_loadu_ps(a + e), _mm256_loadu_ps(o + e)));
    }
    const __m256 inv = _mm256_set1_ps(1.0f / den);
    for (int e = 0; e < d; e += 8) _mm256_storeu_ps(o + e, _mm256_mul_ps(inv, _mm256_loadu_ps(o + e)));
  });
}

}  // namespace

void attention_avx2(const float* q, const float* k_cache, const float* v_cache, float* out, int t, int pos0,
                    const AttentionShape& s, ThreadPool& pool) {
  const int d = s.head_dim, group = s.n_head / s.n_head_kv;
  if (d % 8 != 0) {
    ref::attention(q, k_cache, v_cache, out, t, pos0, s);
    return;
  }
  // BONSAI_CPU_ATTN_CHUNK: positions per task of a long-context decode step (0: one task per KV
  // head at any length, as before session 14), read once per process.
  static const int chunk = env_int("BONSAI_CPU_ATTN_CHUNK", 512, 0, 1 << 20);
  if (t == 1 && chunk > 0 && pos0 + 1 > chunk) {
    attention_decode_chunked(q, k_cache, v_cache, out, pos0, s, chunk, pool);
    return;
  }
  const int64_t kv_stride = static_cast<int64_t>(s.n_head_kv) * d;
  pool.parallel_for(static_cast<int64_t>(t) * s.n_head_kv, [&](int64_t task, int) {
    const int i = static_cast<int>(task / s.n_head_kv), hk = static_cast<int>(task % s.n_head_kv);
    const int n_kv = pos0 + i + 1;
    std::vector<float> w(static_cast<size_t>(n_kv) * group);  // [p][g] scores, then weights
    const float* qg = q + (static_cast<int64_t>(i) * s.n_head + static_cast<int64_t>(hk) * group) * d;
    for (int p = 0; p < n_kv; ++p) {
      const float* kp = k_cache + p * kv_stride + hk * d;
      for (int g = 0; g < group; ++g)
        w[static_cast<size_t>(p) * group + g] = dot(qg + g * d, kp, d) * s.scale;
    }
    std::vector<float> inv(group);
    for (int g = 0; g < group; ++g) {
      float mx = -INFINITY, sum = 0;
      for (int p = 0; p < n_kv; ++p) mx = std::max(mx, w[static_cast<size_t>(p) * group + g]);
      for (int p = 0; p < n_kv; ++p)
        sum += (w[static_cast<size_t>(p) * group + g] = std::exp(w[static_cast<size_t>(p) * group + g] - mx));
      inv[g] = 1.0f / sum;
    }
    float* og = out + (static_cast<int64_t>(i) * s.n_head + static_cast<int64_t>(hk) * group) * d;
    for (int64_t e = 0; e < static_cast<int64_t>(group) * d; ++e) og[e] = 0;
    for (int p = 0; p < n_kv; ++p) {
      const float* vp = v_cache + p * kv_stride + hk * d;
      for (int g = 0; g < group; ++g) {
        const __m256 wp = _mm256_set1_ps(w[static_cast<size_t>(p) * group + g] * inv[g]);
        float* o = og + g * d;
        for (int e = 0; e < d; e += 8)
          _mm256_storeu_ps(o + e, _mm256_fmadd_ps(wp, _mm256_loadu_ps(vp + e), _mm256_loadu_ps(o + e)));
      }
    }
  });
}

}  // namespace bonsai::cpu
