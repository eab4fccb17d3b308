// Q2_0 g64 (mainline ggml layout: 18-byte blocks of fp16 d + 16 code bytes)
// row kernel, AVX-512 BW + VNNI. Same scheme as the PQ2_0 kernel with four
// 64-weight blocks per register (16 code bytes each, loaded as four 128-bit
// lanes) and the Q2x64 activation layout (4 int32 lanes per block).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu::detail {
namespace {

inline uint64_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

template <bool kFaithful>
void rows_impl(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const __m512i m3 = _mm512_set1_epi8(3);
  // float lane j takes the scale of block j / 4
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const int64_t n_quads = (args.n_blocks + 3) / 4;
  const PackedView& a = args.a;
  const PrefetchPlan pf = prefetch_plan(args.row_bytes, 1, 72);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = args.w + r * args.row_bytes;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < n_quads; ++g) {
      const uint8_t* b0 = row + g * 72;
      _mm_prefetch(reinterpret_cast<const char*>(b0 + pf.ahead), _MM_HINT_T0);
      const int nb = static_cast<int>(args.n_blocks - g * 4 < 4 ? args.n_blocks - g * 4 : 4);
      __m512i w = _mm512_setzero_si512();
      uint64_t dbits = 0;
      if (nb == 4) {
        w = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 2)));
        w = _mm512_inserti32x4(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 20)), 1);
        w = _mm512_inserti32x4(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 38)), 2);
        w = _mm512_inserti32x4(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 56)), 3);
        dbits = load_u16(b0) | load_u16(b0 + 18) << 16 | load_u16(b0 + 36) << 32 | load_u16(b0 + 54) << 48;
      } else {  // a partial last group: missing blocks have zero codes and zero scale
        alignas(64) uint8_t codes[64] = {};
        for (int h = 0; h < nb; ++h) {
          std::memcpy(codes + 16 * h, b0 + 18 * h + 2, 16);
          dbits |= load_u16(b0 + 18 * h) << (16 * h);
        }
        w = _mm512_load_si512(codes);
      }
      const __m128 d4 = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(dbits)));
      const __m512 dsc = _mm512_mul_ps(_mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4)),
                                       _mm512_load_ps(a.scale + g * 16));
      const __m512i c0 = _mm512_and_si512(w, m3);
      const __m512i c1 = _mm512_and_si512(_mm512_srli_epi16(w, 2), m3);
      const __m512i c2 = _mm512_and_si512(_mm512_srli_epi16(w, 4), m3);
      const __m512i c3 = _mm512_and_si512(_mm512_srli_epi16(w, 6), m3);
      const int8_t* ah = a.hi + g * 256;
      const __m512i corr = _mm512_load_si512(a.corr + g * 16);
      __m512i t;
      if constexpr (kFaithful) {
        const int8_t* al = a.lo + g * 256;
        __m512i th = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c0, _mm512_load_si512(ah));
        th = _mm512_dpbusd_epi32(th, c1, _mm512_load_si512(ah + 64));
        th = _mm512_dpbusd_epi32(th, c2, _mm512_load_si512(ah + 128));
        th = _mm512_dpbusd_epi32(th, c3, _mm512_load_si512(ah + 192));
        __m512i tl = _mm512_dpbusd_epi32(corr, c0, _mm512_load_si512(al));
        tl = _mm512_dpbusd_epi32(tl, c1, _mm512_load_si512(al + 64));
        tl = _mm512_dpbusd_epi32(tl, c2, _mm512_load_si512(al + 128));
        tl = _mm512_dpbusd_epi32(tl, c3, _mm512_load_si512(al + 192));
        t = _mm512_add_epi32(_mm512_slli_epi32(th, 8), tl);
      } else {
        t = _mm512_dpbusd_epi32(corr, c0, _mm512_load_si512(ah));
        t = _mm512_dpbusd_epi32(t, c1, _mm512_load_si512(ah + 64));
        t = _mm512_dpbusd_epi32(t, c2, _mm512_load_si512(ah + 128));
        t = _mm512_dpbusd_epi32(t, c3, _mm512_load_si512(ah + 192));
      }
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), dsc, acc);
    }
    y[r] = _mm512_reduce_add_ps(acc);
  }
}

}  // namespace

void q2g64_rows_avx512(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  if (args.a.lo)
    rows_impl<true>(args, y, r0, r1);
  else
    rows_impl<false>(args, y, r0, r1);
}

}  // namespace bonsai::cpu::detail
