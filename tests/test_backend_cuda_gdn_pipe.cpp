// The prefill GDN pipeline kernels of kernels/cuda/gdn_pipe.cu against the kernels they replace,
// bit for bit (same arithmetic in the same order): gdn_conv_norm_tiled against gdn_conv_norm
// (taps 1..4, d_k != d_v, widths 32..256, t around the tile and load-batch sizes, the conv state
// read for the first taps-1 tokens), gated_rmsnorm_heads against gated_rmsnorm + transpose_heads
// (grouped and not, d = 128 in registers and other widths looped, rows not a multiple of a
// block's 8). The GDN site test (test_backend_cuda_sites.cpp) covers them inside the site against
// the reference backend. With BONSAI_CUDA_BENCH=1, CudaBench.GdnPipeline times the old and new
// kernels and the alpha/beta row variants at the 27B's shapes (t = 512). Needs a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bonsai/formats.h"
#include "test_util.h"

#if BONSAI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_dev_vec.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gdn_ab_mma.h"
#include "kernels/cuda/gdn_pipe.h"
#include "kernels/cuda/launch.h"

namespace bonsai {
namespace {

using testing_util::DevVec;
using testing_util::randn;

// Bitwise equality (so -0 vs +0 and NaN payloads count), reporting the first differences.
void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && ++bad <= 5)
      ADD_FAILURE() << what << " element " << i << ": " << a[i] << " vs " << b[i];
  EXPECT_EQ(bad, 0) << what;
}

TEST(CudaGdnPipe, ConvNormTiledMatchesBlockKernelBitwise) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  struct Case {
    int n_k, n_v, d_k, d_v, taps;
    std::vector<int> ts;
  };
  const Case cases[] = {
      {4, 12, 128, 128, 4, {1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 100}},  // the 27B's head widths
      {2, 4, 64, 96, 4, {5, 16, 31}},                                 // d_k != d_v
      {1, 3, 32, 64, 3, {2, 17}},
      {2, 2, 256, 128, 2, {1, 24}},  // 8 channels per lane
      {1, 2, 32, 256, 1, {9}},       // one tap: no previous inputs
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const Case& cs : cases) {
    ASSERT_TRUE(cuda::gdn_conv_norm_tiled_fits(cs.taps, cs.d_k, cs.d_v));
    const int64_t C = 2 * static_cast<int64_t>(cs.n_k) * cs.d_k + static_cast<int64_t>(cs.n_v) * cs.d_v;
    const auto w = randn(static_cast<size_t>(C) * cs.taps, 700, 0.5f);
    const auto st = randn(static_cast<size_t>(C) * std::max(cs.taps - 1, 1), 701);
    DevVec d_w(w), d_st(st);
    for (int t : cs.ts) {
      const auto qkv = randn(static_cast<size_t>(C) * t, 702 + t);
      DevVec d_x(qkv);
      const std::vector<float> nan(static_cast<size_t>(C) * t, std::nanf(""));
      DevVec ref(nan);
      cuda::gdn_conv_norm(d_x.get(), d_st.get(), d_w.get(), ref.get(), t, cs.taps, cs.n_k, cs.n_v, cs.d_k,
                          cs.d_v, 1e-6f, stream);
      const auto want = ref.host();
      for (int tile : {0, 8, 16, 32}) {
        DevVec got(nan);
        cuda::gdn_conv_norm_tiled(d_x.get(), d_st.get(), d_w.get(), got.get(), t, cs.taps, cs.n_k, cs.n_v,
                                  cs.d_k, cs.d_v, 1e-6f, stream, tile);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        expect_bitwise(got.host(), want,
                       "conv norm n_k " + std::to_string(cs.n_k) + " d_k " + std::to_string(cs.d_k) +
                           " d_v " + std::to_string(cs.d_v) + " taps " + std::to_string(cs.taps) + " t " +
                           std::to_string(t) + " tile " + std::to_string(tile));
      }
      expect_bitwise(d_st.host(), st, "conv state (read only)");
    }
  }
  cudaStreamDestroy(stream);
}

TEST(CudaGdnPipe, GatedNormHeadsMatchesNormAndTransposeBitwise) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  struct Case {
    int t, n_k, n_v, d;
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const Case& cs : {Case{37, 16, 48, 128}, Case{5, 4, 12, 128}, Case{3, 2, 6, 96}, Case{9, 1, 3, 64},
                         Case{1, 3, 3, 160}}) {
    const size_t n = static_cast<size_t>(cs.t) * cs.n_v * cs.d;
    const auto o = randn(n, 800), z = randn(n, 801), w = randn(static_cast<size_t>(cs.d), 802, 0.2f);
    DevVec d_o(o), d_z(z), d_w(w);
    const std::vector<float> nan(n, std::nanf(""));
    for (bool grouped : {false, true}) {
      DevVec y(nan), ref(nan);
      cuda::gated_rmsnorm(d_o.get(), d_z.get(), d_w.get(), y.get(), static_cast<int64_t>(cs.t) * cs.n_v, cs.d,
                          1e-6f, stream);
      if (grouped) cuda::transpose_heads(y.get(), ref.get(), cs.t, cs.n_v / cs.n_k, cs.n_k, cs.d, stream);
      DevVec got(nan);
      cuda::gated_rmsnorm_heads(d_o.get(), d_z.get(), d_w.get(), got.get(), cs.t, cs.n_v, cs.n_k, cs.d, 1e-6f,
                                grouped, stream);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      expect_bitwise(got.host(), grouped ? ref.host() : y.host(),
                     "gated norm t " + std::to_string(cs.t) + " n_k " + std::to_string(cs.n_k) + " n_v " +
                         std::to_string(cs.n_v) + " d " + std::to_string(cs.d) +
                         (grouped ? " grouped" : " tiled"));
    }
  }
  cudaStreamDestroy(stream);
}

// Every alpha/beta rows variant of gdn_ab_mma adds the same products in the same order: equal to
// variant 0 (session 6's layout) bit for bit; partial token and row tiles, a k tail, F32 / F16 / BF16.
TEST(CudaGdnPipe, AbRowVariantsMatchBitwise) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  struct Case {
    int n_v, k, t;
    cuda::RawType type;
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const Case& cs : {Case{48, 5120, 40, cuda::RawType::BF16}, Case{5, 100, 45, cuda::RawType::F32},
                         Case{3, 96, 16, cuda::RawType::F16}, Case{12, 1028, 17, cuda::RawType::BF16},
                         Case{7, 516, 33, cuda::RawType::F32}}) {
    const size_t elem = cs.type == cuda::RawType::F32 ? 4 : 2, row_bytes = elem * cs.k;
    const auto w32 = randn(2 * static_cast<size_t>(cs.n_v) * cs.k, 900, 0.5f);
    std::vector<uint8_t> bytes(2 * cs.n_v * row_bytes);
    for (size_t i = 0; i < w32.size(); ++i) {
      if (cs.type == cuda::RawType::F32) {
        std::memcpy(bytes.data() + 4 * i, &w32[i], 4);
      } else {
        const uint16_t b = cs.type == cuda::RawType::BF16 ? f32_to_bf16(w32[i]) : f32_to_fp16(w32[i]);
        std::memcpy(bytes.data() + 2 * i, &b, 2);
      }
    }
    DevVec d_w(std::vector<float>((bytes.size() + 3) / 4, 0.0f)),
        d_x(randn(static_cast<size_t>(cs.t) * cs.k, 901));
    ASSERT_EQ(cudaMemcpy(d_w.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    const auto* wa = reinterpret_cast<const uint8_t*>(d_w.get());
    const uint8_t* wb = wa + cs.n_v * row_bytes;
    ASSERT_TRUE(cuda::gdn_ab_mma_fits(d_x.get(), wa, wb, row_bytes, cs.type, cs.k));
    const std::vector<float> nan(static_cast<size_t>(cs.t) * cs.n_v, std::nanf(""));
    std::vector<float> a0, b0;
    for (int v = 0; v < cuda::kGdnAbMmaVariants; ++v) {
      DevVec d_a(nan), d_b(nan);
      cuda::gdn_ab_mma(d_x.get(), wa, wb, row_bytes, cs.type, cs.k, cs.n_v, cs.t, d_a.get(), d_b.get(),
                       stream, v);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const std::string what = "ab rows n_v " + std::to_string(cs.n_v) + " k " + std::to_string(cs.k) +
                               " variant " + std::to_string(v);
      if (v == 0) {
        a0 = d_a.host();
        b0 = d_b.host();
        for (float x : a0) ASSERT_TRUE(std::isfinite(x)) << what;  // every output written
        for (float x : b0) ASSERT_TRUE(std::isfinite(x)) << what;
      } else {
        expect_bitwise(d_a.host(), a0, what + " alpha");
        expect_bitwise(d_b.host(), b0, what + " beta");
      }
    }
  }
  cudaStreamDestroy(stream);
}

// Device time per launch of f (averaged over reps after a warm-up), in microseconds.
template <class F>
double time_us(cudaStream_t s, int reps, F f) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < 3; ++i) f();
  cudaEventRecord(e0, s);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(e1, s);
  cudaEventSynchronize(e1);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 1000.0 * ms / reps;
}

// The 27B's GDN layer at t = 512 (n_k 16, n_v 48, d 128, 4 taps, alpha/beta rows BF16 over 5120
// columns): each kernel back to back on the same buffers (L2-warm inputs, as in the layer).
TEST(CudaBench, GdnPipeline) {
  if (!std::getenv("BONSAI_CUDA_BENCH")) GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1 to run the GDN benchmark";
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const int t = 512, n_k = 16, n_v = 48, d = 128, taps = 4, k = 5120, reps = 200;
  const int64_t C = 2 * n_k * d + n_v * d;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  DevVec qkv(randn(static_cast<size_t>(C) * t, 1)), st(randn(static_cast<size_t>(C) * (taps - 1), 2)),
      w(randn(static_cast<size_t>(C) * taps, 3, 0.5f)), conv(std::vector<float>(static_cast<size_t>(C) * t)),
      o(randn(static_cast<size_t>(t) * n_v * d, 4)), z(randn(static_cast<size_t>(t) * n_v * d, 5)),
      gw(randn(d, 6)), y(std::vector<float>(static_cast<size_t>(t) * n_v * d)),
      y2(std::vector<float>(static_cast<size_t>(t) * n_v * d)), x(randn(static_cast<size_t>(t) * k, 7)),
      ab(std::vector<float>(static_cast<size_t>(n_v) * k, 0.01f)), alpha(std::vector<float>(t * n_v)),
      beta(std::vector<float>(t * n_v));
  const auto* wa = reinterpret_cast<const uint8_t*>(ab.get());
  const uint8_t* wb = wa + static_cast<size_t>(n_v) * k * 2;
  auto report = [](const char* what, double us) { std::printf("[bench] %-44s %8.2f us\n", what, us); };
  report("gdn_conv_norm (block per token, head)", time_us(s, reps, [&] {
           cuda::gdn_conv_norm(qkv.get(), st.get(), w.get(), conv.get(), t, taps, n_k, n_v, d, d, 1e-6f, s);
         }));
  for (int tile : {8, 16, 32, 64}) {
    const std::string what = "gdn_conv_norm_tiled tile " + std::to_string(tile);
    report(what.c_str(), time_us(s, reps, [&] {
             cuda::gdn_conv_norm_tiled(qkv.get(), st.get(), w.get(), conv.get(), t, taps, n_k, n_v, d, d,
                                       1e-6f, s, tile);
           }));
  }
  report("gated_rmsnorm + transpose_heads", time_us(s, reps, [&] {
           cuda::gated_rmsnorm(o.get(), z.get(), gw.get(), y.get(), static_cast<int64_t>(t) * n_v, d, 1e-6f,
                               s);
           cuda::transpose_heads(y.get(), y2.get(), t, n_v / n_k, n_k, d, s);
         }));
  report("gated_rmsnorm alone", time_us(s, reps, [&] {
           cuda::gated_rmsnorm(o.get(), z.get(), gw.get(), y.get(), static_cast<int64_t>(t) * n_v, d, 1e-6f,
                               s);
         }));
  report("gated_rmsnorm_heads (grouped)", time_us(s, reps, [&] {
           cuda::gated_rmsnorm_heads(o.get(), z.get(), gw.get(), y2.get(), t, n_v, n_k, d, 1e-6f, true, s);
         }));
  for (int v = 0; v < cuda::kGdnAbMmaVariants; ++v) {
    const std::string what = "gdn_ab_mma variant " + std::to_string(v) + " (BF16)";
    report(what.c_str(), time_us(s, reps, [&] {
             cuda::gdn_ab_mma(x.get(), wa, wb, static_cast<size_t>(k) * 2, cuda::RawType::BF16, k, n_v, t,
                              alpha.get(), beta.get(), s, v);
           }));
  }
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace bonsai
#endif  // BONSAI_HAVE_CUDA
