// AVX2 + FMA elementwise ops (see elementwise.h). ISA unit: no inline symbols
// shared with baseline units (everything here is in an anonymous namespace or
// an out-of-line function).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/exp_avx2.h"

namespace bonsai::cpu {
namespace {

// silu(x) = x / (1 + exp(−x)); below x = −88 exp(−x) would be clamped (so
// x / (1 + e^88.4) would stay as large as −4e-9 for x = −1e30): there the
// result is 0 (NaN still propagates: the mask keeps unordered lanes).
__m256 silu8(__m256 x) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  const __m256 r = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  return _mm256_and_ps(r, _mm256_cmp_ps(x, _mm256_set1_ps(-88.0f), _CMP_NLT_UQ));
}

// sigmoid(x) = 1 / (1 + exp(−x)). exp8's clamp keeps the result in [~4e-39, 1]
// without overflow (below x = −87.3 the exact value is smaller still; both are
// negligible against any product). The clamp's max turns NaN into −87.3, so
// NaN lanes are put back at the end, as the reference's expf would keep them.
__m256 sigmoid8(__m256 x) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  const __m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_ps(r, x, nan);
}

// The tail (< 8 elements) through a zero-padded stack copy.
template <class F>
void tail(int64_t n, F f) {
  if (n > 0) f(n);
}

}  // namespace

void silu_avx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, silu8(_mm256_loadu_ps(x + i)));
  tail(n - i, [&](int64_t m) {
    alignas(32) float b[8] = {};
    std::memcpy(b, x + i, m * sizeof(float));
    _mm256_store_ps(b, silu8(_mm256_load_ps(b)));
    std::memcpy(y + i, b, m * sizeof(float));
  });
}

void sigmoid_mul_avx2(const float* x, const float* gate, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sigmoid8(_mm256_loadu_ps(gate + i))));
  tail(n - i, [&](int64_t m) {
    alignas(32) float bx[8] = {}, bg[8] = {};
    std::memcpy(bx, x + i, m * sizeof(float));
    std::memcpy(bg, gate + i, m * sizeof(float));
    _mm256_store_ps(bx, _mm256_mul_ps(_mm256_load_ps(bx), sigmoid8(_mm256_load_ps(bg))));
    std::memcpy(y + i, bx, m * sizeof(float));
  });
}

void swiglu_avx2(const float* g, const float* u, float* a, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(a + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
  tail(n - i, [&](int64_t m) {
    alignas(32) float bg[8] = {}, bu[8] = {};
    std::memcpy(bg, g + i, m * sizeof(float));
    std::memcpy(bu, u + i, m * sizeof(float));
    _mm256_store_ps(bg, _mm256_mul_ps(silu8(_mm256_load_ps(bg)), _mm256_load_ps(bu)));
    std::memcpy(a + i, bg, m * sizeof(float));
  });
}

void ssm_conv_avx2(const float* x, float* state, const float* w, float* out, int t, int64_t channels,
                   int taps, int64_t c0, int64_t c1) {
  // 8 channels per step; w is [C][taps] (taps apart per channel), so tap j of
  // 8 channels is a gather with stride taps. Same sum order as the reference
  // (oldest state first, then the new input).
  const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(taps));
  constexpr int kMaxTaps = 16;  // the model config allows 1..16
  int64_t c = c0;
  for (; taps <= kMaxTaps && c + 8 <= c1; c += 8) {
    __m256 wj[kMaxTaps];
    if (taps == 4) {
      // The 27B's 4 taps: 8 channels' weights are 32 consecutive floats;
      // a 4 × 8 transpose (8 shuffles) instead of 4 gathers.
      const float* wc = w + c * 4;
      const __m256 r0 = _mm256_loadu_ps(wc), r1 = _mm256_loadu_ps(wc + 8);        // ch 0,1 | 2,3
      const __m256 r2 = _mm256_loadu_ps(wc + 16), r3 = _mm256_loadu_ps(wc + 24);  // ch 4,5 | 6,7
      // Lanes (128-bit halves) hold one channel each: swap halves so that
      // each register holds channels (0,4) | (1,5) etc., then unpack.
      const __m256 a0 = _mm256_permute2f128_ps(r0, r2, 0x20);  // ch0 | ch4
      const __m256 a1 = _mm256_permute2f128_ps(r0, r2, 0x31);  // ch1 | ch5
      const __m256 a2 = _mm256_permute2f128_ps(r1, r3, 0x20);  // ch2 | ch6
      const __m256 a3 = _mm256_permute2f128_ps(r1, r3, 0x31);  // ch3 | ch7
      const __m256 t0 = _mm256_unpacklo_ps(a0, a1);            // c0t0 c1t0 c0t1 c1t1 | c4.. c5..
      const __m256 t1 = _mm256_unpackhi_ps(a0, a1);            // c0t2 c1t2 c0t3 c1t3 | ...
      const __m256 t2 = _mm256_unpacklo_ps(a2, a3);            // c2t0 c3t0 c2t1 c3t1 | ...
      const __m256 t3 = _mm256_unpackhi_ps(a2, a3);
      wj[0] = _mm256_shuffle_ps(t0, t2, 0x44);  // c0t0 c1t0 c2t0 c3t0 | c4t0 ..
      wj[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
      wj[2] = _mm256_shuffle_ps(t1, t3, 0x44);
      wj[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
    } else {
      for (int j = 0; j < taps; ++j) wj[j] = _mm256_i32gather_ps(w + c * taps + j, idx, 4);
    }
    for (int i = 0; i < t; ++i) {
      const __m256 xi = _mm256_loadu_ps(x + static_cast<int64_t>(i) * channels + c);
      __m256 acc = _mm256_setzero_ps();
      for (int j = 0; j + 1 < taps; ++j)
        acc = _mm256_fmadd_ps(wj[j], _mm256_loadu_ps(state + j * channels + c), acc);
      acc = _mm256_fmadd_ps(wj[taps - 1], xi, acc);
      _mm256_storeu_ps(out + static_cast<int64_t>(i) * channels + c, silu8(acc));
      for (int j = 0; j + 2 < taps; ++j)
        _mm256_storeu_ps(state + j * channels + c, _mm256_loadu_ps(state + (j + 1) * channels + c));
      if (taps > 1) _mm256_storeu_ps(state + (taps - 2) * channels + c, xi);
    }
  }
  // Remaining channels one at a time (the 27B has C = 10240: none).
  for (; c < c1; ++c)
    for (int i = 0; i < t; ++i) {
      const float* xi = x + static_cast<int64_t>(i) * channels;
      float acc = 0;
      for (int j = 0; j + 1 < taps; ++j) acc += w[c * taps + j] * state[j * channels + c];
      acc += w[c * taps + taps - 1] * xi[c];
      alignas(32) float b[8] = {acc};
      _mm256_store_ps(b, silu8(_mm256_load_ps(b)));
      out[static_cast<int64_t>(i) * channels + c] = b[0];
      for (int j = 0; j + 2 < taps; ++j) state[j * channels + c] = state[(j + 1) * channels + c];
      if (taps > 1) state[(taps - 2) * channels + c] = xi[c];
    }
}

void gdn_head_step_avx2(const float* q, const float* k, const float* v, float decay, float beta, float* S,
                        float* o, int d_k, int d_v) {
  constexpr int kTile = 4;  // 4 × 8 columns: 4 kv + 4 o accumulators, within AVX2's 16 registers
  const __m256 vdecay = _mm256_set1_ps(decay), vbeta = _mm256_set1_ps(beta);
  for (int e0 = 0; e0 < d_v; e0 += 8 * kTile) {
    const int nt = (d_v - e0) / 8 < kTile ? (d_v - e0) / 8 : kTile;
    __m256 kv[kTile], acc[kTile];
    for (int j = 0; j < kTile; ++j) kv[j] = _mm256_setzero_ps();
    for (int a = 0; a < d_k; ++a) {  // Sᵀk over the tile
      const __m256 ka = _mm256_set1_ps(k[a]);
      const float* row = S + static_cast<int64_t>(a) * d_v + e0;
      for (int j = 0; j < nt; ++j) kv[j] = _mm256_fmadd_ps(_mm256_loadu_ps(row + 8 * j), ka, kv[j]);
    }
    for (int j = 0; j < nt; ++j) {  // kv = β·(v − decay·Sᵀk)
      kv[j] = _mm256_mul_ps(vbeta, _mm256_fnmadd_ps(vdecay, kv[j], _mm256_loadu_ps(v + e0 + 8 * j)));
      acc[j] = _mm256_setzero_ps();
    }
    for (int a = 0; a < d_k; ++a) {  // S ← decay·S + k_a·kv; o += S·q_a
      const __m256 ka = _mm256_set1_ps(k[a]), qa = _mm256_set1_ps(q[a]);
      float* row = S + static_cast<int64_t>(a) * d_v + e0;
      for (int j = 0; j < nt; ++j) {
        const __m256 s = _mm256_fmadd_ps(_mm256_loadu_ps(row + 8 * j), vdecay, _mm256_mul_ps(ka, kv[j]));
        _mm256_storeu_ps(row + 8 * j, s);
        acc[j] = _mm256_fmadd_ps(s, qa, acc[j]);
      }
    }
    for (int j = 0; j < nt; ++j) _mm256_storeu_ps(o + e0 + 8 * j, acc[j]);
  }
}

}  // namespace bonsai::cpu
