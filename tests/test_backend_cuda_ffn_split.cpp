// The decode SwiGLU / FWHT sites through cuda::fwht_site_split (launch.h): inputs read through
// SplitSums (the FFN gate+up launch's unsummed outputs, or plain ones) over 1, 2, 4 or 8 thread
// blocks per Hadamard block. Every output must equal, bit for bit, the in-kernel fix-up (first)
// followed by swiglu_hadamard / hadamard: the site adds each float4's slots in rank order from
// 0.0f (split_sums.cuh, load4x2), the same additions as the fix-up, and the cluster's last FWHT
// stages are the same butterflies as hadamard_kernel's:
//   CudaFfnSplit.SwigluSiteMatchesFixupBitwise: gate and up of one deferred two-job launch
//     (ws and bulk), the 27B FFN shape (5120 -> 2 x 17408, nr 4-5) and odd ones (every group
//     whole, nr = 1 and 2, nr > 8: the loads in more than one batch; no signs; 64-column weight
//     groups; t = 1..4 and two token groups), act, rotated, the quantized activation and its
//     scales, and gate / up themselves.
//   CudaFfnSplit.PlainSitesMatchBitwise: plain inputs (split_whole) over clusters against
//     swiglu_hadamard, and the plain FWHT site (no up) against hadamard.
//   Both also run the lean one-block SwiGLU site (cuda::swiglu_site_lean, BONSAI_CUDA_SWI_SITE),
//     with and without its write-back of the sums; the backend test under set_swi_site too.
//   CudaFfnSplit.BackendModesMatchBitwise: CudaBackend's matmul -> residual_norm_site ->
//     matmul_multi(gate, up) -> swiglu_site (act written, as when the graph dumps, and not) ->
//     hadamard under BONSAI_CUDA_FFN_DEFER / BONSAI_CUDA_FWHT_CLUSTER's settings, eagerly and
//     recorded as a graph, against the default-free path (no deferral, one block); and a
//     held-back gate+up launch whose outputs another op reads first (launched as usual).
// (A row count that is not a multiple of 64 cannot reach these sites: they need n % block == 0
// with block % 128 == 0; the partial last row group is CudaSplitSums.StandaloneSumMatchesFixupBitwise's.)
// Needs a device with sm_90 code (Hopper); skips with the reason otherwise.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
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

// What a site writes: the rotated row, its quantization, and (SwiGLU) act, gate and up.
struct SiteOut {
  float *gate = nullptr, *up = nullptr, *act = nullptr, *rotated = nullptr;
  uint8_t* xq = nullptr;
  float4* meta = nullptr;
  size_t count = 0, qbytes = 0, mbytes = 0;

  SiteOut(DevMem& mem, size_t n) : count(n) {
    qbytes = count / cuda::kBlockK * cuda::kActBytes;
    mbytes = count / cuda::kBlockK * sizeof(float4);
    gate = mem.alloc<float>(count * 4);
    up = mem.alloc<float>(count * 4);
    act = mem.alloc<float>(count * 4);
    rotated = mem.alloc<float>(count * 4);
    xq = mem.alloc<uint8_t>(qbytes);
    meta = mem.alloc<float4>(mbytes);
    clear();
  }
  void clear() {  // unwritten words: NaN 0xFFFFFFFF
    for (float* p : {gate, up, act, rotated}) cudaMemset(p, 0xff, count * 4);
    cudaMemset(xq, 0xff, qbytes);
    cudaMemset(meta, 0xff, mbytes);
  }
  // a's and b's outputs equal bit for bit (gate / up / act only where `swiglu`)
  static void expect_same(const SiteOut& a, const SiteOut& b, bool swiglu, const std::string& what) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    std::vector<std::tuple<const float*, const float*, const char*>> f = {{a.rotated, b.rotated, "rotated"}};
    if (swiglu) {
      f.emplace_back(a.gate, b.gate, "gate");
      f.emplace_back(a.up, b.up, "up");
      f.emplace_back(a.act, b.act, "act");
    }
    for (auto [pa, pb, name] : f) {
      const auto va = down(pa, a.count), vb = down(pb, a.count);
      expect_same_bits(va.data(), vb.data(), a.count * 4, what + " " + name);
    }
    const auto qa = down(a.xq, a.qbytes), qb = down(b.xq, a.qbytes);
    expect_same_bits(qa.data(), qb.data(), a.qbytes, what + " xq");
    const auto ma = down(reinterpret_cast<const uint8_t*>(a.meta), a.mbytes),
               mb = down(reinterpret_cast<const uint8_t*>(b.meta), a.mbytes);
    expect_same_bits(ma.data(), mb.data(), a.mbytes, what + " meta");
  }
};

uint32_t bits_of(float v) {
  uint32_t b = 0;
  std::memcpy(&b, &v, 4);
  return b;
}

std::vector<float> random_signs(int64_t n, uint32_t seed) {
  std::vector<float> s(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  for (auto& v : s) v = rng() & 1 ? 1.0f : -1.0f;
  return s;
}

TEST(CudaFfnSplit, SwigluSiteMatchesFixupBitwise) {
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
      {1, 17408, 5120, 1024, {1, 2, 3, 4}, sms},  // the 27B FFN gate+up
      {2, 2048, 6144, 256, {1, 5}, sms, false},   // 64-column groups, no signs; two token groups
      {1, 1408, 640, 128, {1, 3}, 1},             // groups whole and split by 2
      {1, 1024, 640, 512, {2}, 1},                // every group whole (nr = 1)
      {1, 2048, 16384, 1024, {1}, sms},           // nr > 8: the slot loads in more than one batch
  };
  for (const Case& cs : cases) {
    for (const int t : cs.ts) {
      DevMem mem;
      Matvec mv(mem, cs.groups, cs.n, cs.k, t, cs.plan_sms, static_cast<uint32_t>(5 * cs.n + cs.k + t), 2);
      const std::string what = "G " + std::to_string(cs.groups) + " n " + std::to_string(cs.n) + " k " +
                               std::to_string(cs.k) + " block " + std::to_string(cs.block) + " t " +
                               std::to_string(t) + " nr " +
                               std::to_string(most_ranks(2 * cs.n, cs.k, cs.plan_sms));
      const size_t count = static_cast<size_t>(t) * cs.n;
      float* signs = cs.signs ? mem.up(random_signs(cs.n, 94)) : nullptr;
      SiteOut a(mem, count), b(mem, count);
      mv.run(a.gate, cuda::MatvecKernel::ws, cuda::MatvecFixup::first, nullptr, a.up);
      cuda::swiglu_hadamard(a.gate, a.up, a.act, signs, a.rotated, t, cs.n, cs.block, false, a.xq, a.meta,
                            nullptr);
      for (const auto kernel : {cuda::MatvecKernel::ws, cuda::MatvecKernel::bulk})
        for (const int ctas : {1, 2, 4, 8}) {
          if (cs.block / ctas < cuda::kBlockK) continue;
          const std::string w2 =
              what + (kernel == cuda::MatvecKernel::ws ? " ws" : " bulk") + " ctas " + std::to_string(ctas);
          b.clear();
          cuda::SplitSums split[2];
          ASSERT_EQ(static_cast<int>(mv.run(b.gate, kernel, cuda::MatvecFixup::defer, split, b.up)),
                    static_cast<int>(cuda::MatvecFixup::defer))
              << w2;
          EXPECT_EQ(split[0].y, b.gate);
          EXPECT_EQ(split[1].y, b.up);
          ASSERT_TRUE(cuda::fwht_site_split(split[0], split[1], b.act, signs, b.rotated, t, cs.n, cs.block,
                                            ctas, b.xq, b.meta, nullptr))
              << w2;
          SiteOut::expect_same(a, b, true, w2);
          if (ctas <= 4)  // the lean form (BONSAI_CUDA_SWI_SITE, _REGS), with and without the write-back
            for (const bool wb : {true, false})
              for (const bool lr : {false, true}) {
                b.clear();
                mv.run(b.gate, kernel, cuda::MatvecFixup::defer, split, b.up);
                ASSERT_TRUE(cuda::swiglu_site_lean(split[0], split[1], wb ? b.act : nullptr, signs, b.rotated,
                                                   t, cs.n, cs.block, b.xq, b.meta, wb, nullptr, ctas, lr))
                    << w2 << " lean" << (lr ? " low regs" : "");
                if (!wb) {  // act, gate and up not written: compare the rest
                  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                  const auto act = down(b.act, count);
                  for (size_t i = 0; i < count; ++i)
                    ASSERT_EQ(bits_of(act[i]), 0xFFFFFFFFu) << w2 << " lean: act written at " << i;
                  for (auto [dst, src] : {std::pair{b.act, a.act}, {b.gate, a.gate}, {b.up, a.up}})
                    cudaMemcpy(dst, src, count * 4, cudaMemcpyDeviceToDevice);
                }
                SiteOut::expect_same(a, b, true,
                                     w2 + (wb ? " lean" : " lean, no write-back") + (lr ? " low regs" : ""));
              }
          if (ctas == 1 && kernel == cuda::MatvecKernel::ws) {  // act may be null
            b.clear();
            mv.run(b.gate, kernel, cuda::MatvecFixup::defer, split, b.up);
            ASSERT_TRUE(cuda::fwht_site_split(split[0], split[1], nullptr, signs, b.rotated, t, cs.n,
                                              cs.block, ctas, b.xq, b.meta, nullptr));
            const auto act = down(b.act, count);
            for (size_t i = 0; i < count; ++i)
              ASSERT_EQ(bits_of(act[i]), 0xFFFFFFFFu) << w2 << " act written at " << i;
            cudaMemcpy(b.act, a.act, count * 4, cudaMemcpyDeviceToDevice);
            SiteOut::expect_same(a, b, true, w2 + " (no act)");
          }
        }
    }
  }
}

TEST(CudaFfnSplit, PlainSitesMatchBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const auto& [n, block, t] : {std::tuple<int64_t, int64_t, int>{17408, 1024, 1},
                                    {6144, 1024, 1},
                                    {6144, 1024, 3},
                                    {4096, 4096, 1},
                                    {2048, 256, 5}}) {
    DevMem mem;
    const size_t count = static_cast<size_t>(t) * n;
    float* x = mem.up(randn(count, 31 + t, 1.5f));
    float* u = mem.up(randn(count, 32 + t, 1.5f));
    float* signs = mem.up(random_signs(n, 95));
    const auto wx = cuda::split_whole(x, t, static_cast<int>(n)),
               wu = cuda::split_whole(u, t, static_cast<int>(n));
    SiteOut a(mem, count), b(mem, count);
    for (const bool swiglu : {true, false}) {
      a.clear();
      if (swiglu)
        cuda::swiglu_hadamard(x, u, a.act, signs, a.rotated, t, n, block, false, a.xq, a.meta, nullptr);
      else
        cuda::hadamard(x, signs, a.rotated, t, n, block, false, a.xq, a.meta, nullptr);
      for (const int ctas : {1, 2, 4, 8}) {
        if (block / ctas < cuda::kBlockK) continue;
        const std::string what = std::string(swiglu ? "swiglu" : "fwht") + " n " + std::to_string(n) +
                                 " block " + std::to_string(block) + " t " + std::to_string(t) + " ctas " +
                                 std::to_string(ctas);
        b.clear();
        const bool took = cuda::fwht_site_split(wx, swiglu ? wu : cuda::SplitSums{}, b.act, signs, b.rotated,
                                                t, n, block, ctas, b.xq, b.meta, nullptr);
        if (block / ctas <= 1024) {  // larger blocks of threads may exceed the kernel's registers
          ASSERT_TRUE(took) << what;
        }
        if (!took) continue;
        SiteOut::expect_same(a, b, false, what);
        if (swiglu && ctas <= 4) {  // the lean form takes plain inputs too
          SiteOut c(mem, count);
          const bool fits = block / ctas <= 1024;
          ASSERT_EQ(cuda::swiglu_site_lean(wx, wu, c.act, signs, c.rotated, t, n, block, c.xq, c.meta, true,
                                           nullptr, ctas, ctas == 1),
                    fits)
              << what << " lean";
          if (fits) {
            SiteOut::expect_same(b, c, false, what + " lean");
            const auto va = down(a.act, count), vc = down(c.act, count);
            expect_same_bits(va.data(), vc.data(), count * 4, what + " lean act");
          }
        }
        if (swiglu) {
          const auto va = down(a.act, count), vb = down(b.act, count);
          expect_same_bits(va.data(), vb.data(), count * 4, what + " act");
        }
        const auto vx = down(x, count);  // plain inputs are never written
        const auto want = randn(count, 31 + t, 1.5f);
        expect_same_bits(vx.data(), want.data(), count * 4, what + " x untouched");
      }
    }
  }
}

// The backend: matmul -> residual_norm_site -> matmul_multi(gate, up) -> swiglu_site -> hadamard
// of its rotated output under each setting, eagerly and recorded (a CUDA graph, as a decode
// step), equal bit for bit to the reference setting (no FFN deferral, one block per Hadamard
// block); then a held-back gate+up launch whose outputs are read or added by another op first.
TEST(CudaFfnSplit, BackendModesMatchBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  CudaBackend be(0);
  const int64_t n = 5120, k = 6144, f = 4096, block = 1024;
  WeightPool pool(be, "ffn split test weight");
  Weight &w = pool.ternary(n, k, 5), &wg = pool.ternary(f, n, 15), &wu = pool.ternary(f, n, 25);
  auto gain_h = randn(n, 6, 0.3f);
  for (auto& g : gain_h) g += 1.0f;
  Weight& gain = pool.f32(gain_h, 1, n);
  const auto signs_h = random_signs(n, 7), signs_f_h = random_signs(f, 8);
  for (const int t : {1, 3}) {
    const size_t count = static_cast<size_t>(t) * n, fcount = static_cast<size_t>(t) * f;
    auto xin_h = randn(static_cast<size_t>(t) * k, 8 + t, 2.0f), x_h = randn(count, 9 + t, 1.5f);
    auto put = [&](const std::vector<float>& v) {
      float* p = be.alloc(v.size());
      be.from_host(p, v.data(), v.size());
      return p;
    };
    float *xin = put(xin_h), *x = put(x_h), *signs = put(signs_h), *signs_f = put(signs_f_h);
    float *y = be.alloc(count), *x_out = be.alloc(count), *normed = be.alloc(count),
          *rotated = be.alloc(count);
    float *g = be.alloc(fcount), *u = be.alloc(fcount), *act = be.alloc(fcount), *frot = be.alloc(fcount),
          *frot2 = be.alloc(fcount);
    const std::vector<std::pair<float*, size_t>> outs = {{y, count},       {x_out, count}, {normed, count},
                                                         {rotated, count}, {g, fcount},    {u, fcount},
                                                         {act, fcount},    {frot, fcount}, {frot2, fcount}};
    const char* names[] = {"y", "x_out", "normed", "rotated", "gate", "up", "act", "ffn rotated", "fwht"};
    auto run = [&](bool defer, int swiglu_ctas, int plain_ctas, bool with_act, bool recorded, int lean) {
      be.set_ffn_defer(defer);
      be.set_swi_site(std::abs(lean), lean < 0);
      be.set_fwht_cluster(swiglu_ctas, plain_ctas);
      auto body = [&] {
        be.matmul(w, xin, y, t);
        be.residual_norm_site(x, y, x_out, gain, signs, block, normed, rotated, t, n, 1e-6f);
        const Weight* gu[] = {&wg, &wu};
        float* gu_out[] = {g, u};
        be.matmul_multi(gu, rotated, gu_out, t);
        be.swiglu_site(g, u, with_act ? act : nullptr, signs_f, block, frot, t, f);
        be.hadamard(frot, signs_f, frot2, t, f, block, false);
      };
      if (recorded)
        be.time_recorded(body, 2);
      else
        body();
      std::vector<std::vector<float>> out;
      for (const auto& [p, c] : outs) {
        std::vector<float> v(c);
        be.to_host(v.data(), p, c);
        out.push_back(std::move(v));
      }
      for (const auto& [p, c] : outs) be.zero(p, c);
      return out;
    };
    const auto ref = run(false, 1, 1, true, false, 0);
    for (const int lean : {0, 1, 2, 4, -1, -2})  // -c: c blocks, registers capped
      for (const bool defer : {false, true})
        for (const auto& [sc, pc] : {std::pair{1, 1}, std::pair{4, 1}, std::pair{8, 2}, std::pair{2, 4}})
          for (const bool recorded : {false, true})
            for (const bool with_act : {true, false}) {
              if (!defer && sc == 1 && pc == 1 && !recorded && with_act && !lean) continue;
              if (lean && sc != 1) continue;  // (the lean site runs where BONSAI_CUDA_FWHT_CLUSTER is 1,x)
              const auto got = run(defer, sc, pc, with_act, recorded, lean);
              const std::string what = "t " + std::to_string(t) + " defer " + std::to_string(defer) +
                                       " cluster " + std::to_string(sc) + "," + std::to_string(pc) +
                                       (recorded ? " recorded" : " eager") + (with_act ? "" : " no act") +
                                       (lean ? " lean " + std::to_string(lean) : "");
              // the lean site without act leaves the deferred gate and up unsummed (not written back)
              const bool gu_unsummed = lean && defer && !with_act;
              for (size_t i = 0; i < ref.size(); ++i) {
                if (!with_act && outs[i].first == act) continue;  // not written
                if (gu_unsummed && (outs[i].first == g || outs[i].first == u)) continue;
                expect_same_bits(ref[i].data(), got[i].data(), ref[i].size() * 4, what + " " + names[i]);
              }
            }
    be.set_swi_site(1);
    // Held back, then read by another op first: launched with its own fix-up, gate and up whole.
    be.set_ffn_defer(true);
    be.set_fwht_cluster(4, 1);
    be.matmul(w, xin, y, t);
    be.residual_norm_site(x, y, x_out, gain, signs, block, normed, rotated, t, n, 1e-6f);
    const Weight* gu[] = {&wg, &wu};
    float* gu_out[] = {g, u};
    be.matmul_multi(gu, rotated, gu_out, t);
    be.add(g, u, act, static_cast<int64_t>(fcount));
    std::vector<float> sum(fcount), want(fcount);
    be.to_host(sum.data(), act, fcount);
    for (size_t i = 0; i < fcount; ++i) want[i] = ref[4][i] + ref[5][i];
    expect_same_bits(want.data(), sum.data(), fcount * 4, "t " + std::to_string(t) + " held back, added");
    for (float* p : {xin, x, signs, signs_f, y, x_out, normed, rotated, g, u, act, frot, frot2})
      be.release(p);
  }
}

}  // namespace
}  // namespace bonsai

#else

TEST(CudaFfnSplit, SwigluSiteMatchesFixupBitwise) { GTEST_SKIP() << "built without CUDA (BONSAI_CUDA=OFF)"; }

#endif
