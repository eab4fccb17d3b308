// Ternary matvec on the int8 tensor cores and the activation quantizer. Layouts:
// kernels/cuda/tile_layout.h. The file-layout side (load-time repack, raw matvec for
// small float tensors, embedding gather) is in matvec_raw.cu; the warp-specialized Hopper
// kernel in matvec_ws.cu; the pieces the kernels share in matvec_common.cuh.
#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/knobs.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/matvec_common.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {
namespace {

using namespace mv;  // NOLINT: the kernels' shared constants and helpers

// ---- activation quantization ------------------------------------------------------

__global__ void quantize_kernel(const float* __restrict__ x, uint8_t* __restrict__ xq,
                                float4* __restrict__ meta, int64_t blocks, int kblocks, int64_t k) {
  pdl_trigger();
  pdl_wait();
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (blk >= blocks) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = blk / kblocks, kb = blk % kblocks;
  const float4 v = *reinterpret_cast<const float4*>(x + row * k + kb * kBlockK + lane * 4);
  quantize_block(v, lane, reinterpret_cast<uint32_t*>(xq + blk * kActBytes), meta + blk);
}

// ---- tiled ternary matvec ----------------------------------------------------------------

constexpr int kDepth = 2;  // register-staged path: k-blocks each warp has in flight (2 KB each)

template <int G>
struct Stage {
  uint4 w[kWarpTiles];         // codes of the tiles
  uint32_t sc[kWarpTiles][G];  // scale words of the tiles
  uint4 x[2];                  // this lane's B words (zero for lanes without a column)
  float4 m;                    // {s0, s1, Σq0, Σq1} of the lane's token
};

template <int G>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm)
    matvec_tiled_kernel(TiledJobs jobs, StreamPlan plan, const uint8_t* __restrict__ xq,
                        const float4* __restrict__ meta, int t, int kblocks, float* __restrict__ partial,
                        int* counters) {
  pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int gw = blockIdx.x * kWarps + warp;
  const int u0 = min(gw * plan.per_warp, plan.units), u1 = min(u0 + plan.per_warp, plan.units);
  const int tok0 = blockIdx.y * kTok, ntok = min(kTok, t - tok0);
  constexpr int CB = kCodeBytes + 32 * G;
  const size_t tile_stride = static_cast<size_t>(kblocks) * CB;
  const bool has_x = g < 2 * ntok;
  const uint8_t* xp =
      xq + static_cast<size_t>(tok0 + (has_x ? g >> 1 : 0)) * kblocks * kActBytes + (g & 1) * 128 + tig * 32;
  const float4* mp = meta + static_cast<size_t>(tok0 + min(tig, ntok - 1)) * kblocks;

  // Cursors walk the units without divisions: the load cursor runs kDepth units ahead of
  // the compute cursor. A unit is (job, pair, k-block); jobs start at pair boundaries.
  struct Cursor {
    int job, pair, kb, gpair, next_job;  // next_job: first unit of the following job
    const uint8_t* chunk;                // tile 0 of (pair, kb)
  };
  auto job_w = [&](int j) {  // constant indices only: no local-memory copy of `jobs`
    const uint8_t* w = jobs.job[0].w;
#pragma unroll
    for (int i = 1; i < kMaxJobs; ++i)
      if (i == j) w = jobs.job[i].w;
    return w;
  };
  auto job_start = [&](int j) {
    int v = plan.unit_start[0];
#pragma unroll
    for (int i = 1; i <= kMaxJobs; ++i)
      if (i == j) v = plan.unit_start[i];
    return v;
  };
  auto cursor_at = [&](int u) {
    Cursor c;
    c.job = 0;
#pragma unroll
    for (int i = 1; i < kMaxJobs; ++i)
      if (i < jobs.count && u >= plan.unit_start[i]) c.job = i;
    const int local = u - job_start(c.job);
    c.pair = local / kblocks;
    c.kb = local - c.pair * kblocks;
    c.gpair = u / kblocks;
    c.next_job = job_start(c.job + 1);
    c.chunk = job_w(c.job) + static_cast<size_t>(c.pair) * kWarpTiles * tile_stride +
              static_cast<size_t>(c.kb) * CB;
    return c;
  };
  auto advance = [&](Cursor& c, int u_next) {  // u_next: the unit the cursor moves to
    c.chunk += CB;
    if (++c.kb < kblocks) return;
    c.kb = 0;
    ++c.pair;
    ++c.gpair;
    c.chunk += (kWarpTiles - 1) * tile_stride;  // skip the other tiles of the finished group
    if (u_next == c.next_job) {
      ++c.job;
      c.pair = 0;
      c.next_job = job_start(c.job + 1);
      c.chunk = job_w(c.job);
    }
  };

  Stage<G> st[kDepth];
  auto load_w = [&](Stage<G>& d, const Cursor& c) {
#pragma unroll
    for (int tile = 0; tile < kWarpTiles; ++tile) {
      const uint8_t* chunk = c.chunk + tile * tile_stride;
      d.w[tile] = __ldcs(reinterpret_cast<const uint4*>(chunk + lane * 16));
#pragma unroll
      for (int sub = 0; sub < G; ++sub)
        d.sc[tile][sub] = __ldcs(reinterpret_cast<const unsigned*>(chunk + kCodeBytes + sub * 32 + g * 4));
    }
  };
  auto load_x = [&](Stage<G>& d, int kb) {
    if (has_x) {
      d.x[0] = __ldg(reinterpret_cast<const uint4*>(xp + static_cast<size_t>(kb) * kActBytes));
      d.x[1] = __ldg(reinterpret_cast<const uint4*>(xp + static_cast<size_t>(kb) * kActBytes + 16));
    } else {
      d.x[0] = d.x[1] = make_uint4(0, 0, 0, 0);
    }
    d.m = __ldg(mp + kb);
  };

  Cursor lc = cursor_at(u0), cc = lc;
  int lu = u0;  // next unit to load
  // The weights do not depend on the previous kernel: their first loads go out before the wait.
  int kbs[kDepth];
#pragma unroll
  for (int s = 0; s < kDepth; ++s)
    if (lu < u1) {
      load_w(st[s], lc);
      kbs[s] = lc.kb;
      ++lu;
      advance(lc, lu);
    }
  pdl_wait();
#pragma unroll
  for (int s = 0; s < kDepth; ++s)
    if (u0 + s < u1) load_x(st[s], kbs[s]);

  float acc[kWarpTiles][2] = {};  // [tile][row g, row g + 8] of token tig
  for (int base = u0; base < u1; base += kDepth) {
#pragma unroll
    for (int s = 0; s < kDepth; ++s) {
      const int u = base + s;
      if (u >= u1) break;
      Stage<G>& d = st[s];
      const uint32_t xb[8] = {d.x[0].x, d.x[0].y, d.x[0].z, d.x[0].w, d.x[1].x, d.x[1].y, d.x[1].z, d.x[1].w};
      const int sq0 = __float_as_int(d.m.z), sq1 = __float_as_int(d.m.w);
#pragma unroll
      for (int tile = 0; tile < kWarpTiles; ++tile) {
        const uint32_t wd[4] = {d.w[tile].x, d.w[tile].y, d.w[tile].z, d.w[tile].w};
        // One activation scale per 128 columns (quantize_block): with one weight scale too
        // (G == 1) the four k-steps share one integer accumulator and one flush.
        int c[4] = {0, 0, 0, 0};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t w = wd[q], mask = 0x03030303u;
          mma_u8s8(c, w & mask, (w >> 2) & mask, (w >> 4) & mask, (w >> 6) & mask, xb[2 * q], xb[2 * q + 1]);
          if (G == 2 && q == 1) {  // 64-column weight groups: flush each half
            const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&d.sc[tile][0]));
            acc[tile][0] += static_cast<float>(256 * c[0] + c[1] - sq0) * (dd.x * d.m.x);
            acc[tile][1] += static_cast<float>(256 * c[2] + c[3] - sq0) * (dd.y * d.m.x);
            c[0] = c[1] = c[2] = c[3] = 0;
          }
        }
        const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&d.sc[tile][G - 1]));
        const int sq = G == 2 ? sq1 : sq0 + sq1;
        acc[tile][0] += static_cast<float>(256 * c[0] + c[1] - sq) * (dd.x * d.m.y);
        acc[tile][1] += static_cast<float>(256 * c[2] + c[3] - sq) * (dd.y * d.m.y);
      }
      if (lu < u1) {  // refill the stage just consumed
        load_w(d, lc);
        load_x(d, lc.kb);
        ++lu;
        advance(lc, lu);
      }
      const bool pair_done = cc.kb == kblocks - 1 || u + 1 == u1;
      const Cursor done = cc;
      advance(cc, u + 1);
      if (!pair_done) continue;
      // ---- this warp is done with its share of pair `done` ----
      TiledJob job = jobs.job[0];
#pragma unroll
      for (int i = 1; i < kMaxJobs; ++i)
        if (i == done.job) job = jobs.job[i];
      const int p_lo = done.gpair * kblocks, p_hi = p_lo + kblocks;  // the pair's units
      const int first = p_lo / plan.per_warp, last = (p_hi - 1) / plan.per_warp;
      const int row0 = done.pair * kPairRows;
      float v[2 * kWarpTiles];
#pragma unroll
      for (int i = 0; i < 2 * kWarpTiles; ++i) {
        v[i] = acc[i / 2][i % 2];
        acc[i / 2][i % 2] = 0.0f;
      }
      auto row_of = [&](int i) { return (i / 2) * kTileRows + g + 8 * (i % 2); };
      if (first == last) {  // the whole group was ours
        if (tig < ntok)
#pragma unroll
          for (int i = 0; i < 2 * kWarpTiles; ++i)
            if (row0 + row_of(i) < job.n)
              job.y[static_cast<size_t>(tok0 + tig) * job.n + row0 + row_of(i)] = v[i];
        continue;
      }
      float* slots = partial + (static_cast<size_t>(blockIdx.y) * plan.pairs + done.gpair) * plan.slots *
                                   (kPairRows * kTok);
#pragma unroll
      for (int i = 0; i < 2 * kWarpTiles; ++i)
        slots[(gw - first) * (kPairRows * kTok) + row_of(i) * kTok + tig] = v[i];
      __threadfence();
      __syncwarp();
      int* counter = counters + static_cast<size_t>(blockIdx.y) * plan.pairs + done.gpair;
      int arrived = 0;
      if (lane == 0) arrived = atomicAdd(counter, 1);
      arrived = __shfl_sync(kFullMask, arrived, 0);
      if (arrived != last - first) continue;
      __threadfence();  // every other slot of the group is visible (written before its fence)
#pragma unroll
      for (int rr = 0; rr < kPairRows / 32; ++rr) {
        const int row = rr * 32 + lane;
        if (row0 + row < job.n)
          for (int tok = 0; tok < ntok; ++tok) {
            float sum = 0.0f;
#pragma unroll 4
            for (int r = 0; r <= last - first; ++r)
              sum += __ldcg(slots + r * (kPairRows * kTok) + row * kTok + tok);
            job.y[static_cast<size_t>(tok0 + tok) * job.n + row0 + row] = sum;
          }
      }
      if (lane == 0) *counter = 0;  // ready for the next launch
    }
  }
}

// ---- tiled ternary matvec, Hopper: weights staged by the bulk-copy engine -----------------
// Same work split, numerics and split fix-up as matvec_tiled_kernel (finish_pair; also its
// first-rank and flag-free forms, `fixup`), but a warp's weights
// reach it through a ring of `plan.ring` unit slots in shared memory (one unit: its four
// tiles' chunks of one k-block, 2.1 KB) filled by cp.async.bulk: one instruction per chunk
// instead of one 16-byte load per lane, and up to ring x 2.1 KB per warp (ring 4: 140 KB per
// SM) in flight without holding registers. Each slot has an mbarrier (arrive count 1: lane
// 0's expect_tx; the copies complete the phase). A slot is refilled as soon as the warp has
// read it into registers, before computing on it.

template <int G, bool kEvictFirst>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm)
    matvec_bulk_kernel(TiledJobs jobs, StreamPlan plan, const uint8_t* __restrict__ xq,
                       const float4* __restrict__ meta, int t, int kblocks, float* __restrict__ partial,
                       int* counters, int fixup) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ __align__(8) uint64_t bars[kWarps][kMaxRing];
  pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int gw = blockIdx.x * kWarps + warp;
  const int u0 = min(gw * plan.per_warp, plan.units), u1 = min(u0 + plan.per_warp, plan.units);
  const int tok0 = blockIdx.y * kTok, ntok = min(kTok, t - tok0);
  constexpr int CB = kCodeBytes + 32 * G;
  constexpr int kUnit = kWarpTiles * CB;
  const int R = plan.ring;
  const size_t tile_stride = static_cast<size_t>(kblocks) * CB;
  const uint8_t* my = ring + static_cast<size_t>(warp) * R * kUnit;
  const uint32_t my_s = smem_u32(my), bar0 = smem_u32(&bars[warp][0]);
  if (lane == 0) {
    for (int s = 0; s < R; ++s) mbar_init(bar0 + 8 * s);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  const bool has_x = g < 2 * ntok;
  const uint8_t* xp =
      xq + static_cast<size_t>(tok0 + (has_x ? g >> 1 : 0)) * kblocks * kActBytes + (g & 1) * 128 + tig * 32;
  const float4* mp = meta + static_cast<size_t>(tok0 + min(tig, ntok - 1)) * kblocks;

  struct Cursor {
    int job, pair, kb, gpair, next_job;
    const uint8_t* chunk;  // tile 0 of (pair, kb)
  };
  auto job_w = [&](int j) {
    const uint8_t* w = jobs.job[0].w;
#pragma unroll
    for (int i = 1; i < kMaxJobs; ++i)
      if (i == j) w = jobs.job[i].w;
    return w;
  };
  auto job_start = [&](int j) {
    int v = plan.unit_start[0];
#pragma unroll
    for (int i = 1; i <= kMaxJobs; ++i)
      if (i == j) v = plan.unit_start[i];
    return v;
  };
  auto cursor_at = [&](int u) {
    Cursor c;
    c.job = 0;
#pragma unroll
    for (int i = 1; i < kMaxJobs; ++i)
      if (i < jobs.count && u >= plan.unit_start[i]) c.job = i;
    const int local = u - job_start(c.job);
    c.pair = local / kblocks;
    c.kb = local - c.pair * kblocks;
    c.gpair = u / kblocks;
    c.next_job = job_start(c.job + 1);
    c.chunk = job_w(c.job) + static_cast<size_t>(c.pair) * kWarpTiles * tile_stride +
              static_cast<size_t>(c.kb) * CB;
    return c;
  };
  auto advance = [&](Cursor& c, int u_next) {
    c.chunk += CB;
    if (++c.kb < kblocks) return;
    c.kb = 0;
    ++c.pair;
    ++c.gpair;
    c.chunk += (kWarpTiles - 1) * tile_stride;
    if (u_next == c.next_job) {
      ++c.job;
      c.pair = 0;
      c.next_job = job_start(c.job + 1);
      c.chunk = job_w(c.job);
    }
  };
  auto issue = [&](int slot, const Cursor& c) {
    if (lane == 0) {
      const uint32_t bar = bar0 + 8 * slot, dst = my_s + slot * kUnit;
      mbar_expect(bar, kUnit);
#pragma unroll
      for (int tile = 0; tile < kWarpTiles; ++tile) {
        if constexpr (kEvictFirst)
          bulk_load_evict_first(dst + tile * CB, c.chunk + tile * tile_stride, CB, bar);
        else
          bulk_load(dst + tile * CB, c.chunk + tile * tile_stride, CB, bar);
      }
    }
  };
  auto load_x = [&](XStage& d, int kb) {
    if (has_x) {
      d.x[0] = __ldg(reinterpret_cast<const uint4*>(xp + static_cast<size_t>(kb) * kActBytes));
      d.x[1] = __ldg(reinterpret_cast<const uint4*>(xp + static_cast<size_t>(kb) * kActBytes + 16));
    } else {
      d.x[0] = d.x[1] = make_uint4(0, 0, 0, 0);
    }
    d.m = __ldg(mp + kb);
  };

  Cursor lc = cursor_at(u0), cc = lc;
  int lu = u0;
  // The weights do not depend on the previous kernel: the whole ring is requested before the wait.
  for (int s = 0; s < R && lu < u1; ++s) {
    issue(s, lc);
    ++lu;
    advance(lc, lu);
  }
  pdl_wait();
  XStage xc;
  load_x(xc, cc.kb);
  float acc[kWarpTiles][2] = {};
  int slot = 0;
  uint32_t phase = 0;
  for (int u = u0; u < u1; ++u) {
    XStage xn = xc;
    if (u + 1 < u1) load_x(xn, cc.kb + 1 == kblocks ? 0 : cc.kb + 1);
    mbar_wait(bar0 + 8 * slot, phase);
    uint4 w[kWarpTiles];
    uint32_t sc[kWarpTiles][G];
    const uint8_t* src = my + slot * kUnit;
#pragma unroll
    for (int tile = 0; tile < kWarpTiles; ++tile) {
      w[tile] = *reinterpret_cast<const uint4*>(src + tile * CB + lane * 16);
#pragma unroll
      for (int sub = 0; sub < G; ++sub)
        sc[tile][sub] = *reinterpret_cast<const uint32_t*>(src + tile * CB + kCodeBytes + sub * 32 + g * 4);
    }
    __syncwarp();  // every lane has the slot in registers: it may be overwritten
    if (lu < u1) {
      if (lane == 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue(slot, lc);
      ++lu;
      advance(lc, lu);
    }
    if (++slot == R) {
      slot = 0;
      phase ^= 1;
    }
    unit_dot<G>(acc, w, sc, xc);
    xc = xn;

    const bool pair_done = cc.kb == kblocks - 1 || u + 1 == u1;
    const Cursor done = cc;
    advance(cc, u + 1);
    if (!pair_done) continue;
    // ---- this warp is done with its share of pair `done` ----
    TiledJob job = jobs.job[0];
#pragma unroll
    for (int i = 1; i < kMaxJobs; ++i)
      if (i == done.job) job = jobs.job[i];
    finish_pair(acc, job, done.pair, done.gpair, gw, plan, kblocks, tok0, ntok, partial, counters, fixup);
  }
#else
  __trap();  // launched only on compute capability 9.0 and newer (matvec_tiled)
#endif
}

// Tuning of the matvec, read once per process (the kernel itself: matvec_kernel(),
// matvec_select.cpp): BONSAI_CUDA_MV_RING (1..8, default 3: tg128 +2.3 % over 4 on the H200,
// docs/performance.md "Session 9: decode timeline") unit slots per warp (the ws kernel takes
// fewer where its shared memory would not fit, at least 2);
// BONSAI_CUDA_MV_MIN (default 3 = the ring's depth) the fewest units per warp: a range of up
// to a ring of units is requested whole before the dependency wait anyway, so the small
// launches (the 27B's out-projections: 2 units per warp on 240 blocks before) run on fewer
// blocks and leave SMs free for the site after them, whose cluster then becomes resident
// early (tg128 +1.5 % on the H200: docs/performance.md, "Session 10: matvec plan");
// BONSAI_CUDA_MV_BPS (1..2) blocks per SM; BONSAI_CUDA_MV_RESERVE (0..64, default 0) blocks
// the plan leaves out of its count of SMs x blocks per SM (measured slower: same section).
struct MatvecConfig {
  int ring = 3, min_units = 3;
  int blocks_per_sm = kBlocksPerSm;  // persistent blocks per SM the work is spread over
  int reserve = 0;                   // blocks of that count left free
};

const MatvecConfig& matvec_config() {
  static const MatvecConfig cfg = [] {
    MatvecConfig c;
    // Parsed in kernels/cuda/knobs.cpp (out-of-range values are errors there).
    static_assert(knob::kMvMaxRing == kMaxRing && knob::kMvBlocksPerSm == kBlocksPerSm);
    c.ring = knob::mv_ring();
    c.min_units = knob::mv_min();
    c.blocks_per_sm = knob::mv_bps();
    c.reserve = knob::mv_reserve();
    return c;
  }();
  return cfg;
}

StreamPlan plan_stream(const TiledJobs& jobs, int kblocks, int sm_count, MatvecPlanHint hint) {
  const MatvecConfig& cfg = matvec_config();
  StreamPlan p;
  for (int j = 0; j < jobs.count; ++j) {
    p.pair_start[j] = p.pairs;
    p.unit_start[j] = p.pairs * kblocks;
    p.pairs += static_cast<int>(tiled_pairs(jobs.job[j].n));
  }
  p.pair_start[jobs.count] = p.pairs;
  p.units = p.pairs * kblocks;
  p.unit_start[jobs.count] = p.units;
  const int warps = std::max(1, sm_count * cfg.blocks_per_sm - cfg.reserve - hint.room) * kWarps;
  p.per_warp = std::max({cfg.min_units, hint.min_units, (p.units + warps - 1) / warps});
  p.slots = (kblocks + p.per_warp - 1) / p.per_warp + 1;  // a pair meets at most this many ranges
  p.ring = cfg.ring;
  return p;
}

unsigned stream_blocks(const StreamPlan& p) {
  const int warps = (p.units + p.per_warp - 1) / p.per_warp;
  return blocks_for(warps, kWarps);
}

// Returns the fix-up the launch uses: `fixup` where the kernel has it, the launch allows it
// (first_sums_safe) and, for slots, the sentinel scratch is given (else first); last where not
// (legacy always).
template <int G>
MatvecFixup launch_matvec(const StreamPlan& p, dim3 grid, const TiledJobs& jobs, const uint8_t* xq,
                          const float4* meta, int t, int kblocks, float* partial, int* counters,
                          cudaStream_t s, bool evict_first, MatvecKernel kernel, MatvecFixup fixup,
                          float* slots, int ws_loop) {
  if (fixup == MatvecFixup::slots && slots == nullptr) fixup = MatvecFixup::first;
  int code = fixup == MatvecFixup::slots   ? kFixupSlots
             : fixup == MatvecFixup::first ? kFixupFirst
             : fixup == MatvecFixup::defer ? kFixupDefer
                                           : kFixupLast;
  // The flag-free fix-up's slots live in the sentinel scratch; the others use `partial`.
  auto scratch = [&] { return code == kFixupSlots ? slots : partial; };
  auto used = [&] {
    return code == kFixupSlots   ? MatvecFixup::slots
           : code == kFixupFirst ? MatvecFixup::first
           : code == kFixupDefer ? MatvecFixup::defer
                                 : MatvecFixup::last;
  };
  if (kernel == MatvecKernel::ws) {
    int ws_code = code;
    if (launch_matvec_ws(G, p, grid, jobs, xq, meta, t, kblocks, partial, slots, counters, s, evict_first,
                         matvec_config().blocks_per_sm, ws_code, ws_loop)) {
      code = ws_code;
      return used();
    }
  }
  if (kernel != MatvecKernel::legacy) {  // bulk, or ws whose shared memory does not fit
    const size_t smem = static_cast<size_t>(kWarps) * p.ring * kWarpTiles * chunk_bytes(G);
    auto* k = evict_first ? matvec_bulk_kernel<G, true> : matvec_bulk_kernel<G, false>;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if ((code == kFixupFirst || code == kFixupSlots) && !first_sums_safe(k, grid, kWarps * 32, smem))
      code = kFixupLast;
    launch(k, grid, kWarps * 32, smem, s, jobs, p, xq, meta, t, kblocks, scratch(), counters, code);
    return used();
  }
  launch(matvec_tiled_kernel<G>, grid, kWarps * 32, 0, s, jobs, p, xq, meta, t, kblocks, partial, counters);
  return MatvecFixup::last;
}

}  // namespace

namespace {
// The exact instructions (no constant folding, no contraction): add.rn / mul.rn / fma.rn.f32.
__global__ void fp_ops_probe_kernel(const float* a, const float* b, const float* c, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s, p, f;
  asm volatile("add.rn.f32 %0, %1, %2;" : "=f"(s) : "f"(a[i]), "f"(b[i]));
  asm volatile("mul.rn.f32 %0, %1, %2;" : "=f"(p) : "f"(a[i]), "f"(b[i]));
  asm volatile("fma.rn.f32 %0, %1, %2, %3;" : "=f"(f) : "f"(a[i]), "f"(b[i]), "f"(c[i]));
  out[3 * i] = s;
  out[3 * i + 1] = p;
  out[3 * i + 2] = f;
}
}  // namespace

void fp_ops_probe(const float* a, const float* b, const float* c, float* out, int n, cudaStream_t s) {
  fp_ops_probe_kernel<<<blocks_for(n, 256), 256, 0, s>>>(a, b, c, out, n);
}

void quantize_act(const float* x, uint8_t* xq, float4* meta, int t, int64_t k, cudaStream_t s) {
  const int kblocks = static_cast<int>(k / kBlockK);
  const int64_t blocks = static_cast<int64_t>(t) * kblocks;
  launch(quantize_kernel, blocks_for(blocks, 8), 256, 0, s, x, xq, meta, blocks, kblocks, k);
}

void matvec_tiled_scratch(const TiledJobs& jobs, int t, int64_t k, int sm_count, size_t* partial_floats,
                          size_t* counters, MatvecPlanHint hint) {
  const StreamPlan p = plan_stream(jobs, static_cast<int>(k / kBlockK), sm_count, hint);
  const size_t groups = static_cast<size_t>((t + kTok - 1) / kTok);
  *partial_floats = groups * p.pairs * p.slots * kPairRows * kTok;
  *counters = groups * p.pairs;
}

MatvecFixup matvec_tiled(const TiledJobs& jobs, int groups, const uint8_t* xq, const float4* meta, int t,
                         int64_t k, int sm_count, float* partial, int* counters, cudaStream_t s,
                         bool evict_first, MatvecKernel kernel, MatvecFixup fixup, float* slots,
                         SplitSums* split, int ws_loop, MatvecPlanHint hint) {
  const int kblocks = static_cast<int>(k / kBlockK);
  const StreamPlan p = plan_stream(jobs, kblocks, sm_count, hint);
  const dim3 grid(stream_blocks(p), static_cast<unsigned>((t + kTok - 1) / kTok));
  if (fixup == MatvecFixup::defer && split == nullptr) fixup = MatvecFixup::first;
  const MatvecFixup used = groups == 2
                               ? launch_matvec<2>(p, grid, jobs, xq, meta, t, kblocks, partial, counters, s,
                                                  evict_first, kernel, fixup, slots, ws_loop)
                               : launch_matvec<1>(p, grid, jobs, xq, meta, t, kblocks, partial, counters, s,
                                                  evict_first, kernel, fixup, slots, ws_loop);
  if (used == MatvecFixup::defer)
    for (int j = 0; j < jobs.count; ++j) {  // one plan, each job's groups from its first pair on
      SplitSums& o = split[j];
      o.partial = partial;
      o.y = jobs.job[j].y;
      o.t = t;
      o.n = jobs.job[j].n;
      o.per_warp = p.per_warp;
      o.kblocks = kblocks;
      o.pairs = p.pairs;
      o.slots = p.slots;
      o.pair0 = p.pair_start[j];
    }
  return used;
}

int matvec_ws_ring(int groups, int t, int64_t k) {
  return matvec_ws_slots(groups, matvec_config().ring, t, static_cast<int>(k / kBlockK),
                         matvec_config().blocks_per_sm);
}

bool matvec_kernel_available(MatvecKernel kernel) {
  if (kernel == MatvecKernel::legacy) return true;
  static const bool sm90_code = [] {
    // The bulk and ws kernels have a body only in code built for sm_90+. Compute capability
    // 9.x runs the sm_90a build; a newer GPU runs the portable compute_80 PTX (JIT), whose
    // kernels are __trap() stubs, unless the binary was built for its architecture (ptxVersion).
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (major < 9) return false;
    if (major == 9) return true;
    cudaFuncAttributes fa{};
    const bool ok =
        cudaFuncGetAttributes(&fa, matvec_bulk_kernel<1, false>) == cudaSuccess && fa.ptxVersion >= 90;
    cudaGetLastError();  // a failed query is not an error of the next launch
    return ok;
  }();
  return sm90_code;
}

}  // namespace bonsai::cuda
