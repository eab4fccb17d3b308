// Reference RoPE (NeoX rotate-half) and causal GQA attention over a KV cache.
#include <cmath>
#include <cstring>
#include <vector>

#include "bonsai/formats.h"
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

namespace {

// Element e of a cache row as f32: the stored float, or the stored half converted exactly.
inline float kv_at(const float* row, int64_t e) { return row[e]; }
inline float kv_at(const uint16_t* row, int64_t e) { return fp16_to_f32(row[e]); }

template <class T>
void attention_t(const float* q, const T* k_cache, const T* v_cache, float* out, int t, int pos0,
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
        const T* kp = k_cache + p * kv_stride + hk * d;
        float dot = 0;
        for (int e = 0; e < d; ++e) dot += qh[e] * kv_at(kp, e);
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
        const T* vp = v_cache + p * kv_stride + hk * d;
        const float wp = w[p] / sum;
        for (int e = 0; e < d; ++e) oh[e] += wp * kv_at(vp, e);
      }
    }
  }
}

}  // namespace

void attention(const float* q, const void* k_cache, const void* v_cache, float* out, int t, int pos0,
               const AttentionShape& s) {
  if (s.kv == KvType::F16)
    attention_t(q, static_cast<const uint16_t*>(k_cache), static_cast<const uint16_t*>(v_cache), out, t, pos0,
                s);
  else
    attention_t(q, static_cast<const float*>(k_cache), static_cast<const float*>(v_cache), out, t, pos0, s);
}

void store_rows(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv) {
  const int64_t n = width * t, at = static_cast<int64_t>(pos0) * width;
  if (kv == KvType::F16) {
    uint16_t* dst = static_cast<uint16_t*>(cache) + at;
    for (int64_t j = 0; j < n; ++j) dst[j] = f32_to_fp16(src[j]);
  } else {
    std::memmove(static_cast<float*>(cache) + at, src, static_cast<size_t>(n) * sizeof(float));
  }
}

}  // namespace bonsai::ref
