// The CUDA prefill GEMM (kernels/cuda/gemm.cu) and the decode matvec on long rows against
// exact dot products of the dequantized weights, and the GEMM's (and the prefill attention's)
// throughput at the 27B shapes (with BONSAI_CUDA_BENCH=1). CudaGemmNumerics runs everywhere; the rest needs a
// device and skips with the reason when there is none.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bonsai/formats.h"
#include "test_util.h"
#if BONSAI_HAVE_CUDA
#include "cuda_backend_fixture.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gemm.h"
#endif

#include "kernels/cuda/tile_layout.h"

namespace bonsai {
namespace {

// The GEMM's integer -> float step (tile_layout.h, flush_value) is exact over the whole box
// of chain sums its MMAs can produce: Σc·hi in ±3·128·127, Σc·lo in [−3·128·128, 3·128·127],
// Σq in ±128·32639 (codes 0..3 over one 128-column block). Runs without a GPU.
TEST(CudaGemmNumerics, MagicNumberFlushIsExactOverTheWholeRange) {
  const int64_t hs[] = {-3 * 128 * 127, -1, 0, 1, 3 * 128 * 127};
  const int64_t ls[] = {-3 * 128 * 128, -1, 0, 1, 3 * 128 * 127};
  const int64_t qs[] = {-128 * 32639, -1, 0, 1, 128 * 32639};
  auto expect_exact = [](int64_t h, int64_t l, int64_t q) {
    const float got = cuda::flush_value(cuda::kFlushMagicBits + static_cast<int>(h),
                                        cuda::kFlushMagicBits + static_cast<int>(l),
                                        cuda::kFlushMagic + static_cast<float>(q));
    const int64_t exact = 256 * h + l - q;  // |exact| < 2^24: representable as float
    ASSERT_EQ(static_cast<double>(got), static_cast<double>(exact)) << h << " " << l << " " << q;
  };
  for (int64_t h : hs)
    for (int64_t l : ls)
      for (int64_t q : qs) expect_exact(h, l, q);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> dh(hs[0], hs[4]), dl(ls[0], ls[4]), dq(qs[0], qs[4]);
  for (int i = 0; i < 100000; ++i) expect_exact(dh(rng), dl(rng), dq(rng));
}

}  // namespace
}  // namespace bonsai

#if BONSAI_HAVE_CUDA
namespace bonsai {
namespace {

using testing_util::randn;

struct TernaryWeight {
  std::vector<uint8_t> bytes;
  std::vector<float> dense;  // [n][k] dequantized
  Weight w;
};

// Random codes (code 3 included where the format has it) and scales, every 5th group's
// scale zero; `dense` is the reference dequantization of the encoded bytes.
TernaryWeight make_ternary(DType type, int64_t n, int64_t k, uint32_t seed) {
  TernaryWeight h;
  const size_t stride = row_bytes(type, static_cast<uint64_t>(k));
  h.bytes.resize(stride * n);
  h.dense.resize(static_cast<size_t>(n * k));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(0, type == DType::PTQ1_0 ? 2 : 3);
  std::uniform_real_distribution<float> scale(0.02f, 0.08f);
  const int group = type == DType::Q2_0_G64 ? 64 : 128;
  std::vector<uint8_t> codes(k);
  std::vector<float> scales(k / group);
  for (int64_t r = 0; r < n; ++r) {
    for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
    for (size_t b = 0; b < scales.size(); ++b) scales[b] = (r * 3 + b) % 5 == 0 ? 0.0f : scale(rng);
    encode_ternary_row(type, codes.data(), scales.data(), h.bytes.data() + r * stride, k);
    dequantize_row(type, h.bytes.data() + r * stride, h.dense.data() + r * k, k);
  }
  h.w.name = std::string(dtype_name(type)) + " gemm test weight";
  h.w.type = type;
  h.w.n = n;
  h.w.k = k;
  h.w.data = h.bytes.data();
  h.w.nbytes = h.bytes.size();
  return h;
}

// The activation numerics of tile_layout.h: each input is within s/2 of s·q, s = amax/32639
// over its 128-column block, so |Δy| <= Σ_j |W_j|·s(j)/2; the products and the per-block
// float sums add ~(k/64 + 2) roundings of Σ|W x| (2^-24 each, taken as 4e-7 with margin).
double bound(const float* w, const float* x, int64_t k) {
  double b = 0, mag = 0;
  for (int64_t c0 = 0; c0 < k; c0 += 128) {
    float amax = 0;
    for (int64_t c = c0; c < c0 + 128; ++c) amax = std::max(amax, std::fabs(x[c]));
    for (int64_t c = c0; c < c0 + 128; ++c) {
      b += std::fabs(w[c]) * (amax / 32639.0) / 2;
      mag += std::fabs(w[c] * x[c]);
    }
  }
  return 1.01 * b + 4e-7 * mag * (2 + k / 64.0) + 1e-30;
}

class CudaGemm : public testing::CudaBackendFixture {
 protected:
  // Tokens with some zero 128-blocks (scale 0) and one all-zero token.
  static std::vector<float> activations(int t, int64_t k, uint32_t seed) {
    auto x = randn(static_cast<size_t>(t) * k, seed, 2.0f);
    for (int i = 0; i < t; ++i)
      for (int64_t c = 0; c < k; ++c)
        if (i == t / 2 || (i % 3 == 1 && c / 128 == (i / 3) % (k / 128))) x[i * k + c] = 0.0f;
    return x;
  }
  void check(const TernaryWeight& h, const std::vector<float>& x, const std::vector<float>& y, int t,
             const std::string& what) {
    const int64_t n = h.w.n, k = h.w.k;
    for (int i = 0; i < t; ++i)
      for (int64_t r = 0; r < n; ++r) {
        double exact = 0;
        for (int64_t c = 0; c < k; ++c) exact += static_cast<double>(h.dense[r * k + c]) * x[i * k + c];
        ASSERT_NEAR(y[i * n + r], exact, bound(h.dense.data() + r * k, x.data() + i * k, k))
            << what << " token " << i << " row " << r;
      }
  }
};

TEST_F(CudaGemm, EveryTernaryFormatMatchesReference) {
  struct Shape {
    int64_t n, k;
  };
  for (DType type : {DType::PQ2_0, DType::PTQ1_0, DType::Q2_0_G128, DType::Q2_0_G64})
    // partial tiles and row blocks; 2048 columns: few blocks, so the k-blocks are split (split-K)
    for (const Shape sh : {Shape{77, 384}, Shape{200, 640}, Shape{200, 2048}}) {
      TernaryWeight h = make_ternary(type, sh.n, sh.k, 7 + static_cast<uint32_t>(sh.n));
      be_->prepare(h.w);
      // odd counts, one full token block, and counts crossing token blocks
      for (int t : {cuda::kGemmMinTokens, 13, 64, 77, 130}) {
        const auto x = activations(t, sh.k, 100 + t);
        float* dx = up(x);
        float* dy = be_->alloc(static_cast<size_t>(t) * sh.n);
        be_->matmul(h.w, dx, dy, t);
        check(h, x, down(dy, static_cast<size_t>(t) * sh.n), t,
              std::string(dtype_name(type)) + " n " + std::to_string(sh.n) + " t " + std::to_string(t));
        be_->release(dx);
        be_->release(dy);
      }
      be_->unprepare(h.w);
    }
}

// Several weights in one launch (one row-block range per job) agree with the reference and,
// token by token, with the single-token matvec: both compute the same exact integer per
// block and differ only in the order of the float sums (a few roundings of Σ|W x|).
TEST_F(CudaGemm, MultiJobLaunchAgreesWithDecodeMatvec) {
  const int64_t k = 2048;  // 16 k-blocks: split over blockIdx.z (few row blocks)
  const int t = 29;
  TernaryWeight a = make_ternary(DType::PQ2_0, 40, k, 1), b = make_ternary(DType::PQ2_0, 300, k, 2),
                c = make_ternary(DType::Q2_0_G128, 33, k, 3), d = make_ternary(DType::Q2_0_G64, 130, k, 4);
  TernaryWeight* hs[] = {&a, &b, &c, &d};
  const Weight* ws[4];
  std::vector<float*> ys;
  for (int j = 0; j < 4; ++j) {
    be_->prepare(hs[j]->w);
    ws[j] = &hs[j]->w;
    ys.push_back(be_->alloc(static_cast<size_t>(t) * hs[j]->w.n));
  }
  const auto x = activations(t, k, 5);
  float* dx = up(x);
  be_->matmul_multi(ws, dx, ys, t);
  for (int j = 0; j < 4; ++j) {
    const TernaryWeight& h = *hs[j];
    const auto y = down(ys[j], static_cast<size_t>(t) * h.w.n);
    check(h, x, y, t, "job " + std::to_string(j));
    for (int i = 0; i < t; i += 7) {
      float* xi = up(std::vector<float>(x.begin() + i * k, x.begin() + (i + 1) * k));
      float* yi = be_->alloc(h.w.n);
      be_->matmul(h.w, xi, yi, 1);
      const auto y1 = down(yi, h.w.n);
      for (int64_t r = 0; r < h.w.n; ++r) {
        double mag = 0;
        for (int64_t col = 0; col < k; ++col) mag += std::fabs(h.dense[r * k + col] * x[i * k + col]);
        ASSERT_NEAR(y[i * h.w.n + r], y1[r], 4e-7 * mag * (2 + k / 64.0) + 1e-30)
            << "job " << j << " token " << i << " row " << r;
      }
      be_->release(xi);
      be_->release(yi);
    }
  }
  be_->release(dx);
  for (float* y : ys) be_->release(y);
  for (TernaryWeight* h : hs) be_->unprepare(h->w);
}

// The wgmma kernels (Hopper: the producer warp's bulk / TMA feed with the 128-byte and with the
// 32-byte swizzle, and the consumers' cp.async) against the mma.sync kernel on the same tiled
// weights and quantized
// activations: several weights per launch, partial tiles and token blocks, codes 0..3, zero
// scales, an all-zero token, one k range and several. Both form the same exact integer per
// (row, token, k-block) and add T·(d·s) in k-block order, so with the same k ranges (the mma
// kernel's plan, forced on the wgmma kernel) the results are equal bit for bit. (The wgmma
// kernel's own plan may pick other ranges; EveryTernaryFormatMatchesReference checks that path
// against the reference.) The mma kernel runs the staging of BONSAI_CUDA_GEMM_STAGE; the wgmma
// side does not depend on it, so passing under STAGE=0 and under STAGE=1 shows the two stagings
// equal bit for bit on these launches.
TEST_F(CudaGemm, WgmmaKernelMatchesMmaKernel) {
  int dev = 0, major = 0, minor = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (major != 9 || minor != 0) GTEST_SKIP() << "the wgmma kernel needs compute capability 9.0";
  struct Case {
    std::vector<int64_t> ns;
    int64_t k;
    std::vector<int> ts;
  };
  const Case cases[] = {{{77}, 384, {12, 13, 64, 77, 130}},
                        {{200}, 2048, {12, 64, 130}},
                        {{300, 33, 1000}, 5120, {29, 256, 300}},
                        {{5120}, 17408, {256}},
                        {{2048}, 6144, {512}}};
  int whole_launches = 0, split_launches = 0;
  for (const Case& cs : cases) {
    const int64_t k = cs.k, kb = k / 128;
    const size_t stride = row_bytes(DType::PQ2_0, static_cast<uint64_t>(k));
    cuda::TiledJobs jobs;
    std::vector<void*> mem;
    auto dalloc = [&](size_t bytes) {
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
      mem.push_back(p);
      return p;
    };
    std::mt19937 rng(static_cast<uint32_t>(k));
    for (const int64_t n : cs.ns) {  // random PQ2_0 rows: any codes, scales in [2^-8, 2^-4) or 0
      std::vector<uint8_t> raw(stride * n);
      for (auto& b : raw) b = static_cast<uint8_t>(rng());
      for (int64_t r = 0; r < n; ++r)
        for (int64_t b = 0; b < kb; ++b) {
          const float d = (r + b) % 7 == 0
                              ? 0.0f
                              : std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -8 + static_cast<int>(rng() % 4));
          const uint16_t h = f32_to_fp16(d);
          std::memcpy(raw.data() + r * stride + b * 34, &h, 2);
        }
      auto* draw = static_cast<uint8_t*>(dalloc(raw.size()));
      auto* tiled = static_cast<uint8_t*>(dalloc(static_cast<size_t>(cuda::tiled_bytes(n, k, 1))));
      cudaMemcpy(draw, raw.data(), raw.size(), cudaMemcpyHostToDevice);
      cuda::repack_tiled(draw, stride, n, k, 1, tiled, nullptr);
      jobs.job[jobs.count].w = tiled;
      jobs.job[jobs.count].n = static_cast<int>(n);
      ++jobs.count;
    }
    for (const int t : cs.ts) {
      auto x = randn(static_cast<size_t>(t) * k, 9 + t, 3.0f);
      for (int64_t c = 0; c < k; ++c) x[static_cast<size_t>(t / 2) * k + c] = 0.0f;  // an all-zero token
      auto* dx = static_cast<float*>(dalloc(x.size() * 4));
      cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
      auto* xq = static_cast<uint8_t*>(dalloc(static_cast<size_t>(t) * kb * cuda::kActBytes));
      auto* meta = static_cast<float4*>(dalloc(static_cast<size_t>(t) * kb * sizeof(float4)));
      cuda::quantize_act(dx, xq, meta, t, k, nullptr);
      const int ranges = cuda::gemm_tiled_ranges(jobs, 1, t, k, sms, cuda::GemmKernel::mma);
      int64_t rows = 0;
      for (int j = 0; j < jobs.count; ++j) rows += jobs.job[j].n;
      const size_t scratch =
          std::max<size_t>(cuda::gemm_tiled_scratch(jobs, t, k, sms), static_cast<size_t>(ranges) * t * rows);
      auto* partial = static_cast<float*>(dalloc(scratch * 4));
      // mma, then the wgmma kernels: the producer warp's bulk / TMA feed (128-byte swizzle with
      // the default consumer loop, then 32-byte), the consumers' cp.async, the producer kernel's
      // consumer loops 0, 1, 2 (128-byte swizzle, 64 tokens per block), then its 128-token blocks
      // (forced on every launch, also on grids the automatic rule leaves at 64).
      const cuda::GemmKernel kernels[] = {cuda::GemmKernel::mma,   cuda::GemmKernel::wgmma,
                                          cuda::GemmKernel::wgmma, cuda::GemmKernel::wgmma_cp,
                                          cuda::GemmKernel::wgmma, cuda::GemmKernel::wgmma,
                                          cuda::GemmKernel::wgmma, cuda::GemmKernel::wgmma};
      const int swizzles[] = {0, 128, 32, 0, 128, 128, 128, 128};
      const int loops[] = {-1, -1, -1, -1, 0, 1, 2, -1};
      const int tokens[] = {0, 0, 0, 0, 64, 64, 64, 128};
      constexpr int kVariants = 8;
      std::vector<std::vector<float>> ys[kVariants];
      for (int v = 0; v < kVariants; ++v) {
        const auto kernel = kernels[v];
        cuda::TiledJobs run = jobs;
        for (int j = 0; j < jobs.count; ++j) {
          run.job[j].y = static_cast<float*>(dalloc(static_cast<size_t>(t) * jobs.job[j].n * 4));
          cudaMemset(run.job[j].y, 0xff, static_cast<size_t>(t) * jobs.job[j].n * 4);  // NaN: unwritten
        }
        cuda::gemm_tiled(run, 1, xq, meta, t, k, sms, partial, nullptr, kernel, v ? ranges : 0, swizzles[v],
                         loops[v], tokens[v]);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        for (int j = 0; j < jobs.count; ++j) {
          ys[v].emplace_back(static_cast<size_t>(t) * jobs.job[j].n);
          cudaMemcpy(ys[v].back().data(), run.job[j].y, ys[v].back().size() * 4, cudaMemcpyDeviceToHost);
        }
      }
      (ranges > 1 ? split_launches : whole_launches)++;
      for (int v = 1; v < kVariants; ++v)
        for (int j = 0; j < jobs.count; ++j)
          for (size_t i = 0; i < ys[0][j].size(); ++i) {
            const float a = ys[0][j][i], b = ys[v][j][i];
            ASSERT_FALSE(std::isnan(a)) << "k " << k << " t " << t << " job " << j << " i " << i;
            ASSERT_EQ(std::memcmp(&a, &b, 4), 0)
                << "variant " << v
                << " (1: wgmma 128-byte swizzle, 2: 32-byte, 3: wgmma_cp, 4-6: loops 0-2, 7: 128 tokens) k "
                << k << " t " << t << " job " << j << " i " << i << ": " << a << " vs " << b;
          }
    }
    for (void* p : mem) cudaFree(p);
  }
  EXPECT_GT(whole_launches, 0);  // both paths of the kernel (y directly, partial sums) were compared
  EXPECT_GT(split_launches, 0);
}

// The automatic kernel choice per launch (gemm_launch_kernel): wgmma only where the device has it,
// for 128-column groups, and for grids of at least BONSAI_CUDA_GEMM_WG_MIN blocks per SM; the
// other kernels are kept as they are. Host logic only (runs without a GPU).
TEST(CudaGemmSelect, AutomaticChoiceFollowsTheGridSize) {
  using cuda::GemmKernel;
  const int sms = 132, min_blocks = cuda::gemm_wg_min_blocks();
  ASSERT_GE(min_blocks, 0);
  ASSERT_LE(min_blocks, 16);
  const int small = min_blocks * sms - 1, large = min_blocks * sms;
  if (small >= 0) {
    EXPECT_EQ(cuda::gemm_launch_kernel(GemmKernel::automatic, 1, small, sms, true), GemmKernel::mma);
  }
  EXPECT_EQ(cuda::gemm_launch_kernel(GemmKernel::automatic, 1, large, sms, true), GemmKernel::wgmma);
  EXPECT_EQ(cuda::gemm_launch_kernel(GemmKernel::automatic, 1, 100 * sms, sms, true), GemmKernel::wgmma);
  EXPECT_EQ(cuda::gemm_launch_kernel(GemmKernel::automatic, 2, 100 * sms, sms, true), GemmKernel::mma);
  EXPECT_EQ(cuda::gemm_launch_kernel(GemmKernel::automatic, 1, 100 * sms, sms, false), GemmKernel::mma);
  for (const GemmKernel k : {GemmKernel::mma, GemmKernel::wgmma, GemmKernel::wgmma_cp}) {
    EXPECT_EQ(cuda::gemm_launch_kernel(k, 1, 1, sms, true), k);
    EXPECT_EQ(cuda::gemm_launch_kernel(k, 1, 100 * sms, sms, true), k);
  }
}

// The tokens per block of a wgmma producer launch (gemm_wg_block_tokens): 128 only when asked
// for and the grid of 128-token blocks covers every SM. Host logic only (runs without a GPU).
TEST(CudaGemmSelect, WideTokenBlocksOnlyOnLargeGrids) {
  const int sms = 132;
  EXPECT_EQ(cuda::gemm_wg_block_tokens(64, 100 * sms, sms), 64);
  EXPECT_EQ(cuda::gemm_wg_block_tokens(128, sms, sms), 128);
  EXPECT_EQ(cuda::gemm_wg_block_tokens(128, 100 * sms, sms), 128);
  EXPECT_EQ(cuda::gemm_wg_block_tokens(128, sms - 1, sms), 64);
  EXPECT_EQ(cuda::gemm_wg_block_tokens(128, 0, sms), 64);
  const int knob = cuda::gemm_wg_tokens();
  EXPECT_TRUE(knob == 64 || knob == 128);
}

// The decode matvec on shapes long enough that each warp's range wraps its ring of unit
// slots several times and row groups are split between warps (kernels/cuda/matvec.cu).
TEST_F(CudaGemm, DecodeMatvecLongRowsMatchReference) {
  struct Case {
    DType type;
    int64_t n, k;
  };
  for (const Case cs : {Case{DType::PQ2_0, 4160, 17408}, Case{DType::Q2_0_G64, 1000, 17408},
                        Case{DType::PTQ1_0, 3000, 5120}}) {
    TernaryWeight h = make_ternary(cs.type, cs.n, cs.k, 77);
    be_->prepare(h.w);
    for (int t : {1, 5}) {
      const auto x = activations(t, cs.k, 200 + t);
      float* dx = up(x);
      float* dy = be_->alloc(static_cast<size_t>(t) * cs.n);
      be_->matmul(h.w, dx, dy, t);
      check(h, x, down(dy, static_cast<size_t>(t) * cs.n), t,
            std::string(dtype_name(cs.type)) + " k " + std::to_string(cs.k) + " t " + std::to_string(t));
      be_->release(dx);
      be_->release(dy);
    }
    be_->unprepare(h.w);
  }
}

// A random PQ2_0 weight of n rows × k columns (all scales 1/64), for the benchmarks.
void fill_bench_weight(TernaryWeight& h, int64_t k, int64_t n) {
  h.bytes.resize(static_cast<size_t>(row_bytes(DType::PQ2_0, k)) * n);
  uint64_t st = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < h.bytes.size(); i += 34) {
    for (size_t j = 2; j < 34; j += 8) {
      st ^= st << 13, st ^= st >> 7, st ^= st << 17;
      std::memcpy(&h.bytes[i + j], &st, 8);
    }
    const uint16_t dd = f32_to_fp16(1.0f / 64);
    std::memcpy(&h.bytes[i], &dd, 2);
  }
  h.w.name = "bench";
  h.w.type = DType::PQ2_0;
  h.w.n = n;
  h.w.k = k;
  h.w.data = h.bytes.data();
  h.w.nbytes = h.bytes.size();
}

int bench_tokens() {
  const char* te = std::getenv("BONSAI_CUDA_BENCH_T");  // tokens (default 512)
  return te && std::atoi(te) > 0 ? std::atoi(te) : 512;
}

// GEMM throughput at the 27B shapes, 512 tokens or BONSAI_CUDA_BENCH_T (docs/performance.md); weights random.
TEST(CudaBench, GemmAt27bShapes) {
  if (!std::getenv("BONSAI_CUDA_BENCH")) GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1 to run the GEMM benchmark";
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  CudaBackend be(0);
  struct Shape {
    int64_t k, n;
    int per_layer;  // how many of the 64 layers use the shape (for the whole-model estimate)
  };
  // 48 GDN layers: qkv 10240, gate 6144, ssm_out; 16 attention layers: q 12288, k/v 1024, out;
  // 64 FFN: gate/up 17408, down.
  const Shape shapes[] = {{5120, 10240, 48},  {5120, 6144, 48}, {5120, 12288, 16}, {5120, 1024, 32},
                          {5120, 17408, 128}, {6144, 5120, 64}, {17408, 5120, 64}};
  const int t = bench_tokens();
  std::printf("| K | N | t | us | T MAC/s (weight x token) |\n|---|---|---|---|---|\n");
  double total_s = 0;
  for (const Shape& sh : shapes) {
    TernaryWeight h;
    fill_bench_weight(h, sh.k, sh.n);
    be.prepare(h.w);
    auto x = randn(static_cast<size_t>(t) * sh.k, 8);
    float* dx = be.alloc(x.size());
    be.from_host(dx, x.data(), x.size());
    float* dy = be.alloc(static_cast<size_t>(t) * sh.n);
    // Includes the activation quantization (one small kernel) as in a model step.
    const double sec = be.time_recorded([&] { be.matmul(h.w, dx, dy, t); }, 20);
    const double macs = static_cast<double>(sh.k) * sh.n * t;
    std::printf("| %lld | %lld | %d | %.1f | %.1f |\n", static_cast<long long>(sh.k),
                static_cast<long long>(sh.n), t, sec * 1e6, macs / sec / 1e12);
    total_s += sec * sh.per_layer;
    be.unprepare(h.w);
    be.release(dx);
    be.release(dy);
  }
  std::printf("27B ternary matmuls (no head) for %d tokens: %.2f ms -> %.0f tok/s (GEMM + quantize)\n", t,
              total_s * 1e3, t / total_s);
}

// The GEMM launches of a 27B forward pass as the graph issues them (matmul_multi: GDN qkv + z,
// attention q + k + v, FFN gate + up in one launch each), t tokens; the split-K plan
// (BONSAI_CUDA_GEMM_SPLIT) is chosen per launch, so this is what it must be fitted on.
TEST(CudaBench, GemmLaunchesAt27b) {
  if (!std::getenv("BONSAI_CUDA_BENCH")) GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1 to run the GEMM benchmark";
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  CudaBackend be(0);
  struct Launch {
    int64_t k;
    std::vector<int64_t> n;  // the weights of one launch
    int per_pass;            // launches per forward pass (64 layers)
  };
  const Launch launches[] = {{5120, {10240, 6144}, 48},
                             {5120, {12288, 1024, 1024}, 16},
                             {5120, {17408, 17408}, 64},
                             {6144, {5120}, 64},
                             {17408, {5120}, 64}};
  const int t = bench_tokens();
  const char* split = std::getenv("BONSAI_CUDA_GEMM_SPLIT");
  std::printf("| K | N | t | split | us |\n|---|---|---|---|---|\n");
  double total_s = 0;
  for (const Launch& l : launches) {
    std::vector<TernaryWeight> h(l.n.size());
    std::vector<const Weight*> ws;
    std::vector<float*> ys;
    int64_t rows = 0;
    for (size_t j = 0; j < l.n.size(); ++j) {
      fill_bench_weight(h[j], l.k, l.n[j]);
      be.prepare(h[j].w);
      ws.push_back(&h[j].w);
      ys.push_back(be.alloc(static_cast<size_t>(t) * l.n[j]));
      rows += l.n[j];
    }
    auto x = randn(static_cast<size_t>(t) * l.k, 8);
    float* dx = be.alloc(x.size());
    be.from_host(dx, x.data(), x.size());
    const double sec = be.time_recorded([&] { be.matmul_multi(ws, dx, ys, t); }, 20);
    std::printf("| %lld | %lld | %d | %s | %.1f |\n", static_cast<long long>(l.k),
                static_cast<long long>(rows), t, split ? split : "model", sec * 1e6);
    total_s += sec * l.per_pass;
    for (size_t j = 0; j < l.n.size(); ++j) {
      be.unprepare(h[j].w);
      be.release(ys[j]);
    }
    be.release(dx);
  }
  std::printf("27B GEMM launches (no head) for %d tokens: %.2f ms -> %.0f tok/s (GEMM + quantize)\n", t,
              total_s * 1e3, t / total_s);
}

// The prefill attention (split + merge, BONSAI_CUDA_ATTN) of one 27B attention layer (24 query heads, 4 KV
// heads, head_dim 256) for t tokens after pos0 cached ones (BONSAI_CUDA_BENCH_T, default 512;
// BONSAI_CUDA_BENCH_POS0, default 256: the second chunk of a pp512 run).
TEST(CudaBench, AttentionPrefill27b) {
  if (!std::getenv("BONSAI_CUDA_BENCH"))
    GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1 to run the attention benchmark";
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  CudaBackend be(0);
  const int t = bench_tokens();
  const char* pe = std::getenv("BONSAI_CUDA_BENCH_POS0");
  const int pos0 = pe ? std::atoi(pe) : 256;
  const AttentionShape s{24, 4, 256, 1.0f / 16.0f};
  const size_t kv = static_cast<size_t>(pos0 + t) * s.n_head_kv * s.head_dim;
  auto q = randn(static_cast<size_t>(t) * s.n_head * s.head_dim, 91, 2.0f);
  auto kc = randn(kv, 92), vc = randn(kv, 93);
  float *dq = be.alloc(q.size()), *dk = be.alloc(kv), *dv = be.alloc(kv), *out = be.alloc(q.size());
  be.from_host(dq, q.data(), q.size());
  be.from_host(dk, kc.data(), kv);
  be.from_host(dv, vc.data(), kv);
  // Timed eagerly: a recorded graph would read the position from the step parameters (a
  // decode step's), not pos0. Two launches a call, ~170 µs each: the host stays ahead.
  be.attention(dq, dk, dv, out, t, pos0, s);
  be.sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 20; ++r) be.attention(dq, dk, dv, out, t, pos0, s);
  be.sync();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 20;
  std::printf("attention 24/4 x 256, t = %d after %d: %.1f us\n", t, pos0, sec * 1e6);
  for (float* p : {dq, dk, dv, out}) be.release(p);
}

}  // namespace
}  // namespace bonsai
#endif  // BONSAI_HAVE_CUDA
