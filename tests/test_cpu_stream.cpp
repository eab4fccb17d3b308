// The block-stream weight layout (WeightLayout::Stream16, kernels/cpu/matvec.h):
// the Lanes16 chunks and scales re-ordered into one sequential stream per row
// group. The layout is restated here and checked byte for byte; the matvec
// and the GEMM on it must give bit-identical results to Lanes16 / the file
// layout, because they read the same integers and scales and accumulate them
// in the same order (only the addresses differ) — any misplaced chunk or
// scale changes y by ~|w|·|x|, far from bit equality.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/formats.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/matvec.h"
#include "kernels/cpu/matvec_kernels.h"
#include "kernels/cpu/repack.h"
#include "runtime/cpu_features.h"
#include "runtime/thread_pool.h"

namespace bonsai::cpu {
namespace {

// A random PQ2_0 / Q2_0 g128 matrix in its file layout (codes 0..3, fp16
// scales in [1e-3, 0.1], every 7th block zero).
std::vector<uint8_t> random_matrix(DType t, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(row_bytes(t, k) * n), codes(k);
  std::vector<float> scales(k / 128);
  std::uniform_real_distribution<float> sd(1e-3f, 0.1f);
  int64_t blk = 0;
  for (int64_t r = 0; r < n; ++r) {
    for (auto& c : codes) c = static_cast<uint8_t>(rng() % 4);
    for (auto& s : scales) s = ++blk % 7 == 0 ? 0.0f : sd(rng);
    encode_ternary_row(t, codes.data(), scales.data(), bytes.data() + r * row_bytes(t, k), k);
  }
  return bytes;
}

std::vector<float> gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

struct Shape {
  int64_t n, nb;  // rows, 128-blocks per row
};
// Row groups of 4 (nb ≤ 64) and 8 (nb ≥ 65), full and partial; tails of
// 0, 1, 7, 8 (folded) and 9, 15 (not folded); the 27B's 40 and 136 blocks.
const std::vector<Shape> kShapes = {{5, 1},  {7, 15}, {9, 16},  {6, 17},  {13, 40},  {11, 136},
                                    {1, 40}, {3, 17}, {4, 8},   {6, 25},  {17, 72},  {9, 65},
                                    {8, 31}, {2, 48}, {19, 23}, {12, 81}, {16, 136}, {4, 7}};

// Every code byte and scale lands where matvec.h says (restated here), every
// other byte is zero, and the file bytes rebuilt from the layout equal the
// original; the geometry of the 27B's shapes adds no bytes over the file.
TEST(StreamLayout, RepackRoundTrip) {
  for (const Shape sh : kShapes) {
    const int64_t n = sh.n, nb = sh.nb, k = nb * 128;
    const auto file = random_matrix(DType::PQ2_0, n, k, static_cast<uint32_t>(n * 1000 + nb));
    const int64_t rl = stream_group_rows(k), total = stream_total_bytes(n, k);
    ASSERT_EQ(rl, lanes_code_row_bytes(k) * 4 > 8192 ? 8 : 4);
    std::vector<uint8_t> s(static_cast<size_t>(total), 0xEE);
    pack_stream_rows({DType::PQ2_0, file.data(), n, k}, s.data(), 0, n);
    std::vector<uint8_t> rebuilt(file.size());
    std::vector<int> hits(s.size(), 0);
    const int64_t n_full = nb / 16, g = nb % 16, steps = g <= 8 ? 4 : 8;
    const int64_t gs = 544 * rl, rgb = stream_rowgroup_bytes(k);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* blk = rebuilt.data() + r * row_bytes(DType::PQ2_0, k) + b * 34;
        const int64_t base = r / rl * rgb, i = r % rl, j = b / 16, lane = b % 16;
        const int64_t sc = j < n_full ? base + j * gs + 512 * rl + 32 * i + 2 * lane
                                      : base + n_full * gs + steps * 64 * rl + 2 * g * i + 2 * lane;
        for (int e = 0; e < 2; ++e) blk[e] = s[sc + e], ++hits[sc + e];
        for (int64_t c = 0; c < 8; ++c) {
          int64_t at;
          if (j < n_full)
            at = base + j * gs + c * 64 * rl + 64 * i + 4 * lane;
          else if (g <= 8)
            at = base + n_full * gs + (c % 4) * 64 * rl + 64 * i + 32 * (c / 4) + 4 * lane;
          else
            at = base + n_full * gs + c * 64 * rl + 64 * i + 4 * lane;
          for (int e = 0; e < 4; ++e) blk[2 + 4 * c + e] = s[at + e], ++hits[at + e];
        }
      }
    const std::string what = "n " + std::to_string(n) + " nb " + std::to_string(nb);
    ASSERT_EQ(rebuilt, file) << what;
    for (size_t p = 0; p < s.size(); ++p) {
      ASSERT_LE(hits[p], 1) << what << " byte " << p << " used twice";
      if (!hits[p]) {
        ASSERT_EQ(s[p], 0) << what << " padding byte " << p;
      }
    }
    if (nb == 40 || nb == 48 || nb == 136) {  // the 27B: no growth over the file (per whole row group)
      EXPECT_EQ(stream_rowgroup_bytes(k), rl * static_cast<int64_t>(row_bytes(DType::PQ2_0, k))) << what;
    }
  }
}

// The Stream16 matvec equals the Lanes16 one bit for bit (faithful and int8,
// 1 and 2 threads, row ranges cut inside row groups).
TEST(StreamMatvec, EqualsLanes) {
  if (!isa_supported(Isa::Avx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  ThreadPool pool1(1), pool2(2);
  for (DType type : {DType::PQ2_0, DType::Q2_0_G128})
    for (const Shape sh : kShapes) {
      const int64_t n = sh.n, k = sh.nb * 128;
      const auto file = random_matrix(type, n, k, static_cast<uint32_t>(n * 7 + sh.nb));
      std::vector<uint8_t> lanes(static_cast<size_t>(lanes_total_bytes(n, k)));
      std::vector<uint8_t> stream(static_cast<size_t>(stream_total_bytes(n, k)));
      pack_lanes_rows({type, file.data(), n, k}, lanes.data(), 0, n);
      pack_stream_rows({type, file.data(), n, k}, stream.data(), 0, n);
      const WeightView lv = lanes_view(type, lanes.data(), n, k), sv = stream_view(type, stream.data(), n, k);
      EXPECT_EQ(layouts_for(sv), layout_bit(ActLayout::Lanes16));
      const auto x = gaussian(k, static_cast<uint32_t>(k + n));
      for (Precision prec : {Precision::Faithful, Precision::Int8}) {
        PreparedAct act;
        prepare_act(x.data(), k, prec, act, layouts_for(sv));
        std::vector<float> yl(n, -1.0f), y1(n, -2.0f), y2(n, -3.0f), yr(n, -4.0f);
        matvec(lv, act, yl.data(), pool1, Isa::Avx512);
        matvec(sv, act, y1.data(), pool1, Isa::Avx512);
        matvec(sv, act, y2.data(), pool2, Isa::Avx512);
        const std::string what = std::string(dtype_name(type)) + " n " + std::to_string(n) + " nb " +
                                 std::to_string(sh.nb) +
                                 (prec == Precision::Faithful ? " faithful" : " int8");
        for (int64_t r = 0; r < n; ++r) {
          ASSERT_EQ(y1[r], yl[r]) << what << " row " << r;
          ASSERT_EQ(y2[r], yl[r]) << what << " 2 threads, row " << r;
        }
        // Ranges that start and end inside row groups (rows run one at a time there).
        for (int64_t cut = 1; cut < n; cut += 3) {
          matvec_rows(sv, act, yr.data(), 0, cut, Isa::Avx512);
          matvec_rows(sv, act, yr.data(), cut, n, Isa::Avx512);
          for (int64_t r = 0; r < n; ++r) ASSERT_EQ(yr[r], yl[r]) << what << " cut " << cut << " row " << r;
        }
      }
    }
}

// The software prefetch distance (TernaryArgs::prefetch; BONSAI_CPU_STREAM_PF4 / _PF8) only
// moves lines into L2: the kernel with no prefetch and with leads of 64 B .. 64 KiB (past the
// tensor's end too, which a prefetch may touch) gives the same floats, row groups of 4 and 8,
// faithful and int8, whole row groups and rows run one at a time.
TEST(StreamMatvec, PrefetchDistanceChangesNothing) {
  if (!isa_supported(Isa::Avx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (const Shape sh : kShapes) {
    const int64_t n = sh.n, k = sh.nb * 128;
    const auto file = random_matrix(DType::PQ2_0, n, k, static_cast<uint32_t>(n * 31 + sh.nb));
    std::vector<uint8_t> stream(static_cast<size_t>(stream_total_bytes(n, k)));
    pack_stream_rows({DType::PQ2_0, file.data(), n, k}, stream.data(), 0, n);
    const auto x = gaussian(k, static_cast<uint32_t>(3 * k + n));
    for (Precision prec : {Precision::Faithful, Precision::Int8}) {
      PreparedAct act;
      prepare_act(x.data(), k, prec, act, layout_bit(ActLayout::Lanes16));
      const PackedAct& p = act.packed[static_cast<int>(ActLayout::Lanes16)];
      detail::TernaryArgs args{};
      args.w = stream.data();
      args.row_bytes = stream_group_rows(k);
      args.n_blocks = sh.nb;
      args.end = stream.data() + stream.size();
      args.a = {p.hi.data(), prec == Precision::Faithful ? p.lo.data() : nullptr, p.corr.data(),
                p.scale.data(), p.n_groups};
      args.prefetch = 0;
      std::vector<float> want(n, -1.0f), got(n, -2.0f);
      detail::pq2_stream_rows_avx512(args, want.data(), 0, n);
      for (const int64_t lead : {64, 4096, 8192, 65536}) {
        args.prefetch = lead;
        std::fill(got.begin(), got.end(), -2.0f);
        detail::pq2_stream_rows_avx512(args, got.data(), 0, n);
        const int64_t cut = n / 2 + 1;  // a range boundary inside a row group (one row at a time)
        detail::pq2_stream_rows_avx512(args, got.data(), cut, n);
        const std::string what = "n " + std::to_string(n) + " nb " + std::to_string(sh.nb) + " lead " +
                                 std::to_string(lead) + (prec == Precision::Faithful ? " faithful" : " int8");
        for (int64_t r = 0; r < n; ++r) ASSERT_EQ(got[r], want[r]) << what << " row " << r;
      }
    }
  }
}

// The GEMM reads Stream16 through its own loader (decode_stream): bit-identical
// to the GEMM on the file layout (same integers, scales and order), across
// partial 64-row panels, tails of 1 and 8, row groups of 4 and 8.
TEST(StreamGemm, EqualsFileLayoutGemm) {
  if (!gemm_supported(DType::PQ2_0, Isa::Avx512)) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  ThreadPool pool1(1), pool2(2);
  for (const Shape sh : {Shape{77, 2}, Shape{130, 5}, Shape{67, 17}, Shape{33, 40}, Shape{70, 136},
                         Shape{65, 25}, Shape{20, 72}}) {
    const int64_t n = sh.n, k = sh.nb * 128;
    const auto file = random_matrix(DType::PQ2_0, n, k, static_cast<uint32_t>(n + 3 * k));
    std::vector<uint8_t> stream(static_cast<size_t>(stream_total_bytes(n, k)));
    pack_stream_rows({DType::PQ2_0, file.data(), n, k}, stream.data(), 0, n);
    const WeightView fv{DType::PQ2_0, file.data(), n, k}, sv = stream_view(DType::PQ2_0, stream.data(), n, k);
    for (Precision prec : {Precision::Faithful, Precision::Int8})
      for (int t : {1, 7}) {
        const auto x = gaussian(t * k, static_cast<uint32_t>(t * 17 + n));
        PreparedBatch batch;
        prepare_batch(x.data(), t, k, 128, prec, batch);
        std::vector<float> yf(static_cast<size_t>(t * n)), y1(yf.size(), -1.0f), y2(yf.size(), -2.0f);
        gemm(fv, batch, yf.data(), pool1, Isa::Avx512);
        gemm(sv, batch, y1.data(), pool1, Isa::Avx512);
        gemm(sv, batch, y2.data(), pool2, Isa::Avx512);
        for (size_t at = 0; at < yf.size(); ++at) {
          ASSERT_EQ(y1[at], yf[at]) << "n " << n << " nb " << sh.nb << " t " << t << " at " << at;
          ASSERT_EQ(y2[at], yf[at]) << "n " << n << " nb " << sh.nb << " t " << t << " at " << at
                                    << " 2 threads";
        }
        std::vector<float> y(static_cast<size_t>(t * n));
        EXPECT_THROW(gemm(sv, batch, y.data(), pool1, Isa::Avx2), Error);
      }
  }
}

// make_repack with BONSAI_CPU_WEIGHTS=stream: PQ2_0 and (transcoded) PTQ1_0
// become exactly pack_stream_rows of the PQ2_0 bytes, in tasks of whole row
// groups (n large enough for several tasks, with a partial last group).
TEST(StreamRepack, PolicyStreamRelaysEveryRow) {
  if (!isa_supported(Isa::Avx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  ThreadPool pool(2);
  const int64_t k = 40 * 128, n = 1543;  // > 2 MiB of codes: several repack tasks
  std::mt19937 rng(3);
  std::vector<uint8_t> ptq1(row_bytes(DType::PTQ1_0, k) * n), codes(k);
  std::vector<float> scales(k / 128);
  for (int64_t r = 0; r < n; ++r) {
    for (auto& c : codes) c = static_cast<uint8_t>(rng() % 3);
    for (auto& s : scales) s = 0.01f + 0.001f * static_cast<float>(rng() % 100);
    encode_ternary_row(DType::PTQ1_0, codes.data(), scales.data(),
                       ptq1.data() + r * row_bytes(DType::PTQ1_0, k), k);
  }
  std::vector<uint8_t> pq2(row_bytes(DType::PQ2_0, k) * n);
  for (int64_t r = 0; r < n; ++r)
    bonsai::transcode_ptq1_to_pq2(ptq1.data() + r * row_bytes(DType::PTQ1_0, k),
                                  pq2.data() + r * row_bytes(DType::PQ2_0, k), k);
  std::vector<uint8_t> want(static_cast<size_t>(stream_total_bytes(n, k)));
  pack_stream_rows({DType::PQ2_0, pq2.data(), n, k}, want.data(), 0, n);
  const RepackPolicy pol{true, WeightsMode::Stream};
  for (const auto& [type, bytes] : {std::pair{DType::PTQ1_0, &ptq1}, std::pair{DType::PQ2_0, &pq2}}) {
    Weight w;
    w.type = type, w.k = k, w.n = n, w.data = bytes->data(), w.nbytes = bytes->size();
    const auto rp = make_repack(w, pol, pool, Isa::Avx512);
    ASSERT_NE(rp, nullptr);
    EXPECT_EQ(rp->type, DType::PQ2_0);
    EXPECT_EQ(rp->layout, WeightLayout::Stream16);
    ASSERT_EQ(rp->bytes.size(), want.size());
    EXPECT_EQ(std::memcmp(rp->bytes.data(), want.data(), want.size()), 0) << dtype_name(type);
    EXPECT_EQ(make_repack(w, pol, pool, Isa::Avx2) != nullptr, type == DType::PTQ1_0);  // AVX2: file layout
  }
  setenv("BONSAI_CPU_WEIGHTS", "stream", 1);
  EXPECT_EQ(repack_policy_from_env().weights, WeightsMode::Stream);
  unsetenv("BONSAI_CPU_WEIGHTS");
}

TEST(StreamLayout, RejectsWhatItCannotHold) {
  const int64_t k = 256, n = 9;
  const auto file = random_matrix(DType::PQ2_0, n, k, 1);
  std::vector<uint8_t> s(static_cast<size_t>(stream_total_bytes(n, k)));
  EXPECT_THROW(pack_stream_rows({DType::PQ2_0, file.data(), n, k}, s.data(), 1, n),
               Error);  // not a group start
  EXPECT_THROW(pack_stream_rows({DType::PQ2_0, file.data(), n, k}, s.data(), 0, 3),
               Error);                                                  // ends inside a group
  pack_stream_rows({DType::PQ2_0, file.data(), n, k}, s.data(), 8, n);  // the last, partial one
  std::vector<uint8_t> g64(row_bytes(DType::Q2_0_G64, k) * n);
  EXPECT_THROW(pack_stream_rows({DType::Q2_0_G64, g64.data(), n, k}, s.data(), 0, n), Error);
  if (!isa_supported(Isa::Avx512)) return;
  ThreadPool pool(1);
  const auto x = gaussian(k, 2);
  PreparedAct act;
  prepare_act(x.data(), k, Precision::Faithful, act, layouts_for(DType::PQ2_0));  // no Lanes16 activation
  std::vector<float> y(n);
  const WeightView sv = stream_view(DType::PQ2_0, s.data(), n, k);
  EXPECT_THROW(matvec(sv, act, y.data(), pool, Isa::Avx512), Error);
  prepare_act(x.data(), k, Precision::Faithful, act, layouts_for(sv));
  EXPECT_THROW(matvec(sv, act, y.data(), pool, Isa::Avx2), Error);
}

}  // namespace
}  // namespace bonsai::cpu
