// The deferred split-K sums (launch.h, MatvecFixup::defer / SplitSums): the matvec leaves a row
// group split between warps as one slot per warp, and the consumer adds the slots in rank order
// from 0.0f, the same additions as the matvec's own fix-ups, so everything must be equal bit
// for bit to the first-rank fix-up:
//   CudaSplitSums.StandaloneSumMatchesFixupBitwise: y of the ws and bulk kernels with defer +
//     matvec_split_sum against ws with first; plans with every group whole (nr = 1), groups of
//     both kinds, nr > 8, nr > 32 (the loads in more than one batch), a partial last group,
//     t = 1..4 and two token groups (t = 5, 8); legacy asked for defer runs last.
//   CudaSplitSums.ResidualSiteMatchesFixupBitwise: residual_norm_site_split (the site adds the
//     slots; cluster of the row's Hadamard blocks) in its four forms (BONSAI_CUDA_RES_SPLIT: how the
//     x·x terms go around the cluster) against matvec first + residual_norm_site: x_out, normed,
//     rotated, the quantized activation and its scales, and y itself.
//   CudaSplitSums.BackendModesMatchBitwise: CudaBackend's matmul + residual_norm_site under
//     BONSAI_CUDA_MV_DEFER's three modes (set_matvec_defer), eagerly and recorded as a graph,
//     and a held-back matmul whose y is read by another op first.
// Needs a device with sm_90 code (Hopper); skips with the reason otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

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

TEST(CudaSplitSums, StandaloneSumMatchesFixupBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int sms = sm_count();
  struct Case {
    int groups;
    int64_t n, k;
    std::vector<int> ts;
    int plan_sms;
    int min_ranks, max_ranks;  // the plan's most ranks per group must lie in this range
  };
  const Case cases[] = {
      {1, 1024, 5120, {1, 4}, 1, 1, 1},           // every group whole
      {1, 1000, 5120, {1, 2, 3, 4}, 1, 1, 1},     // whole groups, partial last group
      {1, 1344, 640, {1, 3}, 1, 2, 2},            // groups whole and split by 2
      {2, 5120, 6144, {1, 2, 3, 4}, sms, 9, 32},  // the 27B out-projection: nr > 8
      {1, 5120, 17408, {1, 3}, sms, 9, 32},       // the 27B FFN down
      {1, 1000, 6144, {1, 4, 5, 8}, sms, 9, 64},  // partial last group; two token groups
      {2, 600, 17408, {1, 2}, sms, 33, 1000},     // nr > 32: loads in batches
  };
  for (const Case& cs : cases) {
    const int nr = most_ranks(cs.n, cs.k, cs.plan_sms);
    EXPECT_GE(nr, cs.min_ranks) << "n " << cs.n << " k " << cs.k;
    EXPECT_LE(nr, cs.max_ranks) << "n " << cs.n << " k " << cs.k;
    for (const int t : cs.ts) {
      DevMem mem;
      Matvec mv(mem, cs.groups, cs.n, cs.k, t, cs.plan_sms, static_cast<uint32_t>(cs.n + cs.k + t));
      const std::string what = "G " + std::to_string(cs.groups) + " n " + std::to_string(cs.n) + " k " +
                               std::to_string(cs.k) + " t " + std::to_string(t) + " nr " + std::to_string(nr);
      const size_t count = static_cast<size_t>(t) * cs.n;
      float* ref = mv.new_y();
      mv.run(ref, cuda::MatvecKernel::ws, cuda::MatvecFixup::last, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const auto want = down(ref, count);
      for (size_t i = 0; i < count; ++i) ASSERT_FALSE(std::isnan(want[i])) << what << " i " << i;
      for (const auto kernel :
           {cuda::MatvecKernel::ws, cuda::MatvecKernel::bulk, cuda::MatvecKernel::legacy}) {
        const char* name = kernel == cuda::MatvecKernel::ws     ? "ws"
                           : kernel == cuda::MatvecKernel::bulk ? "bulk"
                                                                : "legacy";
        float* y = mv.new_y();
        cuda::SplitSums split;
        const cuda::MatvecFixup used = mv.run(y, kernel, cuda::MatvecFixup::defer, &split);
        if (kernel == cuda::MatvecKernel::legacy) {
          EXPECT_EQ(static_cast<int>(used), static_cast<int>(cuda::MatvecFixup::last)) << what << " " << name;
        } else {
          ASSERT_EQ(static_cast<int>(used), static_cast<int>(cuda::MatvecFixup::defer))
              << what << " " << name;
          EXPECT_EQ(split.y, y);
          EXPECT_EQ(split.t, t);
          EXPECT_EQ(split.n, cs.n);
          cuda::matvec_split_sum(split, nullptr);
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what << " " << name;
        const auto got = down(y, count);
        expect_same_bits(want.data(), got.data(), count * 4, what + " " + name);
      }
    }
  }
}

TEST(CudaSplitSums, ResidualSiteMatchesFixupBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int sms = sm_count();
  struct Case {
    int groups;
    int64_t n, k, block;
    std::vector<int> ts;
    int plan_sms;
    bool signs = true;
  };
  const Case cases[] = {
      {1, 5120, 6144, 1024, {1, 2, 3, 4}, sms},  // the 27B out-projection and site, nr 24
      {2, 5120, 17408, 1024, {1}, sms},          // the 27B FFN down
      {1, 1024, 5120, 128, {1, 4}, 1},           // nr 1, 8 blocks per cluster
      {1, 1536, 640, 512, {2}, 1},               // groups whole and split, 3 blocks
      {2, 768, 17408, 256, {1}, sms, false},     // nr > 32, no signs
      {1, 1024, 5120, 256, {5}, sms},            // two token groups
      {1, 1024, 2048, 1024, {1, 3}, sms},        // one block per row: a cluster of 1
      {1, 8192, 2048, 4096, {1}, sms},           // 1024 threads: the split site or the fallback
  };
  for (const Case& cs : cases) {
    for (const int t : cs.ts) {
      DevMem mem;
      Matvec mv(mem, cs.groups, cs.n, cs.k, t, cs.plan_sms, static_cast<uint32_t>(3 * cs.n + cs.k + t));
      const std::string what = "G " + std::to_string(cs.groups) + " n " + std::to_string(cs.n) + " k " +
                               std::to_string(cs.k) + " block " + std::to_string(cs.block) + " t " +
                               std::to_string(t) + " nr " +
                               std::to_string(most_ranks(cs.n, cs.k, cs.plan_sms));
      const size_t count = static_cast<size_t>(t) * cs.n;
      auto x = randn(count, 91 + t, 1.5f), gain = randn(cs.n, 92, 0.3f);
      std::vector<float> signs(cs.n);
      for (auto& g : gain) g += 1.0f;
      std::mt19937 rng(93);
      for (auto& s : signs) s = rng() & 1 ? 1.0f : -1.0f;
      float *dx = mem.up(x), *dgain = mem.up(gain), *dsigns = cs.signs ? mem.up(signs) : nullptr;
      const size_t qbytes = count / cuda::kBlockK * cuda::kActBytes, mbytes = count / cuda::kBlockK * 16;
      struct Out {
        float *y, *x_out, *normed, *rotated;
        uint8_t* xq;
        float4* meta;
      };
      auto outs = [&] {
        Out o;
        o.x_out = mem.alloc<float>(count * 4);
        o.normed = mem.alloc<float>(count * 4);
        o.rotated = mem.alloc<float>(count * 4);
        o.xq = mem.alloc<uint8_t>(qbytes);
        o.meta = mem.alloc<float4>(mbytes);
        return o;
      };
      Out a = outs(), b = outs();
      a.y = mv.new_y();
      b.y = mv.new_y();
      ASSERT_EQ(static_cast<int>(mv.run(a.y, cuda::MatvecKernel::ws, cuda::MatvecFixup::first, nullptr)),
                static_cast<int>(t <= 4 ? cuda::MatvecFixup::first : cuda::MatvecFixup::last))
          << what;
      cuda::residual_norm_site(dx, a.y, a.x_out, dgain, dsigns, cs.block, a.normed, a.rotated, t, cs.n, 1e-6f,
                               a.xq, a.meta, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      for (const auto kernel : {cuda::MatvecKernel::ws, cuda::MatvecKernel::bulk})
        for (int form = 0; form <= 3; ++form) {
          const std::string w2 =
              what + (kernel == cuda::MatvecKernel::ws ? " ws" : " bulk") + " form " + std::to_string(form);
          cudaMemset(b.y, 0xff, count * 4);
          for (float* p : {b.x_out, b.normed, b.rotated}) cudaMemset(p, 0xff, count * 4);
          cudaMemset(b.xq, 0xff, qbytes);
          cudaMemset(b.meta, 0xff, mbytes);
          cuda::SplitSums split;
          ASSERT_EQ(static_cast<int>(mv.run(b.y, kernel, cuda::MatvecFixup::defer, &split)),
                    static_cast<int>(cuda::MatvecFixup::defer))
              << w2;
          // Blocks up to 1024 columns must take the split site (the 27B's); larger ones may be
          // refused (registers): then the standalone sum and the plain site, as the backend does.
          const bool took =
              cuda::residual_norm_site_split(dx, split, b.x_out, dgain, dsigns, cs.block, b.normed, b.rotated,
                                             t, cs.n, 1e-6f, b.xq, b.meta, nullptr, form);
          if (cs.block <= 1024) {
            ASSERT_TRUE(took) << w2;
          }
          if (!took) {
            cuda::matvec_split_sum(split, nullptr);
            cuda::residual_norm_site(dx, b.y, b.x_out, dgain, dsigns, cs.block, b.normed, b.rotated, t, cs.n,
                                     1e-6f, b.xq, b.meta, nullptr);
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << w2;
          for (auto [pa, pb, name] :
               {std::tuple{a.y, b.y, "y"}, std::tuple{a.x_out, b.x_out, "x_out"},
                std::tuple{a.normed, b.normed, "normed"}, std::tuple{a.rotated, b.rotated, "rotated"}}) {
            const auto va = down(pa, count), vb = down(pb, count);
            expect_same_bits(va.data(), vb.data(), count * 4, w2 + " " + name);
          }
          const auto qa = down(a.xq, qbytes), qb = down(b.xq, qbytes);
          expect_same_bits(qa.data(), qb.data(), qbytes, w2 + " xq");
          const auto ma = down(reinterpret_cast<uint8_t*>(a.meta), mbytes),
                     mb = down(reinterpret_cast<uint8_t*>(b.meta), mbytes);
          expect_same_bits(ma.data(), mb.data(), mbytes, w2 + " meta");
        }
    }
  }
}

// The backend's residual site fed by a held-back matmul under the three BONSAI_CUDA_MV_DEFER
// modes, eagerly and recorded: every output equal bit for bit to mode 0 (the matvec's own
// fix-up); then y read by another op first (the held-back matvec launched as usual).
TEST(CudaSplitSums, BackendModesMatchBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  CudaBackend be(0);
  const int64_t n = 5120, k = 6144, block = 1024;
  std::vector<uint8_t> raw = random_rows(DType::PQ2_0, n, k, 5);
  Weight w;
  w.name = "split test weight";
  w.type = DType::PQ2_0;
  w.n = n;
  w.k = k;
  w.data = raw.data();
  w.nbytes = raw.size();
  be.prepare(w);
  auto gain_h = randn(n, 6, 0.3f);
  for (auto& g : gain_h) g += 1.0f;
  Weight gain;
  gain.name = "split test gain";
  gain.type = DType::F32;
  gain.n = 1;
  gain.k = n;
  gain.data = reinterpret_cast<const uint8_t*>(gain_h.data());
  gain.nbytes = gain_h.size() * 4;
  be.prepare(gain);
  std::vector<float> signs_h(n);
  std::mt19937 rng(7);
  for (auto& s : signs_h) s = rng() & 1 ? 1.0f : -1.0f;
  for (const int t : {1, 3}) {
    const size_t count = static_cast<size_t>(t) * n;
    auto xin_h = randn(static_cast<size_t>(t) * k, 8 + t, 2.0f), x_h = randn(count, 9 + t, 1.5f);
    auto put = [&](const std::vector<float>& v) {
      float* p = be.alloc(v.size());
      be.from_host(p, v.data(), v.size());
      return p;
    };
    float *xin = put(xin_h), *x = put(x_h), *signs = put(signs_h);
    float *y = be.alloc(count), *x_out = be.alloc(count), *normed = be.alloc(count),
          *rotated = be.alloc(count);
    auto run = [&](int mode, bool recorded) {
      be.set_matvec_defer(mode);
      auto body = [&] {
        be.matmul(w, xin, y, t);
        be.residual_norm_site(x, y, x_out, gain, signs, block, normed, rotated, t, n, 1e-6f);
      };
      if (recorded)
        be.time_recorded(body, 2);
      else
        body();
      std::vector<std::vector<float>> out;
      for (const float* p : {y, x_out, normed, rotated}) {
        std::vector<float> v(count);
        be.to_host(v.data(), p, count);
        out.push_back(std::move(v));
      }
      for (float* p : {y, x_out, normed, rotated}) be.zero(p, count);
      return out;
    };
    const auto ref = run(0, false);
    for (const int mode : {0, 1, 2})
      for (const bool recorded : {false, true}) {
        if (mode == 0 && !recorded) continue;
        const auto got = run(mode, recorded);
        const char* names[] = {"y", "x_out", "normed", "rotated"};
        for (size_t i = 0; i < ref.size(); ++i)
          expect_same_bits(ref[i].data(), got[i].data(), count * 4,
                           "t " + std::to_string(t) + " mode " + std::to_string(mode) +
                               (recorded ? " recorded " : " eager ") + names[i]);
      }
    // Held back, then read by another op before any site: launched with its own fix-up.
    be.set_matvec_defer(1);
    be.matmul(w, xin, y, t);
    std::vector<float> direct(count);
    be.to_host(direct.data(), y, count);
    expect_same_bits(ref[0].data(), direct.data(), count * 4, "t " + std::to_string(t) + " held back, read");
    be.matmul(w, xin, y, t);
    be.add(y, x, x_out, static_cast<int64_t>(count));  // another consumer
    std::vector<float> sum(count), want(count);
    be.to_host(sum.data(), x_out, count);
    for (size_t i = 0; i < count; ++i) want[i] = ref[0][i] + x_h[i];
    expect_same_bits(want.data(), sum.data(), count * 4, "t " + std::to_string(t) + " held back, added");
    for (float* p : {xin, x, signs, y, x_out, normed, rotated}) be.release(p);
  }
  be.unprepare(w);
  be.unprepare(gain);
}

}  // namespace
}  // namespace bonsai

#else
TEST(CudaSplitSums, StandaloneSumMatchesFixupBitwise) {
  GTEST_SKIP() << "built without CUDA (BONSAI_CUDA=OFF)";
}
#endif
