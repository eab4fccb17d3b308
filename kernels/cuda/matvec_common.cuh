// Pieces shared by the ternary matvec kernels (kernels/cuda/matvec.cu: register-staged and
// bulk-ring kernels; kernels/cuda/matvec_ws.cu: the warp-specialized kernel): the work plan,
// the tensor-core dot product of one unit, the split fix-up, and the mbarrier / bulk-copy
// wrappers. Layouts: kernels/cuda/tile_layout.h.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda::mv {

inline constexpr int kWarps = 8;  // (consumer) warps per block: the plan's unit ranges
inline constexpr int kTok = 4;    // tokens per pass: B columns 2i, 2i+1 are token i's hi, lo
inline constexpr int kBlocksPerSm = 2;
inline constexpr int kMaxRing = 8;  // bulk / ws paths: most unit slots per warp

// Persistent streaming: the (pair, k-block) units of all jobs, pair-major, are cut into
// one contiguous range of `per_warp` units per warp (a single wave of blocks). A warp
// streams its range and, at each pair it finishes, writes y directly (it covered the whole
// pair) or a partial sum into slot (pair, its rank among the pair's warps); the last of
// those warps to arrive adds the slots in rank order (deterministic) and resets the pair's
// counter. Unit u of the launch is global pair u / kblocks, k-block u % kblocks.
struct StreamPlan {
  int per_warp = 0, units = 0, pairs = 0, slots = 0;  // slots: most warps sharing one pair
  int ring = 0;                                       // bulk / ws paths: unit slots per warp
  int unit_start[kMaxJobs + 1] = {};
  int pair_start[kMaxJobs + 1] = {};
};

// This lane's activation words of one 128-column block.
struct XStage {
  uint4 x[2];  // this lane's B words (zero for lanes without a column)
  float4 m;    // {s0, s1, Σq0, Σq1} of the lane's token
};

__device__ __forceinline__ void mma_u8s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// acc[tile][row g, row g + 8] (token tig) += one unit: four tiles' chunks of one k-block.
template <int G>
__device__ __forceinline__ void unit_dot(float (&acc)[kWarpTiles][2], const uint4 (&w)[kWarpTiles],
                                         const uint32_t (&sc)[kWarpTiles][G], const XStage& d) {
  const uint32_t xb[8] = {d.x[0].x, d.x[0].y, d.x[0].z, d.x[0].w, d.x[1].x, d.x[1].y, d.x[1].z, d.x[1].w};
  const int sq0 = __float_as_int(d.m.z), sq1 = __float_as_int(d.m.w);
#pragma unroll
  for (int tile = 0; tile < kWarpTiles; ++tile) {
    const uint32_t wd[4] = {w[tile].x, w[tile].y, w[tile].z, w[tile].w};
    // One activation scale per 128 columns (quantize_block): with one weight scale too
    // (G == 1) the four k-steps share one integer accumulator and one flush.
    int c[4] = {0, 0, 0, 0};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t v = wd[q], mask = 0x03030303u;
      mma_u8s8(c, v & mask, (v >> 2) & mask, (v >> 4) & mask, (v >> 6) & mask, xb[2 * q], xb[2 * q + 1]);
      if (G == 2 && q == 1) {  // 64-column weight groups: flush each half
        const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&sc[tile][0]));
        acc[tile][0] += static_cast<float>(256 * c[0] + c[1] - sq0) * (dd.x * d.m.x);
        acc[tile][1] += static_cast<float>(256 * c[2] + c[3] - sq0) * (dd.y * d.m.x);
        c[0] = c[1] = c[2] = c[3] = 0;
      }
    }
    const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&sc[tile][G - 1]));
    const int sq = G == 2 ? sq1 : sq0 + sq1;
    acc[tile][0] += static_cast<float>(256 * c[0] + c[1] - sq) * (dd.x * d.m.y);
    acc[tile][1] += static_cast<float>(256 * c[2] + c[3] - sq) * (dd.y * d.m.y);
  }
}

// Release / acquire at GPU scope on a split counter (sm_70+; finish_pair's first-rank fix-up).
__device__ __forceinline__ void red_release_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Relaxed (strong, GPU-scope) word accesses of the flag-free fix-up (finish_pair, kFixupSlots):
// no ordering beyond the one location, but never served from a stale L1 line nor merged or
// hoisted by the compiler (volatile), so a poll sees the word's writes in coherence order.
__device__ __forceinline__ float ld_relaxed(const float* p) {
  float v;
  asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed(float* p, float v) {
  asm volatile("st.relaxed.gpu.global.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}

// The split fix-up a launch of the bulk / ws kernel runs (finish_pair's `fixup`).
inline constexpr int kFixupLast = 0, kFixupFirst = 1, kFixupSlots = 2, kFixupDefer = 3;
// An empty slot word of the flag-free fix-up: 0xFFFFFFFF, a NaN that no FP arithmetic of sm_70+
// returns (FADD / FMUL / FFMA give the canonical NaN 0x7FFFFFFF for NaN results, whatever the
// NaN inputs; CudaMatvecKernels.FixupsMatchBitwise checks that on the device), so a sum that
// is really NaN is never taken for an empty word. A byte memset of 0xFF writes it.
inline constexpr uint32_t kSlotEmpty = 0xFFFFFFFFu;

// Rank 0's wait for one slot word (flag-free fix-up): v, the word as first loaded, reloaded
// until it holds a sum.
__device__ __forceinline__ float await_slot(const float* p, float v) {
  while (__float_as_uint(v) == kSlotEmpty) v = ld_relaxed(p);
  return v;
}

// The warp (global index gw, lanes g = lane / 4, tig = lane % 4) is done with its share of
// global row group `gpair` (group `pair` of job `job`); acc holds its sums over that share
// and is reset. The warp writes y itself when its range covered the whole group; otherwise the
// group is split between the warps first..last (rank = gw - first) and summed in rank order,
// starting from 0 (deterministic: the three fix-ups below give the same floats):
//   last-arriver (kFixupLast): every rank stores its sums in the group's slot of its
//     rank, fences and counts itself in the group's counter (atomicAdd, waiting for the old
//     value); the last to arrive adds the slots 0..nr-1 into y and resets the counter.
//   first-rank (kFixupFirst): ranks > 0 store their slot and count themselves with a
//     release, without waiting for a value; rank 0 stores its slot without a fence, waits
//     (acquire loads) until the counter reaches nr - 1 and adds the slots 0..nr-1 into y (the
//     same loop, the same floats) and resets the counter.
//   flag-free (kFixupSlots; `partial` is then the sentinel scratch: every word kSlotEmpty
//     before the launch, and the launch leaves it so): ranks > 0 store their slot words of the
//     group's ntok tokens (relaxed) and go on, with no fence and no counter. Rank 0 stores its
//     own slot, loads the words of slots 0..nr-1 it sums (relaxed; 8 ranks' words in flight),
//     reloads only those still kSlotEmpty until they hold a sum, adds them in rank order (the
//     same floats again) and stores kSlotEmpty back into every word it read.
//     Why this is enough under the PTX memory model: each slot word is written once per launch,
//     by one thread, and its value is its own flag; rank 0 needs nothing but that word (no
//     other data is published with it), so single-location coherence of morally strong
//     (relaxed, .gpu) accesses suffices: a poll that reads a value other than kSlotEmpty reads
//     the writer's store (the only other write to the word before the reset, since the
//     launch began with kSlotEmpty there and kernel boundaries order launches), and rank 0's
//     reset, after that read in program order, follows the writer's store in the word's
//     coherence order, so the word ends kSlotEmpty. The next launch's writers store only after
//     griddepcontrol.wait, i.e. after this grid has completed and its memory is flushed (as
//     for the counters). A sum that is NaN (a NaN or Inf input) is the canonical NaN, never
//     kSlotEmpty. Rank 0's own slot is read by its own lanes after the warp barrier.
//   deferred (kFixupDefer): every rank, 0 included, stores its slot ([4 tokens][64 rows], not
//     the others' [64 rows][4 tokens]: the consumer reads a token's rows contiguously) and
//     goes on: no fence, no counter, no wait. The consumer, which runs after this grid has
//     completed, adds the slots (launch.h, SplitSums).
//   first-rank and flag-free: rank 0's range *ends* in the group's first k-blocks, so it
//     meets the group last in its life, while ranks > 0 meet it first in theirs: the wait is
//     usually short. But rank 0 spins on warps of later blocks, so the launch must have every
//     block resident at once (one wave, one token group): the launcher checks that
//     (first_sums_safe) and otherwise passes kFixupLast. Waits never go the other way (a warp
//     waits only for warps of higher index, and only at its range's end), so with every block
//     resident the highest waiting warp always progresses.
__device__ __forceinline__ void finish_pair(float (&acc)[kWarpTiles][2], const TiledJob& job, int pair,
                                            int gpair, int gw, const StreamPlan& plan, int kblocks, int tok0,
                                            int ntok, float* __restrict__ partial, int* counters,
                                            int fixup = kFixupLast) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int p_lo = gpair * kblocks, p_hi = p_lo + kblocks;  // the group's units
  const int first = p_lo / plan.per_warp, last = (p_hi - 1) / plan.per_warp;
  const int row0 = pair * kPairRows;
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
    return;
  }
  float* slots =
      partial + (static_cast<size_t>(blockIdx.y) * plan.pairs + gpair) * plan.slots * (kPairRows * kTok);
  int* counter = counters + static_cast<size_t>(blockIdx.y) * plan.pairs + gpair;
  const int nr = last - first + 1, rank = gw - first;
  constexpr int S = kPairRows * kTok;  // floats per slot
  if (fixup == kFixupDefer) {
    if (tig < ntok)
#pragma unroll
      for (int i = 0; i < 2 * kWarpTiles; ++i) slots[rank * S + tig * kPairRows + row_of(i)] = v[i];
    return;
  }
  if (fixup == kFixupSlots) {
    if (rank > 0) {
      if (tig < ntok)
#pragma unroll
        for (int i = 0; i < 2 * kWarpTiles; ++i) st_relaxed(slots + rank * S + row_of(i) * kTok + tig, v[i]);
      return;
    }
    if (tig < ntok)
#pragma unroll
      for (int i = 0; i < 2 * kWarpTiles; ++i) slots[row_of(i) * kTok + tig] = v[i];
    __syncwarp();  // this warp's slot-0 stores before its lanes' loads below
    for (int tok = 0; tok < ntok; ++tok) {
      float* p0 = slots + lane * kTok + tok;  // row lane
      float* p1 = p0 + 32 * kTok;             // row 32 + lane
      float s0 = 0.0f, s1 = 0.0f;
      for (int r0 = 0; r0 < nr; r0 += 8) {
        float a[8] = {}, b[8] = {};
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (r0 + j < nr) {
            a[j] = ld_relaxed(p0 + (r0 + j) * S);
            b[j] = ld_relaxed(p1 + (r0 + j) * S);
          }
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (r0 + j < nr) {
            s0 += await_slot(p0 + (r0 + j) * S, a[j]);
            s1 += await_slot(p1 + (r0 + j) * S, b[j]);
          }
      }
      if (row0 + lane < job.n) job.y[static_cast<size_t>(tok0 + tok) * job.n + row0 + lane] = s0;
      if (row0 + 32 + lane < job.n) job.y[static_cast<size_t>(tok0 + tok) * job.n + row0 + 32 + lane] = s1;
      const float empty = __uint_as_float(kSlotEmpty);
      for (int r = 0; r < nr; ++r) {  // every word this lane read, ready for the next launch
        st_relaxed(p0 + r * S, empty);
        st_relaxed(p1 + r * S, empty);
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 2 * kWarpTiles; ++i) slots[rank * S + row_of(i) * kTok + tig] = v[i];
  if (fixup == kFixupFirst) {
    if (rank > 0) {
      // Publish: the warp barrier orders every lane's slot stores before lane 0's reduction
      // (bar.warp.sync guarantees memory ordering among the participating threads), and a
      // release is cumulative: rank 0's acquire that reads this count (or a later one in the
      // counter's modification order, which holds only reductions) then sees all 32 lanes'
      // stores. A reduction returns nothing, so the warp does not wait for an L2 round trip
      // for the count; it still waits, at the release, for its stores to be performed.
      __syncwarp();
      if (lane == 0) red_release_add(counter, 1);
      return;
    }
    // Rank 0 stored its own slot above without a fence: only this warp reads it, after the
    // warp barrier below (which orders the lanes' stores before the other lanes' loads). Kept
    // in registers instead (gathered by shuffles), the sums cost the G = 2 ws kernel a
    // spill at its 96-register budget, or half the loads in flight below.
    if (lane == 0)
      while (ld_acquire(counter) != nr - 1) {
      }
    __syncwarp();  // every lane's loads below are ordered after lane 0's acquire
  } else {
    __threadfence();
    __syncwarp();
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(counter, 1);
    arrived = __shfl_sync(kFullMask, arrived, 0);
    if (arrived != nr - 1) return;
    __threadfence();  // every other slot of the group is visible (written before its fence)
  }
  // Each lane sums rows lane and 32 + lane over the slots in rank order (deterministic),
  // the two rows' loads interleaved so that many are in flight.
  for (int tok = 0; tok < ntok; ++tok) {
    float s0 = 0.0f, s1 = 0.0f;
    const float* sl = slots + tok;
#pragma unroll 8
    for (int r = 0; r < nr; ++r) {
      s0 += __ldcg(sl + r * S + lane * kTok);
      s1 += __ldcg(sl + r * S + (32 + lane) * kTok);
    }
    if (row0 + lane < job.n) job.y[static_cast<size_t>(tok0 + tok) * job.n + row0 + lane] = s0;
    if (row0 + 32 + lane < job.n) job.y[static_cast<size_t>(tok0 + tok) * job.n + row0 + 32 + lane] = s1;
  }
  if (lane == 0) *counter = 0;  // ready for the next launch
}

// ---- mbarriers and the bulk-copy engine (sm_90) ------------------------------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar) {  // arrive count 1
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// One arrival (release: this thread's earlier shared-memory reads are done before it counts).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// bulk_load with an L2 cache policy (evict_first_policy: lines read once should be the first to go).
__device__ __forceinline__ void bulk_load_hint(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                               uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
// bulk_load with an L2 evict-first policy: lines read once should be the first to go.
__device__ __forceinline__ void bulk_load_evict_first(uint32_t dst, const void* src, uint32_t bytes,
                                                      uint32_t bar) {
  bulk_load_hint(dst, src, bytes, bar, evict_first_policy());
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}\n" ::
          "r"(bar),
      "r"(parity)
      : "memory");
}
#endif

// ---- host side -----------------------------------------------------------------------------
// The bulk and ws kernels' launchers hand each other the plan (matvec.cu) and the launch;
// matvec_ws.cu launches the warp-specialized kernel. Returns false (launching nothing) when
// its shared memory (rings of at least 2 slots + the staged activation) does not fit
// kBlocksPerSm blocks per SM: then the caller runs the bulk kernel (same results).
// fixup: in, the fix-up asked for (kFixup*, finish_pair); out, the one the launch uses
// (kFixupLast unless first_sums_safe). The kernel's slots are `slots` (the sentinel scratch)
// for kFixupSlots, else `partial`. loop: the consumer loop (launch.h, matvec_ws_loop).
bool launch_matvec_ws(int groups, const StreamPlan& p, dim3 grid, const TiledJobs& jobs, const uint8_t* xq,
                      const float4* meta, int t, int kblocks, float* partial, float* slots, int* counters,
                      cudaStream_t s, bool evict_first, int blocks_per_sm, int& fixup, int loop);
// Whether a launch of `kernel` (its max dynamic shared memory already set) may use the
// first-rank or flag-free fix-up (finish_pair): only if every block of the launch is resident at once, since
// rank 0 spins on warps of later blocks. That holds when the grid is one token group
// (grid.y == 1, t <= kTok) and one wave: grid.x <= (blocks per SM the occupancy API gives for
// this kernel, block size and shared memory) x SMs. Blocks of other kernels do not break it: a
// kernel launched before ours finishes on its own (it waits for nothing of ours), and one
// launched after it by programmatic dependent launch starts only once every block of ours has
// run pdl_trigger (the first thing each does), i.e. is resident. The backend launches on one
// stream; a concurrent spinning launch on another stream of the same device could deadlock.
template <typename Kernel>
bool first_sums_safe(Kernel* kernel, dim3 grid, int threads, size_t smem) {
  if (grid.y != 1 || grid.z != 1) return false;
  int dev = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
    cudaGetLastError();  // a failed query is not an error of the next launch: the safe fix-up runs
    return false;
  }
  return static_cast<long long>(grid.x) <= static_cast<long long>(per_sm) * sms;
}

// Ring slots per consumer warp the ws kernel uses for a launch of t tokens over kblocks
// k-blocks with `ring` slots asked for and blocks_per_sm blocks per SM (0: it does not fit).
int matvec_ws_slots(int groups, int ring, int t, int kblocks, int blocks_per_sm);

}  // namespace bonsai::cuda::mv
