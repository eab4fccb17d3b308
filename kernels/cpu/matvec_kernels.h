// Internal: the per-ISA row kernels behind kernels/cpu/matvec.h.
//
// This header is included by the *_avx2.cpp / *_avx512.cpp translation units,
// which are compiled with ISA flags. It therefore holds only plain data and
// declarations: an inline function or template instantiated in such a unit
// could be emitted with AVX-512 instructions and then picked by the linker
// for the baseline build as well (ODR merging), crashing an AVX2-only CPU.
// Keep ISA units free of standard-library templates for the same reason.
#pragma once

#include <cstdint>

namespace bonsai::cpu::detail {

// Blocks per group of the Lanes16 weight / activation layouts (matvec.h).
inline constexpr int kLanesGroupBlocks = 16;

// One PackedAct as raw pointers (see matvec.h for the layout).
struct PackedView {
  const int8_t* hi;
  const int8_t* lo;  // nullptr in int8 mode
  const int32_t* corr;
  const float* scale;
  int64_t n_groups;
};

// Ternary weights: rows of `n_blocks` blocks, `row_bytes` apart, the whole
// tensor ending at `end` (kernels must not read at or past it). Lanes16
// weights: w / row_bytes are the code rows, `scales` the fp16 d [n][n_blocks].
// Stream16 weights: w the buffer, row_bytes the rows per row group (4 or 8).
struct TernaryArgs {
  const uint8_t* w;
  int64_t row_bytes;
  int64_t n_blocks;  // weight blocks per row
  const uint8_t* end;
  PackedView a;
  const uint8_t* scales;  // Lanes16 only
  // Stream16 only: how far ahead (bytes) the kernel prefetches its stream into L2, 0 none
  // (matvec.cpp, stream_prefetch_bytes: BONSAI_CPU_STREAM_PF4 / _PF8).
  int64_t prefetch = 0;
};

// Float weights: 0 = F32, 1 = F16, 2 = BF16; x is the f32 activation.
struct FloatArgs {
  const uint8_t* w;
  int64_t k;
  int type;
  const float* x;
};

using TernaryKernel = void (*)(const TernaryArgs& args, float* y, int64_t r0, int64_t r1);
using FloatKernel = void (*)(const FloatArgs& args, float* y, int64_t r0, int64_t r1);

// PQ2_0 / Q2_0 g128 (identical bytes).
void pq2_rows_scalar(const TernaryArgs&, float*, int64_t, int64_t);
void pq2_rows_avx2(const TernaryArgs&, float*, int64_t, int64_t);
void pq2_rows_avx512(const TernaryArgs&, float*, int64_t, int64_t);
// PQ2_0 / Q2_0 g128 in the Lanes16 layout (matvec.h), ActLayout::Lanes16 activation.
void pq2_lanes_rows_avx512(const TernaryArgs&, float*, int64_t, int64_t);
// The same in the Stream16 layout (matvec.h).
void pq2_stream_rows_avx512(const TernaryArgs&, float*, int64_t, int64_t);
// Q2_0 g64.
void q2g64_rows_scalar(const TernaryArgs&, float*, int64_t, int64_t);
void q2g64_rows_avx2(const TernaryArgs&, float*, int64_t, int64_t);
void q2g64_rows_avx512(const TernaryArgs&, float*, int64_t, int64_t);
// PTQ1_0.
void ptq1_rows_scalar(const TernaryArgs&, float*, int64_t, int64_t);
void ptq1_rows_avx2(const TernaryArgs&, float*, int64_t, int64_t);
void ptq1_rows_avx512(const TernaryArgs&, float*, int64_t, int64_t);
// PTQ1_0 → PQ2_0 (bit-exact) for n_blocks consecutive blocks; src_end bounds the reads.
void transcode_ptq1_blocks_avx2(const uint8_t* src, uint8_t* dst, int64_t n_blocks, const uint8_t* src_end);
// F32 / F16 / BF16.
void float_rows_scalar(const FloatArgs&, float*, int64_t, int64_t);
void float_rows_avx2(const FloatArgs&, float*, int64_t, int64_t);
void float_rows_avx512(const FloatArgs&, float*, int64_t, int64_t);

// Software prefetch of the streamed weights. Measured on Zen 4 with 2
// threads (the hardware prefetchers alone leave the compute-heavy kernels at
// 0.4-0.65 of read bandwidth), for kernels that walk R rows side by side:
//  * prefetch one row group (R rows) ahead — a row group being ≥ 4 KB;
//  * for short rows (group ≤ 8 KB: K = 5120, 6144) issue the prefetches in
//    *linear* address order over the next group, which lifts PQ2_0 faithful
//    from ~0.62 to ~0.85 of read bandwidth (column order — each row's stream
//    separately — stays at ~0.62, at any distance);
//  * for long rows (K = 17408: a 4-row group is 18.5 KB) column order is the
//    better one (0.82 vs 0.65 linear: a linear sweep runs too far ahead of
//    the first rows and L1, already streaming the 43 KB activation, drops it).
// A kernel prefetches group_base + ahead + iter·per_iter + i·per_row at
// iteration `iter` for its row i, with `step` weight bytes per row and iteration.
struct PrefetchPlan {
  int64_t ahead, per_iter, per_row;
};
inline constexpr int64_t kPrefetchMinLead = 4096;
inline constexpr int64_t kLinearPrefetchMaxGroup = 8192;
// static: no shared inline symbol between units compiled for different ISAs.
static inline PrefetchPlan prefetch_plan(int64_t row_bytes, int rows, int64_t step) {
  const int64_t group = row_bytes * rows;
  const int64_t ahead = group * ((kPrefetchMinLead + group - 1) / group);
  if (group <= kLinearPrefetchMaxGroup) return {ahead, rows * step, step};
  return {ahead, step, row_bytes};
}

}  // namespace bonsai::cpu::detail
