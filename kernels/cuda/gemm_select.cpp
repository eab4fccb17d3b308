// BONSAI_CUDA_GEMM: which kernel runs the prefill GEMM (kernels/cuda/gemm.h, gemm_kernel);
// BONSAI_CUDA_GEMM_STAGE: the mma.sync kernel's activation staging (gemm_stage);
// BONSAI_CUDA_GEMM_WG_STAGES / _WG_SWIZZLE / _WG_LOOP / _WG_TOKENS: the wgmma producer kernel's
// ring depth, activation swizzle, consumer loop and tokens per block; BONSAI_CUDA_GEMM_WG_MIN: the automatic
// choice's threshold; the tensor maps. The knob:: functions parse (kernels/cuda/knobs.h); the others
// cache their result once per process.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include "bonsai/error.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/knobs.h"
#include "kernels/cuda/tile_layout.h"
#include "runtime/env.h"

namespace bonsai::cuda {

namespace {
// The current device's compute capability {major, minor}.
std::pair<int, int> compute_capability() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return {major, minor};
}
}  // namespace

bool gemm_wgmma_available() {
  // The wgmma kernels have a body only in the sm_90a build, which the driver runs on compute
  // capability 9.0 exactly; any other device runs the portable PTX, whose wgmma kernels trap.
  static const bool available = compute_capability() == std::pair<int, int>{9, 0};
  return available;
}

std::optional<GemmKernel> knob::gemm_kernel() {
  return env_choice<std::optional<GemmKernel>>("BONSAI_CUDA_GEMM",
                                               {{"mma", GemmKernel::mma},
                                                {"wgmma", GemmKernel::wgmma},
                                                {"wgmma_cp", GemmKernel::wgmma_cp},
                                                {"f16", GemmKernel::f16},
                                                {"auto", GemmKernel::automatic}},
                                               std::nullopt);
}

GemmKernel gemm_kernel() {
  static const GemmKernel choice = [] {
    const std::optional<GemmKernel> k = knob::gemm_kernel();
    // Default on compute capability 9.0: f16 (the fp16 GEMM for launches of at least
    // gemm_wg_min_blocks() blocks per SM whose weights' scales are fp16-exact, the int8 kernels
    // for the rest; H200: pp512 +21.8 % against automatic, alternated, `gate --prefill` 7 of 7
    // with it forced on every launch: docs/performance.md, "Prefill GEMM", session 6). Elsewhere
    // automatic: the wgmma producer kernel (128-byte swizzle) for grids of at least
    // gemm_wg_min_blocks() blocks per SM on 9.0, mma.sync for smaller ones and everywhere else
    // (H200: pp512 +10 % against mma.sync, round 2). `auto` keeps the int8 kernels on 9.0 too.
    if (!k) return gemm_wgmma_available() ? GemmKernel::f16 : GemmKernel::automatic;
    if (*k == GemmKernel::automatic || *k == GemmKernel::mma) return *k;
    if (!gemm_wgmma_available()) {
      const auto [major, minor] = compute_capability();
      fail(
          "BONSAI_CUDA_GEMM={}: the device has compute capability {}.{}; the wgmma kernels (and f16) need "
          "9.0",
          env_value("BONSAI_CUDA_GEMM"), major, minor);
    }
    return *k;
  }();
  return choice;
}

// Default 1: grids of fewer blocks than SMs stay on mma.sync (H200: 5120 x 1024 at t = 256,
// 32 blocks, 19.7 us against 26.8 on wgmma; at t = 512, 64 blocks, 38.0 against 37.5), all
// larger ones run wgmma (6144 x 5120 at t = 256, 160 blocks: 81.2 against 79.2 us). pp512:
// 4348 with 1, 4350 with 0, 4225 with 2, 4130 with 4 (docs/performance.md, "Prefill GEMM").
// Blocks per SM, 0 to 16.
int knob::gemm_wg_min_blocks() { return env_int("BONSAI_CUDA_GEMM_WG_MIN", 1, 0, 16); }

int gemm_wg_min_blocks() {
  static const int min_blocks = knob::gemm_wg_min_blocks();
  return min_blocks;
}

// fp16 activation terms, 1 or 2.
int knob::gemm_f16_terms() { return env_int_in("BONSAI_CUDA_GEMM_F16_TERMS", 1, {1, 2}); }

int gemm_f16_terms() {
  static const int terms = knob::gemm_f16_terms();
  return terms;
}

// The fp16 GEMM's consumer pipelining, 0 or 1.
int knob::gemm_f16_pipe() { return env_flag("BONSAI_CUDA_GEMM_F16_PIPE", false) ? 1 : 0; }

int gemm_f16_pipe() {
  static const int pipe = knob::gemm_f16_pipe();
  return pipe;
}

GemmF16Shape gemm_f16_model(int rowblocks, int t, int kblocks, int64_t outs, int sm_count, bool tail,
                            int tail_gain, int stream_gain) {
  // A launch takes rounds x kb_per_split x the per-k-block time of an item (round 2, H200: ~0.85
  // µs at 128 tokens, the unit here; 64 tokens taken as 0.7 of it: half the MACs, the same
  // decode and waits), plus, with k ranges, each range's partial sums written and read (8 bytes
  // per output at ~3 TB/s: 2.55 MB per unit) and the reduce launch (~3 units). A candidate
  // replaces the best only for a clear gain (3 %): 128 tokens and fewer ranges first.
  // tail (session 7: the in-kernel fix-up, no reduce launch): a split round costs kFix more
  // (its slots written and the last arriver's reads, ~64 KB each way per item from L2), and a
  // second form joins: the full rounds' tiles whole (whole = rounds x SMs items of one range),
  // only the last partial round's tiles split in k, so that round fills the SMs with shorter
  // items (FFN gate + up at t = 512: 8 rounds x 40 + 1 x 20 + kFix instead of 9 x 40). A tail
  // candidate replaces the best for a gain of tail_gain % (BONSAI_CUDA_GEMM_F16_TAIL_GAIN).
  // Round 2, stream-K (stream_gain >= 0, with tail): the full rounds' tiles whole, the other
  // tiles' left x kblocks units cut into one chunk per SM of L = max(kStreamMin, ceil(units /
  // SMs)) k-blocks: full x kblocks + L units plus one fix-up (kFix), chosen for a gain of
  // stream_gain %. Only for k >= 16 k-blocks: with L >= 8 a tile then has at most ceil((k - 1) /
  // 8) + 1 <= k/4 + 1 ranges (the tests' bound for a launch's plan).
  constexpr double kFix = 2.0;
  constexpr int kStreamMin = 8;
  GemmF16Shape best{128, kblocks, 0};
  double best_cost = -1;
  const int max_splits = std::max(1, kblocks / 4);
  for (const int tk : {128, 64}) {
    const double unit = tk == 128 ? 1.0 : 0.7;
    const int64_t grid = static_cast<int64_t>(rowblocks) * ((t + tk - 1) / tk);
    for (int sp = 1; sp <= std::min(16, max_splits); ++sp) {
      const int kbps = (kblocks + sp - 1) / sp, real = (kblocks + kbps - 1) / kbps;
      const int64_t rounds = (grid * real + sm_count - 1) / sm_count;
      const double sums = real == 1 ? 0.0
                          : tail    ? kFix * static_cast<double>(rounds)
                                    : real * 8.0 * static_cast<double>(outs) / 2.55e6 + 3.0;
      const double cost = static_cast<double>(rounds) * kbps * unit + sums;
      if (best_cost < 0 || cost < best_cost * 0.97) {
        best = {tk, kbps, 0};
        best_cost = cost;
      }
    }
    const int64_t full = grid / sm_count, left = grid - full * sm_count;
    if (tail && full > 0 && left > 0)
      for (int sp = 2; sp <= std::min(16, max_splits); ++sp) {
        const int kbps = (kblocks + sp - 1) / sp, real = (kblocks + kbps - 1) / kbps;
        const int64_t rounds = (left * real + sm_count - 1) / sm_count;
        const double cost =
            (static_cast<double>(full) * kblocks + static_cast<double>(rounds) * kbps) * unit +
            kFix * static_cast<double>(rounds);
        if (cost < best_cost * (1.0 - tail_gain / 100.0)) {
          best = {tk, kbps, static_cast<int>(full * sm_count)};
          best_cost = cost;
        }
      }
    if (tail && stream_gain >= 0 && left > 0 && kblocks >= 16) {
      const int64_t units = left * kblocks;
      const int len = static_cast<int>(std::max<int64_t>(kStreamMin, (units + sm_count - 1) / sm_count));
      const double cost = (static_cast<double>(full) * kblocks + len) * unit + kFix;
      if (cost < best_cost * (1.0 - stream_gain / 100.0)) {
        best = {tk, kblocks, static_cast<int>(full * sm_count), len};
        best_cost = cost;
      }
    }
  }
  return best;
}

// Default 5 (H200, t = 512: the 27B GEMM launches 39.78 against 40.94 ms with 3, pp512 8496 /
// 8482 against 8373 / 8345, alternated; docs/performance.md, "Prefill GEMM", session 7, round
// 2). 3 (41.05 against 41.48 ms with 4) and 4 stay as knobs.
int knob::gemm_f16_decode() { return env_int_in("BONSAI_CUDA_GEMM_F16_DECODE", 5, {3, 4, 5}); }

int gemm_f16_decode() {
  static const int decode = knob::gemm_f16_decode();
  return decode;
}

// A gain in percent, 0 to 10 (gemm_f16_model's tail_gain).
int knob::gemm_f16_tail_gain() { return env_int("BONSAI_CUDA_GEMM_F16_TAIL_GAIN", 3, 0, 10); }

int gemm_f16_tail_gain() {
  static const int gain = knob::gemm_f16_tail_gain();
  return gain;
}

// Default off (-1; H200, t = 512: the 27B GEMM launches 41.37 ms with 1 against 40.98 without,
// pp512 8328.78 / 8285.19 against 8427.62 / 8335.34, alternated: a second piece per SM and up
// to 6 ranges per tile cost more than the model's kFix; docs/performance.md, "Prefill GEMM",
// session 7, round 2). Else a gain in percent, 0 to 10.
int knob::gemm_f16_stream() {
  const std::string_view v = env_value("BONSAI_CUDA_GEMM_F16_STREAM");
  if (v.empty() || v == "off") return -1;
  int n = 0;
  if (!parse_decimal(v, n) || n < 0 || n > 10)
    env_refuse("BONSAI_CUDA_GEMM_F16_STREAM", v, "off or an integer in 0 .. 10");
  return n;
}

int gemm_f16_stream() {
  static const int gain = knob::gemm_f16_stream();
  return gain;
}

// Default tail (H200, t = 512: the 27B GEMM launches 41.48 against 45.62 ms with reduce, pp512
// 7821 / 7783 against 7415 / 7369; docs/performance.md, "Prefill GEMM", session 7).
int knob::gemm_f16_sums() {
  return env_choice<int>("BONSAI_CUDA_GEMM_F16_SUMS", {{"reduce", 0}, {"fixup", 1}, {"tail", 2}}, 2);
}

int gemm_f16_sums() {
  static const int sums = knob::gemm_f16_sums();
  return sums;
}

int gemm_f16_block_tokens(int tokens, int grid256, int grid128, int sm_count) {
  if (tokens == 256 && grid256 >= sm_count) return 256;
  return gemm_wg_block_tokens(128, grid128, sm_count);
}

// Default `model` (0; H200, pp512 6714.04 / 6724.39 against 6320.08 / 6310.37 with 128, the
// grid rule, alternated; docs/performance.md, "Prefill GEMM", session 6, round 2).
int knob::gemm_f16_tokens() {
  return env_choice<int>("BONSAI_CUDA_GEMM_F16_TOKENS", {{"128", 128}, {"256", 256}, {"model", 0}}, 0);
}

int gemm_f16_tokens() {
  static const int tokens = knob::gemm_f16_tokens();
  return tokens;
}

// The fp16 GEMM's ring depth, 4 or 6.
int knob::gemm_f16_stages() { return env_int_in("BONSAI_CUDA_GEMM_F16_STAGES", 4, {4, 6}); }

int gemm_f16_stages() {
  static const int stages = knob::gemm_f16_stages();
  return stages;
}

// Default 1, a persistent grid (H200, pp512 6301.73 / 6292.98 against 5988.60 / 5974.98 with 0,
// alternated; docs/performance.md, "Prefill GEMM", session 6, round 2).
int knob::gemm_f16_persist() { return env_flag("BONSAI_CUDA_GEMM_F16_PERSIST", true) ? 1 : 0; }

int gemm_f16_persist() {
  static const int persist = knob::gemm_f16_persist();
  return persist;
}

// Default 128: 2 activation boxes per stage instead of 8.
int knob::gemm_wg_swizzle() { return env_int_in("BONSAI_CUDA_GEMM_WG_SWIZZLE", 128, {32, 128}); }

int gemm_wg_swizzle() {
  static const int swizzle = knob::gemm_wg_swizzle();
  return swizzle;
}

// Default 2: the next k-block's shared-memory reads and A gather while the current wgmmas
// run (docs/performance.md, "Prefill GEMM", round 3); 0 keeps round 2's loop.
int knob::gemm_wg_loop() { return env_int("BONSAI_CUDA_GEMM_WG_LOOP", 2, 0, 2); }

int gemm_wg_loop() {
  static const int loop = knob::gemm_wg_loop();
  return loop;
}

int knob::gemm_wg_tokens() {
  // 128 tokens: stages of 39 KB (8 would exceed the 227 KB of shared memory) and the 128-byte
  // swizzle's two boxes of 128 tokens (the 32-byte kernel stays at 64).
  const int stages = knob::gemm_wg_stages(), swizzle = knob::gemm_wg_swizzle();
  const bool fits = stages == 4 && swizzle == 128;
  // Default 128 (H200: pp512 4703 / 4702 against 4501 / 4497 with 64, alternated; all 27B
  // matmuls at t = 512 81.8 against 85.7 ms; docs/performance.md, "Prefill GEMM", round 4),
  // 64 where BONSAI_CUDA_GEMM_WG_STAGES=8 or _WG_SWIZZLE=32 ask for the 64-token kernel.
  const int tokens = env_int_in("BONSAI_CUDA_GEMM_WG_TOKENS", fits ? 128 : 64, {64, 128});
  if (tokens == 128 && stages != 4)
    usage_fail("BONSAI_CUDA_GEMM_WG_TOKENS=128 runs 4 stages; BONSAI_CUDA_GEMM_WG_STAGES={} does not fit",
               stages);
  if (tokens == 128 && swizzle != 128)
    usage_fail("BONSAI_CUDA_GEMM_WG_TOKENS=128 needs the 128-byte swizzle (BONSAI_CUDA_GEMM_WG_SWIZZLE={})",
               swizzle);
  return tokens;
}

int gemm_wg_tokens() {
  static const int tokens = knob::gemm_wg_tokens();
  return tokens;
}

int gemm_wg_block_tokens(int tokens, int grid128, int sm_count) {
  return tokens == 128 && grid128 >= sm_count ? 128 : kGemmTokens;
}

// Default 1 (256-byte rows, no split sectors): all 27B matmuls at t = 512 1 % faster, pp512
// +0.9 % on the H200 (docs/performance.md, "Prefill GEMM"); 0 keeps the padded rows.
int knob::gemm_stage() { return env_flag("BONSAI_CUDA_GEMM_STAGE", true) ? 1 : 0; }

int gemm_stage() {
  static const int stage = knob::gemm_stage();
  return stage;
}

// Default 4 (since round 3): the same microbench time as 8 (27B matmuls at t = 512 85.74
// against 85.82 ms with consumer loop 2), pp512 4486 against 4428-4430 (one unalternated run;
// round 2 measured +0.8 % too), and half the shared memory. 8 keeps the deeper ring.
int knob::gemm_wg_stages() { return env_int_in("BONSAI_CUDA_GEMM_WG_STAGES", 4, {4, 8}); }

int gemm_wg_stages() {
  static const int stages = knob::gemm_wg_stages();
  return stages;
}

namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                 CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                 CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess || p == nullptr)
      fail("BONSAI_CUDA_GEMM=wgmma: the CUDA driver has no cuTensorMapEncodeTiled (needs 12.0 or later)");
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A 2-D map over rows x cols elements of esize bytes (rows cols·esize bytes apart), box bx x by.
void encode_2d(unsigned char (&out)[128], const void* base, CUtensorMapDataType type, uint64_t esize,
               uint64_t cols, uint64_t rows, uint32_t bx, uint32_t by, CUtensorMapSwizzle swizzle,
               const char* what) {
  static_assert(sizeof(CUtensorMap) == sizeof out);
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cols, rows}, strides[1] = {cols * esize};
  const cuuint32_t box[2] = {bx, by}, estride[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, type, 2, const_cast<void*>(base), dims, strides, box, estride,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail("BONSAI_CUDA_GEMM=wgmma: cuTensorMapEncodeTiled failed (CUresult {}) for the {} ({} x {})",
         static_cast<int>(r), what, rows, cols);
  std::memcpy(out, &map, sizeof out);
}

}  // namespace

GemmTensorMaps gemm_tensor_maps(const uint8_t* xq, const float4* meta, int t, int kblocks, int swizzle,
                                int tokens) {
  GemmTensorMaps m{};
  const auto rows = static_cast<uint64_t>(t), kb = static_cast<uint64_t>(kblocks);
  // The activation: region r of a k-block = bytes [swizzle·r, swizzle·(r + 1)) of `tokens`
  // tokens' 256-byte records.
  const auto by = static_cast<uint32_t>(tokens);
  encode_2d(m.act, xq, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, kb * kActBytes, rows, static_cast<uint32_t>(swizzle),
            by, swizzle == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_32B, "GEMM activation");
  if (meta == nullptr) return m;
  encode_2d(m.meta, meta, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kb * 4, rows, 4, by, CU_TENSOR_MAP_SWIZZLE_NONE,
            "GEMM activation meta");
  return m;
}

}  // namespace bonsai::cuda
