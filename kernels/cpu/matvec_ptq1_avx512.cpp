// PTQ1_0 row kernel, AVX-512 BW + VNNI (vectorised trit decode, no lookup).
//
// A PTQ1_0 block is 26 base-3 bytes (5 trits each, 4 for the two qh bytes)
// followed by its fp16 scale; two blocks fill one 512-bit register (lanes
// 0..25 and 32..57; lanes 26..31 hold the scale and the next block's first
// bytes, whose activations are zero). Trit n of byte v is ⌊3t/256⌋ with
// t = v·3ⁿ mod 256, so plane n+1 is t+t+t (byte adds wrap mod 256 for free).
// Lane m of plane n holds element 16n+m (m < 16), 80+8n+(m−16) (m < 24) or
// 120+2n+(m−24): PreparedAct's Trit128 layout.
//
// Decode: with v = 3t mod 256 (the next plane's t, computed anyway),
//   64·⌊3t/256⌋ = avg_epu8(t, subs_epu8(t, v)) & 0xC0
// (three cheap byte ops; checked for all 256 t by the PTQ1Decode test in
// tests/test_kernels_matvec.cpp, found by exhaustive search). The codes are
// therefore 64× the trits; the kernel folds the 64 into the combine step
// (hi·256/64 = hi·4, lo / 64 exact) and into the correction (−64·Σq).
//
// Cost on Zen 4: decode (5 ops per plane incl. the ×3) outweighs the 10
// vpdpbusd of a faithful block pair, so this kernel is compute-bound at about
// half of the PQ2_0 kernel's bytes/s; three rows are interleaved per plane so
// independent work hides the dpbusd latency.
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

template <int R, bool kFaithful>
void rows_impl(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const __m512i mc0 = _mm512_set1_epi8(static_cast<char>(0xC0));
  const int64_t n_pairs = (args.n_blocks + 1) / 2;
  const PackedView& a = args.a;
  const PrefetchPlan pf = prefetch_plan(args.row_bytes, R, 56);
  for (int64_t r = r0; r + R <= r1; r += R) {
    const uint8_t* row = args.w + r * args.row_bytes;
    __m512 acc[R];
    for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t p = 0; p < n_pairs; ++p) {
      const bool two = 2 * p + 1 < args.n_blocks;
      const __m512i corr64 = _mm512_slli_epi32(_mm512_load_si512(a.corr + p * 16), 6);
      __m512i t[R], th[R], tl[R];
      for (int i = 0; i < R; ++i) {
        const uint8_t* b0 = row + i * args.row_bytes + p * 56;
        _mm_prefetch(reinterpret_cast<const char*>(row + pf.ahead + p * pf.per_iter + i * pf.per_row),
                     _MM_HINT_T0);
        // Byte-masked loads never touch bytes past the block (or the tensor).
        const __m256i lo = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0))
                               : _mm256_maskz_loadu_epi8(0x03FFFFFF, b0);
        const __m256i hi = _mm256_maskz_loadu_epi8(two ? 0x03FFFFFF : 0, b0 + 28);
        t[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        th[i] = _mm512_setzero_si512();
        tl[i] = corr64;
      }
      const int8_t* ah = a.hi + p * 320;
      const int8_t* al = kFaithful ? a.lo + p * 320 : nullptr;
#pragma GCC unroll 5
      for (int n = 0; n < 5; ++n) {
        const __m512i hs = _mm512_load_si512(ah + 64 * n);
        __m512i ls = hs;
        if constexpr (kFaithful) ls = _mm512_load_si512(al + 64 * n);
        for (int i = 0; i < R; ++i) {
          const __m512i v = _mm512_add_epi8(_mm512_add_epi8(t[i], t[i]), t[i]);
          const __m512i c = _mm512_and_si512(_mm512_avg_epu8(t[i], _mm512_subs_epu8(t[i], v)), mc0);
          if constexpr (kFaithful) th[i] = _mm512_dpbusd_epi32(th[i], c, hs);
          tl[i] = _mm512_dpbusd_epi32(tl[i], c, ls);
          t[i] = v;
        }
      }
      const __m512 sc = _mm512_load_ps(a.scale + p * 16);
      for (int i = 0; i < R; ++i) {
        const uint8_t* b0 = row + i * args.row_bytes + p * 56;
        const __m256i dv = _mm256_mask_set1_epi16(_mm256_set1_epi16(static_cast<short>(load_u16(b0 + 26))),
                                                  0xFF00, two ? static_cast<short>(load_u16(b0 + 54)) : 0);
        const __m512 dsc = _mm512_mul_ps(_mm512_cvtph_ps(dv), sc);
        // tl = 64·(Σ trit·lo − Σq) is a multiple of 64; th = 64·Σ trit·hi.
        __m512i tt = _mm512_srai_epi32(tl[i], 6);
        if constexpr (kFaithful) tt = _mm512_add_epi32(_mm512_slli_epi32(th[i], 2), tt);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tt), dsc, acc[i]);
      }
    }
    for (int i = 0; i < R; ++i) y[r + i] = _mm512_reduce_add_ps(acc[i]);
  }
}

template <bool kFaithful>
void rows(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  constexpr int R = 3;
  const int64_t full = r0 + (r1 - r0) / R * R;
  rows_impl<R, kFaithful>(args, y, r0, full);
  rows_impl<1, kFaithful>(args, y, full, r1);
}

}  // namespace

void ptq1_rows_avx512(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  if (args.a.lo)
    rows<true>(args, y, r0, r1);
  else
    rows<false>(args, y, r0, r1);
}

}  // namespace bonsai::cpu::detail
