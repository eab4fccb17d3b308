// PQ2_0 / Q2_0 g128 row kernel, AVX-512 BW + VNNI.
//
// One 512-bit register holds the 2·32 code bytes of a block pair (the file's
// 34-byte blocks are not 64-byte aligned, so the two 32-byte code fields are
// loaded separately). Shifting by 2s and masking with 3 yields plane s: byte m
// of block h holds element 4m+s, which PreparedAct's Q2x128 layout matches.
// vpdpbusd multiplies the unsigned codes (0..3) by the signed activation
// bytes; the "−1" of each code is the precomputed −Σq in the accumulator's
// first lane of each block. Faithful mode runs the hi and lo halves as two
// accumulators and combines them as hi·256 + lo in int32 (exact; one vpdpwssd).
//
// Per block pair the float work is: cvt(int32 → f32) and one FMA with
// d_b·s_b broadcast over the block's 8 lanes; the horizontal sum happens once
// per row. Several rows are processed together so the activation planes are
// loaded once per block pair for all of them.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu::detail {
namespace {

inline __m512i load_pair(const uint8_t* b0, const uint8_t* b1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1)), 1);
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// [d0 × 8 | d1 × 8] as floats.
inline __m512 pair_scales(uint16_t d0, uint16_t d1) {
  const __m256i h =
      _mm256_mask_set1_epi16(_mm256_set1_epi16(static_cast<short>(d0)), 0xFF00, static_cast<short>(d1));
  return _mm512_cvtph_ps(h);
}

// Σ over one block pair of code·act for the four planes, as 16 int32 lanes
// (8 per block), including the −Σq correction: q = 256·hi + lo (faithful) or hi.
template <bool kFaithful>
inline __m512i pair_dot(__m512i w, const __m512i (&h)[4], const __m512i (&l)[4], __m512i corr) {
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m512i c0 = _mm512_and_si512(w, m3);
  const __m512i c1 = _mm512_and_si512(_mm512_srli_epi16(w, 2), m3);
  const __m512i c2 = _mm512_and_si512(_mm512_srli_epi16(w, 4), m3);
  const __m512i c3 = _mm512_and_si512(_mm512_srli_epi16(w, 6), m3);
  if constexpr (kFaithful) {
    __m512i th = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c0, h[0]);
    th = _mm512_dpbusd_epi32(th, c1, h[1]);
    th = _mm512_dpbusd_epi32(th, c2, h[2]);
    th = _mm512_dpbusd_epi32(th, c3, h[3]);
    __m512i tl = _mm512_dpbusd_epi32(corr, c0, l[0]);
    tl = _mm512_dpbusd_epi32(tl, c1, l[1]);
    tl = _mm512_dpbusd_epi32(tl, c2, l[2]);
    tl = _mm512_dpbusd_epi32(tl, c3, l[3]);
    // th·256 + tl in one vpdpwssd: |th| ≤ 16 products · 3 · 127 = 6096 fits
    // the low int16 of each lane (the high word, its sign, is multiplied by 0).
    return _mm512_dpwssd_epi32(tl, th, _mm512_set1_epi32(256));
  } else {
    __m512i t = _mm512_dpbusd_epi32(corr, c0, h[0]);
    t = _mm512_dpbusd_epi32(t, c1, h[1]);
    t = _mm512_dpbusd_epi32(t, c2, h[2]);
    return _mm512_dpbusd_epi32(t, c3, h[3]);
  }
}

template <bool kFaithful>
inline void load_planes(const PackedView& a, int64_t p, __m512i (&h)[4], __m512i (&l)[4]) {
  for (int s = 0; s < 4; ++s) h[s] = _mm512_load_si512(a.hi + p * 256 + 64 * s);
  if constexpr (kFaithful)
    for (int s = 0; s < 4; ++s) l[s] = _mm512_load_si512(a.lo + p * 256 + 64 * s);
}

template <int R, bool kFaithful>
void rows_impl(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const int64_t n_pairs = args.n_blocks / 2;
  const bool odd = args.n_blocks & 1;
  const PackedView& a = args.a;
  const PrefetchPlan pf = prefetch_plan(args.row_bytes, R, 68);
  __m512i h[4], l[4];
  for (int64_t r = r0; r + R <= r1; r += R) {
    const uint8_t* row = args.w + r * args.row_bytes;
    __m512 acc[R];
    for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t p = 0; p < n_pairs; ++p) {
      load_planes<kFaithful>(a, p, h, l);
      const __m512i corr = _mm512_load_si512(a.corr + p * 16);
      const __m512 sc = _mm512_load_ps(a.scale + p * 16);
      for (int i = 0; i < R; ++i) {
        const uint8_t* b0 = row + i * args.row_bytes + p * 68;
        // 8-row groups (K = 17408): one group ahead is 37 KB, more than L1 next to the 34 KB
        // activation, so those prefetches go to L2 (as in matvec_lanes_avx512.cpp).
        if constexpr (R >= 8)
          _mm_prefetch(reinterpret_cast<const char*>(row + pf.ahead + p * pf.per_iter + i * pf.per_row),
                       _MM_HINT_T1);
        else
          _mm_prefetch(reinterpret_cast<const char*>(row + pf.ahead + p * pf.per_iter + i * pf.per_row),
                       _MM_HINT_T0);
        const __m512i t = pair_dot<kFaithful>(load_pair(b0 + 2, b0 + 36), h, l, corr);
        const __m512 dsc = _mm512_mul_ps(pair_scales(load_u16(b0), load_u16(b0 + 34)), sc);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), dsc, acc[i]);
      }
    }
    if (odd) {  // the last block alone: the upper half of the register stays zero
      load_planes<kFaithful>(a, n_pairs, h, l);
      const __m512i corr = _mm512_load_si512(a.corr + n_pairs * 16);
      const __m512 sc = _mm512_load_ps(a.scale + n_pairs * 16);
      for (int i = 0; i < R; ++i) {
        const uint8_t* b0 = row + i * args.row_bytes + n_pairs * 68;
        const __m512i w =
            _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2)));
        const __m512i t = pair_dot<kFaithful>(w, h, l, corr);
        const __m512 dsc = _mm512_mul_ps(pair_scales(load_u16(b0), 0), sc);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), dsc, acc[i]);
      }
    }
    for (int i = 0; i < R; ++i) y[r + i] = _mm512_reduce_add_ps(acc[i]);
  }
}

template <int R, bool kFaithful>
void rows_r(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const int64_t full = r0 + (r1 - r0) / R * R;
  rows_impl<R, kFaithful>(args, y, r0, full);
  rows_impl<1, kFaithful>(args, y, full, r1);
}

// Rows walked side by side share each load of the activation planes. Short
// rows (K ≤ ~7000) take 4 (the activation, ≤ 15 KB, stays in L1); long rows
// (K = 17408: a 43 KB activation streamed from L2 for every row group) take 8,
// halving that traffic (measured 0.81 → 0.87 of read bandwidth at 17408 × 5120).
template <bool kFaithful>
void rows(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  if (args.row_bytes * 4 > kLinearPrefetchMaxGroup)
    rows_r<8, kFaithful>(args, y, r0, r1);
  else
    rows_r<4, kFaithful>(args, y, r0, r1);
}

}  // namespace

void pq2_rows_avx512(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  if (args.a.lo)
    rows<true>(args, y, r0, r1);
  else
    rows<false>(args, y, r0, r1);
}

}  // namespace bonsai::cpu::detail
