// PQ2_0 / Q2_0 g128 row kernel, AVX2 + FMA + F16C (the x86 baseline).
//
// Same math and activation layout as the AVX-512 kernel (see there), one
// 128-weight block per 256-bit register. Without VNNI, u8×s8 products go
// through vpmaddubsw (pairs summed to int16: |c·q| ≤ 3·128, so a pair is at
// most 768 and the sum of the four planes at most 3072: no saturation), then
// vpmaddwd with ones widens to int32 once per block and half.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu::detail {
namespace {

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline __m256i ld(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Σ_s c_s·act_s over the four planes, as 8 int32 lanes.
inline __m256i dot4(__m256i c0, __m256i c1, __m256i c2, __m256i c3, const int8_t* act, __m256i ones) {
  __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(c0, ld(act)), _mm256_maddubs_epi16(c1, ld(act + 64)));
  s = _mm256_add_epi16(s, _mm256_maddubs_epi16(c2, ld(act + 128)));
  s = _mm256_add_epi16(s, _mm256_maddubs_epi16(c3, ld(act + 192)));
  return _mm256_madd_epi16(s, ones);
}

template <int R, bool kFaithful>
void rows_impl(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i ones = _mm256_set1_epi16(1);
  const PackedView& a = args.a;
  const PrefetchPlan pf = prefetch_plan(args.row_bytes, R, 34);
  for (int64_t r = r0; r + R <= r1; r += R) {
    const uint8_t* row = args.w + r * args.row_bytes;
    __m256 acc[R];
    for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < args.n_blocks; ++b) {
      const int64_t g = b / 2, h = b % 2;
      const int8_t* ah = a.hi + g * 256 + h * 32;
      const __m256i corr = ld(a.corr + g * 16 + h * 8);
      const __m256 sc = _mm256_load_ps(a.scale + g * 16 + h * 8);
      for (int i = 0; i < R; ++i) {
        const uint8_t* blk = row + i * args.row_bytes + b * 34;
        _mm_prefetch(reinterpret_cast<const char*>(row + pf.ahead + b * pf.per_iter + i * pf.per_row),
                     _MM_HINT_T0);
        const __m256i w = ld(blk + 2);
        const __m256i c0 = _mm256_and_si256(w, m3);
        const __m256i c1 = _mm256_and_si256(_mm256_srli_epi16(w, 2), m3);
        const __m256i c2 = _mm256_and_si256(_mm256_srli_epi16(w, 4), m3);
        const __m256i c3 = _mm256_and_si256(_mm256_srli_epi16(w, 6), m3);
        __m256i t;
        if constexpr (kFaithful) {
          const __m256i th = dot4(c0, c1, c2, c3, ah, ones);
          const __m256i tl = dot4(c0, c1, c2, c3, a.lo + g * 256 + h * 32, ones);
          t = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(th, 8), tl), corr);
        } else {
          t = _mm256_add_epi32(dot4(c0, c1, c2, c3, ah, ones), corr);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(load_u16(blk))));
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(d, sc), acc[i]);
      }
    }
    for (int i = 0; i < R; ++i) {
      const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
      const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
      y[r + i] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
    }
  }
}

template <bool kFaithful>
void rows(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  constexpr int R = 2;
  const int64_t full = r0 + (r1 - r0) / R * R;
  rows_impl<R, kFaithful>(args, y, r0, full);
  rows_impl<1, kFaithful>(args, y, full, r1);
}

}  // namespace

void pq2_rows_avx2(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  if (args.a.lo)
    rows<true>(args, y, r0, r1);
  else
    rows<false>(args, y, r0, r1);
}

}  // namespace bonsai::cpu::detail
