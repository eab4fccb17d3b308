// Q2_0 g64 row kernel, AVX2 + FMA + F16C: two 64-weight blocks (2 × 16 code
// bytes) per 256-bit register, Q2x64 activation layout, vpmaddubsw products
// as in the PQ2_0 AVX2 kernel.
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

inline __m256i dot4(__m256i c0, __m256i c1, __m256i c2, __m256i c3, const int8_t* act, __m256i ones) {
  __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(c0, ld(act)), _mm256_maddubs_epi16(c1, ld(act + 64)));
  s = _mm256_add_epi16(s, _mm256_maddubs_epi16(c2, ld(act + 128)));
  s = _mm256_add_epi16(s, _mm256_maddubs_epi16(c3, ld(act + 192)));
  return _mm256_madd_epi16(s, ones);
}

template <bool kFaithful>
void rows_impl(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t n_halves = (args.n_blocks + 1) / 2;  // two blocks per register
  const PackedView& a = args.a;
  const PrefetchPlan pf = prefetch_plan(args.row_bytes, 1, 36);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = args.w + r * args.row_bytes;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t hg = 0; hg < n_halves; ++hg) {
      const uint8_t* b0 = row + hg * 36;
      _mm_prefetch(reinterpret_cast<const char*>(b0 + pf.ahead), _MM_HINT_T0);
      __m256i w;
      short d0 = load_i16(b0), d1 = 0;
      if (2 * hg + 1 < args.n_blocks) {
        w = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(b0 + 20),
                                reinterpret_cast<const __m128i*>(b0 + 2));
        d1 = load_i16(b0 + 18);
      } else {  // odd block count: the second block is absent
        w = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 2)));
      }
      const int64_t g = hg / 2, half = hg % 2;
      const __m256 d = _mm256_cvtph_ps(_mm_setr_epi16(d0, d0, d0, d0, d1, d1, d1, d1));
      const __m256 dsc = _mm256_mul_ps(d, _mm256_load_ps(a.scale + g * 16 + half * 8));
      const __m256i c0 = _mm256_and_si256(w, m3);
      const __m256i c1 = _mm256_and_si256(_mm256_srli_epi16(w, 2), m3);
      const __m256i c2 = _mm256_and_si256(_mm256_srli_epi16(w, 4), m3);
      const __m256i c3 = _mm256_and_si256(_mm256_srli_epi16(w, 6), m3);
      const __m256i corr = ld(a.corr + g * 16 + half * 8);
      const int64_t off = g * 256 + half * 32;
      __m256i t;
      if constexpr (kFaithful) {
        const __m256i th = dot4(c0, c1, c2, c3, a.hi + off, ones);
        const __m256i tl = dot4(c0, c1, c2, c3, a.lo + off, ones);
        t = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(th, 8), tl), corr);
      } else {
        t = _mm256_add_epi32(dot4(c0, c1, c2, c3, a.hi + off, ones), corr);
      }
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), dsc, acc);
    }
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    y[r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
}

}  // namespace

void q2g64_rows_avx2(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  if (args.a.lo)
    rows_impl<true>(args, y, r0, r1);
  else
    rows_impl<false>(args, y, r0, r1);
}

}  // namespace bonsai::cpu::detail
