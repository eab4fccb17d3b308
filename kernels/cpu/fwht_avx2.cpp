// AVX2 FWHT. Stages h = 1, 2, 4 run inside one 8-float register (lane j pairs
// with lane j^h: the lower lane of a pair takes a+b, the upper b' - a' with the
// swapped register), stages h >= 8 are plain vector butterflies across registers.
// The butterfly order matches the reference exactly, so results are bit-identical.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/fwht.h"
#include "kernels/ref/fwht.h"

namespace bonsai::cpu {
namespace {

// The blend mask is a template parameter: vblendps takes an immediate, which a function
// argument only becomes after inlining (an unoptimized build would not compile).
template <int kMask>
inline __m256 stage_in_register(__m256 v, __m256 swapped) {
  // lanes with bit h clear: v + swapped (= x[j] + x[j+h]); set: swapped - v (= x[j-h] - x[j]).
  return _mm256_blend_ps(_mm256_add_ps(v, swapped), _mm256_sub_ps(swapped, v), kMask);
}

void fwht_avx2(float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    v = stage_in_register<0xAA>(v, _mm256_permute_ps(v, 0xB1));          // h = 1
    v = stage_in_register<0xCC>(v, _mm256_permute_ps(v, 0x4E));          // h = 2
    v = stage_in_register<0xF0>(v, _mm256_permute2f128_ps(v, v, 0x01));  // h = 4
    _mm256_storeu_ps(x + i, v);
  }
  for (int64_t h = 8; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; j += 8) {
        __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
        _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
      }
}

}  // namespace

void hadamard_row(const float* x, const float* signs, float* y, int64_t k, int64_t block, bool inverse,
                  Isa isa) {
  if (isa == Isa::Scalar || block < 8) {
    if (inverse)
      ref::hadamard_inverse(x, signs, y, k, block);
    else
      ref::hadamard_forward(x, signs, y, k, block);
    return;
  }
  const __m256 scale = _mm256_set1_ps(1.0f / std::sqrt(static_cast<float>(block)));
  for (int64_t i = 0; i < k; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (signs && !inverse) v = _mm256_mul_ps(v, _mm256_loadu_ps(signs + i));
    _mm256_storeu_ps(y + i, v);
  }
  for (int64_t b = 0; b < k; b += block) fwht_avx2(y + b, block);
  for (int64_t i = 0; i < k; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(y + i), scale);
    if (signs && inverse) v = _mm256_mul_ps(v, _mm256_loadu_ps(signs + i));
    _mm256_storeu_ps(y + i, v);
  }
}

}  // namespace bonsai::cpu
