// The CUDA backend against the scalar reference (kernels/ref/ops.h).
//
// CudaTileLayout runs everywhere: it emulates the tensor-core matvec on the
// host, register by register, from the PTX fragment definitions of
// mma.m16n8k32, so the repack layout (kernels/cuda/tile_layout.h) is checked
// on machines without a GPU too. CudaOps / CudaModel need a device and skip
// with the reason when there is none. CudaBench runs only with
// BONSAI_CUDA_BENCH=1 (matvec microbenchmark, docs/performance.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "bonsai/formats.h"
#include "bonsai/model.h"
#include "bonsai/session.h"
#include "bonsai/synth.h"
#include "kernels/cuda/tile_layout.h"
#include "kernels/ref/ops.h"
#include "kernels/ref/ref_backend.h"
#if BONSAI_HAVE_CUDA
#include "cuda_backend_fixture.h"
#include "kernels/cuda/cuda_backend.h"
#endif

#include "raw_weight.h"
#include "temp_path.h"
#include "test_util.h"

namespace bonsai {
namespace {

using testing_util::randn;

using testing_util::HostWeight;

HostWeight make_weight(DType type, int64_t n, int64_t k, uint32_t seed) {
  HostWeight h;
  const size_t stride = row_bytes(type, static_cast<uint64_t>(k));
  h.bytes.resize(stride * n);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(0, type == DType::PTQ1_0 ? 2 : 3);  // 2-bit formats allow code 3
  std::uniform_real_distribution<float> scale(0.02f, 0.08f);
  std::normal_distribution<float> val(0.0f, 0.5f);
  for (int64_t r = 0; r < n; ++r) {
    uint8_t* row = h.bytes.data() + r * stride;
    switch (type) {
      case DType::PQ2_0:
      case DType::PTQ1_0:
      case DType::Q2_0_G128:
      case DType::Q2_0_G64: {
        const int g = type == DType::Q2_0_G64 ? 64 : 128;
        std::vector<uint8_t> codes(k);
        std::vector<float> scales(k / g);
        for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
        for (auto& s : scales) s = scale(rng);
        encode_ternary_row(type, codes.data(), scales.data(), row, k);
        break;
      }
      case DType::Q1_0:
        for (int64_t b = 0; b < k / 128; ++b) {
          const uint16_t d = f32_to_fp16(scale(rng));
          std::memcpy(row + b * 18, &d, 2);
          for (int j = 0; j < 16; ++j) row[b * 18 + 2 + j] = static_cast<uint8_t>(rng());
        }
        break;
      default: {
        std::vector<float> v(k);
        for (auto& x : v) x = val(rng);
        if (type == DType::Q8_0) {
          quantize_row_q8_0(v.data(), row, k);
        } else {
          for (int64_t c = 0; c < k; ++c) {
            if (type == DType::F32) std::memcpy(row + 4 * c, &v[c], 4);
            const uint16_t hbits = type == DType::F16 ? f32_to_fp16(v[c]) : f32_to_bf16(v[c]);
            if (type != DType::F32) std::memcpy(row + 2 * c, &hbits, 2);
          }
        }
      }
    }
  }
  h.w.name = std::string(dtype_name(type)) + " test weight";
  h.w.type = type;
  h.w.n = n;
  h.w.k = k;
  h.w.data = h.bytes.data();
  h.w.nbytes = h.bytes.size();
  return h;
}

std::vector<float> dequant(const Weight& w) {
  std::vector<float> out(static_cast<size_t>(w.n * w.k));
  for (int64_t r = 0; r < w.n; ++r)
    dequantize_row(w.type, w.data + r * w.row_stride(), out.data() + r * w.k, w.k);
  return out;
}

// Error bound of the int16-accurate activation path (tile_layout.h, kernels/cpu/matvec.h):
// each input carries |x - s·q| <= s/2 with s = amax/32639 over its 128-column block, so
// |Δy_r| <= Σ_j |W_rj|·s(j)/2; the float accumulation adds ~(k/64) roundings of Σ|W x|.
double ternary_bound(const std::vector<float>& W, const float* x, int64_t r, int64_t k) {
  double b = 0, mag = 0;
  for (int64_t c0 = 0; c0 < k; c0 += 128) {
    float amax = 0;
    for (int64_t c = c0; c < std::min(c0 + 128, k); ++c) amax = std::max(amax, std::fabs(x[c]));
    const double s = amax / 32639.0;
    for (int64_t c = c0; c < std::min(c0 + 128, k); ++c) {
      b += std::fabs(W[r * k + c]) * s / 2;
      mag += std::fabs(W[r * k + c] * x[c]);
    }
  }
  return 1.01 * b + 4e-7 * mag * (1 + k / 64.0);
}

// ---- host emulation of the tensor-core matvec ------------------------------------

// The kernel's view of one weight: chunks [tile][kblock] built with code_pos/scale_pos.
std::vector<uint8_t> host_repack(const Weight& w, int groups) {
  const int64_t kblocks = w.k / cuda::kBlockK, cb = cuda::chunk_bytes(groups);
  std::vector<uint8_t> out(static_cast<size_t>(cuda::tiled_bytes(w.n, w.k, groups)), 0);
  const int g = groups == 2 ? 64 : 128;
  std::vector<uint8_t> codes(w.k);
  std::vector<uint16_t> scales(w.k / g);
  for (int64_t r = 0; r < w.n; ++r) {
    decode_ternary_codes(w.type, w.data + r * w.row_stride(), codes.data(), scales.data(), w.k);
    for (int64_t c = 0; c < w.k; ++c) {
      uint8_t* chunk = out.data() + ((r / 16) * kblocks + c / 128) * cb;
      const cuda::CodePos p = cuda::code_pos(static_cast<int>(r % 16), static_cast<int>(c % 128));
      chunk[p.byte] |= static_cast<uint8_t>(codes[c] << p.shift);
      const int sub = groups == 2 ? static_cast<int>((c % 128) / 64) : 0;
      std::memcpy(chunk + cuda::scale_pos(static_cast<int>(r % 16), sub), &scales[c / g], 2);
    }
  }
  return out;
}

struct HostAct {
  std::vector<uint32_t> words;  // [kblocks][64]
  std::vector<float> s;         // [kblocks][2]
  std::vector<int> sumq;        // [kblocks][2]
};

HostAct host_quantize(const float* x, int64_t k) {
  HostAct a;
  const int64_t kblocks = k / 128;
  a.words.assign(kblocks * 64, 0);
  a.s.resize(kblocks * 2);
  a.sumq.resize(kblocks * 2);
  for (int64_t h = 0; h < k / 64; ++h) {
    float amax = 0;  // one scale per 128-column block, for both halves
    for (int j = 0; j < 128; ++j) amax = std::max(amax, std::fabs(x[(h / 2) * 128 + j]));
    a.s[h] = amax / cuda::kActQMax;
    int sum = 0;
    for (int j = 0; j < 64; ++j) {
      const int64_t c = h * 64 + j;
      const int q = amax > 0 ? static_cast<int>(std::nearbyint(x[c] * (cuda::kActQMax / amax))) : 0;
      sum += q;
      const int kk = static_cast<int>(c % 128), shift = 8 * (kk & 3);
      uint32_t* blk = a.words.data() + (c / 128) * 64;
      blk[cuda::act_word(kk)] |= static_cast<uint32_t>(cuda::act_hi(q) & 0xff) << shift;
      blk[32 + cuda::act_word(kk)] |= static_cast<uint32_t>(cuda::act_lo(q) & 0xff) << shift;
    }
    a.sumq[h] = sum;
  }
  return a;
}

// mma.m16n8k32 .u8 x .s8 from the fragments of the 32 lanes (PTX ISA, "Matrix Fragments
// for mma.m16n8k32"): A a0/a1 rows g/g+8 at k = 4·tig + b, a2/a3 the same rows at k + 16;
// B b0 at k = 4·tig + b, b1 at k + 16, column g; C c0,c1 row g, c2,c3 row g+8, columns 2·tig, +1.
void emulate_mma(const uint32_t a[32][4], const uint32_t b[32][2], int c[32][4]) {
  int A[16][32], B[32][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, tig = lane % 4;
    for (int byte = 0; byte < 4; ++byte) {
      auto u8 = [&](uint32_t v) { return static_cast<int>((v >> (8 * byte)) & 0xff); };
      auto s8 = [&](uint32_t v) { return static_cast<int>(static_cast<int8_t>((v >> (8 * byte)) & 0xff)); };
      A[g][4 * tig + byte] = u8(a[lane][0]);
      A[g + 8][4 * tig + byte] = u8(a[lane][1]);
      A[g][16 + 4 * tig + byte] = u8(a[lane][2]);
      A[g + 8][16 + 4 * tig + byte] = u8(a[lane][3]);
      B[4 * tig + byte][g] = s8(b[lane][0]);
      B[16 + 4 * tig + byte][g] = s8(b[lane][1]);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, tig = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), col = 2 * tig + i % 2;
      for (int kk = 0; kk < 32; ++kk) c[lane][i] += A[row][kk] * B[kk][col];
    }
  }
}

// One token, exactly the kernel's per-lane sequence (matvec.cu, matvec_tiled_kernel).
std::vector<float> emulate_matvec(const std::vector<uint8_t>& tiled, int groups, int64_t n, int64_t k,
                                  const HostAct& x) {
  const int64_t kblocks = k / 128, cb = cuda::chunk_bytes(groups);
  std::vector<float> y(n);
  for (int64_t tile = 0; tile < (n + 15) / 16; ++tile) {
    float acc[32][2] = {};
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      const uint8_t* chunk = tiled.data() + (tile * kblocks + kb) * cb;
      // G == 1: one integer accumulator over the block and one flush with Σq of both
      // halves; G == 2: a flush per 64-column half (its own weight scale and Σq).
      int c[32][4] = {};
      for (int sub = 0; sub < 2; ++sub) {
        if (groups == 2) std::memset(c, 0, sizeof(c));
        for (int st = 0; st < 2; ++st) {
          const int s = sub * 2 + st;
          uint32_t a[32][4], b[32][2];
          for (int lane = 0; lane < 32; ++lane) {
            uint32_t w;
            std::memcpy(&w, chunk + lane * 16 + s * 4, 4);
            for (int j = 0; j < 4; ++j) a[lane][j] = (w >> (2 * j)) & 0x03030303u;
            const int g = lane / 4, tig = lane % 4;
            const uint32_t* blk = x.words.data() + kb * 64 + (g == 1 ? 32 : 0);  // column 0 hi, 1 lo
            b[lane][0] = g < 2 ? blk[tig * 8 + 2 * s] : 0;
            b[lane][1] = g < 2 ? blk[tig * 8 + 2 * s + 1] : 0;
          }
          emulate_mma(a, b, c);
        }
        if (groups == 1 && sub == 0) continue;
        for (int lane = 0; lane < 32; lane += 4) {  // tig == 0 lanes hold token 0
          const int g = lane / 4;
          uint32_t dw;
          std::memcpy(&dw, chunk + cuda::kCodeBytes + (groups == 2 ? sub : 0) * 32 + g * 4, 4);
          const float dg = fp16_to_f32(static_cast<uint16_t>(dw & 0xffff));
          const float dg8 = fp16_to_f32(static_cast<uint16_t>(dw >> 16));
          const float sx = x.s[kb * 2 + sub];
          const int sq = groups == 1 ? x.sumq[kb * 2] + x.sumq[kb * 2 + 1] : x.sumq[kb * 2 + sub];
          acc[lane][0] += static_cast<float>(256 * c[lane][0] + c[lane][1] - sq) * (dg * sx);
          acc[lane][1] += static_cast<float>(256 * c[lane][2] + c[lane][3] - sq) * (dg8 * sx);
        }
      }
    }
    for (int g = 0; g < 8; ++g)
      for (int upper = 0; upper < 2; ++upper) {
        const int64_t r = tile * 16 + g + 8 * upper;
        if (r < n) y[r] = acc[4 * g][upper];
      }
  }
  return y;
}

TEST(CudaTileLayout, EmulatedTensorCoreMatvecMatchesReference) {
  for (DType type : {DType::PQ2_0, DType::PTQ1_0, DType::Q2_0_G64}) {
    const int64_t n = 37, k = 384;  // a partial tile; three 128-column blocks
    HostWeight hw = make_weight(type, n, k, 11);
    const int groups = type == DType::Q2_0_G64 ? 2 : 1;
    const auto tiled = host_repack(hw.w, groups);
    const auto x = randn(k, 12, 3.0f);
    const auto y = emulate_matvec(tiled, groups, n, k, host_quantize(x.data(), k));
    const auto W = dequant(hw.w);
    for (int64_t r = 0; r < n; ++r) {
      double exact = 0;
      for (int64_t c = 0; c < k; ++c) exact += static_cast<double>(W[r * k + c]) * x[c];
      EXPECT_NEAR(y[r], exact, ternary_bound(W, x.data(), r, k)) << dtype_name(type) << " row " << r;
    }
  }
}

TEST(CudaTileLayout, CodeAndActivationPositionsAreBijections) {
  std::vector<int> seen(cuda::kCodeBytes * 4, 0), words(32, 0);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 128; ++c) {
      const cuda::CodePos p = cuda::code_pos(r, c);
      ASSERT_LT(p.byte, cuda::kCodeBytes);
      ++seen[p.byte * 4 + p.shift / 2];
    }
  for (int c = 0; c < 128; c += 4) ++words[cuda::act_word(c)];
  for (int v : seen) EXPECT_EQ(v, 1);
  for (int v : words) EXPECT_EQ(v, 1);
  for (int q : {-32639, -32511, -129, -128, -1, 0, 1, 127, 128, 32639}) {
    EXPECT_EQ(256 * cuda::act_hi(q) + cuda::act_lo(q), q);
    EXPECT_LE(std::abs(cuda::act_hi(q)), 127);
    EXPECT_GE(cuda::act_lo(q), -128);
    EXPECT_LE(cuda::act_lo(q), 127);
  }
}

}  // namespace
}  // namespace bonsai

#if BONSAI_HAVE_CUDA
namespace bonsai {
namespace {

// Device memory through the backend's own interface (tests/cuda_backend_fixture.h).
class CudaOps : public testing::CudaBackendFixture {};

// |a - b| <= tol·max(1, |b|) elementwise.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], tol * std::max(1.0, std::fabs(static_cast<double>(b[i])))) << what << " at " << i;
}

TEST_F(CudaOps, MatmulEveryWeightTypeMatchesReference) {
  const DType types[] = {DType::PQ2_0, DType::PTQ1_0, DType::Q2_0_G128, DType::Q2_0_G64, DType::F32,
                         DType::F16,   DType::BF16,   DType::Q8_0,      DType::Q1_0};
  for (DType type : types)
    for (int64_t k : {384, 192}) {
      if (k % dtype_info(type).block_size) continue;
      const int64_t n = 77;
      HostWeight hw = make_weight(type, n, k, 21);
      prep(hw.w);
      const auto W = dequant(hw.w);
      const bool ternary = type == DType::PQ2_0 || type == DType::PTQ1_0 || type == DType::Q2_0_G128 ||
                           type == DType::Q2_0_G64;
      for (int t : {1, 3, 6}) {  // 6 crosses the kernel's 4-token groups
        const auto x = randn(static_cast<size_t>(t * k), 22 + t, 2.0f);
        float* dx = up(x);
        float* dy = be_->alloc(static_cast<size_t>(t * n));
        be_->matmul(hw.w, dx, dy, t);
        const auto y = down(dy, static_cast<size_t>(t * n));
        for (int i = 0; i < t; ++i)
          for (int64_t r = 0; r < n; ++r) {
            double exact = 0, mag = 0;
            for (int64_t c = 0; c < k; ++c) {
              exact += static_cast<double>(W[r * k + c]) * x[i * k + c];
              mag += std::fabs(static_cast<double>(W[r * k + c]) * x[i * k + c]);
            }
            // float weights: plain f32 dot products (k·ε·Σ|wx| worst case)
            const double bound = ternary ? ternary_bound(W, x.data() + i * k, r, k) : 1e-7 * k * mag + 1e-30;
            ASSERT_NEAR(y[i * n + r], exact, bound)
                << dtype_name(type) << " k " << k << " t " << t << " token " << i << " row " << r;
          }
        be_->release(dx);
        be_->release(dy);
      }
    }
}

TEST_F(CudaOps, MatmulMultiGroupsWeightsSharingTheInput) {
  const int64_t k = 640;
  HostWeight a = make_weight(DType::PQ2_0, 40, k, 31), b = make_weight(DType::PQ2_0, 33, k, 32),
             c = make_weight(DType::BF16, 7, k, 33), d = make_weight(DType::PQ2_0, 96, k, 34),
             e = make_weight(DType::Q2_0_G64, 50, k, 35);
  for (Weight* w : {&a.w, &b.w, &c.w, &d.w, &e.w}) prep(*w);
  const int t = 2;
  const auto x = randn(t * k, 36);
  float* dx = up(x);
  const Weight* ws[] = {&a.w, &b.w, &c.w, &d.w, &e.w};
  std::vector<float*> ys;
  for (const Weight* w : ws) ys.push_back(be_->alloc(static_cast<size_t>(t * w->n)));
  be_->matmul_multi(ws, dx, ys, t);
  for (size_t j = 0; j < 5; ++j) {
    const Weight& w = *ws[j];
    const auto W = dequant(w);
    const auto y = down(ys[j], static_cast<size_t>(t * w.n));
    for (int i = 0; i < t; ++i)
      for (int64_t r = 0; r < w.n; ++r) {
        double exact = 0, mag = 0;
        for (int64_t col = 0; col < k; ++col) {
          exact += static_cast<double>(W[r * k + col]) * x[i * k + col];
          mag += std::fabs(static_cast<double>(W[r * k + col]) * x[i * k + col]);
        }
        const double bound =
            w.type == DType::BF16 ? 1e-7 * k * mag : ternary_bound(W, x.data() + i * k, r, k);
        ASSERT_NEAR(y[i * w.n + r], exact, bound) << "weight " << j << " token " << i << " row " << r;
      }
  }
}

TEST_F(CudaOps, EmbedIsExactForEveryTableType) {
  for (DType type : {DType::PQ2_0, DType::PTQ1_0, DType::Q2_0_G64, DType::Q8_0, DType::F16, DType::BF16,
                     DType::F32, DType::Q1_0}) {
    HostWeight hw = make_weight(type, 45, 256, 41);
    prep(hw.w);
    const int32_t tokens[] = {0, 44, 17, 16, 31, 8};
    float* out = be_->alloc(6 * 256);
    be_->embed(hw.w, tokens, 6, out);
    std::vector<float> ref(6 * 256);
    ref::embed(hw.w, tokens, 6, ref.data());
    EXPECT_EQ(down(out, ref.size()), ref) << dtype_name(type);
    be_->release(out);
  }
}

TEST_F(CudaOps, NormsAndElementwiseMatchReference) {
  for (int64_t n : {1000, 5120}) {
    const int64_t rows = 3;
    auto x = randn(rows * n, 51, 4.0f), gain = randn(n, 52);
    float *dx = up(x), *dy = be_->alloc(rows * n);
    be_->rmsnorm(dx, vec(gain, n), dy, rows, n, 1e-6f);
    std::vector<float> ref(rows * n);
    ref::rmsnorm(x.data(), gain.data(), ref.data(), rows, n, 1e-6f);
    expect_close(down(dy, ref.size()), ref, 1e-5, "rmsnorm");  // reduction order: ~√n·ε relative
  }
  {
    const int64_t rows = 6, d = 128;
    auto o = randn(rows * d, 53), z = randn(rows * d, 54), w = randn(d, 55);
    float* dout = be_->alloc(rows * d);
    be_->gated_rmsnorm(up(o), up(z), vec(w, d), dout, rows, d, 1e-6f);
    std::vector<float> ref(rows * d);
    ref::gated_rmsnorm(o.data(), z.data(), w.data(), ref.data(), rows, d, 1e-6f);
    expect_close(down(dout, ref.size()), ref, 1e-5, "gated_rmsnorm");
  }
  const int64_t n = 1001;
  auto a = randn(n, 56, 3.0f), b = randn(n, 57, 3.0f);
  float *da = up(a), *db = up(b), *dy = be_->alloc(n);
  std::vector<float> ref(n);
  be_->add(da, db, dy, n);
  ref::add(a.data(), b.data(), ref.data(), n);
  EXPECT_EQ(down(dy, n), ref);
  be_->swiglu(da, db, dy, n);
  ref::swiglu(a.data(), b.data(), ref.data(), n);
  expect_close(down(dy, n), ref, 1e-6, "swiglu");  // expf: a few ulp
  be_->sigmoid_mul(da, db, dy, n);
  ref::sigmoid_mul(a.data(), b.data(), ref.data(), n);
  expect_close(down(dy, n), ref, 1e-6, "sigmoid_mul");

  auto h = randn(2 * 3 * 4 * 5, 58);
  float *dh = up(h), *dt = be_->alloc(h.size());
  std::vector<float> rt(h.size());
  be_->transpose_heads(dh, dt, 2, 3, 4, 5);
  ref::transpose_heads(h.data(), rt.data(), 2, 3, 4, 5);
  EXPECT_EQ(down(dt, h.size()), rt);
  std::vector<float> rp(8 * 5);
  be_->take_part(dh, dt, 8, 3, 2, 5);  // [8 rows][3 parts][5] -> part 2
  ref::take_part(h.data(), rp.data(), 8, 3, 2, 5);
  EXPECT_EQ(down(dt, rp.size()), rp);
}

TEST_F(CudaOps, HadamardIsBitIdenticalToReference) {
  for (int64_t block : {128, 1024}) {
    const int64_t k = block * 3, rows = 3;
    auto x = randn(k * rows, 61, 10.0f), s = randn(k, 62);
    for (auto& v : s) v = v < 0 ? -1.0f : 1.0f;
    float *dx = up(x), *ds = up(s), *dy = be_->alloc(k * rows);
    for (bool inverse : {false, true}) {
      std::vector<float> ref(k * rows);
      be_->hadamard(dx, ds, dy, rows, k, block, inverse);
      ref::hadamard(x.data(), s.data(), ref.data(), rows, k, block, inverse);
      EXPECT_EQ(down(dy, ref.size()), ref)
          << "block " << block << " inverse " << inverse;  // same butterflies
    }
  }
}

// The Hadamard site quantizes its output for the next ternary matvec; a write to that
// output in between must not leave the matvec reading the stale quantization.
TEST_F(CudaOps, FusedQuantizationFollowsWrites) {
  const int64_t k = 256, n = 64;
  HostWeight hw = make_weight(DType::PQ2_0, n, k, 71);
  prep(hw.w);
  const auto W = dequant(hw.w);
  auto x = randn(k, 72), delta = randn(k, 73);
  float *dx = up(x), *dd = up(delta), *dr = be_->alloc(k), *dy = be_->alloc(n);
  std::vector<float> r(k), r2(k);
  ref::hadamard(x.data(), nullptr, r.data(), 1, k, 128, false);
  ref::add(r.data(), delta.data(), r2.data(), k);
  be_->hadamard(dx, nullptr, dr, 1, k, 128, false);
  for (int pass = 0; pass < 2; ++pass) {
    const std::vector<float>& in = pass == 0 ? r : r2;
    be_->matmul(hw.w, dr, dy, 1);
    const auto y = down(dy, n);
    for (int64_t row = 0; row < n; ++row) {
      double exact = 0;
      for (int64_t c = 0; c < k; ++c) exact += static_cast<double>(W[row * k + c]) * in[c];
      ASSERT_NEAR(y[row], exact, ternary_bound(W, in.data(), row, k)) << "pass " << pass << " row " << row;
    }
    be_->add(dr, dd, dr, k);  // rewrites the quantized buffer's source
  }
}

// The fused sites against the composed reference ops; their quantized output then feeds
// a ternary matvec directly.
TEST_F(CudaOps, FusedSitesMatchComposedReference) {
  RefBackend ref_be;
  const int64_t n = 1024, rows = 3;
  auto x = randn(rows * n, 120), d = randn(rows * n, 121), g = randn(n, 122), s = randn(n, 123);
  for (auto& v : s) v = v < 0 ? -1.0f : 1.0f;
  Weight& gain = vec(g, n);
  HostWeight hw = make_weight(DType::PQ2_0, 48, n, 124);
  prep(hw.w);
  const auto W = dequant(hw.w);
  float *dx = up(x), *dd = up(d), *ds = up(s), *xo = be_->alloc(rows * n), *nr = be_->alloc(rows * n),
        *rot = be_->alloc(rows * n), *dy = be_->alloc(rows * 48);
  auto check_matvec = [&](const std::vector<float>& in, const char* what) {
    be_->matmul(hw.w, rot, dy, static_cast<int>(rows));
    const auto y = down(dy, rows * 48);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t r = 0; r < 48; ++r) {
        double exact = 0;
        for (int64_t c = 0; c < n; ++c) exact += static_cast<double>(W[r * n + c]) * in[i * n + c];
        ASSERT_NEAR(y[i * 48 + r], exact, ternary_bound(W, in.data() + i * n, r, n)) << what << " row " << r;
      }
  };
  for (int64_t block : {128, 1024})
    for (bool with_delta : {true, false}) {
      std::vector<float> xo2(rows * n), n2(rows * n), r2(rows * n);
      be_->residual_norm_site(dx, with_delta ? dd : nullptr, xo, gain, ds, block, nr, rot, rows, n, 1e-6f);
      ref_be.residual_norm_site(x.data(), with_delta ? d.data() : nullptr, xo2.data(), gain, s.data(), block,
                                n2.data(), r2.data(), rows, n, 1e-6f);
      EXPECT_EQ(down(xo, xo2.size()), xo2);                   // the same single add
      expect_close(down(nr, n2.size()), n2, 1e-5, "normed");  // parallel sum of squares
      expect_close(down(rot, r2.size()), r2, 1e-5,
                   "rotated");  // same butterflies; only the row scale differs
      check_matvec(down(rot, r2.size()), "residual_norm_site");
    }
  std::vector<float> a2(rows * n), r2(rows * n);
  be_->swiglu_site(dx, dd, nr, ds, 1024, rot, rows, n);
  ref_be.swiglu_site(x.data(), d.data(), a2.data(), s.data(), 1024, r2.data(), rows, n);
  expect_close(down(nr, a2.size()), a2, 1e-6, "swiglu act");
  expect_close(down(rot, r2.size()), r2, 1e-5, "swiglu rotated");
  check_matvec(down(rot, r2.size()), "swiglu_site");
  // Without act: the same rotated bit for bit (the kernels only skip act's store).
  const std::vector<float> with_act = down(rot, r2.size());
  be_->swiglu_site(dx, dd, nullptr, ds, 1024, rot, rows, n);
  EXPECT_EQ(down(rot, r2.size()), with_act);
}

TEST_F(CudaOps, RopeAndKvStoreMatchReference) {
  const int t = 3, n_head = 5, head_dim = 64, n_rot = 32, pos0 = 91;
  auto x = randn(static_cast<size_t>(t) * n_head * head_dim, 81);
  float* dx = up(x);
  be_->rope(dx, t, n_head, head_dim, n_rot, 1e7f, pos0);
  auto ref = x;
  ref::rope(ref.data(), t, n_head, head_dim, n_rot, 1e7f, pos0);
  // powf / sincosf differ from glibc by an ulp or two: θ = pos·base^(-2j/n) is off by
  // ~pos·2ε, so each rotated value by about |x|·100·2.4e-7.
  expect_close(down(dx, x.size()), ref, 1e-4, "rope");

  const int64_t width = 40;
  auto src = randn(t * width, 82);
  float* cache = be_->alloc(10 * width);
  be_->store_rows(cache, up(src), width, t, 4, KvType::F32);
  const auto c = down(cache, 10 * width);
  for (int64_t i = 0; i < 10 * width; ++i)
    EXPECT_EQ(c[i], i >= 4 * width && i < 7 * width ? src[i - 4 * width] : 0.0f) << i;
}

TEST_F(CudaOps, AttentionMatchesReference) {
  struct Case {
    int n_head, n_head_kv, head_dim, t, pos0;
  };
  for (const Case& cs :
       {Case{6, 2, 128, 1, 37}, Case{8, 1, 256, 5, 0}, Case{24, 4, 256, 1, 300}, Case{4, 4, 64, 7, 70},
        Case{24, 4, 256, 72, 97},    // the 27B's heads, a prefill batch (one split per token)
        Case{24, 4, 256, 1, 2},      // 27B decode, 32 splits: most of them and most warps empty
        Case{24, 4, 256, 1, 1500},   // 27B decode at a long context: ~47 positions per split
        Case{24, 4, 256, 1, 5000},   // one wave of splits (attention_decode_splits; 99 on the H200):
                                     // the block-wide merge
        Case{24, 4, 256, 1, 20000},  // the same count over 4x the positions
        Case{8, 1, 256, 1, 20000},   // one KV head: the wave capped at 256, one split per merge thread
        Case{6, 2, 128, 1, 69999},
        Case{12, 2, 128, 1, 777},    // group 6, head_dim 128: the batch kernel with half rows
        Case{12, 2, 128, 3, 41}}) {  // ... and a batch of tokens below the tensor cores' minimum  // 198
                                     // splits on the H200, merged by 128 threads (two or one each)
    const int n_ctx = cs.pos0 + cs.t + 3;
    const AttentionShape s{cs.n_head, cs.n_head_kv, cs.head_dim, 1.0f / std::sqrt(float(cs.head_dim))};
    // fp16 operands: CudaAttentionMma.MatchesFp16OperandReference (this case with BONSAI_CUDA_ATTN=0..2)
    if (CudaBackend::attention_on_tensor_cores(cs.t, s)) continue;
    const size_t kv = static_cast<size_t>(n_ctx) * cs.n_head_kv * cs.head_dim;
    auto q = randn(static_cast<size_t>(cs.t) * cs.n_head * cs.head_dim, 91, 2.0f);
    auto kc = randn(kv, 92), vc = randn(kv, 93);
    float* out = be_->alloc(q.size());
    be_->attention(up(q), up(kc), up(vc), out, cs.t, cs.pos0, s);
    std::vector<float> ref(q.size());
    ref::attention(q.data(), kc.data(), vc.data(), ref.data(), cs.t, cs.pos0, s);
    // online softmax merges partial sums in another order: a few ε of the O(1) outputs
    expect_close(down(out, ref.size()), ref, 2e-5, "attention head_dim " + std::to_string(cs.head_dim));
  }
}

TEST_F(CudaOps, GatedDeltaNetPiecesMatchReference) {
  const int t = 3, taps = 4;
  const int64_t channels = 300;
  auto x = randn(t * channels, 101), state = randn((taps - 1) * channels, 102),
       w = randn(taps * channels, 103);
  float *dstate = up(state), *dout = be_->alloc(t * channels);
  be_->ssm_conv(up(x), dstate, vec(w, taps, channels), dout, t, channels, taps);
  std::vector<float> ref(t * channels), rstate = state;
  ref::ssm_conv(x.data(), rstate.data(), w.data(), ref.data(), t, channels, taps);
  expect_close(down(dout, ref.size()), ref, 1e-6, "ssm_conv");
  EXPECT_EQ(down(dstate, rstate.size()), rstate);

  const int n_v = 6;
  auto alpha = randn(t * n_v, 104), beta_in = randn(t * n_v, 105), a = randn(n_v, 106), dt = randn(n_v, 107);
  float *dg = be_->alloc(t * n_v), *db = be_->alloc(t * n_v);
  be_->gdn_gates(up(alpha), up(beta_in), vec(a, n_v), vec(dt, n_v), dg, db, t, n_v);
  std::vector<float> rg(t * n_v), rb(t * n_v);
  ref::gdn_gates(alpha.data(), beta_in.data(), a.data(), dt.data(), rg.data(), rb.data(), t, n_v);
  expect_close(down(dg, rg.size()), rg, 1e-6, "gdn gates g");
  expect_close(down(db, rb.size()), rb, 1e-6, "gdn gates beta");

  for (const GdnShape& s : {GdnShape{2, 4, 128, 64, 1e-6f}, GdnShape{1, 3, 64, 96, 1e-6f}}) {
    const int64_t width = 2 * s.n_k * s.d_k + static_cast<int64_t>(s.n_v) * s.d_v;
    auto conv = randn(t * width, 108);
    auto g = randn(t * s.n_v, 109, 0.3f), beta = randn(t * s.n_v, 110);
    for (auto& v : g) v = -std::fabs(v);                    // decays in (0, 1]
    for (auto& v : beta) v = 1.0f / (1.0f + std::exp(-v));  // betas in (0, 1)
    auto st = randn(static_cast<size_t>(s.n_v) * s.d_k * s.d_v, 111, 0.1f);
    float *dst = up(st), *o = be_->alloc(static_cast<size_t>(t) * s.n_v * s.d_v);
    be_->gdn_recurrence(up(conv), up(g), up(beta), dst, o, t, s);
    std::vector<float> ro(static_cast<size_t>(t) * s.n_v * s.d_v), rst = st;
    ref::gdn_recurrence(conv.data(), g.data(), beta.data(), rst.data(), ro.data(), t, s);
    // sums over d_k in another order: ~√d_k·ε of the magnitudes involved
    expect_close(down(o, ro.size()), ro, 1e-5, "gdn output d_v " + std::to_string(s.d_v));
    expect_close(down(dst, rst.size()), rst, 1e-5, "gdn state d_v " + std::to_string(s.d_v));
  }
}

// The GDN core as the graph issues it (gates, delta rule, gated norm, head reorder): the
// backend runs it as one fused kernel; the result must match the reference ops in sequence.
TEST_F(CudaOps, FusedGdnChainMatchesReference) {
  const int t = 2;
  const GdnShape s{4, 12, 128, 128, 1e-6f};  // 27B-like head shape, 3 value heads per key head
  const int64_t width = 2 * s.n_k * s.d_k + static_cast<int64_t>(s.n_v) * s.d_v, dv_all = s.n_v * s.d_v;
  auto conv = randn(t * width, 130), alpha = randn(t * s.n_v, 131), beta_in = randn(t * s.n_v, 132);
  auto a = randn(s.n_v, 133), dt = randn(s.n_v, 134), z = randn(t * dv_all, 135), w = randn(s.d_v, 136);
  for (auto& v : a) v = -std::fabs(v);  // ssm_a < 0: decays below one
  auto st = randn(static_cast<size_t>(s.n_v) * s.d_k * s.d_v, 137, 0.1f);
  float *dg = be_->alloc(t * s.n_v), *db = be_->alloc(t * s.n_v), *dst = up(st), *o = be_->alloc(t * dv_all),
        *fo = be_->alloc(t * dv_all), *fog = be_->alloc(t * dv_all);
  be_->gdn_gates(up(alpha), up(beta_in), vec(a, s.n_v), vec(dt, s.n_v), dg, db, t, s.n_v);
  be_->gdn_recurrence(up(conv), dg, db, dst, o, t, s);
  be_->gated_rmsnorm(o, up(z), vec(w, s.d_v), fo, static_cast<int64_t>(t) * s.n_v, s.d_v, 1e-6f);
  be_->transpose_heads(fo, fog, t, s.n_v / s.n_k, s.n_k, s.d_v);
  std::vector<float> g(t * s.n_v), beta(t * s.n_v), ro(t * dv_all), rfo(t * dv_all), rfog(t * dv_all),
      rst = st;
  ref::gdn_gates(alpha.data(), beta_in.data(), a.data(), dt.data(), g.data(), beta.data(), t, s.n_v);
  ref::gdn_recurrence(conv.data(), g.data(), beta.data(), rst.data(), ro.data(), t, s);
  ref::gated_rmsnorm(ro.data(), z.data(), w.data(), rfo.data(), static_cast<int64_t>(t) * s.n_v, s.d_v,
                     1e-6f);
  ref::transpose_heads(rfo.data(), rfog.data(), t, s.n_v / s.n_k, s.n_k, s.d_v);
  // sums over d_k/d_v in another order, then a norm: a few 1e-6 of the O(1) outputs
  expect_close(down(fog, rfog.size()), rfog, 1e-5, "fused gdn output");
  expect_close(down(dst, rst.size()), rst, 1e-5, "fused gdn state");
}

// Whole model: eager first step, recorded second step, replays after that, and batched
// prefill, each against the reference. Faithful activations (~3e-5 per matvec) keep the
// logits at cosine > 0.9999 like the CPU fast path.
TEST(CudaModel, RecordedDecodeAndPrefillTrackReference) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  for (DType type : {DType::PQ2_0, DType::Q2_0_G64}) {
    SynthOptions o = synth_preset("tiny");
    o.with_vocab = false;
    o.seed = 9;
    o.weight_type = type;
    const auto path = bonsai::testing::unique_temp_path("cuda_vs_ref.gguf").string();
    write_synthetic_model(o, path);
    auto model = Model::load(path);
    const std::vector<int32_t> tokens = {3, 100, 7, 900, 42, 5, 77, 12};
    auto run = [&](const std::string& p, bool prefill) {
      SessionOptions so;
      so.n_ctx = 16;
      so.path = p;
      Session s(*model, so);
      std::vector<std::vector<float>> out;
      if (prefill) {
        std::vector<float> all(tokens.size() * model->config().n_vocab);
        s.prefill(tokens, all);
        for (size_t i = 0; i < tokens.size(); ++i)
          out.emplace_back(all.begin() + i * model->config().n_vocab,
                           all.begin() + (i + 1) * model->config().n_vocab);
      } else {
        for (int32_t t : tokens) {
          auto l = s.decode(t);
          out.emplace_back(l.begin(), l.end());
        }
      }
      return out;
    };
    const auto ref = run("ref", false);
    for (bool prefill : {false, true}) {
      const auto got = run("cuda", prefill);
      for (size_t i = 0; i < ref.size(); ++i) {
        double dot = 0, na = 0, nb = 0;
        for (size_t v = 0; v < ref[i].size(); ++v) {
          dot += double(got[i][v]) * ref[i][v];
          na += double(got[i][v]) * got[i][v];
          nb += double(ref[i][v]) * ref[i][v];
        }
        EXPECT_GT(dot / std::sqrt(na * nb), 0.9999)
            << dtype_name(type) << (prefill ? " prefill" : " decode") << " pos " << i;
      }
    }
    std::filesystem::remove(path);
  }
}

// Matvec bandwidth at the 27B shapes against the device copy rate (docs/performance.md).
// Each shape cycles through enough weight copies to defeat the L2 cache.
TEST(CudaBench, MatvecBandwidthAt27bShapes) {
  if (!std::getenv("BONSAI_CUDA_BENCH"))
    GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1 to run the matvec benchmark";
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  CudaBackend be(0);
  const double copy = be.copy_bandwidth(size_t{2} << 30, 20);
  std::printf("device %s: D2D copy %.0f GB/s (read + write)\n", be.device_name().c_str(), copy / 1e9);
  struct Shape {
    int64_t k, n;
  };
  // The unfused projections, then the launches a decode step runs (fused: GDN qkv + z, attention
  // q + k + v, FFN gate + up; out-projection 6144 x 5120 and FFN down 17408 x 5120 above).
  const Shape shapes[] = {{5120, 10240}, {5120, 6144},   {5120, 12288}, {5120, 1024},
                          {5120, 17408}, {5120, 248320}, {6144, 5120},  {17408, 5120},
                          {5120, 16384}, {5120, 14336},  {5120, 34816}};
  // The yardstick columns: a kernel that only streams the same bytes, chained the same way
  // (CudaBackend::read_chain_seconds), i.e. what one launch per call of that size reaches: with 4
  // blocks of 512 threads per SM (the next launch resident only as it drains, like the matvec) and
  // with 1 (the next launch can start beside it); "matvec of read" is against the first.
  std::printf(
      "| K | N | MB | us | GB/s | of copy | read us, 4 / 1 blocks per SM | read of copy | matvec of read |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    // Random PQ2_0 bytes (codes 0..3, scale 1/64): the kernel's speed does not depend on the values.
    HostWeight hw;
    hw.bytes.resize(static_cast<size_t>(row_bytes(DType::PQ2_0, sh.k)) * sh.n);
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < hw.bytes.size(); i += 34) {
      for (size_t j = 2; j < 34; j += 8) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        std::memcpy(&hw.bytes[i + j], &st, 8);
      }
      const uint16_t d = f32_to_fp16(1.0f / 64);
      std::memcpy(&hw.bytes[i], &d, 2);
    }
    hw.w.name = "bench";
    hw.w.type = DType::PQ2_0;
    hw.w.n = sh.n;
    hw.w.k = sh.k;
    hw.w.data = hw.bytes.data();
    hw.w.nbytes = hw.bytes.size();
    const size_t bytes = hw.bytes.size();
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{768} << 20) / bytes));
    std::vector<Weight> ws(copies, hw.w);
    for (Weight& w : ws) be.prepare(w);
    auto x = randn(sh.k, 8);
    float* dx = be.alloc(sh.k);
    be.from_host(dx, x.data(), x.size());
    float* dy = be.alloc(sh.n);
    const double sec = be.time_recorded(
        [&] {
          for (const Weight& w : ws) be.matmul(w, dx, dy, 1);
        },
        10);
    const double per = sec / copies, gbs = bytes / per;
    for (Weight& w : ws) be.unprepare(w);  // room for the yardstick's buffers
    const double rd = be.read_chain_seconds(bytes, copies, 10, 4),
                 rd1 = be.read_chain_seconds(bytes, copies, 10, 1);
    std::printf("| %lld | %lld | %.1f | %.1f | %.0f | %.0f %% | %.1f / %.1f | %.0f / %.0f %% | %.0f %% |\n",
                static_cast<long long>(sh.k), static_cast<long long>(sh.n), bytes / 1e6, per * 1e6, gbs / 1e9,
                100.0 * gbs / copy, rd * 1e6, rd1 * 1e6, rd > 0 ? 100.0 * bytes / rd / copy : 0.0,
                rd1 > 0 ? 100.0 * bytes / rd1 / copy : 0.0, rd > 0 ? 100.0 * rd / per : 0.0);
    be.release(dx);
    be.release(dy);
  }
}

}  // namespace
}  // namespace bonsai
#endif  // BONSAI_HAVE_CUDA
