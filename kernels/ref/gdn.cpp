// Reference Gated DeltaNet pieces: causal depthwise conv + SiLU, the decay/beta
// gates, the delta-rule recurrence on fp32 [d_k x d_v] states, and the gated norm.
#include <cmath>
#include <vector>

#include "kernels/ref/ops.h"

namespace bonsai::ref {

void ssm_conv(const float* x, float* state, const float* w, float* out, int t, int64_t channels, int taps) {
  // state rows: [taps-1][C], oldest first. w: ne {taps, C} -> w[c*taps + j] multiplies x_{now - (taps-1) +
  // j}.
  for (int i = 0; i < t; ++i) {
    const float* xi = x + static_cast<int64_t>(i) * channels;
    float* oi = out + static_cast<int64_t>(i) * channels;
    for (int64_t c = 0; c < channels; ++c) {
      float acc = 0;
      for (int j = 0; j < taps - 1; ++j) acc += w[c * taps + j] * state[j * channels + c];
      acc += w[c * taps + taps - 1] * xi[c];
      oi[c] = silu(acc);
      for (int j = 0; j + 1 < taps - 1; ++j) state[j * channels + c] = state[(j + 1) * channels + c];
      if (taps > 1) state[(taps - 2) * channels + c] = xi[c];
    }
  }
}

void gdn_gates(const float* alpha, const float* beta_in, const float* ssm_a, const float* dt_bias, float* g,
               float* beta, int t, int n_v) {
  for (int i = 0; i < t; ++i)
    for (int h = 0; h < n_v; ++h) {
      const int64_t j = static_cast<int64_t>(i) * n_v + h;
      g[j] = ssm_a[h] * softplus(alpha[j] + dt_bias[h]);
      beta[j] = sigmoid(beta_in[j]);
    }
}

namespace {
void l2_normalize(const float* x, float* y, int n, float eps, float extra_scale) {
  float ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = extra_scale / std::max(std::sqrt(ss), eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * scale;
}
}  // namespace

void gdn_recurrence(const float* conv, const float* g, const float* beta, float* state, float* out, int t,
                    const GdnShape& s) {
  const int64_t qk = static_cast<int64_t>(s.n_k) * s.d_k;
  const int64_t width = 2 * qk + static_cast<int64_t>(s.n_v) * s.d_v;
  std::vector<float> q(s.d_k), k(s.d_k), kv(s.d_v);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(s.d_k));
  for (int i = 0; i < t; ++i) {
    const float* ci = conv + i * width;
    for (int h = 0; h < s.n_v; ++h) {
      const int hk = h % s.n_k;  // tiled value-head order
      l2_normalize(ci + hk * s.d_k, q.data(), s.d_k, s.eps, q_scale);
      l2_normalize(ci + qk + hk * s.d_k, k.data(), s.d_k, s.eps, 1.0f);
      const float* v = ci + 2 * qk + static_cast<int64_t>(h) * s.d_v;
      float* S = state + static_cast<int64_t>(h) * s.d_k * s.d_v;  // S[a][b], a over d_k, b over d_v
      const float decay = std::exp(g[i * s.n_v + h]);
      const float b = beta[i * s.n_v + h];
      for (int64_t e = 0; e < static_cast<int64_t>(s.d_k) * s.d_v; ++e) S[e] *= decay;
      for (int bb = 0; bb < s.d_v; ++bb) kv[bb] = 0;
      for (int a = 0; a < s.d_k; ++a)
        for (int bb = 0; bb < s.d_v; ++bb) kv[bb] += S[a * s.d_v + bb] * k[a];
      for (int bb = 0; bb < s.d_v; ++bb) kv[bb] = b * (v[bb] - kv[bb]);  // delta
      for (int a = 0; a < s.d_k; ++a)
        for (int bb = 0; bb < s.d_v; ++bb) S[a * s.d_v + bb] += k[a] * kv[bb];
      float* o = out + (static_cast<int64_t>(i) * s.n_v + h) * s.d_v;
      for (int bb = 0; bb < s.d_v; ++bb) o[bb] = 0;
      for (int a = 0; a < s.d_k; ++a)
        for (int bb = 0; bb < s.d_v; ++bb) o[bb] += S[a * s.d_v + bb] * q[a];
    }
  }
}

void gated_rmsnorm(const float* o, const float* z, const float* w, float* y, int64_t rows, int64_t d,
                   float eps) {
  rmsnorm(o, w, y, rows, d, eps);
  for (int64_t i = 0; i < rows * d; ++i) y[i] *= silu(z[i]);
}

}  // namespace bonsai::ref
