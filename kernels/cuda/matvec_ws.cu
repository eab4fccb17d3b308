// Ternary matvec, Hopper, warp-specialized (BONSAI_CUDA_MV=ws; kernels/cuda/launch.h).
//
// Same plan (unit ranges per warp), per-row summation order and split fix-up as the bulk
// kernel of matvec.cu, so the results are bit-identical; what changes is who does the
// bookkeeping. The bulk kernel's 8 warps each walk a load cursor over their units, issue their
// own bulk copies from lane 0 (divergent), fence and wait. Here a block is 8 consumer warps +
// P producer warps (BONSAI_CUDA_MV_WS, matvec_ws_variant: default 2; docs/performance.md,
// "Warp-specialized matvec", for what each variant measured):
//   - producer lane l (< 8 / P) of producer warp p walks the unit range of consumer warp
//     c = p·(8 / P) + l with one cursor and keeps its ring of R unit slots full (4 bulk copies
//     of one 16-row x 128-column chunk per unit, L2 evict-first); the lanes share one
//     instruction stream, one instruction serving 8 / P rings. Each lane polls its own
//     consumer's next empty barrier (non-blocking), so a slow consumer does not hold back the
//     others' refills. The first R units of every ring are requested before
//     griddepcontrol.wait (the weights do not depend on the previous kernel).
//   - consumer warp c waits on full[c][slot], reads the unit (LDS), arrives on
//     empty[c][slot], and runs unit_dot with the activation words it loaded from global
//     memory during the unit before (prefetch); at the end of a row group it runs the same
//     finish_pair as the bulk kernel.
//   Variant 4 instead copies the block's activation (xq + meta of its token group, the
//   k-blocks its units touch) into shared memory once, after the wait, by one bulk copy.
//
// Ring protocol (per consumer c and slot s; both barriers live for the whole launch):
//   full[c][s]:  arrive count 1 = the producer lane's arrive.expect_tx(unit bytes); the four
//                copies' complete_tx finish the phase. The consumer's j-th use of slot s
//                (unit i = j·R + s of its range) waits for phase parity j & 1.
//   empty[c][s]: arrive count 32 = every consumer lane once it has read the slot (its arrive
//                is a release: its shared loads are done before it counts). The producer's
//                refill number j >= 1 of slot s waits for phase parity (j - 1) & 1.
// Every consumer warp waits for all of its units (and the staged activation) before it exits,
// so no bulk copy is in flight when the block's shared memory is released.
//
// Shared memory: [ring: 8 warps][R][unit: 4 chunks of 512 + 32·G bytes]
//                (variant 4: + [xq: ntok][kblocks][256 B] [meta: ntok][kblocks] float4, ntok <= kTok)
// e.g. R = 4, G = 1: 69632 B; 2 blocks per SM (~96 registers, 320 threads).
#include <cuda_runtime.h>

#include "kernels/cuda/matvec_common.cuh"

namespace bonsai::cuda::mv {

// Variants of the protocol (BONSAI_CUDA_MV_WS, a bit mask, default kTwoProducers; all
// bit-identical; launch.h, matvec_ws_variant):
inline constexpr int kArriveLate = 1;    // consumers release a slot after its math, not once it is read
inline constexpr int kLockstep = 2;      // a producer's lanes wait for their slots together (blocking)
inline constexpr int kStageX = 4;        // the activation staged in shared memory by bulk copy
inline constexpr int kTwoProducers = 8;  // two producer warps of 4 lanes each
inline constexpr int kXNoPrefetch = 16;  // (global activation) each unit's words loaded at its start,
                                         // not during the unit before

namespace {

constexpr int kMaxWsThreads = (kWarps + 2) * 32;  // 8 consumer warps + 1 or 2 producer warps

constexpr int unit_bytes(int groups) { return kWarpTiles * (kCodeBytes + 32 * groups); }

// Dynamic shared memory of a launch: R-slot rings for the 8 consumers + the staged activation.
size_t ws_smem(int groups, int ring, int t, int kblocks, int flags) {
  const int ntok = t < kTok ? t : kTok;
  const size_t x = flags & kStageX ? static_cast<size_t>(ntok) * kblocks * (kActBytes + sizeof(float4)) : 0;
  return static_cast<size_t>(kWarps) * ring * unit_bytes(groups) + x;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Non-blocking: whether the phase of the given parity has completed.
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// unit_dot with fewer instructions per 32-bit code word (the consumer loop of kLoop 1): the
// four A registers of one k32 step are v & 0x03.., v & 0x0C.., h & 0x03.., h & 0x0C.. with
// h = v >> 4: 1 shift + 4 LOP3 instead of 3 shifts + 4 ANDs. The two registers of rows g + 8
// (a1, a3) then hold 4x the codes (0, 4, 8, 12: still u8), so C rows g + 8 (c[2], c[3]) are
// exactly 4x unit_dot's (integer sums, no rounding): multiples of 4 with |c| <= 4 · 128 · 3 ·
// 128 = 196608 (at most 128 columns of codes <= 3 against s8 bytes), so 256·c2 + c3 stays
// below 2^26 and (256·c2 + c3) >> 2 (arithmetic shift of a multiple of 4) is unit_dot's integer.
// So every float conversion, product and sum below is unit_dot's, in the same order:
// bit-identical results (tests: CudaMatvecKernels.WsLoopsMatchBitwise).
template <int G>
__device__ __forceinline__ void unit_dot_v1(float (&acc)[kWarpTiles][2], const uint4 (&w)[kWarpTiles],
                                            const uint32_t (&sc)[kWarpTiles][G], const XStage& d) {
  const uint32_t xb[8] = {d.x[0].x, d.x[0].y, d.x[0].z, d.x[0].w, d.x[1].x, d.x[1].y, d.x[1].z, d.x[1].w};
  const int sq0 = __float_as_int(d.m.z), sq1 = __float_as_int(d.m.w);
#pragma unroll
  for (int tile = 0; tile < kWarpTiles; ++tile) {
    const uint32_t wd[4] = {w[tile].x, w[tile].y, w[tile].z, w[tile].w};
    int c[4] = {0, 0, 0, 0};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t v = wd[q], h = v >> 4;
      mma_u8s8(c, v & 0x03030303u, v & 0x0C0C0C0Cu, h & 0x03030303u, h & 0x0C0C0C0Cu, xb[2 * q],
               xb[2 * q + 1]);
      if (G == 2 && q == 1) {  // 64-column weight groups: flush each half
        const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&sc[tile][0]));
        acc[tile][0] += static_cast<float>(256 * c[0] + c[1] - sq0) * (dd.x * d.m.x);
        acc[tile][1] += static_cast<float>(((256 * c[2] + c[3]) >> 2) - sq0) * (dd.y * d.m.x);
        c[0] = c[1] = c[2] = c[3] = 0;
      }
    }
    const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&sc[tile][G - 1]));
    const int sq = G == 2 ? sq1 : sq0 + sq1;
    acc[tile][0] += static_cast<float>(256 * c[0] + c[1] - sq) * (dd.x * d.m.y);
    acc[tile][1] += static_cast<float>(((256 * c[2] + c[3]) >> 2) - sq) * (dd.y * d.m.y);
  }
}

// The consumer loop of kLoop 1 (BONSAI_CUDA_MV_LOOP=1; the protocol of the default variant:
// activation from global memory, prefetched one unit ahead, slot released once read), the
// same units, waits, releases, products and sums as the kLoop 0 loop in the kernel below,
// with less bookkeeping per unit:
//   - the ring walked by a slot pointer and its full barrier's 32-bit address, both advanced
//     by a constant and reset at the ring's end (no slot · unit-size multiply, no re-derived
//     barrier address); the empty barrier at a fixed offset from the full one;
//   - the next unit's activation words loaded unconditionally (no flag or range test): past
//     the range's end it reads k-block (kb + 1) mod kblocks of the same row (in bounds), unused;
//   - unit_dot_v1's decode.
// my: this warp's ring (slot 0); full0: full[warp][0]; empty_off: empty[c][s] - full[c][s] in
// bytes; xrow / mrow: this lane's activation words / meta at k-block 0 (the kLoop 0 loop's xg / mg).
template <int G, bool kSlots>
__device__ __forceinline__ void consume_v1(const uint8_t* my, uint32_t full0, uint32_t empty_off, int R,
                                           const TiledJobs& jobs, const StreamPlan& plan,
                                           const uint8_t* __restrict__ xrow, const float4* __restrict__ mrow,
                                           int u0, int u1, int gw, int kblocks, int tok0, int ntok,
                                           float* __restrict__ partial, int* counters, int fixup) {
  constexpr int CB = kCodeBytes + 32 * G;
  constexpr int kUnit = kWarpTiles * CB;
  const int lane = threadIdx.x & 31, g = lane >> 2;
  const uint8_t* const wbase = my + lane * 16;  // this lane's code words, slot 0
  const uint8_t* wsrc = wbase;
  const int soff = kCodeBytes + g * 4 - lane * 16;  // this lane's scale word, from wsrc
  uint32_t bar = full0;
  const uint32_t bar_end = full0 + 8 * R;
  uint32_t phase = 0;
  int gpair = u0 / kblocks, kb = u0 - gpair * kblocks;
  float acc[kWarpTiles][2] = {};
  auto load_x = [&](XStage& d, int k) {
    d.x[0] = __ldg(reinterpret_cast<const uint4*>(xrow + k * kActBytes));
    d.x[1] = __ldg(reinterpret_cast<const uint4*>(xrow + k * kActBytes + 16));
    d.m = __ldg(mrow + k);
  };
  XStage xn;
  if (u0 < u1) load_x(xn, kb);
  for (int u = u0; u < u1; ++u) {
    const XStage xc = xn;
    mbar_wait(bar, phase);
    uint4 w[kWarpTiles];
    uint32_t sc[kWarpTiles][G];
#pragma unroll
    for (int tile = 0; tile < kWarpTiles; ++tile) {
      w[tile] = *reinterpret_cast<const uint4*>(wsrc + tile * CB);
#pragma unroll
      for (int sub = 0; sub < G; ++sub)
        sc[tile][sub] = *reinterpret_cast<const uint32_t*>(wsrc + soff + tile * CB + sub * 32);
    }
    mbar_arrive(bar + empty_off);                // release: waits for the loads above
    load_x(xn, kb + 1 == kblocks ? 0 : kb + 1);  // the next unit's words
    unit_dot_v1<G>(acc, w, sc, xc);
    wsrc += kUnit;
    bar += 8;
    if (bar == bar_end) {
      wsrc = wbase;
      bar = full0;
      phase ^= 1;
    }
    if (++kb < kblocks && u + 1 < u1) continue;
    // ---- this warp is done with its share of global row group gpair ----
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
    finish_pair(acc, jb, gpair - pair0, gpair, gw, plan, kblocks, tok0, ntok, partial, counters,
                kSlots                 ? kFixupSlots
                : fixup == kFixupDefer ? kFixupDefer
                                       : fixup & kFixupFirst);
    kb = 0;
    ++gpair;
  }
}
#endif

// kSlots: the instantiation for the flag-free fix-up (finish_pair, kFixupSlots); the others run
// kFixupFirst / kFixupLast only. Separate so that the flag-free path's registers do not cost the
// other instantiations a spill at the 96-register budget (they compile as before; the kSlots
// ones: no spill at G = 1, 4 bytes at G = 2, ptxas -v).
template <int G, bool kEvictFirst, bool kSlots, int kLoop>
__global__ void __launch_bounds__(kMaxWsThreads, kBlocksPerSm)
    matvec_ws_kernel(TiledJobs jobs, StreamPlan plan, const uint8_t* __restrict__ xq,
                     const float4* __restrict__ meta, int t, int kblocks, float* __restrict__ partial,
                     int* counters, int flags, int fixup) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kWarps][kMaxRing];
  __shared__ __align__(8) uint64_t empty[kWarps][kMaxRing];
  __shared__ __align__(8) uint64_t xbar;
  pdl_trigger();
  constexpr int CB = kCodeBytes + 32 * G;  // one chunk: 16 rows x 128 columns
  constexpr int kUnit = kWarpTiles * CB;   // one unit: the 4 tiles' chunks of one k-block
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int R = plan.ring;
  const int tok0 = blockIdx.y * kTok, ntok = min(kTok, t - tok0);
  const uint32_t xbytes = static_cast<uint32_t>(ntok * kblocks * kActBytes);
  const uint8_t* xs = smem + kWarps * R * kUnit;                    // [ntok][kblocks][256 B]
  const float4* ms = reinterpret_cast<const float4*>(xs + xbytes);  // [ntok][kblocks]
  const bool xglobal = !(flags & kStageX);
  if (threadIdx.x < kWarps * R) {  // one thread per (consumer, slot); the next one the activation's
    mbar_init(smem_u32(&full[threadIdx.x / R][threadIdx.x % R]), 1);
    mbar_init(smem_u32(&empty[threadIdx.x / R][threadIdx.x % R]), 32);
  } else if (threadIdx.x == kWarps * R) {
    mbar_init(smem_u32(&xbar), 1);
  }
  if (threadIdx.x <= kWarps * R) asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();

  if (warp >= kWarps) {  // ---- producer: lane l of producer p feeds consumer warp p·per + l ----
    const int per = flags & kTwoProducers ? kWarps / 2 : kWarps;  // consumers per producer
    const bool feeds = lane < per;
    const int c = (warp - kWarps) * per + (feeds ? lane : 0);
    const int gw = blockIdx.x * kWarps + c;
    const int u0 = min(gw * plan.per_warp, plan.units);
    const int u1 = feeds ? min(u0 + plan.per_warp, plan.units) : u0;
    const size_t tile_stride = static_cast<size_t>(kblocks) * CB;
    // Cursor over the range: unit u = (global pair, k-block); jobs start at pair boundaries.
    int job = 0;
#pragma unroll
    for (int i = 1; i < kMaxJobs; ++i)
      if (i < jobs.count && u0 >= plan.unit_start[i]) job = i;
    const uint8_t* jw = jobs.job[0].w;
    int job_pair0 = plan.pair_start[0], next_pair0 = plan.pair_start[1];
#pragma unroll
    for (int i = 1; i < kMaxJobs; ++i)
      if (i == job) {
        jw = jobs.job[i].w;
        job_pair0 = plan.pair_start[i];
        next_pair0 = plan.pair_start[i + 1];
      }
    int gpair = u0 / kblocks, kb = u0 - gpair * kblocks;
    const uint8_t* chunk = jw + static_cast<size_t>(gpair - job_pair0) * kWarpTiles * tile_stride +
                           static_cast<size_t>(kb) * CB;  // tile 0 of (pair, kb)
    auto advance = [&] {
      chunk += CB;
      if (++kb < kblocks) return;
      kb = 0;
      chunk += (kWarpTiles - 1) * tile_stride;  // skip the other tiles of the finished group
      if (++gpair == next_pair0) {              // the next job's first group
        ++job;
#pragma unroll
        for (int i = 1; i < kMaxJobs; ++i)
          if (i == job) {
            chunk = jobs.job[i].w;
            next_pair0 = plan.pair_start[i + 1];
          }
      }
    };
    const uint32_t full0 = smem_u32(&full[c][0]), empty0 = smem_u32(&empty[c][0]);
    const uint32_t ring0 = smem_u32(smem + c * R * kUnit);
    uint64_t policy = 0;
    if constexpr (kEvictFirst) policy = evict_first_policy();
    auto issue = [&](int slot) {
      const uint32_t bar = full0 + 8 * slot, dst = ring0 + slot * kUnit;
      mbar_expect(bar, kUnit);
#pragma unroll
      for (int tile = 0; tile < kWarpTiles; ++tile) {
        if constexpr (kEvictFirst)
          bulk_load_hint(dst + tile * CB, chunk + tile * tile_stride, CB, bar, policy);
        else
          bulk_load(dst + tile * CB, chunk + tile * tile_stride, CB, bar);
      }
      advance();
    };
    int u = u0;
    for (int s = 0; s < R && u < u1; ++s, ++u) issue(s);  // before the wait: weights only
    pdl_wait();
    if (warp == kWarps && lane == 0 &&
        !xglobal) {  // the activation of this token group, written by the previous kernel
      // Only the k-blocks the block's units touch: its range b0..b1 covers k-blocks
      // b0 % kblocks .. in one piece, or two when it wraps into the next row group.
      const int b0 = min(static_cast<int>(blockIdx.x) * kWarps * plan.per_warp, plan.units);
      const int nb = min(b0 + kWarps * plan.per_warp, plan.units) - b0;
      int lo[2] = {0, 0}, len[2] = {kblocks, 0};
      if (nb < kblocks) {
        lo[0] = b0 % kblocks;
        len[0] = min(nb, kblocks - lo[0]);
        len[1] = nb - len[0];  // wrapped: k-blocks 0 .. len[1] - 1
      }
      const uint32_t bar = smem_u32(&xbar);
      mbar_expect(bar, static_cast<uint32_t>(ntok * (len[0] + len[1]) * (kActBytes + sizeof(float4))));
      for (int tok = 0; tok < ntok; ++tok)
#pragma unroll
        for (int p = 0; p < 2; ++p)
          if (len[p] > 0) {
            const size_t kb0 = static_cast<size_t>(tok) * kblocks + lo[p];  // in the group
            const size_t src = static_cast<size_t>(tok0) * kblocks + kb0;   // in the launch
            bulk_load(smem_u32(xs + kb0 * kActBytes), xq + src * kActBytes, len[p] * kActBytes, bar);
            bulk_load(smem_u32(ms + kb0), meta + src, len[p] * sizeof(float4), bar);
          }
    }
    int slot = 0;
    uint32_t parity = 0;
    if (flags & kLockstep) {
      for (; u < u1; ++u) {  // refill each slot as soon as its consumer has released it
        mbar_wait(empty0 + 8 * slot, parity);
        issue(slot);
        if (++slot == R) {
          slot = 0;
          parity ^= 1;
        }
      }
      return;
    }
    // Each lane polls its own consumer's next slot, so that a slower consumer does not hold
    // back the refills of the others (a blocking wait would suspend the whole warp).
    for (;;) {
      const bool more = u < u1;
      if (!__any_sync(kFullMask, more)) break;
      if (more && mbar_test(empty0 + 8 * slot, parity)) {
        issue(slot);
        ++u;
        if (++slot == R) {
          slot = 0;
          parity ^= 1;
        }
      }
    }
    return;
  }

  // ---- consumer warp ----
  const int g = lane >> 2, tig = lane & 3;
  const int gw = blockIdx.x * kWarps + warp;
  const int u0 = min(gw * plan.per_warp, plan.units), u1 = min(u0 + plan.per_warp, plan.units);
  pdl_wait();  // y and the split scratch may still be read or written by the previous kernel
  if constexpr (kLoop == 1) {
    consume_v1<G, kSlots>(smem + warp * R * kUnit, smem_u32(&full[warp][0]),
                          smem_u32(&empty[0][0]) - smem_u32(&full[0][0]), R, jobs, plan,
                          xq + static_cast<size_t>(tok0 + (g < 2 * ntok ? g >> 1 : 0)) * kblocks * kActBytes +
                              (g & 1) * 128 + tig * 32,
                          meta + static_cast<size_t>(tok0 + min(tig, ntok - 1)) * kblocks, u0, u1, gw,
                          kblocks, tok0, ntok, partial, counters, fixup);
    return;
  }
  if (!xglobal) mbar_wait(smem_u32(&xbar), 0);
  // This lane's B words: token g / 2 (hi or lo half); lanes past the group's tokens read token
  // 0's words instead of zeros: their B column feeds only C columns 2·tig, 2·tig + 1 of tokens
  // tig >= ntok, which no lane stores and the fix-up never reads.
  const uint8_t* xp = xs + (g < 2 * ntok ? g >> 1 : 0) * kblocks * kActBytes + (g & 1) * 128 + tig * 32;
  const float4* mp = ms + min(tig, ntok - 1) * kblocks;
  const uint8_t* xg = xq + static_cast<size_t>(tok0 + (g < 2 * ntok ? g >> 1 : 0)) * kblocks * kActBytes +
                      (g & 1) * 128 + tig * 32;  // the same words in global memory (kXGlobal)
  const float4* mg = meta + static_cast<size_t>(tok0 + min(tig, ntok - 1)) * kblocks;
  const uint8_t* my = smem + warp * R * kUnit;
  const uint32_t full0 = smem_u32(&full[warp][0]), empty0 = smem_u32(&empty[warp][0]);
  int gpair = u0 / kblocks, kb = u0 - gpair * kblocks;
  float acc[kWarpTiles][2] = {};
  int slot = 0;
  uint32_t phase = 0;
  auto load_xg = [&](XStage& d, int k) {
    d.x[0] = __ldg(reinterpret_cast<const uint4*>(xg + k * kActBytes));
    d.x[1] = __ldg(reinterpret_cast<const uint4*>(xg + k * kActBytes + 16));
    d.m = __ldg(mg + k);
  };
  // The next unit's activation words are loaded during this unit's math: loaded right before
  // the release below, they would be waited for there (the arrive orders this thread's earlier
  // loads before it counts).
  const bool prefetch = xglobal && !(flags & kXNoPrefetch);
  XStage xn;
  if (prefetch && u0 < u1) load_xg(xn, kb);
  for (int u = u0; u < u1; ++u) {
    XStage xc;
    if (prefetch)
      xc = xn;
    else if (xglobal)
      load_xg(xc, kb);  // in flight while the weights are awaited
    mbar_wait(full0 + 8 * slot, phase);
    const uint8_t* src = my + slot * kUnit;
    uint4 w[kWarpTiles];
    uint32_t sc[kWarpTiles][G];
#pragma unroll
    for (int tile = 0; tile < kWarpTiles; ++tile) {
      w[tile] = *reinterpret_cast<const uint4*>(src + tile * CB + lane * 16);
#pragma unroll
      for (int sub = 0; sub < G; ++sub)
        sc[tile][sub] = *reinterpret_cast<const uint32_t*>(src + tile * CB + kCodeBytes + sub * 32 + g * 4);
    }
    if (!xglobal) {
      xc.x[0] = *reinterpret_cast<const uint4*>(xp + kb * kActBytes);
      xc.x[1] = *reinterpret_cast<const uint4*>(xp + kb * kActBytes + 16);
      xc.m = mp[kb];
    }
    if (!(flags & kArriveLate)) mbar_arrive(empty0 + 8 * slot);  // release: waits for the loads above
    if (prefetch && u + 1 < u1) load_xg(xn, kb + 1 == kblocks ? 0 : kb + 1);
    unit_dot<G>(acc, w, sc, xc);
    if (flags & kArriveLate) mbar_arrive(empty0 + 8 * slot);
    if (++slot == R) {
      slot = 0;
      phase ^= 1;
    }
    if (++kb < kblocks && u + 1 < u1) continue;
    // ---- this warp is done with its share of global row group gpair ----
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
    finish_pair(acc, jb, gpair - pair0, gpair, gw, plan, kblocks, tok0, ntok, partial, counters,
                kSlots                 ? kFixupSlots
                : fixup == kFixupDefer ? kFixupDefer
                                       : fixup & kFixupFirst);
    kb = 0;
    ++gpair;
  }
#else
  __trap();  // launched only on compute capability 9.x (matvec_kernel_available)
#endif
}

// Shared-memory limits of the device and the kernels' static shared memory, read once.
struct WsLimits {
  size_t per_sm = 0, per_block = 0, reserved = 0, static_bytes = 0;
};

const WsLimits& ws_limits() {
  static const WsLimits lim = [] {
    WsLimits l;
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    l.per_sm = static_cast<size_t>(v);
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    l.per_block = static_cast<size_t>(v);
    cudaDeviceGetAttribute(&v, cudaDevAttrReservedSharedMemoryPerBlock, dev);
    l.reserved = static_cast<size_t>(v);
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, matvec_ws_kernel<2, true, false, 0>) == cudaSuccess)
      l.static_bytes = fa.sharedSizeBytes;
    cudaGetLastError();  // a failed query is not an error of the next launch
    return l;
  }();
  return lim;
}

}  // namespace

int matvec_ws_slots(int groups, int ring, int t, int kblocks, int blocks_per_sm) {
  const WsLimits& l = ws_limits();
  const int flags = matvec_ws_variant();
  // Fewer slots than asked for rather than no ws kernel (the ring depth barely matters at
  // 2..6, docs/performance.md), but at least 2 so that a refill overlaps a unit's math.
  for (int r = ring; r >= 2; --r) {
    const size_t dyn = ws_smem(groups, r, t, kblocks, flags);
    if (dyn <= l.per_block && blocks_per_sm * (dyn + l.static_bytes + l.reserved) <= l.per_sm) return r;
  }
  return 0;
}

bool launch_matvec_ws(int groups, const StreamPlan& p, dim3 grid, const TiledJobs& jobs, const uint8_t* xq,
                      const float4* meta, int t, int kblocks, float* partial, float* slots, int* counters,
                      cudaStream_t s, bool evict_first, int blocks_per_sm, int& fixup, int loop) {
  StreamPlan plan = p;
  plan.ring = matvec_ws_slots(groups, p.ring, t, kblocks, blocks_per_sm);
  if (plan.ring == 0) return false;
  const int flags = matvec_ws_variant();
  const size_t smem = ws_smem(groups, plan.ring, t, kblocks, flags);
  // The kLoop 1 consumer loop has only the default protocol's consumer side (global activation,
  // prefetched, early release); the other variants run the kLoop 0 loop.
  const bool v1 = loop == 1 && !(flags & (kArriveLate | kStageX | kXNoPrefetch));
  auto pick = [&](bool slot_kernel) {
    using K =
        void (*)(TiledJobs, StreamPlan, const uint8_t*, const float4*, int, int, float*, int*, int, int);
    const K table[2][2][2][2] = {
        // [loop][groups == 2][evict_first][slot_kernel]
        {{{matvec_ws_kernel<1, false, false, 0>, matvec_ws_kernel<1, false, true, 0>},
          {matvec_ws_kernel<1, true, false, 0>, matvec_ws_kernel<1, true, true, 0>}},
         {{matvec_ws_kernel<2, false, false, 0>, matvec_ws_kernel<2, false, true, 0>},
          {matvec_ws_kernel<2, true, false, 0>, matvec_ws_kernel<2, true, true, 0>}}},
        {{{matvec_ws_kernel<1, false, false, 1>, matvec_ws_kernel<1, false, true, 1>},
          {matvec_ws_kernel<1, true, false, 1>, matvec_ws_kernel<1, true, true, 1>}},
         {{matvec_ws_kernel<2, false, false, 1>, matvec_ws_kernel<2, false, true, 1>},
          {matvec_ws_kernel<2, true, false, 1>, matvec_ws_kernel<2, true, true, 1>}}}};
    return table[v1][groups == 2][evict_first][slot_kernel];
  };
  const int threads = (kWarps + (flags & kTwoProducers ? 2 : 1)) * 32;
  auto* kernel = pick(fixup == kFixupSlots);
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  // The deferred fix-up waits for nothing: any grid may take it.
  if ((fixup == kFixupFirst || fixup == kFixupSlots) && !first_sums_safe(kernel, grid, threads, smem)) {
    fixup = kFixupLast;
    kernel = pick(false);
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  }
  launch(kernel, grid, threads, smem, s, jobs, plan, xq, meta, t, kblocks,
         fixup == kFixupSlots ? slots : partial, counters, flags, fixup);
  return true;
}

}  // namespace bonsai::cuda::mv
