// Ternary GEMM panel kernel, AVX2 baseline (see kernels/cpu/gemm.h).
//
// Same panel decode and memory layout as gemm_avx512.cpp (row r's dword at
// byte 4r of every 256-byte step, here read as 8 ymm of 8 rows). Without
// vpdpbusd, each step is vpmaddubsw (u8 code × s8 activation, pairs summed
// into int16) and a 16-bit add; the int16 sums stay exact over a whole block
// (per lane ≤ 2 products per step × 3 × 128 × 32 steps = 24576 < 32767), and
// one vpmaddwd with ones per block widens them to the same int32 as the
// AVX-512 kernel. Tiles: 16 rows (2 ymm) × 4 tokens.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu::detail {
namespace {

constexpr int kTile = 4;

// Like decode_vec in gemm_avx512.cpp for 8 rows (vector v of the panel).
void decode_vec8(const uint8_t* src, int64_t stride, int bb, int block, int nb, int valid_rows, int v,
                 uint8_t* codes, float* d) {
  const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                         _mm256_set1_epi32(static_cast<int>(stride)));
  const __m256i valid =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(valid_rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i m3 = _mm256_set1_epi32(0x03030303);
  const __m256i zero = _mm256_setzero_si256();
  const int steps = block / 4;
  for (int lb = 0; lb < nb; ++lb) {
    const uint8_t* p = src + static_cast<int64_t>(lb) * bb;
    const __m256i dd = _mm256_mask_i32gather_epi32(zero, reinterpret_cast<const int*>(p), idx, valid, 1);
    // low 16 bits of each dword → fp16 → f32
    const __m256i packed = _mm256_packus_epi32(_mm256_and_si256(dd, _mm256_set1_epi32(0xFFFF)), zero);
    const __m128i h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
    _mm256_store_ps(d + lb * kGemmPanelRows + 8 * v, _mm256_cvtph_ps(h));
    for (int u = 0; u < block / 16; ++u) {
      const __m256i g =
          _mm256_mask_i32gather_epi32(zero, reinterpret_cast<const int*>(p + 2 + 4 * u), idx, valid, 1);
      uint8_t* out = codes + (static_cast<int64_t>(lb) * steps + 4 * u) * 256 + 32 * v;
      _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm256_and_si256(g, m3));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + 256),
                         _mm256_and_si256(_mm256_srli_epi32(g, 2), m3));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + 512),
                         _mm256_and_si256(_mm256_srli_epi32(g, 4), m3));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + 768),
                         _mm256_and_si256(_mm256_srli_epi32(g, 6), m3));
    }
  }
}

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Σ_j over the block for rows of vectors (c0, c0 + 32 B) and N tokens, widened to int32.
template <int N>
inline void pass(const uint8_t* c, int steps, const int8_t* q, int64_t tok_stride, __m256i (&r)[2][N]) {
  __m256i a[2][N];
  for (int m = 0; m < 2; ++m)
    for (int n = 0; n < N; ++n) a[m][n] = _mm256_setzero_si256();
  for (int j = 0; j < steps; ++j) {
    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(c + j * 256));
    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(c + j * 256 + 32));
    for (int n = 0; n < N; ++n) {
      const __m256i b = bcast4(q + n * tok_stride + 4 * j);
      a[0][n] = _mm256_add_epi16(a[0][n], _mm256_maddubs_epi16(w0, b));
      a[1][n] = _mm256_add_epi16(a[1][n], _mm256_maddubs_epi16(w1, b));
    }
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int m = 0; m < 2; ++m)
    for (int n = 0; n < N; ++n) r[m][n] = _mm256_madd_epi16(a[m][n], ones);
}

// One block × 16 rows (vectors 2·vp, 2·vp + 1) × N tokens.
template <int N, bool kFaithful>
void tile(const uint8_t* c, int steps, const float* d, const int8_t* q, int64_t tok_stride, int lo_off,
          const int32_t* corr, const float* scale, float* y, int64_t ldy, const __m256i (&mask)[2]) {
  __m256i r[2][N];
  pass<N>(c, steps, q, tok_stride, r);
  if constexpr (kFaithful) {
    __m256i lo[2][N];
    pass<N>(c, steps, q + lo_off, tok_stride, lo);
    for (int m = 0; m < 2; ++m)
      for (int n = 0; n < N; ++n) r[m][n] = _mm256_add_epi32(_mm256_slli_epi32(r[m][n], 8), lo[m][n]);
  }
  for (int n = 0; n < N; ++n) {
    const __m256i cr = _mm256_set1_epi32(corr[n]);
    const __m256 sn = _mm256_set1_ps(scale[n]);
    for (int m = 0; m < 2; ++m) {
      const __m256 f = _mm256_cvtepi32_ps(_mm256_add_epi32(r[m][n], cr));
      const __m256 dsc = _mm256_mul_ps(_mm256_load_ps(d + 8 * m), sn);
      float* yp = y + n * ldy + 8 * m;
      _mm256_maskstore_ps(yp, mask[m], _mm256_fmadd_ps(f, dsc, _mm256_maskload_ps(yp, mask[m])));
    }
  }
}

template <bool kFaithful>
void run_tiles(const uint8_t* c, int steps, const float* d, const int8_t* q, int64_t tok_stride, int lo_off,
               const int32_t* corr, const float* scale, int t, float* y, int64_t ldy,
               const __m256i (&mask)[2]) {
  int t0 = 0;
  for (; t0 + kTile <= t; t0 += kTile)
    tile<kTile, kFaithful>(c, steps, d, q + t0 * tok_stride, tok_stride, lo_off, corr + t0, scale + t0,
                           y + t0 * ldy, ldy, mask);
  const int8_t* qr = q + t0 * tok_stride;
  float* yr = y + t0 * ldy;
  switch (t - t0) {
    case 1:
      tile<1, kFaithful>(c, steps, d, qr, tok_stride, lo_off, corr + t0, scale + t0, yr, ldy, mask);
      break;
    case 2:
      tile<2, kFaithful>(c, steps, d, qr, tok_stride, lo_off, corr + t0, scale + t0, yr, ldy, mask);
      break;
    case 3:
      tile<3, kFaithful>(c, steps, d, qr, tok_stride, lo_off, corr + t0, scale + t0, yr, ldy, mask);
      break;
    default:
      break;
  }
}

__m256i lane_mask(int valid) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace

void gemm_panel_avx2(const GemmArgs& a, int64_t r0, uint8_t* scratch) {
  const int rows = static_cast<int>(a.n_rows - r0 < kGemmPanelRows ? a.n_rows - r0 : kGemmPanelRows);
  float* ybuf = reinterpret_cast<float*>(scratch + kGemmScratchBytes);  // [t][64], see gemm_scratch_bytes
  std::memset(ybuf, 0, static_cast<size_t>(a.t) * kGemmPanelRows * sizeof(float));
  const int steps = a.block / 4;
  const int slab = static_cast<int>(kGemmSlabWeights / a.block);
  const int halves = a.faithful ? 2 : 1;
  const int64_t tok_stride = static_cast<int64_t>(halves) * a.block;
  uint8_t* codes = scratch;
  float* d = reinterpret_cast<float*>(scratch + 32768);
  uint8_t* tbuf = scratch + 32768 + slab * kGemmPanelRows * 4;
  for (int64_t b0 = 0; b0 < a.n_blocks; b0 += slab) {
    const int nb = static_cast<int>(a.n_blocks - b0 < slab ? a.n_blocks - b0 : slab);
    const uint8_t* src;
    int64_t stride;
    int bb;
    if (a.ptq1) {
      stride = static_cast<int64_t>(nb) * 34;
      for (int i = 0; i < rows; ++i)
        transcode_ptq1_blocks_avx2(a.w + (r0 + i) * a.row_bytes + b0 * 28, tbuf + i * stride, nb, a.end);
      src = tbuf, bb = 34;
    } else {
      src = a.w + r0 * a.row_bytes + b0 * a.block_bytes, stride = a.row_bytes, bb = a.block_bytes;
    }
    for (int v = 0; v < 8; ++v) {
      const int valid = rows - 8 * v;
      decode_vec8(valid > 0 ? src + 8 * v * stride : src, stride, bb, a.block, nb, valid, v, codes, d);
    }
    for (int vp = 0; vp < 4; ++vp) {
      // Prefetch a quarter of the next slab's rows per row pair (or the next panel's first slab).
      if (b0 + slab < a.n_blocks)
        gemm_prefetch_rows(a, r0, b0 + slab, 16 * vp, 16 * vp + 16);
      else
        gemm_prefetch_rows(a, r0 + kGemmPanelRows, 0, 16 * vp, 16 * vp + 16);
      if (rows <= 16 * vp) continue;
      const __m256i mask[2] = {lane_mask(8), lane_mask(8)};  // ybuf has room for all 64 rows
      for (int lb = 0; lb < nb; ++lb) {
        const int64_t b = b0 + lb;
        const int8_t* qb = a.q + b * a.t * tok_stride;
        const uint8_t* cb = codes + static_cast<int64_t>(lb) * steps * 256 + 64 * vp;
        const float* db = d + lb * kGemmPanelRows + 16 * vp;
        float* yb = ybuf + 16 * vp;
        if (a.faithful)
          run_tiles<true>(cb, steps, db, qb, tok_stride, a.block, a.corr + b * a.t, a.scale + b * a.t, a.t,
                          yb, kGemmPanelRows, mask);
        else
          run_tiles<false>(cb, steps, db, qb, tok_stride, a.block, a.corr + b * a.t, a.scale + b * a.t, a.t,
                           yb, kGemmPanelRows, mask);
      }
    }
  }
  for (int i = 0; i < a.t; ++i)
    std::memcpy(a.y + i * a.ldy + r0, ybuf + i * kGemmPanelRows, static_cast<size_t>(rows) * sizeof(float));
}

}  // namespace bonsai::cpu::detail
