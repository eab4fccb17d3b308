// Device side of tools/cuda/persistent_probe.cu (its header comment says what A and B are): B's
// constants and flags, the dots it runs (DotV0 here, the others from probe_dots.cuh), the matvec
// descriptors, the plan, and the persistent kernel itself. Included by persistent_probe.cu only,
// after kernels/cuda/matvec_ws.cu and tools/cuda/probe_dots.cuh.
#pragma once

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matvec_common.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/tile_layout.h"

// Named, not anonymous: the kernel template's arguments are dots of mv's anonymous namespace, and
// nvcc's generated launch stubs cannot name a kernel of one anonymous namespace instantiated on a
// type of another (the two mangle alike: "reference ... is ambiguous").
namespace pk {

using namespace bonsai::cuda;
using namespace bonsai::cuda::mv;

constexpr int kProducers = 2;                         // producer warps, 4 lanes (rings) each
constexpr int kThreads = (kWarps + kProducers) * 32;  // 320
constexpr int kMaxKb = 17408 / kBlockK;               // widest input: 136 k-blocks
constexpr int kCB = kCodeBytes + 32;                  // one chunk, G = 1 (PQ2_0)
constexpr int kUnit = kWarpTiles * kCB;               // one unit: 4 tiles' chunks of a k-block

// Flags of a B launch.
constexpr int kSkipUnits = 1;     // no matvec work (barrier / site cost alone)
constexpr int kSkipSite = 2;      // no quantization either (the barriers alone)
constexpr int kHeavy = 4;         // the norm stand-in + extra block barriers before the quantization
constexpr int kNoCross = 8;       // producers wait for the barrier before a matvec's first unit
constexpr int kNoFixup = 32;      // timing only, wrong outputs: no split fix-up, no y stores
constexpr int kAtomicOut = 64;    // each warp red.add's its partial rows into y (zeroed before the
                                  // launch): no slots, fence, counter or last-arriver sum; the
                                  // order of the additions varies, so the floats are not bitwise
constexpr int kFlow = 128;        // no grid barriers: dataflow (session 14). Outputs by red.add (with
                                  // kAtomicOut), each warp then counts itself on its row group's
                                  // counter; a consumer warp of matvec i + 1 waits only for the two
                                  // row groups its k-block reads (their counters at epoch x ranks),
                                  // quantizes that k-block itself (the site is local: 128 columns)
                                  // and prefetches the next unit's input when it is ready already
constexpr int kFlowNoWait = 256;  // kFlow without the waits (timing only: stale inputs)
constexpr int kNoBarrier = 512;   // timing only: no grid barriers, the consumers run on through the
                                  // matvecs (stale inputs): the stream without any synchronization
constexpr int kNoXs = 1024;       // with kSkipSite: no activation staging in shared memory (the dot
                                  // reads the ring's bytes instead), so deeper rings fit 2 blocks per SM
constexpr int kSiteBatch = 4;     // k-blocks per warp whose loads are in flight together (6: spills)

// B's consumers run one of the probes' dots (tools/cuda/probe_dots.cuh): DotV0 = unit_dot, the
// consumer of session 5 when this probe was written; DotV1 = production's unit_dot_v1 since session
// 7 (the same integers and floats: bitwise equal to A); DotB1<2> = the b1 bit-plane form "Cm" of
// session 10 on the same bytes read as planes (timing only: wrong outputs).
struct DotV0 : DotV1 {
  __device__ explicit DotV0(int l) : DotV1(l) {}
  __device__ void operator()(float (&acc)[kWarpTiles][2], const uint4 (&w)[kWarpTiles],
                             const uint32_t (&sc)[kWarpTiles][1], const X& d) const {
    unit_dot<1>(acc, w, sc, d);
  }
};

struct Mv {          // one matvec of the sequence (B's descriptor, device memory)
  const uint8_t* w;  // tiled [N/64][4 tiles][kblocks][kCB]
  const float* x;    // input [>= K] (first K floats used)
  float* y;          // output [N]
  unsigned* done;    // kFlow: per row group, the warps that have added their share (monotonic)
  int n, kblocks;
  StreamPlan plan;  // the production plan for 2 x SMs blocks (one job)
};

// Same arithmetic as kernels/cuda/matvec.cu's plan_stream (defaults: ring 4, min 1 unit,
// 2 blocks per SM) for a single job.
StreamPlan plan_one(int n, int kblocks, int blocks) {
  StreamPlan p;
  p.pairs = static_cast<int>(tiled_pairs(n));
  p.pair_start[0] = 0;
  p.pair_start[1] = p.pairs;
  p.units = p.pairs * kblocks;
  p.unit_start[0] = 0;
  p.unit_start[1] = p.units;
  const int warps = blocks * kWarps;
  p.per_warp = std::max(1, (p.units + warps - 1) / warps);
  p.slots = (kblocks + p.per_warp - 1) / p.per_warp + 1;
  p.ring = 4;
  return p;
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ bool reached(unsigned v, unsigned target) {
  return static_cast<int>(v - target) >= 0;
}
__device__ __forceinline__ void consumers_sync() {  // the 8 consumer warps only
  asm volatile("bar.sync 1, %0;" ::"n"(kWarps * 32) : "memory");
}
__device__ __forceinline__ long long globaltimer() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned sm_id() {
  unsigned v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}

// Session 15: where the per-matvec wait comes from, and ranges weighted per SM.
struct Tails {
  long long* blk = nullptr;    // [count + 1][blocks]: row i < count = the block's arrival at matvec i's
                               // barrier (globaltimer); row count = its smid | (its slot on the SM) << 16
  const float* cum = nullptr;  // [max smid + 2]: cumulative share of the units per SM (cum[0] = 0, the
                               // last = 1); null = the plan's equal ranges (gw · per_warp)
  unsigned* smc = nullptr;     // [256]: blocks started per SM, never reset (slot = count & 1)
  int stall_ns = 0;            // session 18 (--stall): the consumers idle this long at the start of every
                               // matvec after the first (a site's latency stand-in); the producers run on
};

// Units [u0, u1) of matvec `p` for consumer warp `warp` of the block in slot `slot` of SM `sm`: the
// plan's equal ranges, or (t.cum) the SM's share split evenly over its 2 x 8 warps. Adjacent warps
// compute their common boundary from the same expression, so the ranges tile [0, units) exactly.
__device__ __forceinline__ void unit_range(const StreamPlan& p, const Tails& t, int gw, int sm, int slot,
                                           int warp, int& u0, int& u1) {
  if (t.cum == nullptr) {
    u0 = min(gw * p.per_warp, p.units);
    u1 = min(u0 + p.per_warp, p.units);
    return;
  }
  constexpr int kPerSm = kBlocksPerSm * kWarps;
  const float c0 = t.cum[sm], c1 = t.cum[sm + 1];
  const int lw = slot * kWarps + warp;
  auto at = [&](int j) {
    const float c = j == kPerSm ? c1 : c0 + (c1 - c0) * static_cast<float>(j) / kPerSm;
    return min(p.units, static_cast<int>(static_cast<float>(p.units) * c + 0.5f));
  };
  u0 = at(lw);
  u1 = at(lw + 1);
}

// ---- B: the persistent kernel ------------------------------------------------------------------
// Dynamic shared memory: [ring: 8 warps][R][kUnit] [xq: kMaxKb][256 B] [meta: kMaxKb] float4.
// stamps (block 0, thread 0; may be null): [3 * count + 1] globaltimer values: per matvec i its
// start (barrier passed), the end of its site (quantized input ready), block 0's arrival (its
// units and fix-ups done); then the last barrier passed.
template <class Dot>
__global__ void __launch_bounds__(kThreads, 2)
    persistent_step(const Mv* __restrict__ seq, int count, float* __restrict__ partial, int* counters,
                    unsigned* arrivals, unsigned base, int flags, int extra_bars, int grid_bars, int R,
                    long long* stamps, unsigned epoch, Tails tails) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kWarps][kMaxRing];
  __shared__ __align__(8) uint64_t empty[kWarps][kMaxRing];
  __shared__ float red[kWarps];
  __shared__ int where[2];  // this block's SM and its slot there (Tails)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const unsigned nblocks = gridDim.x;
  uint8_t* xs = (flags & kNoXs) ? smem : smem + kWarps * R * kUnit;
  float4* ms = reinterpret_cast<float4*>(xs + kMaxKb * kActBytes);
  if (threadIdx.x < kWarps * R) {
    mbar_init(smem_u32(&full[threadIdx.x / R][threadIdx.x % R]), 1);
    mbar_init(smem_u32(&empty[threadIdx.x / R][threadIdx.x % R]), 32);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (threadIdx.x == 0) {
    const unsigned sm = sm_id();
    where[0] = static_cast<int>(sm);
    where[1] = tails.smc != nullptr ? static_cast<int>(atomicAdd(tails.smc + sm, 1u) & 1u) : 0;
    if (tails.blk != nullptr)
      tails.blk[static_cast<size_t>(count) * gridDim.x + blockIdx.x] =
          static_cast<long long>(sm) | (static_cast<long long>(where[1]) << 16);
  }
  __syncthreads();
  const int my_sm = where[0], my_slot = where[1];

  if (warp >= kWarps) {  // ---- producer: lane l < 4 of producer p feeds consumer 4p + l ----
    if (flags & kSkipUnits) return;
    const bool feeds = lane < kWarps / kProducers;
    const int c = (warp - kWarps) * (kWarps / kProducers) + (feeds ? lane : 0);
    const int gw = blockIdx.x * kWarps + c;
    const uint32_t full0 = smem_u32(&full[c][0]), empty0 = smem_u32(&empty[c][0]);
    const uint32_t ring0 = smem_u32(smem + c * R * kUnit);
    const uint64_t policy = evict_first_policy();
    // Cursor over matvec i's range of this consumer, then the next matvec's, and so on.
    int i = feeds ? 0 : count, u = 0, u1 = 0, kb = 0, kblocks = 1;
    size_t tile_stride = 0;
    const uint8_t* chunk = nullptr;
    bool unlocked = true;  // kNoCross: matvec i's barrier has been seen
    auto enter = [&] {     // move to the first matvec at or after i with units in this range
      for (; i < count; ++i) {
        const StreamPlan& p = seq[i].plan;
        kblocks = seq[i].kblocks;
        unit_range(p, tails, gw, my_sm, my_slot, c, u, u1);
        if (u >= u1) continue;
        const int gpair = u / kblocks;
        kb = u - gpair * kblocks;
        tile_stride = static_cast<size_t>(kblocks) * kCB;
        chunk =
            seq[i].w + static_cast<size_t>(gpair) * kWarpTiles * tile_stride + static_cast<size_t>(kb) * kCB;
        unlocked = !(flags & kNoCross) || i == 0;
        return;
      }
    };
    enter();
    int slot = 0, issued = 0;
    uint32_t parity = 0;
    for (;;) {
      const bool more = i < count;
      if (!__any_sync(kFullMask, more)) break;
      if (!more) continue;
      if (!unlocked)  // barrier i*grid_bars - 1 (the last before matvec i) complete?
        unlocked = reached(ld_acquire(arrivals), base + static_cast<unsigned>(i * grid_bars) * nblocks);
      if (!unlocked) continue;
      if (issued >= R && !mbar_test(empty0 + 8 * slot, parity)) continue;
      const uint32_t bar = full0 + 8 * slot, dst = ring0 + slot * kUnit;
      mbar_expect(bar, kUnit);
#pragma unroll
      for (int tile = 0; tile < kWarpTiles; ++tile)
        bulk_load_hint(dst + tile * kCB, chunk + tile * tile_stride, kCB, bar, policy);
      ++issued;
      if (++slot == R) {
        slot = 0;
        if (issued > R) parity ^= 1;  // the first round needed no empty phase
      }
      chunk += kCB;
      if (++kb == kblocks) {
        kb = 0;
        chunk += (kWarpTiles - 1) * tile_stride;
      }
      if (++u == u1) {
        ++i;
        enter();
      }
    }
    return;
  }

  // ---- consumer warps ----
  const int g = lane >> 2, tig = lane & 3;
  const int gw = blockIdx.x * kWarps + warp;
  const uint8_t* my = smem + warp * R * kUnit;
  const uint32_t full0 = smem_u32(&full[warp][0]), empty0 = smem_u32(&empty[warp][0]);
  constexpr bool kPlanes = !std::is_same_v<typename Dot::X, XStage>;
  const Dot dot(lane);
  // t = 1: every lane reads token 0's words (b1: the lane's 8 bytes of the block's 256, as planes)
  const uint8_t* xp = kPlanes ? xs + lane * 8 : xs + (g & 1) * 128 + tig * 32;
  const bool rec = stamps != nullptr && blockIdx.x == 0 && threadIdx.x == 0;
  int slot = 0;
  uint32_t phase = 0;
  int bar_j = 0;      // next grid barrier of this launch
  int arrive_i = -1;  // the matvec whose barrier the next arrive() ends (-1: an extra grid barrier)
  auto arrive = [&] {
    consumers_sync();  // every consumer's stores of the phase are issued
    if (threadIdx.x == 0) {
      if (tails.blk != nullptr && arrive_i >= 0)
        tails.blk[static_cast<size_t>(arrive_i) * gridDim.x + blockIdx.x] = globaltimer();
      __threadfence();
      atomicAdd(arrivals, 1u);
    }
  };
  auto wait = [&] {
    if (threadIdx.x == 0) {
      const long long t0 = globaltimer();
      while (!reached(ld_acquire(arrivals), base + static_cast<unsigned>(bar_j + 1) * nblocks))
        if (globaltimer() - t0 > 2000000000ll) __trap();  // 2 s: a deadlock, not a slow phase
    }
    ++bar_j;
    consumers_sync();
  };
  const bool flow = flags & kFlow;
  uint8_t* const wx = xs + warp * kActBytes;  // kFlow: this warp's quantized k-block and its meta
  float4* const wm = ms + warp;
  const uint8_t* const wxp = wx + (kPlanes ? lane * 8 : (g & 1) * 128 + tig * 32);
  // kFlow: whether rows 128·kb .. + 127 of matvec i's output (its row groups 2·kb, 2·kb + 1) are
  // final, i.e. every warp of their split has counted itself (lanes 0 and 1 test one each).
  auto rows_ready = [&](int i, int kb) {
    bool ok = true;
    if (lane < 2 && !(flags & kFlowNoWait)) {
      const Mv& pm = seq[i];
      const int pair = 2 * kb + lane, pw = pm.plan.per_warp;
      const unsigned ranks =
          static_cast<unsigned>(((pair + 1) * pm.kblocks - 1) / pw - pair * pm.kblocks / pw + 1);
      ok = reached(ld_acquire(pm.done + pair), epoch * ranks);
    }
    return __all_sync(kFullMask, ok);
  };
  for (int i = 0; i < count; ++i) {
    if (i > 0 && !flow && !(flags & kNoBarrier)) {
      wait();
      for (int b = 1; b < grid_bars; ++b) {  // extra grid barriers (a site needing a grid phase)
        arrive_i = -1;
        arrive();
        wait();
      }
    }
    if (i > 0 && tails.stall_ns > 0) {  // a site's latency: the consumers wait, the rings keep filling
      const long long t0 = globaltimer();
      while (globaltimer() - t0 < tails.stall_ns) {
      }
    }
    if (rec) stamps[3 * i] = globaltimer();
    const Mv& m = seq[i];
    const StreamPlan& plan = m.plan;
    const int kblocks = m.kblocks;
    if (!(flags & kSkipSite) && !flow) {
      float one = 1.0f;
      if (flags & kHeavy) {  // norm stand-in: Σx² over the whole input, one reduction + barriers
        float ss = 0.0f;
        for (int c = threadIdx.x * 4; c < kblocks * kBlockK; c += kWarps * 32 * 4) {
          const float4 v = __ldcg(reinterpret_cast<const float4*>(m.x + c));
          ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        consumers_sync();
        float tot = 0.0f;
        for (int w = 0; w < kWarps; ++w) tot += red[w];
        for (int b = 0; b < extra_bars; ++b) consumers_sync();  // FWHT-like stages
        one = tot >= 0.0f ? 1.0f : tot;                         // exactly 1: bitwise outputs
        consumers_sync();                                       // red[] reusable
      }
      // The k-blocks this block's units touch (as matvec_ws.cu's staged activation).
      int b0 = 0, b1 = 0, unused = 0;
      unit_range(plan, tails, static_cast<int>(blockIdx.x) * kWarps, my_sm, my_slot, 0, b0, unused);
      unit_range(plan, tails, static_cast<int>(blockIdx.x) * kWarps + kWarps - 1, my_sm, my_slot, kWarps - 1,
                 unused, b1);
      const int nb = b1 - b0;
      int lo0 = 0, len0 = kblocks, len1 = 0;
      if (nb < kblocks) {
        lo0 = b0 % kblocks;
        len0 = min(nb, kblocks - lo0);
        len1 = nb - len0;
      }
      if (flags & kSkipUnits) {  // site cost alone: the whole input, like the largest blocks
        lo0 = 0;
        len0 = kblocks;
        len1 = 0;
      }
      const int nq = len0 + len1;
      auto kb_of = [&](int j) { return j < len0 ? lo0 + j : j - len0; };
      {  // up to kSiteBatch k-blocks' loads in flight per warp: one L2 round trip for most shapes
        for (int j0 = warp; j0 < nq; j0 += kWarps * kSiteBatch) {
          float4 v[kSiteBatch];
#pragma unroll
          for (int b = 0; b < kSiteBatch; ++b)
            if (j0 + b * kWarps < nq)
              v[b] =
                  __ldcg(reinterpret_cast<const float4*>(m.x + kb_of(j0 + b * kWarps) * kBlockK + lane * 4));
#pragma unroll
          for (int b = 0; b < kSiteBatch; ++b)
            if (j0 + b * kWarps < nq) {
              const int kb = kb_of(j0 + b * kWarps);
              v[b].x *= one;
              v[b].y *= one;
              v[b].z *= one;
              v[b].w *= one;
              quantize_block(v[b], lane, reinterpret_cast<uint32_t*>(xs + kb * kActBytes), ms + kb);
            }
        }
      }
      consumers_sync();
    }
    if (rec) stamps[3 * i + 1] = globaltimer();
    if (!(flags & kSkipUnits)) {
      int u0 = 0, u1 = 0;
      unit_range(plan, tails, gw, my_sm, my_slot, warp, u0, u1);
      int gpair = u0 / kblocks, kb = u0 - gpair * kblocks;
      const TiledJob job{m.w, m.y, m.n};
      float acc[kWarpTiles][2] = {};
      float4 vnext{};  // kFlow: the next unit's input floats, when have_next
      bool have_next = false;
      for (int u = u0; u < u1; ++u) {
        typename Dot::X xc;
        if (flow) {  // this unit's k-block: wait for its rows, quantize it in the warp
          float4 v = vnext;
          if (!have_next) {
            if (i > 0)
              while (!rows_ready(i - 1, kb)) {
              }
            v = __ldcg(reinterpret_cast<const float4*>(m.x + kb * kBlockK + lane * 4));
          }
          const int kbn = kb + 1 < kblocks ? kb + 1 : 0;
          have_next = u + 1 < u1 && (i == 0 || rows_ready(i - 1, kbn));
          if (have_next) vnext = __ldcg(reinterpret_cast<const float4*>(m.x + kbn * kBlockK + lane * 4));
          quantize_block(v, lane, reinterpret_cast<uint32_t*>(wx), wm);
          __syncwarp();
          Dot::load_plain(xc, wxp, wm, 0);
          __syncwarp();  // the staging is rewritten by the next unit
        } else {
          Dot::load_plain(xc, xp, ms, kb);
        }
        mbar_wait(full0 + 8 * slot, phase);
        const uint8_t* src = my + slot * kUnit;
        uint4 w[kWarpTiles];
        uint32_t sc[kWarpTiles][1];
#pragma unroll
        for (int tile = 0; tile < kWarpTiles; ++tile) {
          w[tile] = *reinterpret_cast<const uint4*>(src + tile * kCB + lane * 16);
          sc[tile][0] = *reinterpret_cast<const uint32_t*>(src + tile * kCB + kCodeBytes + g * 4);
        }
        mbar_arrive(empty0 + 8 * slot);  // release: the slot's loads are done
        dot(acc, w, sc, xc);
        if (++slot == R) {
          slot = 0;
          phase ^= 1;
        }
        if (++kb < kblocks && u + 1 < u1) continue;
        dot.finish(acc);
        if (flags & kAtomicOut) {  // t = 1: lanes tig == 0 hold token 0's rows g, g + 8 of each tile
          if (tig == 0)
#pragma unroll
            for (int t2 = 0; t2 < kWarpTiles; ++t2) {
              atomicAdd(m.y + gpair * kPairRows + t2 * kTileRows + g, acc[t2][0]);
              atomicAdd(m.y + gpair * kPairRows + t2 * kTileRows + g + 8, acc[t2][1]);
            }
          if (flow) {  // every lane's adds performed before lane 0 counts the warp in
            __threadfence();
            __syncwarp();
            if (lane == 0) atomicAdd(m.done + gpair, 1u);
          }
#pragma unroll
          for (int t2 = 0; t2 < kWarpTiles; ++t2) acc[t2][0] = acc[t2][1] = 0.0f;
          kb = 0;
          ++gpair;
          continue;
        }
        if (flags & kNoFixup) {  // keep the math alive, skip the fix-up's round trips
          if (acc[0][0] == 12345.0f) m.y[gpair] = acc[1][1];
#pragma unroll
          for (int t2 = 0; t2 < kWarpTiles; ++t2) acc[t2][0] = acc[t2][1] = 0.0f;
          kb = 0;
          ++gpair;
          continue;
        }
        finish_pair(acc, job, gpair, gpair, gw, plan, kblocks, 0, 1, partial, counters);
        kb = 0;
        ++gpair;
      }
    }
    arrive_i = i;
    if (!flow) arrive();
    if (rec) stamps[3 * i + 2] = globaltimer();
  }
  if (rec) {
    while (!reached(ld_acquire(arrivals), base + static_cast<unsigned>(bar_j + 1) * nblocks)) {
    }
    stamps[3 * count] = globaltimer();
  }
#else
  __trap();  // sm_90 only (the bulk copies and mbarriers of matvec_common.cuh)
#endif
}
}  // namespace pk
