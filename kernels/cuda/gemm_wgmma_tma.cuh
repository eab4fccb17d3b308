// The prefill GEMM on wgmma with a producer warp (sm_90a; included by kernels/cuda/gemm.cu after
// gemm_wgmma.cuh, whose block shape, A gather and flush it shares). BONSAI_CUDA_GEMM=wgmma.
//
// Same block and numerics as gemm_wgmma_kernel (128 weight rows x 64 tokens, two consumer
// warpgroups of 64 rows, per 128-column k-block the exact sums Σc·hi and Σc·lo chained from the
// bits of 1.5·2^23, T by flush_value, acc += T·(d·s) in k-block order: bit-identical to the
// mma.sync kernel for the same k ranges). Status (H200, docs/performance.md "Prefill GEMM",
// wgmma producer warp): all 27B matmuls at t = 512 in 102.0 ms against 102.5 for mma.sync and
// 118.7 for gemm_wgmma_kernel; pp512 0.5 % below the default. Not the default.
// What differs from gemm_wgmma_kernel is who fills the stages:
// - A third warpgroup is the producer. Its warp 0 alone issues a stage's copies, one per lane,
//   through the async proxy: lanes 0-7 one `cp.async.bulk` each of a stored 544-byte chunk (the
//   chunks are contiguous in global memory, [tile][kblock]); lanes 8-15 one TMA box each of the
//   activation (a 2-D tensor map over [t][kblocks·256] bytes, box 32 bytes x 64 tokens, the
//   32-byte swizzle: region r of the stage = bytes [32r, 32r + 32) of the 64 tokens' records,
//   token n's 32 bytes at 32n with the 16-byte halves swapped when bit 2 of n is set, i.e.
//   address bit 4 ^= bit 7: exactly the layout gemm_wgmma_kernel<SW = 1> stages by hand and its
//   wgmma descriptors read, so the consumers' descriptors are the same); lane 16 one TMA box of
//   the 64 tokens' float4 meta (a tensor map over [t][kblocks·4] floats, box 4 x 64). Tokens past
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
//   completed (wgmma_wait before the flush). The producer refills slot s with k-block i only
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

// The stages (as gemm_wgmma_kernel's: the 8 stored chunks, the activation's 8 swizzled regions,
// the 64 tokens' float4 meta), then per consumer warp two buffers of the 64 tokens' flush
// operands {s, kMagic + Σq} (float2), then the full and empty mbarriers.
template <int kStagesT>
struct GemmSmemT {
  using W = GemmSmemW<kStagesT>;
  static constexpr int kCB = W::kCB, kW = W::kW, kX = W::kX, kM = W::kM, kStage = W::kStage;
  static constexpr int kP = kGemmTokens * 8;  // one operand buffer
  static constexpr int kBytes = kStagesT * kStage + 8 * 2 * kP;
  static constexpr int kBars = 16 * kStagesT;
  static_assert(kW % 256 == 0 && kStage % 256 == 0, "swizzled regions need 256-byte alignment");
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

// xmap: the activation [t][kblocks·256] u8 (box 32 x 64, 32-byte swizzle); mmap: the meta
// [t][kblocks·4] f32 (box 4 x 64). Both describe the launch's token range (t tokens from its xq).
template <int kStagesT>
__global__ void __launch_bounds__(kTmaThreads, 1)
    gemm_wgmma_tma_kernel(TiledJobs jobs, GemmPlan plan, const __grid_constant__ CUtensorMap xmap,
                          const __grid_constant__ CUtensorMap mmap, int t, int kblocks) {
#if BONSAI_WGMMA
  using S = GemmSmemT<kStagesT>;
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_trigger();
  constexpr int kR = 32;  // accumulators per set and thread (64 rows x 64 tokens / 128)
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
            tg = lane & 3;
  const int tok0 = blockIdx.x * kGemmTokens;
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
  // Stages from a 256-byte aligned base (the swizzle follows address bits 4 and 7).
  const uint32_t sraw = static_cast<uint32_t>(__cvta_generic_to_shared(smem)),
                 spad = (256u - (sraw & 255u)) & 255u;
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
        bulk_g2s(sbase + slot * S::kStage + lane * S::kCB, wsrc + static_cast<size_t>(kb0 + i) * S::kCB,
                 S::kCB, bar);
    };
    auto load_x = [&](int i) {  // the activation's 8 regions and the meta
      const uint32_t slot = i % kStagesT, bar = full0 + 8 * slot, st = sbase + slot * S::kStage;
      const int r = lane - kBlockTiles;
      if (r >= 0 && r < 8)
        tma_g2s_2d(st + S::kW + r * 2048, &xmap, (kb0 + i) * kActBytes + 32 * r, tok0, bar);
      else if (r == 8)
        tma_g2s_2d(st + S::kW + S::kX, &mmap, (kb0 + i) * 4, tok0, bar);
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
  // The B descriptors (wgmma.cuh wgmma_desc, layout type 3, LBO 16, SBO 256) differ only in the
  // start address field (bits 0-13, address / 16): the low word of region r of slot s is
  // dlo0 + s·kStage/16 + r·128, with no carry out of the field (shared addresses < 2^18); the high
  // word is the constant SBO | type. Computed once here instead of masked and shifted per wgmma.
  static_assert(S::kBytes + S::kBars + 256 <= (1 << 18) && S::kStage % 16 == 0);
  const uint32_t dlo0 = (((sbase + S::kW) & 0x3FFFFu) >> 4) | (1u << 16);
  constexpr uint64_t kDescHi = (static_cast<uint64_t>(256 >> 4) | (3ull << 30)) << 32;
  pdl_wait();  // (the output may still be read by the previous kernel)
  const int tile = wg * 4 + w;
  float acc[kR];  // element 4q + e: row g + 8(e >> 1), token 8q + 2·tg + (e & 1)
#pragma unroll
  for (int i = 0; i < kR; ++i) acc[i] = 0.0f;
  int hs[2][kR], ls[2][kR];  // accumulator sets: Σc·hi, Σc·lo (+ the magic)
  // This warp's two operand buffers [2][64] (after the stages).
  float2* const ops = reinterpret_cast<float2*>(sm + kStagesT * S::kStage) + (wg * 4 + w) * 2 * kGemmTokens;

  auto issue = [&](int i, int set) {
    const int slot = i % kStagesT;
    mbar_wait(full0 + 8 * slot, (i / kStagesT) & 1);
    const uint8_t* chunk = sm + slot * S::kStage + tile * S::kCB;
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
      // Layout type 3 (32-byte swizzle): k-step j of hi in region j, of lo in region 4 + j;
      // 8-token groups 256 B apart (the leading offset is unused).
      const uint64_t dh = kDescHi | (dlo + j * (2048 / 16)), dl = kDescHi | (dlo + (4 + j) * (2048 / 16));
      wgmma_m64n64k32_u8s8(hs[set], a[j], dh, 1);
      wgmma_m64n64k32_u8s8(ls[set], a[j], dl, 1);
    }
    wgmma_commit();
    // While they run: this warp's flush operands of k-block i (two tokens per lane) into buffer
    // i & 1, read by flush(i) in the next half-iteration (__syncwarp there orders the stores).
    const uint8_t* mst = sm + slot * S::kStage + S::kW + S::kX;
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
    const uint32_t sw = *reinterpret_cast<const uint32_t*>(st + tile * S::kCB + kCodeBytes + g * 4);
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

  float* out = job.y;
  if (gridDim.z > 1) out = plan.partial + blockIdx.z * plan.out_start[kMaxJobs] + out0;
#pragma unroll
  for (int e = 0; e < kR; ++e) {
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
