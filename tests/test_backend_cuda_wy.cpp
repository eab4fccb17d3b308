// The prefill walk in the chunked form on the tensor cores (kernels/cuda/gdn_tc2.cu, gdn_walk
// kernel 6) against the token kernel (kernel 0): outputs and new state equal up to summation order
// and the split TF32 products' rounding, the conv state bit for bit; where kernel 6 does not
// apply (d_k = 256) gdn_walk runs the chunked walk, bit-identical to the token kernel. The cases
// cover one partial chunk
// (t = 12), chunk boundaries (t = 64), several chunks with a partial last one (t = 33, 75, 300,
// 600), d_k = 32, 64, 128, 256 (256: the fallback), columns past d_v (d_v = 96 with 64
// columns per block), gates from alpha/beta_in and from g/beta with weak (g near 0), strong (g down
// to -30) and mixed decays, β over (0, 1), repeated keys, and an adversarial case for the
// triangular solve: β near 1, g near 0 and every odd key equal to the one before.
// Needs a device; skips with the reason when there is none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
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

enum class Gates { raw, weak, strong, mixed, sticky };

struct Case {
  int n_k, n_v, d_k, d_v, t;
  Gates gates;
  bool repeat_keys;  // every odd token's key equals the token before's
};

struct Result {
  std::vector<float> out, state, conv_state;
};

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float v : a) m = std::max(m, double(std::fabs(v)));
  return m;
}
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = a.size() == b.size() ? 0.0 : 1e30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

TEST(CudaGdnWy, MatchesTokenWalk) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const Case cases[] = {
      {4, 12, 128, 128, 300, Gates::raw, false},  {4, 12, 128, 128, 12, Gates::mixed, false},
      {4, 12, 128, 128, 64, Gates::weak, true},   {2, 4, 64, 96, 75, Gates::strong, false},
      {1, 2, 256, 64, 33, Gates::weak, false},    {2, 2, 32, 32, 37, Gates::mixed, true},
      {4, 12, 128, 128, 97, Gates::strong, true}, {4, 12, 128, 128, 600, Gates::mixed, false},
      {2, 4, 128, 128, 200, Gates::sticky, true}};
  int seed = 400;
  for (const Case& cs : cases) {
    const int taps = 4, t = cs.t;
    const int64_t qk = static_cast<int64_t>(cs.n_k) * cs.d_k,
                  C = 2 * qk + static_cast<int64_t>(cs.n_v) * cs.d_v;
    // conv as gdn_conv_norm leaves it: q (times 1/sqrt(d_k)) and k of unit L2 norm per head
    auto conv = randn(t * C, ++seed, 0.5f);
    if (cs.repeat_keys)
      for (int i = 1; i < t; i += 2)
        std::copy_n(conv.data() + (i - 1) * C + qk, qk, conv.data() + i * C + qk);
    for (int i = 0; i < t; ++i)
      for (int64_t head = 0; head < 2 * cs.n_k; ++head) {
        float* x = conv.data() + i * C + head * cs.d_k;
        double ss = 0;
        for (int e = 0; e < cs.d_k; ++e) ss += double(x[e]) * x[e];
        const float scale =
            static_cast<float>((head < cs.n_k ? 1.0 / std::sqrt(double(cs.d_k)) : 1.0) / std::sqrt(ss));
        for (int e = 0; e < cs.d_k; ++e) x[e] *= scale;
      }
    auto ga = randn(t * cs.n_v, ++seed), gb = randn(t * cs.n_v, ++seed), a = randn(cs.n_v, ++seed),
         dt = randn(cs.n_v, ++seed);
    for (auto& v : a) v = -std::fabs(v);
    std::mt19937 rng(++seed);
    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    if (cs.gates != Gates::raw) {  // g = log(decay) <= 0, beta in (0, 1)
      for (auto& v : ga) {
        const bool strong = cs.gates == Gates::strong || (cs.gates == Gates::mixed && uni(rng) < 0.3f);
        v = strong ? -(5.0f + 25.0f * uni(rng)) : -1e-4f * std::fabs(v);
      }
      for (auto& v : gb)
        v = cs.gates == Gates::sticky ? 1.0f - 0.02f * uni(rng)
                                      : 1.0f / (1.0f + std::exp(-(cs.gates == Gates::weak ? 2.0f + v : v)));
    }
    const auto qkv = randn(t * C, ++seed), conv_state0 = randn((taps - 1) * C, ++seed),
               state0 = randn(static_cast<size_t>(cs.n_v) * cs.d_k * cs.d_v, ++seed, 0.1f);
    DevVec d_conv(conv), d_ga(ga), d_gb(gb), d_a(a), d_dt(dt), d_qkv(qkv);
    auto run = [&](int kernel) {
      DevVec d_state(state0), d_cs(conv_state0), d_out(std::vector<float>(t * cs.n_v * cs.d_v, 0.0f));
      cuda::GdnFused f;
      f.t = t;
      f.n_v = cs.n_v;
      f.d_k = cs.d_k;
      f.d_v = cs.d_v;
      // kernel 6's scratch, filled with NaN: every float it reads must have been written first
      DevVec d_scr(std::vector<float>(kernel == 6 ? cuda::gdn_walk_tc2_scratch_floats(f) : 1, std::nanf("")));
      if (kernel == 6) f.scratch = d_scr.get();
      f.conv = d_conv.get();
      if (cs.gates == Gates::raw) {
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
      EXPECT_EQ(cudaGetLastError(), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      return Result{d_out.host(), d_state.host(), d_cs.host()};
    };
    const Result ref = run(0);
    const std::string what = "d_k " + std::to_string(cs.d_k) + " d_v " + std::to_string(cs.d_v) + " t " +
                             std::to_string(t) + " gates " + std::to_string(static_cast<int>(cs.gates));
    for (float v : ref.out) ASSERT_TRUE(std::isfinite(v)) << what;
    ASSERT_GT(max_abs(ref.out), 0.0) << what;
    ASSERT_GT(max_diff(ref.state, state0), 0.0) << what;
    // Both are fp32 and sum the same terms in other orders. Each output and state element is a
    // sum over <= t·(d_k + 32) products (the rows of S'k / S'q and the chunk's tokens); the
    // recurrence is non-expansive (decays <= 1, I - β k kᵀ with |k| = 1 and β in (0, 1)), so
    // rounding errors add up rather than grow. With unit roundoff u = 2^-24 the probabilistic
    // bound (Higham & Mary) is λ·sqrt(n)·u relative to the magnitudes; λ = 8. Kernel 6 forms each
    // product term in the split TF32 form: x·y within 3·2^-22·|x y| (dropped lo·lo and the two
    // split residues) instead of fp32's 2^-24, the sums in fp32 (accumulations in the tensor core
    // need not round to nearest: <= 2^-23 per add, within the constant): the same bound with
    // u = 3·2^-22 per term, 12x the fp32 one. It forms u = T·βV − (T·βe^{G}K)·S0 rather than the
    // walk's T·β(V − e^{G}K·S0): the same number of terms per element (C with T, d_k with S0),
    // bounded by the same |T|·|βe^{G}k|·|S0| magnitudes. A wrong index, decay or token would
    // show up as an error of the order of the values themselves.
    const double tk = 12.0 * 8.0 * std::sqrt(double(t) * (cs.d_k + 32)) * std::ldexp(1.0, -24);
    {
      const Result r = run(6);
      const std::string wk = what + " kernel 6";
      if (cs.d_k > 128) {  // gdn_walk_tc2_supported is false: the chunked walk, the token kernel's bits
        EXPECT_EQ(std::memcmp(r.out.data(), ref.out.data(), ref.out.size() * sizeof(float)), 0) << wk;
        EXPECT_EQ(std::memcmp(r.state.data(), ref.state.data(), ref.state.size() * sizeof(float)), 0) << wk;
        continue;
      }
      const double d_out = max_diff(r.out, ref.out), d_state = max_diff(r.state, ref.state);
      std::printf("  %s: out %.3g (max %.3g), state %.3g (max %.3g), tol %.3g\n", wk.c_str(), d_out,
                  max_abs(ref.out), d_state, max_abs(ref.state), tk);
      EXPECT_LE(d_out, tk * std::max(1.0, max_abs(ref.out))) << wk;
      EXPECT_LE(d_state, tk * std::max(1.0, max_abs(ref.state))) << wk;
      EXPECT_EQ(
          std::memcmp(r.conv_state.data(), ref.conv_state.data(), ref.conv_state.size() * sizeof(float)), 0)
          << wk;
    }
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace bonsai
#endif  // BONSAI_HAVE_CUDA
