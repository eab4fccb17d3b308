// Device layouts of the CUDA backend's ternary matvec, shared by the kernels
// (kernels/cuda/*.cu) and the host-side tests that check them without a GPU.
//
// ---- Weights: "tiled" 2-bit codes -------------------------------------------
// The matvec runs on the int8 tensor cores: one mma.m16n8k32 multiplies a
// 16-row x 32-column slice of codes (A, u8) by a 32 x 8 slice of activations
// (B, s8). A thread's A fragment is four 32-bit registers a0..a3 of four codes:
//   a0: row g,   k = 4·tig + b        a1: row g+8, k = 4·tig + b
//   a2: row g,   k = 16 + 4·tig + b   a3: row g+8, k = 16 + 4·tig + b
// (lane = 4·g + tig, byte b = 0..3). The weights are repacked at load so that
// one 32-bit word per lane and k-step holds exactly those 16 codes, register j
// in bit pair j of each byte: a_j = (word >> 2j) & 0x03030303. The whole
// fragment then costs one shift and one AND per register, and a lane reads its
// four k-steps of a 128-column block as one 16-byte load.
//
// A "chunk" is 16 rows x 128 columns (one PQ2_0 block per row):
//   bytes [0, 512):   codes, word (lane, step s) at byte 16·lane + 4·s
//   bytes [512, ...): fp16 scales, `groups` (1 for 128-groups, 2 for Q2_0 g64)
//                     sets of 8 words; word g of set `sub` = {d(row g), d(row g+8)}
// Chunks are stored [tile][kblock]; tiles are 16 rows, padded to a multiple of
// kWarpTiles (a warp streams that many tiles together); padding rows have code 0
// and scale 0.
//
// ---- Activations: int16-accurate, as two int8 halves ----------------------------
// The CPU backend's Faithful numerics (kernels/cpu/matvec.h): per 128 inputs a
// scale s = amax/32639 and q = round(x/s) = 256·hi + lo. Per 128-column
// block: 256 bytes, [hi: 32 words][lo: 32 words], word 8·tig + 2·s + h holding
// natural columns 32·s + 16·h + 4·tig + (0..3), so a lane reads its eight B
// words (four k-steps x two registers) as 32 contiguous bytes; plus a float4
// {s, s, Σq0, Σq1 (int bits)}: the scale for each 64-column half (both the block's) and
// each half's sum. The dot product of a block (or half) with codes c ∈ {0..3}, w = (c-1)·d:
//   d · s · (256·Σc·hi + Σc·lo − Σq)        (integer part exact: |.| < 2^24)
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define BONSAI_HD __host__ __device__ __forceinline__
#else
#define BONSAI_HD inline
#endif

namespace bonsai::cuda {

inline constexpr int kTileRows = 16;                      // rows of one mma A fragment
inline constexpr int kWarpTiles = 4;                      // tiles a warp streams together (one "group")
inline constexpr int kPairRows = kTileRows * kWarpTiles;  // rows per group
inline constexpr int kBlockK = 128;                       // columns per chunk
inline constexpr int kCodeBytes = 512;                    // 16 x 128 codes of 2 bits
inline constexpr int kActBytes = 256;        // quantized activation bytes per 128 columns (hi + lo)
inline constexpr float kActQMax = 32639.0f;  // |q| <= 32639 keeps hi in [-127, 127]

BONSAI_HD int chunk_bytes(int groups) { return kCodeBytes + 32 * groups; }

struct CodePos {
  int byte;   // byte offset inside the chunk
  int shift;  // bit shift of the 2-bit code inside that byte
};

// Where the code of (row r in [0,16), column k in [0,128)) of a chunk lives.
BONSAI_HD CodePos code_pos(int r, int k) {
  const int step = k >> 5, half = (k >> 4) & 1, tig = (k >> 2) & 3, b = k & 3;
  const int g = r & 7, upper = r >> 3;
  return {(g * 4 + tig) * 16 + step * 4 + b, 2 * (half * 2 + upper)};
}

// Byte offset of the fp16 scale of row r for 64-column group `sub` (0 when groups == 1).
BONSAI_HD int scale_pos(int r, int sub) { return kCodeBytes + sub * 32 + (r & 7) * 4 + (r >> 3) * 2; }

// Word (0..31) of a 128-column activation block holding natural column k (byte k & 3 of it).
BONSAI_HD int act_word(int k) { return ((k >> 2) & 3) * 8 + (k >> 5) * 2 + ((k >> 4) & 1); }

// Split q (|q| <= 32639) into hi in [-127, 127] and lo in [-128, 127] with q = 256·hi + lo.
BONSAI_HD int act_hi(int q) { return (q + 128) >> 8; }  // arithmetic shift: floor
BONSAI_HD int act_lo(int q) { return q - 256 * act_hi(q); }

// ---- The prefill GEMM's exact integer -> float step (kernels/cuda/gemm.cu) ----------------
// Both int32 MMA chains of a block (Σc·hi, Σc·lo; |.| <= 3·128·128 < 2^22) start from the
// bits of kFlushMagic = 1.5·2^23, so the chain's int32 result, read as a float, is exactly
// kFlushMagic + Σ (floats in [2^23, 2^24) have ulp 1). Then, with magic_sumq = kFlushMagic +
// Σq (exact: |Σq| <= 128·32639 < 2^22), one FMA gives T = 256·Σc·hi + Σc·lo − Σq exactly:
// |T| <= 256·48768 + 49152 + 4177792 < 2^24 for any codes 0..3 (test_backend_cuda_gemm.cpp
// checks the corners of that box).
inline constexpr int kFlushMagicBits = 0x4B400000;
inline constexpr float kFlushMagic = 12582912.0f;

BONSAI_HD float flush_bits_as_float(int v) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(v);
#else
  float f;
  std::memcpy(&f, &v, sizeof f);
  return f;
#endif
}

BONSAI_HD float flush_value(int hi_acc, int lo_acc, float magic_sumq) {
  const float h = flush_bits_as_float(hi_acc) - kFlushMagic, l = flush_bits_as_float(lo_acc) - magic_sumq;
#if defined(__CUDA_ARCH__)
  return fmaf(h, 256.0f, l);
#else
  return std::fma(h, 256.0f, l);
#endif
}

// Bytes of a tiled weight of n rows and k columns (k a multiple of 128).
// Row groups (kPairRows rows, kWarpTiles tiles) of an n-row weight.
BONSAI_HD int64_t tiled_pairs(int64_t n) { return (n + kPairRows - 1) / kPairRows; }
BONSAI_HD int64_t tiled_bytes(int64_t n, int64_t k, int groups) {
  return tiled_pairs(n) * kWarpTiles * (k / kBlockK) * chunk_bytes(groups);
}

}  // namespace bonsai::cuda
