// The prefill sites writing the fp16 GEMM's activation (kernels/cuda/site_f16.h) and the
// prefill attention's split plan:
//   CudaAttentionPlan.SplitsFillOneWaveAtMost: attention_mma_splits never starts a second round
//     of blocks with a split (blocks · splits <= SMs · blocks per SM when splits > 1), and takes
//     the most splits that one wave holds up to its caps (four KV tiles per split, 32).
//   CudaSiteF16.MatchesPerBlockSitesAndConversion: site_f16 against the per-block sites
//     (hadamard, swiglu_hadamard, residual_norm_site) followed by act_to_f16, bit for bit: every
//     float output, the fp16 record and the per-token scale; random rows and adversarial ones
//     (all zero, huge, float-subnormal, one large element among tiny ones, the amax in the
//     last Hadamard block), 1 .. 24 Hadamard blocks of 128 .. 1024 columns, odd row counts; and
//     the same for site_f16_two_pass (the per-block kernels writing block amaxes, then the
//     record), also with blocks of 2048 and 4096 that only it takes, and for site_f16_cluster
//     (a cluster of thread blocks per row) with 1 .. 4 Hadamard blocks per thread block (the
//     last thread block of a row partial where they do not divide the row; odd block counts).
//   CudaSiteF16.BackendSitesFeedTheGemmBitwise: CudaBackend's three sites + matmul with the
//     sites' fp16 activation (set_site_f16(1 .. 4)) or the int8 quantization skipped (0 with
//     skip_quant) against the int8 quantization and the conversion (0): the same GEMM output
//     and site outputs bit for bit, and the fp16 form written (or the quantization skipped)
//     only where the width's prefill matmuls ran the fp16 GEMM (not for decode rows, not below
//     the GEMM's grid rule); mode 3 also with the cluster form (set_site_cluster), Hadamard
//     blocks of 1024 (a cluster of one) and of 256 (clusters of 4 and of 2, one partial).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bonsai/formats.h"
#include "test_util.h"

#if BONSAI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/site_f16.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai {
namespace {

using testing_util::randn;

TEST(CudaAttentionPlan, SplitsFillOneWaveAtMost) {
  if (cuda::attention_mma_forced_splits() != 0) GTEST_SKIP() << "BONSAI_CUDA_ATTN_SPLITS forces the count";
  struct Heads {
    int n_head, n_head_kv;
  };
  for (const Heads h : {Heads{24, 4}, Heads{16, 2}, Heads{8, 8}, Heads{32, 4}})
    for (int sms : {16, 78, 132})
      for (int t : {8, 16, 100, 256, 512})
        for (int pos0 : {0, 64, 256, 1000, 8000}) {
          const int s = cuda::attention_mma_splits(t, pos0, h.n_head, h.n_head_kv, sms);
          const std::string what = std::to_string(h.n_head) + "/" + std::to_string(h.n_head_kv) + " heads, " +
                                   std::to_string(sms) + " SMs, t " + std::to_string(t) + ", pos0 " +
                                   std::to_string(pos0) + ": " + std::to_string(s) + " splits";
          ASSERT_GE(s, 1) << what;
          // the tile width (and so blocks per SM) as the kernel picks it: both are tried
          bool ok = false;
          for (int kt : {32, 64}) {
            const int per_sm = kt == 32 ? 2 : 1, blocks = (t + 15) / 16 * h.n_head_kv;
            const int cap = std::max(1, std::min((pos0 + t + kt - 1) / kt / 4, 32));
            const bool one_wave =
                s == 1 || static_cast<int64_t>(blocks) * s <= static_cast<int64_t>(sms) * per_sm;
            const bool most =
                s == cap || static_cast<int64_t>(blocks) * (s + 1) > static_cast<int64_t>(sms) * per_sm;
            ok = ok || (one_wave && most && s <= cap);
          }
          ASSERT_TRUE(ok) << what;
        }
}

class DevMem {
 public:
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() {
    for (void* p : mem_) cudaFree(p);
  }
  template <class T>
  T* alloc(size_t count) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(count * sizeof(T), 16)), cudaSuccess);
    cudaMemset(p, 0xff, count * sizeof(T));  // no output may be left unwritten
    mem_.push_back(p);
    return static_cast<T*>(p);
  }
  template <class T>
  T* up(const std::vector<T>& v) {
    T* p = alloc<T>(v.size());
    cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return p;
  }

 private:
  std::vector<void*> mem_;
};

template <class T>
std::vector<T> down(const T* p, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

template <class T>
void expect_same_bits(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  const size_t bytes = a.size() * sizeof(T);
  const auto* pa = reinterpret_cast<const uint8_t*>(a.data());
  const auto* pb = reinterpret_cast<const uint8_t*>(b.data());
  for (size_t i = 0; i < bytes; i += 4)
    ASSERT_EQ(std::memcmp(pa + i, pb + i, std::min<size_t>(4, bytes - i)), 0) << what << " word " << i / 4;
}

// rows x k values: random rows, and as rows 0..4 (where there are that many) an all-zero row,
// a huge one, a float-subnormal one (the exponent clamp), one large element among tiny ones
// (fp16 subnormals after the scaling), and rows whose Hadamard blocks grow 16-fold each (the
// amax in the last block: the exponent needs the whole row).
std::vector<float> site_input(int64_t rows, int64_t k, int64_t block, uint32_t seed, float scale) {
  std::vector<float> v = randn(static_cast<size_t>(rows * k), seed, scale);
  for (int64_t r = 0; r < std::min<int64_t>(rows, 5); ++r)
    for (int64_t c = 0; c < k; ++c) {
      float& x = v[r * k + c];
      switch (r) {
        case 0:
          x = 0.0f;
          break;
        case 1:
          x *= 1e17f;
          break;
        case 2:
          x *= 1e-40f / scale;
          break;
        case 3:
          x = c == 5 ? 3e4f : x * 1e-6f;
          break;
        default:
          x *= std::pow(16.0f, static_cast<float>(c / block));
          break;
      }
    }
  return v;
}

TEST(CudaSiteF16, MatchesPerBlockSitesAndConversion) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  struct Case {
    int64_t rows, k, block;
  };
  // 5 / 17 blocks of 1024 (the 27B's residual and SwiGLU sites: 8- and 24-float4 kernels), 6 of
  // 256 (one cross-warp stage), 4 and 24 of 128 (a warp per block, no cross-warp stage), 1.
  // 2 of 2048 and 3 of 4096: site_f16_two_pass only.
  // 7 of 256 and 9 of 128: odd counts for the cluster form (partial last thread blocks).
  const Case cases[] = {{13, 5120, 1024}, {7, 17408, 1024}, {37, 1536, 256},  {1, 512, 128},  {5, 3072, 128},
                        {3, 1024, 1024},  {6, 4096, 2048},  {5, 12288, 4096}, {9, 1792, 256}, {6, 1152, 128}};
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  for (const Case& cs : cases) {
    const bool fused = cuda::site_f16_fits(cs.k, cs.block);
    ASSERT_EQ(fused, cs.block <= 1024);
    ASSERT_TRUE(cuda::site_f16_two_pass_fits(cs.k, cs.block));
    std::vector<int> per_blocks;  // the cluster form's choices that fit this row
    for (int g = 1; g <= 4; ++g) {
      const int64_t c = (cs.k / cs.block + g - 1) / g;
      const bool fits = major == 9 && cs.block <= 1024 && c <= cuda::kSiteF16MaxCluster;
      ASSERT_EQ(cuda::site_f16_cluster_fits(cs.k, cs.block, g), fits) << cs.k << " " << cs.block << " " << g;
      if (fits) per_blocks.push_back(g);
    }
    const size_t count = static_cast<size_t>(cs.rows * cs.k);
    const size_t kbs = static_cast<size_t>(cs.rows * (cs.k / cuda::kBlockK));
    DevMem mem;
    auto signs_h = randn(static_cast<size_t>(cs.k), 3, 1.0f);
    for (auto& s : signs_h) s = s < 0 ? -1.0f : 1.0f;
    auto gain_h = randn(static_cast<size_t>(cs.k), 4, 0.3f);
    for (auto& g : gain_h) g += 1.0f;
    const float* signs = mem.up(signs_h);
    const float* gain = mem.up(gain_h);
    const float* x = mem.up(site_input(cs.rows, cs.k, cs.block, 5, 1.5f));
    const float* x2 = mem.up(site_input(cs.rows, cs.k, cs.block, 6, 0.7f));
    for (const auto kind :
         {cuda::SiteF16Kind::hadamard, cuda::SiteF16Kind::swiglu, cuda::SiteF16Kind::residual})
      for (const bool with_signs : {true, false})
        for (const bool with_delta : {true, false}) {
          if (kind != cuda::SiteF16Kind::residual && !with_delta) continue;  // (no delta elsewhere)
          const std::string what = "rows " + std::to_string(cs.rows) + " k " + std::to_string(cs.k) +
                                   " block " + std::to_string(cs.block) + " kind " +
                                   std::to_string(static_cast<int>(kind)) + (with_signs ? " signs" : "") +
                                   (with_delta ? " delta" : "");
          struct Out {
            float *rotated, *act, *x_out, *normed, *tscale;
            uint8_t* xh;
          };
          auto outs = [&] {
            return Out{mem.alloc<float>(count),
                       mem.alloc<float>(count),
                       mem.alloc<float>(count),
                       mem.alloc<float>(count),
                       mem.alloc<float>(static_cast<size_t>(cs.rows)),
                       mem.alloc<uint8_t>(kbs * cuda::kActBytes)};
          };
          const Out want = outs(), got = outs(), two = outs();
          uint8_t* xq = mem.alloc<uint8_t>(kbs * cuda::kActBytes);
          float4* meta = mem.alloc<float4>(kbs);
          const float* sg = with_signs ? signs : nullptr;
          switch (kind) {
            case cuda::SiteF16Kind::hadamard:
              cuda::hadamard(x, sg, want.rotated, cs.rows, cs.k, cs.block, false, xq, meta, nullptr);
              break;
            case cuda::SiteF16Kind::swiglu:
              cuda::swiglu_hadamard(x, x2, want.act, sg, want.rotated, cs.rows, cs.k, cs.block, false, xq,
                                    meta, nullptr);
              break;
            case cuda::SiteF16Kind::residual:
              cuda::residual_norm_site(x, with_delta ? x2 : nullptr, want.x_out, gain, sg, cs.block,
                                       want.normed, want.rotated, cs.rows, cs.k, 1e-6f, xq, meta, nullptr);
              break;
          }
          cuda::act_to_f16(want.rotated, want.xh, want.tscale, static_cast<int>(cs.rows), cs.k, nullptr, 1);
          auto args = [&](const Out& o) {
            cuda::SiteF16Args a;
            a.x = x;
            a.up = x2;
            a.act = o.act;
            a.delta = with_delta ? x2 : nullptr;
            a.x_out = o.x_out;
            a.gain = gain;
            a.normed = o.normed;
            a.eps = 1e-6f;
            a.signs = sg;
            a.rotated = o.rotated;
            a.xh = o.xh;
            a.tscale = o.tscale;
            return a;
          };
          if (fused) cuda::site_f16(kind, args(got), cs.rows, cs.k, cs.block, nullptr);
          float* bamax = mem.alloc<float>(static_cast<size_t>(cs.rows * (cs.k / cs.block)));
          cuda::site_f16_two_pass(kind, args(two), bamax, cs.rows, cs.k, cs.block, nullptr);
          std::vector<Out> cl;  // per per_blocks[i]
          for (const int g : per_blocks) {
            cl.push_back(outs());
            ASSERT_TRUE(cuda::site_f16_cluster(kind, args(cl.back()), cs.rows, cs.k, cs.block, g, nullptr))
                << what << " cluster, " << g << " per block";
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
          for (int form = -2; form < static_cast<int>(cl.size()); ++form) {  // -2 fused, -1 two passes
            if (form == -2 && !fused) continue;
            const Out& g = form == -2 ? got : (form == -1 ? two : cl[static_cast<size_t>(form)]);
            const std::string w =
                what + (form == -2   ? " (one block per row)"
                        : form == -1 ? " (two passes)"
                                     : " (cluster, " + std::to_string(per_blocks[static_cast<size_t>(form)]) +
                                           " per block)");
            expect_same_bits(down(want.rotated, count), down(g.rotated, count), w + " rotated");
            if (kind == cuda::SiteF16Kind::swiglu)
              expect_same_bits(down(want.act, count), down(g.act, count), w + " act");
            if (kind == cuda::SiteF16Kind::residual) {
              expect_same_bits(down(want.x_out, count), down(g.x_out, count), w + " x_out");
              expect_same_bits(down(want.normed, count), down(g.normed, count), w + " normed");
            }
            expect_same_bits(down(want.xh, kbs * cuda::kActBytes), down(g.xh, kbs * cuda::kActBytes),
                             w + " fp16 record");
            expect_same_bits(down(want.tscale, static_cast<size_t>(cs.rows)),
                             down(g.tscale, static_cast<size_t>(cs.rows)), w + " token scales");
          }
        }
  }
}

// The weight: PQ2_0 rows of random codes and small scales, k = 1024 (the sites' width).
Weight gemm_weight(std::vector<uint8_t>& raw, int64_t n, int64_t k) {
  const size_t stride = row_bytes(DType::PQ2_0, static_cast<uint64_t>(k));
  raw.resize(stride * n);
  std::mt19937 rng(8);
  for (auto& b : raw) b = static_cast<uint8_t>(rng());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < k / 128; ++b) {
      const uint16_t h = f32_to_fp16(0.001f * static_cast<float>(1 + (r * 7 + b) % 40));
      std::memcpy(raw.data() + r * stride + b * 34, &h, 2);
    }
  Weight w;
  w.name = "site f16 test weight";
  w.type = DType::PQ2_0;
  w.n = n;
  w.k = k;
  w.data = raw.data();
  w.nbytes = raw.size();
  return w;
}

TEST(CudaSiteF16, BackendSitesFeedTheGemmBitwise) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  // 8448 rows: 66 row blocks x 3 token blocks of 64 at t = 130 (198 >= 132 SMs: the fp16 GEMM
  // where it is chosen), 66 x 1 at t = 13 (below one block per SM: the int8 kernels).
  const int64_t n = 8448, k = 1024;
  std::vector<uint8_t> raw;
  Weight w = gemm_weight(raw, n, k);
  auto gain_h = randn(static_cast<size_t>(k), 6, 0.3f);
  for (auto& g : gain_h) g += 1.0f;
  Weight gain;
  gain.name = "site f16 test gain";
  gain.type = DType::F32;
  gain.n = 1;
  gain.k = k;
  gain.data = reinterpret_cast<const uint8_t*>(gain_h.data());
  gain.nbytes = gain_h.size() * 4;
  auto signs_h = randn(static_cast<size_t>(k), 7, 1.0f);
  for (auto& s : signs_h) s = s < 0 ? -1.0f : 1.0f;
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  // the sites write the fp16 form only where the fp16 GEMM (one term) runs; they skip the
  // quantization where it runs with any terms
  const bool gemm_f16 = cuda::gemm_kernel() == cuda::GemmKernel::f16 && major == 9 && minor == 0;
  const bool f16 = gemm_f16 && cuda::gemm_f16_terms() == 1;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const bool small_f16 =
      gemm_f16 && 66 >= static_cast<int64_t>(cuda::gemm_wg_min_blocks()) * sms;  // (WG_MIN=0)
  if (gemm_f16 && 198 < static_cast<int64_t>(cuda::gemm_wg_min_blocks()) * sms)
    GTEST_SKIP() << "grid rule changed";
  struct Run {
    std::vector<std::vector<float>> outs;
    int64_t site_f16 = 0, skips = 0, cluster = 0;
  };
  struct Cl {
    int per_block = 0;     // set_site_cluster(per_block, per_block); 0: not used
    int64_t block = 1024;  // the sites' Hadamard block
  };
  auto run = [&](int mode, bool skip_quant, Cl cl) {
    const int64_t block = cl.block;
    CudaBackend be(0);
    be.set_site_f16(mode, skip_quant);
    be.set_site_cluster(cl.per_block, cl.per_block);
    be.prepare(w);
    be.prepare(gain);
    Run r;
    std::vector<float*> bufs;
    auto up = [&](const std::vector<float>& v) {
      float* p = be.alloc(v.size());
      be.from_host(p, v.data(), v.size());
      bufs.push_back(p);
      return p;
    };
    auto fresh = [&](size_t count) {
      float* p = be.alloc(count);
      bufs.push_back(p);
      return p;
    };
    const float* signs = up(signs_h);
    for (const int t : {130, 13, 1, 130}) {  // (the first launch of the width teaches the sites)
      const size_t count = static_cast<size_t>(t) * k;
      const float* x = up(randn(count, 11 + t, 1.3f));
      const float* x2 = up(randn(count, 12 + t, 0.8f));
      float *x_out = fresh(count), *normed = fresh(count), *rotated = fresh(count), *act = fresh(count),
            *y = fresh(static_cast<size_t>(t) * n);
      auto keep = [&](const float* p, size_t c) {
        std::vector<float> v(c);
        be.to_host(v.data(), p, c);
        r.outs.push_back(std::move(v));
      };
      be.residual_norm_site(x, x2, x_out, gain, signs, block, normed, rotated, t, k, 1e-6f);
      be.matmul(w, rotated, y, t);
      for (const float* p : {x_out, normed, rotated}) keep(p, count);
      keep(y, static_cast<size_t>(t) * n);
      be.hadamard(x2, signs, rotated, t, k, block, false);
      be.matmul(w, rotated, y, t);
      keep(rotated, count);
      keep(y, static_cast<size_t>(t) * n);
      be.swiglu_site(x, x2, act, signs, block, rotated, t, k);
      be.matmul(w, rotated, y, t);
      for (const float* p : {act, rotated}) keep(p, count);
      keep(y, static_cast<size_t>(t) * n);
      // without act (the graph's form unless it dumps): the same rotated and GEMM output
      be.swiglu_site(x, x2, nullptr, signs, block, rotated, t, k);
      be.matmul(w, rotated, y, t);
      keep(rotated, count);
      keep(y, static_cast<size_t>(t) * n);
      const size_t o = r.outs.size();
      EXPECT_EQ(r.outs[o - 1], r.outs[o - 3]) << "t " << t << ": GEMM output without act";
      EXPECT_EQ(r.outs[o - 2], r.outs[o - 4]) << "t " << t << ": rotated without act";
    }
    r.site_f16 = be.site_f16_launches();
    r.cluster = be.site_f16_cluster_launches();
    r.skips = be.site_quant_skips();
    for (float* p : bufs) be.release(p);
    be.unprepare(w);
    be.unprepare(gain);
    return r;
  };
  const Run base = run(0, false, {});
  EXPECT_EQ(base.site_f16, 0);
  EXPECT_EQ(base.skips, 0);
  // t = 130 the first time: the residual site before any matmul of the width converts, the
  // hadamard and SwiGLU sites after it write fp16 (or skip the quantization); t = 13: never
  // (the int8 kernels), unless the fp16 GEMM takes that grid too (then the two after its first
  // matmul); t = 1: never; t = 130 again: all three. (Each SwiGLU site runs twice: with and
  // without act.)
  const int64_t where = gemm_f16 ? (small_f16 ? 10 : 7) : 0;
  for (const int mode : {0, 1, 2, 3, 4})
    for (const bool skip_quant : {true, false}) {
      if (mode == 0 && !skip_quant) continue;  // (the base)
      const Run sites = run(mode, skip_quant, {});
      const std::string what = "mode " + std::to_string(mode) + (skip_quant ? " skip_quant" : "");
      const bool writes = mode > 0 && f16;
      EXPECT_EQ(sites.site_f16, writes ? where : 0) << what;
      EXPECT_EQ(sites.skips, !writes && skip_quant ? where : 0) << what;
      EXPECT_EQ(sites.cluster, 0) << what;
      ASSERT_EQ(base.outs.size(), sites.outs.size()) << what;
      for (size_t i = 0; i < base.outs.size(); ++i)
        expect_same_bits(base.outs[i], sites.outs[i], what + " output " + std::to_string(i));
    }
  // The cluster form (mode 3): a cluster of one (1024), of 4 and of 2 with one Hadamard block of
  // the row's 4 left to the last thread block (256), against mode 0 at the same block.
  const Run base256 = run(0, false, {0, 256});
  const Cl forms[] = {{1, 1024}, {1, 256}, {3, 256}};
  for (const Cl& cl : forms) {
    const Run sites = run(3, true, cl);
    const Run& want = cl.block == 1024 ? base : base256;
    const std::string what =
        "mode 3, cluster " + std::to_string(cl.per_block) + " per block, block " + std::to_string(cl.block);
    EXPECT_EQ(sites.site_f16, f16 ? where : 0) << what;
    EXPECT_EQ(sites.cluster, f16 && major == 9 ? where : 0) << what;
    ASSERT_EQ(want.outs.size(), sites.outs.size()) << what;
    for (size_t i = 0; i < want.outs.size(); ++i)
      expect_same_bits(want.outs[i], sites.outs[i], what + " output " + std::to_string(i));
  }
}

}  // namespace
}  // namespace bonsai

#endif  // BONSAI_HAVE_CUDA
