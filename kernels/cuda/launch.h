// Host-callable launchers of the CUDA kernels (kernels/cuda/*.cu). Every
// pointer is device memory unless named *_host; every launch goes to `s` and
// returns without waiting. Shapes and semantics follow kernels/backend.h; the
// comments here only add what is specific to the device layouts.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "bonsai/kv_type.h"

namespace bonsai::cuda {

// Weight element formats read in their file layout (small or non-ternary tensors).
enum class RawType : int { F32, F16, BF16, Q8_0, Q1_0, Q2_128, Q2_64 };

// ---- ternary matvec (tile_layout.h) ----------------------------------------------
struct TiledJob {
  const uint8_t* w = nullptr;  // tiled weight, tiled_bytes(n, k, groups)
  float* y = nullptr;          // [t][n]
  int n = 0;                   // rows
};
inline constexpr int kMaxJobs = 4;
struct TiledJobs {
  TiledJob job[kMaxJobs];
  int count = 0;
};

// x [t][k] (k % 128 == 0) -> xq [t][k/128][256 B], meta [t][k/128].
void quantize_act(const float* x, uint8_t* xq, float4* meta, int t, int64_t k, cudaStream_t s);
// y_j = x · W_jᵀ for every job (same k, same groups) from the quantized activation.
// One wave of persistent blocks: every warp streams an equal share of all (row group,
// k-block) units; a row group split between warps is summed in `partial` (slots per
// warp, added in a fixed order: deterministic) and `counters` (zero-initialised; the kernel
// leaves them zero). Both sized by matvec_tiled_scratch for the same jobs, t, k, SM count.
// A launch's plan hint: min_units the fewest units per warp (0: BONSAI_CUDA_MV_MIN's only),
// room the block slots left free out of the plan's SMs x blocks per SM (on top of
// BONSAI_CUDA_MV_RESERVE), for the CTAs of the kernel after it. The plan takes the largest
// per-warp share of these and the global one, so a hint only ever moves a launch onto fewer
// blocks (the decode step's launches, by the site after them: cuda_backend.cpp, Impl::mv_hint).
// Give matvec_tiled_scratch the launch's hint too (its slots depend on the plan).
struct MatvecPlanHint {
  int min_units = 0;
  int room = 0;
};
void matvec_tiled_scratch(const TiledJobs& jobs, int t, int64_t k, int sm_count, size_t* partial_floats,
                          size_t* counters, MatvecPlanHint hint = {});
// Which kernel runs matvec_tiled (kernels/cuda/matvec.cu, matvec_ws.cu): legacy (weights
// staged in registers; any device), bulk (Hopper: each warp streams its weights through a
// ring of bulk copies in shared memory), ws (Hopper: warp-specialized, producer warps fill
// the 8 consumer warps' rings; where its shared memory does not fit, the launch runs bulk).
// Same plan and summation order: all three give the same floats. BONSAI_CUDA_MV=ws|bulk|legacy picks one
// (any other value, or bulk / ws on a device without sm_90 code, is an error); the default
// is the fastest available (matvec_select.cpp). Read once per process.
enum class MatvecKernel { legacy, bulk, ws };
MatvecKernel matvec_kernel();
bool matvec_kernel_available(MatvecKernel kernel);
// Variant of the ws kernel's protocol, BONSAI_CUDA_MV_WS (0..31, a bit mask, default 8; any
// other value is an error; all variants bit-identical; matvec_ws.cu): 1 consumers release a
// slot after its math, 2 the producer's lanes wait together, 4 the activation staged in shared
// memory, 8 two producer warps (else one), 16 no activation prefetch. Read once per process.
int matvec_ws_variant();
// The ws kernel's consumer loop, BONSAI_CUDA_MV_LOOP (0 or 1, default 1; any other value is an
// error; both bit-identical; matvec_ws.cu, consume_v1): 1 the loop with the shorter decode and
// ring bookkeeping (default protocol only: variants with bit 1, 4 or 16 run loop 0), 0 the loop
// of sessions 5 and 6. Read once per process.
int matvec_ws_loop();
// How the bulk and ws kernels sum a row group split between warps (kernels/cuda/
// matvec_common.cuh, finish_pair; all give the same floats): last, the last warp to arrive
// adds every warp's slot; first, the group's first warp waits for the others' slots (they
// publish with a release, without waiting) and adds them to its own sums; slots, the same
// without flags: the others only store their slot words into a scratch of empty words
// (0xFFFFFFFF), the first warp polls the words themselves and empties them again. first and
// slots only where every block of the launch is resident at once (one wave, t <= 4);
// elsewhere, and in the legacy kernel, last. BONSAI_CUDA_MV_FIXUP=first|last|slots (any other
// value is an error); read once per process.
// defer (never chosen by BONSAI_CUDA_MV_FIXUP; matvec_tiled with a SplitSums, bulk and ws
// kernels): no fix-up at all, the consumer adds the slots (SplitSums).
enum class MatvecFixup { last, first, slots, defer };
MatvecFixup matvec_fixup();
// A matvec output y [t][n] left unsummed (MatvecFixup::defer): every warp stored its share of
// a row group split between warps into slot `rank` of `partial` and went on (no counter, no
// wait), and the groups one warp covered whole were written to y directly. Element (token,
// row) of global row group gpair = pair0 + row / 64 is, with p_lo = gpair·kblocks, the ranks
// first = p_lo / per_warp .. last = (p_lo + kblocks - 1) / per_warp (nr = last - first + 1):
// nr == 1: y itself; else slots 0..nr-1 added in rank order starting from 0.0f (the same floats
// as finish_pair's fix-ups), slot r at partial[((token / 4)·pairs + gpair)·slots + r] of
// [4 tokens][64 rows] floats (kernels/cuda/split_sums.cuh). Valid until the next matvec writes
// `partial` (only after its griddepcontrol.wait, i.e. after the consumer has completed).
struct SplitSums {
  const float* partial = nullptr;
  float* y = nullptr;  // [t][n]: where the sums belong
  int t = 0, n = 0;
  int per_warp = 0, kblocks = 0, pairs = 0, slots = 0, pair0 = 0;  // the launch's plan (StreamPlan)
};
// A SplitSums that reads a plain y [t][n] (every row group whole: one rank each), so that a
// consumer of SplitSums takes an ordinary input too.
inline SplitSums split_whole(const float* y, int t, int n) {
  SplitSums s;
  s.y = const_cast<float*>(y);  // written only where a group is split: never here
  s.t = t;
  s.n = n;
  s.per_warp = s.kblocks = 1;
  return s;
}
// evict_first: the Hopper paths' weight copies carry an L2 evict-first policy (each weight
// byte is read once per launch), as the register-staged path's __ldcs loads do; the results
// do not depend on it. kernel, fixup: matvec_kernel(), matvec_fixup() unless a test compares
// them. slots: the slots fix-up's scratch, partial_floats words (matvec_tiled_scratch) that
// are all 0xFFFFFFFF before the launch (a byte memset of 0xFF) and that the launch leaves so;
// never share it with anything else (partial may be shared: its contents do not matter).
// Without it (nullptr) fixup slots runs first. ws_loop: the ws kernel's consumer loop
// (matvec_ws_loop unless a test compares them). Returns the fix-up the launch uses.
// fixup defer needs `split` (else first runs), split[j] for each job j; where it is used (the
// returned fix-up), split[j] describes job j's unsummed y: add it with matvec_split_sum or a
// consumer that reads SplitSums (residual_norm_site_split, fwht_site_split) before anything
// else reads y.
MatvecFixup matvec_tiled(const TiledJobs& jobs, int groups, const uint8_t* xq, const float4* meta, int t,
                         int64_t k, int sm_count, float* partial, int* counters, cudaStream_t s,
                         bool evict_first = false, MatvecKernel kernel = matvec_kernel(),
                         MatvecFixup fixup = matvec_fixup(), float* slots = nullptr,
                         SplitSums* split = nullptr, int ws_loop = matvec_ws_loop(),
                         MatvecPlanHint hint = {});
// y of a deferred matvec: the split groups' slots added into y (kernels/cuda/split_sums.cu).
void matvec_split_sum(const SplitSums& y, cudaStream_t s);
// Device check of the flag-free fix-up's sentinel (tests): for i < n, out[3i..3i+2] = the
// sm_90 FADD, FMUL and FFMA (round to nearest, no flush) of a[i], b[i] (and c[i]).
void fp_ops_probe(const float* a, const float* b, const float* c, float* out, int n, cudaStream_t s);
// Ring slots per consumer warp the ws kernel uses for t tokens at k columns (tests; 0: such a
// launch runs the bulk kernel instead).
int matvec_ws_ring(int groups, int t, int64_t k);
// Raw 2-bit rows [rows][row_bytes] (PQ2_0 / Q2_0 layout; groups 1 = 128-blocks, 2 = 64-blocks) ->
// tiles of `dst` (rows padded to a multiple of 32). `rows` counts from a multiple of 32.
void repack_tiled(const uint8_t* src, size_t row_bytes, int64_t rows, int64_t k, int groups, uint8_t* dst,
                  cudaStream_t s);
// y_j [t][n_j] = x [t][k] · W_jᵀ for raw weights of one type and row size, in one launch.
struct RawJob {
  const uint8_t* w = nullptr;
  float* y = nullptr;
  int n = 0;
};
struct RawJobs {
  RawJob job[kMaxJobs];
  int count = 0;
};
void matvec_raw(RawType type, const RawJobs& jobs, size_t row_bytes, int64_t k, const float* x, int t,
                cudaStream_t s);

// ---- embedding: tokens are device memory ----------------------------------------------
void embed_raw(RawType type, const uint8_t* table, size_t row_bytes, int64_t k, const int32_t* tokens, int t,
               float* out, cudaStream_t s);
void embed_tiled(const uint8_t* table, int64_t k, int groups, const int32_t* tokens, int t, float* out,
                 cudaStream_t s);

// ---- norms and the Hadamard site ---------------------------------------------------------
void rmsnorm(const float* x, const float* gain, float* y, int64_t rows, int64_t n, float eps, cudaStream_t s);
void gated_rmsnorm(const float* o, const float* z, const float* w, float* y, int64_t rows, int64_t d,
                   float eps, cudaStream_t s);
// Blockwise FWHT (block <= 8192). When xq is given (k % 128 == 0, block % 128 == 0) the
// output is also quantized for matvec_tiled, saving the separate quantize launch. When bamax is
// given (128 <= block <= 4096), bamax [rows][k / block] = max |y| of each Hadamard block
// (cuda::site_f16_two_pass).
void hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k, int64_t block,
              bool inverse, uint8_t* xq, float4* meta, cudaStream_t s, float* bamax = nullptr);

// residual_norm_site with delta the unsummed output of a deferred matvec (delta.t == rows,
// delta.n == n): the same floats, and delta.y written too. A cluster of the row's n / block
// blocks (n / block <= 8, compute capability 9.x) shares the summed x + delta through
// distributed shared memory. Returns false (launching nothing) where that does not apply (also
// blocks whose threads the kernel's registers do not allow: block > 1024 at sm_90a).
// `form` (norm_fwht.cu, residual_norm_split_kernel): how the cluster exchanges the x·x terms, all
// four the same floats: 0 the session-6 kernel, 1 lean, 2 lean with st.async pushes, 3 (default) 2's
// code with its registers capped at 128 so that its blocks fit beside a ws matvec block.
int residual_split_form();  // BONSAI_CUDA_RES_SPLIT=0|1|2|3, read once; another value is an error
bool residual_norm_site_split(const float* x, const SplitSums& delta, float* x_out, const float* gain,
                              const float* signs, int64_t block, float* normed, float* rotated, int64_t rows,
                              int64_t n, float eps, uint8_t* xq, float4* meta, cudaStream_t s,
                              int form = residual_split_form());

// The forward, quantizing SwiGLU site (up.y != nullptr: swiglu_hadamard) or FWHT site (up.y ==
// nullptr: hadamard) with x and up read through SplitSums: the unsummed outputs of a deferred
// matvec (for the SwiGLU site gate and up, two jobs of one launch; their slot loads together),
// or plain inputs (split_whole); the same floats, and the split groups' sums written to x.y /
// up.y too. act may be null. ctas (1, 2, 4 or 8) thread blocks per Hadamard block: more than
// one runs as a thread-block cluster that joins the FWHT's last stages through distributed
// shared memory (kernels/cuda/norm_fwht.cu, fwht_split_kernel). Returns false (launching
// nothing) unless compute capability 9.x, block <= 4096, block / ctas a multiple of 128 and the
// kernel's registers allow block / (4·ctas) threads; x.t == up.t == rows, x.n == up.n == k.
bool fwht_site_split(const SplitSums& x, const SplitSums& up, float* act, const float* signs, float* y,
                     int64_t rows, int64_t k, int64_t block, int ctas, uint8_t* xq, float4* meta,
                     cudaStream_t s);
// fwht_site_split's SwiGLU site with less after the dependency wait (kernels/cuda/swiglu_site.cu;
// BONSAI_CUDA_SWI_SITE): the same floats; the split sums are written back to x.y / up.y only with
// `writeback`. ctas 1, 2 or 4 thread blocks per Hadamard block (more: a cluster exchanging the
// FWHT's last stages with st.async pushes); low_regs: the kernel's registers capped at 64 per
// thread (BONSAI_CUDA_SWI_REGS). Returns false (launching nothing) unless compute capability 9.x,
// block <= 4096 with block / ctas 128, 256, 512 or 1024, xq, meta and up.y given, x.t == up.t ==
// rows, x.n == up.n == k; or if the cluster launch is refused.
bool swiglu_site_lean(const SplitSums& x, const SplitSums& up, float* act, const float* signs, float* y,
                      int64_t rows, int64_t k, int64_t block, uint8_t* xq, float4* meta, bool writeback,
                      cudaStream_t s, int ctas = 1, bool low_regs = false);
// hadamard() of act = silu(x) ⊙ up (also written to act): the SwiGLU site.
void swiglu_hadamard(const float* x, const float* up, float* act, const float* signs, float* y, int64_t rows,
                     int64_t k, int64_t block, bool inverse, uint8_t* xq, float4* meta, cudaStream_t s,
                     float* bamax = nullptr);
// Backend::residual_norm_site with 128 <= block <= 4096 (a block of threads per Hadamard block)
// (x_out may alias x); rotated also quantized when xq is given, its block amaxes written to
// bamax [rows][n / block] when that is given (as hadamard()).
void residual_norm_site(const float* x, const float* delta, float* x_out, const float* gain,
                        const float* signs, int64_t block, float* normed, float* rotated, int64_t rows,
                        int64_t n, float eps, uint8_t* xq, float4* meta, cudaStream_t s,
                        float* bamax = nullptr);

// ---- elementwise / layout ------------------------------------------------------------------
void add(const float* a, const float* b, float* y, int64_t n, cudaStream_t s);
void swiglu(const float* gate, const float* up, float* y, int64_t n, cudaStream_t s);
void sigmoid_mul(const float* x, const float* gate, float* y, int64_t n, cudaStream_t s);
void transpose_heads(const float* x, float* y, int64_t rows, int a, int b, int64_t d, cudaStream_t s);
void take_part(const float* x, float* y, int64_t rows, int parts, int part, int64_t d, cudaStream_t s);

// ---- position-dependent ops: pos0 comes from *pos_dev when it is not null -----------------------
// (a recorded decode step reads it from device memory so that one recording serves every position)
void rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0, const int* pos_dev,
          cudaStream_t s);
// cache: elements of type kv (F16: rounded to nearest even).
void store_rows(void* cache, const float* src, int64_t width, int t, int pos0, const int* pos_dev, KvType kv,
                cudaStream_t s);
// Split-K attention over a cache of type kv (F16 elements widened to f32 where they are read): `splits`
// partial softmaxes per (token, head) in `part`
// ([t][n_head][splits][head_dim + 2]), then merged into out, times
// sigmoid(gate[(token·n_head + head)·gate_stride + dim]) when gate is given.
// splits <= kAttentionMaxSplits (below).
// head_dim % 32 == 0, <= 256; n_head / n_head_kv <= 8. batch: the split kernel that scores 4 of a
// warp's positions together where it applies (group 6, a ring on: attention_decode_batch), else
// the ring kernel (not bit-identical to each other).
void attention(const float* q, const void* k_cache, const void* v_cache, KvType kv, float* out, float* part,
               int t, int pos0, const int* pos_dev, int splits, bool batch, int n_head, int n_head_kv,
               int head_dim, float scale, const float* gate, int64_t gate_stride, cudaStream_t s);
// The merge alone: out [t][n_head][head_dim] from `part` as above (times the gate when given).
void attention_merge(const float* part, float* out, int t, int n_head, int splits, int head_dim,
                     const float* gate, int64_t gate_stride, cudaStream_t s);
// attention() without its merge: the split launch alone (then attention_merge or
// attention_merge_fwht).
void attention_splits(const float* q, const void* k_cache, const void* v_cache, KvType kv, float* part, int t,
                      int pos0, const int* pos_dev, int splits, bool batch, int n_head, int n_head_kv,
                      int head_dim, float scale, cudaStream_t s);
// attention_merge of 32 splits followed by hadamard(out, signs, y, t, n_head·head_dim, block,
// forward, xq, meta) in one launch (kernels/cuda/attention.cu, attention_merge_fwht_kernel;
// BONSAI_CUDA_ATTN_FWHT=1): block = C·head_dim query heads' outputs per Hadamard block, C = 1,
// 2, 4 or 8 thread blocks (one per head) in a thread-block cluster that runs the FWHT's stages
// across heads through distributed shared memory. out and y, xq, meta: the same floats and bytes
// as the two launches. Returns false (launching nothing) unless compute capability 9.x, splits
// == 32, head_dim 128 or 256, block == C·head_dim for such a C, n_head % C == 0, xq and meta
// given.
bool attention_merge_fwht(const float* part, float* out, int t, int n_head, int splits, int head_dim,
                          const float* gate, int64_t gate_stride, const float* signs, float* y, int64_t block,
                          uint8_t* xq, float4* meta, cudaStream_t s);
// The split count of a single-token (decode) step whose cache holds n_kv positions, this one's
// included: kAttentionDecodeMinSplits below 2 x kAttentionDecodeMinSplits x per positions
// (BONSAI_CUDA_ATTN_DEC_PER, default 64), then `wave` (attention_split_wave: the splits of one full
// wave of the device; 99 on the H200 with the 27B's 4 KV heads) when that is more than
// kAttentionDecodeMinSplits, capped at kAttentionMaxSplits. BONSAI_CUDA_ATTN_DEC_RULE=double (or a
// wave of at most kAttentionDecodeMinSplits, or 0 from a failed query) keeps session 14's rule
// instead: the count doubled while each split keeps `per` positions, up to BONSAI_CUDA_ATTN_DEC_MAX
// (default 256 = kAttentionMaxSplits, 32 = always kAttentionDecodeMinSplits as before session 14).
// A recorded step keeps the count it was recorded with, so CudaBackend records again when a step's
// count differs (replay_step). Why more splits at long contexts: each split is one block of 4 warps
// walking its positions, so 32 splits x the KV heads (128 blocks on the 27B, one per SM) cannot keep
// enough cache reads in flight; why one wave: a second, partial wave of blocks runs while most SMs
// idle (docs/performance.md, "Decode and prefill at context depth", session 16).
inline constexpr int kAttentionDecodeMinSplits = 32, kAttentionMaxSplits = 256;
int attention_decode_splits(int n_kv, int wave);
// Whether a single-token step over n_kv positions takes the split kernel that scores 4 positions
// together (`batch` of attention()): BONSAI_CUDA_ATTN_SCORE=4 (the default) and n_kv >=
// BONSAI_CUDA_ATTN_SCORE_MIN (default 16384; below it the ring kernel's shorter launch wins:
// docs/performance.md, session 16).
bool attention_decode_batch(int n_kv);
// A decode step over an f16 cache on the tensor cores (kernels/cuda/attention_dec_mma.cu): the
// split half of attention() for t = 1 (the same partials, merged by attention_merge or
// attention_merge_fwht), the group's query heads as the rows of mma.sync m16n8k16 with fp16 q, k,
// v and softmax weights, fp32 scores and sums. attention_decode_mma_shape: head_dim 128 or 256,
// at most 8 query heads per KV head. attention_decode_mma_wave: the kernel's occupancy x the SMs
// / n_head_kv (0 when the shape does not fit or the query fails: then the split kernels run).
bool attention_decode_mma_shape(int n_head, int n_head_kv, int head_dim);
int attention_decode_mma_wave(int n_head, int n_head_kv, int head_dim);
void attention_decode_mma(const float* q, const void* k_cache, const void* v_cache, float* part, int pos0,
                          const int* pos_dev, int splits, int n_head, int n_head_kv, int head_dim,
                          float scale, cudaStream_t s);
// Whether a decode step over n_kv positions takes attention_decode_mma: an f16 cache whose shape
// gives the kernel a wave (mma_wave > 0), BONSAI_CUDA_ATTN_DEC_MMA=1 (the default; 0 = the split
// kernels) and n_kv >= BONSAI_CUDA_ATTN_DEC_MMA_MIN (default 1024).
bool attention_decode_mma_on(int n_kv, int mma_wave);
// What a recorded decode step's attention was recorded with: the split count and the kernel
// (0 the ring kernel, 1 the batch kernel, 2 the tensor cores' decode kernel; replay_step records
// again when the context wants another). wave / mma_wave: attention_split_wave /
// attention_decode_mma_wave of the step's shape and cache type (mma_wave 0 for an f32 cache).
inline int attention_decode_plan(int n_kv, int wave, int mma_wave = 0) {
  if (attention_decode_mma_on(n_kv, mma_wave)) return attention_decode_splits(n_kv, mma_wave) * 4 + 2;
  return attention_decode_splits(n_kv, wave) * 4 + (attention_decode_batch(n_kv) ? 1 : 0);
}
// Blocks of the decode split kernel resident at once on the current device (its occupancy x the SMs),
// divided among n_head_kv KV heads; 0 when the query fails. The kernel: the batch one where
// BONSAI_CUDA_ATTN_SCORE=4 makes it the long contexts' kernel (on the H200 both fit 3 blocks per SM).
// attention_split.cu.
int attention_split_wave(int n_head, int n_head_kv, int head_dim, KvType kv = KvType::F32);

// Which attention kernel runs (BONSAI_CUDA_ATTN, attention_select.cpp; read once, other values are
// errors): 0, 1, 2 the fp32 split kernel's variants (attention_split.cu) for every batch; 3 (default) and 4
// prefill batches of at least kAttentionMmaMinTokens tokens on the tensor cores (attention_mma.cu) with
// KV tiles of 64 / 32 positions, the split kernel (2) for the rest. BONSAI_CUDA_ATTN_SPLITS=1..32
// forces the tensor-core kernel's split count (0: unset, the plan of attention_mma_splits).
int attention_mode();
// The split kernel's cp.async ring depth (BONSAI_CUDA_ATTN_RING=0|3|4|6, default 3; 0 = none).
int attention_ring();
// Positions the decode split kernel scores together per warp (BONSAI_CUDA_ATTN_SCORE=1|4, default 4:
// with the group 6 and a ring, attention_split_batch_kernel; not bit-identical to 1).
int attention_score_batch();
int attention_mma_forced_splits();
inline constexpr int kAttentionMmaMinTokens = 8;
// Whether attention_mma takes this batch: the mode, t, head_dim 128 or 256, <= 8 query heads per
// KV head, 16-byte aligned q and cache rows.
bool attention_mma_fits(const float* q, const void* k_cache, const void* v_cache, int t, int n_head,
                        int n_head_kv, int head_dim);
int attention_mma_splits(int t, int pos0, int n_head, int n_head_kv, int sm_count);
// Bytes of `scratch` for attention_mma: the partials (splits > 1) and an fp16 copy of the cache rows.
size_t attention_mma_scratch(int t, int pos0, int n_head, int n_head_kv, int head_dim, int splits);
// attention() for a prefill batch on the tensor cores (fp16 q, k, v and softmax weights; fp32
// scores, softmax and sums), then the merge when splits > 1. Not recordable (pos0 on the host).
// An F16 cache's rows are copied into the scratch as they are (the same halves the f32 path rounds to).
void attention_mma(const float* q, const void* k_cache, const void* v_cache, KvType kv, float* out,
                   void* scratch, int t, int pos0, int splits, int n_head, int n_head_kv, int head_dim,
                   float scale, const float* gate, int64_t gate_stride, cudaStream_t s);
// The attention site before attention(): q [t][n_head][d] = RoPE(rmsnorm(query)·q_norm) from
// qf [t][n_head][2][d]; k likewise from k [t][n_head_kv][d] (k_norm) into k_cache rows
// pos..pos+t-1; v copied into v_cache. head_dim % 32 == 0, <= 1024; n_rot <= head_dim.
// split (optional): qf, k and v are the unsummed outputs of one deferred matvec launch of three
// jobs (split[0..2].y == qf, k, v; SplitSums): the kernel adds their slots itself (the same
// floats as the matvec's fix-up) and writes the sums back to qf, k and v.
struct AttnPrep {
  const float *qf = nullptr, *k = nullptr, *v = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;
  float eps = 0.0f, base = 0.0f;
  int n_rot = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  float* q = nullptr;
  void *k_cache = nullptr, *v_cache = nullptr;  // elements of type kv
  KvType kv = KvType::F32;
};
// split (optional): qf, k and v unsummed (the deferred q/k/v launch's three jobs); weak: their
// slots read with plain loads, else ld.global.cg (split_sums.cuh, sum_slots).
void attention_prep(const AttnPrep& p, int t, int pos0, const int* pos_dev, cudaStream_t s,
                    const SplitSums* split = nullptr, bool weak = true);

// ---- gated delta net ------------------------------------------------------------------------
void ssm_conv(const float* x, float* state, const float* w, float* out, int t, int64_t channels, int taps,
              cudaStream_t s);
void gdn_gates(const float* alpha, const float* beta_in, const float* ssm_a, const float* dt_bias, float* g,
               float* beta, int t, int n_v, cudaStream_t s);
// d_k and d_v multiples of 32, d_k <= 1024.
void gdn_recurrence(const float* conv, const float* g, const float* beta, float* state, float* out, int t,
                    int n_k, int n_v, int d_k, int d_v, float eps, cudaStream_t s);

// gdn_recurrence with, optionally, the gates computed in place (alpha != nullptr:
// gdn_gates of alpha/beta_in, instead of reading g/beta), the gated RMSNorm of each
// head's output (norm_w != nullptr: out = gated_rmsnorm(o, z)), and the tiled -> grouped
// head order of the normed output (transpose). d_k, d_v multiples of 32,
// (d_k/32)·d_v <= 512 threads.
struct GdnFused {
  const float* conv = nullptr;                // [t][2·n_k·d_k + n_v·d_v]
  const float *g = nullptr, *beta = nullptr;  // when alpha == nullptr
  const float *alpha = nullptr, *beta_in = nullptr, *ssm_a = nullptr, *dt_bias = nullptr;
  float* state = nullptr;                       // [n_v][d_k][d_v]
  const float *z = nullptr, *norm_w = nullptr;  // gated norm
  float* out = nullptr;                         // [t][n_v][d_v]
  int t = 0, n_k = 0, n_v = 0, d_k = 0, d_v = 0;
  float eps = 0.0f, norm_eps = 0.0f;
  bool transpose = false;
  // gdn_fused may load state and conv_state before its grid-dependency wait: no kernel still
  // running when it starts writes them (a recorded decode step, each layer's site once per
  // step, replayed only after the previous replay has finished).
  bool state_early = false;
  // gdn_fused reads and writes `state` with streaming (evict-first) cache hints: a layer's
  // state is next read one step later, after every other layer's, so it cannot stay in L2.
  bool state_stream = false;
  // The rest of the GDN site, optional. qkv != nullptr: conv is not read; the block computes
  // ssm_conv of its q/k/v channels from qkv [t][channels], conv_w (F32 [channels][taps]) and
  // conv_state ([taps-1][channels], updated; taps <= 4). The q/k channels of a key head are
  // read by its n_v/n_k value-head blocks: the last of them to count itself in `conv_counters`
  // ([n_k] ints, zero, left zero) writes their new state. alpha_w != nullptr: alpha and
  // beta_in are computed as normed [t][ab_k] · row h of alpha_w / beta_w (file layout, ab_type
  // F32, F16 or BF16), then the gates in place (ssm_a, dt_bias).
  const float* qkv = nullptr;
  const float* conv_w = nullptr;
  float* conv_state = nullptr;
  int* conv_counters = nullptr;
  int taps = 0;
  const uint8_t *alpha_w = nullptr, *beta_w = nullptr;
  const float* normed = nullptr;
  RawType ab_type = RawType::F32;
  size_t ab_row_bytes = 0;
  int ab_k = 0;
  // gdn_walk kernel 6's per-(value head, chunk) products (gdn_walk_scratch_bytes; device memory the
  // caller owns, used only during the launch)
  float* scratch = nullptr;
};
void gdn_fused(const GdnFused& p, cudaStream_t s);
// Prefill form of the GDN site, for many tokens: gdn_ab_batch computes alpha / beta_in
// [t][n_v] from x [t][k] and the raw (F32/F16/BF16) ssm_alpha / ssm_beta rows; gdn_conv_norm
// writes conv [t][2·n_k·d_k + n_v·d_v] = silu(ssm_conv(qkv)) with q (times 1/√d_k) and k
// L2-normalised, reading but not updating conv_state (taps <= 8); gdn_walk runs the
// recurrence over them (p.conv; gates from p.alpha/beta_in or p.g/beta), writes the raw
// outputs to p.out [t][n_v][d_v] (no norm, tiled head order) and, when p.qkv is given, the
// new conv_state (t >= taps-1). Same shape limits as gdn_fused.
void gdn_ab_batch(const float* x, const uint8_t* wa, const uint8_t* wb, size_t row_bytes, RawType type, int k,
                  int n_v, int t, float* alpha, float* beta_in, cudaStream_t s);
void gdn_conv_norm(const float* qkv, const float* conv_state, const float* conv_w, float* conv, int t,
                   int taps, int n_k, int n_v, int d_k, int d_v, float eps, cudaStream_t s);
void gdn_walk(const GdnFused& p, cudaStream_t s);
// kernel: 0 one token at a time, 1 chunks of tokens staged in shared memory (one column per
// thread), 2 the same with two columns per thread; all the same arithmetic, bit-identical
// (kernels/cuda/gdn_walk.cu). 6: gdn_walk_tc2 (equal up to summation order and the split TF32
// products' rounding; 1 where unsupported). The two-argument form: BONSAI_CUDA_WALK, default 6 from
// kTc2MinTokens tokens (with p.scratch), else kWalkDefault (gdn_walk.cu).
void gdn_walk(const GdnFused& p, cudaStream_t s, int kernel);
// gdn_walk kernel 6: the chunked form with 3xTF32 mma.sync products in a kernel parallel over
// (value head, chunk) and the serial one with the state products (kernels/cuda/gdn_tc2.cu); d_k in
// {32, 64, 128}, d_v % 32 == 0, 16-byte aligned conv; needs p.scratch with
// gdn_walk_tc2_scratch_floats(p) floats (1 where unsupported or without it).
bool gdn_walk_tc2_supported(const GdnFused& p);
size_t gdn_walk_tc2_scratch_floats(const GdnFused& p);
void gdn_walk_tc2(const GdnFused& p, cudaStream_t s);
// The scratch bytes gdn_walk(p, s) needs in p.scratch with the kernel it picks for p (0: none).
size_t gdn_walk_scratch_bytes(const GdnFused& p);

// ---- the head's candidates ---------------------------------------------------------------
// Backend::top_k on the device: the k best of x [n] (1 <= k <= min(n, kMaxTopK)) into out,
// ids [k] (int32) then values [k] (f32 bits); scratch holds top_k_scratch_words(n, k) words.
size_t top_k_scratch_words(int64_t n, int k);
void top_k(const float* x, int64_t n, int k, uint32_t* scratch, uint32_t* out, cudaStream_t s);

// Bytes per second of a device-to-device copy (read + write counted), for benchmarks.
double measure_copy_bandwidth(size_t bytes, int reps, cudaStream_t s);
// Seconds per launch of a pure read of `bytes` (the yardstick of the matvec benchmark): `copies`
// buffers of that size (enough to defeat the L2), one streaming-read kernel of `blocks` blocks of 512
// threads each, launched like the decode matvecs (programmatic serialization, the reads before the
// dependency wait, one word per block written after it) and recorded as one graph, replayed `reps`
// times. 0 when a buffer cannot be allocated.
double measure_read_chain(size_t bytes, int copies, int reps, int blocks, cudaStream_t s);

}  // namespace bonsai::cuda
