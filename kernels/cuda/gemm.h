// The prefill GEMM of the CUDA backend: y_j [t][n_j] = x [t][k] · W_jᵀ for tiled ternary
// weights (kernels/cuda/tile_layout.h) and several tokens at once, on the int8 tensor
// cores. Same numerics as matvec_tiled: each weight tile is decoded once per tile of
// kGemmTokens tokens instead of once per 4 tokens.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace bonsai::cuda {

inline constexpr int kGemmRows = 128;   // weight rows per block (8 tiles, two row groups)
inline constexpr int kGemmTokens = 64;  // tokens per block
// Below this many tokens the matvec (weights streamed once per 4 tokens) is as fast.
inline constexpr int kGemmMinTokens = 12;

// Which kernel runs the GEMM: mma (mma.sync, any device), wgmma / wgmma_cp (Hopper's warpgroup
// MMA; compute capability 9.0, where the sm_90a build runs), or automatic: per launch, wgmma
// for grids of at least gemm_wg_min_blocks() blocks per SM on compute capability 9.0 and mma
// otherwise (gemm_launch_kernel). BONSAI_CUDA_GEMM=mma|wgmma|wgmma_cp|auto|f16 picks one (wgmma,
// wgmma_cp or f16 where they are not available and any other value are errors); unset: f16 on
// compute capability 9.0, else automatic (gemm_select.cpp). Read once per process. wgmma: a producer warp
// feeds the ring with bulk / TMA copies (gemm_wgmma_tma.cuh); wgmma_cp: the session-4 kernel whose consumer
// threads issue cp.async (gemm_wgmma.cuh). Both are bit-identical to mma for the same k ranges. f16
// (BONSAI_CUDA_GEMM=f16; compute capability 9.0): launches that gemm_f16_launch accepts run gemm_f16 (fp16
// weights and activation, fp32 accumulation: not bit-identical to the others, gemm_f16.cuh), the rest as
// automatic.
enum class GemmKernel { mma, wgmma, wgmma_cp, automatic, f16 };
GemmKernel gemm_kernel();
// Whether the current device can run the wgmma kernels (compute capability 9.0). Read once.
bool gemm_wgmma_available();
// The kernel a launch of `grid` blocks (row blocks x token blocks, before the k split) runs:
// `kernel` itself unless it is automatic (then wgmma or mma, see above; wgmma_ok: the device has
// it).
GemmKernel gemm_launch_kernel(GemmKernel kernel, int groups, int grid, int sm_count, bool wgmma_ok);
// automatic's threshold: wgmma for launches of at least this many blocks per SM,
// BONSAI_CUDA_GEMM_WG_MIN=0..16 (default in gemm_select.cpp; any other value is an error).
int gemm_wg_min_blocks();
// The wgmma producer kernel's ring depth: 4 (default) or 8, BONSAI_CUDA_GEMM_WG_STAGES (any other
// value is an error). Read once per process.
int gemm_wg_stages();
// The wgmma producer kernel's activation swizzle: 128 (default; 2 TMA boxes of 128 bytes per
// stage) or 32 (8 boxes of 32 bytes, session 5's first kernel), BONSAI_CUDA_GEMM_WG_SWIZZLE (any
// other value is an error). Read once per process.
int gemm_wg_swizzle();
// The wgmma producer kernel's consumer loop (gemm_wgmma_tma.cuh, LOOP; with the 128-byte swizzle
// and 64 tokens per block only): 0 (round 2's), 1 (the stage's reads done before the wgmmas, the flush
// operands formed after them) or 2 (the default: 1, and the next k-block's reads, A gather and set init
// before the wait for the current wgmmas), BONSAI_CUDA_GEMM_WG_LOOP (any other value is an error). Read once
// per process.
int gemm_wg_loop();
// The wgmma producer kernel's tokens per block: 128 (the default; one accumulator set per
// consumer warpgroup, m64n128k32, 4 stages; with the 128-byte swizzle only, its own consumer
// loop: BONSAI_CUDA_GEMM_WG_LOOP does not apply) or 64 (two sets, m64n64k32; also the default
// when BONSAI_CUDA_GEMM_WG_STAGES=8 or _WG_SWIZZLE=32), BONSAI_CUDA_GEMM_WG_TOKENS (any other
// value, or 128 with WG_STAGES=8 or WG_SWIZZLE=32, is an error). Read once per process. Per
// launch see gemm_wg_block_tokens.
int gemm_wg_tokens();
// The tokens per block a wgmma producer launch runs with: `tokens` (gemm_wg_tokens()) = 128 only
// for grids of at least one 128-token block per SM (grid128: row blocks x 128-token blocks,
// before the k split); smaller grids keep 64 (twice the blocks to spread over the SMs).
int gemm_wg_block_tokens(int tokens, int grid128, int sm_count);
// The wgmma producer kernel's two CUtensorMaps (128 bytes each, kept opaque here so that this
// header needs no cuda.h) for a launch over t tokens: act = xq [t][kblocks·256] bytes, box
// `swizzle` (32 or 128) bytes x `tokens` (the block's, 64 or 128) with the swizzle of that many
// bytes; meta = [t][kblocks] float4 as [t][4·kblocks] floats, box 4 x `tokens`, no swizzle.
// Tokens past t read as zeros. A failed encode is a bonsai::Error.
struct GemmTensorMaps {
  alignas(64) unsigned char act[128];
  alignas(64) unsigned char meta[128];
};
// meta == nullptr: only the activation's map (the fp16 GEMM has no meta).
GemmTensorMaps gemm_tensor_maps(const uint8_t* xq, const float4* meta, int t, int kblocks, int swizzle,
                                int tokens);
// The mma.sync kernel's activation staging in shared memory (gemm.cu, kActPitch): 1 (the
// default), 256-byte rows with swapped 16-byte halves in odd tokens; 0, rows padded by 16
// bytes (before). BONSAI_CUDA_GEMM_STAGE=0|1 (any other value is an error). Read once per process.
int gemm_stage();

// Floats of split-K partial sums gemm_tiled needs for these jobs (0: none).
size_t gemm_tiled_scratch(const TiledJobs& jobs, int t, int64_t k, int sm_count);
// jobs: same k and scale grouping (groups 1 or 2); xq/meta: quantize_act of x [t][k]. With
// few row blocks x token blocks, or a last round of blocks that would leave SMs idle, the
// k-blocks are split over blockIdx.z (gemm.cu, plan_gemm); the ranges' sums go to `partial`
// (gemm_tiled_scratch floats) and are added in a fixed order by a second launch.
// kernel: gemm_kernel() unless a test compares the two; both give the same floats for the same
// k ranges, but the plan may pick other ranges for the wgmma kernel (one block per SM instead of
// two). ranges > 0 (tests): that many k ranges instead of the plan's (`partial` must hold
// ranges x t x Σ n_j floats). wg_swizzle (tests): the wgmma producer kernel's swizzle, 32 or
// 128; 0: gemm_wg_swizzle(). wg_loop (tests): its consumer loop, 0..2; -1: gemm_wg_loop().
// wg_tokens (tests): its tokens per block on every launch, 64 or 128 (128 with the 128-byte
// swizzle only; with 32 it runs 64); 0: gemm_wg_tokens() through gemm_wg_block_tokens.
void gemm_tiled(const TiledJobs& jobs, int groups, const uint8_t* xq, const float4* meta, int t, int64_t k,
                int sm_count, float* partial, cudaStream_t s, GemmKernel kernel = gemm_kernel(),
                int ranges = 0, int wg_swizzle = 0, int wg_loop = -1, int wg_tokens = 0);
// The number of k ranges gemm_tiled splits such a launch into (tests).
int gemm_tiled_ranges(const TiledJobs& jobs, int groups, int t, int64_t k, int sm_count, GemmKernel kernel);

// ---- The FP16 GEMM (kernels/cuda/gemm_f16.cuh; layouts: gemm_f16_layout.h) ----
// x [t][k] (k % 128 == 0) -> xh [t][k/128][terms][256 B] (128 fp16 per k-block and term,
// permuted), tscale[t] = 2^e (the token's amax·2^-e in [2^14, 2^15)); terms 2: x·2^-e as hi + lo.
void act_to_f16(const float* x, uint8_t* xh, float* tscale, int t, int64_t k, cudaStream_t s, int terms = 1);
// The fp16 GEMM's activation terms: 1 (the default: fp16, 11 significant bits) or 2 (hi + lo,
// ~22 bits, twice the tensor work; a fidelity knob), BONSAI_CUDA_GEMM_F16_TERMS (any other value
// is an error). Read once per process.
int gemm_f16_terms();
// The fp16 GEMM's consumer pipelining (gemm_f16.cuh, PIPE; one term only): 0 (the default: each
// k-block's wgmmas waited for before the next are issued) or 1 (one batch kept in flight),
// BONSAI_CUDA_GEMM_F16_PIPE (any other value is an error). Read once per process.
int gemm_f16_pipe();
// The fp16 GEMM's tokens per block asked for (gemm_f16.cuh, NT): 0 (`model`, the default:
// gemm_f16_model picks 64 or 128 tokens and the k ranges), 128 (the grid rule: 128, 64 where the
// grid of 128-token blocks does not cover the SMs; k ranges by plan_gemm) or 256 (m64n256k16,
// 128 accumulators per consumer thread, 3 stages; where the grid of 256-token blocks covers the
// SMs, one term only, else as 128), BONSAI_CUDA_GEMM_F16_TOKENS (any other value is an error).
// Read once per process.
int gemm_f16_tokens();
// The tokens per block and k-blocks per range of an fp16 GEMM launch by a model of its rounds
// (one block per SM; 64 or 128 tokens, 1 to 16 ranges; BONSAI_CUDA_GEMM_F16_TOKENS unset or
// `model`): rowblocks = 128-row blocks of the launch's weights, outs = t x Σ n_j.
// tail: the in-kernel fix-up's costs and the tail form (whole: items of whole tiles first, one
// per tile of the full rounds; the tiles of the last partial round split into ranges).
// stream_gain >= 0 (round 2, with tail): a third form, stream-K (stream: the chunk length in
// k-blocks; the tiles past the full rounds as one run of (tile, k-block) units, a chunk per SM),
// chosen for a gain of stream_gain %; -1: not considered.
struct GemmF16Shape {
  int tokens, kb_per_split, whole = 0, stream = 0;
};
GemmF16Shape gemm_f16_model(int rowblocks, int t, int kblocks, int64_t outs, int sm_count, bool tail = false,
                            int tail_gain = 3, int stream_gain = -1);
// The gain in percent a stream-K candidate of gemm_f16_model needs: -1 (`off`, none considered)
// or 0..10, BONSAI_CUDA_GEMM_F16_STREAM (any other value is an error). Read once per process.
int gemm_f16_stream();
// The most k ranges (pieces) of one tile under stream-K chunks of `stream` k-blocks.
int gemm_f16_stream_ranges(int kblocks, int stream);
// The gain in percent a tail candidate of gemm_f16_model needs over the best so far: 3 (the
// default) or 0..10, BONSAI_CUDA_GEMM_F16_TAIL_GAIN (any other value is an error). Read once per process.
int gemm_f16_tail_gain();
// The fp16 GEMM's split-K sums: 0 `reduce` (session 6's: gemm_reduce_kernel adds the ranges'
// slots), 1 `fixup` (the same plan; the last-arriving range of each tile adds them in the kernel,
// in the same order: bit-identical), 2 `tail` (the default: the fix-up and gemm_f16_model's tail
// form),
// BONSAI_CUDA_GEMM_F16_SUMS (any other value is an error). Read once per process. Forms 1 and 2
// need counters (gemm_f16's), 2 the persistent grid; without them a launch runs 0.
int gemm_f16_sums();
// Zeroed ints gemm_f16's fix-up needs for these jobs at t tokens (any plan).
int gemm_f16_counters(const TiledJobs& jobs, int t);
// Floats of split-K slots an fp16 launch of `ranges` k ranges needs, either form of its sums (tests;
// gemm_tiled_scratch covers the plans).
size_t gemm_f16_scratch(const TiledJobs& jobs, int t, int ranges);
// The tokens per block of a launch asked for `tokens` (gemm_f16_tokens()), given its grids of
// 256- and 128-token blocks.
int gemm_f16_block_tokens(int tokens, int grid256, int grid128, int sm_count);
// The fp16 GEMM's ring depth for 64 or 128 tokens per block: 4 (the default) or 6 (one term,
// PIPE 0 only; 256 tokens always run 3), BONSAI_CUDA_GEMM_F16_STAGES (any other value is an
// error). Read once per process.
int gemm_f16_stages();
// The fp16 GEMM's grid: 1 (the default; persistent: one block per SM walks the work items,
// token block x row block x k range, its ring running on across them; one term, PIPE 0 only) or
// 0 (one block per item), BONSAI_CUDA_GEMM_F16_PERSIST (any other value is an error). Read once
// per process.
int gemm_f16_persist();
// Whether a launch of these jobs over t tokens runs gemm_f16: `kernel` f16 (the default on compute
// capability 9.0, or BONSAI_CUDA_GEMM=f16),
// 128-column groups, every weight's scales exact in fp16 (all_scales_ok: f16_scale_ok at upload),
// and a grid of at least gemm_wg_min_blocks() 64-token blocks per SM (smaller grids run mma.sync,
// as automatic does).
bool gemm_f16_launch(const TiledJobs& jobs, int groups, int t, int sm_count, bool all_scales_ok,
                     GemmKernel kernel = gemm_kernel());
// y_j = x · W_jᵀ from act_to_f16's output; partial: gemm_tiled_scratch floats (split-K ranges,
// summed in a fixed order). ranges > 0 (tests): that many k ranges (`partial` must hold ranges x t
// x Σ n_j floats); tokens (tests): 64, 128 or 256 per block on every launch (256 with two terms
// runs 128); 0: gemm_f16_model, or gemm_f16_block_tokens of gemm_f16_tokens() where that is 128
// or 256. terms: act_to_f16's (0: gemm_f16_terms()); pipe (tests): 0 or 1 (-1: gemm_f16_pipe();
// two terms and 256 tokens run 0); stages (tests): 4 or 6 (0: gemm_f16_stages()); persist
// (tests): 0 or 1 (-1: gemm_f16_persist()). counters: gemm_f16_counters zeroed ints, left zero
// (null: the reduce kernel); sums (tests): 0..2 as gemm_f16_sums (-1: gemm_f16_sums()); with 2
// and ranges > 0 the tiles of the full rounds of sm_count stay whole. decode (tests): 3 or 4 (0:
// gemm_f16_decode()). stream (tests; sums 2, persistent): > 0, the other tiles stream-K in chunks
// of at least that many k-blocks (`partial`: gemm_f16_scratch of gemm_f16_stream_ranges); 0 none;
// -1 the model's.
void gemm_f16(const TiledJobs& jobs, const uint8_t* xh, const float* tscale, int t, int64_t k, int sm_count,
              float* partial, cudaStream_t s, int ranges = 0, int tokens = 0, int terms = 0, int pipe = -1,
              int stages = 0, int persist = -1, int* counters = nullptr, int sums = -1, int decode = 0,
              int stream = -1);
// The fp16 GEMM's weight decode (gemm_f16.cuh, DEC; the persistent kernel of one term, PIPE 0, 4
// stages, 64 or 128 tokens only): 3 or 4 steps per half2 (bit-identical), or 5 (the default;
// session 7, round 2: decode 3's values in 3 instructions per register, the scale check after the
// decode, shared-window loads, unsigned ring counters; bit-identical), BONSAI_CUDA_GEMM_F16_DECODE
// (any other value is an error). Read once per process.
int gemm_f16_decode();

}  // namespace bonsai::cuda
