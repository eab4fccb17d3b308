// The prefill GDN walk's kernels against each other (kernels/cuda/gdn_walk.cu): the chunked
// kernel, with one and with two state columns per thread, performs per column the token
// kernel's operations in the token kernel's order, so all three must agree bit for bit: the
// outputs, the new recurrent state and the new conv state. The cases cover several chunks
// with a partial last one, chunks of 16 tokens (d_k = 256: the shared-memory cap), columns
// past d_v (d_v = 96 and 32 with two columns per thread), the gates from alpha/beta_in and
// from g/beta, and d_k = 128 (the compiled-in row-group count) next to the general path.
// Needs a device; skips with the reason when there is none.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

#if BONSAI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_dev_vec.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.h"

namespace bonsai {
namespace {

using testing_util::DevVec;
using testing_util::randn;

struct WalkResult {
  std::vector<float> out, state, conv_state;
};

// Index of the first element whose bits differ, or -1.
long first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<long>(i);
  return -1;
}

TEST(CudaGdnWalk, ChunkedKernelsMatchTokenKernelBitwise) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  struct Case {
    int n_k, n_v, d_k, d_v, t;
    bool raw_gates;  // alpha/beta_in with ssm_a/dt_bias, else g/beta
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const Case& cs : {Case{4, 12, 128, 128, 75, true}, Case{2, 4, 64, 96, 70, false},
                         Case{1, 2, 256, 64, 37, true}, Case{2, 2, 32, 32, 5, true}}) {
    const int taps = 4, t = cs.t;
    const int64_t qk = static_cast<int64_t>(cs.n_k) * cs.d_k,
                  C = 2 * qk + static_cast<int64_t>(cs.n_v) * cs.d_v;
    // conv as gdn_conv_norm leaves it: q (times 1/sqrt(d_k)) and k of unit L2 norm per head
    auto conv = randn(t * C, 300, 0.5f);
    for (int i = 0; i < t; ++i)
      for (int64_t head = 0; head < 2 * cs.n_k; ++head) {
        float* x = conv.data() + i * C + head * cs.d_k;
        double ss = 0;
        for (int e = 0; e < cs.d_k; ++e) ss += double(x[e]) * x[e];
        const float scale =
            static_cast<float>((head < cs.n_k ? 1.0 / std::sqrt(double(cs.d_k)) : 1.0) / std::sqrt(ss));
        for (int e = 0; e < cs.d_k; ++e) x[e] *= scale;
      }
    auto ga = randn(t * cs.n_v, 301), gb = randn(t * cs.n_v, 302), a = randn(cs.n_v, 303),
         dt = randn(cs.n_v, 304);
    for (auto& v : a) v = -std::fabs(v);
    if (!cs.raw_gates) {  // g = log(decay) < 0, beta in (0, 1)
      for (auto& v : ga) v = -0.3f * std::fabs(v);
      for (auto& v : gb) v = 1.0f / (1.0f + std::exp(-v));
    }
    const auto qkv = randn(t * C, 305), conv_state0 = randn((taps - 1) * C, 306),
               state0 = randn(static_cast<size_t>(cs.n_v) * cs.d_k * cs.d_v, 307, 0.1f);
    DevVec d_conv(conv), d_ga(ga), d_gb(gb), d_a(a), d_dt(dt), d_qkv(qkv);
    WalkResult res[3];
    for (int kernel = 0; kernel < 3; ++kernel) {
      DevVec d_state(state0), d_cs(conv_state0), d_out(std::vector<float>(t * cs.n_v * cs.d_v, 0.0f));
      cuda::GdnFused f;
      f.conv = d_conv.get();
      if (cs.raw_gates) {
        f.alpha = d_ga.get();
        f.beta_in = d_gb.get();
        f.ssm_a = d_a.get();
        f.dt_bias = d_dt.get();
      } else {
        f.g = d_ga.get();
        f.beta = d_gb.get();
      }
      f.state = d_state.get();
      f.out = d_out.get();
      f.qkv = d_qkv.get();
      f.conv_state = d_cs.get();
      f.taps = taps;
      f.t = t;
      f.n_k = cs.n_k;
      f.n_v = cs.n_v;
      f.d_k = cs.d_k;
      f.d_v = cs.d_v;
      cuda::gdn_walk(f, stream, kernel);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      res[kernel] = {d_out.host(), d_state.host(), d_cs.host()};
    }
    const std::string what =
        "d_k " + std::to_string(cs.d_k) + " d_v " + std::to_string(cs.d_v) + " t " + std::to_string(t);
    // not vacuous: the token kernel moved the state, wrote finite outputs, copied the last inputs
    EXPECT_GE(first_diff(res[0].state, state0), 0) << what;
    double mag = 0;
    for (float v : res[0].out) {
      ASSERT_TRUE(std::isfinite(v)) << what;
      mag += std::fabs(v);
    }
    EXPECT_GT(mag, 0.0) << what;
    EXPECT_EQ(std::memcmp(res[0].conv_state.data(), qkv.data() + (t - (taps - 1)) * C, C * sizeof(float)), 0)
        << what;
    for (int kernel = 1; kernel < 3; ++kernel) {
      const std::string wk = what + " kernel " + std::to_string(kernel);
      EXPECT_EQ(first_diff(res[kernel].out, res[0].out), -1) << wk << " out";
      EXPECT_EQ(first_diff(res[kernel].state, res[0].state), -1) << wk << " state";
      EXPECT_EQ(first_diff(res[kernel].conv_state, res[0].conv_state), -1) << wk << " conv state";
    }
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace bonsai
#endif  // BONSAI_HAVE_CUDA
