// Internal: the per-ISA panel kernels behind kernels/cpu/gemm.h. Plain data
// and declarations only (included by ISA-flagged units; see matvec_kernels.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace bonsai::cpu::detail {

inline constexpr int kGemmPanelRows = 64;
// Bytes of decoded codes per slab (blocks decoded together): 4 blocks of 128
// or 8 of 64, i.e. 32 KB, about what L1 holds.
inline constexpr int64_t kGemmSlabWeights = 512;
inline constexpr size_t kGemmScratchBytes = 64 * 1024;
// Per-thread scratch for a batch of t tokens: the decode buffers above plus
// the panel's output accumulator [t][64] floats (contiguous, so the per-block
// read-modify-write does not hit y's rows n floats apart — for n a multiple
// of 1024 they all alias the same L1 sets).
inline size_t gemm_scratch_bytes(int t) {
  return kGemmScratchBytes + static_cast<size_t>(t) * kGemmPanelRows * 4;
}

struct GemmArgs {
  const uint8_t* w;   // weight rows in the file layout
  int64_t row_bytes;  // bytes per row
  int64_t n_rows;
  int64_t n_blocks;    // blocks per row
  int block;           // weights per block: 128 or 64
  int block_bytes;     // 34 (PQ2_0 / Q2_0 g128), 18 (Q2_0 g64), 28 (PTQ1_0)
  bool ptq1;           // PTQ1_0: transcoded to PQ2_0 per slab before decoding
  const uint8_t* end;  // end of the weight data (PTQ1_0 transcode reads are bounded by it)
  // Lanes16 weights (kernels/cpu/matvec.h; AVX-512 only): w / row_bytes are the
  // code rows, scales the fp16 d [n_rows][n_blocks].
  bool lanes;
  const uint8_t* scales;
  // Stream16 weights (matvec.h; AVX-512 only): w the buffer, stream_rl rows
  // per row group (0: not Stream16), stream_rgb bytes per row group.
  int stream_rl;
  int64_t stream_rgb;
  // The prepared batch (see gemm.h).
  const int8_t* q;
  const int32_t* corr;
  const float* scale;
  int t;
  bool faithful;
  float* y;  // [t][ldy]
  int64_t ldy;
};

// Software prefetch (into L2) of the weight bytes that rows [r0 + i0, r0 + i1)
// of the panel at r0 decode for the slab starting at block b0: one short piece
// per row, rows 1–5 KB apart, which the hardware prefetchers do not
// anticipate. Callers spread a slab's prefetches over the previous slab's
// compute (a burst of ~200 overflows the miss queues).
static inline void gemm_prefetch_rows(const GemmArgs& a, int64_t r0, int64_t b0, int64_t i0, int64_t i1) {
  const int64_t slab = kGemmSlabWeights / a.block;
  if (b0 >= a.n_blocks) return;
  const int64_t nb = a.n_blocks - b0 < slab ? a.n_blocks - b0 : slab;
  const int64_t bytes = nb * a.block_bytes;
  const int64_t row_bytes_ptq1 = a.ptq1 ? 28 : a.block_bytes;  // PTQ1_0 is read as 28-byte blocks
  for (int64_t i = r0 + i0; i < r0 + i1 && i < a.n_rows; ++i) {
    const uint8_t* p = a.w + i * a.row_bytes + b0 * row_bytes_ptq1;
    const int64_t n = a.ptq1 ? nb * 28 : bytes;
    for (int64_t off = 0; off < n; off += 64) __builtin_prefetch(p + off, 0, 2);
    __builtin_prefetch(p + n - 1, 0, 2);
  }
}

// Lanes16: prefetch (into L2) group j's code chunks and scales for rows
// [r0 + i0, r0 + i1) (the panel loop spreads a group's prefetches over the
// slabs of the group before it).
static inline void gemm_prefetch_lanes(const GemmArgs& a, int64_t r0, int64_t j, int64_t i0, int64_t i1) {
  constexpr int64_t kGroup = 16;
  if (j * kGroup >= a.n_blocks) return;
  const int64_t g = a.n_blocks - j * kGroup < kGroup ? a.n_blocks - j * kGroup : kGroup;
  for (int64_t i = r0 + i0; i < r0 + i1 && i < a.n_rows; ++i) {
    const uint8_t* p = a.w + i * a.row_bytes + j * 512;
    for (int64_t off = 0; off < 32 * g; off += 64) __builtin_prefetch(p + off, 0, 2);
    const uint8_t* s = a.scales + (i * a.n_blocks + j * kGroup) * 2;
    __builtin_prefetch(s, 0, 2);
    __builtin_prefetch(s + 2 * g - 1, 0, 2);
  }
}

// Stream16: the same for group j of rows [r0 + i0, r0 + i1) (matvec.h: row i's
// chunks 64·RL bytes apart inside its row group, its scales after them).
static inline void gemm_prefetch_stream(const GemmArgs& a, int64_t r0, int64_t j, int64_t i0, int64_t i1) {
  constexpr int64_t kGroup = 16;
  if (j * kGroup >= a.n_blocks) return;
  const int64_t rl = a.stream_rl, n_full = a.n_blocks / kGroup, g = a.n_blocks - j * kGroup;
  const bool full = j < n_full;
  const int64_t steps = full ? 8 : g <= 8 ? 4 : 8;
  for (int64_t i = r0 + i0; i < r0 + i1 && i < a.n_rows; ++i) {
    const uint8_t* p = a.w + i / rl * a.stream_rgb + j * 544 * rl + i % rl * 64;
    for (int64_t u = 0; u < steps; ++u) __builtin_prefetch(p + u * 64 * rl, 0, 2);
    __builtin_prefetch(p + steps * 64 * rl - i % rl * 64 + i % rl * (full ? 32 : 2 * g), 0, 2);
  }
}

// Rows [r0, min(r0 + 64, n_rows)) of y for every token; scratch holds
// gemm_scratch_bytes(t), 64-byte aligned.
void gemm_panel_avx512(const GemmArgs& a, int64_t r0, uint8_t* scratch);
void gemm_panel_avx2(const GemmArgs& a, int64_t r0, uint8_t* scratch);

}  // namespace bonsai::cpu::detail
