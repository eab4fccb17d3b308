// The decode matvec's three kernels against each other (kernels/cuda/matvec.cu, matvec_ws.cu;
// launch.h, MatvecKernel). They share the plan (each warp's unit range), the per-unit
// arithmetic (unit_dot) and the split fix-up (slots added in rank order), so every y must be
// equal bit for bit: the warp-specialized kernel (ws) and the bulk-ring kernel against the
// register-staged one (legacy). Cases: both 2-bit scale groupings (G = 1: 128-column groups,
// G = 2: 64-column groups), odd row counts, several jobs per launch, t = 1..4, a whole row group
// per warp (y written directly), a group shared by up to 136 warps (the fix-up), long rows
// (k = 17408; with BONSAI_CUDA_MV_WS=4 the staged activation shrinks the ring at t = 2), codes 0..3, zero
// scales, an all-zero token. The split counters must be left zero. CudaMatvecKernels.
// FixupsMatchBitwise: the three split fix-ups (launch.h, MatvecFixup) of the bulk and ws kernels
// against legacy, and which fix-up each launch takes; FpOpsNeverReturnTheEmptySlotWord: the
// flag-free fix-up's sentinel is no result of FADD / FMUL / FFMA. Needs a device with sm_90
// code (Hopper); skips with the reason otherwise. With BONSAI_CUDA_BENCH=1, CudaBench.
// MatvecKernelsOneShape times the three kernels (ws with both consumer loops) on one shape (A/B
// in one process; profiling).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
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

// Device allocations of one test, freed at its end.
class DevMem {
 public:
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() {
    for (void* p : mem_) cudaFree(p);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    mem_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> mem_;
};

// Random 2-bit rows in the file layout (groups 1: PQ2_0, 128-column groups of 34 bytes;
// 2: Q2_0 g64, 18 bytes), any codes 0..3, scales in [2^-8, 2^-4) or 0 (every 7th group);
// with specials, one group's scale in every 5th row is one of FP16 +Inf, -Inf, NaN 0x7E00, NaN 0xFFFF.
std::vector<uint8_t> random_rows(int groups, int64_t n, int64_t k, std::mt19937& rng, bool specials = false) {
  const DType type = groups == 2 ? DType::Q2_0_G64 : DType::PQ2_0;
  const int64_t group_cols = groups == 2 ? 64 : 128, group_bytes = groups == 2 ? 18 : 34;
  const size_t stride = row_bytes(type, static_cast<uint64_t>(k));
  std::vector<uint8_t> raw(stride * n);
  for (auto& b : raw) b = static_cast<uint8_t>(rng());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < k / group_cols; ++b) {
      const float d = (r + b) % 7 == 0
                          ? 0.0f
                          : std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -8 + static_cast<int>(rng() % 4));
      uint16_t h = f32_to_fp16(d);
      if (specials && r % 5 == 0 && b == (r / 5) % (k / group_cols)) {  // one group of every 5th row
        const uint16_t special[4] = {0x7C00, 0xFC00, 0x7E00, 0xFFFF};
        h = special[(r + b) % 4];
      }
      std::memcpy(raw.data() + r * stride + b * group_bytes, &h, 2);
    }
  return raw;
}

// The tiled device copy of raw rows (kernels/cuda/tile_layout.h), padding zero.
uint8_t* tiled_weight(DevMem& mem, const uint8_t* draw, int groups, int64_t n, int64_t k) {
  const DType type = groups == 2 ? DType::Q2_0_G64 : DType::PQ2_0;
  const size_t tb = static_cast<size_t>(cuda::tiled_bytes(n, k, groups));
  auto* tiled = static_cast<uint8_t*>(mem.alloc(tb));
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

TEST(CudaMatvecKernels, WsAndBulkMatchLegacyBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int sms = sm_count();
  struct Case {
    int groups;
    std::vector<int64_t> ns;
    int64_t k;
    std::vector<int> ts;
    bool evict_first;
  };
  const Case cases[] = {
      {1, {77, 300, 33, 1000}, 5120, {1, 2, 3, 4}, true},  // 4 jobs, odd n
      {2, {130, 61, 1001}, 2048, {1, 2, 3, 4}, true},
      {2, {67}, 6144, {1, 3}, false},    // one group split over many warps, no cache hint
      {1, {40000}, 128, {1, 4}, true},   // one k-block: every warp writes whole groups
      {1, {64}, 17408, {1, 2}, true},    // 136 units of one group: 136 warps, one unit each
      {1, {1000}, 17408, {1, 2}, true},  // t = 2: the ws ring shrinks to fit the activation
      {2, {600}, 17408, {1}, true},
  };
  int ws_launches = 0;
  for (const Case& cs : cases) {
    const int64_t k = cs.k, kb = k / cuda::kBlockK;
    DevMem mem;
    auto dalloc = [&](size_t bytes) { return mem.alloc(bytes); };
    std::mt19937 rng(static_cast<uint32_t>(k + cs.groups));
    cuda::TiledJobs jobs;
    for (const int64_t n : cs.ns) {
      const auto raw = random_rows(cs.groups, n, k, rng);
      auto* draw = static_cast<uint8_t*>(dalloc(raw.size()));
      cudaMemcpy(draw, raw.data(), raw.size(), cudaMemcpyHostToDevice);
      jobs.job[jobs.count].w = tiled_weight(mem, draw, cs.groups, n, k);
      jobs.job[jobs.count].n = static_cast<int>(n);
      ++jobs.count;
    }
    for (const int t : cs.ts) {
      auto x = randn(static_cast<size_t>(t) * k, 11 + t, 3.0f);
      if (t > 1)
        for (int64_t c = 0; c < k; ++c) x[static_cast<size_t>(t / 2) * k + c] = 0.0f;  // an all-zero token
      auto* dx = static_cast<float*>(dalloc(x.size() * 4));
      cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
      auto* xq = static_cast<uint8_t*>(dalloc(static_cast<size_t>(t) * kb * cuda::kActBytes));
      auto* meta = static_cast<float4*>(dalloc(static_cast<size_t>(t) * kb * sizeof(float4)));
      cuda::quantize_act(dx, xq, meta, t, k, nullptr);
      size_t partial_floats = 0, counter_count = 0;
      cuda::matvec_tiled_scratch(jobs, t, k, sms, &partial_floats, &counter_count);
      auto* partial = static_cast<float*>(dalloc(partial_floats * 4));
      auto* counters = static_cast<int*>(dalloc(counter_count * 4));
      cudaMemset(counters, 0, counter_count * 4);
      const std::string what = "G " + std::to_string(cs.groups) + " k " + std::to_string(k) + " t " +
                               std::to_string(t) + " jobs " + std::to_string(jobs.count);
      const int ring = cuda::matvec_ws_ring(cs.groups, t, k);
      EXPECT_GE(ring, 2) << what << ": the ws kernel does not fit, the launch would run bulk";
      ws_launches += ring >= 2;
      const cuda::MatvecKernel kernels[] = {cuda::MatvecKernel::legacy, cuda::MatvecKernel::bulk,
                                            cuda::MatvecKernel::ws};
      std::vector<std::vector<float>> ys[3];
      for (int v = 0; v < 3; ++v) {
        cuda::TiledJobs run = jobs;
        for (int j = 0; j < jobs.count; ++j) {
          const size_t bytes = static_cast<size_t>(t) * jobs.job[j].n * 4;
          run.job[j].y = static_cast<float*>(dalloc(bytes));
          cudaMemset(run.job[j].y, 0xff, bytes);  // NaN: unwritten
        }
        cuda::matvec_tiled(run, cs.groups, xq, meta, t, k, sms, partial, counters, nullptr, cs.evict_first,
                           kernels[v]);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        for (int j = 0; j < jobs.count; ++j) {
          ys[v].emplace_back(static_cast<size_t>(t) * jobs.job[j].n);
          cudaMemcpy(ys[v].back().data(), run.job[j].y, ys[v].back().size() * 4, cudaMemcpyDeviceToHost);
        }
      }
      for (int v = 1; v < 3; ++v)
        for (int j = 0; j < jobs.count; ++j)
          for (size_t i = 0; i < ys[0][j].size(); ++i) {
            const float a = ys[0][j][i], b = ys[v][j][i];
            ASSERT_FALSE(std::isnan(a)) << what << " job " << j << " i " << i;
            ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << what << (v == 1 ? " bulk" : " ws") << " job " << j
                                                 << " i " << i << ": " << a << " (legacy) vs " << b;
          }
      std::vector<int> left(counter_count);
      cudaMemcpy(left.data(), counters, left.size() * 4, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < left.size(); ++i) ASSERT_EQ(left[i], 0) << what << " counter " << i;
    }
  }
  EXPECT_GT(ws_launches, 0);
}

// The first-rank fix-up (rank 0 of a split row group waits for the others' slots and adds them
// to its own sums) and the flag-free one (the same, rank 0 polling the slot words themselves
// for the empty word 0xFFFFFFFF) must give the same floats as the last-arriver one: the same
// sums in the same order, 0 + rank 0 + rank 1 + ..., so bit for bit, for both kernels that have
// them, against legacy (which only has the last-arriver one). Cases: G = 1 and 2; groups shared
// by up to 136 warps (k = 17408, one unit per warp) and by a few; several jobs, odd row counts;
// t = 1..4 (one token group: first / slots is taken) and t = 5, 8 (two token groups) and a plan
// for 4x the SMs (more blocks than are resident at once): there the launch must fall back to
// last (rank 0 would spin on blocks that cannot start). With specials, weight scales of +-Inf
// and NaN (two payloads) and activations of +-Inf and NaN in one token: partial sums that are
// really NaN must neither hang rank 0 nor be taken for empty words (and the outputs still
// match legacy bit for bit). Each launch runs twice in a row; after every launch the counters
// must be zero and the flag-free scratch all empty words again (it starts so, as a memset of
// 0xFF leaves it; the last-arriver fallback must not touch it).
TEST(CudaMatvecKernels, FixupsMatchBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int sms = sm_count();
  struct Case {
    int groups;
    std::vector<int64_t> ns;
    int64_t k;
    std::vector<int> ts;
    int plan_sms;  // the SM count the plan is made for
    bool specials = false;
  };
  const Case cases[] = {
      {1, {64}, 17408, {1, 2, 3, 4}, sms},                // one group, 136 warps
      {2, {600}, 17408, {1, 4}, sms},                     // 10 groups of 20-ish warps
      {1, {77, 300, 33, 1000}, 5120, {1, 2, 3, 4}, sms},  // 4 jobs, odd n
      {2, {67, 130}, 6144, {1, 2, 3, 4}, sms},            // groups of 20-ish warps
      {1, {1000}, 5120, {5, 8}, sms},                     // two token groups: last
      {2, {130, 61}, 6144, {5}, sms},                     // two token groups: last
      {1, {10240}, 5120, {1, 3}, 4 * sms},                // ~3x more blocks than resident: last
      {2, {10000}, 6144, {2}, 4 * sms},                   // the same, G = 2
      {1, {64, 200}, 17408, {1, 3}, sms, true},           // Inf / NaN, groups of 136 warps
      {2, {67, 130, 1000}, 6144, {1, 2, 4}, sms, true},   // Inf / NaN, G = 2
      {1, {1000}, 5120, {5}, sms, true},                  // Inf / NaN, fallback
  };
  for (const Case& cs : cases) {
    const int64_t k = cs.k, kb = k / cuda::kBlockK;
    DevMem mem;
    auto dalloc = [&](size_t bytes) { return mem.alloc(bytes); };
    std::mt19937 rng(static_cast<uint32_t>(3 * k + cs.groups));
    cuda::TiledJobs jobs;
    for (const int64_t n : cs.ns) {
      const auto raw = random_rows(cs.groups, n, k, rng, cs.specials);
      auto* draw = static_cast<uint8_t*>(dalloc(raw.size()));
      cudaMemcpy(draw, raw.data(), raw.size(), cudaMemcpyHostToDevice);
      jobs.job[jobs.count].w = tiled_weight(mem, draw, cs.groups, n, k);
      jobs.job[jobs.count].n = static_cast<int>(n);
      ++jobs.count;
    }
    for (const int t : cs.ts) {
      auto x = randn(static_cast<size_t>(t) * k, 23 + t, 3.0f);
      if (cs.specials && t > 1) {  // the last token: a few Inf / NaN activations (its blocks' scales)
        const float sp[3] = {INFINITY, -INFINITY, NAN};
        for (int i = 0; i < 3; ++i) x[static_cast<size_t>(t - 1) * k + (i * 1009 + 7) % k] = sp[i];
      }
      auto* dx = static_cast<float*>(dalloc(x.size() * 4));
      cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
      auto* xq = static_cast<uint8_t*>(dalloc(static_cast<size_t>(t) * kb * cuda::kActBytes));
      auto* meta = static_cast<float4*>(dalloc(static_cast<size_t>(t) * kb * sizeof(float4)));
      cuda::quantize_act(dx, xq, meta, t, k, nullptr);
      size_t partial_floats = 0, counter_count = 0;
      cuda::matvec_tiled_scratch(jobs, t, k, cs.plan_sms, &partial_floats, &counter_count);
      auto* partial = static_cast<float*>(dalloc(partial_floats * 4));
      auto* counters = static_cast<int*>(dalloc(counter_count * 4));
      auto* slots = static_cast<float*>(dalloc(partial_floats * 4));
      cudaMemset(counters, 0, counter_count * 4);
      cudaMemset(slots, 0xff, partial_floats * 4);  // every word empty (0xFFFFFFFF)
      const std::string what = "G " + std::to_string(cs.groups) + " k " + std::to_string(k) + " t " +
                               std::to_string(t) + " plan SMs " + std::to_string(cs.plan_sms) +
                               (cs.specials ? " Inf/NaN" : "");
      const bool one_wave = t <= 4 && cs.plan_sms == sms;  // the plan's blocks: 2 per SM
      struct Run {
        cuda::MatvecKernel kernel;
        cuda::MatvecFixup fixup;
        const char* name;
      };
      const Run runs[] = {{cuda::MatvecKernel::legacy, cuda::MatvecFixup::last, "legacy"},
                          {cuda::MatvecKernel::bulk, cuda::MatvecFixup::last, "bulk last"},
                          {cuda::MatvecKernel::bulk, cuda::MatvecFixup::first, "bulk first"},
                          {cuda::MatvecKernel::bulk, cuda::MatvecFixup::slots, "bulk slots"},
                          {cuda::MatvecKernel::ws, cuda::MatvecFixup::last, "ws last"},
                          {cuda::MatvecKernel::ws, cuda::MatvecFixup::first, "ws first"},
                          {cuda::MatvecKernel::ws, cuda::MatvecFixup::slots, "ws slots"}};
      std::vector<std::vector<float>> ref;  // legacy's y per job
      for (const Run& run : runs) {
        cuda::TiledJobs out = jobs;
        for (int j = 0; j < jobs.count; ++j) {
          const size_t bytes = static_cast<size_t>(t) * jobs.job[j].n * 4;
          out.job[j].y = static_cast<float*>(dalloc(bytes));
        }
        for (int rep = 0; rep < 2; ++rep) {
          for (int j = 0; j < jobs.count; ++j)
            cudaMemset(out.job[j].y, 0xff, static_cast<size_t>(t) * jobs.job[j].n * 4);  // unwritten
          const cuda::MatvecFixup used =
              cuda::matvec_tiled(out, cs.groups, xq, meta, t, k, cs.plan_sms, partial, counters, nullptr,
                                 true, run.kernel, run.fixup, slots);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what << " " << run.name;
          const cuda::MatvecFixup want = one_wave ? run.fixup : cuda::MatvecFixup::last;
          EXPECT_EQ(static_cast<int>(used), static_cast<int>(want)) << what << " " << run.name;
          std::vector<int> left(counter_count);
          cudaMemcpy(left.data(), counters, left.size() * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < left.size(); ++i)
            ASSERT_EQ(left[i], 0) << what << " " << run.name << " counter " << i;
          std::vector<uint32_t> words(partial_floats);
          cudaMemcpy(words.data(), slots, words.size() * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < words.size(); ++i)
            ASSERT_EQ(words[i], 0xFFFFFFFFu) << what << " " << run.name << " slot word " << i << " not empty";
          for (int j = 0; j < jobs.count; ++j) {
            std::vector<float> y(static_cast<size_t>(t) * jobs.job[j].n);
            cudaMemcpy(y.data(), out.job[j].y, y.size() * 4, cudaMemcpyDeviceToHost);
            if (ref.size() < static_cast<size_t>(jobs.count)) {
              size_t nans = 0;
              for (size_t i = 0; i < y.size(); ++i) {
                uint32_t bits = 0;
                std::memcpy(&bits, &y[i], 4);
                ASSERT_NE(bits, 0xFFFFFFFFu) << what << " legacy i " << i << " unwritten";
                nans += std::isnan(y[i]);
              }
              // Specials: some sums NaN (not all: the test would compare little); else none.
              if (cs.specials) {
                EXPECT_GT(nans, 0u) << what << " job " << j;
                EXPECT_LT(nans, y.size()) << what << " job " << j;
              } else {
                EXPECT_EQ(nans, 0u) << what << " job " << j;
              }
              ref.push_back(std::move(y));
              continue;
            }
            for (size_t i = 0; i < y.size(); ++i)
              ASSERT_EQ(std::memcmp(&ref[j][i], &y[i], 4), 0)
                  << what << " " << run.name << " job " << j << " i " << i << ": " << ref[j][i]
                  << " (legacy) vs " << y[i];
          }
        }
      }
    }
  }
}

// The ws kernel's two consumer loops (BONSAI_CUDA_MV_LOOP, launch.h matvec_ws_loop: loop 1's
// decode keeps rows g + 8 at 4x and shifts the integer back, its ring and activation
// addresses are walked differently) must give the same floats bit for bit, whatever the fix-up:
// the 27B's matvec shapes (K x N, t = 1 as in decode and t = 4) and odd ones (several jobs, odd
// row counts, G = 2, one k-block, groups shared by 136 warps, two token groups, a plan for 4x
// the SMs: the last-arriver fallback), under the fix-ups first, last, slots and, with one job,
// defer (then the unsummed y and the slots in `partial` must match too). The comparison with
// the reference (legacy) is WsAndBulkMatchLegacyBitwise / FixupsMatchBitwise, run under either
// loop by the knob.
TEST(CudaMatvecKernels, WsLoopsMatchBitwise) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int sms = sm_count();
  struct Case {
    int groups;
    std::vector<int64_t> ns;
    int64_t k;
    std::vector<int> ts;
    int plan_sms;
  };
  const Case cases[] = {
      {1, {10240}, 5120, {1, 4}, sms},                 // a 27B shape
      {1, {6144}, 5120, {1}, sms},                     // a 27B shape
      {1, {12288}, 5120, {1}, sms},                    // a 27B shape
      {1, {1024}, 5120, {1, 4}, sms},                  // a 27B shape
      {1, {17408}, 5120, {1}, sms},                    // a 27B shape
      {1, {5120}, 6144, {1, 4}, sms},                  // a 27B shape
      {1, {5120}, 17408, {1}, sms},                    // a 27B shape
      {1, {77, 300, 33, 1000}, 5120, {1, 2, 3}, sms},  // 4 jobs, odd n
      {2, {130, 61, 1001}, 2048, {1, 2, 3, 4}, sms},   // G = 2
      {2, {67}, 6144, {1, 3}, sms},                    // one group over many warps, G = 2
      {1, {40000}, 128, {1, 4}, sms},                  // one k-block: whole groups per warp
      {1, {64}, 17408, {1, 2}, sms},                   // one group shared by 136 warps
      {1, {1000}, 5120, {5, 8}, sms},                  // two token groups: last
      {1, {10240}, 5120, {1}, 4 * sms},                // more blocks than resident: last
  };
  int compared = 0;
  for (const Case& cs : cases) {
    const int64_t k = cs.k, kb = k / cuda::kBlockK;
    DevMem mem;
    auto dalloc = [&](size_t bytes) { return mem.alloc(bytes); };
    std::mt19937 rng(static_cast<uint32_t>(5 * k + cs.groups));
    cuda::TiledJobs jobs;
    for (const int64_t n : cs.ns) {
      const auto raw = random_rows(cs.groups, n, k, rng);
      auto* draw = static_cast<uint8_t*>(dalloc(raw.size()));
      cudaMemcpy(draw, raw.data(), raw.size(), cudaMemcpyHostToDevice);
      jobs.job[jobs.count].w = tiled_weight(mem, draw, cs.groups, n, k);
      jobs.job[jobs.count].n = static_cast<int>(n);
      ++jobs.count;
    }
    for (const int t : cs.ts) {
      auto x = randn(static_cast<size_t>(t) * k, 31 + t, 3.0f);
      auto* dx = static_cast<float*>(dalloc(x.size() * 4));
      cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
      auto* xq = static_cast<uint8_t*>(dalloc(static_cast<size_t>(t) * kb * cuda::kActBytes));
      auto* meta = static_cast<float4*>(dalloc(static_cast<size_t>(t) * kb * sizeof(float4)));
      cuda::quantize_act(dx, xq, meta, t, k, nullptr);
      size_t partial_floats = 0, counter_count = 0;
      cuda::matvec_tiled_scratch(jobs, t, k, cs.plan_sms, &partial_floats, &counter_count);
      auto* partial = static_cast<float*>(dalloc(partial_floats * 4));
      auto* counters = static_cast<int*>(dalloc(counter_count * 4));
      auto* slots = static_cast<float*>(dalloc(partial_floats * 4));
      cudaMemset(counters, 0, counter_count * 4);
      cudaMemset(slots, 0xff, partial_floats * 4);  // every word empty (0xFFFFFFFF)
      const std::string what = "G " + std::to_string(cs.groups) + " k " + std::to_string(k) + " n " +
                               std::to_string(cs.ns[0]) + " t " + std::to_string(t) + " jobs " +
                               std::to_string(jobs.count) + " plan SMs " + std::to_string(cs.plan_sms);
      EXPECT_GE(cuda::matvec_ws_ring(cs.groups, t, k), 2) << what << ": the launch would run bulk";
      std::vector<cuda::MatvecFixup> fixups = {cuda::MatvecFixup::first, cuda::MatvecFixup::last,
                                               cuda::MatvecFixup::slots};
      if (jobs.count == 1) fixups.push_back(cuda::MatvecFixup::defer);
      for (const cuda::MatvecFixup fixup : fixups) {
        std::vector<std::vector<float>> ys[2];
        std::vector<float> parts[2];
        cuda::MatvecFixup used[2] = {};
        for (int loop = 0; loop < 2; ++loop) {
          cuda::TiledJobs out = jobs;
          for (int j = 0; j < jobs.count; ++j) {
            const size_t bytes = static_cast<size_t>(t) * jobs.job[j].n * 4;
            out.job[j].y = static_cast<float*>(dalloc(bytes));
            cudaMemset(out.job[j].y, 0xff, bytes);  // unwritten
          }
          cudaMemset(partial, 0, partial_floats * 4);
          cuda::SplitSums split;
          used[loop] = cuda::matvec_tiled(out, cs.groups, xq, meta, t, k, cs.plan_sms, partial, counters,
                                          nullptr, true, cuda::MatvecKernel::ws, fixup, slots, &split, loop);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what << " loop " << loop;
          for (int j = 0; j < jobs.count; ++j) {
            ys[loop].emplace_back(static_cast<size_t>(t) * jobs.job[j].n);
            cudaMemcpy(ys[loop].back().data(), out.job[j].y, ys[loop].back().size() * 4,
                       cudaMemcpyDeviceToHost);
          }
          parts[loop].resize(partial_floats);
          cudaMemcpy(parts[loop].data(), partial, partial_floats * 4, cudaMemcpyDeviceToHost);
          std::vector<int> left(counter_count);
          cudaMemcpy(left.data(), counters, left.size() * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < left.size(); ++i)
            ASSERT_EQ(left[i], 0) << what << " loop " << loop << " counter " << i;
        }
        const std::string f = what + " fix-up " + std::to_string(static_cast<int>(fixup));
        ASSERT_EQ(static_cast<int>(used[0]), static_cast<int>(used[1])) << f;
        const bool deferred = used[0] == cuda::MatvecFixup::defer;
        for (int j = 0; j < jobs.count; ++j)
          for (size_t i = 0; i < ys[0][j].size(); ++i) {
            uint32_t bits = 0;
            std::memcpy(&bits, &ys[1][j][i], 4);
            if (!deferred) {
              ASSERT_NE(bits, 0xFFFFFFFFu) << f << " job " << j << " i " << i << " unwritten";
            }
            ASSERT_EQ(std::memcmp(&ys[0][j][i], &ys[1][j][i], 4), 0)
                << f << " job " << j << " i " << i << ": " << ys[0][j][i] << " (loop 0) vs " << ys[1][j][i];
          }
        if (deferred) {
          ASSERT_EQ(std::memcmp(parts[0].data(), parts[1].data(), partial_floats * 4), 0)
              << f << ": slots differ";
        }
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 0);
}

// The flag-free fix-up's empty word 0xFFFFFFFF (a NaN) must be no result of the arithmetic a
// slot's sum comes from: FADD, FMUL, FFMA (round to nearest), here for every triple of NaNs
// (quiet and signalling, both signs, the empty word itself, the canonical 0x7FFFFFFF), +-Inf,
// +-0, +-1, +-FLT_MAX and denormals. Prints the NaN bit patterns seen (documented: only the
// canonical 0x7FFFFFFF on sm_90).
TEST(CudaMatvecKernels, FpOpsNeverReturnTheEmptySlotWord) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const uint32_t vals[] = {0xFFFFFFFFu, 0x7FFFFFFFu, 0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u,
                           0x7FBFFFFFu, 0x7F800000u, 0xFF800000u, 0x00000000u, 0x80000000u, 0x3F800000u,
                           0xBF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x00000001u, 0x807FFFFFu};
  constexpr int nv = sizeof(vals) / sizeof(vals[0]);
  const int n = nv * nv * nv;
  std::vector<uint32_t> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = vals[i % nv];
    b[i] = vals[i / nv % nv];
    c[i] = vals[i / (nv * nv)];
  }
  DevMem mem;
  auto* da = static_cast<float*>(mem.alloc(n * 4));
  auto* db = static_cast<float*>(mem.alloc(n * 4));
  auto* dc = static_cast<float*>(mem.alloc(n * 4));
  auto* dout = static_cast<float*>(mem.alloc(3 * n * 4));
  cudaMemcpy(da, a.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dc, c.data(), n * 4, cudaMemcpyHostToDevice);
  cuda::fp_ops_probe(da, db, dc, dout, n, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint32_t> out(3 * n);
  cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost);
  std::vector<uint32_t> nan_bits;
  size_t nans = 0;
  for (int i = 0; i < 3 * n; ++i) {
    const char* op[3] = {"add", "mul", "fma"};
    ASSERT_NE(out[i], 0xFFFFFFFFu) << op[i % 3] << "(" << std::hex << a[i / 3] << ", " << b[i / 3] << ", "
                                   << c[i / 3] << ") is the empty slot word";
    if ((out[i] & 0x7F800000u) == 0x7F800000u && (out[i] & 0x007FFFFFu) != 0) {
      ++nans;
      if (std::find(nan_bits.begin(), nan_bits.end(), out[i]) == nan_bits.end()) nan_bits.push_back(out[i]);
    }
  }
  EXPECT_GT(nans, 0u);
  std::printf("FpOps: %zu NaN results of %d; their bit patterns:", nans, 3 * n);
  for (const uint32_t w : nan_bits) std::printf(" 0x%08X", w);
  std::printf("\n");
}

// One shape, BONSAI_CUDA_BENCH_K x BONSAI_CUDA_BENCH_N (default 5120 x 10240, PQ2_0), each
// kernel in turn on the same weights: one matvec (t = 1) per weight copy, enough copies
// (>= 768 MB) to defeat the L2, recorded as a CUDA graph (PDL between the launches, as in a
// decode step) and replayed 10 times. For A/B within one process, and for profiling one
// kernel: ncu -k regex:matvec_ws ... --gtest_filter=CudaBench.MatvecKernelsOneShape.
TEST(CudaBench, MatvecKernelsOneShape) {
  if (!std::getenv("BONSAI_CUDA_BENCH"))
    GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1 to run the matvec benchmark";
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  auto env = [](const char* name, int64_t fallback) {
    const char* e = std::getenv(name);
    return e && std::atoll(e) > 0 ? std::atoll(e) : fallback;
  };
  const int64_t k = env("BONSAI_CUDA_BENCH_K", 5120) / 128 * 128, n = env("BONSAI_CUDA_BENCH_N", 10240);
  const int sms = sm_count();
  DevMem mem;
  std::mt19937 rng(1);
  const auto raw = random_rows(1, n, k, rng);
  auto* draw = static_cast<uint8_t*>(mem.alloc(raw.size()));
  cudaMemcpy(draw, raw.data(), raw.size(), cudaMemcpyHostToDevice);
  const size_t bytes = static_cast<size_t>(cuda::tiled_bytes(n, k, 1));
  const int copies = static_cast<int>(std::max<size_t>(2, (size_t{768} << 20) / bytes));
  std::vector<cuda::TiledJobs> jobs(copies);
  auto* y = static_cast<float*>(mem.alloc(static_cast<size_t>(n) * 4));
  for (cuda::TiledJobs& j : jobs) {
    j.job[0] = {tiled_weight(mem, draw, 1, n, k), y, static_cast<int>(n)};
    j.count = 1;
  }
  const auto x = randn(static_cast<size_t>(k), 8);
  auto* dx = static_cast<float*>(mem.alloc(x.size() * 4));
  cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
  auto* xq = static_cast<uint8_t*>(mem.alloc(static_cast<size_t>(k / 128) * cuda::kActBytes));
  auto* meta = static_cast<float4*>(mem.alloc(static_cast<size_t>(k / 128) * sizeof(float4)));
  cuda::quantize_act(dx, xq, meta, 1, k, nullptr);
  size_t partial_floats = 0, counter_count = 0;
  cuda::matvec_tiled_scratch(jobs[0], 1, k, sms, &partial_floats, &counter_count);
  auto* partial = static_cast<float*>(mem.alloc(partial_floats * 4));
  auto* counters = static_cast<int*>(mem.alloc(counter_count * 4));
  cudaMemset(counters, 0, counter_count * 4);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  std::printf("| kernel | K | N | MB | us | GB/s |\n|---|---|---|---|---|---|\n");
  struct Kernel {
    const char* name;
    cuda::MatvecKernel kernel;
    int ws_loop;  // BONSAI_CUDA_MV_LOOP
  };
  const Kernel kernels[] = {{"legacy", cuda::MatvecKernel::legacy, 1},
                            {"bulk", cuda::MatvecKernel::bulk, 1},
                            {"ws loop 0", cuda::MatvecKernel::ws, 0},
                            {"ws loop 1", cuda::MatvecKernel::ws, 1}};
  for (const auto& [name, kernel, ws_loop] : kernels) {
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    for (const cuda::TiledJobs& j : jobs)
      cuda::matvec_tiled(j, 1, xq, meta, 1, k, sms, partial, counters, s, true, kernel, cuda::matvec_fixup(),
                         nullptr, nullptr, ws_loop);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaGraphLaunch(exec, s);  // warm-up
    cudaEventRecord(e0, s);
    constexpr int kReps = 10;
    for (int r = 0; r < kReps; ++r) cudaGraphLaunch(exec, s);
    cudaEventRecord(e1, s);
    ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    const double per = ms * 1e-3 / kReps / copies;
    std::printf("| %s | %lld | %lld | %.1f | %.2f | %.0f |\n", name, static_cast<long long>(k),
                static_cast<long long>(n), bytes / 1e6, per * 1e6, bytes / per / 1e9);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
  }
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace bonsai
#else
TEST(CudaMatvecKernels, WsAndBulkMatchLegacyBitwise) {
  GTEST_SKIP() << "built without CUDA (BONSAI_CUDA=OFF)";
}
#endif  // BONSAI_HAVE_CUDA
