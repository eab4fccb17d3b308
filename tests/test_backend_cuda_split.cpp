// The deferred split-K sums (launch.h, MatvecFixup::defer / SplitSums): the matvec leaves a row
// group split between warps as one slot per warp, and the consumer adds the slots in rank order
// from 0.0f, the same additions as the matvec's own fix-ups, so everything must be equal bit
// for bit to the first-rank fix-up:
//   CudaSplitSums.StandaloneSumMatchesFixupBitwise: y of the ws and bulk kernels with defer +
//     matvec_split_sum against ws with first; plans with every group whole (nr = 1), groups of
//     both kinds, nr > 8, nr > 32 (the loads in more than one batch), a partial last group,
//     t = 1..4 and two token groups (t = 5, 8); legacy asked for defer runs last.
//   CudaSplitSums.ResidualSiteMatchesFixupBitwise: residual_norm_site_split (the site adds the
//     slots; cluster of the row's Hadamard blocks) against matvec first + residual_norm_site:
//     x_out, normed, rotated, the quantized activation and its scales, and y itself.
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

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai {
namespace {

using testing_util::randn;

class DevMem {
 public:
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() {
    for (void* p : mem_) cudaFree(p);
  }
  template <class T = void>
  T* alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    mem_.push_back(p);
    return static_cast<T*>(p);
  }
  template <class T>
  T* up(const std::vector<T>& v) {
    T* p = alloc<T>(v.size() * sizeof(T));
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

// Random 2-bit rows (PQ2_0 for groups 1, Q2_0 g64 for 2): codes 0..3, scales in [0.02, 0.08).
std::vector<uint8_t> random_rows(DType type, int64_t n, int64_t k, uint32_t seed) {
  const size_t stride = row_bytes(type, static_cast<uint64_t>(k));
  std::vector<uint8_t> raw(stride * n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(0.02f, 0.08f);
  const int g = type == DType::Q2_0_G64 ? 64 : 128;
  std::vector<uint8_t> codes(k);
  std::vector<float> scales(k / g);
  for (int64_t r = 0; r < n; ++r) {
    for (auto& c : codes) c = static_cast<uint8_t>(rng() % 4);
    for (auto& s : scales) s = scale(rng);
    encode_ternary_row(type, codes.data(), scales.data(), raw.data() + r * stride, k);
  }
  return raw;
}

DType type_of(int groups) { return groups == 2 ? DType::Q2_0_G64 : DType::PQ2_0; }

uint8_t* tiled_weight(DevMem& mem, int groups, int64_t n, int64_t k, uint32_t seed) {
  const DType type = type_of(groups);
  const auto raw = random_rows(type, n, k, seed);
  auto* draw = mem.up(raw);
  const size_t tb = static_cast<size_t>(cuda::tiled_bytes(n, k, groups));
  auto* tiled = mem.alloc<uint8_t>(tb);
  cudaMemset(tiled, 0, tb);
  cuda::repack_tiled(draw, row_bytes(type, static_cast<uint64_t>(k)), n, k, groups, tiled, nullptr);
  return tiled;
}

std::string skip_reason() {
  std::string why;
  if (cuda_device_count(&why) == 0) return "no CUDA device: " + why;
  if (!cuda::matvec_kernel_available(cuda::MatvecKernel::ws))
    return "the ws and bulk kernels need sm_90 code (compute capability 9.x)";
  return "";
}

int sm_count() {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

// Most ranks sharing one row group under the plan of `plan_sms` SMs (the plan: launch.h's
// matvec_tiled, 2 blocks of 8 warps per SM, ceil(units / warps) units per warp).
int most_ranks(int64_t n, int64_t k, int plan_sms) {
  const int64_t kb = k / cuda::kBlockK, pairs = (n + cuda::kPairRows - 1) / cuda::kPairRows;
  const int64_t warps = static_cast<int64_t>(plan_sms) * 2 * 8, units = pairs * kb;
  const int64_t per = (units + warps - 1) / warps;
  int64_t most = 0;
  for (int64_t p = 0; p < pairs; ++p) most = std::max(most, (p * kb + kb - 1) / per - p * kb / per + 1);
  return static_cast<int>(most);
}

// One matvec launch: x [t][k] quantized, then y = x · Wᵀ with the given kernel and fix-up.
struct Matvec {
  DevMem& mem;
  cuda::TiledJobs jobs;
  int groups;
  int64_t k;
  int t;
  int plan_sms;
  uint8_t* xq = nullptr;
  float4* meta = nullptr;
  float* partial = nullptr;
  int* counters = nullptr;
  size_t partial_floats = 0;

  Matvec(DevMem& m, int g, int64_t n, int64_t kk, int tt, int sms, uint32_t seed)
      : mem(m), groups(g), k(kk), t(tt), plan_sms(sms) {
    jobs.job[0].w = tiled_weight(mem, g, n, k, seed);
    jobs.job[0].n = static_cast<int>(n);
    jobs.count = 1;
    const int64_t kb = k / cuda::kBlockK;
    auto x = randn(static_cast<size_t>(t) * k, seed + 7, 2.0f);
    auto* dx = mem.up(x);
    xq = mem.alloc<uint8_t>(static_cast<size_t>(t) * kb * cuda::kActBytes);
    meta = mem.alloc<float4>(static_cast<size_t>(t) * kb * sizeof(float4));
    cuda::quantize_act(dx, xq, meta, t, k, nullptr);
    size_t n_counters = 0;
    cuda::matvec_tiled_scratch(jobs, t, k, plan_sms, &partial_floats, &n_counters);
    partial = mem.alloc<float>(partial_floats * 4);
    counters = mem.alloc<int>(n_counters * 4);
    cudaMemset(counters, 0, n_counters * 4);
  }
  float* new_y() {
    auto* y = mem.alloc<float>(static_cast<size_t>(t) * jobs.job[0].n * 4);
    cudaMemset(y, 0xff, static_cast<size_t>(t) * jobs.job[0].n * 4);  // unwritten words: NaN 0xFFFFFFFF
    return y;
  }
  cuda::MatvecFixup run(float* y, cuda::MatvecKernel kernel, cuda::MatvecFixup fixup,
                        cuda::SplitSums* split) {
    cuda::TiledJobs j = jobs;
    j.job[0].y = y;
    cudaMemset(partial, 0xff, partial_floats * 4);  // stale slots would show as NaN
    return cuda::matvec_tiled(j, groups, xq, meta, t, k, plan_sms, partial, counters, nullptr, true, kernel,
                              fixup, nullptr, split);
  }
};

void expect_same_bits(const void* a, const void* b, size_t bytes, const std::string& what) {
  const auto* pa = static_cast<const uint8_t*>(a);
  const auto* pb = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < bytes; i += 4)
    ASSERT_EQ(std::memcmp(pa + i, pb + i, std::min<size_t>(4, bytes - i)), 0) << what << " word " << i / 4;
}

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
      for (const auto kernel : {cuda::MatvecKernel::ws, cuda::MatvecKernel::bulk}) {
        const std::string w2 = what + (kernel == cuda::MatvecKernel::ws ? " ws" : " bulk");
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
                                           t, cs.n, 1e-6f, b.xq, b.meta, nullptr);
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
