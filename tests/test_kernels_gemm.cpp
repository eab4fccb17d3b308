// Ternary GEMM (kernels/cpu/gemm.h) vs (a) the f64 reference product of the
// dequantized weights and the float activations, and (b) the decode matvec run
// token by token, for every ternary format × precision, odd token counts
// (1, 3, 7, 64, 100: full 6-token tiles and every remainder), odd row counts
// (partial 64-row panels), codes 3, zero scales, all-zero activation blocks,
// 1 and 2 threads. The CPU backend's batched matmul is checked with the AVX2
// baseline forced too (it falls back to the matvec there).
//
// Tolerances (see the numerics notes in gemm.h and matvec.h):
//  (a) |y − y_ref| ≤ Σ_j |w_j|·s_b(j)/2 (activation rounding, exact bound; 1 %
//      slack for s_b rounded to float) + (n_blocks + 4)·2·2⁻²⁴·(Σ|w_j x_j| + that
//      bound) for the float steps (≤ 3 roundings per block, one add per block).
//  (b) The integers per block are the matvec's exactly; only the float order of
//      the per-block terms differs, so |y_gemm − y_matvec| ≤ 2·(n_blocks + 4)·2⁻²⁴
//      ·Σ_b |term_b| ≤ the float part of (a). A wrong step order, half or
//      correction would move y by ~|w||x| per element, far outside either.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/formats.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/matvec.h"
#include "runtime/cpu_features.h"
#include "runtime/thread_pool.h"
#include "test_util.h"

namespace bonsai::cpu {
namespace {

constexpr double kEps = 1.0 / (1 << 24);

struct Matrix {
  DType type;
  int64_t n, k;
  std::vector<uint8_t> bytes;
  WeightView view() const { return {type, bytes.data(), n, k}; }
};

// Codes 0..3 (0..2 for PTQ1_0), fp16 scales in [1e-3, 0.1], every 5th block zero.
Matrix random_ternary(DType t, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t g = dtype_info(t).block_size;
  Matrix m{t, n, k, std::vector<uint8_t>(row_bytes(t, k) * n)};
  std::uniform_int_distribution<int> code(0, t == DType::PTQ1_0 ? 2 : 3);
  std::uniform_real_distribution<float> scale(1e-3f, 0.1f);
  std::vector<uint8_t> codes(k);
  std::vector<float> scales(k / g);
  int64_t blk = 0;
  for (int64_t r = 0; r < n; ++r) {
    for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
    for (auto& s : scales) s = (++blk % 5 == 0) ? 0.0f : scale(rng);
    encode_ternary_row(t, codes.data(), scales.data(), m.bytes.data() + r * row_bytes(t, k), k);
  }
  return m;
}

// Gaussian activations; token 1 (when present) has an all-zero first block and
// one large outlier, so zero scales and wide-range blocks are covered.
std::vector<float> activations(int t, int64_t k, uint32_t seed) {
  std::vector<float> x = testing_util::randn(static_cast<size_t>(t * k), seed);
  if (t > 1) {
    std::fill(x.begin() + k, x.begin() + k + 128, 0.0f);
    x[static_cast<size_t>(k + 200)] = 300.0f;
  }
  return x;
}

// y_ref [t][n] and per-element tolerances, as described in the file comment.
// flt: the float-rounding part of tol alone.
void reference(const Matrix& m, const std::vector<float>& x, int t, Precision p, std::vector<double>& y,
               std::vector<double>& tol, std::vector<double>& flt) {
  const int64_t ab = m.type == DType::Q2_0_G64 ? 64 : 128;
  const double Q = p == Precision::Faithful ? 32639.0 : 127.0;
  const int64_t n_blocks = m.k / dtype_info(m.type).block_size;
  std::vector<float> w(static_cast<size_t>(m.n * m.k));
  for (int64_t r = 0; r < m.n; ++r)
    dequantize_row(m.type, m.bytes.data() + r * row_bytes(m.type, m.k), w.data() + r * m.k, m.k);
  y.assign(static_cast<size_t>(t * m.n), 0.0);
  tol.assign(y.size(), 0.0);
  flt.assign(y.size(), 0.0);
  std::vector<double> half_step(static_cast<size_t>(m.k / ab));
  for (int i = 0; i < t; ++i) {
    const float* xi = x.data() + i * m.k;
    for (size_t b = 0; b < half_step.size(); ++b) {
      double amax = 0;
      for (int64_t j = b * ab; j < static_cast<int64_t>(b + 1) * ab; ++j)
        amax = std::max(amax, std::fabs(double(xi[j])));
      half_step[b] = amax / Q / 2;
    }
    for (int64_t r = 0; r < m.n; ++r) {
      double acc = 0, mag = 0, bound = 0;
      for (int64_t j = 0; j < m.k; ++j) {
        const double wj = w[r * m.k + j];
        acc += wj * xi[j];
        mag += std::fabs(wj * xi[j]);
        bound += std::fabs(wj) * half_step[j / ab];
      }
      y[i * m.n + r] = acc;
      flt[i * m.n + r] = (n_blocks + 4) * 2 * kEps * (mag + bound);
      tol[i * m.n + r] = 1.01 * bound + flt[i * m.n + r];
    }
  }
}

using Param = std::tuple<DType, Precision, Isa>;
class GemmTest : public ::testing::TestWithParam<Param> {};

TEST_P(GemmTest, MatchesReferenceAndMatvec) {
  const auto [type, prec, isa] = GetParam();
  if (!gemm_supported(type, isa)) GTEST_SKIP() << "this CPU cannot run " << isa_name(isa) << " kernels";
  ThreadPool pool1(1), pool2(2);
  struct Shape {
    int64_t n, k;
  };
  // 77 rows: one full panel + 13; 130: two panels + 2; k = 640 spans two slabs (4 blocks + 1).
  for (const Shape sh : {Shape{77, 256}, Shape{130, 640}, Shape{16, 128}}) {
    const Matrix m = random_ternary(type, sh.n, sh.k, static_cast<uint32_t>(sh.n * 7 + sh.k));
    for (int t : {1, 3, 7, 64, 100}) {
      const std::vector<float> x = activations(t, sh.k, static_cast<uint32_t>(t * 31 + sh.n));
      std::vector<double> yr, tol, flt;
      reference(m, x, t, prec, yr, tol, flt);
      PreparedBatch batch;
      prepare_batch(x.data(), t, sh.k, gemm_block(type), prec, batch);
      std::vector<float> y1(static_cast<size_t>(t * sh.n), -1.0f), y2(y1.size(), -2.0f);
      gemm(m.view(), batch, y1.data(), pool1, isa);
      gemm(m.view(), batch, y2.data(), pool2, isa);
      PreparedAct act;
      std::vector<float> ym(static_cast<size_t>(sh.n));
      for (int i = 0; i < t; ++i) {
        prepare_act(x.data() + i * sh.k, sh.k, prec, act, layouts_for(type));
        matvec(m.view(), act, ym.data(), pool1, isa);
        for (int64_t r = 0; r < sh.n; ++r) {
          const size_t at = static_cast<size_t>(i * sh.n + r);
          const std::string what = std::string(dtype_name(type)) + " " + std::string(isa_name(isa)) +
                                   " n=" + std::to_string(sh.n) + " k=" + std::to_string(sh.k) +
                                   " t=" + std::to_string(t) + " token " + std::to_string(i) + " row " +
                                   std::to_string(r);
          ASSERT_NEAR(y1[at], yr[at], tol[at]) << what;
          ASSERT_EQ(y1[at], y2[at]) << what << " (threads must not change the result)";
          // Same integers; float order only: the float part of the bound covers the difference.
          ASSERT_NEAR(y1[at], ym[r], flt[at]) << what << " (vs matvec)";
        }
      }
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& p) {
  std::string s = std::string(dtype_name(std::get<0>(p.param))) +
                  (std::get<1>(p.param) == Precision::Faithful ? "_faithful_" : "_int8_") +
                  std::string(isa_name(std::get<2>(p.param)));
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Formats, GemmTest,
                         ::testing::Combine(::testing::Values(DType::PQ2_0, DType::Q2_0_G128, DType::Q2_0_G64,
                                                              DType::PTQ1_0),
                                            ::testing::Values(Precision::Faithful, Precision::Int8),
                                            ::testing::Values(Isa::Avx2, Isa::Avx512)),
                         param_name);

// The GEMM on Lanes16 weights (kernels/cpu/matvec.h; the AVX-512 backend's
// default repack) reads the same codes and scales through a different loader,
// and accumulates the same per-block terms in the same order: bit-identical
// to the GEMM on the file layout. Also within the float bound of the lanes
// matvec and within the full bound of the reference. Shapes cover one slab,
// a slab cut by the row end, a tail group of 1 (nb = 17) and K = 5120 (tail of 8).
TEST(GemmLanes, EqualsFileLayoutGemm) {
  if (!gemm_supported(DType::PQ2_0, Isa::Avx512)) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  ThreadPool pool1(1), pool2(2);
  struct Shape {
    int64_t n, k;
  };
  for (Precision prec : {Precision::Faithful, Precision::Int8})
    for (const Shape sh : {Shape{77, 256}, Shape{130, 640}, Shape{67, 17 * 128}, Shape{33, 5120}}) {
      const Matrix m = random_ternary(DType::PQ2_0, sh.n, sh.k, static_cast<uint32_t>(sh.n * 3 + sh.k));
      std::vector<uint8_t> lanes(static_cast<size_t>(lanes_total_bytes(sh.n, sh.k)));
      pack_lanes_rows(m.view(), lanes.data(), 0, sh.n);
      const WeightView lv = lanes_view(m.type, lanes.data(), sh.n, sh.k);
      for (int t : {1, 7, 64}) {
        const std::vector<float> x = activations(t, sh.k, static_cast<uint32_t>(t * 17 + sh.n));
        std::vector<double> yr, tol, flt;
        reference(m, x, t, prec, yr, tol, flt);
        PreparedBatch batch;
        prepare_batch(x.data(), t, sh.k, 128, prec, batch);
        std::vector<float> yf(static_cast<size_t>(t * sh.n)), y1(yf.size(), -1.0f), y2(yf.size(), -2.0f);
        gemm(m.view(), batch, yf.data(), pool1, Isa::Avx512);
        gemm(lv, batch, y1.data(), pool1, Isa::Avx512);
        gemm(lv, batch, y2.data(), pool2, Isa::Avx512);
        PreparedAct act;
        std::vector<float> ym(static_cast<size_t>(sh.n));
        for (int i = 0; i < t; ++i) {
          prepare_act(x.data() + i * sh.k, sh.k, prec, act, layouts_for(lv));
          matvec(lv, act, ym.data(), pool1, Isa::Avx512);
          for (int64_t r = 0; r < sh.n; ++r) {
            const size_t at = static_cast<size_t>(i * sh.n + r);
            const std::string what = "n=" + std::to_string(sh.n) + " k=" + std::to_string(sh.k) +
                                     " t=" + std::to_string(t) + " token " + std::to_string(i) + " row " +
                                     std::to_string(r);
            ASSERT_EQ(y1[at], yf[at]) << what << " (lanes vs file layout)";
            ASSERT_EQ(y1[at], y2[at]) << what << " (threads must not change the result)";
            ASSERT_NEAR(y1[at], yr[at], tol[at]) << what;
            ASSERT_NEAR(y1[at], ym[r], flt[at]) << what << " (vs lanes matvec)";
          }
        }
      }
      PreparedBatch b;
      const std::vector<float> x = activations(2, sh.k, 1);
      prepare_batch(x.data(), 2, sh.k, 128, prec, b);
      std::vector<float> y(static_cast<size_t>(2 * sh.n));
      EXPECT_THROW(gemm(lv, b, y.data(), pool1, Isa::Avx2), Error);  // no AVX2 lanes loader
    }
}

// The batched matmul of the CPU backend (GEMM on AVX2 / AVX-512, matvec per
// token on the scalar level) against the reference and against the
// token-by-token path; matmul_multi against matmul.
TEST(GemmBackend, BatchedMatmulMatchesPerToken) {
  const Matrix m = random_ternary(DType::PQ2_0, 70, 384, 5);
  const int t = 9;
  const std::vector<float> x = activations(t, 384, 6);
  std::vector<double> yr, tol, flt;
  reference(m, x, t, Precision::Faithful, yr, tol, flt);
  Weight w{};
  w.type = m.type, w.data = m.bytes.data(), w.n = m.n, w.k = m.k;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!isa_supported(isa)) continue;
    for (int threads : {1, 2}) {
      CpuBackend be(threads, isa, Precision::Faithful);
      std::vector<float> y(static_cast<size_t>(t * m.n)), y1(y.size()), y2(y.size());
      be.matmul(w, x.data(), y.data(), t);
      for (int i = 0; i < t; ++i) be.matmul(w, x.data() + i * m.k, y1.data() + i * m.n, 1);
      const Weight* ws[2] = {&w, &w};
      float* ys[2] = {y2.data(), y1.data()};
      std::vector<float> y_multi_b(y.size());
      ys[1] = y_multi_b.data();
      be.matmul_multi(ws, x.data(), ys, t);
      for (size_t j = 0; j < y.size(); ++j) {
        ASSERT_NEAR(y[j], yr[j], tol[j]) << isa_name(isa) << " element " << j;
        ASSERT_NEAR(y[j], y1[j], tol[j]) << isa_name(isa) << " batched vs per token, element " << j;
        ASSERT_EQ(y2[j], y[j]) << isa_name(isa) << " matmul_multi vs matmul, element " << j;
        ASSERT_EQ(y_multi_b[j], y[j]) << isa_name(isa) << " matmul_multi second output, element " << j;
      }
    }
  }
}

TEST(GemmArgs, RejectsBadInput) {
  if (!gemm_supported(DType::PQ2_0, Isa::Avx512)) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  ThreadPool pool(1);
  const Matrix m = random_ternary(DType::PQ2_0, 8, 256, 1);
  const Matrix g64 = random_ternary(DType::Q2_0_G64, 8, 256, 1);
  std::vector<float> x(2 * 384, 0.5f), y(2 * 8);
  PreparedBatch b384, b256;
  prepare_batch(x.data(), 2, 384, 128, Precision::Faithful, b384);
  prepare_batch(x.data(), 2, 256, 128, Precision::Faithful, b256);
  EXPECT_THROW(gemm(m.view(), b384, y.data(), pool, Isa::Avx512), Error);    // k mismatch
  EXPECT_THROW(gemm(g64.view(), b256, y.data(), pool, Isa::Avx512), Error);  // block 64 needed
  EXPECT_THROW(prepare_batch(x.data(), 2, 200, 128, Precision::Faithful, b256), Error);
  x[300] = std::nanf("");
  EXPECT_THROW(prepare_batch(x.data(), 2, 256, 128, Precision::Faithful, b256), Error);
}

}  // namespace
}  // namespace bonsai::cpu
