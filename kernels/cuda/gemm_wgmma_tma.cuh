// The prefill GEMM on wgmma with a producer warp (sm_90a; included by kernels/cuda/gemm.cu after
// gemm_wgmma.cuh, whose block shape, A gather and flush it shares). BONSAI_CUDA_GEMM=wgmma.
//
// Same block and numerics as gemm_wgmma_kernel (128 weight rows x 64 tokens, two consumer
// warpgroups of 64 rows, per 128-column k-block the exact sums Σc·hi and Σc·lo chained from the
// bits of 1.5·2^23, T by flush_value, acc += T·(d·s) in k-block order: bit-identical to the
// mma.sync kernel for the same k ranges). Status (H200, docs/performance.md "Prefill GEMM",
// round 2): with the 128-byte swizzle all 27B matmuls at t = 512 in 87.9 ms against 102.5 for
// mma.sync (102.0 with the 32-byte swizzle), at t = 256 53.3 against 56.9; the default on compute
// capability 9.0 for grids of at least one block per SM (BONSAI_CUDA_GEMM=auto), pp512 +10 %.
// Round 3: consumer loop 2 (LOOP, below) 85.8 against 88.1 ms, pp512 +1.7 %; ring of 4 stages.
// Round 4: NT = 128 tokens per block (BONSAI_CUDA_GEMM_WG_TOKENS=128, the default; m64n128k32,
// one accumulator set per warpgroup, 4 stages of 39 KB; the 128-byte swizzle only), below: all
// 27B matmuls at t = 512 81.8 against 85.7 ms, pp512 +4.5 %.
// What differs from gemm_wgmma_kernel is who fills the stages:
// - A third warpgroup is the producer. Its warp 0 alone issues a stage's copies, one per lane,
//   through the async proxy: lanes 0-7 one `cp.async.bulk` each of a stored 544-byte chunk (the
//   chunks are contiguous in global memory, [tile][kblock]); lanes 8-15 one TMA box each of the
//   activation (a 2-D tensor map over [t][kblocks·256] bytes, box 32 bytes x 64 tokens, the
//   32-byte swizzle: region r of the stage = bytes [32r, 32r + 32) of the 64 tokens' records,
//   token n's 32 bytes at 32n with the 16-byte halves swapped when bit 2 of n is set, i.e.
//   address bit 4 ^= bit 7: exactly the layout gemm_wgmma_kernel<SW = 1> stages by hand and its
//   wgmma descriptors read, so the consumers' descriptors are the same); lane 16 one TMA box of
//   the 64 tokens' float4 meta (a tensor map over [t][kblocks·4] floats, box 4 x 64). That is
//   SWZ = 32 (BONSAI_CUDA_GEMM_WG_SWIZZLE=32, session 5's kernel). SWZ = 128 (the default): lanes
//   8-9 one TMA box each of 128 bytes x 64 tokens (the hi or lo half of the records) with the
//   128-byte swizzle, lane 10 the meta; 2 activation copies per stage instead of 8 (below, at
//   the kernel). Tokens past
//   t are zero-filled by the TMA (as the cp.async zero fill did); chunks of tiles past the stored
//   ones are copied from tile 0 instead (finite values in rows that are never stored; the byte
//   count per stage stays constant). The consumers no longer compute copy addresses, issue
//   copies, or fence the generic proxy before their wgmmas read a stage: the TMA writes through
//   the async proxy, and the full barrier's completion makes them visible to the waiting threads.
// - Registers: 384 threads at launch get 168 each; the producer warpgroup gives its share back
//   (`setmaxnreg.dec` to 40) and the consumers take it (`setmaxnreg.inc` to 232: 128·40 +
//   256·232 = 64512 <= 65536) for two accumulator sets (hi + lo, 64 registers each), the 32
//   outputs and the flush: no spills (ptxas). With 24 / 240 the producer spilled.
// - The flush operands per token, s and kMagic + Σq (the same float as gemm_tiled_kernel's mq),
//   are formed by each consumer warp while its wgmmas of the k-block run (two tokens per lane)
//   into its own float2 buffer: the flush then loads 8 bytes per token instead of a float4 and
//   adds nothing, and holds half the registers for them (with the float4s the consumers spilled
//   at 232 registers). Formed per warp, not once per block by other warps: a third barrier
//   ("operands ready", warps 1-2 of the producer warpgroup forming them) made the consumers wait
//   (H200, run of 17:48: 5120 x 10240 at t = 512 305 us against 293 without it).
//
// Ring protocol (kStagesT slots of one k-block each; mbarriers after the stages):
// - full[s] (1 arrival + transaction bytes): the producer's lane 0 arrives with expect_tx of the
//   stage's bytes (8·544 + 8·2048 + 1024) before any lane issues its copy (__syncwarp), each
//   copy completes its bytes on the same barrier; the phase completes when every byte landed.
//   Consumers wait for k-block i's phase by parity (i / kStagesT) & 1.
// - empty[s] (8 arrivals, one per consumer warp): a warp arrives after its flush of the slot's
//   k-block (meta and scales read) and after the wgmma batch that read the slot's activation
//   completed (wgmma_wait before the flush; LOOP 1 / 2: at the flush's start, all its reads of
//   the stage being done in prep). The producer refills slot s with k-block i only
//   after the release of k-block i - kStagesT, i.e. the phase (i / kStagesT - 1) & 1: the whole
//   ring is in flight ahead of the consumers (gemm_wgmma_kernel's refill ran kStages - 2 ahead
//   and every thread waited for it).
// - PDL: the weights do not depend on the previous kernel, so the producer issues the first
//   round's chunks before griddepcontrol.wait and their activation after it (the expect_tx of
//   the stage already covers both).
#pragma once

#include <cuda.h>  // CUtensorMap (the encoder comes through the runtime's driver entry point)

#include "kernels/cuda/wgmma.cuh"

namespace bonsai::cuda {
namespace {

constexpr int kTmaThreads = 384;  // two consumer warpgroups + the producer warpgroup

// The stages, then per consumer warp two buffers of the 64 tokens' flush operands {s, kMagic +
// Σq} (float2), then the full and empty mbarriers. A stage holds the 8 stored chunks (kW bytes
// at kOffW), the activation (kX at kOffX) and the 64 tokens' float4 meta (kM at kOffM).
// SWZ = 32: as gemm_wgmma_kernel's stage (chunks, then the 8 swizzled 2048-byte regions, then
// the meta; regions 256-byte aligned). SWZ = 128: the activation first, as two 8 KB regions (hi,
// lo) of 8-token atoms of 1024 bytes, which the 128-byte swizzle needs 1024-byte aligned, so
// the stage is padded to a multiple of 1024 bytes (22528 instead of 21760).
template <int kStagesT, int SWZ, int NT = kGemmTokens>
struct GemmSmemT {
  static_assert(SWZ == 32 || SWZ == 128);
  static_assert(NT == kGemmTokens || (NT == 2 * kGemmTokens && SWZ == 128),
                "128 tokens: 128-byte swizzle only");
  using W = GemmSmemW<kStagesT>;
  static constexpr int kCB = W::kCB, kW = W::kW;
  static constexpr int kX = NT * kActBytes, kM = NT * 16;  // activation and meta of NT tokens
  static constexpr int kAlign = SWZ == 128 ? 1024 : 256;   // of the activation regions
  static constexpr int kOffW = SWZ == 128 ? kX : 0;
  static constexpr int kOffX = SWZ == 128 ? 0 : kW;
  static constexpr int kOffM = kW + kX;
  static constexpr int kStage = (kW + kX + kM + kAlign - 1) / kAlign * kAlign;
  static constexpr int kP = NT * 8;  // one operand buffer
  static constexpr int kBytes = kStagesT * kStage + 8 * 2 * kP;
  static constexpr int kBars = 16 * kStagesT;
  static_assert(kOffX % kAlign == 0 && kStage % kAlign == 0, "swizzled regions need their alignment");
  static_assert(SWZ == 128 || kStage == W::kStage, "SWZ = 32 keeps gemm_wgmma_kernel's stage");
};

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// The mbarrier inits (generic proxy) before the async proxy's complete_tx on them.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// bytes (a multiple of 16) from global src to shared dst, completing on bar.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// The box of a 2-D tensor map at element coordinates (x, y), completing on bar.
__device__ __forceinline__ void tma_g2s_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
#if BONSAI_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
#if BONSAI_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}

// xmap: the activation [t][kblocks·256] u8 (SWZ = 32: box 32 x 64, 32-byte swizzle; SWZ = 128:
// box 128 x NT, 128-byte swizzle); mmap: the meta [t][kblocks·4] f32 (box 4 x NT). Both describe
// the launch's token range (t tokens from its xq). NT: tokens per block, 64 or 128 (the regions
// below then hold 128 tokens, 16 KB each; the wgmma B operand is 128 tokens of 16 8-token
// atoms, the same SBO).
//
// SWZ = 128 (the layout of the 128-byte swizzle mode, wgmma layout type 1, K-major): region h
// (0: hi, 1: lo) of a stage holds bytes [128h, 128h + 128) of the 64 tokens' records, token n's
// 128 bytes at 128n with its 16-byte unit u stored at unit u ^ (n & 7) (address bits 4-6 ^= bits
// 7-9, the region 1024-byte aligned): what one TMA box of 128 bytes x 64 tokens with
// CU_TENSOR_MAP_SWIZZLE_128B writes. The wgmma of k-step j reads bytes [32j, 32j + 32) of each
// token: its descriptor starts 32j bytes into the region (the swizzle is applied to the whole
// address, so the start moves inside the 1024-byte atom, as CUTLASS's descriptor iterator does),
// 8-token groups SBO = 1024 bytes apart; the leading offset is unused for swizzled K-major.
//
// LOOP (BONSAI_CUDA_GEMM_WG_LOOP, consumer loop; SWZ = 128 only): 0, round 2's loop (issue: full
// wait, A gather, set init, wgmmas, then the meta loads and the operands formed right after
// them; flush: the row scales loaded, then the math). 1: every shared-memory read of k-block i
// (the meta, the row scales, the A gather) is done in prep(i) before its wgmmas, and the
// operands are formed after the wgmmas are issued, so the loads' latency hides behind the
// gather, the set init and the wgmma issue instead of stalling the IADD3 / HADD2 that use them
// (round 2's ncu: 8 % of the stall samples between the meta loads and their adds). 2: as 1, and
// prep(i + 1) (full wait, loads, A gather into the other A registers, the set init) runs before
// the wait for k-block i's wgmmas, so the next batch issues right after that wait.
template <int kStagesT, int SWZ, int LOOP, int NT>
__global__ void __launch_bounds__(kTmaThreads, 1)
    gemm_wgmma_tma_kernel(TiledJobs jobs, GemmPlan plan, const __grid_constant__ CUtensorMap xmap,
                          const __grid_constant__ CUtensorMap mmap, int t, int kblocks) {
#if BONSAI_WGMMA
  using S = GemmSmemT<kStagesT, SWZ, NT>;
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_trigger();
  constexpr int kR = 32;       // accumulators per set and thread of NT = 64 (64 rows x 64 tokens / 128)
  constexpr int kRA = NT / 2;  // outputs per thread (64 rows x NT tokens / 128)
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
            tg = lane & 3;
  const int tok0 = blockIdx.x * NT;
  const int rb = blockIdx.y;
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
  const int n = kb1 - kb0;
  const int tile0 = (rb - bstart) * kBlockTiles;
  // Stages from a kAlign-byte aligned base (the swizzle follows address bits 4-6 and 7-9).
  const uint32_t sraw = static_cast<uint32_t>(__cvta_generic_to_shared(smem)),
                 spad = (S::kAlign - (sraw & (S::kAlign - 1u))) & (S::kAlign - 1u);
  const uint32_t sbase = sraw + spad;
  uint8_t* const sm = smem + spad;
  const uint32_t full0 = sbase + S::kBytes, empty0 = full0 + 8 * kStagesT;
  if (tid < kStagesT) {
    mbar_init(full0 + 8 * tid, 1);
    mbar_init(empty0 + 8 * tid, 8);
  }
  fence_mbar_init();
  __syncthreads();  // the last block-wide barrier: the producer's idle warps exit below

  if (wg == 2) {  // ---- producer ----
    setmaxnreg_dec<40>();
    if (w != 0) return;
    constexpr uint32_t kTx = S::kW + S::kX + S::kM;  // every stage moves the same bytes
    // Lane l < 8: chunk of tile l (tile 0's when l is past the stored tiles), bytes [kb·544, +544).
    const int ti = lane < kBlockTiles && tile0 + lane < tiles ? lane : 0;
    const uint8_t* wsrc = job.w + static_cast<size_t>(tile0 + ti) * kblocks * S::kCB;
    auto load_w = [&](int i) {  // arrive with the stage's bytes, then the chunks
      const uint32_t slot = i % kStagesT, bar = full0 + 8 * slot;
      if (lane == 0) mbar_arrive_expect_tx(bar, kTx);
      __syncwarp();
      if (lane < kBlockTiles)
        bulk_g2s(sbase + slot * S::kStage + S::kOffW + lane * S::kCB,
                 wsrc + static_cast<size_t>(kb0 + i) * S::kCB, S::kCB, bar);
    };
    auto load_x = [&](int i) {  // the activation's regions (8 of 32 bytes or 2 of 128) and the meta
      constexpr int kRegions = kActBytes / SWZ, kRegion = NT * SWZ;
      const uint32_t slot = i % kStagesT, bar = full0 + 8 * slot, st = sbase + slot * S::kStage;
      const int r = lane - kBlockTiles;
      if (r >= 0 && r < kRegions)
        tma_g2s_2d(st + S::kOffX + r * kRegion, &xmap, (kb0 + i) * kActBytes + SWZ * r, tok0, bar);
      else if (r == kRegions)
        tma_g2s_2d(st + S::kOffM, &mmap, (kb0 + i) * 4, tok0, bar);
    };
    const int first = min(n, kStagesT);
    for (int i = 0; i < first; ++i) load_w(i);
    pdl_wait();  // the activation and meta are the previous kernel's output
    for (int i = 0; i < first; ++i) load_x(i);
    for (int i = kStagesT; i < n; ++i) {
      mbar_wait(empty0 + 8 * (i % kStagesT), ((i / kStagesT) - 1) & 1);
      load_w(i);
      load_x(i);
    }
    return;
  }

  // ---- consumers: warpgroup wg owns rows 64·wg.. of the block (tiles 4·wg + w) ----
  setmaxnreg_inc<232>();
  // The B descriptors (wgmma.cuh wgmma_desc; SWZ = 32: layout type 3, SBO 256; SWZ = 128: layout
  // type 1, SBO 1024; LBO 16, unused) differ only in the start address field (bits 0-13, address
  // / 16): the low word of a k-step's operand in slot s is dlo0 + s·kStage/16 + its offset / 16,
  // with no carry out of the field (shared addresses < 2^18); the high word is the constant SBO |
  // type. Computed once here instead of masked and shifted per wgmma.
  static_assert(S::kBytes + S::kBars + S::kAlign <= (1 << 18) && S::kStage % 16 == 0);
  const uint32_t dlo0 = (((sbase + S::kOffX) & 0x3FFFFu) >> 4) | (1u << 16);
  constexpr uint64_t kSbo = SWZ == 128 ? 1024 : 256, kType = SWZ == 128 ? 1 : 3;
  constexpr uint64_t kDescHi = ((kSbo >> 4) | (kType << 30)) << 32;
  // The operand of k-step j: SWZ = 32, hi in region j, lo in region 4 + j (2048 bytes each);
  // SWZ = 128, hi 32j bytes into region 0, lo 32j bytes into region 1 (NT·128 bytes on).
  constexpr uint32_t kHiStep = SWZ == 128 ? 32 / 16 : 2048 / 16,
                     kLoOff = SWZ == 128 ? NT * 128 / 16 : 4 * 2048 / 16;
  pdl_wait();  // (the output may still be read by the previous kernel)
  const int tile = wg * 4 + w;
  float acc[kRA];  // element 4q + e: row g + 8(e >> 1), token 8q + 2·tg + (e & 1)
#pragma unroll
  for (int i = 0; i < kRA; ++i) acc[i] = 0.0f;
  // This warp's two operand buffers [2][NT] (after the stages).
  float2* const ops = reinterpret_cast<float2*>(sm + kStagesT * S::kStage) + (wg * 4 + w) * 2 * NT;

  static_assert(LOOP >= 0 && LOOP <= 2 && (LOOP == 0 || SWZ == 128));
  static_assert(NT == kGemmTokens || NT == 2 * kGemmTokens);
  if constexpr (NT == 2 * kGemmTokens) {
    // NT = 128 (BONSAI_CUDA_GEMM_WG_TOKENS=128): one accumulator set per warpgroup, m64n128k32.
    // Two sets of 64 (hi + lo) plus the 64 outputs would be 320 registers against the 232 of a
    // consumer, so the set is flushed before the next k-block's wgmmas are issued: this
    // warpgroup's tensor work pauses during its flush, which the other consumer warpgroup's
    // wgmmas fill (its own k-block runs out of phase). Still taken off that path: the full wait
    // and the flush operands of k-block i + 1 are done while k-block i's wgmmas run.
    uint32_t a[4][4];  // this k-block's A operands
    uint32_t swv;      // the row scales (half2 of rows g, g + 8)
    int hs[kRA], ls[kRA];
    auto wait_form = [&](int i) {  // full wait, then k-block i's operands into buffer i & 1
      const int slot = i % kStagesT;
      mbar_wait(full0 + 8 * slot, (i / kStagesT) & 1);
      const uint8_t* mst = sm + slot * S::kStage + S::kOffM;
#pragma unroll
      for (int h = 0; h < NT / 32; ++h) {  // kMagic + Σq exactly (|Σq| < 2^22): gemm_tiled_kernel's mq
        const float4 m = *reinterpret_cast<const float4*>(mst + (lane + 32 * h) * 16);
        ops[(i & 1) * NT + lane + 32 * h] =
            make_float2(m.x, __int_as_float(kMagicBits + __float_as_int(m.z) + __float_as_int(m.w)));
      }
    };
    if (n > 0) wait_form(0);
    for (int i = 0; i < n; ++i) {
      const int slot = i % kStagesT;
      const uint8_t* chunk = sm + slot * S::kStage + S::kOffW + tile * S::kCB;
      swv = *reinterpret_cast<const uint32_t*>(chunk + kCodeBytes + g * 4);
#pragma unroll
      for (int j = 0; j < 4; ++j) gather_codes(a[j], chunk, g, tg, j);
#pragma unroll
      for (int e = 0; e < kRA; ++e) {
        hs[e] = kMagicBits;
        ls[e] = kMagicBits;
      }
      wgmma_fence();
      const uint32_t dlo = dlo0 + slot * (S::kStage / 16);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint64_t dh = kDescHi | (dlo + j * kHiStep), dl = kDescHi | (dlo + kLoOff + j * kHiStep);
        wgmma_m64n128k32_u8s8(hs, a[j], dh, 1);
        wgmma_m64n128k32_u8s8(ls, a[j], dl, 1);
      }
      wgmma_commit();
      if (i + 1 < n) wait_form(i + 1);
      wgmma_wait<0>();
      __syncwarp();  // every lane's reads of the stage and operand stores of k-block i
      if (lane == 0) mbar_arrive(empty0 + 8 * slot);
      const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&swv));  // rows g, g + 8
      const float2* op = ops + (i & 1) * NT;
#pragma unroll
      for (int q = 0; q < NT / 8; ++q)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float2 m = op[8 * q + 2 * tg + c];  // {s, kMagic + Σq}
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int e = 4 * q + 2 * r + c;
            const float T = flush_value(hs[e], ls[e], m.y);
            acc[e] = fmaf(T, (r ? dd.y : dd.x) * m.x, acc[e]);
          }
        }
      __syncwarp();  // the operand reads before wait_form(i + 2) rewrites the buffer
    }
  } else if constexpr (LOOP == 0) {
    int hs[2][kR], ls[2][kR];  // accumulator sets: Σc·hi, Σc·lo (+ the magic)
    auto issue = [&](int i, int set) {
      const int slot = i % kStagesT;
      mbar_wait(full0 + 8 * slot, (i / kStagesT) & 1);
      const uint8_t* chunk = sm + slot * S::kStage + S::kOffW + tile * S::kCB;
      uint32_t a[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) gather_codes(a[j], chunk, g, tg, j);
#pragma unroll
      for (int e = 0; e < kR; ++e) {
        hs[set][e] = kMagicBits;
        ls[set][e] = kMagicBits;
      }
      wgmma_fence();
      const uint32_t dlo = dlo0 + slot * (S::kStage / 16);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint64_t dh = kDescHi | (dlo + j * kHiStep), dl = kDescHi | (dlo + kLoOff + j * kHiStep);
        wgmma_m64n64k32_u8s8(hs[set], a[j], dh, 1);
        wgmma_m64n64k32_u8s8(ls[set], a[j], dl, 1);
      }
      wgmma_commit();
      // While they run: this warp's flush operands of k-block i (two tokens per lane) into buffer
      // i & 1, read by flush(i) in the next half-iteration (__syncwarp there orders the stores).
      const uint8_t* mst = sm + slot * S::kStage + S::kOffM;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 m = *reinterpret_cast<const float4*>(mst + (lane + 32 * h) * 16);
        // kMagic + Σq exactly (|Σq| < 2^22): the same float as gemm_tiled_kernel's mq.
        ops[(i & 1) * kGemmTokens + lane + 32 * h] =
            make_float2(m.x, __int_as_float(kMagicBits + __float_as_int(m.z) + __float_as_int(m.w)));
      }
    };
    // k-block i's set is complete: add its terms (tile_layout.h flush_value), then release the slot.
    auto flush = [&](int i, int set) {
      const int slot = i % kStagesT;
      const uint8_t* st = sm + slot * S::kStage;
      const uint32_t sw =
          *reinterpret_cast<const uint32_t*>(st + S::kOffW + tile * S::kCB + kCodeBytes + g * 4);
      const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&sw));  // rows g, g + 8
      __syncwarp();  // the operand stores of issue(i)
      const float2* op = ops + (i & 1) * kGemmTokens;
#pragma unroll
      for (int q = 0; q < 8; ++q)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float2 m = op[8 * q + 2 * tg + c];  // {s, kMagic + Σq}
          const float mq = m.y;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int e = 4 * q + 2 * r + c;
            const float T = flush_value(hs[set][e], ls[set][e], mq);
            acc[e] = fmaf(T, (r ? dd.y : dd.x) * m.x, acc[e]);
          }
        }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * slot);
    };

    // Issue k-block i into one set, flush k-block i - 1's (complete) set while those run, wait:
    // nothing is in flight across the loop's back edge (else ptxas serializes the wgmmas).
    if (n > 0) {
      issue(0, 0);
      wgmma_wait<0>();
      for (int i = 1;; ++i) {
        if (i >= n) {
          flush(i - 1, 0);
          break;
        }
        issue(i, 1);
        flush(i - 1, 0);
        wgmma_wait<0>();
        if (++i >= n) {
          flush(i - 1, 1);
          break;
        }
        issue(i, 0);
        flush(i - 1, 1);
        wgmma_wait<0>();
      }
    }
  } else {
    int hs[2][kR], ls[2][kR];  // accumulator sets: Σc·hi, Σc·lo (+ the magic)
    // LOOP 1 / 2: prep(i) reads everything k-block i needs from its stage into registers (A
    // codes, raw meta of this lane's two tokens, the row scales), launch(i) issues its wgmmas,
    // form(i) then turns the meta into the flush operands, flush(i) needs no stage data (the slot
    // is released at its start, once the wgmmas that read it are complete).
    uint32_t a[2][4][4];  // A operands per set: LOOP 2 gathers k-block i + 1's while i's wgmmas run
    uint32_t swv[2];      // the row scales (half2 of rows g, g + 8) per set
    float4 mv[2];         // the raw meta of tokens lane, lane + 32 of the last prepped k-block
    auto prep = [&](int i, int set) {
      const int slot = i % kStagesT;
      mbar_wait(full0 + 8 * slot, (i / kStagesT) & 1);
      const uint8_t* st = sm + slot * S::kStage;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        mv[h] = *reinterpret_cast<const float4*>(st + S::kOffM + (lane + 32 * h) * 16);
      const uint8_t* chunk = st + S::kOffW + tile * S::kCB;
      swv[set] = *reinterpret_cast<const uint32_t*>(chunk + kCodeBytes + g * 4);
#pragma unroll
      for (int j = 0; j < 4; ++j) gather_codes(a[set][j], chunk, g, tg, j);
#pragma unroll
      for (int e = 0; e < kR; ++e) {
        hs[set][e] = kMagicBits;
        ls[set][e] = kMagicBits;
      }
    };
    auto launch_mma = [&](int i, int set) {
      wgmma_fence();
      const uint32_t dlo = dlo0 + (i % kStagesT) * (S::kStage / 16);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint64_t dh = kDescHi | (dlo + j * kHiStep), dl = kDescHi | (dlo + kLoOff + j * kHiStep);
        wgmma_m64n64k32_u8s8(hs[set], a[set][j], dh, 1);
        wgmma_m64n64k32_u8s8(ls[set], a[set][j], dl, 1);
      }
      wgmma_commit();
    };
    auto form = [&](int i) {  // into buffer i & 1, read by flush(i) (its __syncwarp orders the stores)
#pragma unroll
      for (int h = 0; h < 2; ++h)  // kMagic + Σq exactly (|Σq| < 2^22): gemm_tiled_kernel's mq
        ops[(i & 1) * kGemmTokens + lane + 32 * h] = make_float2(
            mv[h].x, __int_as_float(kMagicBits + __float_as_int(mv[h].z) + __float_as_int(mv[h].w)));
    };
    auto flush = [&](int i, int set) {
      __syncwarp();  // every lane's reads of the stage (prep(i)) and operand stores (form(i))
      if (lane == 0) mbar_arrive(empty0 + 8 * (i % kStagesT));
      const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&swv[set]));  // rows g, g + 8
      const float2* op = ops + (i & 1) * kGemmTokens;
#pragma unroll
      for (int q = 0; q < 8; ++q)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float2 m = op[8 * q + 2 * tg + c];  // {s, kMagic + Σq}
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int e = 4 * q + 2 * r + c;
            const float T = flush_value(hs[set][e], ls[set][e], m.y);
            acc[e] = fmaf(T, (r ? dd.y : dd.x) * m.x, acc[e]);
          }
        }
      __syncwarp();  // the operand reads before form(i + 2) rewrites the buffer
    };
    constexpr bool kEarly = LOOP == 2;
    if (n > 0) {
      prep(0, 0);
      launch_mma(0, 0);
      form(0);
      if (kEarly && n > 1) prep(1, 1);
      wgmma_wait<0>();
      for (int i = 1;; ++i) {
        if (i >= n) {
          flush(i - 1, 0);
          break;
        }
        if (!kEarly) prep(i, 1);
        launch_mma(i, 1);
        form(i);
        flush(i - 1, 0);
        if (kEarly && i + 1 < n) prep(i + 1, 0);
        wgmma_wait<0>();
        if (++i >= n) {
          flush(i - 1, 1);
          break;
        }
        if (!kEarly) prep(i, 0);
        launch_mma(i, 0);
        form(i);
        flush(i - 1, 1);
        if (kEarly && i + 1 < n) prep(i + 1, 1);
        wgmma_wait<0>();
      }
    }
  }

  float* out = job.y;
  if (gridDim.z > 1) out = plan.partial + blockIdx.z * plan.out_start[kMaxJobs] + out0;
#pragma unroll
  for (int e = 0; e < kRA; ++e) {
    const int row = (tile0 + tile) * kTileRows + g + 8 * ((e >> 1) & 1);
    const int tok = tok0 + 8 * (e >> 2) + 2 * tg + (e & 1);
    if (row < job.n && tok < t) out[static_cast<size_t>(tok) * job.n + row] = acc[e];
  }
#else
  __trap();  // gemm.cu selects this kernel only on compute capability 9.0 (the sm_90a build)
#endif
}

}  // namespace
}  // namespace bonsai::cuda
