// exp8: exp(x) for 8 float lanes, AVX2 + FMA, for the AVX2 units only (elementwise_avx2.cpp,
// attention_avx2.cpp). Internal linkage (an anonymous namespace), so that no inline symbol
// compiled with AVX2 flags is shared with a baseline unit.
#pragma once

#include <immintrin.h>

namespace bonsai::cpu {
namespace {

// exp(x) for 8 lanes: n = round(x·log2 e), r = x − n·ln 2 (two-part ln 2 so r
// is exact to ~1 ulp), exp(r) by the Cephes minimax polynomial on
// [−ln2/2, ln2/2], scaled by 2ⁿ through the exponent field. x is clamped to
// [−87.3, 88.3] so 2ⁿ stays a normal float.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.3762626647949f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace
}  // namespace bonsai::cpu
