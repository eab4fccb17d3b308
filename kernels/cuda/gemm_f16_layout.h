// The layouts of the FP16 prefill GEMM (kernels/cuda/gemm_f16.cuh), shared by the kernels and
// the host-side tests that check them without a GPU.
//
// The weights stay in the tiled layout of tile_layout.h (same upload, same repack): lane 4g + t
// of a chunk holds, per 32-column step s, one word whose byte b, bit pair p is the code of row
// g + 8·(p & 1), natural column 32s + 16·(p >> 1) + 4t + b. That is 32 columns of rows g and
// g + 8, exactly the rows the lane's A fragment of wgmma m64nNk16 (f16, A in registers) covers:
//   a0 = row g, k 2t, 2t+1    a1 = row g+8, k 2t, 2t+1
//   a2 = row g, k 8+2t, 8+2t+1 a3 = row g+8, k 8+2t, 8+2t+1   (low half = the smaller k)
// K is the reduction axis, so the 128 columns of a k-block may enter the MMA in any order as
// long as the activation is stored in the same order: the fp16 activation of a k-block is
// written permuted so that permuted index K = 16j + 8m + 2t + c (k-step j = 2s + h, fragment
// column pair m, lane t, half c) holds natural column 32s + 16h + 4t + m + 2c. Then register
// r = 2m + u (u: row g + 8u) of k-step j takes, from the step word of s = j >> 1, the bit pair
// 2h + u of byte m (low half) and of byte m + 2 (high half): both are at the same bit offset
// 8m + 4h + 2u of their 16-bit half, so one shift and one mask, (w >> shift) & 0x00030003,
// extract the two codes in place, and OR 0x64006400 makes them the fp16 values 1024 + c.
#pragma once

#include <cstdint>

#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {

// Permuted position (0..127) of natural column n (0..127) in a k-block of the fp16 activation.
BONSAI_HD int f16_act_index(int n) {
  const int s = n >> 5, h = (n >> 4) & 1, t = (n >> 2) & 3, m = n & 1, c = (n >> 1) & 1;
  return 32 * s + 16 * h + 8 * m + 2 * t + c;
}

// Shift of the step word (s = j >> 1) that puts the codes of A register r (0..3) of k-step j
// (0..7) at bits 0-1 and 16-17.
BONSAI_HD int f16_code_shift(int j, int r) { return 8 * (r >> 1) + 4 * (j & 1) + 2 * (r & 1); }

// Whether the fp16 scale d (bits) keeps every weight value (c - 1)·d, c in 0..3, exact in fp16:
// 2d must not overflow. |d| < 2^15 gives |2d| <= 2 · 32752 = 65504, the largest finite fp16
// (2^15 = 0x7800 as fp16 bits); d·(-1, 0, 1) is always exact and doubling is exact short of
// overflow (also for subnormal d). Infinite and NaN scales fail too.
BONSAI_HD bool f16_scale_ok(uint16_t bits) { return (bits & 0x7FFFu) < 0x7800u; }

// The per-token scale of the fp16 activation: x is stored as x · 2^-e with e chosen so that the
// token's amax·2^-e lies in [2^14, 2^15): the top binade whose values cannot round to infinity
// (the largest, just under 2^15, rounds to at most 2^15 <= 65504), which leaves small elements
// the most room above fp16's subnormal range. e is clamped to [-120, 120] so that 2^±e are
// normal floats (only amax < 2^-106 is affected: such tokens lose their small elements to
// fp16's underflow, an absolute error of at most 2^-25 · 2^e per element). amax = 0 or not
// finite: e = 0. frexp_exp: E with amax in [2^(E-1), 2^E).
BONSAI_HD int f16_token_exp(int frexp_exp) {
  const int e = frexp_exp - 15;
  return e < -120 ? -120 : (e > 120 ? 120 : e);
}

}  // namespace bonsai::cuda
