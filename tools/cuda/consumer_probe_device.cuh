// Device side of tools/cuda/consumer_probe.cu (the header comment there says what each variant is):
// the consumer loop templated on the dot (the dots: probe_dots.cuh), the timed and verification
// kernels, the MMA and clock rate kernels.
// Included by consumer_probe.cu only (after kernels/cuda/matvec_ws.cu); also its constants and CK.
#pragma once

#include "tools/cuda/probe_ck.h"
#include "tools/cuda/probe_dots.cuh"

namespace bonsai::cuda::mv {
namespace {

constexpr int kRing = 3;                          // slots per consumer warp (production default)
constexpr int kChunk = kCodeBytes + 32;           // one tile's chunk at G = 1
constexpr int kUnitBytes = kWarpTiles * kChunk;   // 2176
constexpr int kProbeThreads = (kWarps + 2) * 32;  // production block: 8 consumers + 2 producers
constexpr int kKblocks = 40;                      // K = 5120

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// ---- the consumer loop: consume_v1's, with the dot a parameter, M x 4 tiles per slot ----------
template <class Dot, int M, bool kBare>
__device__ __forceinline__ void consume_copy(const uint8_t* my, uint32_t full0, uint32_t empty_off, int R,
                                             const TiledJobs& jobs, const StreamPlan& plan,
                                             const uint8_t* __restrict__ xrow,
                                             const float4* __restrict__ mrow, int u0, int u1, int gw,
                                             int kblocks, float* __restrict__ partial, int* counters) {
  constexpr int kUnit = M * kUnitBytes;
  const int lane = threadIdx.x & 31, g = lane >> 2;
  const Dot dot(lane);
  const uint8_t* const wbase = my + lane * 16;
  const uint8_t* wsrc = wbase;
  const int soff = kCodeBytes + g * 4 - lane * 16;
  uint32_t bar = full0;
  const uint32_t bar_end = full0 + 8 * R;
  uint32_t phase = 0;
  int gpair = u0 / kblocks, kb = u0 - gpair * kblocks;
  float acc[M][kWarpTiles][2] = {};
  typename Dot::X xn;
  if (u0 < u1) Dot::load(xn, xrow, mrow, kb);
  for (int u = u0; u < u1; ++u) {
    const typename Dot::X xc = xn;
    if constexpr (!kBare) mbar_wait(bar, phase);
    uint4 w[M][kWarpTiles];
    uint32_t sc[M][kWarpTiles][1];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int tile = 0; tile < kWarpTiles; ++tile) {
        w[m][tile] = *reinterpret_cast<const uint4*>(wsrc + (m * kWarpTiles + tile) * kChunk);
        sc[m][tile][0] = *reinterpret_cast<const uint32_t*>(wsrc + soff + (m * kWarpTiles + tile) * kChunk);
      }
    if constexpr (!kBare) mbar_arrive(bar + empty_off);
    Dot::load(xn, xrow, mrow, kb + 1 == kblocks ? 0 : kb + 1);
#pragma unroll
    for (int m = 0; m < M; ++m) dot(acc[m], w[m], sc[m], xc);
    wsrc += kUnit;
    bar += 8;
    if (bar == bar_end) {
      wsrc = wbase;
      bar = full0;
      phase ^= 1;
    }
    if (++kb < kblocks && u + 1 < u1) continue;
    int job = 0;
#pragma unroll
    for (int i = 1; i < kMaxJobs; ++i)
      if (i < jobs.count && gpair >= plan.pair_start[i]) job = i;
    TiledJob jb = jobs.job[0];
    int pair0 = plan.pair_start[0];
#pragma unroll
    for (int i = 1; i < kMaxJobs; ++i)
      if (i == job) {
        jb = jobs.job[i];
        pair0 = plan.pair_start[i];
      }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      dot.finish(acc[m]);
      finish_pair(acc[m], jb, M * (gpair - pair0) + m, M * gpair + m, gw, plan, kblocks, 0, 1, partial,
                  counters, kFixupFirst);
    }
    kb = 0;
    ++gpair;
  }
}
#endif

enum Variant { kA, kAp, kA2, kAbare, kB, kC4, kC6, kCm, kCmBare, kD8, kDCm8, kVariants };
const char* const kNames[kVariants] = {
    "A   production consume_v1",     "Ap  A + 2 polling producers", "A'  copy, unit_dot_v1",
    "Ab  copy, no mbarrier ops",     "B   copy, no decode",         "C4  b1, 4 x k128 per tile",
    "C6  b1, 6 x k128 per tile",     "Cm  b1, 2 x (k256 + k128)",   "Cmb Cm, no mbarrier ops",
    "D8  unit_dot_v1, 8 tiles/slot", "DCm Cm, 8 tiles/slot"};
constexpr int kTilesPerSlot[kVariants] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2};  // x 4 tiles
constexpr bool kBits[kVariants] = {false, false, false, false, false, true, true, true, true, false, true};

struct ProbeArgs {
  const uint8_t* ring;     // [kWarps][R][M·2176 B]: every block's rings start as this
  const uint8_t* xq;       // [kblocks][256 B]: production activation (token 0)
  const uint8_t* xbits;    // [kblocks][32 lanes][2 words]: bit planes
  const float4* meta;      // [kblocks]
  TiledJobs jobs;          // job 0: y, n
  StreamPlan plan;         // per_warp huge: every warp covers its row groups whole (y stores)
  int per_warp, kblocks;   // units per warp of the timed range (a multiple of kblocks)
  long long* clk;          // [blocks·8][2]: SM clock at the consumer's start / end
  unsigned long long* ns;  // [2]: globaltimer of block 0 warp 0 at start / end
};

template <int V>
__global__ void __launch_bounds__(kProbeThreads, kBlocksPerSm) probe_kernel(ProbeArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int M = kTilesPerSlot[V];
  constexpr int kUnit = M * kUnitBytes;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kWarps][kMaxRing];
  __shared__ __align__(8) uint64_t idle;  // Ap: the producers' poll target (never completes)
  __shared__ int done;                    // Ap: consumer warps finished
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int ring_bytes = kWarps * kRing * kUnit;
  for (int i = threadIdx.x; i < ring_bytes / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(smem)[i] = reinterpret_cast<const uint4*>(a.ring)[i];
  if (threadIdx.x < kWarps * kRing) {
    mbar_init(smem_u32(&full[threadIdx.x / kRing][threadIdx.x % kRing]), 32);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (threadIdx.x == kWarps * kRing) {
    mbar_init(smem_u32(&idle), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    done = 0;
  }
  __syncthreads();
  if (warp >= kWarps) {  // no producers; Ap: they poll as production's do while the ring is full
    if constexpr (V == kAp)
      for (;;) {
        const bool more = *reinterpret_cast<volatile int*>(&done) < kWarps;
        if (!__any_sync(kFullMask, more)) break;
        if (more && mbar_test(smem_u32(&idle), 0)) break;
      }
    return;
  }
  for (int s = 0; s < kRing; ++s) mbar_arrive(smem_u32(&full[warp][s]));  // phase 0 complete
  __syncwarp();
  const int gw = blockIdx.x * kWarps + warp;
  const int u0 = gw * a.per_warp, u1 = u0 + a.per_warp;
  const uint8_t* my = smem + warp * kRing * kUnit;
  const uint32_t full0 = smem_u32(&full[warp][0]);
  constexpr bool kPlanes = kBits[V];
  const uint8_t* xrow = kPlanes ? a.xbits + lane * 8 : a.xq + (g & 1) * 128 + tig * 32;
  long long c0 = clock64();
  unsigned long long t0 = 0;
  if (blockIdx.x == 0 && threadIdx.x == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if constexpr (V == kA || V == kAp)
    consume_v1<1, false>(my, full0, 0, kRing, a.jobs, a.plan, xrow, a.meta, u0, u1, gw, a.kblocks, 0, 1,
                         a.jobs.job[0].y, nullptr, kFixupFirst);
  else if constexpr (V == kA2)
    consume_copy<DotV1, 1, false>(my, full0, 0, kRing, a.jobs, a.plan, xrow, a.meta, u0, u1, gw, a.kblocks,
                                  a.jobs.job[0].y, nullptr);
  else if constexpr (V == kAbare)
    consume_copy<DotV1, 1, true>(my, full0, 0, kRing, a.jobs, a.plan, xrow, a.meta, u0, u1, gw, a.kblocks,
                                 a.jobs.job[0].y, nullptr);
  else if constexpr (V == kB)
    consume_copy<DotRaw, 1, false>(my, full0, 0, kRing, a.jobs, a.plan, xrow, a.meta, u0, u1, gw, a.kblocks,
                                   a.jobs.job[0].y, nullptr);
  else if constexpr (V == kC4)
    consume_copy<DotB1<0>, 1, false>(my, full0, 0, kRing, a.jobs, a.plan, xrow, a.meta, u0, u1, gw, a.kblocks,
                                     a.jobs.job[0].y, nullptr);
  else if constexpr (V == kC6)
    consume_copy<DotB1<1>, 1, false>(my, full0, 0, kRing, a.jobs, a.plan, xrow, a.meta, u0, u1, gw, a.kblocks,
                                     a.jobs.job[0].y, nullptr);
  else if constexpr (V == kCm)
    consume_copy<DotB1<2>, 1, false>(my, full0, 0, kRing, a.jobs, a.plan, xrow, a.meta, u0, u1, gw, a.kblocks,
                                     a.jobs.job[0].y, nullptr);
  else if constexpr (V == kCmBare)
    consume_copy<DotB1<2>, 1, true>(my, full0, 0, kRing, a.jobs, a.plan, xrow, a.meta, u0, u1, gw, a.kblocks,
                                    a.jobs.job[0].y, nullptr);
  else if constexpr (V == kD8)
    consume_copy<DotV1, 2, false>(my, full0, 0, kRing, a.jobs, a.plan, xrow, a.meta, u0, u1, gw, a.kblocks,
                                  a.jobs.job[0].y, nullptr);
  else
    consume_copy<DotB1<2>, 2, false>(my, full0, 0, kRing, a.jobs, a.plan, xrow, a.meta, u0, u1, gw, a.kblocks,
                                     a.jobs.job[0].y, nullptr);
  const long long c1 = clock64();
  __syncwarp();
  if (lane == 0) atomicAdd(&done, 1);
  if (lane == 0) {
    a.clk[2 * gw] = c0;
    a.clk[2 * gw + 1] = c1;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    a.ns[0] = t0;
    a.ns[1] = t1;
  }
#endif
}

// One warp per (row group, k-block) of a tiled weight [pairs][4 tiles][kblocks][544 B]: the dot's
// integer of each row (T) and its float for this one block (Y), from global memory.
template <class Dot, bool kBitsX>
__global__ void verify_kernel(const uint8_t* w, const uint8_t* x, const float4* meta, int kblocks, int* T,
                              float* Y) {
  const int pair = blockIdx.x / kblocks, kb = blockIdx.x % kblocks;
  const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const Dot dot(lane);
  typename Dot::X d;
  Dot::load(d, kBitsX ? x + lane * 8 : x + (g & 1) * 128 + tig * 32, meta, kb);
  uint4 wr[kWarpTiles];
  uint32_t sc[kWarpTiles][1];
  for (int tile = 0; tile < kWarpTiles; ++tile) {
    const uint8_t* c = w + ((static_cast<size_t>(pair) * kWarpTiles + tile) * kblocks + kb) * kChunk;
    wr[tile] = *reinterpret_cast<const uint4*>(c + lane * 16);
    sc[tile][0] = *reinterpret_cast<const uint32_t*>(c + kCodeBytes + g * 4);
    int v[2];
    dot.tile_int(wr[tile], d, v);
    if (tig == 0)
      for (int r = 0; r < 2; ++r) T[(pair * kPairRows + tile * kTileRows + g + 8 * r) * kblocks + kb] = v[r];
  }
  float acc[kWarpTiles][2] = {};
  dot(acc, wr, sc, d);
  dot.finish(acc);
  if (tig == 0)
    for (int tile = 0; tile < kWarpTiles; ++tile)
      for (int r = 0; r < 2; ++r)
        Y[(pair * kPairRows + tile * kTileRows + g + 8 * r) * kblocks + kb] = acc[tile][r];
}

// Raw MMA rate: CH independent chains per warp, iters x 4 x CH MMAs.
template <int Kind, int CH>
__global__ void mma_rate(int iters, int* out) {
  const uint32_t a0 = threadIdx.x, a1 = threadIdx.x * 3u, a2 = threadIdx.x * 5u, a3 = threadIdx.x * 7u;
  const uint32_t b0 = threadIdx.x * 11u, b1 = threadIdx.x * 13u;
  int d[CH][4] = {};
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        if constexpr (Kind == 0) mma_u8s8(d[c], a0, a1, a2, a3, b0 + s, b1);
        if constexpr (Kind == 1) mma_b1_k128(d[c], a0, a1, b0 + s);
        if constexpr (Kind == 2) mma_b1_k256(d[c], a0, a1, a2, a3, b0 + s, b1);
      }
  int sum = 0;
#pragma unroll
  for (int c = 0; c < CH; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) sum += d[c][e];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

__global__ void clock_rate(unsigned long long spin_ns, double* ghz) {
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  while (t1 - t0 < spin_ns);
  const long long c1 = clock64();
  *ghz = static_cast<double>(c1 - c0) / static_cast<double>(t1 - t0);
}

}  // namespace
}  // namespace bonsai::cuda::mv
