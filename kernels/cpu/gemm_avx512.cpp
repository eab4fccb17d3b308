// Ternary GEMM panel kernel, AVX-512 BW + VNNI (see kernels/cpu/gemm.h).
//
// Code decode ("rows across lanes"): for 16 rows at once, dword u of a block's
// code bytes (codes of elements 16u .. 16u+15, byte e holding 16u+4e+s at
// bit 2s) is brought into lane i = row i (loads + a dword transpose), then
// (g >> 2s) & 0x03030303 gives step j = 4u + s: byte e of lane i = the code of
// element 16u + 4e + s of row i. PreparedBatch stores each token's block in
// that same step order, so one broadcast dword of activation bytes meets the
// matching 4 codes of 16 rows.
#include <immintrin.h>

// GCC 12 reports its own _mm512_undefined_* operands (inside cvtepi32_ps,
// slli_epi32, ... once inlined into the big unrolled tile) as uninitialized:
// a known false positive of the intrinsics headers, not of this code.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "kernels/cpu/gemm_dot_avx512.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu::detail {
namespace {

constexpr int kTile = 6;  // tokens per micro-tile: 4 row vectors × 6 tokens = 24 zmm accumulators

// Decodes blocks [0, nb) of 16 rows (row i at src + i·stride, blocks bb bytes
// apart, fp16 d first, then the code bytes) into codes[lb][j][m] (64 B) and
// d[lb][16m + i]. Rows outside `valid` decode to code 0 with d = 0 (masked
// loads: nothing past the weights is touched).
//
// The 16 rows' 32 code bytes are loaded as 8 dwords each and transposed so
// that register u holds dword u of every row (lane = row): pairs of rows
// (i, i + 8) share a zmm, an 8 × 8 dword transpose runs in both 256-bit
// halves (unpack 32, unpack 64, then vpermt2q joining 128-bit lanes). This
// replaced 8 vpgatherdd per block (microcoded on Zen 4), which cost ~17 % of
// the GEMM at T = 60.
void decode_vec(const uint8_t* src, int64_t stride, int bb, int block, int nb, __mmask16 valid, int m,
                uint8_t* codes, float* d) {
  const __m512i idx =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(stride)));
  const __m512i m3 = _mm512_set1_epi32(0x03030303);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i lo_lanes = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i hi_lanes = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  const int steps = block / 4;
  const int dwords = block / 16;  // code dwords per block: 8 (128) or 4 (64)
  const __mmask8 dw_mask = static_cast<__mmask8>((1u << dwords) - 1);
  for (int lb = 0; lb < nb; ++lb) {
    const uint8_t* p = src + static_cast<int64_t>(lb) * bb;
    const __m512i dd = _mm512_mask_i32gather_epi32(zero, valid, idx, p, 1);
    _mm512_store_ps(d + lb * kGemmPanelRows + 16 * m, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
    __m512i z[8];
    for (int i = 0; i < 8; ++i) {
      const __mmask8 k0 = (valid >> i) & 1 ? dw_mask : __mmask8(0);
      const __mmask8 k1 = (valid >> (i + 8)) & 1 ? dw_mask : __mmask8(0);
      const __m256i r0 = _mm256_maskz_loadu_epi32(k0, p + i * stride + 2);
      const __m256i r1 = _mm256_maskz_loadu_epi32(k1, p + (i + 8) * stride + 2);
      z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1);
    }
    __m512i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    for (int h = 0; h < 2; ++h) {  // rows 0-3 (h = 0) and 4-7 of each half
      u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
      u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
      u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
      u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    // u[c] (c = 0..3) holds dword c (128-bit lanes 0, 2) and c + 4 (lanes 1, 3) of rows 0-3 / 8-11; u[4 + c]
    // of rows 4-7 / 12-15.
    for (int c = 0; c < 4; ++c) {
      const __m512i g_lo = _mm512_permutex2var_epi64(u[c], lo_lanes, u[4 + c]);  // dword c of rows 0..15
      const __m512i g_hi = _mm512_permutex2var_epi64(u[c], hi_lanes, u[4 + c]);  // dword c + 4
      for (int half = 0; half < 2; ++half) {
        const int du = c + 4 * half;
        if (du >= dwords) break;
        const __m512i g = half ? g_hi : g_lo;
        uint8_t* out = codes + (static_cast<int64_t>(lb) * steps + 4 * du) * 256 + 64 * m;
        _mm512_store_si512(out, _mm512_and_si512(g, m3));
        _mm512_store_si512(out + 256, _mm512_and_si512(_mm512_srli_epi32(g, 2), m3));
        _mm512_store_si512(out + 512, _mm512_and_si512(_mm512_srli_epi32(g, 4), m3));
        _mm512_store_si512(out + 768, _mm512_and_si512(_mm512_srli_epi32(g, 6), m3));
      }
    }
  }
}

// decode_vec for Lanes16 weights (kernels/cpu/matvec.h): blocks [b0, b0 + nb)
// (nb ≤ 4, within one group of 16) of the 16 rows at codes row0 (rows
// row_bytes apart), scales at srow0 (rows n_blocks·2 bytes apart). In that
// layout dword u of block b sits in chunk u of b's group (64 B, or 4g B for a
// tail group of g blocks) at lane b mod 16, so one 16-byte load per (row, u)
// brings dword u of the slab's 4 blocks. Four such loads (rows q, 4 + q,
// 8 + q, 12 + q) fill register A_q; the 4 × 4 dword transposes that
// unpack{lo,hi}_epi{32,64} run inside every 128-bit lane then leave dword u of
// block lb for row 4t + q in lane 4t + q of B_lb: rows across lanes, in order.
void decode_lanes(const uint8_t* row0, int64_t row_bytes, const uint8_t* srow0, int64_t n_blocks, int64_t b0,
                  int nb, __mmask16 valid, int m, uint8_t* codes, float* d) {
  const int64_t j = b0 / 16, pos = b0 % 16;
  const int64_t g = n_blocks - j * 16 < 16 ? n_blocks - j * 16 : 16;  // blocks in this group
  const int64_t chunk = 4 * g;
  const __mmask8 blk_mask = static_cast<__mmask8>((1u << nb) - 1);
  const __m512i m3 = _mm512_set1_epi32(0x03030303);
  const __m512i zero = _mm512_setzero_si512();
  // Scales: the dword ending at each fp16 d (its upper half), so nothing past
  // the buffer is read; the 2 bytes before a row's first scale are the
  // previous row's last scale or, for row 0, the end of the code rows.
  const int64_t sb = n_blocks * 2;
  const __m512i sidx =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(sb)));
  for (int lb = 0; lb < nb; ++lb) {
    const __m512i dd = _mm512_mask_i32gather_epi32(zero, valid, sidx, srow0 + (b0 + lb) * 2 - 2, 1);
    _mm512_store_ps(d + lb * kGemmPanelRows + 16 * m,
                    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
  }
  __mmask8 rmask[16];
  for (int i = 0; i < 16; ++i) rmask[i] = (valid >> i) & 1 ? blk_mask : __mmask8(0);
  for (int u = 0; u < 8; ++u) {
    const uint8_t* base = row0 + j * 512 + u * chunk + 4 * pos;
    __m512i A[4];
    for (int q = 0; q < 4; ++q) {
      __m512i v = _mm512_castsi128_si512(_mm_maskz_loadu_epi32(rmask[q], base + q * row_bytes));
      v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi32(rmask[4 + q], base + (4 + q) * row_bytes), 1);
      v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi32(rmask[8 + q], base + (8 + q) * row_bytes), 2);
      A[q] = _mm512_inserti32x4(v, _mm_maskz_loadu_epi32(rmask[12 + q], base + (12 + q) * row_bytes), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(A[0], A[1]), t1 = _mm512_unpackhi_epi32(A[0], A[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(A[2], A[3]), t3 = _mm512_unpackhi_epi32(A[2], A[3]);
    const __m512i B[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                          _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
    for (int lb = 0; lb < nb; ++lb) {
      uint8_t* out = codes + (static_cast<int64_t>(lb) * 32 + 4 * u) * 256 + 64 * m;
      _mm512_store_si512(out, _mm512_and_si512(B[lb], m3));
      _mm512_store_si512(out + 256, _mm512_and_si512(_mm512_srli_epi32(B[lb], 2), m3));
      _mm512_store_si512(out + 512, _mm512_and_si512(_mm512_srli_epi32(B[lb], 4), m3));
      _mm512_store_si512(out + 768, _mm512_and_si512(_mm512_srli_epi32(B[lb], 6), m3));
    }
  }
}

// One block × 64 rows × N tokens: y[n][16m + i] += d_i·s_n · Σ_j (c − 1)·q.
// codes: the block's [steps][4][64]; q: token 0's block bytes (hi, then lo at
// +lo_off when faithful), tokens tok_stride apart.
template <int N, bool kFaithful>
void tile(const uint8_t* codes, int steps, const float* d, const int8_t* q, int64_t tok_stride, int lo_off,
          const int32_t* corr, const float* scale, float* y, int64_t ldy, const __mmask16 (&mask)[4]) {
  alignas(64) __m512i acc[4 * N];
  const int8_t* ql = kFaithful ? q + lo_off : nullptr;
  if constexpr (N == 1) dot_asm1(codes, steps, q, ql, tok_stride, acc);
  if constexpr (N == 2) dot_asm2(codes, steps, q, ql, tok_stride, acc);
  if constexpr (N == 3) dot_asm3(codes, steps, q, ql, tok_stride, acc);
  if constexpr (N == 4) dot_asm4(codes, steps, q, ql, tok_stride, acc);
  if constexpr (N == 5) dot_asm5(codes, steps, q, ql, tok_stride, acc);
  if constexpr (N == 6) dot_asm6(codes, steps, q, ql, tok_stride, acc);
  for (int n = 0; n < N; ++n) {
    const __m512i cr = _mm512_set1_epi32(corr[n]);
    const __m512 sn = _mm512_set1_ps(scale[n]);
    for (int m = 0; m < 4; ++m) {
      const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(acc[m * N + n], cr));
      const __m512 dsc = _mm512_mul_ps(_mm512_load_ps(d + 16 * m), sn);
      float* yp = y + n * ldy + 16 * m;
      _mm512_mask_storeu_ps(yp, mask[m], _mm512_fmadd_ps(f, dsc, _mm512_maskz_loadu_ps(mask[m], yp)));
    }
  }
}

template <bool kFaithful>
void run_tiles(const uint8_t* codes, int steps, const float* d, const int8_t* q, int64_t tok_stride,
               int lo_off, const int32_t* corr, const float* scale, int t, float* y, int64_t ldy,
               const __mmask16 (&mask)[4]) {
  int t0 = 0;
  for (; t0 + kTile <= t; t0 += kTile)
    tile<kTile, kFaithful>(codes, steps, d, q + t0 * tok_stride, tok_stride, lo_off, corr + t0, scale + t0,
                           y + t0 * ldy, ldy, mask);
  const int rest = t - t0;
  const int8_t* qr = q + t0 * tok_stride;
  float* yr = y + t0 * ldy;
  switch (rest) {
    case 1:
      tile<1, kFaithful>(codes, steps, d, qr, tok_stride, lo_off, corr + t0, scale + t0, yr, ldy, mask);
      break;
    case 2:
      tile<2, kFaithful>(codes, steps, d, qr, tok_stride, lo_off, corr + t0, scale + t0, yr, ldy, mask);
      break;
    case 3:
      tile<3, kFaithful>(codes, steps, d, qr, tok_stride, lo_off, corr + t0, scale + t0, yr, ldy, mask);
      break;
    case 4:
      tile<4, kFaithful>(codes, steps, d, qr, tok_stride, lo_off, corr + t0, scale + t0, yr, ldy, mask);
      break;
    case 5:
      tile<5, kFaithful>(codes, steps, d, qr, tok_stride, lo_off, corr + t0, scale + t0, yr, ldy, mask);
      break;
    default:
      break;
  }
}

// decode_lanes for Stream16 weights (kernels/cpu/matvec.h): the same 16-byte
// loads and transposes, but row rm + r's chunk u of group j sits at
// row_base(r) + off(u) with row_base(r) = base + (r / RL)·rgb + (r % RL)·64
// (base: the row group of row rm, rm a multiple of 16 and so of RL) and
// off(u) = j·544·RL + u·64·RL (a full group), or in the tail part
// (g ≤ 8: folded, chunk u in step u % 4 at byte 32·(u / 4)); its scales
// follow the group's chunks, 32 bytes (tail: 2g) per row.
void decode_stream(const uint8_t* base, int rl, int64_t rgb, int64_t n_blocks, int64_t b0, int nb,
                   __mmask16 valid, int m, uint8_t* codes, float* d) {
  const int64_t j = b0 / 16, pos = b0 % 16, n_full = n_blocks / 16;
  const int64_t g = n_blocks - j * 16 < 16 ? n_blocks - j * 16 : 16;  // blocks in this group
  const bool full = j < n_full, fold = !full && g <= 8;
  const int64_t gp = j * 544 * rl;  // the group's offset in a row group (tail: n_full · 544 · RL)
  const int64_t steps = fold ? 4 : 8;
  const __mmask8 blk_mask = static_cast<__mmask8>((1u << nb) - 1);
  const __m512i m3 = _mm512_set1_epi32(0x03030303);
  const __m512i zero = _mm512_setzero_si512();
  int64_t rowoff[16];
  for (int r = 0; r < 16; ++r) rowoff[r] = r / rl * rgb + r % rl * 64;
  // Scales: as decode_lanes, the dword ending at each fp16 d (the 2 bytes
  // before it are the group's last code bytes or the previous row's scale).
  alignas(64) int32_t sidx_a[16];
  for (int r = 0; r < 16; ++r)
    sidx_a[r] = static_cast<int32_t>(r / rl * rgb + gp + steps * 64 * rl + r % rl * (full ? 32 : 2 * g));
  const __m512i sidx = _mm512_load_si512(sidx_a);
  for (int lb = 0; lb < nb; ++lb) {
    const __m512i dd = _mm512_mask_i32gather_epi32(zero, valid, sidx, base + (pos + lb) * 2 - 2, 1);
    _mm512_store_ps(d + lb * kGemmPanelRows + 16 * m,
                    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
  }
  __mmask8 rmask[16];
  for (int i = 0; i < 16; ++i) rmask[i] = (valid >> i) & 1 ? blk_mask : __mmask8(0);
  for (int u = 0; u < 8; ++u) {
    const int64_t off = gp + (fold ? (u % 4) * 64 * rl + (u / 4) * 32 : u * 64 * rl) + 4 * pos;
    const uint8_t* b = base + off;
    __m512i A[4];
    for (int q = 0; q < 4; ++q) {
      __m512i v = _mm512_castsi128_si512(_mm_maskz_loadu_epi32(rmask[q], b + rowoff[q]));
      v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi32(rmask[4 + q], b + rowoff[4 + q]), 1);
      v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi32(rmask[8 + q], b + rowoff[8 + q]), 2);
      A[q] = _mm512_inserti32x4(v, _mm_maskz_loadu_epi32(rmask[12 + q], b + rowoff[12 + q]), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(A[0], A[1]), t1 = _mm512_unpackhi_epi32(A[0], A[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(A[2], A[3]), t3 = _mm512_unpackhi_epi32(A[2], A[3]);
    const __m512i B[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                          _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
    for (int lb = 0; lb < nb; ++lb) {
      uint8_t* out = codes + (static_cast<int64_t>(lb) * 32 + 4 * u) * 256 + 64 * m;
      _mm512_store_si512(out, _mm512_and_si512(B[lb], m3));
      _mm512_store_si512(out + 256, _mm512_and_si512(_mm512_srli_epi32(B[lb], 2), m3));
      _mm512_store_si512(out + 512, _mm512_and_si512(_mm512_srli_epi32(B[lb], 4), m3));
      _mm512_store_si512(out + 768, _mm512_and_si512(_mm512_srli_epi32(B[lb], 6), m3));
    }
  }
}

}  // namespace

void gemm_panel_avx512(const GemmArgs& a, int64_t r0, uint8_t* scratch) {
  const int rows = static_cast<int>(a.n_rows - r0 < kGemmPanelRows ? a.n_rows - r0 : kGemmPanelRows);
  __mmask16 mask[4];
  for (int m = 0; m < 4; ++m) {
    const int cnt = rows - 16 * m;
    mask[m] = cnt >= 16  ? __mmask16(0xFFFF)
              : cnt <= 0 ? __mmask16(0)
                         : static_cast<__mmask16>((1u << cnt) - 1);
  }
  float* ybuf = reinterpret_cast<float*>(scratch + kGemmScratchBytes);  // [t][64]
  for (int64_t i = 0; i < a.t * kGemmPanelRows; i += 16) _mm512_store_ps(ybuf + i, _mm512_setzero_ps());
  const __mmask16 full[4] = {0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF};

  const int steps = a.block / 4;
  const int slab = static_cast<int>(kGemmSlabWeights / a.block);
  const int halves = a.faithful ? 2 : 1;
  const int64_t tok_stride = static_cast<int64_t>(halves) * a.block;
  uint8_t* codes = scratch;                                     // [slab][steps][4][64] = 32 KB
  float* d = reinterpret_cast<float*>(scratch + 32768);         // [slab][64]
  uint8_t* tbuf = scratch + 32768 + slab * kGemmPanelRows * 4;  // PTQ1_0 → PQ2_0 rows [64][slab·34]
  for (int64_t b0 = 0; b0 < a.n_blocks; b0 += slab) {
    const int nb = static_cast<int>(a.n_blocks - b0 < slab ? a.n_blocks - b0 : slab);
    if (a.lanes || a.stream_rl) {
      for (int m = 0; m < 4; ++m) {
        const int64_t rm = mask[m] ? r0 + 16 * m : r0;
        if (a.stream_rl)
          decode_stream(a.w + rm / a.stream_rl * a.stream_rgb, a.stream_rl, a.stream_rgb, a.n_blocks, b0, nb,
                        mask[m], m, codes, d);
        else
          decode_lanes(a.w + rm * a.row_bytes, a.row_bytes, a.scales + rm * a.n_blocks * 2, a.n_blocks, b0,
                       nb, mask[m], m, codes, d);
      }
      // Prefetch the next group (or the next panel's first) during this
      // group's slabs, a share of the 64 rows per slab and block.
      const int64_t j = b0 / 16, gb = j * 16;
      const int64_t g = a.n_blocks - gb < 16 ? a.n_blocks - gb : 16;
      const int64_t n_slabs = (g + slab - 1) / slab, q = (b0 - gb) / slab;
      const bool last = gb + g >= a.n_blocks;
      for (int lb = 0; lb < nb; ++lb) {
        const int64_t i0 = (q * nb + lb) * kGemmPanelRows / (n_slabs * nb);
        const int64_t i1 = (q * nb + lb + 1) * kGemmPanelRows / (n_slabs * nb);
        if (a.stream_rl)
          gemm_prefetch_stream(a, last ? r0 + kGemmPanelRows : r0, last ? 0 : j + 1, i0, i1);
        else
          gemm_prefetch_lanes(a, last ? r0 + kGemmPanelRows : r0, last ? 0 : j + 1, i0, i1);
        const int64_t b = b0 + lb;
        const int8_t* qb = a.q + b * a.t * tok_stride;
        const uint8_t* cb = codes + static_cast<int64_t>(lb) * steps * 256;
        const float* db = d + lb * kGemmPanelRows;
        if (a.faithful)
          run_tiles<true>(cb, steps, db, qb, tok_stride, a.block, a.corr + b * a.t, a.scale + b * a.t, a.t,
                          ybuf, kGemmPanelRows, full);
        else
          run_tiles<false>(cb, steps, db, qb, tok_stride, a.block, a.corr + b * a.t, a.scale + b * a.t, a.t,
                           ybuf, kGemmPanelRows, full);
      }
      continue;
    }
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
    for (int m = 0; m < 4; ++m)
      decode_vec(mask[m] ? src + 16 * m * stride : src, stride, bb, a.block, nb, mask[m], m, codes, d);
    for (int lb = 0; lb < nb; ++lb) {
      // Prefetch a quarter of the next slab's rows per block (or the next panel's first slab).
      const int64_t i0 = lb * kGemmPanelRows / nb, i1 = (lb + 1) * kGemmPanelRows / nb;
      if (b0 + slab < a.n_blocks)
        gemm_prefetch_rows(a, r0, b0 + slab, i0, i1);
      else
        gemm_prefetch_rows(a, r0 + kGemmPanelRows, 0, i0, i1);
      const int64_t b = b0 + lb;
      const int8_t* qb = a.q + b * a.t * tok_stride;
      const uint8_t* cb = codes + static_cast<int64_t>(lb) * steps * 256;
      const float* db = d + lb * kGemmPanelRows;
      if (a.faithful)
        run_tiles<true>(cb, steps, db, qb, tok_stride, a.block, a.corr + b * a.t, a.scale + b * a.t, a.t,
                        ybuf, kGemmPanelRows, full);
      else
        run_tiles<false>(cb, steps, db, qb, tok_stride, a.block, a.corr + b * a.t, a.scale + b * a.t, a.t,
                         ybuf, kGemmPanelRows, full);
    }
  }
  for (int i = 0; i < a.t; ++i)
    for (int m = 0; m < 4; ++m)
      _mm512_mask_storeu_ps(a.y + i * a.ldy + r0 + 16 * m, mask[m],
                            _mm512_load_ps(ybuf + i * kGemmPanelRows + 16 * m));
}

}  // namespace bonsai::cpu::detail
