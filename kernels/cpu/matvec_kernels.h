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

// One PackedAct as raw pointers (see matvec.h for the layout).
struct PackedView {
  const int8_t* hi;
  const int8_t* lo;  // nullptr in int8 mode
  const int32_t* corr;
  const float* scale;
  int64_t n_groups;
};

// Ternary weights: rows of `n_blocks` blocks, `row_bytes` apart, the whole
// tensor ending at `end` (kernels must not read at or past it).
struct TernaryArgs {
  const uint8_t* w;
  int64_t row_bytes;
  int64_t n_blocks;  // weight blocks per row
  const uint8_t* end;
  PackedView a;
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
// Q2_0 g64.
void q2g64_rows_scalar(const TernaryArgs&, float*, int64_t, int64_t);
void q2g64_rows_avx2(const TernaryArgs&, float*, int64_t, int64_t);
void q2g64_rows_avx512(const TernaryArgs&, float*, int64_t, int64_t);
// PTQ1_0.
void ptq1_rows_scalar(const TernaryArgs&, float*, int64_t, int64_t);
void ptq1_rows_avx2(const TernaryArgs&, float*, int64_t, int64_t);
void ptq1_rows_avx512(const TernaryArgs&, float*, int64_t, int64_t);
// F32 / F16 / BF16.
void float_rows_scalar(const FloatArgs&, float*, int64_t, int64_t);
void float_rows_avx2(const FloatArgs&, float*, int64_t, int64_t);
void float_rows_avx512(const FloatArgs&, float*, int64_t, int64_t);

// Software prefetch distance for streamed weights. Measured on Zen 4 (2
// threads): without it the compute-heavy kernels reach 0.4-0.65 of read
// bandwidth; ~8 KB ahead keeps enough lines in flight.
inline constexpr int64_t kPrefetchBytes = 8192;

// A kernel that walks R rows side by side reads R interleaved streams, and a
// row may be shorter than the prefetch distance; so it prefetches the same
// column of the row group that lies ≈ kPrefetchBytes ahead in its own reading
// order: a whole number of R-row steps. (static: no shared inline symbol
// between units compiled for different ISAs.)
static inline int64_t prefetch_offset(int64_t row_bytes, int rows_per_step) {
  const int64_t step = row_bytes * rows_per_step;
  const int64_t steps = (kPrefetchBytes + step / 2) / step;
  return step * (steps > 0 ? steps : 1);
}

}  // namespace bonsai::cpu::detail
