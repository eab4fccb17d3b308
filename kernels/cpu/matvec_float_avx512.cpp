// F32 / F16 / BF16 row kernel, AVX-512 (small matrices such as ssm_alpha and
// ssm_beta, 5120 → 48 in BF16): four rows at a time share each load of x,
// 16 columns per step, masked loads for a k that is not a multiple of 16.
#include <immintrin.h>

#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu::detail {
namespace {

template <int kType>
inline __m512 load_w(const uint8_t* row, int64_t j, __mmask16 m) {
  if constexpr (kType == 0) return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + j);
  const __m256i h = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + j);
  if constexpr (kType == 1) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  // bf16: the high half of an f32
}

template <int kType, int R>
void rows_impl(const FloatArgs& args, float* y, int64_t r0, int64_t r1) {
  constexpr int64_t elem = kType == 0 ? 4 : 2;
  const int64_t k = args.k;
  for (int64_t r = r0; r + R <= r1; r += R) {
    const uint8_t* row = args.w + r * k * elem;
    __m512 acc[R];
    for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; j += 16) {
      const __mmask16 m = k - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (k - j)) - 1);
      const __m512 x = _mm512_maskz_loadu_ps(m, args.x + j);
      for (int i = 0; i < R; ++i)
        acc[i] = _mm512_fmadd_ps(load_w<kType>(row + i * k * elem, j, m), x, acc[i]);
    }
    for (int i = 0; i < R; ++i) y[r + i] = _mm512_reduce_add_ps(acc[i]);
  }
}

template <int kType>
void rows(const FloatArgs& args, float* y, int64_t r0, int64_t r1) {
  const int64_t full = r0 + (r1 - r0) / 4 * 4;
  rows_impl<kType, 4>(args, y, r0, full);
  rows_impl<kType, 1>(args, y, full, r1);
}

}  // namespace

void float_rows_avx512(const FloatArgs& args, float* y, int64_t r0, int64_t r1) {
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
