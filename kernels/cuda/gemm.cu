// The prefill GEMM on the int8 tensor cores (mma.sync m16n8k32, u8 codes x s8 activation
// halves), layouts of kernels/cuda/tile_layout.h.
//
// A block computes 128 weight rows (8 tiles) x 64 tokens; its 8 warps are 4 along the
// rows x 2 along the tokens, a warp owns 32 rows x 32 tokens (2 x 4 mma tiles): it unpacks
// its two tiles' codes once per k-block and keeps them in registers for all four token
// tiles, so the 2-bit unpack costs half as much per MMA as with 64 rows x 16 tokens. Each
// 128-column k-block is one pipeline stage, staged in shared memory with cp.async
// (kStages deep): the 8 weight chunks exactly as stored (codes + scales), the 64 tokens'
// 256 quantized bytes and their float4 meta. The activation rows are laid out one of two
// ways (XS, BONSAI_CUDA_GEMM_STAGE): 0, rows padded by 16 bytes so that the B-fragment loads
// of 8 tokens hit distinct banks; 1, rows of 256 bytes with the two 16-byte halves of every
// 32-byte piece swapped in odd tokens (the same banks property, below). Rows past the
// weight's stored tiles and tokens past t are zero-filled (scale 0: they add nothing). By
// default (MB) each stage is handed over by mbarriers (its copies landed / all warps done
// with it), not by a block barrier per k-block.
//
// Numerics are the matvec's (tile_layout.h): per k-block (or 64-column half when
// groups == 2) the integer dot products Σc·hi and Σc·lo are exact; both chains start from
// the accumulator value 0x4B400000 (the bits of 1.5·2^23), so that the int32 result
// M + Σ is the float M + Σ (|Σ| <= 3·128·128 < 2^22): two FADDs instead of two
// quarter-rate I2F. T = 256·Σc·hi + Σc·lo − Σq is then formed by one FMA, exactly
// (|T| <= 2·128·32639 < 2^24), and added as T·(d·s) like the matvec does.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_common.cuh"  // block shape, stage layout, GemmPlan, cp.async / mbarrier / mma helpers
#include "kernels/cuda/knobs.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {
namespace {

// OCC: blocks per SM the registers are capped for (1: no spills; 2: twice the warps).
// MB = 1: the stages are handed over by mbarriers instead of a block barrier per k-block: a
// stage's "full" barrier completes when all 256 threads' copies have landed; a warp done with
// a k-block arrives on its slot's "empty" barrier; each thread refills a slot two k-blocks
// ahead once all 8 warps have left it (by then the slowest warp is usually done), so warps
// wait only for data, not for each other.
// XS: the activation's shared-memory layout (kActPitch above).
template <int G, int OCC, int MB, int XS>
__global__ void __launch_bounds__(kThreads, OCC)
    gemm_tiled_kernel(TiledJobs jobs, GemmPlan plan, const uint8_t* __restrict__ xq,
                      const float4* __restrict__ meta, int t, int kblocks) {
  using S = GemmSmem<G, XS>;
  constexpr int kPitch = kActPitch<XS>;
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_trigger();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int wm = warp & 3, wn = warp >> 2;
  const bool active = static_cast<int>(blockIdx.x) * kGemmTokens + wn * 32 < t;
  const int tok0 = blockIdx.x * kGemmTokens;
  const int rb = blockIdx.y;
  // The job of this row block; fields picked with constant indices (no local copy of `jobs`).
  TiledJob job = jobs.job[0];
  int tiles = plan.tiles[0], bstart = 0;
  int64_t out0 = 0;
#pragma unroll
  for (int i = 1; i < kMaxJobs; ++i)
    if (i < jobs.count && rb >= plan.block_start[i]) {
      job = jobs.job[i];
      tiles = plan.tiles[i];
      bstart = plan.block_start[i];
      out0 = plan.out_start[i];
    }
  const int kb0 = blockIdx.z * plan.kb_per_split, kb1 = min(kblocks, kb0 + plan.kb_per_split);
  const int tile0 = (rb - bstart) * kBlockTiles;
  const size_t tile_stride = static_cast<size_t>(kblocks) * S::kCB;
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  // Straight-line staging: every thread issues a fixed set of copies per stage, whose
  // sources at k-block 0 are computed here once, so a stage only adds kb times a constant
  // stride. Smem destinations: the 8 chunks are contiguous, so weight piece p lands at
  // p·16; token tk's 16 pieces at kW + tk·kPitch (XS = 1: piece u of an odd token at u ^ 1,
  // tk + 16·j has tk's parity). Zero-filled copies (tiles past the
  // stored ones, tokens past t) read from tile 0 / token 0 instead, which stays in bounds.
  constexpr int kWp = S::kW / 16;  // weight pieces: 272 (G = 1), 288 (G = 2)
  constexpr int kChunkPieces = S::kCB / 16;
  static_assert(kWp >= kThreads && kWp <= 2 * kThreads && kGemmTokens * 16 == 4 * kThreads);
  // Per thread: one 64-bit base per operand and 32-bit offsets within this block's 8 tiles
  // or 64 tokens (few registers: the kernel is at its register cap).
  const uint8_t* wbase = job.w + static_cast<size_t>(tile0) * tile_stride;  // tile0 < tiles
  uint32_t woff[2];
  int wok = 0;  // bit c: weight copy c is a real one
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int p = tid + c * kThreads, ti = p / kChunkPieces, piece = p - ti * kChunkPieces;
    const bool ok = p < kWp && tile0 + ti < tiles;
    woff[c] = (ok ? static_cast<uint32_t>(ti) * static_cast<uint32_t>(tile_stride) : 0u) + piece * 16;
    wok |= ok << c;
  }
  const int xtk = tid >> 4, xpiece = tid & 15;  // copy j: token xtk + 16·j, piece xpiece
  // Offsets from xq and meta in 32 bits: gemm_tiled launches token ranges whose activation
  // stays under 4 GiB.
  const uint32_t xrow = static_cast<uint32_t>(kblocks) * kActBytes;
  const uint32_t xoff = static_cast<uint32_t>(tok0 + xtk) * xrow + xpiece * 16;
  const int xn = min(4, max(0, (t - tok0 - xtk + 15) >> 4));  // copies j < xn are real
  const bool mok = tid < kGemmTokens && tok0 + tid < t;
  const uint32_t moff = mok ? static_cast<uint32_t>(tok0 + tid) * kblocks : 0u;

  auto load_stage = [&](int kb, int slot) {
    const uint32_t st = sbase + slot * S::kStage;
    const uint32_t wk = kb * S::kCB;
    cp_async16(st + tid * 16, wbase + (woff[0] + wk), (wok & 1) ? 16 : 0);
    if (tid < kWp - kThreads)
      cp_async16(st + (tid + kThreads) * 16, wbase + (woff[1] + wk), (wok & 2) ? 16 : 0);
    const uint32_t xdst = st + S::kW + xtk * kPitch + (xpiece ^ (XS ? xtk & 1 : 0)) * 16, xk = kb * kActBytes;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool ok = j < xn;  // else token 0's row, in bounds
      cp_async16(xdst + j * 16 * kPitch, xq + ((ok ? xoff + j * 16 * xrow : xpiece * 16u) + xk), ok ? 16 : 0);
    }
    if (tid < kGemmTokens) cp_async16(st + S::kW + S::kX + tid * 16, meta + (moff + kb), mok ? 16 : 0);
  };

  // MB: full[slot] at kBytes + 8·slot, empty[slot] at kBytes + 32 + 8·slot.
  const uint32_t full0 = sbase + S::kBytes, empty0 = full0 + 8 * kStages;
  if constexpr (MB == 1) {
    if (tid < kStages) {
      mbar_init(full0 + 8 * tid, kThreads);
      mbar_init(empty0 + 8 * tid, kThreads / 32);
    }
    __syncthreads();
  }

  pdl_wait();  // the activation is the previous kernel's output
#pragma unroll
  for (int s = 0; s < kStages - 1 - MB; ++s) {
    if (kb0 + s < kb1) load_stage(kb0 + s, s);
    if constexpr (MB == 1)
      mbar_arrive_cp_async(full0 + 8 * s);
    else
      cp_commit();
  }

  float acc[2][4][4];  // [m tile][n tile][c0..c3]: rows g, g+8 x tokens 2·tig, 2·tig+1
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int jn = 0; jn < 4; ++jn)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][jn][e] = 0.0f;
  const int magic[4] = {kMagicBits, kMagicBits, kMagicBits, kMagicBits};

  for (int kb = kb0; kb < kb1; ++kb) {
    const int it = kb - kb0, slot = it % kStages;
    if constexpr (MB == 1) {
      // Refill the slot of k-block kb - 2 with kb + 2 once every warp has left it, then wait
      // for k-block kb's copies.
      if (kb + kStages - 2 < kb1) {
        const int rs = (it + kStages - 2) % kStages;
        if (it >= 2) mbar_wait(empty0 + 8 * rs, ((it - 2) / kStages) & 1);
        load_stage(kb + kStages - 2, rs);
        mbar_arrive_cp_async(full0 + 8 * rs);
      }
      mbar_wait(full0 + 8 * slot, (it / kStages) & 1);
    } else {
      cp_wait<kStages - 2>();
      __syncthreads();  // stage kb is visible to all; the slot refilled below was consumed by everyone
      if (kb + kStages - 1 < kb1) load_stage(kb + kStages - 1, (kb - kb0 + kStages - 1) % kStages);
      cp_commit();
    }
    const uint8_t* st = smem + slot * S::kStage;
    if (!active) {  // all 32 of this warp's tokens are past t
      if constexpr (MB == 1)
        if (lane == 0) mbar_arrive(empty0 + 8 * slot);
      continue;
    }

    // A fragments of both tiles, all four k-steps, unpacked once (register j in bit pair j
    // of the step's word), and the tiles' row scales {d(row g), d(row g + 8)} per group.
    uint32_t a[2][4][4];
    float2 dd[2][G];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint8_t* ch = st + (wm * 2 + i) * S::kCB;
      const uint4 w4 = *reinterpret_cast<const uint4*>(ch + lane * 16);
      const uint32_t wd[4] = {w4.x, w4.y, w4.z, w4.w};
      constexpr uint32_t mask = 0x03030303u;
#pragma unroll
      for (int step = 0; step < 4; ++step) {
        a[i][step][0] = wd[step] & mask;
        a[i][step][1] = (wd[step] >> 2) & mask;
        a[i][step][2] = (wd[step] >> 4) & mask;
        a[i][step][3] = (wd[step] >> 6) & mask;
      }
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const uint32_t sw = *reinterpret_cast<const uint32_t*>(ch + kCodeBytes + h * 32 + g * 4);
        dd[i][h] = __half22float2(*reinterpret_cast<const __half2*>(&sw));  // rows g, g + 8
      }
    }

#pragma unroll
    for (int jn = 0; jn < 4; ++jn) {
      // B fragments: token column g of n tile jn, hi and lo words of all four k-steps: bytes
      // [32·tig, 32·tig + 32) of the hi and lo halves, the 16-byte halves at o0 and o1
      // (swapped for odd tokens when XS = 1; tk is even, so token tk + g has g's parity).
      const int tk = wn * 32 + jn * 8;
      const int o0 = tig * 32 + (XS ? (g & 1) * 16 : 0), o1 = tig * 32 + (XS ? (~g & 1) * 16 : 16);
      const uint8_t* xr = st + S::kW + (tk + g) * kPitch;
      const uint4 h0 = *reinterpret_cast<const uint4*>(xr + o0),
                  h1 = *reinterpret_cast<const uint4*>(xr + o1);
      const uint4 l0 = *reinterpret_cast<const uint4*>(xr + 128 + o0),
                  l1 = *reinterpret_cast<const uint4*>(xr + 128 + o1);
      const uint32_t bh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
      const uint32_t bl[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
      float sc[2], mq[2][G];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float4 m = *reinterpret_cast<const float4*>(st + S::kW + S::kX + (tk + 2 * tig + c) * 16);
        sc[c] = m.x;
        const int q0 = __float_as_int(m.z), q1 = __float_as_int(m.w);
        if constexpr (G == 1) {
          mq[c][0] = kMagic + static_cast<float>(q0 + q1);  // exact: |Σq| < 2^22
        } else {
          mq[c][0] = kMagic + static_cast<float>(q0);
          mq[c][G - 1] = kMagic + static_cast<float>(q1);
        }
      }
#pragma unroll
      for (int h = 0; h < G; ++h) {
        constexpr int kSteps = 4 / G;
        int hi[2][4], lo[2][4];  // [m tile]: four independent chains
#pragma unroll
        for (int q = 0; q < kSteps; ++q) {
          const int step = h * kSteps + q;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            if (q == 0) {
              mma_u8s8(hi[i], magic, a[i][step], bh[2 * step], bh[2 * step + 1]);
              mma_u8s8(lo[i], magic, a[i][step], bl[2 * step], bl[2 * step + 1]);
            } else {
              mma_u8s8(hi[i], hi[i], a[i][step], bh[2 * step], bh[2 * step + 1]);
              mma_u8s8(lo[i], lo[i], a[i][step], bl[2 * step], bl[2 * step + 1]);
            }
          }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = e & 1;
            const float T = flush_value(hi[i][e], lo[i][e], mq[c][h]);
            acc[i][jn][e] = fmaf(T, ((e >> 1) ? dd[i][h].y : dd[i][h].x) * sc[c], acc[i][jn][e]);
          }
      }
    }
    if constexpr (MB == 1) {  // this warp is done with the slot
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * slot);
    }
  }
  cp_wait<0>();

  // One k-range: y directly; several: this range's slice of the partial sums (gemm_reduce).
  float* out = job.y;
  if (gridDim.z > 1) out = plan.partial + blockIdx.z * plan.out_start[kMaxJobs] + out0;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int jn = 0; jn < 4; ++jn)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = (tile0 + wm * 2 + i) * kTileRows + g + 8 * (e >> 1);
        const int tok = tok0 + wn * 32 + jn * 8 + 2 * tig + (e & 1);
        if (row < job.n && tok < t) out[static_cast<size_t>(tok) * job.n + row] = acc[i][jn][e];
      }
}

// y_j = Σ_z partial[z] in order z = 0, 1, ... (deterministic); thread per output element.
__global__ void gemm_reduce_kernel(TiledJobs jobs, GemmPlan plan, int splits) {
  pdl_trigger();
  pdl_wait();
  const int64_t total = plan.out_start[kMaxJobs];
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  float* y = jobs.job[0].y;
  int64_t off = 0;
#pragma unroll
  for (int i = 1; i < kMaxJobs; ++i)
    if (i < jobs.count && idx >= plan.out_start[i]) {
      y = jobs.job[i].y;
      off = plan.out_start[i];
    }
  float sum = 0.0f;
  for (int z = 0; z < splits; ++z) sum += __ldcg(plan.partial + z * total + idx);
  y[idx - off] = sum;  // y_j is [t][n_j], the slice's layout
}

}  // namespace
}  // namespace bonsai::cuda

#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/gemm_wgmma_tma.cuh"

// (after the producer kernel, whose ring helpers it uses)
#include "kernels/cuda/gemm_f16.cuh"

namespace bonsai::cuda {
namespace {

// BONSAI_CUDA_GEMM_SPLIT (plan_gemm): unset or 1 = the model, 0 = the former rule, n > 1 = n ranges,
// -1 = one range (no split; measurements).
int gemm_split_mode() {
  static const int mode = knob::gemm_split();
  return mode;
}

// Row blocks x token blocks (of `tokens` each) of a launch before any k split.
int gemm_grid(const TiledJobs& jobs, int t, int tokens = kGemmTokens) {
  int blocks = 0;
  for (int j = 0; j < jobs.count; ++j)
    blocks += (static_cast<int>(tiled_pairs(jobs.job[j].n) * kWarpTiles) + kBlockTiles - 1) / kBlockTiles;
  return blocks * ((t + tokens - 1) / tokens);
}

// slots: blocks resident per SM (2 for the mma.sync kernel, 1 for the wgmma kernel); tokens: per
// block (128 for the wgmma producer kernel's NT = 128, else 64).
GemmPlan plan_gemm(const TiledJobs& jobs, int t, int kblocks, int sm_count, int slots_per_sm,
                   int tokens = kGemmTokens) {
  GemmPlan plan;
  int blocks = 0;
  int64_t out = 0;
  for (int j = 0; j < jobs.count; ++j) {
    plan.block_start[j] = blocks;
    plan.out_start[j] = out;
    plan.tiles[j] = static_cast<int>(tiled_pairs(jobs.job[j].n) * kWarpTiles);
    blocks += (plan.tiles[j] + kBlockTiles - 1) / kBlockTiles;
    out += static_cast<int64_t>(t) * jobs.job[j].n;
  }
  for (int j = jobs.count; j <= kMaxJobs; ++j) {
    plan.block_start[j] = blocks;
    plan.out_start[j] = out;
  }
  // Split the k-blocks over blockIdx.z (ranges of at least 4 k-blocks). Fewer blocks than SMs
  // (few tokens, short outputs): about two blocks per SM. Otherwise the split that ends the
  // launch soonest by a model of its time on S SMs of two block slots each: every full round
  // of 2·S blocks takes one range's time; a last partial round of R blocks takes it too when
  // R > S (some SM runs two), but only kLoneBlock of it when R <= S (each block runs alone,
  // with its SM's issue slots to itself; 0.56 fits the H200's GEMMs of K x N = 17408 x 5120
  // and 5120 x 6144 at t = 512). Each range beyond one costs the partial sums' write and read
  // (t x n floats, ~3 TB/s) against ~2.3 µs per k-block of a block pair: 6.9 MB per k-block
  // unit. So the FFN down projection (320 blocks at t = 512, 160 at t = 256: mostly one block
  // per SM in the last round) runs as 2 or 4 ranges instead of 1 or 2; launches of two or
  // more full rounds stay whole. BONSAI_CUDA_GEMM_SPLIT=0: the first rule for every grid (the
  // plan before the model); n > 1: n ranges wherever k allows (measurements).
  const int grid = blocks * ((t + tokens - 1) / tokens);
  const int max_splits = std::max(1, kblocks / 4);
  int splits = std::clamp((slots_per_sm * sm_count + grid - 1) / grid, 1, max_splits);
  plan.kb_per_split = (kblocks + splits - 1) / splits;
  if (gemm_split_mode() > 1 || gemm_split_mode() == -1) {
    splits = gemm_split_mode() == -1 ? 1 : std::min(gemm_split_mode(), max_splits);
    plan.kb_per_split = (kblocks + splits - 1) / splits;
  } else if (gemm_split_mode() == 1 && grid >= sm_count) {
    constexpr double kLoneBlock = 0.56;
    // With one block per SM (wgmma) a partial last round costs a whole range.
    const int64_t slots = slots_per_sm * static_cast<int64_t>(sm_count);
    const double lone = slots_per_sm == 2 ? kLoneBlock : 1.0;
    double best = 0;
    for (int s = 1; s <= std::min(16, max_splits); ++s) {
      const int kbps = (kblocks + s - 1) / s, real = (kblocks + kbps - 1) / kbps;
      const int64_t g = static_cast<int64_t>(grid) * real, rest = g % slots;
      const double rounds = static_cast<double>(g / slots) + (rest == 0          ? 0.0
                                                              : rest <= sm_count ? lone
                                                                                 : 1.0);
      const double cost = rounds * kbps + (real > 1 ? real * 8.0 * static_cast<double>(out) / 6.9e6 : 0.0);
      if (s == 1 || cost < best * 0.97) {  // a range more only for a clear gain
        best = cost;
        plan.kb_per_split = kbps;
      }
    }
  }
  return plan;
}

int gemm_splits(const GemmPlan& p, int kblocks) { return (kblocks + p.kb_per_split - 1) / p.kb_per_split; }

// Stages handed over by mbarriers (MB = 1, the default for 128-column groups at 16 warps per
// SM: 4-5 % faster than a block barrier per k-block) unless BONSAI_CUDA_GEMM_PIPE=bar (mb: the
// default).
bool gemm_mbarrier_pipe() {
  static const bool on = knob::gemm_mbarrier();
  return on;
}

// BONSAI_CUDA_GEMM_OCC=1: no register spills, 8 warps per SM (default 2).
int gemm_occupancy() {
  static const int occ = knob::gemm_occupancy();
  return occ;
}

template <int G, int OCC, int MB, int XS>
void run_gemm_xs(GemmPlan plan, const TiledJobs& jobs, const uint8_t* xq, const float4* meta, int t,
                 int kblocks, float* partial, cudaStream_t s) {
  const int splits = gemm_splits(plan, kblocks);
  if (splits > 1) plan.partial = partial;
  int blocks = plan.block_start[kMaxJobs];
  constexpr int smem = GemmSmem<G, XS>::kBytes + (MB ? 16 * kStages : 0);  // + MB's mbarriers
  cudaFuncSetAttribute(gemm_tiled_kernel<G, OCC, MB, XS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const dim3 grid(static_cast<unsigned>((t + kGemmTokens - 1) / kGemmTokens), static_cast<unsigned>(blocks),
                  static_cast<unsigned>(splits));
  launch(gemm_tiled_kernel<G, OCC, MB, XS>, grid, kThreads, smem, s, jobs, plan, xq, meta, t, kblocks);
  if (splits > 1)
    launch(gemm_reduce_kernel, blocks_for(plan.out_start[kMaxJobs], 256), 256, 0, s, jobs, plan, splits);
}

// The activation staging of BONSAI_CUDA_GEMM_STAGE (gemm_stage(): 0 or 1; kActPitch).
template <int G, int OCC, int MB>
void run_gemm(GemmPlan plan, const TiledJobs& jobs, const uint8_t* xq, const float4* meta, int t, int kblocks,
              float* partial, cudaStream_t s) {
  if (gemm_stage() == 1)
    run_gemm_xs<G, OCC, MB, 1>(plan, jobs, xq, meta, t, kblocks, partial, s);
  else
    run_gemm_xs<G, OCC, MB, 0>(plan, jobs, xq, meta, t, kblocks, partial, s);
}

template <int ST, int NW, int SW>
void run_gemm_wgmma(GemmPlan plan, const TiledJobs& jobs, const uint8_t* xq, const float4* meta, int t,
                    int kblocks, float* partial, cudaStream_t s) {
  const int splits = gemm_splits(plan, kblocks);
  if (splits > 1) plan.partial = partial;
  constexpr int smem = GemmSmemW<ST>::kBytes + 16 * ST + 256;  // + the mbarriers, alignment
  const dim3 grid(static_cast<unsigned>((t + kGemmTokens - 1) / kGemmTokens),
                  static_cast<unsigned>(plan.block_start[kMaxJobs]), static_cast<unsigned>(splits));
  cudaFuncSetAttribute(gemm_wgmma_kernel<ST, NW, SW>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  launch(gemm_wgmma_kernel<ST, NW, SW>, grid, wgmma_threads<NW>(), smem, s, jobs, plan, xq, meta, t, kblocks);
  if (splits > 1)
    launch(gemm_reduce_kernel, blocks_for(plan.out_start[kMaxJobs], 256), 256, 0, s, jobs, plan, splits);
}

// The producer-warp kernel (gemm_wgmma_tma.cuh) on this launch's token range: the tensor maps
// (gemm_select.cpp) describe its t tokens from xq / meta.
template <int ST, int SWZ, int LOOP, int NT = kGemmTokens>
void run_gemm_wgmma_tma(GemmPlan plan, const TiledJobs& jobs, const uint8_t* xq, const float4* meta, int t,
                        int kblocks, float* partial, cudaStream_t s) {
  const int splits = gemm_splits(plan, kblocks);
  if (splits > 1) plan.partial = partial;
  const GemmTensorMaps maps = gemm_tensor_maps(xq, meta, t, kblocks, SWZ, NT);
  static_assert(sizeof(CUtensorMap) == sizeof maps.act && sizeof(CUtensorMap) == sizeof maps.meta);
  CUtensorMap xmap, mmap;
  std::memcpy(&xmap, maps.act, sizeof xmap);
  std::memcpy(&mmap, maps.meta, sizeof mmap);
  using S = GemmSmemT<ST, SWZ, NT>;
  constexpr int smem = S::kBytes + S::kBars + S::kAlign;  // + the mbarriers, alignment
  static_assert(smem <= 227 * 1024, "the ring must fit the shared memory of a block");
  const dim3 grid(static_cast<unsigned>((t + NT - 1) / NT), static_cast<unsigned>(plan.block_start[kMaxJobs]),
                  static_cast<unsigned>(splits));
  cudaFuncSetAttribute(gemm_wgmma_tma_kernel<ST, SWZ, LOOP, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       smem);
  launch(gemm_wgmma_tma_kernel<ST, SWZ, LOOP, NT>, grid, kTmaThreads, smem, s, jobs, plan, xmap, mmap, t,
         kblocks);
  if (splits > 1)
    launch(gemm_reduce_kernel, blocks_for(plan.out_start[kMaxJobs], 256), 256, 0, s, jobs, plan, splits);
}

// BONSAI_CUDA_GEMM_WG_SW=0 (measurements): the activation staged as 16-byte core-matrix pieces
// instead of for the 32-byte swizzle (H200, all 27B matmuls at t = 512: 138.7 against 118.6 ms).
// Also measured, not dispatched: 9 stages (143.9 ms with SW=0) and four warpgroups of 32 tokens
// (NW = 32: 142.5 ms with SW=0), runs of 16:01-16:08.
bool wgmma_swizzle() {
  static const bool sw = knob::gemm_wg_sw();
  return sw;
}

// The wgmma kernel runs 128-column groups (every 27B weight); Q2_0's 64-column groups stay on
// mma.sync. `kernel` is a launch's resolved kernel (gemm_launch_kernel), never automatic.
bool use_wgmma(int groups, GemmKernel kernel) { return groups == 1 && kernel != GemmKernel::mma; }
int slots_for(int groups, GemmKernel kernel) { return use_wgmma(groups, kernel) ? 1 : 2; }

// The kernel addresses the activation with 32-bit offsets: it runs on ranges of at most
// this many tokens (about 123k at k = 17408, so one range in practice).
int token_span(int kblocks) {
  const int64_t row = static_cast<int64_t>(kblocks) * kActBytes;
  return static_cast<int>(std::min<int64_t>(((int64_t{1} << 32) / row) / kGemmTokens * kGemmTokens, 1 << 30));
}

size_t scratch_for(const TiledJobs& jobs, int t, int kblocks, int sm_count, int slots, int tokens) {
  const GemmPlan p = plan_gemm(jobs, t, kblocks, sm_count, slots, tokens);
  const int splits = gemm_splits(p, kblocks);
  return splits > 1 ? static_cast<size_t>(splits) * p.out_start[kMaxJobs] : 0;
}

// Outputs of a launch over t tokens (t x Σ n_j).
int64_t f16_outs(const TiledJobs& jobs, int t) {
  int64_t outs = 0;
  for (int j = 0; j < jobs.count; ++j) outs += static_cast<int64_t>(t) * jobs.job[j].n;
  return outs;
}

}  // namespace

size_t gemm_tiled_scratch(const TiledJobs& jobs, int t, int64_t k, int sm_count) {
  const int kblocks = static_cast<int>(k / kBlockK), span = token_span(kblocks);
  // Either kernel may run (the groups are not known here): room for every plan (mma.sync: 2
  // slots of 64 tokens; wgmma: 1 slot of 64 or 128 tokens; f16: also 256).
  size_t s = 0;
  for (const auto& [slots, tokens] :
       {std::pair{1, kGemmTokens}, std::pair{2, kGemmTokens}, std::pair{1, 128}, std::pair{1, 256}}) {
    s = std::max(s, scratch_for(jobs, std::min(t, span), kblocks, sm_count, slots, tokens));
    if (t > span && t % span != 0)
      s = std::max(s, scratch_for(jobs, t % span, kblocks, sm_count, slots, tokens));
  }
  // The fp16 GEMM's model (gemm_f16_model; one launch over all t tokens), both forms.
  for (const bool tail : {false, true}) {
    const GemmF16Shape m = gemm_f16_model(gemm_grid(jobs, 1, 1), t, kblocks, f16_outs(jobs, t), sm_count,
                                          tail, gemm_f16_tail_gain(), tail ? gemm_f16_stream() : -1);
    const int splits = m.stream > 0 ? gemm_f16_stream_ranges(kblocks, m.stream)
                                    : (kblocks + m.kb_per_split - 1) / m.kb_per_split;
    if (splits > 1) s = std::max(s, gemm_f16_scratch(jobs, t, splits));
  }
  return s;
}

GemmKernel gemm_launch_kernel(GemmKernel kernel, int groups, int grid, int sm_count, bool wgmma_ok) {
  // f16: the launches gemm_f16_launch leaves to the int8 kernels run as automatic's.
  if (kernel != GemmKernel::automatic && kernel != GemmKernel::f16) return kernel;
  // A grid of fewer than gemm_wg_min_blocks() blocks per SM (default 1) stays on mma.sync, which
  // runs two blocks per SM against the wgmma kernel's one: with fewer blocks than SMs, the
  // wgmma kernel's k split leaves it slower (docs/performance.md, "Prefill GEMM", round 2).
  const bool big = static_cast<int64_t>(grid) >= static_cast<int64_t>(gemm_wg_min_blocks()) * sm_count;
  return wgmma_ok && groups == 1 && big ? GemmKernel::wgmma : GemmKernel::mma;
}

namespace {

// The tokens per block of a launch: 128 only for the wgmma producer kernel with the 128-byte
// swizzle, where wg_tokens (tests: 64 or 128 forced) or gemm_wg_tokens() asks for it and the grid
// is large enough (gemm_wg_block_tokens).
int block_tokens(const TiledJobs& jobs, int groups, int t, int sm_count, GemmKernel kernel, bool sw128,
                 int wg_tokens) {
  if (!use_wgmma(groups, kernel) || kernel != GemmKernel::wgmma) return kGemmTokens;
  if (wg_tokens) return sw128 ? wg_tokens : kGemmTokens;  // (the 32-byte kernel has 64 only)
  return sw128 ? gemm_wg_block_tokens(gemm_wg_tokens(), gemm_grid(jobs, t, 128), sm_count) : kGemmTokens;
}

}  // namespace

int gemm_tiled_ranges(const TiledJobs& jobs, int groups, int t, int64_t k, int sm_count, GemmKernel kernel) {
  const int kblocks = static_cast<int>(k / kBlockK), n = std::min(t, token_span(kblocks));
  kernel = gemm_launch_kernel(kernel, groups, gemm_grid(jobs, n), sm_count, gemm_wgmma_available());
  const int tokens = block_tokens(jobs, groups, n, sm_count, kernel, gemm_wg_swizzle() == 128, 0);
  return gemm_splits(plan_gemm(jobs, n, kblocks, sm_count, slots_for(groups, kernel), tokens), kblocks);
}

void gemm_tiled(const TiledJobs& jobs, int groups, const uint8_t* xq, const float4* meta, int t, int64_t k,
                int sm_count, float* partial, cudaStream_t s, GemmKernel kernel, int ranges, int wg_swizzle,
                int wg_loop, int wg_tokens) {
  if (kernel == GemmKernel::f16) kernel = GemmKernel::automatic;  // (gemm_f16_launch declined it)
  const int kblocks = static_cast<int>(k / kBlockK), span = token_span(kblocks);
  const bool occ2 = gemm_occupancy() == 2;
  const bool sw128 = (wg_swizzle ? wg_swizzle : gemm_wg_swizzle()) == 128;
  const int loop = wg_loop >= 0 ? wg_loop : gemm_wg_loop();
  const GemmKernel chosen = kernel;
  for (int t0 = 0; t0 < t; t0 += span) {
    const int n = std::min(span, t - t0);
    TiledJobs part = jobs;
    for (int j = 0; j < part.count; ++j) part.job[j].y += static_cast<size_t>(t0) * part.job[j].n;
    const uint8_t* x = xq + static_cast<size_t>(t0) * kblocks * kActBytes;
    const float4* m = meta + static_cast<size_t>(t0) * kblocks;
    kernel = gemm_launch_kernel(chosen, groups, gemm_grid(part, n), sm_count, gemm_wgmma_available());
    const int tokens = block_tokens(part, groups, n, sm_count, kernel, sw128, wg_tokens);
    GemmPlan p = plan_gemm(part, n, kblocks, sm_count, slots_for(groups, kernel), tokens);
    if (ranges > 0) p.kb_per_split = (kblocks + ranges - 1) / ranges;
    if (use_wgmma(groups, kernel) && kernel == GemmKernel::wgmma) {
      // The consumer loop's variants (LOOP 1, 2) run with the 128-byte swizzle only; 128 tokens
      // per block with 4 stages and their own loop.
      const bool st4 = gemm_wg_stages() == 4;
      if (tokens == 128)
        run_gemm_wgmma_tma<4, 128, 2, 128>(p, part, x, m, n, kblocks, partial, s);
      else if (sw128 && loop == 2 && st4)
        run_gemm_wgmma_tma<4, 128, 2>(p, part, x, m, n, kblocks, partial, s);
      else if (sw128 && loop == 2)
        run_gemm_wgmma_tma<8, 128, 2>(p, part, x, m, n, kblocks, partial, s);
      else if (sw128 && loop == 1 && st4)
        run_gemm_wgmma_tma<4, 128, 1>(p, part, x, m, n, kblocks, partial, s);
      else if (sw128 && loop == 1)
        run_gemm_wgmma_tma<8, 128, 1>(p, part, x, m, n, kblocks, partial, s);
      else if (sw128 && st4)
        run_gemm_wgmma_tma<4, 128, 0>(p, part, x, m, n, kblocks, partial, s);
      else if (sw128)
        run_gemm_wgmma_tma<8, 128, 0>(p, part, x, m, n, kblocks, partial, s);
      else if (st4)
        run_gemm_wgmma_tma<4, 32, 0>(p, part, x, m, n, kblocks, partial, s);
      else
        run_gemm_wgmma_tma<8, 32, 0>(p, part, x, m, n, kblocks, partial, s);
    } else if (use_wgmma(groups, kernel)) {
      if (wgmma_swizzle())
        run_gemm_wgmma<6, 64, 1>(p, part, x, m, n, kblocks, partial, s);
      else
        run_gemm_wgmma<6, 64, 0>(p, part, x, m, n, kblocks, partial, s);
    } else if (groups == 2)
      run_gemm<2, 1, 0>(p, part, x, m, n, kblocks, partial, s);  // (64-column groups: more registers)
    else if (occ2 && gemm_mbarrier_pipe())
      run_gemm<1, 2, 1>(p, part, x, m, n, kblocks, partial, s);
    else if (occ2)
      run_gemm<1, 2, 0>(p, part, x, m, n, kblocks, partial, s);
    else
      run_gemm<1, 1, 0>(p, part, x, m, n, kblocks, partial, s);
  }
}

// ---- The FP16 GEMM (gemm_f16.cuh) ----

void act_to_f16(const float* x, uint8_t* xh, float* tscale, int t, int64_t k, cudaStream_t s, int terms) {
  if (t <= 0) return;
  if (terms == 2)
    launch(act_f16_kernel<2>, t, 256, 0, s, x, xh, tscale, k);
  else
    launch(act_f16_kernel<1>, t, 256, 0, s, x, xh, tscale, k);
}

bool gemm_f16_launch(const TiledJobs& jobs, int groups, int t, int sm_count, bool all_scales_ok,
                     GemmKernel kernel) {
  if (kernel != GemmKernel::f16 || groups != 1 || !all_scales_ok || !gemm_wgmma_available()) return false;
  // automatic's rule (gemm_launch_kernel): below gemm_wg_min_blocks() blocks per SM, mma.sync.
  return static_cast<int64_t>(gemm_grid(jobs, t)) >= static_cast<int64_t>(gemm_wg_min_blocks()) * sm_count;
}

namespace {

template <int NT, int TERMS, int PIPE, int ST, int PERSIST, int DEC = 4>
void run_gemm_f16_as(GemmPlan plan, const TiledJobs& jobs, const uint8_t* xh, const float* tscale, int t,
                     int kblocks, int sm_count, float* partial, cudaStream_t s) {
  const int splits = gemm_splits(plan, kblocks);
  if (splits > 1 || plan.stream > 0) plan.partial = partial;
  // [t][kblocks·256·TERMS] bytes: the map of TERMS·kblocks records of 256 bytes per token
  const GemmTensorMaps maps = gemm_tensor_maps(xh, nullptr, t, TERMS * kblocks, 128, NT);
  CUtensorMap xmap;
  std::memcpy(&xmap, maps.act, sizeof xmap);
  using S = GemmSmemF16<NT, TERMS, ST>;
  constexpr int smem = S::kBytes + S::kBars + 1024;  // + the mbarriers, alignment
  static_assert(smem <= 227 * 1024, "the ring must fit the shared memory of a block");
  const int nx = (t + NT - 1) / NT, ny = plan.block_start[kMaxJobs];
  if (!PERSIST || plan.counters == nullptr)
    plan.whole = plan.stream = 0;  // (the tail plan: persistent, fix-up)
  const int items = plan.whole + (nx * ny - plan.whole) * splits;
  // PERSIST: one block per SM walks the work items (at most one block per item). Stream-K: chunks
  // of at least ceil(units / SMs) k-blocks, so that each block has one chunk (whole > 0: every SM,
  // else one block per chunk).
  int blocks = std::min(items, sm_count);
  if (plan.stream > 0) {
    const int units = (nx * ny - plan.whole) * kblocks;
    plan.stream = std::max(plan.stream, (units + sm_count - 1) / sm_count);
    blocks = plan.whole > 0 ? sm_count : (units + plan.stream - 1) / plan.stream;
    if (units == 0) plan.stream = 0, blocks = sm_count;
  }
  const dim3 grid =
      PERSIST ? dim3(static_cast<unsigned>(blocks))
              : dim3(static_cast<unsigned>(nx), static_cast<unsigned>(ny), static_cast<unsigned>(splits));
  constexpr auto kernel = gemm_f16_kernel<NT, TERMS, PIPE, ST, PERSIST, DEC>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  launch(kernel, grid, kTmaThreads, smem, s, jobs, plan, xmap, tscale, t, kblocks);
  if (splits > 1 && plan.counters == nullptr && plan.stream == 0)
    launch(gemm_reduce_kernel, blocks_for(plan.out_start[kMaxJobs], 256), 256, 0, s, jobs, plan, splits);
}

// The persistent kernel for one term and PIPE 0 (gemm_f16_pipe's default) only.
template <int NT, int TERMS, int PIPE, int ST = kF16Stages<NT, TERMS>>
void run_gemm_f16(GemmPlan plan, const TiledJobs& jobs, const uint8_t* xh, const float* tscale, int t,
                  int kblocks, int sm_count, bool persist, float* partial, cudaStream_t s, int decode) {
  if constexpr (TERMS == 1 && PIPE == 0) {
    if constexpr (ST == 4 && NT != 256) {  // (the 3-step decodes: this kernel only)
      if (persist && decode == 3)
        return run_gemm_f16_as<NT, 1, 0, ST, 1, 3>(plan, jobs, xh, tscale, t, kblocks, sm_count, partial, s);
      if (persist && decode == 5)
        return run_gemm_f16_as<NT, 1, 0, ST, 1, 5>(plan, jobs, xh, tscale, t, kblocks, sm_count, partial, s);
    }
    if (persist)
      return run_gemm_f16_as<NT, 1, 0, ST, 1>(plan, jobs, xh, tscale, t, kblocks, sm_count, partial, s);
  }
  run_gemm_f16_as<NT, TERMS, PIPE, ST, 0>(plan, jobs, xh, tscale, t, kblocks, sm_count, partial, s);
}

}  // namespace

int gemm_f16_stream_ranges(int kblocks, int stream) { return (kblocks + stream - 2) / stream + 1; }

int gemm_f16_counters(const TiledJobs& jobs, int t) { return gemm_grid(jobs, t, 64) * kBlockTiles; }

size_t gemm_f16_scratch(const TiledJobs& jobs, int t, int ranges) {
  // the reduce's [ranges][t x Σ n_j], the fix-up's [ranges][tiles][128 rows x NT tokens]
  size_t s = static_cast<size_t>(ranges) * static_cast<size_t>(f16_outs(jobs, t));
  for (const int tk : {64, 128, 256})
    s = std::max(s,
                 static_cast<size_t>(ranges) * static_cast<size_t>(gemm_grid(jobs, t, tk)) * kGemmRows * tk);
  return s;
}

void gemm_f16(const TiledJobs& jobs, const uint8_t* xh, const float* tscale, int t, int64_t k, int sm_count,
              float* partial, cudaStream_t s, int ranges, int tokens, int terms, int pipe, int stages,
              int persist, int* counters, int sums, int decode, int stream) {
  if (t <= 0) return;
  if (decode == 0) decode = gemm_f16_decode();
  if (terms == 0) terms = gemm_f16_terms();
  if (sums < 0) sums = gemm_f16_sums();
  if (counters == nullptr) sums = 0;  // (no counters: the reduce kernel)
  if (persist < 0) persist = gemm_f16_persist();
  const bool ps = persist == 1;
  const int kblocks = static_cast<int>(k / kBlockK);
  // gemm_f16_tokens() 0 (the default): tokens and k ranges by gemm_f16_model (sums 2: its tail
  // form, whole tiles first). 128 or 256: through gemm_f16_block_tokens (256 tokens per block
  // where that grid covers the SMs, one term only, else 128 where that grid does, else 64) and
  // plan_gemm with one slot per SM. ranges > 0 (tests): that many ranges (with sums 2, for the
  // tiles past the last full round of the SMs only).
  // stream > 0 (tests, with sums 2 and ranges > 0): the tiles past the full rounds stream-K in
  // chunks of at least that many k-blocks; -1: the model's (gemm_f16_stream()).
  int kbps = 0, whole = 0, sl = 0;
  if (tokens == 0 && gemm_f16_tokens() == 0) {
    const GemmF16Shape m =
        gemm_f16_model(gemm_grid(jobs, 1, 1), t, kblocks, f16_outs(jobs, t), sm_count, sums == 2 && ps,
                       gemm_f16_tail_gain(), stream < 0 ? gemm_f16_stream() : -1);
    tokens = m.tokens;
    kbps = m.kb_per_split;
    whole = m.whole;
    sl = m.stream;
  }
  if (tokens == 0)
    tokens = gemm_f16_block_tokens(terms == 1 ? gemm_f16_tokens() : 128, gemm_grid(jobs, t, 256),
                                   gemm_grid(jobs, t, 128), sm_count);
  GemmPlan p = plan_gemm(jobs, t, kblocks, sm_count, 1, tokens);
  if (kbps > 0) p.kb_per_split = kbps;
  if (ranges > 0) {
    p.kb_per_split = (kblocks + ranges - 1) / ranges;
    const int grid = gemm_grid(jobs, t, tokens);
    whole = sums == 2 ? grid / sm_count * sm_count : 0;
  }
  if (sums > 0) p.counters = counters;
  p.whole = sums == 2 ? whole : 0;
  if (stream > 0) sl = stream;
  p.stream = sums == 2 && ps ? sl : 0;
  if (pipe < 0) pipe = gemm_f16_pipe();
  if (stages == 0) stages = gemm_f16_stages();
  const bool st6 = stages == 6 && terms == 1 && pipe == 0;  // (the deeper ring: one term, PIPE 0)
  if (tokens == 256 && terms == 1)
    run_gemm_f16<256, 1, 0>(p, jobs, xh, tscale, t, kblocks, sm_count, ps, partial, s, decode);
  else if (tokens >= 128 && terms == 2)
    run_gemm_f16<128, 2, 0>(p, jobs, xh, tscale, t, kblocks, sm_count, ps, partial, s, decode);
  else if (tokens >= 128 && st6)
    run_gemm_f16<128, 1, 0, 6>(p, jobs, xh, tscale, t, kblocks, sm_count, ps, partial, s, decode);
  else if (tokens >= 128 && pipe == 1)
    run_gemm_f16<128, 1, 1>(p, jobs, xh, tscale, t, kblocks, sm_count, ps, partial, s, decode);
  else if (tokens >= 128)
    run_gemm_f16<128, 1, 0>(p, jobs, xh, tscale, t, kblocks, sm_count, ps, partial, s, decode);
  else if (terms == 2)
    run_gemm_f16<64, 2, 0>(p, jobs, xh, tscale, t, kblocks, sm_count, ps, partial, s, decode);
  else if (st6)
    run_gemm_f16<64, 1, 0, 6>(p, jobs, xh, tscale, t, kblocks, sm_count, ps, partial, s, decode);
  else if (pipe == 1)
    run_gemm_f16<64, 1, 1>(p, jobs, xh, tscale, t, kblocks, sm_count, ps, partial, s, decode);
  else
    run_gemm_f16<64, 1, 0>(p, jobs, xh, tscale, t, kblocks, sm_count, ps, partial, s, decode);
}

}  // namespace bonsai::cuda
