// The CPU backend's load-time repacks (kernels/cpu/repack.h): PTQ1_0 → PQ2_0,
// the block-lanes layout of the AVX-512 kernels, the huge-page copy. After
// prepare() a weight is multiplied from its repack, and the result must equal
// what the reference backend computes from the file bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bonsai/error.h"
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

// A random PQ2_0 / Q2_0 (g128 or g64) matrix (codes 0..3, varied scales, some zero).
std::vector<uint8_t> random_pq2(DType t, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(row_bytes(t, k) * n), codes(k);
  std::vector<float> scales(k / dtype_info(t).block_size);
  for (int64_t r = 0; r < n; ++r) {
    for (auto& c : codes) c = static_cast<uint8_t>(rng() % 4);
    for (auto& s : scales) s = rng() % 9 == 0 ? 0.0f : 0.01f + 0.001f * static_cast<float>(rng() % 100);
    encode_ternary_row(t, codes.data(), scales.data(), bytes.data() + r * row_bytes(t, k), k);
  }
  return bytes;
}

// End to end through CpuBackend::prepare with the default policy: PTQ1_0 is
// transcoded (AVX2: to PQ2_0 rows; AVX-512: on into the block-stream layout),
// PQ2_0 / Q2_0 g128 are re-laid into block stream on AVX-512 and read in place
// on AVX2; decode-shaped calls (matvec) and a batch (GEMM) both equal what the
// reference backend computes from the file bytes, with 1 and 2 threads.
TEST(CpuRepack, PreparedWeightsMatchReference) {
  const int64_t k = 17 * 128, n = 37;  // a full lanes group + a tail of 1; odd rows: partial row groups
  for (DType type : {DType::PTQ1_0, DType::PQ2_0, DType::Q2_0_G128}) {
    const auto bytes = type == DType::PTQ1_0 ? random_ptq1(n, k, 11) : random_pq2(type, n, k, 12);
    Weight w;
    w.name = "blk.0.ffn_up.weight";
    w.type = type;
    w.k = k;
    w.n = n;
    w.data = bytes.data();
    w.nbytes = bytes.size();
    const int t = 3;
    const auto x = randn(t * k, 12);
    RefBackend ref_be;
    std::vector<float> want(t * n);
    ref_be.matmul(w, x.data(), want.data(), t);
    std::vector<float> row(k);
    for (Isa isa : {Isa::Avx2, Isa::Avx512})
      for (int threads : {1, 2}) {
        if (!isa_supported(isa)) continue;
        CpuBackend be(threads, isa, cpu::Precision::Faithful);
        Weight pw = w;
        be.prepare(pw);
        const bool repacked = type == DType::PTQ1_0 || isa == Isa::Avx512;
        ASSERT_EQ(pw.prepared != nullptr, repacked) << dtype_name(type) << " " << isa_name(isa);
        if (pw.prepared) {
          EXPECT_EQ(static_cast<cpu::Repack*>(pw.prepared)->layout,
                    isa == Isa::Avx512 ? cpu::WeightLayout::Stream16 : cpu::WeightLayout::File);
        }
        EXPECT_EQ(pw.data, bytes.data()) << "the file bytes stay in place";
        std::vector<float> got(t * n), got_batch(t * n);
        for (int i = 0; i < t; ++i) be.matmul(pw, x.data() + i * k, got.data() + i * n, 1);
        be.matmul(pw, x.data(), got_batch.data(), t);
        // Faithful activations (kernels/cpu/matvec.h): per-element error ≤ amax_b/65278,
        // so |Δy| ≤ Σ_b amax_b/65278 · Σ_{j∈b} |w_j|, plus float rounding of the
        // per-block sums (≤ (n_blocks + 4)·2·2⁻²⁴ ≈ 1.3e-6 of Σ|w_j·x_j| here; 2e-6 allowed).
        for (int i = 0; i < t; ++i)
          for (int64_t r = 0; r < n; ++r) {
            dequantize_row(type, bytes.data() + r * row_bytes(type, k), row.data(), k);
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
            const std::string what = std::string(dtype_name(type)) + " " + std::string(isa_name(isa)) + " t" +
                                     std::to_string(threads) + " token " + std::to_string(i) + " row " +
                                     std::to_string(r);
            EXPECT_NEAR(got[i * n + r], want[i * n + r], bound + 2e-6 * mag + 1e-30) << what << " matvec";
            EXPECT_NEAR(got_batch[i * n + r], want[i * n + r], bound + 2e-6 * mag + 1e-30) << what << " GEMM";
          }
        be.unprepare(pw);
        EXPECT_EQ(pw.prepared, nullptr);
      }
  }
}

// make_repack per policy and ISA: the transcode equals the reference transcode
// row by row, the block-lanes / block-stream repacks equal pack_lanes_rows /
// pack_stream_rows of the (transcoded) PQ2_0 bytes, the huge-page copy equals the file bytes, Q2_0 g64 and
// float weights are never re-laid (float matrices are copied when the ternary weights leave the file), and
// nothing else is repacked.
TEST(CpuRepack, PolicyDecidesWhatIsRepacked) {
  const int64_t k = 384, n = 21;
  const auto ptq1 = random_ptq1(n, k, 13);
  std::vector<uint8_t> pq2(row_bytes(DType::PQ2_0, k) * n);
  for (int64_t r = 0; r < n; ++r)
    transcode_ptq1_to_pq2(ptq1.data() + r * row_bytes(DType::PTQ1_0, k),
                          pq2.data() + r * row_bytes(DType::PQ2_0, k), k);
  std::vector<uint8_t> lanes(static_cast<size_t>(cpu::lanes_total_bytes(n, k)));
  cpu::pack_lanes_rows({DType::PQ2_0, pq2.data(), n, k}, lanes.data(), 0, n);
  std::vector<uint8_t> stream(static_cast<size_t>(cpu::stream_total_bytes(n, k)));
  cpu::pack_stream_rows({DType::PQ2_0, pq2.data(), n, k}, stream.data(), 0, n);
  const auto g64 = random_pq2(DType::Q2_0_G64, n, k, 14);
  Weight wt;
  wt.type = DType::PTQ1_0, wt.k = k, wt.n = n, wt.data = ptq1.data(), wt.nbytes = ptq1.size();
  Weight wq = wt;
  wq.type = DType::PQ2_0, wq.data = pq2.data(), wq.nbytes = pq2.size();
  Weight wg = wt;
  wg.type = DType::Q2_0_G64, wg.data = g64.data(), wg.nbytes = g64.size();
  const std::vector<float> f(k * n, 1.0f);
  Weight wf = wt;
  wf.type = DType::F32, wf.data = reinterpret_cast<const uint8_t*>(f.data()), wf.nbytes = f.size() * 4;
  ThreadPool pool(2);
  auto same = [](const cpu::Repack& r, const std::vector<uint8_t>& want) {
    return r.bytes.size() == want.size() && std::memcmp(r.bytes.data(), want.data(), want.size()) == 0;
  };
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if (!isa_supported(isa)) continue;
    for (bool transcode : {false, true})
      for (cpu::WeightsMode mode : {cpu::WeightsMode::Stream, cpu::WeightsMode::Lanes, cpu::WeightsMode::Map,
                                    cpu::WeightsMode::Copy}) {
        const cpu::RepackPolicy pol{transcode, mode};
        const bool to_stream = mode == cpu::WeightsMode::Stream && isa == Isa::Avx512;
        const bool to_lanes = (mode == cpu::WeightsMode::Lanes || to_stream) && isa == Isa::Avx512;
        const cpu::WeightLayout relaid = to_stream ? cpu::WeightLayout::Stream16 : cpu::WeightLayout::Lanes16;
        const std::vector<uint8_t>& relaid_bytes = to_stream ? stream : lanes;
        const std::string what = std::string(isa_name(isa)) + " transcode " + std::to_string(transcode) +
                                 " mode " + std::to_string(static_cast<int>(mode));
        const auto rt = cpu::make_repack(wt, pol, pool, isa);
        ASSERT_EQ(rt != nullptr, transcode) << what;
        if (rt) {
          EXPECT_EQ(rt->type, DType::PQ2_0) << what;
          EXPECT_EQ(rt->layout, to_lanes ? relaid : cpu::WeightLayout::File) << what;
          EXPECT_TRUE(same(*rt, to_lanes ? relaid_bytes : pq2)) << what;
        }
        const auto rq = cpu::make_repack(wq, pol, pool, isa);
        ASSERT_EQ(rq != nullptr, to_lanes || mode == cpu::WeightsMode::Copy) << what;
        if (rq) {
          EXPECT_EQ(rq->type, DType::PQ2_0) << what;
          EXPECT_EQ(rq->layout, to_lanes ? relaid : cpu::WeightLayout::File) << what;
          EXPECT_TRUE(same(*rq, to_lanes ? relaid_bytes : pq2)) << what;
        }
        const auto rg = cpu::make_repack(wg, pol, pool, isa);
        ASSERT_EQ(rg != nullptr, mode == cpu::WeightsMode::Copy) << what;
        if (rg) {
          EXPECT_EQ(rg->layout, cpu::WeightLayout::File) << what;
          EXPECT_TRUE(same(*rg, g64)) << what;
        }
        const auto rf = cpu::make_repack(wf, pol, pool, isa);
        ASSERT_EQ(rf != nullptr, to_lanes || mode == cpu::WeightsMode::Copy) << what << " (float matrix)";
        if (rf) {
          EXPECT_EQ(rf->type, DType::F32) << what;
          EXPECT_EQ(rf->layout, cpu::WeightLayout::File) << what;
          EXPECT_TRUE(rf->bytes.size() == f.size() * 4 &&
                      std::memcmp(rf->bytes.data(), f.data(), rf->bytes.size()) == 0)
              << what;
        }
        Weight wv = wf;  // a vector (norm gains, biases) is never copied
        wv.n = 1, wv.k = k * n;
        EXPECT_EQ(cpu::make_repack(wv, pol, pool, isa), nullptr) << what;
      }
  }
}

// BONSAI_CPU_WEIGHTS / BONSAI_CPU_PTQ1: defaults, every accepted value, and a
// UsageError naming the variable for anything else.
TEST(CpuRepack, PolicyFromEnvironment) {
  struct Restore {
    std::string w, p;
    bool hw, hp;
    Restore() {
      const char* a = std::getenv("BONSAI_CPU_WEIGHTS");
      const char* b = std::getenv("BONSAI_CPU_PTQ1");
      hw = a, hp = b, w = a ? a : "", p = b ? b : "";
    }
    ~Restore() {
      if (hw)
        setenv("BONSAI_CPU_WEIGHTS", w.c_str(), 1);
      else
        unsetenv("BONSAI_CPU_WEIGHTS");
      if (hp)
        setenv("BONSAI_CPU_PTQ1", p.c_str(), 1);
      else
        unsetenv("BONSAI_CPU_PTQ1");
    }
  } restore;
  unsetenv("BONSAI_CPU_WEIGHTS");
  unsetenv("BONSAI_CPU_PTQ1");
  auto p = cpu::repack_policy_from_env();
  EXPECT_EQ(p.weights, cpu::WeightsMode::Stream);
  EXPECT_TRUE(p.ptq1_transcode);
  setenv("BONSAI_CPU_WEIGHTS", "stream", 1);
  EXPECT_EQ(cpu::repack_policy_from_env().weights, cpu::WeightsMode::Stream);
  setenv("BONSAI_CPU_WEIGHTS", "map", 1);
  EXPECT_EQ(cpu::repack_policy_from_env().weights, cpu::WeightsMode::Map);
  setenv("BONSAI_CPU_WEIGHTS", "copy", 1);
  EXPECT_EQ(cpu::repack_policy_from_env().weights, cpu::WeightsMode::Copy);
  setenv("BONSAI_CPU_WEIGHTS", "lanes", 1);
  EXPECT_EQ(cpu::repack_policy_from_env().weights, cpu::WeightsMode::Lanes);
  setenv("BONSAI_CPU_PTQ1", "direct", 1);
  EXPECT_FALSE(cpu::repack_policy_from_env().ptq1_transcode);
  setenv("BONSAI_CPU_WEIGHTS", "Lanes", 1);
  try {
    (void)cpu::repack_policy_from_env();
    ADD_FAILURE() << "bad BONSAI_CPU_WEIGHTS accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("BONSAI_CPU_WEIGHTS"), std::string::npos) << e.what();
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
