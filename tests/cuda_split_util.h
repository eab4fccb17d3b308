// Shared pieces of the deferred split-sum and site tests (tests/test_backend_cuda_split.cpp,
// _ffn_split, _qkv_split, _gdn_fwht, _merge_fwht): device memory, random ternary weights in the tiled
// layout, hand-built weights (WeightPool), one matvec launch under a chosen kernel and fix-up, and a
// bitwise comparison.
// Include only where BONSAI_HAVE_CUDA is set, after <cuda_runtime_api.h> and <gtest/gtest.h>.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bonsai/formats.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tile_layout.h"
#include "test_util.h"

namespace bonsai::split_test {

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
inline std::vector<uint8_t> random_rows(DType type, int64_t n, int64_t k, uint32_t seed) {
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

// Hand-built weights of a site test: each one's host bytes live here as long as the pool (the
// backend reads them when it prepares the weight and may keep pointing at them), the Weight is
// prepared on `be` when made and unprepared with the pool (declare the pool after the backend). `what`
// names the weights in the backend's messages.
class WeightPool {
 public:
  WeightPool(CudaBackend& be, std::string what) : be_(be), what_(std::move(what)) {}
  WeightPool(const WeightPool&) = delete;
  WeightPool& operator=(const WeightPool&) = delete;
  ~WeightPool() {
    for (auto& w : weights_) be_.unprepare(*w);
  }
  // rows x cols of `type` from the given bytes (row_bytes(type, cols) per row)
  Weight& bytes(DType type, int64_t rows, int64_t cols, std::vector<uint8_t> raw) {
    raws_.push_back(std::move(raw));
    return make(type, rows, cols, raws_.back().data(), raws_.back().size());
  }
  Weight& f32(std::vector<float> v, int64_t rows, int64_t cols) {
    vecs_.push_back(std::move(v));
    return make(DType::F32, rows, cols, reinterpret_cast<const uint8_t*>(vecs_.back().data()),
                vecs_.back().size() * 4);
  }
  // random PQ2_0 rows (random_rows)
  Weight& ternary(int64_t rows, int64_t cols, uint32_t seed) {
    return bytes(DType::PQ2_0, rows, cols, random_rows(DType::PQ2_0, rows, cols, seed));
  }

 private:
  Weight& make(DType type, int64_t rows, int64_t cols, const uint8_t* data, size_t nbytes) {
    weights_.push_back(std::make_unique<Weight>());
    Weight& w = *weights_.back();
    w.name = what_;
    w.type = type;
    w.n = rows;
    w.k = cols;
    w.data = data;
    w.nbytes = nbytes;
    be_.prepare(w);
    return w;
  }
  CudaBackend& be_;
  std::string what_;
  std::vector<std::vector<uint8_t>> raws_;  // moved in: their heap buffers (w.data) do not move
  std::vector<std::vector<float>> vecs_;
  std::vector<std::unique_ptr<Weight>> weights_;
};

// One decode step's ops (`body`, at position pos0, t = 1 when `record`) run eagerly, then, with
// `record`, recorded as a graph (after the eager warm-up step where the backend records only from
// its second step) and replayed twice: each run from reset(), each checked by check(what + mode).
template <class Reset, class Body, class Check>
void run_step_modes(CudaBackend& be, int pos0, bool record, const std::string& what, Reset reset, Body body,
                    Check check) {
  const int32_t tok = 0;
  reset();
  body();
  check(what + " eager");
  if (!record) return;
  reset();
  if (!be.begin_capture(&tok, 1, pos0)) {  // the first step runs eagerly
    body();
    check(what + " warm-up step");
    reset();
    ASSERT_TRUE(be.begin_capture(&tok, 1, pos0)) << what;
  }
  body();
  be.end_capture();  // runs the recorded step once
  check(what + " recorded");
  for (int r = 0; r < 2; ++r) {
    reset();
    ASSERT_TRUE(be.replay_step(&tok, 1, pos0)) << what;
    check(what + " replay " + std::to_string(r));
  }
  be.drop_capture();
}

inline DType type_of(int groups) { return groups == 2 ? DType::Q2_0_G64 : DType::PQ2_0; }

inline uint8_t* tiled_weight(DevMem& mem, int groups, int64_t n, int64_t k, uint32_t seed) {
  const DType type = type_of(groups);
  const auto raw = random_rows(type, n, k, seed);
  auto* draw = mem.up(raw);
  const size_t tb = static_cast<size_t>(cuda::tiled_bytes(n, k, groups));
  auto* tiled = mem.alloc<uint8_t>(tb);
  cudaMemset(tiled, 0, tb);
  cuda::repack_tiled(draw, row_bytes(type, static_cast<uint64_t>(k)), n, k, groups, tiled, nullptr);
  return tiled;
}

inline std::string skip_reason() {
  std::string why;
  if (cuda_device_count(&why) == 0) return "no CUDA device: " + why;
  if (!cuda::matvec_kernel_available(cuda::MatvecKernel::ws))
    return "the ws and bulk kernels need sm_90 code (compute capability 9.x)";
  return "";
}

inline int sm_count() {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

// Most ranks sharing one row group under the plan of `plan_sms` SMs (the plan: launch.h's
// matvec_tiled, 2 blocks of 8 warps per SM, ceil(units / warps) units per warp).
inline int most_ranks(int64_t n, int64_t k, int plan_sms) {
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

  // njobs jobs of n rows each (the FFN's gate and up: 2), weights seeded seed, seed + 1000, ..
  Matvec(DevMem& m, int g, int64_t n, int64_t kk, int tt, int sms, uint32_t seed, int njobs = 1)
      : Matvec(m, g, std::vector<int64_t>(static_cast<size_t>(njobs), n), kk, tt, sms, seed) {}
  // one job per entry of ns (rows), e.g. the GDN's qkv and z, the attention's q, k and v
  Matvec(DevMem& m, int g, const std::vector<int64_t>& ns, int64_t kk, int tt, int sms, uint32_t seed)
      : mem(m), groups(g), k(kk), t(tt), plan_sms(sms) {
    const int njobs = static_cast<int>(ns.size());
    for (int j = 0; j < njobs; ++j) {
      jobs.job[j].w = tiled_weight(mem, g, ns[static_cast<size_t>(j)], k, seed + 1000 * j);
      jobs.job[j].n = static_cast<int>(ns[static_cast<size_t>(j)]);
    }
    jobs.count = njobs;
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
  float* new_y(int job = 0) {
    auto* y = mem.alloc<float>(static_cast<size_t>(t) * jobs.job[job].n * 4);
    cudaMemset(y, 0xff, static_cast<size_t>(t) * jobs.job[job].n * 4);  // unwritten words: NaN 0xFFFFFFFF
    return y;
  }
  // y: job 0's output, y1: job 1's, y2: job 2's (two or three jobs); split: one per job.
  cuda::MatvecFixup run(float* y, cuda::MatvecKernel kernel, cuda::MatvecFixup fixup, cuda::SplitSums* split,
                        float* y1 = nullptr, float* y2 = nullptr) {
    cuda::TiledJobs j = jobs;
    j.job[0].y = y;
    j.job[1].y = y1;
    j.job[2].y = y2;
    cudaMemset(partial, 0xff, partial_floats * 4);  // stale slots would show as NaN
    return cuda::matvec_tiled(j, groups, xq, meta, t, k, plan_sms, partial, counters, nullptr, true, kernel,
                              fixup, nullptr, split);
  }
};

inline void expect_same_bits(const void* a, const void* b, size_t bytes, const std::string& what) {
  const auto* pa = static_cast<const uint8_t*>(a);
  const auto* pb = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < bytes; i += 4)
    ASSERT_EQ(std::memcmp(pa + i, pb + i, std::min<size_t>(4, bytes - i)), 0) << what << " word " << i / 4;
}

}  // namespace bonsai::split_test
