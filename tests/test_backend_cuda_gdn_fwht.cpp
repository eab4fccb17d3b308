// The GDN decode step with the out-projection's input site folded in (cuda::gdn_decode with a
// GdnDecodeFwht; CudaBackend::gdn_site with a rotated output, BONSAI_CUDA_GDN_FWHT): the last CTA
// of each Hadamard block runs hadamard_kernel's arithmetic on the block's outputs, so everything
// must equal, bit for bit, the same site without the fold followed by its own hadamard() launch:
//   CudaGdnFwht.FoldedSiteMatchesSeparateLaunchBitwise: the 27B's GDN shape (48 value heads of
//     128, blocks of 1024, grouped, ±1 signs) and odd ones (tiled heads, no signs, d_v 64 with
//     blocks of 256, a block of one head, a block of 2048 that only one CTA per head can hold),
//     in clusters of 1, 2 and 4 CTAs per head (4: not folded, the separate launch), three steps
//     eagerly (the counters must wrap back to zero), then recorded as a decode step and replayed:
//     the rotated output, the matvec that reads its quantization (the out-projection: xq / meta
//     equal), the gated norm's output, the state and the conv state.
//     Both hand-offs of the fold (BONSAI_CUDA_GDN_FWHT_POLL=1: polled words, =0: the counted last CTA)
//     and both forms of the gated norm's cluster exchange (BONSAI_CUDA_GDN_DEC_PUSH=1: pushed partial
//     sums, =0: a cluster barrier and remote reads; the reference runs 0).
//   CudaGdnFwht.KnobValuesAreChecked: BONSAI_CUDA_GDN_FWHT, _FWHT_POLL, _DEC_PUSH and BONSAI_CUDA_GDN_EARLY
//     take 0 or 1 only.
// Needs a device with sm_90 code (Hopper); skips with the reason otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/formats.h"
#include "test_util.h"

#if BONSAI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_split_util.h"
#include "gdn_site_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gdn_decode.h"
#include "kernels/cuda/launch.h"

namespace bonsai {
namespace {

using namespace split_test;  // NOLINT(google-build-using-namespace): the shared helpers

// Sets the knobs for one scope (the backend reads them when it is made).
struct FwhtKnobs {
  FwhtKnobs(const char* fwht, const char* cluster, const char* poll = "1", const char* push = "1") {
    setenv("BONSAI_CUDA_GDN_FWHT", fwht, 1);
    setenv("BONSAI_CUDA_GDN_DEC_CLUSTER", cluster, 1);
    setenv("BONSAI_CUDA_GDN_FWHT_POLL", poll, 1);
    setenv("BONSAI_CUDA_GDN_DEC_PUSH", push, 1);
  }
  ~FwhtKnobs() {
    unsetenv("BONSAI_CUDA_GDN_FWHT");
    unsetenv("BONSAI_CUDA_GDN_DEC_CLUSTER");
    unsetenv("BONSAI_CUDA_GDN_FWHT_POLL");
    unsetenv("BONSAI_CUDA_GDN_DEC_PUSH");
  }
};

struct Case {
  GdnShape s;
  int embd;
  int64_t block;
  bool grouped, signs;
};

// Raw BF16 rows [n][k] of std `std` (the alpha/beta rows).
std::vector<uint8_t> bf16_rows(int64_t n, int64_t k, uint32_t seed, float std) {
  std::vector<uint8_t> b(2 * static_cast<size_t>(n * k));
  std::mt19937 rng(seed);
  std::normal_distribution<float> val(0.0f, std);
  for (int64_t i = 0; i < n * k; ++i) {
    const uint16_t bits = f32_to_bf16(val(rng));
    std::memcpy(b.data() + 2 * i, &bits, 2);
  }
  return b;
}

// Every output of a run: rotated, the out-projection's output, out, state, conv state.
using Outputs = std::vector<std::vector<float>>;

// Runs the case on a backend made under the current knobs: three eager steps, then (record)
// one recorded step and two replays, each from the same states and inputs as the eager runs'
// steps 0, 1, 2. Returns the outputs after each of those 3 (+ 3) steps.
std::vector<Outputs> run_case(const Case& cs, bool record) {
  CudaBackend be(0);
  const GdnShape& gs = cs.s;
  const int taps = 4, E = cs.embd;
  const int64_t C = 2 * gs.n_k * gs.d_k + static_cast<int64_t>(gs.n_v) * gs.d_v, DV = gs.n_v * gs.d_v;
  const int64_t n_out = 256;  // the out-projection's rows
  WeightPool pool(be, "gdn fwht test weight");
  auto bf16 = [&](int64_t rows, uint32_t seed) -> Weight& {
    return pool.bytes(
        DType::BF16, rows, E,
        bf16_rows(rows, E, seed, 0.5f * std::sqrt(std::min(1.0f, 320.0f / static_cast<float>(E)))));
  };
  Weight& wout = pool.ternary(n_out, DV, 80);
  auto a_h = randn(gs.n_v, 66), nw_h = randn(gs.d_v, 67, 0.2f);
  for (auto& v : a_h) v = -std::fabs(v);
  for (auto& v : nw_h) v += 1.0f;
  Weight &conv = pool.f32(randn(static_cast<size_t>(taps) * C, 70, 0.5f), C, taps),
         &ssm_a = pool.f32(a_h, 1, gs.n_v), &dt = pool.f32(randn(gs.n_v, 71), 1, gs.n_v),
         &norm = pool.f32(nw_h, 1, gs.d_v), &wa = bf16(gs.n_v, 72), &wb = bf16(gs.n_v, 73);
  auto put = [&](const std::vector<float>& v) {
    float* p = be.alloc(v.size());
    be.from_host(p, v.data(), v.size());
    return p;
  };
  std::vector<float> signs_h(static_cast<size_t>(DV));
  std::mt19937 rng(81);
  for (auto& v : signs_h) v = rng() & 1 ? 1.0f : -1.0f;
  const auto conv_state_h = randn(static_cast<size_t>(taps - 1) * C, 76),
             state_h = randn(static_cast<size_t>(DV) * gs.d_k, 77, 0.1f);
  float *conv_state = put(conv_state_h), *state = put(state_h), *signs = put(signs_h);
  float *qkv = be.alloc(static_cast<size_t>(C)), *z = be.alloc(static_cast<size_t>(DV)),
        *xn = be.alloc(static_cast<size_t>(E)),
        *scr = be.alloc(static_cast<size_t>(testing_util::gdn_scratch_floats(gs, 1))),
        *rotated = be.alloc(static_cast<size_t>(DV)), *y = be.alloc(static_cast<size_t>(n_out));
  Backend::GdnSite site;
  site.qkv = qkv;
  site.z = z;
  site.normed = xn;
  site.conv1d = &conv;
  site.alpha_w = &wa;
  site.beta_w = &wb;
  site.ssm_a = &ssm_a;
  site.dt_bias = &dt;
  site.norm_w = &norm;
  site.taps = taps;
  site.conv_state = conv_state;
  site.state = state;
  testing_util::bind_gdn_scratch(site, scr, gs, 1);
  site.shape = gs;
  site.norm_eps = 1e-6f;
  site.grouped = cs.grouped;
  site.rotated = rotated;
  site.signs = cs.signs ? signs : nullptr;
  site.block = cs.block;
  auto inputs = [&](int step) {  // step's qkv, z, normed input
    for (auto [p, n, seed] :
         {std::tuple{qkv, C, 90}, std::tuple{z, DV, 91}, std::tuple{xn, int64_t{E}, 92}}) {
      const auto h = randn(static_cast<size_t>(n), static_cast<uint32_t>(seed + 10 * step));
      be.from_host(p, h.data(), h.size());
    }
  };
  auto body = [&] {
    be.gdn_site(site, 1);
    be.matmul(wout, rotated, y, 1);
  };
  auto read = [&] {
    Outputs o;
    for (auto [p, n] :
         {std::pair{static_cast<const float*>(rotated), DV}, std::pair{static_cast<const float*>(y), n_out},
          std::pair{static_cast<const float*>(site.out), DV},
          std::pair{static_cast<const float*>(state), static_cast<int64_t>(state_h.size())},
          std::pair{static_cast<const float*>(conv_state), static_cast<int64_t>(conv_state_h.size())}}) {
      std::vector<float> h(static_cast<size_t>(n));
      be.to_host(h.data(), p, h.size());
      o.push_back(std::move(h));
    }
    return o;
  };
  std::vector<Outputs> out;
  for (int step = 0; step < 3; ++step) {
    inputs(step);
    body();
    out.push_back(read());
  }
  if (record) {  // the same three steps from the same states: one recorded, two replays
    be.from_host(conv_state, conv_state_h.data(), conv_state_h.size());
    be.from_host(state, state_h.data(), state_h.size());
    const int32_t tok = 0;
    inputs(0);
    // (the first call only marks the backend warm: its buffers have their sizes already)
    const bool began = be.begin_capture(&tok, 1, 0) || be.begin_capture(&tok, 1, 0);
    EXPECT_TRUE(began);
    body();
    be.end_capture();  // runs the recorded step once
    out.push_back(read());
    for (int step = 1; step < 3; ++step) {
      inputs(step);
      EXPECT_TRUE(be.replay_step(&tok, 1, 0));
      out.push_back(read());
    }
    be.drop_capture();
  }
  for (float* p : {conv_state, state, signs, qkv, z, xn, scr, rotated, y}) be.release(p);
  return out;
}

const Case kCases[] = {
    {{16, 48, 128, 128, 1e-6f}, 5120, 1024, true, true},  // the 27B
    {{4, 12, 128, 128, 1e-6f}, 320, 512, false, false},   // tiled heads, no signs
    {{2, 8, 64, 64, 1e-6f}, 256, 256, true, true},        // d_v 64: 4 heads per block
    {{1, 3, 128, 128, 1e-6f}, 128, 128, true, true},      // a block of one head
    {{2, 16, 128, 128, 1e-6f}, 256, 2048, true, true},    // 2048: one CTA per head only
};

TEST(CudaGdnFwht, FoldedSiteMatchesSeparateLaunchBitwise) {
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const Case& cs : kCases)
    for (const char* cluster : {"1", "2", "4"}) {
      const std::string what = "n_v " + std::to_string(cs.s.n_v) + " d_v " + std::to_string(cs.s.d_v) +
                               " block " + std::to_string(cs.block) + " cluster " + cluster;
      // Which runs fold (the predicate gdn_decode goes by): every case at clusters of 1, those
      // whose block fits 4 floats per thread of a CTA at 2 (not 2048), none at 4.
      {
        const FwhtKnobs knobs("1", cluster);
        cuda::GdnFused f;
        f.n_k = cs.s.n_k;
        f.n_v = cs.s.n_v;
        f.d_k = cs.s.d_k;
        f.d_v = cs.s.d_v;
        const bool want = cluster[0] == '1' || (cluster[0] == '2' && cs.block <= 1024);
        EXPECT_EQ(cuda::gdn_decode_folds(f, cuda::gdn_decode_config(), static_cast<int>(cs.block)), want)
            << what;
      }
      std::vector<Outputs> ref;
      {
        const FwhtKnobs knobs("0", cluster, "0", "0");  // the norm's cluster barrier
        ref = run_case(cs, false);
      }
      // both hand-offs of the fold: polled words (the default; the poll words must be left empty
      // for the next step, so three eager steps and the replays) and the counted last CTA; and
      // the gated norm's partial sums pushed (the default) or read after a cluster barrier
      const std::pair<const char*, const char*> forms[] = {{"1", "1"}, {"0", "1"}, {"1", "0"}};
      for (const auto& [poll, push] : forms) {
        std::vector<Outputs> got;
        {
          const FwhtKnobs knobs("1", cluster, poll, push);
          got = run_case(cs, true);
        }
        const char* names[] = {"rotated", "out-projection", "gated norm output", "state", "conv state"};
        ASSERT_EQ(got.size(), 6u) << what;
        for (size_t r = 0; r < got.size(); ++r)
          for (size_t i = 0; i < ref[r % 3].size(); ++i)
            expect_same_bits(ref[r % 3][i].data(), got[r][i].data(), ref[r % 3][i].size() * 4,
                             what + " poll " + poll + " push " + push +
                                 (r < 3 ? " eager step " : " recorded step ") + std::to_string(r % 3) + " " +
                                 names[i]);
      }
    }
}

TEST(CudaGdnFwht, KnobValuesAreChecked) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  for (const char* bad : {"2", "x", "10"}) {
    const FwhtKnobs knobs(bad, "2");
    EXPECT_THROW(CudaBackend be(0), Error) << bad;
  }
  for (const char* bad : {"2", "x", "10"}) {
    const FwhtKnobs knobs("1", "2", bad);
    EXPECT_THROW(CudaBackend be(0), Error) << "poll " << bad;
  }
  for (const char* knob : {"BONSAI_CUDA_GDN_EARLY", "BONSAI_CUDA_GDN_DEC_PUSH"})
    for (const char* bad : {"2", "x"}) {
      setenv(knob, bad, 1);
      EXPECT_THROW(CudaBackend be(0), Error) << knob << "=" << bad;
      unsetenv(knob);
    }
}

}  // namespace
}  // namespace bonsai
#endif  // BONSAI_HAVE_CUDA
