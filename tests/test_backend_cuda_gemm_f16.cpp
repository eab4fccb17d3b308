// The FP16 prefill GEMM (kernels/cuda/gemm_f16.cuh; the default on compute capability 9.0,
// BONSAI_CUDA_GEMM=f16): its layout algebra on
// the host (the A fragment decoded from the stored tiled codes against the permuted activation),
// the fp16-exactness rule for scales, and on a device the kernel against double-precision dot
// products of the dequantized weights with a tolerance from the error analysis below.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bonsai/formats.h"
#include "kernels/cuda/gemm_f16_layout.h"
#include "kernels/cuda/tile_layout.h"
#include "test_util.h"
#if BONSAI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.h"
#endif

namespace bonsai {
namespace {

// For every lane, k-step and A register of wgmma m64nNk16 (f16, A in registers: lane 4g + t,
// a0 = row g, k 2t..2t+1; a1 = row g+8; a2 = row g, k 8+2t..; a3 = row g+8, k 8+2t..; the low
// half the smaller k), the codes the kernel extracts from the stored chunk ((word >> shift) & 3
// at bits 0 and 16) are those of the natural columns the permuted activation holds at those k
// positions. The chunk is written with tile_layout.h's code_pos, independently of the kernel.
TEST(CudaGemmF16Layout, FragmentCodesMatchPermutedActivation) {
  std::vector<int> natural(128, -1);  // permuted index -> natural column
  for (int n = 0; n < 128; ++n) {
    const int p = cuda::f16_act_index(n);
    ASSERT_GE(p, 0);
    ASSERT_LT(p, 128);
    ASSERT_EQ(natural[p], -1) << "f16_act_index is not a permutation";
    natural[p] = n;
  }
  std::mt19937 rng(11);
  uint8_t chunk[cuda::kCodeBytes] = {};
  int codes[16][128];
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 128; ++k) {
      codes[r][k] = static_cast<int>(rng() & 3);
      const cuda::CodePos pos = cuda::code_pos(r, k);
      chunk[pos.byte] |= static_cast<uint8_t>(codes[r][k] << pos.shift);
    }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int j = 0; j < 8; ++j) {
      uint32_t word = 0;
      std::memcpy(&word, chunk + 16 * lane + 4 * (j >> 1), 4);
      for (int r = 0; r < 4; ++r) {
        const uint32_t v = word >> cuda::f16_code_shift(j, r);
        for (int c = 0; c < 2; ++c) {
          const int row = g + 8 * (r & 1), kk = 16 * j + 8 * (r >> 1) + 2 * t + c;
          ASSERT_EQ(static_cast<int>((v >> (16 * c)) & 3), codes[row][natural[kk]])
              << "lane " << lane << " k-step " << j << " register " << r << " half " << c;
        }
      }
    }
  }
}

// f16_scale_ok over every fp16 bit pattern: true exactly when 2d (and so every (c - 1)·d, c in
// 0..3) is a finite fp16 equal to the exact product.
TEST(CudaGemmF16Layout, ScaleRuleIsExactlyTheFp16ExactOnes) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float d = fp16_to_f32(bits);
    bool exact = std::isfinite(d);
    for (int c = 0; c < 4 && exact; ++c) {
      const double want = static_cast<double>(c - 1) * d;
      const float got = fp16_to_f32(f32_to_fp16(static_cast<float>(want)));
      exact = std::isfinite(got) && static_cast<double>(got) == want;
    }
    ASSERT_EQ(cuda::f16_scale_ok(bits), exact) << "bits " << b << " d " << d;
  }
}

// The token exponent puts amax·2^-e into [2^14, 2^15) wherever the clamp allows it.
TEST(CudaGemmF16Layout, TokenExponentPicksTheTopSafeBinade) {
  for (float amax : {1e-30f, 1e-3f, 0.7f, 1.0f, 16383.9f, 16384.0f, 32767.0f, 32768.0f, 3e7f, 1e30f}) {
    int fe = 0;
    std::frexp(amax, &fe);
    const double scaled = std::ldexp(static_cast<double>(amax), -cuda::f16_token_exp(fe));
    EXPECT_GE(scaled, 16384.0) << amax;
    EXPECT_LT(scaled, 32768.0) << amax;
  }
  EXPECT_EQ(cuda::f16_token_exp(-200), -120);  // clamped: 2^±e stay normal floats
  EXPECT_EQ(cuda::f16_token_exp(200), 120);
}

// gemm_f16_launch declines what the fp16 kernel must not run (host logic, no GPU needed for these).
#if BONSAI_HAVE_CUDA
TEST(CudaGemmF16Select, DeclinesOtherKnobsGroupsAndInexactScales) {
  cuda::TiledJobs jobs;
  jobs.job[0].n = 100000;
  jobs.count = 1;
  EXPECT_FALSE(cuda::gemm_f16_launch(jobs, 1, 512, 132, true, cuda::GemmKernel::automatic));
  EXPECT_FALSE(cuda::gemm_f16_launch(jobs, 1, 512, 132, true, cuda::GemmKernel::wgmma));
  EXPECT_FALSE(cuda::gemm_f16_launch(jobs, 2, 512, 132, true, cuda::GemmKernel::f16));
  EXPECT_FALSE(cuda::gemm_f16_launch(jobs, 1, 512, 132, false, cuda::GemmKernel::f16));
}

// The tokens per block of a launch: 256 only when asked for and its grid covers the SMs, else
// 128 when that grid does, else 64.
TEST(CudaGemmF16Select, BlockTokensFollowTheGrids) {
  EXPECT_EQ(cuda::gemm_f16_block_tokens(256, 132, 264, 132), 256);
  EXPECT_EQ(cuda::gemm_f16_block_tokens(256, 131, 262, 132), 128);
  EXPECT_EQ(cuda::gemm_f16_block_tokens(128, 500, 1000, 132), 128);
  EXPECT_EQ(cuda::gemm_f16_block_tokens(256, 60, 120, 132), 64);
  EXPECT_EQ(cuda::gemm_f16_block_tokens(128, 66, 131, 132), 64);
}

// The model's choices, worked out by hand from its costs (gemm.cu, gemm_f16_model; 132 SMs, 27B
// launches at t = 256): the FFN gate + up (272 row blocks, k = 5120) stays whole at 128 tokens (5
// rounds x 40 = 200 units against 9 x 20 + 2 ranges' sums 56 + 3); the FFN down projection (40
// row blocks, k = 17408) runs 3 ranges of 46 k-blocks at 128 tokens (2 rounds x 46 + 3 x 4.1 + 3
// = 107.3 against 136 whole, 147.2 for 2 ranges, 121.3 for 4, and at 64 tokens 190.4 whole, 138.4
// for 4 ranges); 20 tokens of it run 64 tokens per block (40 blocks either way: 0.7 x the cost).
TEST(CudaGemmF16Select, ModelPicksTokensAndRanges) {
  const auto a = cuda::gemm_f16_model(272, 256, 40, int64_t{256} * 34816, 132);
  EXPECT_EQ(a.tokens, 128);
  EXPECT_EQ(a.kb_per_split, 40);
  const auto b = cuda::gemm_f16_model(40, 256, 136, int64_t{256} * 5120, 132);
  EXPECT_EQ(b.tokens, 128);
  EXPECT_EQ(b.kb_per_split, 46);
  const auto c = cuda::gemm_f16_model(40, 20, 136, int64_t{20} * 5120, 132);
  EXPECT_EQ(c.tokens, 64);
  EXPECT_EQ(a.whole, 0);
  EXPECT_EQ(b.whole, 0);
}

// The tail form (in-kernel fix-up, kFix = 2 units per split round), worked out by hand at t = 512:
// the FFN gate + up (1088 tiles = 8 rounds + 32) keeps 1056 tiles whole and splits the last 32 in
// 2 ranges (8 x 40 + 20 + 2 = 342 against 360 whole; 3 ranges 336, 4 ranges 332 are not 3 %
// better); the FFN down projection (160 tiles = 1 round + 28, 136 k-blocks) keeps 132 whole and
// splits 28 in 4 ranges of 34 (136 + 34 + 2 = 172 against the uniform 4 ranges' 5 x 34 + 10 = 180,
// 3 ranges' 4 x 46 + 8 = 192); the GDN projections (512 tiles = 3 rounds + 116) stay whole (116
// tiles in 2 ranges still take a round of 20 plus the fix-up: 162 against 160).
TEST(CudaGemmF16Select, TailModelSplitsOnlyTheLastRound) {
  const auto a = cuda::gemm_f16_model(272, 512, 40, int64_t{512} * 34816, 132, true);
  EXPECT_EQ(a.tokens, 128);
  EXPECT_EQ(a.kb_per_split, 20);
  EXPECT_EQ(a.whole, 1056);
  const auto b = cuda::gemm_f16_model(40, 512, 136, int64_t{512} * 5120, 132, true);
  EXPECT_EQ(b.tokens, 128);
  EXPECT_EQ(b.kb_per_split, 34);
  EXPECT_EQ(b.whole, 132);
  const auto c = cuda::gemm_f16_model(128, 512, 40, int64_t{512} * 16384, 132, true);
  EXPECT_EQ(c.tokens, 128);
  EXPECT_EQ(c.kb_per_split, 40);
  EXPECT_EQ(c.whole, 0);
  // With a 1 % gain asked of tail candidates (BONSAI_CUDA_GEMM_F16_TAIL_GAIN=1) the FFN gate + up
  // splits its last 32 tiles in 4 ranges of 10 (332 < 0.99 x 342).
  const auto d = cuda::gemm_f16_model(272, 512, 40, int64_t{512} * 34816, 132, true, 1);
  EXPECT_EQ(d.kb_per_split, 10);
  EXPECT_EQ(d.whole, 1056);
  EXPECT_EQ(a.stream, 0);
  EXPECT_EQ(d.stream, 0);
}

// Stream-K (round 2; stream_gain 1 %, by hand at t = 512, 132 SMs): the FFN down projection's 28
// tiles past the full round as 28 x 136 = 3808 units, chunks of ceil(3808 / 132) = 29 k-blocks
// (136 + 29 + kFix 2 = 167 against the tail form's 172); the GDN projections' 116 tiles past 3
// rounds, 4640 units in chunks of 36 (120 + 36 + 2 = 158 against 160 whole); the FFN gate + up
// 32 x 40 units in chunks of 10 (332 against the tail's 342); at 3 % neither the GDN projections
// (158 > 0.97 x 160) nor the FFN down (167 > 0.97 x 172) take it, and with TAIL_GAIN=1 the FFN
// gate + up keeps the tail's 4 ranges of 10 (332, not 1 % better). Off (-1): round 1's plans.
TEST(CudaGemmF16Select, StreamModelEvensTheLastRound) {
  const auto down = cuda::gemm_f16_model(40, 512, 136, int64_t{512} * 5120, 132, true, 3, 1);
  EXPECT_EQ(down.tokens, 128);
  EXPECT_EQ(down.whole, 132);
  EXPECT_EQ(down.stream, 29);
  EXPECT_EQ(down.kb_per_split, 136);
  const auto gdn = cuda::gemm_f16_model(128, 512, 40, int64_t{512} * 16384, 132, true, 3, 1);
  EXPECT_EQ(gdn.tokens, 128);
  EXPECT_EQ(gdn.whole, 396);
  EXPECT_EQ(gdn.stream, 36);
  const auto up = cuda::gemm_f16_model(272, 512, 40, int64_t{512} * 34816, 132, true, 3, 1);
  EXPECT_EQ(up.whole, 1056);
  EXPECT_EQ(up.stream, 10);
  EXPECT_EQ(cuda::gemm_f16_model(128, 512, 40, int64_t{512} * 16384, 132, true, 3, 3).stream, 0);
  EXPECT_EQ(cuda::gemm_f16_model(40, 512, 136, int64_t{512} * 5120, 132, true, 3, 3).stream, 0);
  const auto up1 = cuda::gemm_f16_model(272, 512, 40, int64_t{512} * 34816, 132, true, 1, 1);
  EXPECT_EQ(up1.stream, 0);
  EXPECT_EQ(up1.kb_per_split, 10);
  EXPECT_EQ(cuda::gemm_f16_model(40, 512, 136, int64_t{512} * 5120, 132, true, 3, -1).stream, 0);
  // (a tile's ranges under chunks of L: at most ceil((kb - 1) / L) + 1)
  EXPECT_EQ(cuda::gemm_f16_stream_ranges(136, 29), 6);
  EXPECT_EQ(cuda::gemm_f16_stream_ranges(40, 40), 2);
  EXPECT_EQ(cuda::gemm_f16_stream_ranges(40, 8), 6);
  EXPECT_EQ(cuda::gemm_f16_stream_ranges(16, 1), 16);
}
#endif

}  // namespace
}  // namespace bonsai

#if BONSAI_HAVE_CUDA
namespace bonsai {
namespace {

using testing_util::randn;

// Error bound of one output y = Σ_j w_j x_j of the fp16 GEMM (gemm_f16.cuh):
// - weights: (c - 1)·d is exact in fp16 (f16_scale_ok);
// - activation: x_j·2^-e rounded to nearest fp16, the token's amax·2^-e in [2^14, 2^15) (e from
//   f16_token_exp), so |x̃_j − x_j| <= 2^-11·|x_j| in fp16's normal range and <= 2^-25·2^e (half
//   the subnormal spacing 2^-24, scaled back) below it: Σ_j |w_j|·(2^-11·|x_j| + 2^-25·2^e). Two
//   terms (hi + lo, lo = fp16 of the exact residual, |residual| <= 2^-11·|hi|): 2^-22·|x_j| in
//   place of 2^-11·|x_j| (the floor is the same);
// - products: exact in the tensor core (11 x 11 significand bits);
// - accumulation: fp32 in the tensor core, k/16 steps per term and k range; its rounding is not
//   specified (truncation is allowed), so a step is taken to cost up to 4 ulps (2^-21) of the
//   running Σ|w x̃| (the sum of 16 products aligned to the largest, then added); the split's
//   reduce adds one rounding (2^-24) per range. Total (terms·k/16 + ranges + 1)·2^-21·Σ|w x|,
//   with 1 % margin for |x̃| vs |x|.
struct F16Bound {
  double act1 = 0, act2 = 0, mag = 0;  // Σ|w|(2^-11|x| + floor), Σ|w|(2^-22|x| + floor), Σ|w x|
  double tol(int64_t k, int terms, int ranges) const {
    return 1.01 * ((terms == 2 ? act2 : act1) + (terms * k / 16.0 + ranges + 1) * std::ldexp(mag, -21)) +
           1e-37;
  }
};
F16Bound f16_bound(const float* w, const float* x, int64_t k) {
  float amax = 0;
  for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(x[c]));
  int fe = 0;
  if (amax > 0) std::frexp(amax, &fe);
  const double floor_abs = amax > 0 ? std::ldexp(1.0, cuda::f16_token_exp(fe) - 25) : 0.0;
  F16Bound b;
  for (int64_t c = 0; c < k; ++c) {
    const double ax = std::fabs(static_cast<double>(x[c])), aw = std::fabs(w[c]);
    b.act1 += aw * (ax * 0x1p-11 + floor_abs);
    b.act2 += aw * (ax * 0x1p-22 + floor_abs);
    b.mag += aw * ax;
  }
  return b;
}

class CudaGemmF16 : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev);
    if (major != 9 || minor != 0) GTEST_SKIP() << "the fp16 GEMM needs compute capability 9.0";
  }
  void* dalloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    mem_.push_back(p);
    return p;
  }
  void TearDown() override {
    for (void* p : mem_) cudaFree(p);
  }
  int sms_ = 0;
  std::vector<void*> mem_;
};

// Adversarial and random inputs: codes 0..3 (code 3 = 2d), zero scales, scales from fp16
// subnormals to just under 2^15, partial tiles and row blocks, several weights per launch, odd
// token counts and partial token blocks, 64 and 128 tokens per block, one k range and several;
// tokens of very different magnitudes (1e-40 is a float subnormal: the exponent clamp), an
// all-zero token and a token with one large element among tiny ones (fp16 subnormals).
TEST_F(CudaGemmF16, MatchesDoubleReference) {
  struct Case {
    std::vector<int64_t> ns;
    int64_t k;
    std::vector<int> ts;
  };
  const Case cases[] = {
      {{77}, 384, {12, 13, 64, 77, 130}}, {{200}, 2048, {12, 130}}, {{300, 33, 1000}, 5120, {29, 130}}};
  int checked = 0;
  double sq[2] = {0, 0};  // Σ ((y − exact) / Σ|w x|)², one term and two
  for (const Case& cs : cases) {
    const int64_t k = cs.k, kb = k / 128;
    const size_t stride = row_bytes(DType::PQ2_0, static_cast<uint64_t>(k));
    cuda::TiledJobs jobs;
    std::vector<std::vector<float>> dense;
    std::mt19937 rng(static_cast<uint32_t>(k));
    for (const int64_t n : cs.ns) {
      std::vector<uint8_t> raw(stride * n);
      for (auto& b : raw) b = static_cast<uint8_t>(rng());
      for (int64_t r = 0; r < n; ++r)
        for (int64_t b = 0; b < kb; ++b) {
          const int kind = static_cast<int>((r * 5 + b) % 9);
          float d = std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -8 + static_cast<int>(rng() % 4));
          if (kind == 0) d = 0.0f;
          if (kind == 1) d = -d;
          if (kind == 2) d = std::ldexp(1.0f + (rng() % 1000) / 1000.0f, 14) * 0.999f;  // < 2^15
          if (kind == 3) d = std::ldexp(1.0f, -20);                                     // fp16 subnormal
          const uint16_t h = f32_to_fp16(d);
          ASSERT_TRUE(cuda::f16_scale_ok(h));
          std::memcpy(raw.data() + r * stride + b * 34, &h, 2);
        }
      dense.emplace_back(static_cast<size_t>(n * k));
      for (int64_t r = 0; r < n; ++r)
        dequantize_row(DType::PQ2_0, raw.data() + r * stride, dense.back().data() + r * k, k);
      auto* draw = static_cast<uint8_t*>(dalloc(raw.size()));
      auto* tiled = static_cast<uint8_t*>(dalloc(static_cast<size_t>(cuda::tiled_bytes(n, k, 1))));
      cudaMemcpy(draw, raw.data(), raw.size(), cudaMemcpyHostToDevice);
      cuda::repack_tiled(draw, stride, n, k, 1, tiled, nullptr);
      jobs.job[jobs.count].w = tiled;
      jobs.job[jobs.count].n = static_cast<int>(n);
      ++jobs.count;
    }
    int64_t rows = 0;
    for (int j = 0; j < jobs.count; ++j) rows += jobs.job[j].n;
    for (const int t : cs.ts) {
      auto x = randn(static_cast<size_t>(t) * k, 9 + t, 1.0f);
      const float mags[] = {1.0f, 1e-3f, 1e3f, 1e-30f, 1e20f, 1e-40f, 0.0f, 1.0f};
      for (int i = 0; i < t; ++i)
        for (int64_t c = 0; c < k; ++c) {
          float& v = x[static_cast<size_t>(i) * k + c];
          v *= mags[i % 8];
          if (i % 8 == 7) v = c == 5 ? 3e4f : v * 1e-6f;  // one large element, the rest tiny
        }
      // The reference and the bound's sums of the outputs checked (every row of small weights,
      // every 7th of large ones), once for all variants.
      std::vector<std::vector<double>> exact(jobs.count);
      std::vector<std::vector<F16Bound>> bounds(jobs.count);
      auto step = [&](int j) { return jobs.job[j].n > 300 ? 7 : 1; };
      for (int j = 0; j < jobs.count; ++j)
        for (int i = 0; i < t; ++i)
          for (int64_t r = 0; r < jobs.job[j].n; r += step(j)) {
            const float* wr = dense[j].data() + r * k;
            const float* xi = x.data() + static_cast<size_t>(i) * k;
            double e = 0;
            for (int64_t c = 0; c < k; ++c) e += static_cast<double>(wr[c]) * xi[c];
            exact[j].push_back(e);
            bounds[j].push_back(f16_bound(wr, xi, k));
          }
      auto* dx = static_cast<float*>(dalloc(x.size() * 4));
      cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
      auto* ts = static_cast<float*>(dalloc(static_cast<size_t>(t) * 4));
      constexpr int kRanges = 3;
      const size_t scratch = std::max<size_t>(cuda::gemm_tiled_scratch(jobs, t, k, sms_),
                                              static_cast<size_t>(kRanges) * t * rows);
      auto* partial = static_cast<float*>(dalloc(scratch * 4));
      for (const int terms : {1, 2}) {
        auto* xh = static_cast<uint8_t*>(dalloc(static_cast<size_t>(t) * kb * cuda::kActBytes * terms));
        cuda::act_to_f16(dx, xh, ts, t, k, nullptr, terms);
        for (const int tokens : {64, 128, 256})
          for (const int ranges : {0, kRanges})
            for (const int pipe : {0, 1})
              for (const int stages : {4, 6})
                for (const int persist : {0, 1}) {
                  if (pipe == 1 && terms == 2) continue;  // (two terms run 0)
                  if (tokens == 256 && (terms == 2 || pipe == 1 || stages == 6))
                    continue;                                               // (run 128 / 0 / 3)
                  if (stages == 6 && (terms == 2 || pipe == 1)) continue;   // (run 4)
                  if (persist == 1 && (terms == 2 || pipe == 1)) continue;  // (run 0)
                  cuda::TiledJobs run = jobs;
                  for (int j = 0; j < jobs.count; ++j) {
                    run.job[j].y = static_cast<float*>(dalloc(static_cast<size_t>(t) * jobs.job[j].n * 4));
                    cudaMemset(run.job[j].y, 0xff,
                               static_cast<size_t>(t) * jobs.job[j].n * 4);  // NaN: unwritten
                  }
                  cuda::gemm_f16(run, xh, ts, t, k, sms_, partial, nullptr, ranges, tokens, terms, pipe,
                                 stages, persist);
                  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                  // (ranges 0: the plan's split, at most kb/4 ranges)
                  const int nr = ranges ? ranges : static_cast<int>(kb / 4 + 1);
                  for (int j = 0; j < jobs.count; ++j) {
                    const int64_t n = jobs.job[j].n;
                    std::vector<float> y(static_cast<size_t>(t) * n);
                    cudaMemcpy(y.data(), run.job[j].y, y.size() * 4, cudaMemcpyDeviceToHost);
                    size_t o = 0;
                    for (int i = 0; i < t; ++i)
                      for (int64_t r = 0; r < n; r += step(j), ++o) {
                        const double got = y[i * n + r], want = exact[j][o];
                        ASSERT_NEAR(got, want, bounds[j][o].tol(k, terms, nr))
                            << "k " << k << " t " << t << " terms " << terms << " pipe " << pipe << " tokens "
                            << tokens << " stages " << stages << " persist " << persist << " ranges "
                            << ranges << " job " << j << " token " << i << " row " << r;
                        const F16Bound& bd = bounds[j][o];
                        // (the same variants for both terms; not where the floor dominates)
                        if (pipe == 0 && stages == 4 && tokens != 256 && persist == 0 && bd.mag > 0 &&
                            bd.act2 < bd.act1 / 64)
                          sq[terms - 1] += std::pow((got - want) / bd.mag, 2);
                        ++checked;
                      }
                  }
                }
        if (terms != 1) continue;
        // Stream-K (round 2; sums in the kernel, persistent): the tiles past the full rounds of 5
        // or 7 SMs in chunks of at least 3 or 5 k-blocks: a tile's pieces are its ranges, at most
        // gemm_f16_stream_ranges of them.
        const int ncount = cuda::gemm_f16_counters(jobs, t);
        auto* counters = static_cast<int*>(dalloc(static_cast<size_t>(ncount) * 4));
        cudaMemset(counters, 0, static_cast<size_t>(ncount) * 4);
        const int maxr = cuda::gemm_f16_stream_ranges(static_cast<int>(kb), 3);
        auto* slots = static_cast<float*>(dalloc(cuda::gemm_f16_scratch(jobs, t, maxr) * 4));
        for (const int tokens : {64, 128})
          for (const int sms : {5, 7})
            for (const int len : {3, 5}) {
              cuda::TiledJobs run = jobs;
              for (int j = 0; j < jobs.count; ++j) {
                run.job[j].y = static_cast<float*>(dalloc(static_cast<size_t>(t) * jobs.job[j].n * 4));
                cudaMemset(run.job[j].y, 0xff, static_cast<size_t>(t) * jobs.job[j].n * 4);  // NaN: unwritten
              }
              cuda::gemm_f16(run, xh, ts, t, k, sms, slots, nullptr, 1, tokens, 1, 0, 4, 1, counters, 2, 0,
                             len);
              ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
              const int nr = cuda::gemm_f16_stream_ranges(static_cast<int>(kb), len);
              for (int j = 0; j < jobs.count; ++j) {
                const int64_t n = jobs.job[j].n;
                std::vector<float> y(static_cast<size_t>(t) * n);
                cudaMemcpy(y.data(), run.job[j].y, y.size() * 4, cudaMemcpyDeviceToHost);
                size_t o = 0;
                for (int i = 0; i < t; ++i)
                  for (int64_t r = 0; r < n; r += step(j), ++o) {
                    ASSERT_NEAR(y[i * n + r], exact[j][o], bounds[j][o].tol(k, 1, nr))
                        << "stream, k " << k << " t " << t << " tokens " << tokens << " sms " << sms
                        << " len " << len << " job " << j << " token " << i << " row " << r;
                    ++checked;
                  }
              }
            }
      }
    }
  }
  EXPECT_GT(checked, 0);
  // Two terms cut the activation's rounding error by 2^11 (above), far below the accumulation's
  // (where fp16's subnormal floor does not dominate, the same in both):
  // their squared relative errors must sum to well under the one-term ones (a lo term that were
  // lost, misplaced or permuted wrongly would leave them at the one-term level or above).
  EXPECT_LT(sq[1], sq[0] / 16) << sq[0] << " " << sq[1];
}

// The 3-step weight decodes (BONSAI_CUDA_GEMM_F16_DECODE=3 and round 2's 5; some scales take their
// 4-step fallback)
// and the split-K sums in the kernel (BONSAI_CUDA_GEMM_F16_SUMS=fixup|tail) against the reduce
// kernel, bit for bit: with the same k ranges the fix-up adds the same slots in the same order
// (z = 0, 1, ... from 0.0f) whichever range arrives last; the tail form (sm_count 4, 5, 7: the
// tiles of the full rounds whole, the rest in 3 ranges) gives each whole tile's outputs of one
// range and each split tile's of 3 ranges. The counters end zero (ready for the next launch).
// Same weights and inputs as MatchesDoubleReference's, whose bound covers the reference runs.
TEST_F(CudaGemmF16, Decode3FixupAndTailMatchBitwise) {
  struct Case {
    std::vector<int64_t> ns;
    int64_t k;
    std::vector<int> ts;
  };
  const Case cases[] = {{{200}, 2048, {12, 130}}, {{300, 33, 1000}, 5120, {29, 130, 300}}};
  int checked = 0;
  for (const Case& cs : cases) {
    const int64_t k = cs.k, kb = k / 128;
    const size_t stride = row_bytes(DType::PQ2_0, static_cast<uint64_t>(k));
    cuda::TiledJobs jobs;
    std::mt19937 rng(static_cast<uint32_t>(k) + 1);
    std::vector<int> rb0;  // first row block of each job
    int rbs = 0;
    for (const int64_t n : cs.ns) {
      std::vector<uint8_t> raw(stride * n);
      for (auto& b : raw) b = static_cast<uint8_t>(rng());
      for (int64_t r = 0; r < n; ++r)
        for (int64_t b = 0; b < kb; ++b) {
          float d = std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -8 + static_cast<int>(rng() % 4));
          // scales whose d·2^-6 is not an fp16 (the 3-step decode's fallback): a subnormal, a small normal
          if ((r + b) % 7 == 3) d = std::ldexp(1.0f, -20);
          if ((r + 2 * b) % 11 == 4) d = std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -12);
          const uint16_t h = f32_to_fp16((r + b) % 5 == 0 ? -d : d);
          std::memcpy(raw.data() + r * stride + b * 34, &h, 2);
        }
      auto* draw = static_cast<uint8_t*>(dalloc(raw.size()));
      auto* tiled = static_cast<uint8_t*>(dalloc(static_cast<size_t>(cuda::tiled_bytes(n, k, 1))));
      cudaMemcpy(draw, raw.data(), raw.size(), cudaMemcpyHostToDevice);
      cuda::repack_tiled(draw, stride, n, k, 1, tiled, nullptr);
      jobs.job[jobs.count].w = tiled;
      jobs.job[jobs.count].n = static_cast<int>(n);
      ++jobs.count;
      rb0.push_back(rbs);
      rbs += static_cast<int>((n + 127) / 128);
    }
    for (const int t : cs.ts) {
      const auto x = randn(static_cast<size_t>(t) * k, 21 + t, 1.0f);
      auto* dx = static_cast<float*>(dalloc(x.size() * 4));
      cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
      auto* ts = static_cast<float*>(dalloc(static_cast<size_t>(t) * 4));
      auto* xh = static_cast<uint8_t*>(dalloc(static_cast<size_t>(t) * kb * cuda::kActBytes));
      cuda::act_to_f16(dx, xh, ts, t, k, nullptr, 1);
      constexpr int kRanges = 3;
      const size_t scratch = std::max<size_t>(
          cuda::gemm_tiled_scratch(jobs, t, k, sms_),
          cuda::gemm_f16_scratch(jobs, t,
                                 std::max(kRanges, cuda::gemm_f16_stream_ranges(static_cast<int>(kb), 4))));
      auto* partial = static_cast<float*>(dalloc(scratch * 4));
      const int ncount = cuda::gemm_f16_counters(jobs, t);
      auto* counters = static_cast<int*>(dalloc(static_cast<size_t>(ncount) * 4));
      cudaMemset(counters, 0, static_cast<size_t>(ncount) * 4);
      // One launch's outputs, every job concatenated ([job][t][n]).
      auto run = [&](int tokens, int ranges, int sums, int sms, int decode = 4, int stream = 0) {
        cuda::TiledJobs r = jobs;
        for (int j = 0; j < jobs.count; ++j) {
          r.job[j].y = static_cast<float*>(dalloc(static_cast<size_t>(t) * jobs.job[j].n * 4));
          cudaMemset(r.job[j].y, 0xff, static_cast<size_t>(t) * jobs.job[j].n * 4);  // NaN: unwritten
        }
        cuda::gemm_f16(r, xh, ts, t, k, sms, partial, nullptr, ranges, tokens, 1, 0, 4, 1,
                       sums > 0 ? counters : nullptr, sums, decode, stream);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> y;
        for (int j = 0; j < jobs.count; ++j) {
          std::vector<float> yj(static_cast<size_t>(t) * jobs.job[j].n);
          cudaMemcpy(yj.data(), r.job[j].y, yj.size() * 4, cudaMemcpyDeviceToHost);
          y.insert(y.end(), yj.begin(), yj.end());
        }
        return y;
      };
      auto same = [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; };
      for (const int tokens : {64, 128}) {
        const auto whole = run(tokens, 1, 0, sms_), reduce = run(tokens, kRanges, 0, sms_);
        const auto fixup = run(tokens, kRanges, 1, sms_);
        ASSERT_EQ(fixup.size(), reduce.size());
        for (size_t i = 0; i < reduce.size(); ++i)
          ASSERT_TRUE(same(fixup[i], reduce[i])) << "k " << k << " t " << t << " tokens " << tokens << " i "
                                                 << i << ": " << fixup[i] << " vs " << reduce[i];
        for (const int ranges : {1, kRanges})  // the 3-step decodes (3, 5): the same A values exactly
          for (const int dec : {3, 5}) {
            const auto dec3 = run(tokens, ranges, 0, sms_, dec);
            const auto& dec4 = ranges == 1 ? whole : reduce;
            for (size_t i = 0; i < dec4.size(); ++i)
              ASSERT_TRUE(same(dec3[i], dec4[i]))
                  << "decode " << dec << ", k " << k << " t " << t << " tokens " << tokens << " ranges "
                  << ranges << " i " << i;
          }
        const int nx = (t + tokens - 1) / tokens, tiles = nx * rbs;
        for (const int sms : {4, 5, 7}) {
          const auto tail = run(tokens, kRanges, 2, sms);
          const int w = tiles / sms * sms;
          size_t i = 0;
          for (int j = 0; j < jobs.count; ++j)
            for (int tok = 0; tok < t; ++tok)
              for (int64_t r = 0; r < jobs.job[j].n; ++r, ++i) {
                const int tile = tok / tokens + nx * (rb0[j] + static_cast<int>(r / 128));
                const float want = tile < w ? whole[i] : reduce[i];
                ASSERT_TRUE(same(tail[i], want))
                    << "k " << k << " t " << t << " tokens " << tokens << " sms " << sms << " job " << j
                    << " token " << tok << " row " << r << " tile " << tile << " of " << tiles << " whole "
                    << w << ": " << tail[i] << " vs " << want;
                ++checked;
              }
        }
        // Stream-K (round 2): the tiles past the full rounds as chunks of L k-blocks (at least
        // ceil(units / sms)). Where L divides kb every chunk is one tile's range [zL, zL + L): bit
        // for bit the tail form with kb / L ranges. Where it does not, the whole tiles are the
        // one-range run's bit for bit, and two runs (other arrival orders) agree bit for bit
        // (MatchesDoubleReference bounds the split ones).
        for (const int sms : {4, 5, 7})
          for (const int len : {static_cast<int>(kb / 4), static_cast<int>(kb / 2), 5, 6}) {
            const int w = tiles / sms * sms, units = (tiles - w) * static_cast<int>(kb);
            const int eff = std::max(len, (units + sms - 1) / sms);
            const auto sk = run(tokens, 1, 2, sms, 4, len), again = run(tokens, 1, 2, sms, 5, len);
            const auto tail = kb % eff == 0 ? run(tokens, static_cast<int>(kb) / eff, 2, sms) : whole;
            size_t i = 0;
            for (int j = 0; j < jobs.count; ++j)
              for (int tok = 0; tok < t; ++tok)
                for (int64_t r = 0; r < jobs.job[j].n; ++r, ++i) {
                  const int tile = tok / tokens + nx * (rb0[j] + static_cast<int>(r / 128));
                  ASSERT_TRUE(same(sk[i], again[i])) << "stream, k " << k << " t " << t << " i " << i;
                  if (tile >= w && kb % eff != 0) continue;
                  ASSERT_TRUE(same(sk[i], tail[i]))
                      << "stream, k " << k << " t " << t << " tokens " << tokens << " sms " << sms << " len "
                      << len << " (" << eff << ") job " << j << " token " << tok << " row " << r << " tile "
                      << tile << " of " << tiles << ": " << sk[i] << " vs " << tail[i];
                  ++checked;
                }
          }
        // whole and split outputs differ somewhere (else the check above could not tell them apart)
        bool differ = false;
        for (size_t i = 0; i < reduce.size() && !differ; ++i) differ = !same(whole[i], reduce[i]);
        EXPECT_TRUE(differ) << "k " << k << " t " << t;
      }
      std::vector<int> left(static_cast<size_t>(ncount));
      cudaMemcpy(left.data(), counters, left.size() * 4, cudaMemcpyDeviceToHost);
      for (int c = 0; c < ncount; ++c) ASSERT_EQ(left[c], 0) << "counter " << c << " k " << k << " t " << t;
    }
  }
  EXPECT_GT(checked, 0);
}

// Through the backend on a grid large enough for the fp16 kernel (8448 rows x 130 tokens: 198
// blocks of 64 tokens on 132 SMs): with the fp16 GEMM (the default on compute capability 9.0,
// BONSAI_CUDA_GEMM=f16) within f16_bound (the launch's plan: at most k/512 + 1 ranges; the terms
// of BONSAI_CUDA_GEMM_F16_TERMS), else the int8 kernels within theirs. Two launches on the same
// input (the cached fp16 activation) and one after the input changed (the cache invalidated).
TEST_F(CudaGemmF16, BackendLaunchMatchesReference) {
  CudaBackend be(0);
  const int64_t n = 8448, k = 384;
  const int t = 130;
  const size_t stride = row_bytes(DType::PQ2_0, static_cast<uint64_t>(k));
  std::vector<uint8_t> raw(stride * n);
  std::mt19937 rng(6);
  for (auto& b : raw) b = static_cast<uint8_t>(rng());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < k / 128; ++b) {
      const uint16_t h = f32_to_fp16((r + b) % 7 == 0 ? 0.0f : 0.001f * (1 + (r * 13 + b) % 50));
      std::memcpy(raw.data() + r * stride + b * 34, &h, 2);
    }
  std::vector<float> dense(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    dequantize_row(DType::PQ2_0, raw.data() + r * stride, dense.data() + r * k, k);
  Weight w;
  w.name = "f16 backend test weight";
  w.type = DType::PQ2_0;
  w.n = n;
  w.k = k;
  w.data = raw.data();
  w.nbytes = raw.size();
  be.prepare(w);
  const bool f16 = cuda::gemm_kernel() == cuda::GemmKernel::f16;  // (the default on 9.0)
  float* dx = be.alloc(static_cast<size_t>(t) * k);
  float* dy = be.alloc(static_cast<size_t>(t) * n);
  for (int round = 0; round < 3; ++round) {
    const auto x = randn(static_cast<size_t>(t) * k, round < 2 ? 3 : 4, 2.0f);
    if (round != 1) be.from_host(dx, x.data(), x.size());
    be.matmul(w, dx, dy, t);
    std::vector<float> y(static_cast<size_t>(t) * n);
    be.to_host(y.data(), dy, y.size());
    for (int i = 0; i < t; i += 5)
      for (int64_t r = i % 11; r < n; r += 97) {
        const float* wr = dense.data() + r * k;
        const float* xi = x.data() + static_cast<size_t>(i) * k;
        double exact = 0, b = 0;
        for (int64_t c0 = 0; c0 < k; c0 += 128) {  // the int8 kernels' bound (test_backend_cuda_gemm.cpp)
          float amax = 0;
          for (int64_t c = c0; c < c0 + 128; ++c) amax = std::max(amax, std::fabs(xi[c]));
          for (int64_t c = c0; c < c0 + 128; ++c) {
            exact += static_cast<double>(wr[c]) * xi[c];
            b += std::fabs(wr[c]) * (amax / 32639.0) / 2 + 4e-7 * 8 * std::fabs(wr[c] * xi[c]);
          }
        }
        const double tol =
            f16 ? f16_bound(wr, xi, k).tol(k, cuda::gemm_f16_terms(), static_cast<int>(k / 512 + 1))
                : 1.01 * b + 1e-30;
        ASSERT_NEAR(y[i * n + r], exact, tol) << "round " << round << " token " << i << " row " << r;
      }
  }
  be.release(dx);
  be.release(dy);
  be.unprepare(w);
}

// Through the backend: a weight with a scale whose double overflows fp16 (2^15) is never given to
// the fp16 kernel (CudaBackend's upload check), so with the fp16 GEMM chosen too its launch is
// exact to the int8 kernels' bound (and finite); a grid large enough for the fp16 kernel (8448 rows
// x 130 tokens: 198 blocks of 64 tokens on 132 SMs). (BONSAI_CUDA_GEMM=auto or mma: the int8
// kernels anyway.)
TEST_F(CudaGemmF16, OverflowingScalesStayOnTheInt8Kernels) {
  CudaBackend be(0);
  const int64_t n = 8448, k = 384;
  const int t = 130;
  const size_t stride = row_bytes(DType::PQ2_0, static_cast<uint64_t>(k));
  std::vector<uint8_t> raw(stride * n);
  std::mt19937 rng(5);
  for (auto& b : raw) b = static_cast<uint8_t>(rng());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < k / 128; ++b) {
      const uint16_t h = f32_to_fp16(r == 4000 && b == 1 ? 32768.0f : 0.01f);
      std::memcpy(raw.data() + r * stride + b * 34, &h, 2);
    }
  std::vector<float> dense(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    dequantize_row(DType::PQ2_0, raw.data() + r * stride, dense.data() + r * k, k);
  Weight w;
  w.name = "f16 overflow test weight";
  w.type = DType::PQ2_0;
  w.n = n;
  w.k = k;
  w.data = raw.data();
  w.nbytes = raw.size();
  be.prepare(w);
  const auto x = randn(static_cast<size_t>(t) * k, 3, 1.0f);
  float* dx = be.alloc(x.size());
  be.from_host(dx, x.data(), x.size());
  float* dy = be.alloc(static_cast<size_t>(t) * n);
  be.matmul(w, dx, dy, t);
  std::vector<float> y(static_cast<size_t>(t) * n);
  be.to_host(y.data(), dy, y.size());
  for (int i = 0; i < t; i += 3)
    for (int64_t r : {int64_t{0}, int64_t{3999}, int64_t{4000}, int64_t{4001}, n - 1}) {
      double exact = 0, b = 0;
      for (int64_t c0 = 0; c0 < k; c0 += 128) {  // the int8 kernels' bound (test_backend_cuda_gemm.cpp)
        float amax = 0;
        for (int64_t c = c0; c < c0 + 128; ++c) amax = std::max(amax, std::fabs(x[i * k + c]));
        for (int64_t c = c0; c < c0 + 128; ++c) {
          exact += static_cast<double>(dense[r * k + c]) * x[i * k + c];
          b += std::fabs(dense[r * k + c]) * (amax / 32639.0) / 2 +
               4e-7 * 8 * std::fabs(dense[r * k + c] * x[i * k + c]);
        }
      }
      ASSERT_TRUE(std::isfinite(y[i * n + r])) << "token " << i << " row " << r;
      ASSERT_NEAR(y[i * n + r], exact, 1.01 * b + 1e-30) << "token " << i << " row " << r;
    }
  be.release(dx);
  be.release(dy);
  be.unprepare(w);
}

}  // namespace
}  // namespace bonsai
#endif
