// Shared pieces of the int8 prefill GEMM (kernels/cuda/gemm.cu) and the kernels it includes
// (gemm_wgmma.cuh, gemm_wgmma_tma.cuh, gemm_f16.cuh): block shape, the shared-memory stage layout,
// the launch plan (GemmPlan), the cp.async / mbarrier helpers and the u8 x s8 mma. Included once,
// by gemm.cu, into its anonymous namespace's translation unit.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {
namespace {

constexpr int kStages = 4;
constexpr int kThreads = 256;
constexpr int kBlockTiles = kGemmRows / kTileRows;  // 8
// Shared-memory bytes per staged token. XS = 0: padded by 16 bytes, so token r's row starts at
// 16·r mod 128 and the 8 tokens x 4 lanes of a B-fragment load (32 bytes at 32·tig of each
// row) spread over all banks; but then every odd token's row starts 16 bytes into a 32-byte
// unit, and each 32-byte sector a cp.async reads from global memory lands split over two
// 32-byte units of shared memory (the excess L2 sectors and shared wavefronts ncu counts on
// the activation's LDGSTS). XS = 1: rows of 256 bytes (all sector-aligned, a warp's copies of
// two tokens one contiguous 512-byte run) with the halves of each 32-byte piece swapped in odd
// tokens (byte b of the row at b ^ 16): a sector still lands whole in one 32-byte unit, and
// token r's half h sits at 16·(h ^ (r & 1)), so tokens g and g + 1 of a load again read
// disjoint 16-byte bank groups.
template <int XS>
constexpr int kActPitch = XS ? kActBytes : kActBytes + 16;

template <int G, int XS>
struct GemmSmem {
  static constexpr int kCB = kCodeBytes + 32 * G;  // one stored chunk
  static constexpr int kW = kBlockTiles * kCB;
  static constexpr int kX = kGemmTokens * kActPitch<XS>;
  static constexpr int kM = kGemmTokens * 16;
  static constexpr int kStage = kW + kX + kM;
  static constexpr int kBytes = kStages * kStage;
};

struct GemmPlan {
  int block_start[kMaxJobs + 1] = {};    // first row block of each job
  int tiles[kMaxJobs] = {};              // tiles stored per job (whole row groups)
  int64_t out_start[kMaxJobs + 1] = {};  // split-K: offset of job j's [t][n_j] in a partial slice
  int kb_per_split = 0;                  // k-blocks per blockIdx.z
  float* partial = nullptr;              // [splits][out_start[count]] when gridDim.z > 1
  // fp16 GEMM only (gemm_f16.cuh): items [0, whole) are whole tiles, the rest split in k;
  // counters: the in-kernel fix-up's arrival counts, kBlockTiles per split tile (kept zero);
  // null: the split sums are added by gemm_reduce_kernel (whole must be 0 then).
  int whole = 0;
  int* counters = nullptr;
  // stream (session 7, round 2; fp16 GEMM, with whole and counters): > 0, the tiles past `whole`
  // as one run of (tile, k-block) units cut into chunks of `stream` k-blocks, chunk b taken by
  // block b (stream-K: every block ends the launch with about the same work); 0, uniform ranges.
  int stream = 0;
};

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// mbarriers in shared memory (MB kernels): init, arrive, the arrival of this thread's
// cp.asyncs once they land, and a wait for a phase's completion by its parity.
__device__ __forceinline__ void mbar_init(uint32_t a, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t a) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t a) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n MBAR_WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra MBAR_WAIT_%=;\n}\n" ::"r"(a),
      "r"(parity)
      : "memory");
}

// d = a·b + c (u8 A 16x32 row-major, s8 B 32x8 column-major, s32 accumulators).
__device__ __forceinline__ void mma_u8s8(int (&d)[4], const int (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]), "r"(c[2]),
        "r"(c[3]));
}

constexpr int kMagicBits = kFlushMagicBits;  // tile_layout.h: flush_value
constexpr float kMagic = kFlushMagic;

}  // namespace
}  // namespace bonsai::cuda
