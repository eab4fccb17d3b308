// PQ2_0 / Q2_0 g128 row kernel on the Lanes16 weight layout, AVX-512 BW + VNNI.
//
// Layout (kernels/cpu/matvec.h): per row, groups of 16 blocks; 64-byte chunk c
// of a group holds code bytes 4c..4c+3 of block b in 32-bit lane b. So one
// aligned load gives 16 blocks' next 16 codes each, the shift planes
// (w >> 2s) & 3 put element 16c + 4i + s of block b in byte i of lane b, and
// vpdpbusd against ActLayout::Lanes16 (the same order) sums each block in its
// own int32 lane. The 8 chunks of a group accumulate into one register per
// half (hi, lo), and only then is the group combined and scaled:
//   t_b = 256·Σ c·hi + Σ c·lo − Σ q   (exact int32: |Σ c·hi| ≤ 128·3·127 = 48768)
//   acc += float(t_b) · (d_b · s_b)   (16 blocks per FMA, fp16 d_b from a 32-byte load)
// A tail group of ≤ 8 blocks is folded into 4 chunk steps (load_folded).
// These are the same integers and per-block products as the file-layout kernel
// (matvec_pq2_avx512.cpp); only the float summation order differs (lane b
// holds blocks b, 16 + b, ..., reduced once per row). Per 64 code bytes and row:
// 1 load, 7 unpack ops, 8 vpdpbusd (faithful); the file-layout kernel also pays
// two unaligned loads, the fp16 scale pair (~6 ops), a combine, a cvt and an FMA.
//
// Several rows walk side by side so the activation planes are loaded once per
// chunk for all of them. A tail group of g < 16 blocks (K = 5120: 40 = 16 + 16
// + 8) is read with masked loads (chunks of 4g bytes; lanes ≥ g stay zero).
//
// Measured (BM_matvec_hot, one Zen 4 core): faithful ~22-25 GB/s against 18
// for the file layout; the 8 vpdpbusd per 64 code bytes (~1 per cycle) are
// now most of the time, so the faithful ceiling here is ≈ 64 B / 8 cycles.
// Tried without gain: GFNI (vgf2p8affineqb) for the unpack (slower), one
// accumulator per shift plane with in-place masks for the faithful mode (GCC
// spills 8 accumulators per row), the group loop in inline assembly without
// the spills (no faster, R = 4 and 8).
#include <immintrin.h>

// GCC 12 reports its own _mm512_undefined_* operands inside the intrinsics
// headers as uninitialized once the Stream16 kernels are inlined (as in
// gemm_avx512.cpp): a known false positive of the headers, not of this code.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu::detail {
namespace {

constexpr int kChunks = 8;          // 64-byte code chunks per group
constexpr int64_t kActChunk = 256;  // activation bytes per chunk and half: 4 planes × 64

template <bool kFaithful>
inline void load_planes(const PackedView& a, int64_t chunk, __m512i (&h)[4], __m512i (&l)[4]) {
  for (int s = 0; s < 4; ++s) h[s] = _mm512_load_si512(a.hi + chunk * kActChunk + 64 * s);
  if constexpr (kFaithful)
    for (int s = 0; s < 4; ++s) l[s] = _mm512_load_si512(a.lo + chunk * kActChunk + 64 * s);
}

// acc_h / acc_l += codes · planes for one 64-byte code chunk.
template <bool kFaithful>
inline void chunk_dot(__m512i w, const __m512i (&h)[4], const __m512i (&l)[4], __m512i& acc_h,
                      __m512i& acc_l) {
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m512i c0 = _mm512_and_si512(w, m3);
  const __m512i c1 = _mm512_and_si512(_mm512_srli_epi16(w, 2), m3);
  const __m512i c2 = _mm512_and_si512(_mm512_srli_epi16(w, 4), m3);
  const __m512i c3 = _mm512_and_si512(_mm512_srli_epi16(w, 6), m3);
  acc_h = _mm512_dpbusd_epi32(acc_h, c0, h[0]);
  acc_h = _mm512_dpbusd_epi32(acc_h, c1, h[1]);
  acc_h = _mm512_dpbusd_epi32(acc_h, c2, h[2]);
  acc_h = _mm512_dpbusd_epi32(acc_h, c3, h[3]);
  if constexpr (kFaithful) {
    acc_l = _mm512_dpbusd_epi32(acc_l, c0, l[0]);
    acc_l = _mm512_dpbusd_epi32(acc_l, c1, l[1]);
    acc_l = _mm512_dpbusd_epi32(acc_l, c2, l[2]);
    acc_l = _mm512_dpbusd_epi32(acc_l, c3, l[3]);
  }
}

// facc += float(hi·256 + lo + corr) · (d · s) for one group of one row. A
// folded short tail (below) holds block b in lanes b and 8 + b: their
// integers are added first (exact); lanes ≥ 8 then carry d = s = 0.
template <bool kFaithful, bool kFold = false>
inline __m512 group_fma(__m512i acc_h, __m512i acc_l, __m512i corr, __m256i d16, __m512 sc, __m512 facc) {
  __m512i t = kFaithful ? _mm512_add_epi32(_mm512_slli_epi32(acc_h, 8), acc_l) : acc_h;
  t = _mm512_add_epi32(t, corr);
  if constexpr (kFold) t = _mm512_add_epi32(t, _mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(_mm512_cvtph_ps(d16), sc), facc);
}

// A short tail group (g ≤ 8 blocks: K = 5120 and 17408 end in 8) is folded:
// code chunks c and c + 4 (4g bytes each) share one register, chunk c in
// lanes 0..g-1 and chunk c + 4 in lanes 8..8+g-1, against the activation's
// folded tail (matvec.h), so the tail costs 4 chunk steps instead of 8.
inline __m512i load_folded(const uint8_t* tail_codes, int c, int g, __mmask8 m) {
  const __m256i lo = _mm256_maskz_loadu_epi32(m, tail_codes + c * 4 * g);
  const __m256i hi = _mm256_maskz_loadu_epi32(m, tail_codes + (c + 4) * 4 * g);
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Software prefetch of the code stream one row group ahead. With 8 rows (K =
// 17408) that is 35 KB per core, which next to the 36 KB activation does not
// fit the 32 KB L1: those go to L2 (+5 % at 17408 × 5120 in an alternating
// A/B on a loaded machine); 4-row groups (≤ 6 KB ahead) go to L1.
template <int R>
inline void prefetch(const uint8_t* p) {
  if constexpr (R >= 8)
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
  else
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

template <int R, bool kFaithful>
void rows_impl(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const int64_t nb = args.n_blocks;
  const int64_t n_full = nb / kLanesGroupBlocks;
  const int tail = static_cast<int>(nb % kLanesGroupBlocks);
  const __mmask16 tail_mask = static_cast<__mmask16>((1u << tail) - 1);
  const int64_t rb = args.row_bytes, sb = nb * 2;  // code / scale bytes per row
  const PackedView& a = args.a;
  const PrefetchPlan pf = prefetch_plan(rb, R, 64);
  const int64_t scale_lead = pf.ahead / rb;  // rows: the scales are prefetched as far ahead as the codes
  // The prefetch schedule walks rb / 64 steps per row: the full groups take
  // 8 each, the tail group's chunks the remaining lines (its 32·tail bytes,
  // padded to 64).
  const int tail_lines = static_cast<int>((rb - n_full * 512) / 64);
  __m512i h[4], l[4];
  for (int64_t r = r0; r + R <= r1; r += R) {
    const uint8_t* row = args.w + r * rb;
    const uint8_t* srow = args.scales + r * sb;
    for (int64_t off = 0; off < R * sb; off += 64)
      _mm_prefetch(reinterpret_cast<const char*>(srow + scale_lead * sb + off), _MM_HINT_T0);
    // The float accumulators live in memory (read and written once per group
    // and row): with R = 8 the registers hold the 16 integer accumulators,
    // the 8 activation planes and the unpacked codes.
    alignas(64) float facc[R][16];
    for (int i = 0; i < R; ++i) _mm512_store_ps(facc[i], _mm512_setzero_ps());
    int64_t it = 0;  // 64-byte steps taken in this row group (prefetch schedule)
    for (int64_t j = 0; j < n_full; ++j) {
      __m512i ah[R], al[R];
      for (int i = 0; i < R; ++i) ah[i] = al[i] = _mm512_setzero_si512();
      for (int c = 0; c < kChunks; ++c, ++it) {
        load_planes<kFaithful>(a, j * kChunks + c, h, l);
        for (int i = 0; i < R; ++i) {
          prefetch<R>(row + pf.ahead + it * pf.per_iter + i * pf.per_row);
          const __m512i w = _mm512_loadu_si512(row + i * rb + j * 512 + c * 64);
          chunk_dot<kFaithful>(w, h, l, ah[i], al[i]);
        }
      }
      const __m512i corr = _mm512_load_si512(a.corr + j * 16);
      const __m512 sc = _mm512_load_ps(a.scale + j * 16);
      for (int i = 0; i < R; ++i) {
        const __m256i d16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(srow + i * sb + j * 32));
        _mm512_store_ps(facc[i], group_fma<kFaithful>(ah[i], al[i], corr, d16, sc, _mm512_load_ps(facc[i])));
      }
    }
    if (tail) {
      const bool fold = tail <= 8;
      const int steps = fold ? kChunks / 2 : kChunks;
      const uint8_t* tail_codes = row + n_full * 512;
      __m512i ah[R], al[R];
      for (int i = 0; i < R; ++i) ah[i] = al[i] = _mm512_setzero_si512();
      for (int c = 0; c < steps; ++c) {
        load_planes<kFaithful>(a, n_full * kChunks + c, h, l);
        const bool pf_step = c < tail_lines;
        for (int i = 0; i < R; ++i) {
          if (pf_step) prefetch<R>(row + pf.ahead + it * pf.per_iter + i * pf.per_row);
          const __m512i w = fold ? load_folded(tail_codes + i * rb, c, tail, static_cast<__mmask8>(tail_mask))
                                 : _mm512_maskz_loadu_epi32(tail_mask, tail_codes + i * rb + c * 4 * tail);
          chunk_dot<kFaithful>(w, h, l, ah[i], al[i]);
        }
        it += pf_step;
      }
      const __m512i corr = _mm512_load_si512(a.corr + n_full * 16);
      const __m512 sc = _mm512_load_ps(a.scale + n_full * 16);
      for (int i = 0; i < R; ++i) {
        const __m256i d16 = _mm256_maskz_loadu_epi16(tail_mask, srow + i * sb + n_full * 32);
        const __m512 f = _mm512_load_ps(facc[i]);
        _mm512_store_ps(facc[i], fold ? group_fma<kFaithful, true>(ah[i], al[i], corr, d16, sc, f)
                                      : group_fma<kFaithful>(ah[i], al[i], corr, d16, sc, f));
      }
    }
    for (int i = 0; i < R; ++i) y[r + i] = _mm512_reduce_add_ps(_mm512_load_ps(facc[i]));
  }
}

// Int8 mode (one half): the planes are masked in place (w & 3 << 2s = 4^s·c_s:
// 4 ANDs, no shifts) into one accumulator per plane, combined exactly per
// group (Σ 4^s·c_s·q is a multiple of 4^s, so an arithmetic shift divides it;
// |Σ| ≤ 128·192·127 fits int32). Measured 25 → 31 GB/s per core (hot) over
// the shift unpack; for the faithful mode (8 accumulators per row) GCC spills
// and it is slower, so that one keeps the shifts.
template <int R>
void rows_int8(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const int64_t nb = args.n_blocks;
  const int64_t n_full = nb / kLanesGroupBlocks;
  const int tail = static_cast<int>(nb % kLanesGroupBlocks);
  const __mmask16 tail_mask = static_cast<__mmask16>((1u << tail) - 1);
  const int64_t rb = args.row_bytes, sb = nb * 2;
  const PackedView& a = args.a;
  const PrefetchPlan pf = prefetch_plan(rb, R, 64);
  const int64_t scale_lead = pf.ahead / rb;
  const int tail_lines = static_cast<int>((rb - n_full * 512) / 64);  // as in rows_impl
  // Long rows (K = 17408) prefetch the code stream into L2, as the faithful
  // 8-row groups do: ahead of a 17 KB activation the L1 prefetches evicted
  // each other (17408 × 5120 streaming: 23.0 / 23.2 -> 30.6 GB/s, alternating
  // quiet A/B at equal read bandwidth, 32-33 GB/s).
  const bool to_l2 = rb * 4 > kLinearPrefetchMaxGroup;
  for (int64_t r = r0; r + R <= r1; r += R) {
    const uint8_t* row = args.w + r * rb;
    const uint8_t* srow = args.scales + r * sb;
    for (int64_t off = 0; off < R * sb; off += 64)
      _mm_prefetch(reinterpret_cast<const char*>(srow + scale_lead * sb + off), _MM_HINT_T0);
    __m512 facc[R];
    for (int i = 0; i < R; ++i) facc[i] = _mm512_setzero_ps();
    int64_t it = 0;
    const int64_t ng = n_full + (tail ? 1 : 0);
    for (int64_t j = 0; j < ng; ++j) {
      const bool is_tail = j == n_full;
      const bool fold = is_tail && tail <= 8;
      __m512i ah[R][4];
      for (int i = 0; i < R; ++i)
        for (int s = 0; s < 4; ++s) ah[i][s] = _mm512_setzero_si512();
      for (int c = 0; c < (fold ? kChunks / 2 : kChunks); ++c, ++it) {
        const int8_t* ph = a.hi + (j * kChunks + c) * kActChunk;
        for (int i = 0; i < R; ++i) {
          __m512i w;
          if (!is_tail || c < tail_lines) {
            const char* q = reinterpret_cast<const char*>(row + pf.ahead + it * pf.per_iter + i * pf.per_row);
            if (to_l2)
              _mm_prefetch(q, _MM_HINT_T1);
            else
              _mm_prefetch(q, _MM_HINT_T0);
          }
          if (fold) {
            w = load_folded(row + i * rb + n_full * 512, c, tail, static_cast<__mmask8>(tail_mask));
          } else if (is_tail) {
            w = _mm512_maskz_loadu_epi32(tail_mask, row + i * rb + n_full * 512 + c * 4 * tail);
          } else {
            w = _mm512_loadu_si512(row + i * rb + j * 512 + c * 64);
          }
          for (int s = 0; s < 4; ++s) {
            const __m512i cs = _mm512_and_si512(w, _mm512_set1_epi8(static_cast<char>(3 << (2 * s))));
            ah[i][s] = _mm512_dpbusd_epi32(ah[i][s], cs, _mm512_load_si512(ph + 64 * s));
          }
        }
      }
      const __m512i corr = _mm512_load_si512(a.corr + j * 16);
      const __m512 sc = _mm512_load_ps(a.scale + j * 16);
      for (int i = 0; i < R; ++i) {
        const __m512i h = _mm512_add_epi32(
            _mm512_add_epi32(ah[i][0], _mm512_srai_epi32(ah[i][1], 2)),
            _mm512_add_epi32(_mm512_srai_epi32(ah[i][2], 4), _mm512_srai_epi32(ah[i][3], 6)));
        const __m256i d16 =
            is_tail ? _mm256_maskz_loadu_epi16(tail_mask, srow + i * sb + j * 32)
                    : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(srow + i * sb + j * 32));
        facc[i] = fold ? group_fma<false, true>(h, h, corr, d16, sc, facc[i])
                       : group_fma<false>(h, h, corr, d16, sc, facc[i]);
      }
    }
    for (int i = 0; i < R; ++i) y[r + i] = _mm512_reduce_add_ps(facc[i]);
  }
}

template <int R, bool kFaithful>
void rows_r(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const int64_t full = r0 + (r1 - r0) / R * R;
  rows_impl<R, kFaithful>(args, y, r0, full);
  rows_impl<1, kFaithful>(args, y, full, r1);
}

// ---- Stream16 (matvec.h): a row group's chunks and scales in one stream ----
// Rows i0 .. i0 + R of the row group at `base` (RL rows, Stream16 layout):
// the same per-chunk and per-group arithmetic as rows_impl, the code chunk
// of row i, group j, chunk c at base + j·544·RL + c·64·RL + i·64 and the
// group's scales right after its 8 chunks. With R = RL every load advances
// through the row group linearly. Software prefetch: 8 KiB ahead into L2 (into
// L2, not L1: for 8-row groups, K = 17408, the 36 KB activation fills L1).
// Session 4 chose none for 4-row groups on the development VM (one sequential
// stream: its hardware prefetchers kept up); see below for why that changed.
// Measured with bench/regime_probe.cpp (prefetch variants interleaved pass
// by pass in one process, 16:07-16:10; GB/s, fast / slow host windows):
// 5120 x 17408: none 44.5 / 33.9, 4 KiB to L1 43.0 / 33.8, 8 KiB to L1
// 39.8 / 33.3, 16 KiB to L1 35.9 / 31.7, 8 KiB to L2 44.5 / 32.6 (Lanes16
// 42.4 / 33.1); 17408 x 5120: 8 KiB to L2 47.3, 16 KiB 46.5, 32 KiB 44.6,
// 4 KiB 40.0, 8 KiB to L1 28.1, none 24.3 (Lanes16 38.5) in fast windows.
// The distance is the caller's (TernaryArgs::prefetch, matvec.h stream_prefetch_bytes: 8 KiB
// into L2 for both row group sizes since session 12). The measurements above are the 2-core
// development VM's, where 4-row groups did as well without; on a 16-core Xeon host they need
// the lead (27B decode at 16 threads 10.7 -> 15.1 t/s, at 2 threads 2.10 -> 3.37;
// docs/performance.md, "CPU decode on 16 cores (session 12)").
template <bool kPf>
inline void stream_prefetch(const uint8_t* p, int64_t ahead) {
  if constexpr (kPf) _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T1);
}

// chunk_dot with one shift instead of three: w4 = w >> 4; planes 0 and 2
// (w & 3, w4 & 3) into one accumulator, planes 1 and 3 in place (w & 12,
// w4 & 12: 4·c) into a second, whose sum is a multiple of 4 and is shifted
// back exactly at the group's end (split_combine). Needs 2 accumulators per
// row and half (int8 mode: R ≤ 4 rows fit the 32 zmm registers).
template <bool kFaithful>
inline void chunk_dot_split(__m512i w, const __m512i (&h)[4], const __m512i (&l)[4], __m512i (&acc)[4]) {
  const __m512i m3 = _mm512_set1_epi8(3), m12 = _mm512_set1_epi8(12);
  const __m512i w4 = _mm512_srli_epi16(w, 4);
  const __m512i c0 = _mm512_and_si512(w, m3), c1 = _mm512_and_si512(w, m12);
  const __m512i c2 = _mm512_and_si512(w4, m3), c3 = _mm512_and_si512(w4, m12);
  acc[0] = _mm512_dpbusd_epi32(acc[0], c0, h[0]);
  acc[1] = _mm512_dpbusd_epi32(acc[1], c1, h[1]);
  acc[0] = _mm512_dpbusd_epi32(acc[0], c2, h[2]);
  acc[1] = _mm512_dpbusd_epi32(acc[1], c3, h[3]);
  if constexpr (kFaithful) {
    acc[2] = _mm512_dpbusd_epi32(acc[2], c0, l[0]);
    acc[3] = _mm512_dpbusd_epi32(acc[3], c1, l[1]);
    acc[2] = _mm512_dpbusd_epi32(acc[2], c2, l[2]);
    acc[3] = _mm512_dpbusd_epi32(acc[3], c3, l[3]);
  }
}
inline __m512i split_combine(__m512i a, __m512i b) { return _mm512_add_epi32(a, _mm512_srai_epi32(b, 2)); }

template <int RL, int R, bool kFaithful, bool kPf>
void stream_rows(const TernaryArgs& args, const uint8_t* base, int i0, float* y) {
  const int64_t pf = args.prefetch;
  // The one-shift unpack for the int8 mode (hot, one core: 32.4 -> 38.4 GB/s
  // at K = 5120); in the faithful mode it measured slower (18.8 GB/s with
  // R = 4: 16 accumulators spill; 17.5 with pairs of rows) than the shifts (24-26).
  constexpr bool kSplit = !kFaithful && R <= 4;
  const int64_t nb = args.n_blocks;
  const int64_t n_full = nb / kLanesGroupBlocks;
  const int tail = static_cast<int>(nb % kLanesGroupBlocks);
  const __mmask16 tail_mask = static_cast<__mmask16>((1u << tail) - 1);
  constexpr int64_t kGroup = 544 * RL, kStep = 64 * RL;
  const PackedView& a = args.a;
  __m512i h[4], l[4];
  alignas(64) float facc[R][16];
  for (int i = 0; i < R; ++i) _mm512_store_ps(facc[i], _mm512_setzero_ps());
  for (int64_t j = 0; j < n_full; ++j) {
    const uint8_t* gp = base + j * kGroup + i0 * 64;
    __m512i ah[R], al[R], sp4[kSplit ? R : 1][4];
    for (int i = 0; i < R; ++i) ah[i] = al[i] = _mm512_setzero_si512();
    if constexpr (kSplit)
      for (int i = 0; i < R; ++i)
        for (int e = 0; e < 4; ++e) sp4[i][e] = _mm512_setzero_si512();
    for (int c = 0; c < kChunks; ++c) {
      load_planes<kFaithful>(a, j * kChunks + c, h, l);
      const uint8_t* sp = gp + c * kStep;
      for (int i = 0; i < R; ++i) {
        stream_prefetch<kPf>(sp + i * 64, pf);
        if constexpr (kSplit)
          chunk_dot_split<kFaithful>(_mm512_loadu_si512(sp + i * 64), h, l, sp4[i]);
        else
          chunk_dot<kFaithful>(_mm512_loadu_si512(sp + i * 64), h, l, ah[i], al[i]);
      }
    }
    if constexpr (kSplit)
      for (int i = 0; i < R; ++i) {
        ah[i] = split_combine(sp4[i][0], sp4[i][1]);
        if constexpr (kFaithful) al[i] = split_combine(sp4[i][2], sp4[i][3]);
      }
    const uint8_t* sc = base + j * kGroup + kChunks * kStep + i0 * 32;
    for (int m = 0; m < R * 32; m += 64) stream_prefetch<kPf>(sc + m, pf);
    const __m512i corr = _mm512_load_si512(a.corr + j * 16);
    const __m512 sv = _mm512_load_ps(a.scale + j * 16);
    for (int i = 0; i < R; ++i) {
      const __m256i d16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + i * 32));
      _mm512_store_ps(facc[i], group_fma<kFaithful>(ah[i], al[i], corr, d16, sv, _mm512_load_ps(facc[i])));
    }
  }
  if (tail) {
    const bool fold = tail <= 8;
    const int steps = fold ? kChunks / 2 : kChunks;
    const uint8_t* tp = base + n_full * kGroup;
    __m512i ah[R], al[R], sp4[kSplit ? R : 1][4];
    for (int i = 0; i < R; ++i) ah[i] = al[i] = _mm512_setzero_si512();
    if constexpr (kSplit)
      for (int i = 0; i < R; ++i)
        for (int e = 0; e < 4; ++e) sp4[i][e] = _mm512_setzero_si512();
    for (int c = 0; c < steps; ++c) {
      load_planes<kFaithful>(a, n_full * kChunks + c, h, l);
      const uint8_t* sp = tp + c * kStep + i0 * 64;
      for (int i = 0; i < R; ++i) {
        stream_prefetch<kPf>(sp + i * 64, pf);
        if constexpr (kSplit)
          chunk_dot_split<kFaithful>(_mm512_loadu_si512(sp + i * 64), h, l, sp4[i]);
        else
          chunk_dot<kFaithful>(_mm512_loadu_si512(sp + i * 64), h, l, ah[i], al[i]);
      }
    }
    if constexpr (kSplit)
      for (int i = 0; i < R; ++i) {
        ah[i] = split_combine(sp4[i][0], sp4[i][1]);
        if constexpr (kFaithful) al[i] = split_combine(sp4[i][2], sp4[i][3]);
      }
    const uint8_t* sc = tp + steps * kStep + i0 * 2 * tail;
    for (int m = 0; m < R * 2 * tail; m += 64) stream_prefetch<kPf>(sc + m, pf);
    const __m512i corr = _mm512_load_si512(a.corr + n_full * 16);
    const __m512 sv = _mm512_load_ps(a.scale + n_full * 16);
    for (int i = 0; i < R; ++i) {
      const __m256i d16 = _mm256_maskz_loadu_epi16(tail_mask, sc + i * 2 * tail);
      const __m512 f = _mm512_load_ps(facc[i]);
      _mm512_store_ps(facc[i], fold ? group_fma<kFaithful, true>(ah[i], al[i], corr, d16, sv, f)
                                    : group_fma<kFaithful>(ah[i], al[i], corr, d16, sv, f));
    }
  }
  for (int i = 0; i < R; ++i) y[i] = _mm512_reduce_add_ps(_mm512_load_ps(facc[i]));
}

// Rows [r0, r1): whole row groups with all RL rows side by side, rows of a
// partly covered row group (a range boundary inside it) one at a time.
template <int RL, bool kFaithful, bool kPf>
void stream_range(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const int64_t nb = args.n_blocks, tail = nb % kLanesGroupBlocks;
  const int64_t tail_bytes = tail == 0 ? 0 : ((tail <= 8 ? 4 : 8) * 64 * RL + 2 * tail * RL + 63) / 64 * 64;
  const int64_t rgb = nb / kLanesGroupBlocks * 544 * RL + tail_bytes;  // stream_rowgroup_bytes
  for (int64_t r = r0; r < r1;) {
    const uint8_t* base = args.w + r / RL * rgb;
    const int i0 = static_cast<int>(r % RL);
    if (i0 == 0 && r + RL <= r1) {
      stream_rows<RL, RL, kFaithful, kPf>(args, base, 0, y + r);
      r += RL;
    } else {
      stream_rows<RL, 1, kFaithful, kPf>(args, base, i0, y + r);
      r += 1;
    }
  }
}

}  // namespace

void pq2_stream_rows_avx512(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  const bool faithful = args.a.lo != nullptr, pf = args.prefetch > 0;
  if (args.row_bytes == 8) {
    if (pf)
      faithful ? stream_range<8, true, true>(args, y, r0, r1) : stream_range<8, false, true>(args, y, r0, r1);
    else
      faithful ? stream_range<8, true, false>(args, y, r0, r1)
               : stream_range<8, false, false>(args, y, r0, r1);
  } else {
    if (pf)
      faithful ? stream_range<4, true, true>(args, y, r0, r1) : stream_range<4, false, true>(args, y, r0, r1);
    else
      faithful ? stream_range<4, true, false>(args, y, r0, r1)
               : stream_range<4, false, false>(args, y, r0, r1);
  }
}

void pq2_lanes_rows_avx512(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  if (args.a.lo) {
    // Long rows (K = 17408: a 36 KB activation, more than L1) walk 8 rows side
    // by side, halving the activation's L2 traffic per weight byte (streaming
    // 17408 × 5120: 22.5 → 25.4 GB/s in an alternating A/B).
    if (args.row_bytes * 4 > kLinearPrefetchMaxGroup)
      rows_r<8, true>(args, y, r0, r1);
    else
      rows_r<4, true>(args, y, r0, r1);
  } else {
    const int64_t full = r0 + (r1 - r0) / 2 * 2;
    rows_int8<2>(args, y, r0, full);
    rows_int8<1>(args, y, full, r1);
  }
}

}  // namespace bonsai::cpu::detail
