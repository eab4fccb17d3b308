#include <immintrin.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/ref/ops.h"

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

}  // namespace

void attention_avx2(const float* q, const float* k_cache, const float* v_cache, float* out, int t, int pos0,
                    const AttentionShape& s, ThreadPool& pool) {
  const int d = s.head_dim, group = s.n_head / s.n_head_kv;
  if (d % 8 != 0) {
    ref::attention(q, k_cache, v_cache, out, t, pos0, s);
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
