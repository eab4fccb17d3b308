// CudaBackend::top_k (kernels/cuda/topk.cu) against ref::top_k: the same ids and the
// same values bit for bit (a selection copies values, it computes nothing), on the
// vocabulary size, on sizes around the slice boundaries of the two-pass split, with
// ties, ±inf, ±0 and NaN; and a CUDA session whose recorded decode step is followed by
// the device selection. Skips with the reason when there is no device.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/model.h"
#include "bonsai/session.h"
#include "bonsai/synth.h"
#include "kernels/ref/topk.h"
#if BONSAI_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif
#include "temp_model.h"

namespace bonsai {
namespace {

#if BONSAI_HAVE_CUDA
constexpr float kInf = std::numeric_limits<float>::infinity();

// Gaussian logits, a quarter of them rounded onto a few levels (exact ties across
// slices), plus extremes and, when asked, NaNs.
std::vector<float> logits(size_t n, uint32_t seed, bool nans) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::uniform_int_distribution<int> pick(0, 63);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const int p = pick(rng);
    x[i] = d(rng);
    if (p < 16) x[i] = std::round(x[i]);
    if (p == 16) x[i] = kInf;
    if (p == 17) x[i] = -kInf;
    if (p == 18) x[i] = -0.0f;
    if (p == 19 && nans) x[i] = std::nanf("");
  }
  return x;
}

std::string skip_reason() {
  std::string why;
  return cuda_device_count(&why) == 0 ? "no CUDA device: " + why : std::string();
}

TEST(CudaTopK, MatchesReferenceBitForBit) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  CudaBackend be(0);
  // 248320: the Bonsai vocabulary; 2048 * j ± 1: one element more or less than whole slices.
  for (size_t n : {size_t{1}, size_t{64}, size_t{100}, size_t{2047}, size_t{2048}, size_t{2049}, size_t{4097},
                   size_t{248320}, size_t{300001}}) {
    for (bool nans : {false, true}) {
      const auto x = logits(n, static_cast<uint32_t>(n) + (nans ? 7 : 0), nans);
      float* p = be.alloc(n);
      be.from_host(p, x.data(), n);
      for (int k : {1, 2, 40, kMaxTopK}) {
        if (static_cast<size_t>(k) > n) continue;
        std::vector<int32_t> ids(k), want_ids(k);
        std::vector<float> vals(k), want_vals(k);
        be.top_k(p, static_cast<int64_t>(n), k, ids.data(), vals.data());
        ref::top_k(x.data(), static_cast<int64_t>(n), k, want_ids.data(), want_vals.data());
        ASSERT_EQ(ids, want_ids) << "n " << n << " k " << k << " nans " << nans;
        for (int i = 0; i < k; ++i) {
          EXPECT_EQ(vals[i], want_vals[i]) << "n " << n << " k " << k << " rank " << i;
          EXPECT_EQ(std::signbit(vals[i]), std::signbit(want_vals[i]))
              << "n " << n << " k " << k << " rank " << i;
        }
      }
      be.release(p);
    }
  }
}

TEST(CudaTopK, AllEqualAndAllNanRows) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  CudaBackend be(0);
  const size_t n = 248320;
  for (float fill : {0.5f, -kInf, std::nanf("")}) {
    std::vector<float> x(n, fill);
    float* p = be.alloc(n);
    be.from_host(p, x.data(), n);
    std::vector<int32_t> ids(kMaxTopK);
    std::vector<float> vals(kMaxTopK);
    be.top_k(p, static_cast<int64_t>(n), kMaxTopK, ids.data(), vals.data());
    for (int i = 0; i < kMaxTopK; ++i) {
      EXPECT_EQ(ids[i], i) << "fill " << fill;  // ties: the lowest ids, in order
      EXPECT_EQ(vals[i], std::isnan(fill) ? -kInf : fill);
    }
    be.release(p);
  }
  EXPECT_THROW(be.top_k(nullptr, 10, 0, nullptr, nullptr), Error);
  EXPECT_THROW(be.top_k(nullptr, 10, kMaxTopK + 1, nullptr, nullptr), Error);
}

// Recorded decode steps (CUDA graph replay) followed by the device selection: the
// candidates are the best of the very row the step left on the device (fetched by
// snapshot()), and steps through decode() and decode_top_k() share one recording.
TEST(CudaTopK, SessionCandidatesFollowTheRecordedStep) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const bonsai::testing::TempSynthModel tm(bonsai::testing::tiny_no_vocab(13), "cuda_topk.gguf");
  const std::unique_ptr<Model>& model = tm.model;
  SessionOptions so;
  so.n_ctx = 24;
  so.path = "cuda";
  Session s(*model, so);
  int32_t tok = 3;
  for (int step = 0; step < 16; ++step) {
    std::vector<int32_t> ids(40);
    std::vector<float> vals(40);
    if (step % 3 == 2) {  // a full-logits step in between
      const auto l = s.decode(tok);
      ref::top_k(l.data(), static_cast<int64_t>(l.size()), 1, ids.data(), vals.data());
      tok = ids[0];
      continue;
    }
    const auto best = s.decode_top_k(tok, 40);
    const std::vector<float> row = s.snapshot()->logits;
    ASSERT_EQ(row.size(), model->config().n_vocab);
    ref::top_k(row.data(), static_cast<int64_t>(row.size()), 40, ids.data(), vals.data());
    for (int i = 0; i < 40; ++i) {
      ASSERT_EQ(best[i].id, ids[i]) << "step " << step << " rank " << i;
      ASSERT_EQ(best[i].logit, vals[i]) << "step " << step << " rank " << i;
    }
    tok = best[0].id;
  }
}
#else
TEST(CudaTopK, MatchesReferenceBitForBit) { GTEST_SKIP() << "built without CUDA (BONSAI_CUDA=OFF)"; }
#endif

}  // namespace
}  // namespace bonsai
