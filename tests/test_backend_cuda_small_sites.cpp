// Session 8's small decode sites, each form against the former one bit for bit.
// The Hadamard sites' cross-warp FWHT stages after one barrier (BONSAI_CUDA_FWHT_XW, norm_fwht.cu's
// fwht_cross_warps): each thread runs the 2-, 4- or 8-point butterflies of the stages h >= 128
// itself from every warp's float4, in the reference's order, where the former loop ran one stage
// per barrier. Both are the same additions on the same operands, so every output must be the same
// bits (no tolerance):
//   CudaSmallSites.PlainSiteMatchesReferenceBitwise: cuda::hadamard with the mask's plain bit on and
//     off, forward (quantized) and inverse, with and without signs, blocks 128 .. 2048 (1, 2, 4, 8
//     warps: the one-barrier form; 16 warps: the loop either way), against each other and against
//     ref::hadamard (the same butterflies).
//   CudaSmallSites.SwigluAndSplitSitesMatchBitwise: swiglu_hadamard and fwht_site_split (plain inputs,
//     1 and 2 blocks per Hadamard block; SwiGLU and plain) with the mask on and off: rotated, act,
//     the quantized activation and its scales.
//   CudaSmallSites.AttentionPrepRopeEarlyMatchesBitwise: the attention prep's RoPE sin / cos before
//     the dependency wait (BONSAI_CUDA_ATTN_ROPE) against after the norm.
// Needs a device with sm_90 code (Hopper) for the split site; skips with the reason otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

#if BONSAI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_split_util.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tile_layout.h"
#include "kernels/ref/ops.h"

namespace bonsai {
namespace {

using namespace split_test;  // NOLINT(google-build-using-namespace): the shared helpers

std::vector<float> signs_of(int64_t n, uint32_t seed) {
  auto s = randn(static_cast<size_t>(n), seed);
  for (auto& v : s) v = v < 0 ? -1.0f : 1.0f;
  return s;
}

// One site's outputs on the device, NaN-filled before each run (an unwritten word shows).
struct Out {
  float *y = nullptr, *act = nullptr;
  uint8_t* xq = nullptr;
  float4* meta = nullptr;
  size_t n = 0, qbytes = 0, mbytes = 0;
  Out(DevMem& mem, size_t count) : n(count) {
    qbytes = n / cuda::kBlockK * cuda::kActBytes;
    mbytes = n / cuda::kBlockK * sizeof(float4);
    y = mem.alloc<float>(n * 4);
    act = mem.alloc<float>(n * 4);
    xq = mem.alloc<uint8_t>(qbytes);
    meta = mem.alloc<float4>(mbytes);
  }
  void clear() const {
    cudaMemset(y, 0xff, n * 4);
    cudaMemset(act, 0xff, n * 4);
    cudaMemset(xq, 0xff, qbytes);
    cudaMemset(meta, 0xff, mbytes);
  }
  static void expect_same(const Out& a, const Out& b, bool act, bool quant, const std::string& what) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    const auto ya = down(a.y, a.n), yb = down(b.y, a.n);
    expect_same_bits(ya.data(), yb.data(), a.n * 4, what + " y");
    if (act) {
      const auto aa = down(a.act, a.n), ab = down(b.act, a.n);
      expect_same_bits(aa.data(), ab.data(), a.n * 4, what + " act");
    }
    if (quant) {
      const auto qa = down(a.xq, a.qbytes), qb = down(b.xq, a.qbytes);
      expect_same_bits(qa.data(), qb.data(), a.qbytes, what + " xq");
      const auto ma = down(reinterpret_cast<const uint8_t*>(a.meta), a.mbytes),
                 mb = down(reinterpret_cast<const uint8_t*>(b.meta), a.mbytes);
      expect_same_bits(ma.data(), mb.data(), a.mbytes, what + " meta");
    }
  }
};

TEST(CudaSmallSites, PlainSiteMatchesReferenceBitwise) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  for (const int64_t block : {128, 256, 512, 1024, 2048}) {
    const int64_t rows = 3, k = block * 3;
    DevMem mem;
    const auto xh = randn(static_cast<size_t>(k * rows), 81 + static_cast<uint32_t>(block), 7.0f);
    const auto sh = signs_of(k, 82);
    float *x = mem.up(xh), *s = mem.up(sh);
    Out a(mem, static_cast<size_t>(k * rows)), b(mem, static_cast<size_t>(k * rows));
    for (const bool inverse : {false, true})
      for (const bool with_signs : {true, false}) {
        const std::string what = "block " + std::to_string(block) + (inverse ? " inverse" : " forward") +
                                 (with_signs ? " signs" : " no signs");
        const bool quant = !inverse;
        a.clear();
        b.clear();
        cuda::hadamard(x, with_signs ? s : nullptr, a.y, rows, k, block, inverse, quant ? a.xq : nullptr,
                       quant ? a.meta : nullptr, nullptr, nullptr, /*xw_mask=*/0);
        cuda::hadamard(x, with_signs ? s : nullptr, b.y, rows, k, block, inverse, quant ? b.xq : nullptr,
                       quant ? b.meta : nullptr, nullptr, nullptr, /*xw_mask=*/2);
        Out::expect_same(a, b, false, quant, what);
        std::vector<float> ref(static_cast<size_t>(k * rows));
        ref::hadamard(xh.data(), with_signs ? sh.data() : nullptr, ref.data(), rows, k, block, inverse);
        const auto yb = down(b.y, b.n);
        expect_same_bits(yb.data(), ref.data(), b.n * 4, what + " vs reference");
      }
  }
}

TEST(CudaSmallSites, SwigluAndSplitSitesMatchBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const auto& [n, block, t] : {std::tuple<int64_t, int64_t, int>{17408, 1024, 1},
                                    {6144, 1024, 2},
                                    {2048, 512, 3},
                                    {1024, 256, 1},
                                    {4096, 2048, 1}}) {
    DevMem mem;
    const size_t count = static_cast<size_t>(t) * n;
    float* x = mem.up(randn(count, 91 + t, 1.5f));
    float* u = mem.up(randn(count, 92 + t, 1.5f));
    float* s = mem.up(signs_of(n, 93));
    const auto wx = cuda::split_whole(x, t, static_cast<int>(n)),
               wu = cuda::split_whole(u, t, static_cast<int>(n));
    Out a(mem, count), b(mem, count);
    const std::string shape =
        "n " + std::to_string(n) + " block " + std::to_string(block) + " t " + std::to_string(t);
    a.clear();
    b.clear();
    cuda::swiglu_hadamard(x, u, a.act, s, a.y, t, n, block, false, a.xq, a.meta, nullptr, nullptr, 0);
    cuda::swiglu_hadamard(x, u, b.act, s, b.y, t, n, block, false, b.xq, b.meta, nullptr, nullptr, 1);
    Out::expect_same(a, b, true, true, shape + " swiglu_hadamard");
    for (const bool swiglu : {true, false})
      for (const int ctas : {1, 2}) {
        const std::string what =
            shape + (swiglu ? " swiglu" : " fwht") + " split site, ctas " + std::to_string(ctas);
        a.clear();
        b.clear();
        const cuda::SplitSums up = swiglu ? wu : cuda::SplitSums{};
        const bool ta =
            cuda::fwht_site_split(wx, up, a.act, s, a.y, t, n, block, ctas, a.xq, a.meta, nullptr, 0);
        const bool tb =
            cuda::fwht_site_split(wx, up, b.act, s, b.y, t, n, block, ctas, b.xq, b.meta, nullptr, 3);
        ASSERT_EQ(ta, tb) << what;
        if (block / ctas <= 1024) {  // larger blocks of threads may exceed the kernel's registers
          ASSERT_TRUE(ta) << what;
        }
        if (!ta) continue;
        Out::expect_same(a, b, swiglu, true, what);
      }
  }
}

// attention_prep with the RoPE sin / cos before the dependency wait (BONSAI_CUDA_ATTN_ROPE) and
// after the norm: the same expressions of the same position, so q and the cache rows must be the
// same bits; eager (pos0) and with the position read from the device (a recorded step's pos_dev).
TEST(CudaSmallSites, AttentionPrepRopeEarlyMatchesBitwise) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  struct Shape {
    int n_head, n_head_kv, head_dim, n_rot, t, pos0;
  };
  for (const Shape& cs : {Shape{24, 4, 256, 64, 1, 1000}, Shape{24, 4, 256, 64, 3, 7},
                          Shape{8, 2, 128, 128, 2, 0}, Shape{4, 4, 64, 32, 1, 40000}}) {
    DevMem mem;
    const int d = cs.head_dim, t = cs.t;
    const size_t kv = static_cast<size_t>(cs.n_head_kv) * d, rows = static_cast<size_t>(cs.pos0 + t) * kv;
    const size_t nq = static_cast<size_t>(t) * cs.n_head * d;
    auto qn = randn(static_cast<size_t>(d), 61, 0.3f), kn = randn(static_cast<size_t>(d), 62, 0.3f);
    for (auto& v : qn) v += 1.0f;
    for (auto& v : kn) v += 1.0f;
    cuda::AttnPrep p;
    p.qf = mem.up(randn(2 * nq, 63, 2.0f));
    p.k = mem.up(randn(static_cast<size_t>(t) * kv, 64, 2.0f));
    p.v = mem.up(randn(static_cast<size_t>(t) * kv, 65, 2.0f));
    p.q_norm = mem.up(qn);
    p.k_norm = mem.up(kn);
    p.eps = 1e-6f;
    p.base = 1e7f;
    p.n_rot = cs.n_rot;
    p.n_head = cs.n_head;
    p.n_head_kv = cs.n_head_kv;
    p.head_dim = d;
    const int* pos_dev = mem.up(std::vector<int>{cs.pos0});
    for (const bool on_device : {false, true}) {
      std::vector<float> got[2][3];
      for (int early = 0; early < 2; ++early) {
        p.q = mem.alloc<float>(nq * 4);
        p.k_cache = mem.alloc<float>(rows * 4);
        p.v_cache = mem.alloc<float>(rows * 4);
        cudaMemset(p.q, 0xff, nq * 4);
        cudaMemset(p.k_cache, 0xff, rows * 4);
        cudaMemset(p.v_cache, 0xff, rows * 4);
        cuda::attention_prep(p, t, on_device ? -1 : cs.pos0, on_device ? pos_dev : nullptr, nullptr, nullptr,
                             true, early);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        got[early][0] = down(p.q, nq);
        got[early][1] = down(p.k_cache, rows);
        got[early][2] = down(p.v_cache, rows);
      }
      const std::string what = "n_head " + std::to_string(cs.n_head) + " d " + std::to_string(d) + " t " +
                               std::to_string(t) + " pos0 " + std::to_string(cs.pos0) +
                               (on_device ? " (pos_dev)" : "");
      const char* names[] = {"q", "k_cache", "v_cache"};
      for (int j = 0; j < 3; ++j)
        expect_same_bits(got[0][j].data(), got[1][j].data(), got[0][j].size() * 4, what + " " + names[j]);
      // the rows before pos0 stay unwritten (NaN) in both: a wrong position would show here
      const auto kc = got[1][1];
      size_t written = 0;
      for (const float v : kc) written += std::isnan(v) ? 0 : 1;
      EXPECT_EQ(written, static_cast<size_t>(t) * kv) << what;
    }
  }
}

}  // namespace
}  // namespace bonsai

#endif  // BONSAI_HAVE_CUDA
