// Fast CPU matvec kernels vs the f32 reference (dequantize_row + double sums),
// for every weight format × instruction set × activation precision, on odd
// shapes and adversarial inputs, with 1 and 2 threads.
//
// Tolerances come from the error analysis in kernels/cpu/matvec.h:
//  * Quantization: activations are rounded to s_b·q with s_b = amax_b / Q
//    (Q = 32639 faithful, 127 int8; blocks of 64 for Q2_0 g64, else 128), so
//    |x_j − s_b q_j| ≤ s_b/2 and |y_r − y_ref| ≤ Σ_j |w_j| s_b(j)/2 exactly;
//    1 % slack covers s_b itself being rounded to float (relative 6e-8·|q|·s_b).
//  * Float: each block's integer sum is exact; converting it and multiplying
//    by d_b·s_b costs ≤ 3 roundings, and adding n_blocks terms in float costs
//    ≤ n_blocks roundings, each ≤ 2⁻²⁴ of Σ|terms| ≤ Σ|w_j x_j| + the bound.
//  * Float-weight matvecs sum k products in float: ≤ (k + 2)·2⁻²⁴·Σ|w_j x_j|.
// On top of the per-row bound, a statistical check pins the size of the error
// for Gaussian activations (expected ≈3e-5 faithful, ≈7e-3 int8; asserted
// < 1e-4 and in [1e-3, 2e-2]) so a mode that is wired wrongly cannot pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/formats.h"
#include "kernels/cpu/matvec.h"
#include "runtime/cpu_features.h"
#include "runtime/thread_pool.h"

namespace bonsai::cpu {
namespace {

constexpr double kEps = 1.0 / (1 << 24);

struct Matrix {
  DType type;
  int64_t n, k;
  std::vector<uint8_t> bytes;
  WeightView view() const { return {type, bytes.data(), n, k}; }
};

// Random ternary matrix: codes in {0,1,2} (and 3 when allow3 and the format
// takes it), fp16 scales in [1e-3, 0.1] with every `zero_every`-th block zero.
Matrix random_ternary(DType t, int64_t n, int64_t k, std::mt19937& rng, bool allow3, int zero_every = 7) {
  const DTypeInfo info = dtype_info(t);
  const int64_t g = info.block_size;
  Matrix m{t, n, k, std::vector<uint8_t>(row_bytes(t, k) * n)};
  std::uniform_int_distribution<int> code(0, allow3 ? 3 : 2);
  std::uniform_real_distribution<float> scale(1e-3f, 0.1f);
  std::vector<uint8_t> codes(k);
  std::vector<float> scales(k / g);
  int64_t blk = 0;
  for (int64_t r = 0; r < n; ++r) {
    for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
    for (auto& s : scales) s = (++blk % zero_every == 0) ? 0.0f : scale(rng);
    encode_ternary_row(t, codes.data(), scales.data(), m.bytes.data() + r * row_bytes(t, k), k);
  }
  return m;
}

Matrix random_float(DType t, int64_t n, int64_t k, std::mt19937& rng) {
  Matrix m{t, n, k, std::vector<uint8_t>(row_bytes(t, k) * n)};
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (int64_t i = 0; i < n * k; ++i) {
    const float v = nd(rng);
    if (t == DType::F32) {
      std::memcpy(m.bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = t == DType::F16 ? f32_to_fp16(v) : f32_to_bf16(v);
      std::memcpy(m.bytes.data() + 2 * i, &h, 2);
    }
  }
  return m;
}

struct Expected {
  std::vector<double> y, tol;
  std::vector<double> flt;  // the float-rounding part of tol (ternary)
};

// Reference values and per-row tolerances (see the file comment).
Expected reference(const Matrix& m, const std::vector<float>& x, Precision p) {
  const bool ternary = layouts_for(m.type) != 0;
  const int64_t ab = m.type == DType::Q2_0_G64 ? 64 : 128;  // activation block
  const double Q = p == Precision::Faithful ? 32639.0 : 127.0;
  std::vector<double> half_step((m.k + ab - 1) / ab);
  for (size_t b = 0; b < half_step.size(); ++b) {
    double amax = 0;
    for (int64_t j = b * ab; j < std::min<int64_t>(m.k, (b + 1) * ab); ++j)
      amax = std::max(amax, std::fabs(double(x[j])));
    half_step[b] = amax / Q / 2;
  }
  const int64_t n_blocks = m.k / dtype_info(m.type).block_size;
  Expected e{std::vector<double>(m.n), std::vector<double>(m.n), std::vector<double>(m.n)};
  std::vector<float> w(m.k);
  const size_t rb = row_bytes(m.type, m.k);
  for (int64_t r = 0; r < m.n; ++r) {
    dequantize_row(m.type, m.bytes.data() + r * rb, w.data(), m.k);
    double y = 0, mag = 0, bound = 0;
    for (int64_t j = 0; j < m.k; ++j) {
      y += double(w[j]) * x[j];
      mag += std::fabs(double(w[j]) * x[j]);
      bound += std::fabs(double(w[j])) * half_step[j / ab];
    }
    e.y[r] = y;
    e.flt[r] = (n_blocks + 4) * 2 * kEps * (mag + bound);
    e.tol[r] = ternary ? 1.01 * bound + e.flt[r] : (m.k + 2) * kEps * mag;
  }
  return e;
}

std::vector<Isa> isas() { return {Isa::Scalar, Isa::Avx2, Isa::Avx512}; }

// A macro, not a function: GTEST_SKIP() returns from the function it is in, so it has to be the
// test body itself (a helper's skip would let the test run on and fail on the missing ISA).
#define SKIP_UNLESS_SUPPORTED(isa) \
  if (!isa_supported(isa)) GTEST_SKIP() << "this CPU cannot run " << isa_name(isa) << " kernels"

enum class Input { Gaussian, Huge, Tiny, Zero, MixedBlocks, Spiky };

std::vector<float> make_input(Input kind, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> x(k);
  for (auto& v : x) v = nd(rng);
  switch (kind) {
    case Input::Gaussian:
      break;
    case Input::Huge:
      for (auto& v : x) v *= 1e30f;
      break;
    case Input::Tiny:
      for (auto& v : x) v *= 1e-30f;
      break;
    case Input::Zero:
      std::fill(x.begin(), x.end(), 0.0f);
      break;
    case Input::MixedBlocks:  // blocks of wildly different magnitude, one all-zero block
      for (int64_t j = 0; j < k; ++j) {
        const int64_t b = j / 64;
        x[j] *= b % 3 == 0 ? 1e6f : b % 3 == 1 ? 1e-6f : 1.0f;
        if (b == 1) x[j] = 0.0f;
      }
      break;
    case Input::Spiky:  // one huge outlier per block: the rest lose precision, the bound follows
      for (int64_t j = 0; j < k; j += 128) x[j] = 1e4f;
      break;
  }
  return x;
}

const char* input_name(Input i) {
  static const char* names[] = {"gaussian", "huge", "tiny", "zero", "mixed-blocks", "spiky"};
  return names[static_cast<int>(i)];
}

void expect_close(const std::vector<float>& y, const Expected& e, const std::string& what) {
  for (size_t r = 0; r < y.size(); ++r) {
    ASSERT_TRUE(std::isfinite(y[r])) << what << " row " << r;
    ASSERT_LE(std::fabs(double(y[r]) - e.y[r]), e.tol[r]) << what << " row " << r << " ref " << e.y[r];
  }
}

// ---- ternary formats ---------------------------------------------------------

using TernaryParam = std::tuple<DType, Isa, Precision>;
class TernaryMatvec : public ::testing::TestWithParam<TernaryParam> {};

TEST_P(TernaryMatvec, MatchesReferenceOnOddShapesAndInputs) {
  const auto [type, isa, prec] = GetParam();
  SKIP_UNLESS_SUPPORTED(isa);
  const int64_t g = dtype_info(type).block_size;
  const bool two_bit = type != DType::PTQ1_0;
  // (rows, k): odd row counts; one block; an odd number of blocks; K not a
  // power of two; the 27B hidden width; the FFN width (long rows: the AVX-512
  // PQ2_0 kernel walks 8 rows at a time there, with per-row prefetch).
  std::vector<std::pair<int64_t, int64_t>> shapes = {{7, 128}, {13, 384}, {5, 640}, {33, 5120}, {19, 17408}};
  if (g == 64) shapes.insert(shapes.end(), {{3, 64}, {9, 192}, {6, 320}});
  std::mt19937 rng(1234 + static_cast<int>(type) * 7 + static_cast<int>(prec));
  ThreadPool pool1(1), pool2(2);
  for (auto [n, k] : shapes) {
    const Matrix m = random_ternary(type, n, k, rng, /*allow3=*/two_bit);
    for (Input in :
         {Input::Gaussian, Input::Huge, Input::Tiny, Input::Zero, Input::MixedBlocks, Input::Spiky}) {
      const std::vector<float> x = make_input(in, k, rng);
      PreparedAct act;
      prepare_act(x.data(), k, prec, act, layouts_for(type));
      const Expected e = reference(m, x, prec);
      const std::string what = std::string(dtype_name(type)) + " " + std::string(isa_name(isa)) +
                               " n=" + std::to_string(n) + " k=" + std::to_string(k) + " " + input_name(in);
      std::vector<float> y1(n, -1.0f), y2(n, -2.0f);
      matvec(m.view(), act, y1.data(), pool1, isa);
      expect_close(y1, e, what + " 1 thread");
      matvec(m.view(), act, y2.data(), pool2, isa);
      // Rows are independent: the split across threads cannot change a value.
      for (int64_t r = 0; r < n; ++r) ASSERT_EQ(y1[r], y2[r]) << what << " 2 threads, row " << r;
      if (in == Input::Zero) {
        for (int64_t r = 0; r < n; ++r) ASSERT_EQ(y1[r], 0.0f) << what << " row " << r;
      }
    }
  }
}

TEST_P(TernaryMatvec, ErrorSizeMatchesTheAnalysis) {
  const auto [type, isa, prec] = GetParam();
  SKIP_UNLESS_SUPPORTED(isa);
  std::mt19937 rng(99);
  const int64_t n = 64, k = 5120;
  const Matrix m = random_ternary(type, n, k, rng, false, 1 << 30);
  const std::vector<float> x = make_input(Input::Gaussian, k, rng);
  PreparedAct act;
  prepare_act(x.data(), k, prec, act, layouts_for(type));
  std::vector<float> y(n);
  ThreadPool pool(2);
  matvec(m.view(), act, y.data(), pool, isa);
  const Expected e = reference(m, x, prec);
  double err = 0, ref = 0;
  for (int64_t r = 0; r < n; ++r) {
    err += (y[r] - e.y[r]) * (y[r] - e.y[r]);
    ref += e.y[r] * e.y[r];
  }
  const double rel = std::sqrt(err / ref);
  if (prec == Precision::Faithful) {
    EXPECT_LT(rel, 1e-4);
  } else {
    EXPECT_GT(rel, 1e-3);
    EXPECT_LT(rel, 2e-2);
  }
}

std::string sanitize(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

std::string ternary_name(const ::testing::TestParamInfo<TernaryParam>& p) {
  const auto [type, isa, prec] = p.param;
  return sanitize(std::string(dtype_name(type)) + "_" + std::string(isa_name(isa)) +
                  (prec == Precision::Faithful ? "_faithful" : "_int8"));
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, TernaryMatvec,
    ::testing::Combine(::testing::Values(DType::PQ2_0, DType::Q2_0_G128, DType::Q2_0_G64, DType::PTQ1_0),
                       ::testing::ValuesIn(isas()), ::testing::Values(Precision::Faithful, Precision::Int8)),
    ternary_name);

// ---- the block-lanes layout (WeightLayout::Lanes16, AVX-512) ---------------------

// The Lanes16 copy of a PQ2_0 / Q2_0 g128 matrix (pack_lanes_rows), kept with its view.
struct LanesMatrix {
  std::vector<uint8_t> bytes;
  WeightView view;
  explicit LanesMatrix(const Matrix& m) : bytes(static_cast<size_t>(lanes_total_bytes(m.n, m.k)), 0xEE) {
    pack_lanes_rows(m.view(), bytes.data(), 0, m.n);
    view = lanes_view(m.type, bytes.data(), m.n, m.k);
  }
};

// Every code byte and scale lands where matvec.h's layout description says
// (restated here), row padding is zero, and nothing is lost: the file bytes
// rebuilt from the layout equal the original.
TEST(LanesLayout, RepackRoundTrip) {
  std::mt19937 rng(5);
  for (int64_t nb : {1, 15, 16, 17, 40, 136}) {
    const int64_t n = 3, k = nb * 128;
    const Matrix m = random_ternary(DType::PQ2_0, n, k, rng, true);
    const LanesMatrix l(m);
    const int64_t rb = lanes_code_row_bytes(k);
    ASSERT_EQ(rb % 64, 0);
    ASSERT_GE(rb, nb * 32);
    std::vector<uint8_t> rebuilt(m.bytes.size());
    for (int64_t r = 0; r < n; ++r) {
      const uint8_t* codes = l.bytes.data() + r * rb;
      const uint8_t* sc = l.bytes.data() + lanes_scales_offset(n, k) + r * nb * 2;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t j = b / 16, g = std::min<int64_t>(16, nb - 16 * j);
        uint8_t* blk = rebuilt.data() + r * row_bytes(DType::PQ2_0, k) + b * 34;
        std::memcpy(blk, sc + 2 * b, 2);
        for (int c = 0; c < 8; ++c)
          for (int i = 0; i < 4; ++i) blk[2 + 4 * c + i] = codes[512 * j + 4 * g * c + 4 * (b % 16) + i];
      }
      for (int64_t p = nb * 32; p < rb; ++p) ASSERT_EQ(codes[p], 0) << "padding, nb " << nb;
    }
    ASSERT_EQ(rebuilt, m.bytes) << "nb " << nb;
  }
}

// The Lanes16 kernel against the reference (same tolerance as the file-layout
// kernels: same integers, float order only) and against the file-layout
// AVX-512 kernel (the float part of that tolerance covers the difference),
// at every group shape: one block, a tail group alone (15), exactly one
// group (16), one group + a tail of 1 (17), the 27B's K = 5120 (16 + 16 + 8)
// and K = 17408 (8 groups + 8); row counts off the 4- and 2-row walks.
TEST(LanesMatvec, MatchesReferenceAndFileLayout) {
  SKIP_UNLESS_SUPPORTED(Isa::Avx512);
  ThreadPool pool1(1), pool2(2);
  for (Precision prec : {Precision::Faithful, Precision::Int8})
    for (DType type : {DType::PQ2_0, DType::Q2_0_G128}) {
      std::mt19937 rng(77 + static_cast<int>(prec));
      for (auto [n, nb] : std::vector<std::pair<int64_t, int64_t>>{
               {5, 1}, {7, 15}, {9, 16}, {6, 17}, {13, 40}, {11, 136}, {1, 40}, {3, 17}, {4, 8}, {6, 25}}) {
        const int64_t k = nb * 128;
        const Matrix m = random_ternary(type, n, k, rng, /*allow3=*/true);
        const LanesMatrix l(m);
        for (Input in :
             {Input::Gaussian, Input::Huge, Input::Tiny, Input::Zero, Input::MixedBlocks, Input::Spiky}) {
          const std::vector<float> x = make_input(in, k, rng);
          PreparedAct act;
          prepare_act(x.data(), k, prec, act, layouts_for(l.view) | layouts_for(type));
          const Expected e = reference(m, x, prec);
          const std::string what =
              std::string(dtype_name(type)) + (prec == Precision::Faithful ? " faithful" : " int8") +
              " n=" + std::to_string(n) + " nb=" + std::to_string(nb) + " " + input_name(in);
          std::vector<float> y1(n, -1.0f), y2(n, -2.0f), yf(n, -3.0f);
          matvec(l.view, act, y1.data(), pool1, Isa::Avx512);
          expect_close(y1, e, what + " lanes, 1 thread");
          matvec(l.view, act, y2.data(), pool2, Isa::Avx512);
          for (int64_t r = 0; r < n; ++r) ASSERT_EQ(y1[r], y2[r]) << what << " 2 threads, row " << r;
          matvec(m.view(), act, yf.data(), pool1, Isa::Avx512);
          for (int64_t r = 0; r < n; ++r) {
            // Same integers and per-block products; each sum's order costs ≤ n_blocks roundings of
            // Σ|terms| ≤ mag + bound, so the two differ by less than the float part of the tolerance.
            ASSERT_NEAR(y1[r], yf[r], e.flt[r]) << what << " vs the file layout, row " << r;
            if (in == Input::Zero) {
              ASSERT_EQ(y1[r], 0.0f) << what << " row " << r;
            }
          }
        }
      }
    }
}

// ActLayout::Lanes16 as matvec.h describes it (restated here): every element
// exactly once, in byte 4b + i of (group j, chunk c, plane s) for element
// 16c + 4i + s of block 16j + b, or, in a last group of ≤ 8 blocks, chunk
// c ≥ 4 in chunk c − 4 at lane 8 + b; corr / scale in lane b; all else zero.
TEST(LanesActLayout, HoldsEveryElementOnce) {
  std::mt19937 rng(12);
  for (int64_t nb : {1, 5, 8, 9, 15, 16, 17, 40}) {
    const int64_t k = nb * 128;
    const std::vector<float> x = make_input(Input::MixedBlocks, k, rng);
    for (Precision prec : {Precision::Faithful, Precision::Int8}) {
      PreparedAct act;
      prepare_act(x.data(), k, prec, act, layout_bit(ActLayout::Lanes16));
      const PackedAct& p = act.packed[static_cast<int>(ActLayout::Lanes16)];
      const int64_t ng = (nb + 15) / 16;
      ASSERT_EQ(p.n_groups, ng);
      const double Q = prec == Precision::Faithful ? 32639 : 127;
      std::vector<int> seen(k, 0);
      std::vector<int64_t> sums(nb, 0);
      for (int64_t j = 0; j < ng; ++j) {
        const int64_t g = std::min<int64_t>(16, nb - 16 * j);
        const bool fold = g <= 8;
        for (int c = 0; c < 8; ++c)
          for (int s = 0; s < 4; ++s)
            for (int lane = 0; lane < 16; ++lane)
              for (int i = 0; i < 4; ++i) {
                const int64_t idx = ((j * 8 + c) * 4 + s) * 64 + 4 * lane + i;
                const int q = prec == Precision::Faithful ? 256 * p.hi.data()[idx] + p.lo.data()[idx]
                                                          : p.hi.data()[idx];
                int b = lane, cc = c;
                if (fold) b = lane % 8, cc = c + 4 * (lane / 8);
                const bool used = b < g && (!fold || c < 4);
                if (!used) {
                  ASSERT_EQ(q, 0) << "unused byte " << idx << " nb " << nb;
                  continue;
                }
                const int64_t blk = 16 * j + b, e = blk * 128 + 16 * cc + 4 * i + s;
                ++seen[e];
                sums[blk] += q;
                double amax = 0;
                for (int64_t t = blk * 128; t < (blk + 1) * 128; ++t)
                  amax = std::max(amax, std::fabs(double(x[t])));
                const float sc = p.scale.data()[j * 16 + b];
                ASSERT_NEAR(sc, amax / Q, 1e-6 * sc);
                // Rounding to the grid: ≤ s/2, plus three float roundings (1/s, x·(1/s), s
                // itself), each ≤ 2⁻²⁴ of |q|·s.
                ASSERT_LE(std::fabs(double(q) * sc - x[e]), 0.5 * sc + 2e-7 * std::abs(q) * sc)
                    << "element " << e;
              }
        for (int lane = 0; lane < 16; ++lane) {
          if (lane >= g) {
            EXPECT_EQ(p.corr.data()[j * 16 + lane], 0);
            EXPECT_EQ(p.scale.data()[j * 16 + lane], 0.0f);
          }
        }
      }
      for (int64_t b = 0; b < nb; ++b)
        EXPECT_EQ(p.corr.data()[b / 16 * 16 + b % 16], -sums[b]) << "block " << b;
      for (int64_t e = 0; e < k; ++e) ASSERT_EQ(seen[e], 1) << "element " << e << " nb " << nb;
    }
  }
}

TEST(LanesMatvec, ErrorSizeMatchesTheAnalysis) {
  SKIP_UNLESS_SUPPORTED(Isa::Avx512);
  std::mt19937 rng(99);
  const int64_t n = 64, k = 5120;
  const Matrix m = random_ternary(DType::PQ2_0, n, k, rng, false, 1 << 30);
  const LanesMatrix l(m);
  const std::vector<float> x = make_input(Input::Gaussian, k, rng);
  ThreadPool pool(2);
  for (Precision prec : {Precision::Faithful, Precision::Int8}) {
    PreparedAct act;
    prepare_act(x.data(), k, prec, act, layouts_for(l.view));
    std::vector<float> y(n);
    matvec(l.view, act, y.data(), pool, Isa::Avx512);
    const Expected e = reference(m, x, prec);
    double err = 0, ref = 0;
    for (int64_t r = 0; r < n; ++r) {
      err += (y[r] - e.y[r]) * (y[r] - e.y[r]);
      ref += e.y[r] * e.y[r];
    }
    const double rel = std::sqrt(err / ref);
    if (prec == Precision::Faithful) {
      EXPECT_LT(rel, 1e-4);
    } else {
      EXPECT_GT(rel, 1e-3);
      EXPECT_LT(rel, 2e-2);
    }
  }
}

TEST(LanesMatvec, RejectsWhatItCannotRun) {
  std::mt19937 rng(3);
  const Matrix m = random_ternary(DType::PQ2_0, 4, 256, rng, false);
  const LanesMatrix l(m);
  std::vector<float> x(256, 1.0f), y(4);
  PreparedAct file_only, lanes;
  prepare_act(x.data(), 256, Precision::Faithful, file_only, layouts_for(DType::PQ2_0));
  prepare_act(x.data(), 256, Precision::Faithful, lanes, layouts_for(l.view));
  ThreadPool pool(1);
  if (isa_supported(Isa::Avx512)) {
    EXPECT_THROW(matvec(l.view, file_only, y.data(), pool, Isa::Avx512), Error);  // activation layout
  }
  EXPECT_THROW(matvec(l.view, lanes, y.data(), pool, Isa::Avx2), Error);  // no AVX2 lanes kernel
  WeightView bad = l.view;
  bad.type = DType::Q2_0_G64;
  EXPECT_THROW(matvec(bad, lanes, y.data(), pool, Isa::Avx512), Error);
  const Matrix g64 = random_ternary(DType::Q2_0_G64, 4, 256, rng, false);
  std::vector<uint8_t> buf(static_cast<size_t>(lanes_total_bytes(4, 256)));
  EXPECT_THROW(pack_lanes_rows(g64.view(), buf.data(), 0, 4), Error);
}

// ---- float formats -------------------------------------------------------------

using FloatParam = std::tuple<DType, Isa>;
class FloatMatvec : public ::testing::TestWithParam<FloatParam> {};

TEST_P(FloatMatvec, MatchesReference) {
  const auto [type, isa] = GetParam();
  SKIP_UNLESS_SUPPORTED(isa);
  std::mt19937 rng(7);
  ThreadPool pool1(1), pool2(2);
  // ssm_alpha/beta shape, plus odd rows and k not a multiple of 8 or 16.
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{48, 5120}, {7, 37}, {5, 16}, {3, 1}}) {
    const Matrix m = random_float(type, n, k, rng);
    for (Input in : {Input::Gaussian, Input::Huge, Input::Zero}) {
      const std::vector<float> x = make_input(in, k, rng);
      PreparedAct act;
      prepare_act(x.data(), k, Precision::Faithful, act, 0);
      const Expected e = reference(m, x, Precision::Faithful);
      std::vector<float> y1(n), y2(n);
      matvec(m.view(), act, y1.data(), pool1, isa);
      matvec(m.view(), act, y2.data(), pool2, isa);
      const std::string what = std::string(dtype_name(type)) + " " + std::string(isa_name(isa)) +
                               " k=" + std::to_string(k) + " " + input_name(in);
      expect_close(y1, e, what);
      for (int64_t r = 0; r < n; ++r) ASSERT_EQ(y1[r], y2[r]) << what << " row " << r;
    }
  }
}

std::string float_name(const ::testing::TestParamInfo<FloatParam>& p) {
  return std::string(dtype_name(std::get<0>(p.param))) + "_" + std::string(isa_name(std::get<1>(p.param)));
}

INSTANTIATE_TEST_SUITE_P(Kernels, FloatMatvec,
                         ::testing::Combine(::testing::Values(DType::F32, DType::F16, DType::BF16),
                                            ::testing::ValuesIn(isas())),
                         float_name);

// ---- multi-weight entry and argument checks ----------------------------------------

TEST(MatvecMulti, EqualsSeparateMatvecs) {
  std::mt19937 rng(5);
  const int64_t k = 1024;
  const Matrix q = random_ternary(DType::PQ2_0, 37, k, rng, false);
  const Matrix kk = random_ternary(DType::PQ2_0, 8, k, rng, false);
  const Matrix v = random_ternary(DType::PQ2_0, 129, k, rng, false);
  const Matrix alpha = random_float(DType::BF16, 5, k, rng);
  const std::vector<float> x = make_input(Input::Gaussian, k, rng);
  PreparedAct act;
  prepare_act(x.data(), k, Precision::Faithful, act, layouts_for(DType::PQ2_0));
  for (Isa isa : isas()) {
    if (!isa_supported(isa)) continue;
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      std::vector<float> yq(q.n), yk(kk.n), yv(v.n), ya(alpha.n);
      const MatvecJob jobs[] = {
          {q.view(), yq.data()}, {kk.view(), yk.data()}, {v.view(), yv.data()}, {alpha.view(), ya.data()}};
      matvec_multi(jobs, act, pool, isa);
      for (const auto& j : jobs) {
        std::vector<float> ref(j.w.n);
        matvec_rows(j.w, act, ref.data(), 0, j.w.n, isa);
        for (int64_t r = 0; r < j.w.n; ++r) ASSERT_EQ(j.y[r], ref[r]) << isa_name(isa) << " row " << r;
      }
    }
  }
}

// Matrices of many 1 MiB chunks take the split whose last chunks are cut
// finer (matvec.cpp, ChunkPlan); every row must still be computed exactly
// once, bit-identical to one sequential pass (per row the kernels add in the
// same order whatever the row grouping). 5120 × 1605 PQ2_0 is 2.2 MB: 8
// chunks of 208 rows (283 KB), the last 1-2 chunks' worth cut into 32-row
// pieces, the last one partial.
TEST(MatvecSplit, ManyChunksEqualOneSequentialPass) {
  std::mt19937 rng(9);
  const int64_t k = 5120;
  const Matrix m = random_ternary(DType::PQ2_0, 1605, k, rng, false);
  const std::vector<float> x = make_input(Input::Gaussian, k, rng);
  PreparedAct act;
  prepare_act(x.data(), k, Precision::Faithful, act, layouts_for(DType::PQ2_0));
  const Isa isa = best_isa();
  std::vector<float> ref(m.n);
  matvec_rows(m.view(), act, ref.data(), 0, m.n, isa);
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    std::vector<float> y(m.n, std::nanf(""));
    matvec(m.view(), act, y.data(), pool, isa);
    for (int64_t r = 0; r < m.n; ++r) ASSERT_EQ(y[r], ref[r]) << "threads " << threads << " row " << r;
    // The same rows as the second job of a matvec_multi (row space offset by 3).
    const Matrix small = random_ternary(DType::PQ2_0, 3, k, rng, false);
    std::vector<float> ys(3), y2(m.n, std::nanf(""));
    const MatvecJob jobs[] = {{small.view(), ys.data()}, {m.view(), y2.data()}};
    matvec_multi(jobs, act, pool, isa);
    for (int64_t r = 0; r < m.n; ++r)
      ASSERT_EQ(y2[r], ref[r]) << "multi, threads " << threads << " row " << r;
  }
}

TEST(MatvecChecks, RejectsMismatchedInputs) {
  std::mt19937 rng(3);
  const Matrix m = random_ternary(DType::PQ2_0, 4, 256, rng, false);
  const Matrix t1 = random_ternary(DType::PTQ1_0, 4, 256, rng, false);
  const std::vector<float> x(128, 1.0f), x256(256, 1.0f);
  PreparedAct narrow, only_pq2;
  prepare_act(x.data(), 128, Precision::Faithful, narrow);
  prepare_act(x256.data(), 256, Precision::Faithful, only_pq2, layouts_for(DType::PQ2_0));
  std::vector<float> y(4);
  ThreadPool pool(1);
  EXPECT_THROW(matvec(m.view(), narrow, y.data(), pool, Isa::Scalar), Error);     // k mismatch
  EXPECT_THROW(matvec(t1.view(), only_pq2, y.data(), pool, Isa::Scalar), Error);  // layout not prepared
  EXPECT_THROW(matvec_rows(m.view(), only_pq2, y.data(), 0, 5, Isa::Scalar), Error);
  const WeightView q8{DType::Q8_0, m.bytes.data(), 4, 256};
  EXPECT_THROW(matvec(q8, only_pq2, y.data(), pool, Isa::Scalar), Error);
  EXPECT_THROW(prepare_act(x.data(), 0, Precision::Faithful, narrow), Error);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> xb(256, 1.0f);
    xb[201] = bad;  // inside the second block, off the 4-wide SIMD boundary
    EXPECT_THROW(prepare_act(xb.data(), 256, Precision::Faithful, narrow), Error) << bad;
  }
}

// prepare_act on a pool quantizes and packs pieces of 16 blocks on several threads: every layout's
// bytes, corrections and scales must be those of the one-thread pass, at widths with a partial
// last block, a folded Lanes16 tail group (<= 8 blocks) and a full one, in both precisions; a
// non-finite value in the last piece is still refused.
TEST(PrepareAct, OnThePoolEqualsOneThread) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int64_t k : {int64_t{640}, int64_t{6144}, int64_t{6144 + 128 * 3}, int64_t{17408}, int64_t{17408 + 37},
                    int64_t{16 * 2048}})
    for (Precision prec : {Precision::Faithful, Precision::Int8}) {
      std::vector<float> x(k);
      for (auto& v : x) v = nd(rng);
      for (int64_t j = 0; j < std::min<int64_t>(k, 128); ++j) x[j] = 0.0f;  // an all-zero block
      PreparedAct one;
      prepare_act(x.data(), k, prec, one, kAllActLayouts);
      for (int threads : {2, 3, 5}) {
        ThreadPool pool(threads);
        // Buffers first filled by a wider activation, so that padding the pieces fail to zero
        // would show (a resize keeps the old bytes).
        std::vector<float> wide(k + 4096);
        for (auto& v : wide) v = nd(rng);
        PreparedAct many;
        prepare_act(wide.data(), k + 4096, prec, many, kAllActLayouts, &pool);
        {
          prepare_act(x.data(), k, prec, many, kAllActLayouts, &pool);
          for (int l = 0; l < kNumActLayouts; ++l) {
            const PackedAct &a = one.packed[l], &b = many.packed[l];
            const std::string at = "k " + std::to_string(k) + " layout " + std::to_string(l) + " threads " +
                                   std::to_string(threads) +
                                   (prec == Precision::Int8 ? " int8" : " faithful");
            ASSERT_EQ(a.n_groups, b.n_groups) << at;
            ASSERT_EQ(a.hi.size(), b.hi.size()) << at;
            ASSERT_EQ(0, std::memcmp(a.hi.data(), b.hi.data(), a.hi.size())) << at;
            ASSERT_EQ(a.lo.size(), b.lo.size()) << at;
            if (a.lo.size()) {
              ASSERT_EQ(0, std::memcmp(a.lo.data(), b.lo.data(), a.lo.size())) << at;
            }
            ASSERT_EQ(0, std::memcmp(a.corr.data(), b.corr.data(), a.corr.size() * 4)) << at;
            ASSERT_EQ(0, std::memcmp(a.scale.data(), b.scale.data(), a.scale.size() * 4)) << at;
          }
        }
      }
    }
  std::vector<float> bad(17408, 1.0f);
  bad[17400] = std::nanf("");
  ThreadPool pool(3);
  PreparedAct act;
  EXPECT_THROW(prepare_act(bad.data(), 17408, Precision::Faithful, act, kAllActLayouts, &pool), Error);
}

TEST(PTQ1Transcode, MatchesTheReferenceTranscodeBitForBit) {
  std::mt19937 rng(17);
  for (Isa isa : isas()) {
    if (!isa_supported(isa)) continue;
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {7, 384}, {33, 5120}}) {
      const Matrix m = random_ternary(DType::PTQ1_0, n, k, rng, false);
      const size_t pq2_row = row_bytes(DType::PQ2_0, k);
      std::vector<uint8_t> ref(pq2_row * n), got(pq2_row * n, 0xAB);
      for (int64_t r = 0; r < n; ++r)
        bonsai::transcode_ptq1_to_pq2(m.bytes.data() + r * row_bytes(DType::PTQ1_0, k),
                                      ref.data() + r * pq2_row, k);
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        transcode_ptq1_to_pq2(m.view(), got.data(), pool, isa);
        ASSERT_EQ(got, ref) << isa_name(isa) << " n=" << n << " k=" << k;
      }
    }
  }
  std::vector<uint8_t> dst(34);
  const Matrix pq2 = random_ternary(DType::PQ2_0, 1, 128, rng, false);
  ThreadPool pool(1);
  EXPECT_THROW(transcode_ptq1_to_pq2(pq2.view(), dst.data(), pool, Isa::Scalar), Error);
}

TEST(PTQ1Decode, ThreeByteOpFormulaIsExact) {
  // The SIMD PTQ1_0 kernels decode trit = ⌊3t/256⌋ (t = byte·3ⁿ mod 256) as
  // 64·trit = avg_epu8(t, subs_epu8(t, v)) & 0xC0 with v = 3t mod 256.
  for (int t = 0; t < 256; ++t) {
    const int v = (3 * t) & 255;
    const int subs = std::max(t - v, 0);
    const int avg = (t + subs + 1) >> 1;
    EXPECT_EQ(avg & 0xC0, 64 * ((3 * t) >> 8)) << t;
  }
}

TEST(PrepareAct, LayoutsHoldEveryElementOnce) {
  // Map every lane back to its element with the layout documented in
  // matvec.h (restated here independently of prepare_act.cpp) and check that
  // each element appears exactly once, as q = 256·hi + lo with
  // |q·s_b − x| ≤ s_b/2, and that corr holds −Σq of each block.
  std::mt19937 rng(11);
  const int64_t k = 640;  // 5 blocks of 128: the last group is half padding
  const std::vector<float> x = make_input(Input::MixedBlocks, k, rng);
  PreparedAct act;
  prepare_act(x.data(), k, Precision::Faithful, act);
  struct Geo {
    ActLayout l;
    int B, G, P;
  };
  for (Geo geo : {Geo{ActLayout::Q2x128, 128, 2, 4}, Geo{ActLayout::Q2x64, 64, 4, 4},
                  Geo{ActLayout::Trit128, 128, 2, 5}}) {
    const PackedAct& p = act.packed[static_cast<int>(geo.l)];
    const int L = 64 / geo.G;
    ASSERT_EQ(p.n_groups, (k / geo.B + geo.G - 1) / geo.G);
    std::vector<int> seen(k, 0);
    for (int64_t g = 0; g < p.n_groups; ++g)
      for (int h = 0; h < geo.G; ++h) {
        const int64_t b = g * geo.G + h;
        const float s = p.scale.data()[g * 16 + h * (16 / geo.G)];
        int64_t sum = 0;
        for (int pl = 0; pl < geo.P; ++pl)
          for (int m = 0; m < L; ++m) {
            const int64_t idx = (g * geo.P + pl) * 64 + h * L + m;
            const int q = 256 * p.hi.data()[idx] + p.lo.data()[idx];
            sum += q;
            int e = 4 * m + pl;
            if (geo.l == ActLayout::Trit128)
              e = m < 16               ? 16 * pl + m
                  : m < 24             ? 80 + 8 * pl + (m - 16)
                  : (m < 26 && pl < 4) ? 120 + 2 * pl + (m - 24)
                                       : -1;
            const int64_t j = b * geo.B + e;
            if (e < 0 || j >= k) {
              ASSERT_EQ(q, 0) << "unused lane " << idx;
              continue;
            }
            ++seen[j];
            double amax = 0;
            for (int64_t i = b * geo.B; i < (b + 1) * geo.B; ++i)
              amax = std::max(amax, std::fabs(double(x[i])));
            ASSERT_NEAR(s, amax / 32639, 1e-6 * s);
            ASSERT_LE(std::fabs(double(q) * s - x[j]), 0.501 * s) << "element " << j;
          }
        EXPECT_EQ(p.corr.data()[g * 16 + h * (16 / geo.G)], -sum);
      }
    for (int64_t j = 0; j < k; ++j)
      ASSERT_EQ(seen[j], 1) << "element " << j << " layout " << static_cast<int>(geo.l);
  }
}

}  // namespace
}  // namespace bonsai::cpu
