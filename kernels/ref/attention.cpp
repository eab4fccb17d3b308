// Reference RoPE (NeoX rotate-half) and causal GQA attention over a KV cache.
#include <cmath>
#include <vector>

#include "kernels/ref/ops.h"

namespace bonsai::ref {

void rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0) {
  const int half = n_rot / 2;
  for (int i = 0; i < t; ++i) {
    const float pos = static_cast<float>(pos0 + i);
    for (int h = 0; h < n_head; ++h) {
      float* v = x + (static_cast<int64_t>(i) * n_head + h) * head_dim;
      for (int j = 0; j < half; ++j) {
        // theta_j = pos * base^(-2j/n_rot), pairs (j, j + n_rot/2)
        const float theta = pos * std::pow(base, -2.0f * static_cast<float>(j) / static_cast<float>(n_rot));
        const float c = std::cos(theta), s = std::sin(theta);
        const float a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = a * s + b * c;
      }
    }
  }
}

void attention(const float* q, const float* k_cache, const float* v_cache, float* out, int t, int pos0,
               const AttentionShape& s) {
  const int d = s.head_dim, group = s.n_head / s.n_head_kv;
  const int64_t kv_stride = static_cast<int64_t>(s.n_head_kv) * d;
  std::vector<float> w(static_cast<size_t>(pos0 + t));
  for (int i = 0; i < t; ++i) {
    const int n_kv = pos0 + i + 1;  // causal: positions 0..pos0+i
    for (int h = 0; h < s.n_head; ++h) {
      const float* qh = q + (static_cast<int64_t>(i) * s.n_head + h) * d;
      const int hk = h / group;
      float mx = -INFINITY;
      for (int p = 0; p < n_kv; ++p) {
        const float* kp = k_cache + p * kv_stride + hk * d;
        float dot = 0;
        for (int e = 0; e < d; ++e) dot += qh[e] * kp[e];
        w[p] = dot * s.scale;
        mx = std::max(mx, w[p]);
      }
      float sum = 0;
      for (int p = 0; p < n_kv; ++p) {
        w[p] = std::exp(w[p] - mx);
        sum += w[p];
      }
      float* oh = out + (static_cast<int64_t>(i) * s.n_head + h) * d;
      for (int e = 0; e < d; ++e) oh[e] = 0;
      for (int p = 0; p < n_kv; ++p) {
        const float* vp = v_cache + p * kv_stride + hk * d;
        const float wp = w[p] / sum;
        for (int e = 0; e < d; ++e) oh[e] += wp * vp[e];
      }
    }
  }
}

}  // namespace bonsai::ref
