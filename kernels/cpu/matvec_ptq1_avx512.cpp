// PTQ1_0 row kernel, AVX-512 BW + VNNI (vectorised trit decode, no lookup).
//
// A PTQ1_0 block is 26 base-3 bytes (5 trits each, 4 for the two qh bytes)
// followed by its fp16 scale; two blocks fill one 512-bit register (lanes
// 0..25 and 32..57, loaded with byte masks so nothing past the tensor is
// touched). Trit n of byte v is ⌊3·t/256⌋ with t = v·3ⁿ mod 256, and
// ⌊3t/256⌋ = [t > 85] + [t > 170]; so plane n+1 is t+t+t (byte adds wrap
// mod 256 for free), and the code is two unsigned byte compares into masks
// and two masked byte ops. Lane m of plane n holds element 16n+m (m < 16),
// 80+8n+(m−16) (m < 24) or 120+2n+(m−24): PreparedAct's Trit128 layout, with
// zero activations in the unused lanes (26..31, and the qh lanes of plane 4).
// The dot products and the "−1" correction are as in the PQ2_0 kernel.
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

template <bool kFaithful>
void rows_impl(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const __m512i one = _mm512_set1_epi8(1);
  const __m512i c85 = _mm512_set1_epi8(85), c170 = _mm512_set1_epi8(static_cast<char>(170));
  const int64_t n_pairs = (args.n_blocks + 1) / 2;
  const PackedView& a = args.a;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = args.w + r * args.row_bytes;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t p = 0; p < n_pairs; ++p) {
      const uint8_t* b0 = row + p * 56;
      _mm_prefetch(reinterpret_cast<const char*>(b0 + kPrefetchBytes), _MM_HINT_T0);
      const bool two = 2 * p + 1 < args.n_blocks;
      __m512i t = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(0x03FFFFFF, b0));
      if (two)
        t = _mm512_inserti64x4(t, _mm256_maskz_loadu_epi8(0x03FFFFFF, b0 + 28), 1);
      else
        t = _mm512_zextsi256_si512(_mm512_castsi512_si256(t));
      const __m256i dv = _mm256_mask_set1_epi16(_mm256_set1_epi16(static_cast<short>(load_u16(b0 + 26))),
                                                0xFF00, two ? static_cast<short>(load_u16(b0 + 54)) : 0);
      const __m512 dsc = _mm512_mul_ps(_mm512_cvtph_ps(dv), _mm512_load_ps(a.scale + p * 16));
      const int8_t* ah = a.hi + p * 320;
      const int8_t* al = kFaithful ? a.lo + p * 320 : nullptr;
      __m512i th = _mm512_setzero_si512();
      __m512i tl = _mm512_load_si512(a.corr + p * 16);
      for (int n = 0; n < 5; ++n) {
        if (n) t = _mm512_add_epi8(_mm512_add_epi8(t, t), t);
        __m512i c = _mm512_maskz_mov_epi8(_mm512_cmpgt_epu8_mask(t, c85), one);
        c = _mm512_mask_add_epi8(c, _mm512_cmpgt_epu8_mask(t, c170), c, one);
        if constexpr (kFaithful) {
          th = _mm512_dpbusd_epi32(th, c, _mm512_load_si512(ah + 64 * n));
          tl = _mm512_dpbusd_epi32(tl, c, _mm512_load_si512(al + 64 * n));
        } else {
          tl = _mm512_dpbusd_epi32(tl, c, _mm512_load_si512(ah + 64 * n));
        }
      }
      const __m512i tt = kFaithful ? _mm512_add_epi32(_mm512_slli_epi32(th, 8), tl) : tl;
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tt), dsc, acc);
    }
    y[r] = _mm512_reduce_add_ps(acc);
  }
}

}  // namespace

void ptq1_rows_avx512(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  if (args.a.lo)
    rows_impl<true>(args, y, r0, r1);
  else
    rows_impl<false>(args, y, r0, r1);
}

}  // namespace bonsai::cpu::detail
