// Ternary GEMM for prefill: Y[t][n] = X[t][k] · Wᵀ for a batch of t tokens.
//
// ---- Numerics: identical to the decode matvec (kernels/cpu/matvec.h) ----------
// Each token's activation is quantized per block (128 elements; 64 for Q2_0
// g64) exactly as prepare_act does: s_b = amax_b / Q, q_j = round(x_j / s_b),
// Q = 32639 split as q = 256·hi + lo (faithful) or Q = 127 (int8 mode). Per
// (row, token, block) the integer Σ_j (c_j − 1)·q_j is computed exactly in
// int32 — (Σ c·hi)·256 + Σ c·lo − Σ q, with codes c ∈ {0..3} as unsigned bytes —
// so it is bit-identical to the matvec's integer; it is then scaled by
// d_b·s_b (one float multiply, as in the matvec) and accumulated in float.
// Only the float summation order over blocks differs from the matvec (here a
// running sum over blocks; there 16 lanes reduced at the end), so the GEMM's
// error bound and measured error are those of the decode path:
//   |y − y_exact| ≤ Σ_b |d_b| · (s_b/2) · Σ_{j∈b} |c_j − 1|  (+ float rounding),
// ≈ 3e-5 relative per faithful matvec on rotated activations.
// Cost: the faithful scheme issues two int8 dot products per weight (hi and
// lo halves); the int8 mode one.
//
// ---- Kernel shape (AVX-512 VNNI) ------------------------------------------------
// Rows are taken in panels of 64 (4 zmm of 16 rows). For a slab of blocks the
// panel's 2-bit codes are decoded once into an L1/L2-resident buffer laid out
// "rows across lanes": 64 bytes = 16 rows × 4 codes per step of 4 inputs. The
// micro-kernel then holds 4 row vectors × 6 tokens of int32 accumulators
// (24 zmm) and issues per step one vpdpbusd per (row vector, token) with the
// token's 4 activation bytes broadcast from memory: the reduction over the
// block stays inside each lane, so there is no horizontal sum, and the
// per-block float work (corr, cvt, d·s, FMA) is paid once per 32 (64 for
// faithful) vpdpbusd instead of once per 8 as in the matvec. Each weight is
// decoded once per (panel, slab) and reused by every token of the batch.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/matvec.h"

namespace bonsai::cpu {

// t tokens quantized for the GEMM. Per block b and token i the bytes are in
// "step order": byte 4j + e of block b holds element 16·(j/4) + 4e + j%4 of
// the block (the order the 2-bit code decode produces; see gemm_avx512.cpp).
struct PreparedBatch {
  int t = 0;
  int64_t k = 0;
  int block = 128;  // 128 (PQ2_0, Q2_0 g128, PTQ1_0) or 64 (Q2_0 g64)
  Precision precision = Precision::Faithful;
  int64_t n_blocks = 0;
  AlignedBuffer<int8_t> q;      // [n_blocks][t][halves][block]  halves: hi, lo (faithful) or q (int8)
  AlignedBuffer<int32_t> corr;  // [n_blocks][t]  −Σ_j q_j
  AlignedBuffer<float> scale;   // [n_blocks][t]  s_b
};

// The activation block a ternary type needs (128 or 64); 0 for other types.
int gemm_block(DType t);

// Whether gemm() has a kernel for this type and ISA (otherwise callers run a
// matvec per token).
bool gemm_supported(DType t, Isa isa);

// Quantizes x [t][k] (k a multiple of `block`), tokens split across `pool`
// when given; throws bonsai::Error on a non-finite activation.
void prepare_batch(const float* x, int t, int64_t k, int block, Precision precision, PreparedBatch& out,
                   ThreadPool* pool = nullptr);

// y [a.t][w.n] (row stride w.n), rows split across the pool in panels of 64.
void gemm(const WeightView& w, const PreparedBatch& a, float* y, ThreadPool& pool, Isa isa);

// Several weights reading the same batch; jobs[i].y is [a.t][jobs[i].w.n].
void gemm_multi(std::span<const MatvecJob> jobs, const PreparedBatch& a, ThreadPool& pool, Isa isa);

}  // namespace bonsai::cpu
