// PTQ1_0 row kernel, AVX2 + FMA + F16C: one block per 256-bit register, trit
// decode as in the AVX-512 kernel (v = 3t mod 256 is the next plane's t;
// 64·trit = avg(t, subs(t, v)) & 0xC0), shifted down to the trit itself so
// vpmaddubsw pair sums stay small enough to add five planes in int16: a
// 16-bit shift by 6 is exact here because each byte holds only bits 6 and 7.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu::detail {
namespace {

inline short load_i16(const uint8_t* p) {
  short v;
  std::memcpy(&v, p, 2);
  return v;
}

inline __m256i ld(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

template <bool kFaithful>
void rows_impl(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i mc0 = _mm256_set1_epi8(static_cast<char>(0xC0));
  const PackedView& a = args.a;
  const PrefetchPlan pf = prefetch_plan(args.row_bytes, 1, 28);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = args.w + r * args.row_bytes;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < args.n_blocks; ++b) {
      const uint8_t* blk = row + b * 28;
      _mm_prefetch(reinterpret_cast<const char*>(blk + pf.ahead), _MM_HINT_T0);
      // The 32-byte load covers 4 bytes of the next block (their activations
      // are zero); at the very end of the tensor copy instead of over-reading.
      __m256i t;
      if (blk + 32 <= args.end) {
        t = ld(blk);
      } else {
        alignas(32) uint8_t tmp[32] = {};
        std::memcpy(tmp, blk, 28);
        t = _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
      }
      const int64_t g = b / 2, h = b % 2;
      const int8_t* ah = a.hi + g * 320 + h * 32;
      const int8_t* al = kFaithful ? a.lo + g * 320 + h * 32 : nullptr;
      __m256i sh = _mm256_setzero_si256(), sl = _mm256_setzero_si256();
      for (int n = 0; n < 5; ++n) {
        const __m256i v = _mm256_add_epi8(_mm256_add_epi8(t, t), t);
        const __m256i c =
            _mm256_srli_epi16(_mm256_and_si256(_mm256_avg_epu8(t, _mm256_subs_epu8(t, v)), mc0), 6);
        t = v;
        sh = _mm256_add_epi16(sh, _mm256_maddubs_epi16(c, ld(ah + 64 * n)));  // ≤ 5·2·2·128: no overflow
        if constexpr (kFaithful) sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(c, ld(al + 64 * n)));
      }
      __m256i tt = _mm256_madd_epi16(sh, ones);
      if constexpr (kFaithful) tt = _mm256_add_epi32(_mm256_slli_epi32(tt, 8), _mm256_madd_epi16(sl, ones));
      tt = _mm256_add_epi32(tt, ld(a.corr + g * 16 + h * 8));
      const short d = load_i16(blk + 26);
      const __m256 dsc =
          _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16(d)), _mm256_load_ps(a.scale + g * 16 + h * 8));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tt), dsc, acc);
    }
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    y[r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
}

}  // namespace

void ptq1_rows_avx2(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  if (args.a.lo)
    rows_impl<true>(args, y, r0, r1);
  else
    rows_impl<false>(args, y, r0, r1);
}

}  // namespace bonsai::cpu::detail
