// The prefill GEMM on FP16 wgmma with FP32 accumulation (sm_90a; included by kernels/cuda/gemm.cu
// after gemm_wgmma_tma.cuh, whose producer / ring machinery it reuses). BONSAI_CUDA_GEMM=f16.
//
// Numerics (not the int8 kernels' exact per-block integers): a weight value (c - 1)·d is exactly
// an fp16 number (c - 1 in {-1, 0, 1, 2}, d fp16 with |d| < 2^15: gemm_f16_layout.h
// f16_scale_ok; other weights stay on the int8 kernels), so the A fragment carries the scaled
// weights themselves; the activation enters as fp16, x·2^-e rounded to nearest with a per-token
// power of two (f16_token_exp: the token's amax in [2^14, 2^15)), and the tensor core
// accumulates the products in fp32 over the launch's whole k range: no per-k-block flush at all.
// The epilogue multiplies by 2^e (exact). Error per output: the activation rounding, at most
// Σ_j |w_j|·(2^-11·|x_j| + 2^-25·2^e), plus the fp32 accumulation (docs/performance.md,
// "Prefill GEMM", session 6; tests/test_backend_cuda_gemm_f16.cpp derives its tolerance so).
//
// Block: 128 weight rows x NT tokens (64, 128 or 256), two consumer warpgroups of 64 rows and a
// producer warpgroup whose warp 0 feeds a ring of kF16Stages (4) k-blocks: lanes 0-7 one
// `cp.async.bulk` each of a stored 544-byte chunk (the tiled weight as uploaded), lanes 8-9 one
// TMA box each of 128 bytes x NT tokens of the fp16 activation with the 128-byte swizzle (a
// token's k-block is 256 bytes, 128 fp16 columns, as the int8 kernels' hi + lo record: the same
// tensor map shape, the same wgmma descriptors; region 0 holds permuted columns 0-63, region 1
// 64-127). No meta: the per-token scale is read once in the epilogue.
//
// Consumers, per k-block: wait for the stage, load the lane's 16 code bytes and its two row
// scales, decode 32 half2 A registers (8 k-steps x 4: shift, mask | 0x64006400 = 1024 + c,
// HSUB2 1025, HMUL2 d: all exact), issue 8 wgmma m64nNk16 (k-step j: region j >> 2, 32·(j & 3)
// bytes in). The A registers of k-block i + 1 are decoded into a second set while k-block i's
// wgmmas run; the wait for them is at the end of the iteration, so no wgmma is in flight across
// the loop's back edge, and the slot is released right after it.
//
// TERMS = 2 (BONSAI_CUDA_GEMM_F16_TERMS=2, a fidelity knob): the activation as two fp16 terms,
// hi = fp16(x·2^-e) and lo = fp16(x·2^-e - hi) (the residual is exact in fp32), each k-block's
// record [hi 256 B][lo 256 B]: the same A registers multiply both (16 wgmmas per k-block), still
// no flush. Per element |x - x̃| <= 2^-22·|x| + 2^-25·2^e (~22-bit activations, finer than the
// int8 kernels' hi/lo block quantization) at twice the tensor work; 4 TMA boxes per stage, and
// with 128 tokens per block 3 stages (68 KB each).
//
// Work items and grid (round 2): an item is token block x row block x k range. PERSIST = 1
// (BONSAI_CUDA_GEMM_F16_PERSIST, the default): one block per SM walks items blockIdx.x,
// + gridDim.x, ...; producer and consumers count k-blocks across items, so the ring runs on and
// the next item's first stages load during this item's last wgmmas and epilogue (no block
// start, barrier set-up or cold ring per item). Each item's wgmma sequence is the same as with
// PERSIST = 0 (one block per item): the outputs are bit-identical for the same plan. NT = 256
// (m64n256k16, 128 fp32 accumulators per consumer thread, 3 stages of 69 KB) and 6 stages are
// measurement knobs (slower on the H200; docs/performance.md).
#pragma once

#include "kernels/cuda/gemm_f16_layout.h"

namespace bonsai::cuda {
namespace {

// Ring depth (the default): 4 stages; 3 for two terms of 128 tokens (4 x 68 KB would not fit) and
// for 256 tokens (stages of 69 KB). BONSAI_CUDA_GEMM_F16_STAGES=6 (one term of 64 or 128 tokens:
// 6 x 37 KB) asks for a deeper ring (gemm_f16 passes ST).
template <int NT, int TERMS>
constexpr int kF16Stages = (TERMS == 2 && NT == 128) || NT == 256 ? 3 : 4;

#if BONSAI_WGMMA
// d[32] += a (f16, registers) x desc (f16, shared memory, K-major): m64n64k16, fp32 accumulators.
__device__ __forceinline__ void wgmma_m64n64k16_f16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
      "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// d[64] += a (f16, registers) x desc (f16, shared memory, K-major): m64n128k16, fp32 accumulators.
__device__ __forceinline__ void wgmma_m64n128k16_f16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
      "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
      "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
      "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// d[128] += a (f16, registers) x desc (f16, shared memory, K-major): m64n256k16, fp32 accumulators.
__device__ __forceinline__ void wgmma_m64n256k16_f16(float (&d)[128], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),
        "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),
        "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
        "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]),
        "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
        "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
#endif

template <int NT>
__device__ __forceinline__ void wgmma_f16(float (&d)[NT / 2], const uint32_t (&a)[4], uint64_t desc) {
#if BONSAI_WGMMA
  if constexpr (NT == 256)
    wgmma_m64n256k16_f16(d, a, desc);
  else if constexpr (NT == 128)
    wgmma_m64n128k16_f16(d, a, desc);
  else
    wgmma_m64n64k16_f16(d, a, desc);
#endif
}

// Two codes (bits 0-1 and 16-17 of v) as the half2 of (c - 1)·d: 1024 + c exactly by the
// exponent bits of 1024, minus 1025 (exact: integers below 2048), times d (exact: c - 1 is -1,
// 0, 1 or 2 and |2d| is finite, f16_scale_ok).
__device__ __forceinline__ uint32_t f16_weight_pair(uint32_t v, __half2 d) {
  const uint32_t bits = (v & 0x00030003u) | 0x64006400u;
  const __half2 w = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(1025.0f)), d);
  return *reinterpret_cast<const uint32_t*>(&w);
}

// (v & mask) | 0x64006400 in one LOP3 (nvcc emits an AND and an OR for the C expression: two
// immediates).
template <uint32_t kMask>
__device__ __forceinline__ uint32_t f16_code_bits(uint32_t v) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(v), "n"(kMask), "r"(0x64006400u));
  return r;
}

// The stages: the activation first (2·TERMS regions of NT tokens x 128 bytes, 1024-byte aligned
// for the 128-byte swizzle), then the 8 stored chunks; padded to a multiple of 1024 bytes. Then
// the full and empty mbarriers.
template <int NT, int TERMS, int ST = kF16Stages<NT, TERMS>>
struct GemmSmemF16 {
  static constexpr int kST = ST;
  static constexpr int kCB = kCodeBytes + 32;  // one stored chunk (128-column groups)
  static constexpr int kW = 8 * kCB;
  static constexpr int kX = TERMS * NT * kActBytes;
  static constexpr int kOffX = 0, kOffW = kX;
  static constexpr int kStage = (kX + kW + 1023) / 1024 * 1024;
  static constexpr int kBytes = kST * kStage;
  static constexpr int kBars = 16 * kST;
};

// xmap: the fp16 activation as bytes [t][kblocks·256·TERMS] (box 128 x NT, 128-byte swizzle;
// tokens past t read as zeros); tscale[t]: 2^e per token. Plan, jobs, k ranges and output as
// gemm_wgmma_tma_kernel (one block per SM). PIPE (BONSAI_CUDA_GEMM_F16_PIPE): 0, each k-block's
// wgmmas waited for before the next are issued (the other consumer warpgroup's fill the gap);
// 1, one batch kept in flight (wait_group 1; the A registers of k-block i + 1 decoded into those
// of i - 1 once it completed).
// DEC (session 7, BONSAI_CUDA_GEMM_F16_DECODE): 4, the decode above (shift, mask | 0x64006400,
// HSUB2 1025, HMUL2 d); 3, where every scale of the warp's two rows in the k-block keeps d·2^-6
// exact in fp16 (a warp vote per k-block; else the 4-step decode): no shift for codes at bit
// offsets o = 0, 2, 4, 6 of their 16-bit half (one shift by 8 per word for o = 8..14), mask in
// place | 0x64006400 = 1024 + c·2^o, HSUB2 (1024 + 2^o) = (c - 1)·2^o, HMUL2 d·2^-o: the same
// fp16 values exactly (d·2^-o is exact, (c - 1)·d is representable: f16_scale_ok), so the
// outputs are bit-identical.
// DEC 5 (session 7, round 2: the consumers' issue path, the ncu source profile's stalls): decode 3's
// values, in 3 instructions per register (mask and or in one LOP3), with the scale check after the
// decode instead of a branch in front of it (a failing warp decodes again with the 4-step form),
// the stage read through 32-bit shared-window addresses (no generic-to-shared conversion, which
// re-read SR_CgaCtaId every k-block) and the ring's slot and phase in unsigned arithmetic (no
// signed modulo chain on the uniform datapath): the same A registers, so bit-identical.
template <int NT, int TERMS, int PIPE, int ST, int PERSIST, int DEC = 4>
__global__ void __launch_bounds__(kTmaThreads, 1)
    gemm_f16_kernel(TiledJobs jobs, GemmPlan plan, const __grid_constant__ CUtensorMap xmap,
                    const float* __restrict__ tscale, int t, int kblocks) {
#if BONSAI_WGMMA
  using S = GemmSmemF16<NT, TERMS, ST>;
  constexpr int kST = S::kST;
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_trigger();
  constexpr int kRA = NT / 2;  // accumulators per thread (64 rows x NT tokens / 128)
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
            tg = lane & 3;
  // The work items: token block x row block x k range, x fastest (the launch order of a full
  // grid). PERSIST 0: the grid is that, one item per block; 1: a block per SM (gridDim.x) walks
  // items blockIdx.x, + gridDim.x, ...: the ring runs on across items, so the next item's first
  // stages load during this one's last wgmmas and epilogue.
  // Session 7 (the tail plan, PERSIST only): items [0, plan.whole) are tiles 0.. whole (one k
  // range each, y written directly), the rest the other tiles' k ranges (range z of tile
  // whole + i at item whole + i + z·(tiles - whole)); plan.whole = 0 is the uniform split above.
  const int nx = (t + NT - 1) / NT, ny = plan.block_start[kMaxJobs], tiles = nx * ny;
  const int nz = (kblocks + plan.kb_per_split - 1) / plan.kb_per_split, whole = plan.whole;
  // Round 2 (stream-K, plan.stream = L > 0, PERSIST only): the rest tiles' (tile, k-block) units
  // in one run cut into chunks of L; block b takes chunk b as up to pm pieces (item whole + b +
  // j·gridDim.x: piece j, the part of chunk b in its j-th tile; empty ones are skipped). A tile's
  // pieces are its ranges, z = the chunk's index minus that of the tile's first chunk.
  const int sl = PERSIST ? plan.stream : 0, pm = sl > 0 ? (sl + kblocks - 2) / kblocks + 1 : 0;
  const int rest = tiles - whole,
            total = sl > 0 ? whole + static_cast<int>(gridDim.x) * pm : whole + rest * nz;
  const int item0 = PERSIST ? static_cast<int>(blockIdx.x)
                            : static_cast<int>(blockIdx.x + nx * (blockIdx.y + ny * blockIdx.z));
  const int stride = PERSIST ? static_cast<int>(gridDim.x) : total;
  struct Item {
    TiledJob job;
    int tiles, tile0, tok0, kb0, n, bz, nz, split;  // split: the index of a split tile, -1 if whole
    int64_t out0;
  };
  auto item = [&](int it) {
    Item m;
    const bool w1 = it < whole;
    int tl = it;
    m.bz = 0;
    m.nz = 1;
    m.kb0 = 0;
    m.n = kblocks;
    if (!w1 && sl > 0) {  // stream-K: piece j of chunk b
      const int q = it - whole, b = q % static_cast<int>(gridDim.x), j = q / static_cast<int>(gridDim.x);
      const int u0 = b * sl, u1 = min(u0 + sl, rest * kblocks), tr = min(u0 / kblocks + j, rest - 1);
      const int s0 = max(u0, tr * kblocks), s1 = min(u1, (tr + 1) * kblocks);
      m.n = u0 / kblocks + j < rest ? max(0, s1 - s0) : 0;
      m.kb0 = s0 - tr * kblocks;
      tl = whole + tr;
      const int len = max(sl, 1);  // (sl > 0 here; PERSIST = 0 instantiates it with 0)
      m.bz = b - tr * kblocks / len;
      m.nz = ((tr + 1) * kblocks - 1) / len - tr * kblocks / len + 1;
    } else if (!w1) {
      tl = whole + (it - whole) % rest;
      m.bz = (it - whole) / rest;
      m.nz = nz;
      m.kb0 = m.bz * plan.kb_per_split;
      m.n = min(kblocks, m.kb0 + plan.kb_per_split) - m.kb0;
    }
    const int rb = tl / nx;
    m.split = w1 || m.nz == 1 ? -1 : tl - whole;
    m.tok0 = (tl % nx) * NT;
    m.job = jobs.job[0];
    m.tiles = plan.tiles[0];
    m.out0 = 0;
    int bstart = 0;
#pragma unroll
    for (int i = 1; i < kMaxJobs; ++i)
      if (i < jobs.count && rb >= plan.block_start[i]) {
        m.job = jobs.job[i];
        m.tiles = plan.tiles[i];
        bstart = plan.block_start[i];
        m.out0 = plan.out_start[i];
      }
    m.tile0 = (rb - bstart) * kBlockTiles;
    return m;
  };
  const uint32_t sraw = static_cast<uint32_t>(__cvta_generic_to_shared(smem)),
                 spad = (1024u - (sraw & 1023u)) & 1023u;
  const uint32_t sbase = sraw + spad;
  uint8_t* const sm = smem + spad;
  const uint32_t full0 = sbase + S::kBytes, empty0 = full0 + 8 * kST;
  if (tid < kST) {
    mbar_init(full0 + 8 * tid, 1);
    mbar_init(empty0 + 8 * tid, 8);
  }
  fence_mbar_init();
  __syncthreads();  // the last block-wide barrier: the producer's idle warps exit below

  if (wg == 2) {  // ---- producer (gemm_wgmma_tma_kernel's protocol, without the meta box) ----
    setmaxnreg_dec<40>();
    if (w != 0) return;
    constexpr uint32_t kTx = S::kW + S::kX;
    int c = 0;  // k-blocks loaded so far: ring slot c % kST, pass c / kST
    for (int it = item0; it < total; it += stride) {
      const Item m = item(it);
      if (m.n == 0) continue;  // (an empty stream-K piece)
      const int ti = lane < kBlockTiles && m.tile0 + lane < m.tiles ? lane : 0;
      const uint8_t* wsrc = m.job.w + static_cast<size_t>(m.tile0 + ti) * kblocks * S::kCB;
      auto load_w = [&](int i) {
        const uint32_t slot = (c + i) % kST, bar = full0 + 8 * slot;
        if (lane == 0) mbar_arrive_expect_tx(bar, kTx);
        __syncwarp();
        if (lane < kBlockTiles)
          bulk_g2s(sbase + slot * S::kStage + S::kOffW + lane * S::kCB,
                   wsrc + static_cast<size_t>(m.kb0 + i) * S::kCB, S::kCB, bar);
      };
      auto load_x = [&](int i) {
        const uint32_t slot = (c + i) % kST, bar = full0 + 8 * slot;
        const int r = lane - kBlockTiles;  // region r: bytes [128r, 128r + 128) of the k-block's record
        if (r >= 0 && r < 2 * TERMS)
          tma_g2s_2d(sbase + slot * S::kStage + S::kOffX + r * NT * 128, &xmap,
                     (m.kb0 + i) * (TERMS * kActBytes) + 128 * r, m.tok0, bar);
      };
      int i = 0;
      if (c == 0) {  // the first item: its first stages' weights before the activation is ready
        const int first = min(m.n, kST);
        for (; i < first; ++i) load_w(i);
        pdl_wait();  // the activation is the previous kernel's output
        for (int j = 0; j < first; ++j) load_x(j);
      }
      for (; i < m.n; ++i) {
        if (c + i >= kST) mbar_wait(empty0 + 8 * ((c + i) % kST), (((c + i) / kST) - 1) & 1);
        load_w(i);
        load_x(i);
      }
      c += m.n;
    }
    return;
  }

  // ---- consumers: warpgroup wg owns rows 64·wg.. of the block (tiles 4·wg + w) ----
  setmaxnreg_inc<232>();
  // B descriptors as gemm_wgmma_tma_kernel's SWZ = 128 (layout type 1, SBO 1024): k-step j of
  // term u starts 32·(j & 3) bytes into region 2u + (j >> 2) (NT·128 bytes per region).
  static_assert(S::kBytes + S::kBars + 1024 <= (1 << 18) && S::kStage % 16 == 0);
  const uint32_t dlo0 = (((sbase + S::kOffX) & 0x3FFFFu) >> 4) | (1u << 16);
  constexpr uint64_t kDescHi = ((1024ull >> 4) | (1ull << 30)) << 32;
  constexpr uint32_t kRegion = NT * 128 / 16;
  pdl_wait();  // (the output may still be read by the previous kernel)
  const int tile = wg * 4 + w;
  int c = 0;  // k-blocks consumed so far (the producer's count)
  for (int it = item0; it < total; it += stride) {
    const Item m = item(it);
    if (m.n == 0) continue;  // (an empty stream-K piece)
    const int n = m.n;
    float acc[kRA];  // element 4q + e: row g + 8(e >> 1), token 8q + 2·tg + (e & 1)
#pragma unroll
    for (int i = 0; i < kRA; ++i) acc[i] = 0.0f;
    uint32_t a[2][8][4];               // A registers of two k-blocks: [set][k-step][register]
    auto prep = [&](int i, int set) {  // wait for k-block i's stage, decode its A registers
      if constexpr (DEC == 5) {
        const uint32_t kb = static_cast<uint32_t>(c + i), slot = kb % kST;
        mbar_wait(full0 + 8 * slot, (kb / kST) & 1);
        const uint32_t chunk = sbase + S::kOffW + tile * S::kCB + slot * S::kStage;
        uint32_t wd[4], sw;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(wd[0]), "=r"(wd[1]), "=r"(wd[2]), "=r"(wd[3])
                     : "r"(chunk + lane * 16));
        asm volatile("ld.shared.u32 %0, [%1];"
                     : "=r"(sw)
                     : "r"(chunk + kCodeBytes + g * 4));  // {d(g), d(g + 8)}
        const __half2 dd = *reinterpret_cast<const __half2*>(&sw);
        const __half2 d2 = __hmul2(dd, __float2half2_rn(0.25f)), d4 = __hmul2(dd, __float2half2_rn(0.0625f)),
                      d6 = __hmul2(dd, __float2half2_rn(0.015625f));
        const __half2 ds[4][2] = {{__low2half2(dd), __high2half2(dd)},
                                  {__low2half2(d2), __high2half2(d2)},
                                  {__low2half2(d4), __high2half2(d4)},
                                  {__low2half2(d6), __high2half2(d6)}};
        const uint32_t wh[4] = {wd[0] >> 8, wd[1] >> 8, wd[2] >> 8, wd[3] >> 8};
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int sh = f16_code_shift(j, r), o = sh & 7;
            const uint32_t src = sh >= 8 ? wh[j >> 1] : wd[j >> 1];
            const uint32_t bits = o == 0   ? f16_code_bits<0x00030003u>(src)
                                  : o == 2 ? f16_code_bits<0x000C000Cu>(src)
                                  : o == 4 ? f16_code_bits<0x00300030u>(src)
                                           : f16_code_bits<0x00C000C0u>(src);
            const __half2 w = __hmul2(
                __hsub2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(1024.0f + (1 << o))),
                ds[o >> 1][r & 1]);
            a[set][j][r] = *reinterpret_cast<const uint32_t*>(&w);
          }
        const __half2 back = __hmul2(d6, __float2half2_rn(64.0f));  // exact: d again iff d·2^-6 was
        if (!__all_sync(kFullMask, *reinterpret_cast<const uint32_t*>(&back) == sw)) {
          const __half2 d[2] = {__low2half2(dd), __high2half2(dd)};  // (decode 4's values)
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r)
              a[set][j][r] = f16_weight_pair(wd[j >> 1] >> f16_code_shift(j, r), d[r & 1]);
        }
        return;
      }
      const int slot = (c + i) % kST;
      mbar_wait(full0 + 8 * slot, ((c + i) / kST) & 1);
      const uint8_t* chunk = sm + slot * S::kStage + S::kOffW + tile * S::kCB;
      const uint4 cw = *reinterpret_cast<const uint4*>(chunk + lane * 16);
      const uint32_t sw = *reinterpret_cast<const uint32_t*>(chunk + kCodeBytes + g * 4);  // {d(g), d(g + 8)}
      const __half2 dd = *reinterpret_cast<const __half2*>(&sw);
      const uint32_t wd[4] = {cw.x, cw.y, cw.z, cw.w};
      if constexpr (DEC == 3) {
        const __half2 d6 = __hmul2(dd, __float2half2_rn(0.015625f));  // d·2^-6
        const __half2 back = __hmul2(d6, __float2half2_rn(64.0f));    // exact: d again iff d·2^-6 was
        if (__all_sync(kFullMask, *reinterpret_cast<const uint32_t*>(&back) == sw)) {
          const __half2 d2 = __hmul2(dd, __float2half2_rn(0.25f)),
                        d4 = __hmul2(dd, __float2half2_rn(0.0625f));
          const __half2 ds[4][2] = {{__low2half2(dd), __high2half2(dd)},
                                    {__low2half2(d2), __high2half2(d2)},
                                    {__low2half2(d4), __high2half2(d4)},
                                    {__low2half2(d6), __high2half2(d6)}};
          const uint32_t wh[4] = {cw.x >> 8, cw.y >> 8, cw.z >> 8, cw.w >> 8};
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const int sh = f16_code_shift(j, r), o = sh & 7;
              const uint32_t bits = ((sh >= 8 ? wh[j >> 1] : wd[j >> 1]) & (0x00030003u << o)) | 0x64006400u;
              const __half2 w = __hmul2(
                  __hsub2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(1024.0f + (1 << o))),
                  ds[o >> 1][r & 1]);
              a[set][j][r] = *reinterpret_cast<const uint32_t*>(&w);
            }
          return;
        }
      }
      const __half2 d[2] = {__low2half2(dd), __high2half2(dd)};
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          a[set][j][r] = f16_weight_pair(wd[j >> 1] >> f16_code_shift(j, r), d[r & 1]);
    };
    // k-block i's ring slot (DEC 5: unsigned, c + i >= 0)
    auto slot_of = [&](int i) -> uint32_t {
      if constexpr (DEC == 5) return static_cast<uint32_t>(c + i) % kST;
      return static_cast<uint32_t>((c + i) % kST);
    };
    auto launch_mma = [&](int i, int set) {
      wgmma_fence();
      const uint32_t dlo = dlo0 + slot_of(i) * (S::kStage / 16);
#pragma unroll
      for (int u = 0; u < TERMS; ++u)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          wgmma_f16<NT>(acc, a[set][j], kDescHi | (dlo + (2 * u + (j >> 2)) * kRegion + (j & 3) * 2));
      wgmma_commit();
    };
    auto release = [&](int i) {  // k-block i's wgmmas are complete: every read of its stage is done
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * slot_of(i));
    };
    if (n > 0) prep(0, 0);
    if constexpr (PIPE == 0) {  // k-block i + 1 decoded while i's wgmmas run, then wait for them
      for (int i = 0; i < n; ++i) {
        launch_mma(i, 0);
        if (i + 1 < n) prep(i + 1, 1);
        wgmma_wait<0>();
        release(i);
        if (++i >= n) break;
        launch_mma(i, 1);
        if (i + 1 < n) prep(i + 1, 0);
        wgmma_wait<0>();
        release(i);
      }
    } else {  // one batch stays in flight: k-block i is issued before i - 1 is waited for
      for (int i = 0; i < n; ++i) {
        launch_mma(i, 0);
        wgmma_wait<1>();  // k-block i - 1 done: its slot and its A registers (set 1) are free
        if (i > 0) release(i - 1);
        if (i + 1 < n) prep(i + 1, 1);
        if (++i >= n) break;
        launch_mma(i, 1);
        wgmma_wait<1>();
        release(i - 1);
        if (i + 1 < n) prep(i + 1, 0);
      }
      wgmma_wait<0>();
      if (n > 0) release(n - 1);
    }
    c += n;

    // The in-kernel fix-up (plan.counters): each warp owns its 16 rows x NT tokens of the tile in
    // every range, so it stores its range's sums (scaled by 2^e) to its own slot, [element][lane]
    // (coalesced, one base address), and counts itself in per (split tile, warp tile). The fence
    // orders each lane's slot stores before lane 0's count (the warp barrier in between), the
    // last arriver's fence its loads after it (matvec_common.cuh's finish_pair, kFixupLast). The
    // last adds the nz slots in order z = 0, 1, ... from 0.0f, its own reloaded: exactly
    // gemm_reduce_kernel's sum of the same floats, whatever the arrival order. It leaves the count
    // zero for the next launch (which touches it only after griddepcontrol.wait, i.e. after this
    // grid completed).
    bool direct = m.split < 0;
    if (m.split >= 0 && plan.counters != nullptr) {
      constexpr int kSlot = kRA * 32;  // floats per warp and range
      float* slot = plan.partial + (static_cast<size_t>(m.split) * kBlockTiles + tile) * kSlot + lane;
      const size_t zstride = static_cast<size_t>(rest) * kBlockTiles * kSlot;
#pragma unroll
      for (int q = 0; q < NT / 8; ++q)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = m.tok0 + 8 * q + 2 * tg + e;
          const float sc = tok < t ? __ldg(tscale + tok) : 0.0f;  // 2^e: exact
#pragma unroll
          for (int r = 0; r < 2; ++r)
            slot[m.bz * zstride + (4 * q + 2 * r + e) * 32] = acc[4 * q + 2 * r + e] * sc;
        }
      int* counter = plan.counters + m.split * kBlockTiles + tile;
      __threadfence();
      __syncwarp();
      int arrived = 0;
      if (lane == 0) arrived = atomicAdd(counter, 1);
      arrived = __shfl_sync(kFullMask, arrived, 0);
      if (arrived == m.nz - 1) {
        __threadfence();
        if (lane == 0) *counter = 0;
#pragma unroll
        for (int i = 0; i < kRA; ++i) acc[i] = 0.0f;
#pragma unroll 1
        for (int z = 0; z < m.nz; ++z) {
          const float* src = slot + z * zstride;
#pragma unroll
          for (int i = 0; i < kRA; ++i) acc[i] += __ldcg(src + i * 32);
        }
        direct = true;
      } else {
        continue;
      }
    }
    float* out = m.job.y;
    if (!direct) out = plan.partial + m.bz * plan.out_start[kMaxJobs] + m.out0;  // (gemm_reduce_kernel's)
    const bool summed = m.split >= 0 && direct;  // (the fix-up's sums are scaled already)
#pragma unroll
    for (int q = 0; q < NT / 8; ++q)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = m.tok0 + 8 * q + 2 * tg + e;
        if (tok >= t) continue;
        const float sc = summed ? 1.0f : __ldg(tscale + tok);  // 2^e: exact
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = (m.tile0 + tile) * kTileRows + g + 8 * r;
          if (row < m.job.n) out[static_cast<size_t>(tok) * m.job.n + row] = acc[4 * q + 2 * r + e] * sc;
        }
      }
  }
#else
  __trap();  // gemm.cu selects this kernel only on compute capability 9.0 (the sm_90a build)
#endif
}

// x [t][k] -> xh [t][k/128][TERMS][128 fp16, permuted by f16_act_index] and tscale[t] = 2^e: one
// block of 256 threads per token, the token's amax first (f16_token_exp), then each float4 of
// natural columns 4u..4u+3 of a k-block (m, c = 0,0 / 1,0 / 0,1 / 1,1) as two half2: {x0, x2} at
// the permuted index of column 4u, {x1, x3} 8 further on; TERMS = 2: the residuals x·2^-e - hi
// (exact in fp32) rounded likewise, 128 fp16 further on.
template <int TERMS>
__global__ void __launch_bounds__(256) act_f16_kernel(const float* __restrict__ x, uint8_t* __restrict__ xh,
                                                      float* __restrict__ tscale, int64_t k) {
  pdl_trigger();
  pdl_wait();
  __shared__ float red[8];
  const int tok = blockIdx.x, tid = threadIdx.x;
  const float4* row = reinterpret_cast<const float4*>(x + static_cast<size_t>(tok) * k);
  const int64_t n4 = k / 4;
  float amax = 0.0f;
  for (int64_t u = tid; u < n4; u += 256) {
    const float4 v = row[u];
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, o));
  if ((tid & 31) == 0) red[tid >> 5] = amax;
  __syncthreads();
  amax = red[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) amax = fmaxf(amax, red[i]);
  int fe = 0;
  if (amax > 0.0f && amax <= 3.402823466e38f) frexpf(amax, &fe);
  const int e = amax > 0.0f && amax <= 3.402823466e38f ? f16_token_exp(fe) : 0;
  const float down = __int_as_float((127 - e) << 23);  // 2^-e
  if (tid == 0) tscale[tok] = __int_as_float((127 + e) << 23);
  __half2* out =
      reinterpret_cast<__half2*>(xh + static_cast<size_t>(tok) * (k / kBlockK) * TERMS * kActBytes);
  for (int64_t u = tid; u < n4; u += 256) {
    const float4 v = row[u];
    const int64_t kb = u >> 5;
    const int p = f16_act_index(static_cast<int>(u & 31) * 4);  // even: a half2 boundary
    __half2* o = out + kb * (64 * TERMS) + p / 2;
    const float2 a = make_float2(v.x * down, v.z * down), b = make_float2(v.y * down, v.w * down);
    const __half2 ha = __float22half2_rn(a), hb = __float22half2_rn(b);
    o[0] = ha;
    o[4] = hb;
    if constexpr (TERMS == 2) {
      const float2 ra = __half22float2(ha), rb = __half22float2(hb);
      o[64] = __floats2half2_rn(a.x - ra.x, a.y - ra.y);
      o[68] = __floats2half2_rn(b.x - rb.x, b.y - rb.y);
    }
  }
}

}  // namespace
}  // namespace bonsai::cuda
