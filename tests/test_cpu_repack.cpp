// The CPU backend's load-time PTQ1_0 → PQ2_0 repack (kernels/cpu/repack.h):
// after prepare() a PTQ1_0 weight is multiplied from the PQ2_0 copy, and the
// result must equal what the reference backend computes from the file bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/repack.h"
#include "kernels/ref/ref_backend.h"
#include "runtime/cpu_features.h"

#include "test_util.h"

namespace bonsai {
namespace {

using testing_util::randn;

// A random PTQ1_0 matrix of n rows × k inputs (codes 0..2, varied scales).
std::vector<uint8_t> random_ptq1(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(row_bytes(DType::PTQ1_0, k) * n), codes(k);
  std::vector<float> scales(k / 128);
  for (int64_t r = 0; r < n; ++r) {
    for (auto& c : codes) c = static_cast<uint8_t>(rng() % 3);
    for (auto& s : scales) s = 0.01f + 0.001f * static_cast<float>(rng() % 100);
    encode_ternary_row(DType::PTQ1_0, codes.data(), scales.data(),
                       bytes.data() + r * row_bytes(DType::PTQ1_0, k), k);
  }
  return bytes;
}

TEST(CpuRepack, Ptq1PreparedMatchesReference) {
  const int64_t k = 640, n = 37;  // odd rows: partial row groups and chunks
  const auto bytes = random_ptq1(n, k, 11);
  Weight w;
  w.name = "blk.0.ffn_up.weight";
  w.type = DType::PTQ1_0;
  w.k = k;
  w.n = n;
  w.data = bytes.data();
  w.nbytes = bytes.size();
  const int t = 2;
  const auto x = randn(t * k, 12);
  RefBackend ref_be;
  std::vector<float> want(t * n);
  ref_be.matmul(w, x.data(), want.data(), t);
  for (Isa isa : {Isa::Avx2, Isa::Avx512})
    for (int threads : {1, 2}) {
      if (!isa_supported(isa)) continue;
      CpuBackend be(threads, isa, cpu::Precision::Faithful);
      Weight pw = w;
      be.prepare(pw);
      ASSERT_NE(pw.prepared, nullptr) << "PTQ1_0 is repacked by default";
      EXPECT_EQ(pw.data, bytes.data()) << "the file bytes stay in place";
      // Decode-shaped calls (t = 1), as the prefill GEMM may take t > 1 elsewhere.
      std::vector<float> got(t * n);
      for (int i = 0; i < t; ++i) be.matmul(pw, x.data() + i * k, got.data() + i * n, 1);
      // Faithful activations (kernels/cpu/matvec.h): per-element error ≤ amax_b/65278,
      // so |Δy| ≤ Σ_b amax_b/65278 · Σ_{j∈b} |w_j|, plus float rounding of the
      // per-block sums (≤ 1e-6 of Σ|w_j·x_j| for these k).
      for (int i = 0; i < t; ++i)
        for (int64_t r = 0; r < n; ++r) {
          std::vector<float> row(k);
          dequantize_row(DType::PTQ1_0, bytes.data() + r * row_bytes(DType::PTQ1_0, k), row.data(), k);
          double bound = 0, mag = 0;
          for (int64_t b0 = 0; b0 < k; b0 += 128) {
            double amax = 0, wsum = 0;
            for (int64_t j = b0; j < b0 + 128; ++j) {
              amax = std::max(amax, std::fabs(static_cast<double>(x[i * k + j])));
              wsum += std::fabs(row[j]);
              mag += std::fabs(static_cast<double>(row[j]) * x[i * k + j]);
            }
            bound += amax / 65278.0 * wsum;
          }
          EXPECT_NEAR(got[i * n + r], want[i * n + r], bound + 1e-6 * mag + 1e-30)
              << isa_name(isa) << " t" << threads << " row " << r;
        }
      be.unprepare(pw);
      EXPECT_EQ(pw.prepared, nullptr);
    }
}

// make_repack per policy: the transcode equals the reference transcode row by
// row, the huge-page copy equals the file bytes, and nothing else is repacked.
TEST(CpuRepack, PolicyDecidesWhatIsRepacked) {
  const int64_t k = 384, n = 21;
  const auto ptq1 = random_ptq1(n, k, 13);
  std::vector<uint8_t> pq2(row_bytes(DType::PQ2_0, k) * n);
  for (int64_t r = 0; r < n; ++r)
    transcode_ptq1_to_pq2(ptq1.data() + r * row_bytes(DType::PTQ1_0, k),
                          pq2.data() + r * row_bytes(DType::PQ2_0, k), k);
  Weight wt;
  wt.type = DType::PTQ1_0, wt.k = k, wt.n = n, wt.data = ptq1.data(), wt.nbytes = ptq1.size();
  Weight wq = wt;
  wq.type = DType::PQ2_0, wq.data = pq2.data(), wq.nbytes = pq2.size();
  const std::vector<float> f(k * n, 1.0f);
  Weight wf = wt;
  wf.type = DType::F32, wf.data = reinterpret_cast<const uint8_t*>(f.data()), wf.nbytes = f.size() * 4;
  ThreadPool pool(2);
  for (bool transcode : {false, true})
    for (bool copy : {false, true}) {
      const cpu::RepackPolicy pol{transcode, copy};
      const auto rt = cpu::make_repack(wt, pol, pool, select_isa());
      ASSERT_EQ(rt != nullptr, transcode);
      if (rt) {
        EXPECT_EQ(rt->type, DType::PQ2_0);
        ASSERT_EQ(rt->bytes.size(), pq2.size());
        EXPECT_EQ(std::memcmp(rt->bytes.data(), pq2.data(), pq2.size()), 0);
      }
      const auto rq = cpu::make_repack(wq, pol, pool, select_isa());
      ASSERT_EQ(rq != nullptr, copy);
      if (rq) {
        EXPECT_EQ(rq->type, DType::PQ2_0);
        ASSERT_EQ(rq->bytes.size(), pq2.size());
        EXPECT_EQ(std::memcmp(rq->bytes.data(), pq2.data(), pq2.size()), 0);
      }
      EXPECT_EQ(cpu::make_repack(wf, pol, pool, select_isa()), nullptr);
    }
}

// Backend::alloc's contract (zero-filled, owned, released by pointer) holds
// for both the small (arena) and the large (huge-page mapping) blocks.
TEST(CpuRepack, AllocIsZeroedAtEverySize) {
  CpuBackend be(1, select_isa(), cpu::Precision::Faithful);
  for (size_t n : {size_t{1}, size_t{1000}, size_t{1} << 18, (size_t{3} << 20) + 5}) {
    float* p = be.alloc(n);
    ASSERT_NE(p, nullptr);
    for (size_t i = 0; i < n; i += 997) ASSERT_EQ(p[i], 0.0f) << n;
    ASSERT_EQ(p[n - 1], 0.0f);
    p[0] = p[n - 1] = 1.0f;  // writable
    be.release(p);
  }
}

// HugeBuffer starts on a 2 MiB boundary (so a 3 MiB GDN state can hold a
// whole huge page) and every byte of it is usable.
TEST(CpuRepack, HugeBufferStartsOnAHugePageBoundary) {
  for (size_t n : {size_t{100}, (size_t{3} << 20) + 5, size_t{4} << 20}) {
    cpu::HugeBuffer b(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (size_t{2} << 20), 0u) << n;
    EXPECT_EQ(b.size(), n);
    b.data()[0] = 1;
    b.data()[n - 1] = 2;
    EXPECT_EQ(b.data()[n / 2], 0);
  }
}

}  // namespace
}  // namespace bonsai
