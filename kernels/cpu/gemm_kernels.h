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
  // The prepared batch (see gemm.h).
  const int8_t* q;
  const int32_t* corr;
  const float* scale;
  int t;
  bool faithful;
  float* y;  // [t][ldy]
  int64_t ldy;
};

// Rows [r0, min(r0 + 64, n_rows)) of y for every token; scratch holds
// gemm_scratch_bytes(t), 64-byte aligned.
void gemm_panel_avx512(const GemmArgs& a, int64_t r0, uint8_t* scratch);
void gemm_panel_avx2(const GemmArgs& a, int64_t r0, uint8_t* scratch);

}  // namespace bonsai::cpu::detail
