// The prefill form of the three Hadamard sites (residual + norm, plain, SwiGLU) when their output
// feeds the fp16 GEMM (kernels/cuda/gemm_f16.cuh): the site writes the GEMM's fp16 activation
// itself (act_to_f16's layout and values, bit for bit) instead of the int8 quantization
// (xq / meta) that only the int8 kernels read. kernels/cuda/site_f16.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace bonsai::cuda {

enum class SiteF16Kind { hadamard, swiglu, residual };

// One row of a site (every pointer [rows][k] unless noted):
//   hadamard: rotated = FWHT_B(signs ⊙ x)/√B (forward only)
//   swiglu:   act = silu(x) ⊙ up, rotated = FWHT_B(signs ⊙ act)/√B
//   residual: x_out = x + delta (delta may be null; x_out may alias x), normed = rmsnorm(x_out)·gain
//             (gain [k]), rotated = FWHT_B(signs ⊙ normed)/√B
// and in every case xh / tscale = act_to_f16(rotated) with one term. signs [k] may be null.
// Every float the same as hadamard() / swiglu_hadamard() / residual_norm_site() write.
struct SiteF16Args {
  const float* x = nullptr;
  const float* up = nullptr;     // swiglu
  float* act = nullptr;          // swiglu
  const float* delta = nullptr;  // residual
  float* x_out = nullptr;        // residual
  const float* gain = nullptr;   // residual
  float* normed = nullptr;       // residual
  float eps = 0.0f;              // residual
  const float* signs = nullptr;
  float* rotated = nullptr;
  uint8_t* xh = nullptr;    // [rows][k/128][256 B]: 128 fp16 per k-block in f16_act_index order
  float* tscale = nullptr;  // [rows] 2^e
};

// The largest row (in Hadamard blocks) the kernel holds: a thread keeps one float4 of every
// Hadamard block of its row in registers (the 27B's widest site, SwiGLU's 17408 columns, is 17
// blocks of 1024).
inline constexpr int kSiteF16MaxBlocks = 24;

// Whether site_f16 takes rows of width k in Hadamard blocks of `block`: 128 <= block <= 1024
// (a thread per float4 of a block; 1024 keeps the registers of 24 float4s within 256 threads),
// block % 128 == 0, k % block == 0, k / block <= kSiteF16MaxBlocks.
bool site_f16_fits(int64_t k, int64_t block);

// A block per row: loads the whole row at once, the norm's Σx² (residual) in the order of
// residual_norm_site's threads, the FWHT of all its Hadamard blocks together (the cross-warp
// stages through shared memory), then the row's amax, the exponent (f16_token_exp) and the
// fp16 record. Requires site_f16_fits(k, block).
void site_f16(SiteF16Kind kind, const SiteF16Args& a, int64_t rows, int64_t k, int64_t block, cudaStream_t s);

// Whether site_f16_two_pass takes rows of width k in Hadamard blocks of `block`: the per-block
// kernels' one-float4-per-thread path (128 <= block <= 4096), block % 128 == 0, k % block == 0;
// any number of blocks.
bool site_f16_two_pass_fits(int64_t k, int64_t block);

// The same outputs as site_f16 (bit for bit) in two launches that keep the per-block kernels'
// occupancy (site_f16 holds the whole row in one block: 1 block per SM at 17 blocks of 1024):
// hadamard() / swiglu_hadamard() / residual_norm_site() without the int8 quantization, each
// block also writing its max |rotated| to bamax [rows][k / block]; then a light kernel (a block of
// 256 float4s per (row, 1024 columns)) forms each row's amax from its blocks' (max is exact and
// ignores NaN in any order: act_f16_kernel's amax), the exponent and the fp16 record from the
// rotated floats just written. Requires site_f16_two_pass_fits(k, block).
void site_f16_two_pass(SiteF16Kind kind, const SiteF16Args& a, float* bamax, int64_t rows, int64_t k,
                       int64_t block, cudaStream_t s);

// The largest cluster site_f16_cluster launches (16: the non-portable limit of sm_90).
inline constexpr int kSiteF16MaxCluster = 16;

// Whether site_f16_cluster takes rows of width k in Hadamard blocks of `block` with `per_block`
// (1..4) Hadamard blocks per thread block: 128 <= block <= 1024, block % 128 == 0, k % block == 0,
// at most kSiteF16MaxCluster thread blocks per row, and a device of compute capability 9.x.
bool site_f16_cluster_fits(int64_t k, int64_t block, int per_block);

// The same outputs as site_f16 (bit for bit: the same code) with a row spread over a cluster of
// ceil(k / block / per_block) thread blocks, each holding per_block Hadamard blocks of it in
// registers (site_f16 holds all of them in one block: 192 registers and one block per SM at 17
// blocks of 1024). The row-wide reductions (the residual's Σx², in the same order, and the amax)
// go through the cluster's shared memory, so the row is read once and the fp16 record written
// from registers in one launch. False (nothing launched, no error left) where it does not fit
// or the device refuses the cluster launch: the caller runs another form.
bool site_f16_cluster(SiteF16Kind kind, const SiteF16Args& a, int64_t rows, int64_t k, int64_t block,
                      int per_block, cudaStream_t s);

}  // namespace bonsai::cuda
