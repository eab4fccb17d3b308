// The prefill GEMM on Hopper's warpgroup MMA (wgmma m64n64k32 u8 x s8, sm_90a), included by
// kernels/cuda/gemm.cu after its helpers (GemmPlan, cp_async16, mbarriers). Same block shape
// and plan as gemm_tiled_kernel (128 weight rows x 64 tokens, k ranges over blockIdx.z) and the
// same numerics, element for element: per 128-column k-block the exact integer sums Σc·hi and
// Σc·lo (chains started from the bits of 1.5·2^23), T formed by flush_value, acc += T·(d·s) in
// k-block order. So its output is bit-identical to the mma.sync kernel's.
//
// Layout (verified on the H200: tools/cuda/wgmma_peak.cu against the CPU, and the kernels
// against the mma.sync kernel bit for bit):
// - Two warpgroups, one per row group of 4 tiles (64 rows); warp w of warpgroup wg owns tile
//   4·wg + w, i.e. rows 16w..16w+15 of the warpgroup's wgmma A operand. (NW = 32: four
//   warpgroups, row group x 32-token half.)
// - A (codes, u8) from registers. The wgmma's k order is the activation's stored byte order
//   (below), so for k-step j a lane 4g + t takes the stored code words of lane 4g + j of its
//   chunk, steps t/2 and 2 + t/2, bit pairs of half t & 1 (gather_codes): stored words 8j..8j+7
//   of the activation hold natural columns 32s + 16h + 4j + b, word 8j + 2s + h.
// - B (the 64 tokens' hi or lo bytes, s8) from shared memory. SW = 1 (default): the 32-byte
//   swizzle mode, each token's 32 bytes of a k-step in one 32-byte row (staged below); SW = 0:
//   no swizzle, each 16-byte piece u of a token at (u·64 + token)·16 (core matrices of 8 tokens
//   x 16 bytes; k halves 1 KB apart), which splits every 32-byte sector of a copy into two
//   writes 1 KB apart (ncu counted ~25 excess shared-memory wavefronts per warp copy there); the
//   swizzled staging takes 14 % less time (not re-profiled).
// Pipeline: kStagesW (6) stages of one k-block (the stored chunks, the staged activation, its
// meta) filled by every thread's cp.async and handed over by mbarriers as in the MB kernel.
// Each warpgroup keeps two accumulator sets (hi + lo, 64 registers each): it issues k-block
// i's 8 wgmmas into one set, flushes k-block i-1's set (already complete) while they run, then
// waits; nothing is in flight across the loop's back edge, so ptxas keeps the wgmmas async.
//
// Status (H200, docs/performance.md "Prefill GEMM", wgmma): bit-identical to the mma.sync
// kernel for the same k ranges; all 27B matmuls at t = 512 in 118.6 ms against 103.4 (94-110
// against ~120-128 T weight x token MAC/s), though the same loop without global memory runs
// at 277 T (tools/cuda/wgmma_peak.cu). BONSAI_CUDA_GEMM=wgmma_cp since session 5, when the
// producer-warp kernel (gemm_wgmma_tma.cuh, 102.0 ms) took over `wgmma`. Not the default.
#pragma once

#include "kernels/cuda/wgmma.cuh"

namespace bonsai::cuda {
namespace {

template <int kStagesW>
struct GemmSmemW {
  static constexpr int kCB = kCodeBytes + 32;  // one stored chunk (128-column groups)
  static constexpr int kW = kBlockTiles * kCB;
  static constexpr int kX = kGemmTokens * kActBytes;  // 16 pieces x 64 tokens x 16 B
  static constexpr int kM = kGemmTokens * 16;
  static constexpr int kStage = kW + kX + kM;
  static constexpr int kBytes = kStagesW * kStage;
  static_assert(kW % 16 == 0 && kStage % 16 == 0, "wgmma operands need 16-byte alignment");
};

// A operand of k-step j for lane 4g + t from a stored chunk in shared memory (see above).
__device__ __forceinline__ void gather_codes(uint32_t (&a)[4], const uint8_t* chunk, int g, int t, int j) {
  const uint4 w4 = *reinterpret_cast<const uint4*>(chunk + 16 * (4 * g + j));
  const uint32_t lo = (t >> 1) ? w4.y : w4.x, hi = (t >> 1) ? w4.w : w4.z;
  const int sh = 4 * (t & 1);
  constexpr uint32_t m = 0x03030303u;
  a[0] = (lo >> sh) & m;
  a[1] = (lo >> (sh + 2)) & m;
  a[2] = (hi >> sh) & m;
  a[3] = (hi >> (sh + 2)) & m;
}

// kStagesW: pipeline stages (refills run kStagesW - 2 k-blocks ahead). NW: tokens per
// warpgroup, 64 (two warpgroups, one per row group) or 32 (four: row group x token half; 16 warps
// per SM at half the accumulator registers each).
template <int NW>
__host__ __device__ constexpr int wgmma_threads() {
  return 128 * 2 * (kGemmTokens / NW);
}
// SW = 1: the activation staged for the 32-byte swizzle mode (below) instead of as 16-byte
// core-matrix pieces.
template <int kStagesW, int NW, int SW>
__global__ void __launch_bounds__(wgmma_threads<NW>(), 1)
    gemm_wgmma_kernel(TiledJobs jobs, GemmPlan plan, const uint8_t* __restrict__ xq,
                      const float4* __restrict__ meta, int t, int kblocks) {
#if BONSAI_WGMMA
  using S = GemmSmemW<kStagesW>;
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_trigger();
  constexpr int kThr = wgmma_threads<NW>(), kR = NW / 2;  // threads; accumulators per set
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
            tg = lane & 3;
  const int th = (wg >> 1) * NW;  // this warpgroup's first token in the block
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
  const int tile0 = (rb - bstart) * kBlockTiles;
  const size_t tile_stride = static_cast<size_t>(kblocks) * S::kCB;
  // Stages from a 256-byte aligned base (the swizzle pattern follows address bits 4 and 7).
  const uint32_t sraw = static_cast<uint32_t>(__cvta_generic_to_shared(smem)),
                 spad = (256u - (sraw & 255u)) & 255u;
  const uint32_t sbase = sraw + spad;
  uint8_t* const sm = smem + spad;

  // Straight-line staging as in gemm_tiled_kernel, but the activation is copied token-major.
  constexpr int kWp = S::kW / 16, kChunkPieces = S::kCB / 16;
  constexpr int kWc = (kWp + kThr - 1) / kThr, kXc = kGemmTokens * 16 / kThr;  // copies per thread
  static_assert(kWc <= 2 && kGemmTokens * 16 % kThr == 0 && kThr % 256 == 0);
  const uint8_t* wbase = job.w + static_cast<size_t>(tile0) * tile_stride;
  uint32_t woff[2];
  int wok = 0;
#pragma unroll
  for (int c = 0; c < kWc; ++c) {
    const int p = tid + c * kThr, ti = p / kChunkPieces, piece = p - ti * kChunkPieces;
    const bool ok = p < kWp && tile0 + ti < tiles;
    woff[c] = (ok ? static_cast<uint32_t>(ti) * static_cast<uint32_t>(tile_stride) : 0u) + piece * 16;
    wok |= ok << c;
  }
  // Activation copies: copy j of thread i is piece slot s = i + kThr·j of 1024: token (s % 256)/4,
  // piece 4·(s / 256) + s % 4. A warp's copy writes 8 tokens x 4 pieces: four 128-byte runs, one
  // per bank sweep (a warp of 32 pieces of one token would write 16-byte slots 1 KB apart, all
  // in the same 4 banks), and reads 64 contiguous bytes of each of its 8 tokens (whole sectors).
  const int xtk = (tid & 255) >> 2, xp0 = 4 * (tid >> 8) + (tid & 3);
  constexpr int kXs = 4 * kThr / 256;  // piece step between a thread's copies
  const uint32_t xrow = static_cast<uint32_t>(kblocks) * kActBytes;
  const bool xok = tok0 + xtk < t;  // else token 0's bytes (in bounds), zero-filled
  const uint32_t xoff = (xok ? static_cast<uint32_t>(tok0 + xtk) * xrow : 0u) + xp0 * 16;
  // SW: region r (0..7) holds bytes [32r, 32r + 32) of the 64 tokens' 256-byte records (hi k-steps
  // 0..3, then lo), token n's 32 bytes at (n / 8)·256 + (n % 8)·32 with its two 16-byte halves
  // swapped when bit 2 of n is set (the 32-byte swizzle: address bit 4 ^= bit 7). Thread i copies
  // half i & 1 of token (i / 2) % 64 in regions i / 128 + (kThr / 128)·j: a warp reads 16 whole
  // 32-byte sectors and writes two contiguous 256-byte runs.
  const int sn = (tid >> 1) & 63, sc = tid & 1;
  constexpr int kRs = kThr / 128;
  const bool sok = tok0 + sn < t;
  const uint32_t soff = (sok ? static_cast<uint32_t>(tok0 + sn) * xrow : 0u) + (tid >> 7) * 32 + sc * 16;
  const uint32_t sdst =
      S::kW + (tid >> 7) * 2048 + (sn >> 3) * 256 + (sn & 7) * 32 + ((sc ^ ((sn >> 2) & 1)) * 16);
  const bool mok = tid < kGemmTokens && tok0 + tid < t;
  const uint32_t moff = mok ? static_cast<uint32_t>(tok0 + tid) * kblocks : 0u;
  auto load_stage = [&](int kb, int slot) {
    const uint32_t st = sbase + slot * S::kStage;
    const uint32_t wk = kb * S::kCB;
    if (kWc == 2 || tid < kWp) cp_async16(st + tid * 16, wbase + (woff[0] + wk), (wok & 1) ? 16 : 0);
    if (kWc == 2 && tid < kWp - kThr)
      cp_async16(st + (tid + kThr) * 16, wbase + (woff[1] + wk), (wok & 2) ? 16 : 0);
    const uint32_t xk = kb * kActBytes;
    if constexpr (SW == 1) {
#pragma unroll
      for (int j = 0; j < kXc; ++j)
        cp_async16(st + sdst + j * kRs * 2048, xq + (soff + j * kRs * 32 + xk), sok ? 16 : 0);
    } else {
      const uint32_t xdst = st + S::kW + (xp0 * kGemmTokens + xtk) * 16;
#pragma unroll
      for (int j = 0; j < kXc; ++j)
        cp_async16(xdst + j * kXs * kGemmTokens * 16, xq + (xoff + j * kXs * 16 + xk), xok ? 16 : 0);
    }
    if (tid < kGemmTokens) cp_async16(st + S::kW + S::kX + tid * 16, meta + (moff + kb), mok ? 16 : 0);
  };

  const uint32_t full0 = sbase + S::kBytes, empty0 = full0 + 8 * kStagesW;
  if (tid < kStagesW) {
    mbar_init(full0 + 8 * tid, kThr);
    mbar_init(empty0 + 8 * tid, kThr / 32);
  }
  __syncthreads();

  pdl_wait();  // the activation is the previous kernel's output
  const int n = kb1 - kb0;
#pragma unroll
  for (int s = 0; s < kStagesW - 2; ++s) {
    if (s < n) load_stage(kb0 + s, s);
    mbar_arrive_cp_async(full0 + 8 * s);
  }
  // Iteration i refills the slot of k-block i - 2 (released by every warp's flush of it in
  // iteration i - 1) with k-block i + kStagesW - 2.
  auto refill = [&](int i) {
    if (i + kStagesW - 2 < n) {
      const int rs = (i + kStagesW - 2) % kStagesW;
      if (i >= 2) mbar_wait(empty0 + 8 * rs, ((i - 2) / kStagesW) & 1);
      load_stage(kb0 + i + kStagesW - 2, rs);
      mbar_arrive_cp_async(full0 + 8 * rs);
    }
  };

  const int tile = (wg & 1) * 4 + w;
  float acc[kR];  // element 4q + e: row g + 8(e >> 1), token th + 8q + 2·tg + (e & 1)
#pragma unroll
  for (int i = 0; i < kR; ++i) acc[i] = 0.0f;
  int hs[2][kR], ls[2][kR];  // accumulator sets: Σc·hi, Σc·lo (+ the magic)

  auto issue = [&](int i, int set) {
    const int slot = i % kStagesW;
    mbar_wait(full0 + 8 * slot, (i / kStagesW) & 1);
    fence_proxy_async_smem();  // the stage's cp.async data before the wgmmas' reads
    const uint32_t st = sbase + slot * S::kStage;
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
    const uint32_t xs = st + S::kW + (SW ? th * 32 : th * 16);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // SW: layout type 3 (32-byte swizzle), 8-token groups 256 B apart (the k offset is unused).
      const uint64_t dh = SW ? wgmma_desc(xs + j * 2048, 16, 256) | (3ull << 62)
                             : wgmma_desc(xs + 2 * j * 1024, 1024, 128),
                     dl = SW ? wgmma_desc(xs + (4 + j) * 2048, 16, 256) | (3ull << 62)
                             : wgmma_desc(xs + (8 + 2 * j) * 1024, 1024, 128);
      if constexpr (NW == 64) {
        wgmma_m64n64k32_u8s8(hs[set], a[j], dh, 1);
        wgmma_m64n64k32_u8s8(ls[set], a[j], dl, 1);
      } else {
        wgmma_m64n32k32_u8s8(hs[set], a[j], dh, 1);
        wgmma_m64n32k32_u8s8(ls[set], a[j], dl, 1);
      }
    }
    wgmma_commit();
  };
  // k-block i's set is complete: add its terms (tile_layout.h flush_value), then hand the slot back.
  auto flush = [&](int i, int set) {
    const int slot = i % kStagesW;
    const uint8_t* st = sm + slot * S::kStage;
    const uint32_t sw = *reinterpret_cast<const uint32_t*>(st + tile * S::kCB + kCodeBytes + g * 4);
    const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&sw));  // rows g, g + 8
#pragma unroll
    for (int q = 0; q < NW / 8; ++q)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float4 m =
            *reinterpret_cast<const float4*>(st + S::kW + S::kX + (th + 8 * q + 2 * tg + c) * 16);
        // kMagic + Σq exactly (|Σq| < 2^22): the same float as gemm_tiled_kernel's mq.
        const float mq = __int_as_float(kMagicBits + __float_as_int(m.z) + __float_as_int(m.w));
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

  if (n > 0) {
    refill(0);
    issue(0, 0);
    wgmma_wait<0>();
    for (int i = 1;; ++i) {
      if (i >= n) {
        flush(i - 1, 0);
        break;
      }
      issue(i, 1);
      refill(i);  // after the wgmmas are issued: 5 % faster than before them (H200)
      flush(i - 1, 0);
      wgmma_wait<0>();
      if (++i >= n) {
        flush(i - 1, 1);
        break;
      }
      issue(i, 0);
      refill(i);
      flush(i - 1, 1);
      wgmma_wait<0>();
    }
  }
  cp_wait<0>();

  float* out = job.y;
  if (gridDim.z > 1) out = plan.partial + blockIdx.z * plan.out_start[kMaxJobs] + out0;
#pragma unroll
  for (int e = 0; e < kR; ++e) {
    const int row = (tile0 + tile) * kTileRows + g + 8 * ((e >> 1) & 1);
    const int tok = tok0 + th + 8 * (e >> 2) + 2 * tg + (e & 1);
    if (row < job.n && tok < t) out[static_cast<size_t>(tok) * job.n + row] = acc[e];
  }
#else
  __trap();  // gemm.cu selects this kernel only on compute capability 9.0 (the sm_90a build)
#endif
}

}  // namespace
}  // namespace bonsai::cuda
