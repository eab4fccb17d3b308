// The decode attention merge and the FWHT site of its output in one launch
// (cuda::attention_merge_fwht, BONSAI_CUDA_ATTN_FWHT): every output must equal, bit for bit, the
// two launches it replaces (attention_merge, then hadamard with the quantization), since each
// element sees the same operations on the same operands (the butterflies in the reference's
// order, split over lanes, warps and the cluster's blocks):
//   CudaMergeFwht.KernelMatchesTwoLaunchesBitwise: random partials (empty splits included: m =
//     -inf), the 27B shape (24 heads of 256, Hadamard blocks of 1024: clusters of 4) and C = 1, 2
//     and 8 blocks per Hadamard block, head_dim 128 and 256, with and without the gate and the
//     signs, t = 1 .. 3; out, y, the quantized activation and its scales.
//   CudaMergeFwht.BackendModesMatchBitwise: CudaBackend's attention_site -> hadamard -> matmul
//     under set_attn_fwht(false / true), eagerly and recorded as a decode step and replayed, and
//     the held-back merge read by another op first (launched alone): att, the rotated row and
//     the matmul's output (which reads the quantization).
//   CudaMergeFwht.KnobValuesAreChecked: BONSAI_CUDA_ATTN_FWHT and BONSAI_CUDA_SWI_REGS take 0 or 1,
//     BONSAI_CUDA_SWI_SITE 0, 1, 2 or 4.
// Needs a device with sm_90 code (Hopper); skips with the reason otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
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
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai {
namespace {

using namespace split_test;  // NOLINT(google-build-using-namespace): the shared helpers

// Partials [t][H][32][D + 2] as the split kernel leaves them: (max, sum, weighted V); split sp
// of head h is empty (m = -inf, sum 0, V 0) when (sp + h) % 7 == 6.
std::vector<float> random_partials(int t, int H, int D, uint32_t seed) {
  const int row = D + 2;
  std::vector<float> p(static_cast<size_t>(t) * H * 32 * row);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.5f, 3.0f);
  for (int i = 0; i < t * H; ++i)
    for (int sp = 0; sp < 32; ++sp) {
      float* r = p.data() + (static_cast<size_t>(i) * 32 + sp) * row;
      const bool empty = (sp + i % H) % 7 == 6;
      r[0] = empty ? -INFINITY : 2.0f * n01(rng);
      r[1] = empty ? 0.0f : u(rng);
      for (int d = 0; d < D; ++d) r[2 + d] = empty ? 0.0f : n01(rng);
    }
  return p;
}

std::vector<float> random_signs(int64_t n, uint32_t seed) {
  std::vector<float> s(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  for (auto& v : s) v = rng() & 1 ? 1.0f : -1.0f;
  return s;
}

TEST(CudaMergeFwht, KernelMatchesTwoLaunchesBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  struct Case {
    int H, D;
    int64_t block;
    int t;
    bool gate, signs;
  };
  const Case cases[] = {
      {24, 256, 1024, 1, true, true},   // the 27B: clusters of 4
      {24, 256, 1024, 2, true, false},  // two tokens, no signs
      {8, 128, 1024, 1, true, true},    // clusters of 8
      {4, 256, 512, 3, false, true},    // clusters of 2, no gate
      {4, 128, 128, 1, true, true},     // one block per Hadamard block
      {2, 256, 256, 2, true, true},     // one block, head_dim 256
  };
  for (const Case& cs : cases) {
    const std::string what = "H " + std::to_string(cs.H) + " D " + std::to_string(cs.D) + " block " +
                             std::to_string(cs.block) + " t " + std::to_string(cs.t) +
                             (cs.gate ? "" : " no gate") + (cs.signs ? "" : " no signs");
    DevMem mem;
    const int64_t k = static_cast<int64_t>(cs.H) * cs.D;
    const size_t count = static_cast<size_t>(cs.t) * k;
    const size_t qbytes = count / cuda::kBlockK * cuda::kActBytes,
                 mbytes = count / cuda::kBlockK * sizeof(float4);
    const float* part =
        mem.up(random_partials(cs.t, cs.H, cs.D, static_cast<uint32_t>(cs.H * 31 + cs.D + cs.t)));
    // the gate: qf's second half of each head row, stride 2·D (as attention_site passes it)
    const float* gate = cs.gate ? mem.up(randn(count * 2, 17u + cs.t)) + cs.D : nullptr;
    const float* signs = cs.signs ? mem.up(random_signs(k, 23)) : nullptr;
    struct Out {
      float *att, *y;
      uint8_t* xq;
      float4* meta;
    };
    Out o[2];
    for (Out& x : o) {
      x.att = mem.alloc<float>(count * 4);
      x.y = mem.alloc<float>(count * 4);
      x.xq = mem.alloc<uint8_t>(qbytes);
      x.meta = mem.alloc<float4>(mbytes);
      cudaMemset(x.att, 0xff, count * 4);
      cudaMemset(x.y, 0xff, count * 4);
      cudaMemset(x.xq, 0xff, qbytes);
      cudaMemset(x.meta, 0xff, mbytes);
    }
    cuda::attention_merge(part, o[0].att, cs.t, cs.H, 32, cs.D, gate, 2 * cs.D, nullptr);
    cuda::hadamard(o[0].att, signs, o[0].y, cs.t, k, cs.block, false, o[0].xq, o[0].meta, nullptr);
    ASSERT_TRUE(cuda::attention_merge_fwht(part, o[1].att, cs.t, cs.H, 32, cs.D, gate, 2 * cs.D, signs,
                                           o[1].y, cs.block, o[1].xq, o[1].meta, nullptr))
        << what;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    const auto a0 = down(o[0].att, count), a1 = down(o[1].att, count);
    const auto y0 = down(o[0].y, count), y1 = down(o[1].y, count);
    const auto q0 = down(o[0].xq, qbytes), q1 = down(o[1].xq, qbytes);
    const auto m0 = down(reinterpret_cast<const uint8_t*>(o[0].meta), mbytes),
               m1 = down(reinterpret_cast<const uint8_t*>(o[1].meta), mbytes);
    for (size_t i = 0; i < count; ++i) ASSERT_TRUE(std::isfinite(y0[i])) << what << " reference y at " << i;
    expect_same_bits(a0.data(), a1.data(), count * 4, what + " att");
    expect_same_bits(y0.data(), y1.data(), count * 4, what + " y");
    expect_same_bits(q0.data(), q1.data(), qbytes, what + " xq");
    expect_same_bits(m0.data(), m1.data(), mbytes, what + " meta");
  }
  // shapes it does not take: launches nothing
  DevMem mem;
  float* p = mem.alloc<float>(4096);
  uint8_t* xq = mem.alloc<uint8_t>(4096);
  float4* meta = mem.alloc<float4>(4096);
  EXPECT_FALSE(
      cuda::attention_merge_fwht(p, p, 1, 6, 32, 256, nullptr, 0, nullptr, p, 1024, xq, meta, nullptr))
      << "n_head % 4";
  EXPECT_FALSE(
      cuda::attention_merge_fwht(p, p, 1, 8, 16, 256, nullptr, 0, nullptr, p, 1024, xq, meta, nullptr))
      << "16 splits";
  EXPECT_FALSE(cuda::attention_merge_fwht(p, p, 1, 8, 32, 64, nullptr, 0, nullptr, p, 256, xq, meta, nullptr))
      << "head_dim 64";
  EXPECT_FALSE(
      cuda::attention_merge_fwht(p, p, 1, 32, 32, 128, nullptr, 0, nullptr, p, 2048, xq, meta, nullptr))
      << "16 heads per block";
}

// attention_site -> hadamard -> matmul (the graph's attention block) at t = 1 under
// set_attn_fwht(false / true), eagerly, recorded and replayed, from the same inputs each time.
TEST(CudaMergeFwht, BackendModesMatchBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  CudaBackend be(0);
  const int H = 8, HKV = 2, D = 256, pos0 = 37;
  const int64_t HD = static_cast<int64_t>(H) * D, E = 512, block = 1024;
  WeightPool pool(be, "merge fwht test weight");
  Weight& wo = pool.ternary(E, HD, 81);
  auto qn_h = randn(D, 82, 0.3f), kn_h = randn(D, 83, 0.3f);
  for (auto* vs : {&qn_h, &kn_h})
    for (auto& v : *vs) v += 1.0f;
  Weight &qnorm = pool.f32(qn_h, 1, D), &knorm = pool.f32(kn_h, 1, D);
  auto put = [&](const std::vector<float>& v) {
    float* p = be.alloc(v.size());
    be.from_host(p, v.data(), v.size());
    return p;
  };
  const size_t cache = static_cast<size_t>(pos0 + 1) * HKV * D;
  const auto qf_h = randn(static_cast<size_t>(2 * HD), 84), k_h = randn(static_cast<size_t>(HKV) * D, 85),
             v_h = randn(static_cast<size_t>(HKV) * D, 86), kc_h = randn(cache, 87), vc_h = randn(cache, 88),
             signs_h = random_signs(HD, 89);
  float *qf = put(qf_h), *k = put(k_h), *v = put(v_h), *kc = put(kc_h), *vc = put(vc_h),
        *signs = put(signs_h);
  float *q = be.alloc(static_cast<size_t>(HD)), *qgate = be.alloc(static_cast<size_t>(HD)),
        *att = be.alloc(static_cast<size_t>(HD)), *attr = be.alloc(static_cast<size_t>(HD)),
        *mix = be.alloc(static_cast<size_t>(E));
  Backend::AttentionSite as;
  as.qf = qf;
  as.k = k;
  as.v = v;
  as.q_norm = &qnorm;
  as.k_norm = &knorm;
  as.eps = 1e-6f;
  as.n_rot = 64;
  as.rope_base = 1e7f;
  as.k_cache = kc;
  as.v_cache = vc;
  as.q = q;
  as.qgate = qgate;
  as.out = att;
  as.shape = AttentionShape{H, HKV, D, 1.0f / std::sqrt(static_cast<float>(D))};
  auto body = [&] {
    be.attention_site(as, 1, pos0);
    be.hadamard(att, signs, attr, 1, HD, block, false);
    be.matmul(wo, attr, mix, 1);
  };
  const std::vector<std::pair<float*, size_t>> outs = {
      {att, static_cast<size_t>(HD)}, {attr, static_cast<size_t>(HD)}, {mix, static_cast<size_t>(E)}};
  const char* names[] = {"att", "rotated", "out-projection"};
  auto reset = [&] {
    be.from_host(qf, qf_h.data(), qf_h.size());
    be.from_host(k, k_h.data(), k_h.size());
    be.from_host(v, v_h.data(), v_h.size());
    be.from_host(kc, kc_h.data(), cache);
    be.from_host(vc, vc_h.data(), cache);
    for (const auto& [p, c] : outs) be.zero(p, c);
  };
  auto read = [&] {
    std::vector<std::vector<float>> out;
    for (const auto& [p, c] : outs) {
      std::vector<float> h(c);
      be.to_host(h.data(), p, c);
      out.push_back(std::move(h));
    }
    return out;
  };
  auto expect_ref = [&](const std::vector<std::vector<float>>& ref, const std::string& what) {
    const auto got = read();
    for (size_t i = 0; i < ref.size(); ++i)
      expect_same_bits(ref[i].data(), got[i].data(), ref[i].size() * 4, what + " " + names[i]);
  };
  be.set_attn_fwht(false);
  reset();
  body();
  const auto ref = read();
  for (float x : ref[1]) ASSERT_TRUE(std::isfinite(x)) << "reference rotated row";
  for (const bool on : {false, true}) {
    be.set_attn_fwht(on);
    run_step_modes(be, pos0, true, on ? "fused" : "two launches", reset, body,
                   [&](const std::string& w) { expect_ref(ref, w); });
  }
  // Held back, then read by another op first: launched alone, then the site as usual.
  be.set_attn_fwht(true);
  reset();
  be.attention_site(as, 1, pos0);
  std::vector<float> h(static_cast<size_t>(HD));
  be.to_host(h.data(), att, h.size());
  expect_same_bits(ref[0].data(), h.data(), h.size() * 4, "held-back merge, att read first");
  be.hadamard(att, signs, attr, 1, HD, block, false);
  be.matmul(wo, attr, mix, 1);
  expect_ref(ref, "held-back merge, att read first, then the site");
  for (float* p : {qf, k, v, kc, vc, signs, q, qgate, att, attr, mix}) be.release(p);
}

TEST(CudaMergeFwht, KnobValuesAreChecked) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const std::vector<const char*> attn_good = {"0", "1"}, attn_bad = {"2", "x", "10"},
                                 swi_good = {"0", "1", "2", "4"}, swi_bad = {"3", "8", "x", "10"};
  for (const auto& [knob, good, bad] : {std::tuple{"BONSAI_CUDA_ATTN_FWHT", &attn_good, &attn_bad},
                                        std::tuple{"BONSAI_CUDA_SWI_REGS", &attn_good, &attn_bad},
                                        std::tuple{"BONSAI_CUDA_SWI_SITE", &swi_good, &swi_bad}}) {
    for (const char* v : *bad) {
      setenv(knob, v, 1);
      EXPECT_THROW(CudaBackend be(0), Error) << knob << "=" << v;
    }
    for (const char* v : *good) {
      setenv(knob, v, 1);
      EXPECT_NO_THROW(CudaBackend be(0)) << knob << "=" << v;
    }
    unsetenv(knob);
  }
  EXPECT_THROW(CudaBackend(0).set_swi_site(3), Error);
}

}  // namespace
}  // namespace bonsai

#else

TEST(CudaMergeFwht, KernelMatchesTwoLaunchesBitwise) {
  GTEST_SKIP() << "built without CUDA (BONSAI_CUDA=OFF)";
}

#endif
