// F32 / F16 / BF16 row kernel, AVX2 + FMA + F16C: four rows at a time share
// each load of x, 8 columns per step, a scalar loop for the last k % 8.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu::detail {
namespace {

template <int kType>
inline __m256 load_w(const uint8_t* row, int64_t j) {
  if constexpr (kType == 0) return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + j);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * j));
  if constexpr (kType == 1) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <int kType>
inline float load_w1(const uint8_t* row, int64_t j) {
  if constexpr (kType == 0) {
    float f;
    std::memcpy(&f, row + 4 * j, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * j, 2);
  if constexpr (kType == 1) return _cvtsh_ss(h);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

template <int kType, int R>
void rows_impl(const FloatArgs& args, float* y, int64_t r0, int64_t r1) {
  constexpr int64_t elem = kType == 0 ? 4 : 2;
  const int64_t k = args.k, k8 = k / 8 * 8;
  for (int64_t r = r0; r + R <= r1; r += R) {
    const uint8_t* row = args.w + r * k * elem;
    __m256 acc[R];
    for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < k8; j += 8) {
      const __m256 x = _mm256_loadu_ps(args.x + j);
      for (int i = 0; i < R; ++i) acc[i] = _mm256_fmadd_ps(load_w<kType>(row + i * k * elem, j), x, acc[i]);
    }
    for (int i = 0; i < R; ++i) {
      float s = hsum(acc[i]);
      for (int64_t j = k8; j < k; ++j) s += load_w1<kType>(row + i * k * elem, j) * args.x[j];
      y[r + i] = s;
    }
  }
}

template <int kType>
void rows(const FloatArgs& args, float* y, int64_t r0, int64_t r1) {
  const int64_t full = r0 + (r1 - r0) / 4 * 4;
  rows_impl<kType, 4>(args, y, r0, full);
  rows_impl<kType, 1>(args, y, full, r1);
}

}  // namespace

void float_rows_avx2(const FloatArgs& args, float* y, int64_t r0, int64_t r1) {
  switch (args.type) {
    case 0:
      rows<0>(args, y, r0, r1);
      break;
    case 1:
      rows<1>(args, y, r0, r1);
      break;
    default:
      rows<2>(args, y, r0, r1);
      break;
  }
}

}  // namespace bonsai::cpu::detail
