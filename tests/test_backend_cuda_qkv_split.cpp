// The mixers' decode sites reading the unsummed outputs of their input launch (SplitSums,
// launch.h): the GDN decode step (cuda::gdn_decode with split, the qkv+z launch's two jobs) and the
// attention prep (cuda::attention_prep with split, the q/k/v launch's three jobs). Each site adds
// an element's slots in rank order from 0.0f (split_sums.cuh, sum_slots), the same additions as
// the matvec's own fix-up, and computes everything else as before, so every output must equal,
// bit for bit, the first-rank fix-up followed by the same site without split:
//   CudaQkvSplit.GdnDecodeMatchesFixupBitwise: the 27B's GDN shape (5120 -> 10240 + 6144, 8 ranks
//     per group) and odd ones (d_k 32 .. 256, d_k != d_v, n_v / n_k = 1 .. 3, taps 2 .. 4, every
//     group whole (k = 128), nr > 8 (the loads in more than one batch), and under a one-SM plan
//     groups whole and split by 2 in one launch), in clusters of 1, 2 and 4 CTAs, with and
//     without the alpha/beta weights before the wait, with the membar-free cluster arrive
//     (BONSAI_CUDA_GDN_DEC_MEMBAR=1, against the former barrier) and with the conv hand-off's
//     count before the wait (BONSAI_CUDA_GDN_DEC_COUNT=1, the states loaded before the wait) or
//     after the sums, the slots read by plain loads or ld.global.cg (BONSAI_CUDA_QKV_LOAD): the
//     output, the state, the conv state, and qkv / z themselves (written back by the step).
//   CudaQkvSplit.AttentionPrepMatchesFixupBitwise: the 27B's attention shape (5120 -> 12288 +
//     1024 + 1024) and odd ones, t = 1, 3 and 5 (two token groups), the slots read by plain loads
//     and by ld.global.cg: q, the cache rows, and qf / k / v (written back: the merge reads the
//     gate from qf).
//   CudaQkvSplit.BackendModesMatchBitwise: CudaBackend's matmul_multi -> gdn_site (t = 1) and
//     matmul_multi -> attention_site (t = 1 and 3) under set_qkv_defer(0 .. 3), eagerly and
//     recorded as a decode step (begin_capture / replay_step), against the undeferred eager run;
//     and held-back launches whose outputs another op reads first (launched as usual).
//   CudaQkvSplit.KnobValuesAreChecked: BONSAI_CUDA_QKV_DEFER takes 0 .. 3 only,
//     BONSAI_CUDA_GDN_DEC_COUNT and BONSAI_CUDA_QKV_LOAD 0 or 1.
// Needs a device with sm_90 code (Hopper); skips with the reason otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
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

struct GdnCase {
  int n_k, n_v, d_k, d_v, k, taps;
};
const GdnCase kGdnCases[] = {
    {16, 48, 128, 128, 5120, 4},  // the 27B
    {4, 12, 128, 128, 384, 4},    // n_v / n_k = 3
    {2, 2, 64, 32, 256, 4},       // n_v / n_k = 1, d_k > d_v
    {1, 3, 32, 64, 128, 2},       // d_k < d_v, taps 2; k = 128: every group whole
    {2, 4, 64, 96, 256, 3},       // 6 warps per head
    {2, 6, 256, 64, 2048, 4},     // d_k 256: 8 lanes per column
    {1, 1, 32, 32, 8192, 3},      // one warp per head; nr 64 under the full plan (8 load batches)
};

TEST(CudaQkvSplit, GdnDecodeMatchesFixupBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int sms = sm_count();
  for (const GdnCase& cs : kGdnCases)
    for (const int plan_sms : {sms, 1}) {
      DevMem mem;
      const int64_t C = 2 * static_cast<int64_t>(cs.n_k) * cs.d_k + static_cast<int64_t>(cs.n_v) * cs.d_v,
                    DV = static_cast<int64_t>(cs.n_v) * cs.d_v;
      Matvec mv(mem, 1, std::vector<int64_t>{C, DV}, cs.k, 1, plan_sms, static_cast<uint32_t>(C + cs.k));
      const std::string shape = "n_k " + std::to_string(cs.n_k) + " n_v " + std::to_string(cs.n_v) + " d_k " +
                                std::to_string(cs.d_k) + " d_v " + std::to_string(cs.d_v) + " k " +
                                std::to_string(cs.k) + " plan " + std::to_string(plan_sms) +
                                " SMs, nr <= " + std::to_string(most_ranks(C + DV, cs.k, plan_sms));
      auto a = randn(cs.n_v, 41), dt = randn(cs.n_v, 42), nw = randn(cs.d_v, 43, 0.2f);
      for (auto& v : a) v = -std::fabs(v);
      for (auto& v : nw) v += 1.0f;
      const float ab_std = 0.5f * std::sqrt(std::min(1.0f, 320.0f / static_cast<float>(cs.k)));
      const auto conv_state_h = randn(static_cast<size_t>(cs.taps - 1) * C, 44),
                 state_h = randn(static_cast<size_t>(DV) * cs.d_k, 45, 0.1f);
      cuda::GdnFused f;
      f.conv_w = mem.up(randn(static_cast<size_t>(cs.taps) * C, 46, 0.5f));
      f.conv_state = mem.alloc<float>(conv_state_h.size() * 4);
      f.conv_counters = mem.alloc<int>(static_cast<size_t>(cs.n_k) * 4);
      cudaMemset(f.conv_counters, 0, static_cast<size_t>(cs.n_k) * 4);
      f.taps = cs.taps;
      f.ssm_a = mem.up(a);
      f.dt_bias = mem.up(dt);
      f.alpha_w = mem.up(bf16_rows(cs.n_v, cs.k, 47, ab_std));
      f.beta_w = mem.up(bf16_rows(cs.n_v, cs.k, 48, ab_std));
      f.ab_type = cuda::RawType::BF16;
      f.ab_row_bytes = 2 * static_cast<size_t>(cs.k);
      f.ab_k = cs.k;
      f.normed = mem.up(randn(static_cast<size_t>(cs.k), 49));
      f.norm_w = mem.up(nw);
      f.state = mem.alloc<float>(state_h.size() * 4);
      f.norm_eps = 1e-6f;
      f.eps = 1e-6f;
      f.t = 1;
      f.n_k = cs.n_k;
      f.n_v = cs.n_v;
      f.d_k = cs.d_k;
      f.d_v = cs.d_v;
      f.transpose = cs.n_v != cs.n_k;
      f.state_stream = true;
      float *qkv[2] = {mv.new_y(0), mv.new_y(0)}, *z[2] = {mv.new_y(1), mv.new_y(1)};
      float* out[2] = {mem.alloc<float>(static_cast<size_t>(DV) * 4),
                       mem.alloc<float>(static_cast<size_t>(DV) * 4)};
      for (const int ctas : {1, 2, 4})
        for (const int variant : {0, 1, 2, 3, 4}) {  // 0: as configured; 1: AB = 0; 2: the membar-free
                                                     // arrive; 3, 4: the count before / after the
                                                     // sums; 4: the slots by ld.global.cg
          const std::string what =
              shape + " C " + std::to_string(ctas) + " variant " + std::to_string(variant);
          cuda::GdnDecodeConfig cfg;
          cfg.cluster = ctas;
          cfg.ab_early = variant != 1;
          cfg.count_early = variant == 3;
          cfg.split_weak = variant != 4;
          f.state_early = variant == 3;  // (both runs: it moves loads, not results)
          std::vector<float> got[2][5];
          for (int run = 0; run < 2; ++run) {  // 0: the fix-up, then the site; 1: the site adds the slots
            cudaMemcpy(f.conv_state, conv_state_h.data(), conv_state_h.size() * 4, cudaMemcpyHostToDevice);
            cudaMemcpy(f.state, state_h.data(), state_h.size() * 4, cudaMemcpyHostToDevice);
            cudaMemset(out[run], 0xff, static_cast<size_t>(DV) * 4);
            cudaMemset(qkv[run], 0xff, static_cast<size_t>(C) * 4);
            cudaMemset(z[run], 0xff, static_cast<size_t>(DV) * 4);
            cuda::SplitSums split[2];
            const auto fixup = run ? cuda::MatvecFixup::defer : cuda::MatvecFixup::first;
            const auto used = mv.run(qkv[run], cuda::MatvecKernel::ws, fixup, split, z[run]);
            ASSERT_EQ(used == cuda::MatvecFixup::defer, run == 1) << what;
            f.qkv = qkv[run];
            f.z = z[run];
            f.out = out[run];
            ASSERT_TRUE(cuda::gdn_decode_fits(f)) << what;
            cfg.membar_free = run == 1 && variant == 2;  // (the same results as the former barrier's)
            cuda::gdn_decode(f, cfg, nullptr, run ? split : nullptr);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
            got[run][0] = down(out[run], static_cast<size_t>(DV));
            got[run][1] = down(f.state, state_h.size());
            got[run][2] = down(f.conv_state, conv_state_h.size());
            got[run][3] = down(qkv[run], static_cast<size_t>(C));
            got[run][4] = down(z[run], static_cast<size_t>(DV));
          }
          const char* names[] = {"out", "state", "conv state", "qkv", "z"};
          for (int i = 0; i < 5; ++i)
            expect_same_bits(got[0][i].data(), got[1][i].data(), got[0][i].size() * 4, what + " " + names[i]);
          const auto counters = down(f.conv_counters, static_cast<size_t>(cs.n_k));
          for (const int c : counters)
            ASSERT_EQ(c, 0) << what << ": the conv hand-off's counters left nonzero";
        }
    }
}

struct AttnCase {
  int n_head, n_head_kv, head_dim, n_rot, k;
};
const AttnCase kAttnCases[] = {
    {24, 4, 256, 64, 5120},  // the 27B
    {4, 2, 64, 64, 256},     // 2 query heads per KV head, full rotation
    {2, 1, 32, 16, 128},     // k = 128: every group whole
    {8, 8, 128, 32, 4096},   // one query head per KV head; nr 32 under the full plan (4 load batches)
};

TEST(CudaQkvSplit, AttentionPrepMatchesFixupBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int sms = sm_count();
  const int pos0 = 6;
  for (const AttnCase& cs : kAttnCases)
    for (const int plan_sms : {sms, 1})
      for (const int t : {1, 3, 5}) {
        if (plan_sms == 1 && t > 1) continue;  // (each case's weights are made afresh: keep it short)
        DevMem mem;
        const int64_t d = cs.head_dim, nq = 2 * cs.n_head * d, nkv = cs.n_head_kv * d;
        Matvec mv(mem, 1, std::vector<int64_t>{nq, nkv, nkv}, cs.k, t, plan_sms,
                  static_cast<uint32_t>(nq + cs.k + t));
        const std::string what = "heads " + std::to_string(cs.n_head) + "/" + std::to_string(cs.n_head_kv) +
                                 " d " + std::to_string(d) + " k " + std::to_string(cs.k) + " t " +
                                 std::to_string(t) + " plan " + std::to_string(plan_sms) +
                                 " SMs, nr <= " + std::to_string(most_ranks(nq + 2 * nkv, cs.k, plan_sms));
        auto qn = randn(static_cast<size_t>(d), 51, 0.3f), kn = randn(static_cast<size_t>(d), 52, 0.3f);
        for (auto& v : qn) v += 1.0f;
        for (auto& v : kn) v += 1.0f;
        const size_t rows = static_cast<size_t>(pos0 + t) * nkv;
        cuda::AttnPrep p;
        p.q_norm = mem.up(qn);
        p.k_norm = mem.up(kn);
        p.eps = 1e-6f;
        p.base = 1e7f;
        p.n_rot = cs.n_rot;
        p.n_head = cs.n_head;
        p.n_head_kv = cs.n_head_kv;
        p.head_dim = cs.head_dim;
        std::vector<float> got[3][6];
        for (int run = 0; run < 3; ++run) {  // 0: the fix-up; 1, 2: split, plain / cg loads
          float *qf = mv.new_y(0), *k = mv.new_y(1), *v = mv.new_y(2);
          p.qf = qf;
          p.k = k;
          p.v = v;
          p.q = mem.alloc<float>(static_cast<size_t>(t) * cs.n_head * d * 4);
          p.k_cache = mem.alloc<float>(rows * 4);
          p.v_cache = mem.alloc<float>(rows * 4);
          cudaMemset(p.q, 0xff, static_cast<size_t>(t) * cs.n_head * d * 4);
          cudaMemset(p.k_cache, 0xff, rows * 4);
          cudaMemset(p.v_cache, 0xff, rows * 4);
          cuda::SplitSums split[3];
          // (first falls back to last for two token groups, t = 5: the same floats either way)
          const auto fixup = run ? cuda::MatvecFixup::defer : cuda::MatvecFixup::first;
          const auto used = mv.run(qf, cuda::MatvecKernel::ws, fixup, split, k, v);
          ASSERT_EQ(used == cuda::MatvecFixup::defer, run != 0) << what;
          cuda::attention_prep(p, t, pos0, nullptr, nullptr, run ? split : nullptr, run != 2);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
          got[run][0] = down(p.q, static_cast<size_t>(t) * cs.n_head * d);
          got[run][1] = down(static_cast<const float*>(p.k_cache), rows);
          got[run][2] = down(static_cast<const float*>(p.v_cache), rows);
          got[run][3] = down(qf, static_cast<size_t>(t * nq));
          got[run][4] = down(k, static_cast<size_t>(t * nkv));
          got[run][5] = down(v, static_cast<size_t>(t * nkv));
        }
        const char* names[] = {"q", "k cache", "v cache", "qf", "k", "v"};
        for (int run = 1; run < 3; ++run)
          for (int i = 0; i < 6; ++i)
            expect_same_bits(got[0][i].data(), got[run][i].data(), got[0][i].size() * 4,
                             what + (run == 1 ? " plain loads " : " cg loads ") + names[i]);
      }
}

// The backend: the GDN layer's qkv+z matmul and its site at t = 1, the attention layer's q/k/v
// matmul and its site at t = 1 and 3, each under set_qkv_defer(0 .. 3), eagerly and (t = 1)
// recorded as a decode step and replayed, from the same inputs and states each time, equal bit
// for bit to the undeferred eager run.
TEST(CudaQkvSplit, BackendModesMatchBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  CudaBackend be(0);
  const int64_t E = 1024;
  const GdnShape gs{2, 6, 128, 128, 1e-6f};
  const int taps = 4;
  const int64_t C = 2 * gs.n_k * gs.d_k + static_cast<int64_t>(gs.n_v) * gs.d_v, DV = gs.n_v * gs.d_v;
  const int H = 8, HKV = 2, D = 128, pos0 = 9;
  WeightPool pool(be, "qkv split test weight");
  auto ternary = [&](int64_t rows, uint32_t seed) -> Weight& { return pool.ternary(rows, E, seed); };
  auto bf16 = [&](int64_t rows, uint32_t seed) -> Weight& {
    return pool.bytes(DType::BF16, rows, E,
                      bf16_rows(rows, E, seed, 0.5f * std::sqrt(320.0f / static_cast<float>(E))));
  };
  Weight &wqkv = ternary(C, 61), &wz = ternary(DV, 62), &wq = ternary(2 * H * D, 63),
         &wk = ternary(HKV * D, 64), &wv = ternary(HKV * D, 65);
  auto a_h = randn(gs.n_v, 66), nw_h = randn(gs.d_v, 67, 0.2f), qn_h = randn(D, 68, 0.3f),
       kn_h = randn(D, 69, 0.3f);
  for (auto& v : a_h) v = -std::fabs(v);
  for (auto* vs : {&nw_h, &qn_h, &kn_h})
    for (auto& v : *vs) v += 1.0f;
  Weight &conv = pool.f32(randn(static_cast<size_t>(taps) * C, 70, 0.5f), C, taps),
         &ssm_a = pool.f32(a_h, 1, gs.n_v), &dt = pool.f32(randn(gs.n_v, 71), 1, gs.n_v),
         &norm = pool.f32(nw_h, 1, gs.d_v), &qnorm = pool.f32(qn_h, 1, D), &knorm = pool.f32(kn_h, 1, D),
         &wa = bf16(gs.n_v, 72), &wb = bf16(gs.n_v, 73);

  auto put = [&](const std::vector<float>& v) {
    float* p = be.alloc(v.size());
    be.from_host(p, v.data(), v.size());
    return p;
  };
  const int kt = 3;  // the most tokens of a run
  const auto xr_h = randn(static_cast<size_t>(kt) * E, 74, 1.5f), xn_h = randn(static_cast<size_t>(E), 75);
  const auto conv_state_h = randn(static_cast<size_t>(taps - 1) * C, 76),
             state_h = randn(static_cast<size_t>(DV) * gs.d_k, 77, 0.1f);
  const size_t cache = static_cast<size_t>(pos0 + kt) * HKV * D;
  const auto kc_h = randn(cache, 78), vc_h = randn(cache, 79);
  float *xr = put(xr_h), *xn = put(xn_h), *conv_state = put(conv_state_h), *state = put(state_h);
  float *kc = put(kc_h), *vc = put(vc_h);
  float *qkv = be.alloc(static_cast<size_t>(C)), *z = be.alloc(static_cast<size_t>(DV)),
        *scr = be.alloc(static_cast<size_t>(testing_util::gdn_scratch_floats(gs, 1)));
  float *qf = be.alloc(static_cast<size_t>(kt) * 2 * H * D), *k = be.alloc(static_cast<size_t>(kt) * HKV * D),
        *v = be.alloc(static_cast<size_t>(kt) * HKV * D), *q = be.alloc(static_cast<size_t>(kt) * H * D),
        *qgate = be.alloc(static_cast<size_t>(kt) * H * D), *att = be.alloc(static_cast<size_t>(kt) * H * D);
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
  site.grouped = true;
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

  for (const int t : {1, 3}) {
    auto body = [&] {
      if (t == 1) {
        const Weight* proj[] = {&wqkv, &wz};
        float* proj_out[] = {qkv, z};
        be.matmul_multi(proj, xr, proj_out, 1);
        be.gdn_site(site, 1);
      }
      const Weight* proj[] = {&wq, &wk, &wv};
      float* proj_out[] = {qf, k, v};
      be.matmul_multi(proj, xr, proj_out, t);
      be.attention_site(as, t, pos0);
    };
    const std::vector<std::pair<float*, size_t>> outs = {{site.out, static_cast<size_t>(DV)},
                                                         {state, state_h.size()},
                                                         {conv_state, conv_state_h.size()},
                                                         {qkv, static_cast<size_t>(C)},
                                                         {z, static_cast<size_t>(DV)},
                                                         {att, static_cast<size_t>(t) * H * D},
                                                         {q, static_cast<size_t>(t) * H * D},
                                                         {kc, cache},
                                                         {vc, cache},
                                                         {qf, static_cast<size_t>(t) * 2 * H * D}};
    const char* names[] = {"gdn out", "state", "conv state", "qkv",     "z",
                           "att",     "q",     "k cache",    "v cache", "qf"};
    auto reset = [&] {  // the same inputs and states before every run
      be.from_host(conv_state, conv_state_h.data(), conv_state_h.size());
      be.from_host(state, state_h.data(), state_h.size());
      be.from_host(kc, kc_h.data(), cache);
      be.from_host(vc, vc_h.data(), cache);
      for (const auto& [p, c] : outs)
        if (p != state && p != conv_state && p != kc && p != vc) be.zero(p, c);
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
      for (size_t i = 0; i < ref.size(); ++i) {
        if (t != 1 && i < 5) continue;  // the GDN site runs at t = 1 only
        expect_same_bits(ref[i].data(), got[i].data(), ref[i].size() * 4, what + " " + names[i]);
      }
    };
    be.set_qkv_defer(0);
    reset();
    body();
    const auto ref = read();
    for (const int defer : {0, 1, 2, 3}) {
      be.set_qkv_defer(defer);
      run_step_modes(be, pos0, t == 1, "t " + std::to_string(t) + " defer " + std::to_string(defer), reset,
                     body, [&](const std::string& w) { expect_ref(ref, w); });
    }
    // Held back under set_qkv_defer(3), then read by another op first: launched with its own
    // fix-up, every output the reference's.
    be.set_qkv_defer(3);
    reset();
    if (t == 1) {
      const Weight* proj[] = {&wqkv, &wz};
      float* proj_out[] = {qkv, z};
      be.matmul_multi(proj, xr, proj_out, 1);
      std::vector<float> hz(static_cast<size_t>(DV));
      be.to_host(hz.data(), z, hz.size());
      expect_same_bits(ref[4].data(), hz.data(), hz.size() * 4, "held-back qkv+z, z read first");
    }
    const Weight* proj[] = {&wq, &wk, &wv};
    float* proj_out[] = {qf, k, v};
    be.matmul_multi(proj, xr, proj_out, t);
    std::vector<float> hq(static_cast<size_t>(t) * 2 * H * D);
    be.to_host(hq.data(), qf, hq.size());
    expect_same_bits(ref[9].data(), hq.data(), hq.size() * 4,
                     "t " + std::to_string(t) + " held-back q/k/v, qf read first");
  }
  for (float* p : {xr, xn, conv_state, state, kc, vc, qkv, z, scr, qf, k, v, q, qgate, att}) be.release(p);
}

TEST(CudaQkvSplit, KnobValuesAreChecked) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  for (const char* bad : {"4", "x", "10"}) {
    setenv("BONSAI_CUDA_QKV_DEFER", bad, 1);
    EXPECT_THROW(CudaBackend be(0), Error) << bad;
  }
  for (const char* good : {"0", "1", "2", "3"}) {
    setenv("BONSAI_CUDA_QKV_DEFER", good, 1);
    EXPECT_NO_THROW(CudaBackend be(0)) << good;
  }
  unsetenv("BONSAI_CUDA_QKV_DEFER");
  for (const char* knob : {"BONSAI_CUDA_GDN_DEC_COUNT", "BONSAI_CUDA_QKV_LOAD"}) {
    setenv(knob, "2", 1);
    EXPECT_THROW(CudaBackend be(0), Error) << knob;
    unsetenv(knob);
  }
  EXPECT_THROW(CudaBackend(0).set_qkv_defer(4), Error);
}

}  // namespace
}  // namespace bonsai

#else

TEST(CudaQkvSplit, GdnDecodeMatchesFixupBitwise) { GTEST_SKIP() << "built without CUDA (BONSAI_CUDA=OFF)"; }

#endif
