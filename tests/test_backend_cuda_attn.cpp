// The tensor-core prefill attention (kernels/cuda/attention_mma.cu, BONSAI_CUDA_ATTN=3|4) against
// a double-precision reference on the kernel's own fp16-rounded q, k and v; the decode attention's
// split count across a recorded step's re-recording; the f16 KV cache: the fp32 kernels over it, and
// the decode kernel on the tensor cores (attention_dec_mma.cu). Needs a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "bonsai/formats.h"
#include "bonsai/model.h"
#include "bonsai/session.h"
#include "bonsai/synth.h"
#include "kernels/backend.h"
#include "kernels/ref/ops.h"
#if BONSAI_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.h"
#endif

#include "backend_io.h"
#include "temp_model.h"
#include "test_util.h"

#if BONSAI_HAVE_CUDA
namespace bonsai {
namespace {

using testing_util::randn;

float round_half(float x) { return fp16_to_f32(f32_to_fp16(x)); }

// Error bound per output (token i, head h, dim e), from the operand rounding the reference does
// not share. With q, k, v rounded like the kernel's, what remains is
//  (1) the fp32 scores: a D-term dot accumulated in fp32 on the tensor cores (truncating adds
//      allowed), |δs| <= D·2^-23·A with A = scale·Σ|q̃_e k̃_e| (largest over the positions);
//  (2) the softmax weights p rounded to fp16 for P·V (relative u = 2^-11, and absolute 2^-25
//      below 2^-14) while the sum l takes them unrounded;
//  (3) O accumulated in fp32 over n positions (and rescaled once per KV tile): within
//      n·2^-23·max_j |ṽ_je|.
// Each unnormalized weight is then off by a factor within exp(±δs)·(1 ± u), i.e. relative
// η = 2δs + u after normalization by the max score's own error, so the normalized weights move
// by at most 2η + u in sum, and o_e = Σ w_j ṽ_je by at most that times max_j |ṽ_je|; the
// subnormal weights add n·2^-25·max_j |ṽ_je| / l (l >= 1), and (3) n·2^-23·max_j |ṽ_je|.
struct RefRow {
  std::vector<double> o;    // [D]
  std::vector<double> tol;  // [D]
};

RefRow reference_row(const std::vector<float>& q, const std::vector<float>& kc, const std::vector<float>& vc,
                     int i, int h, int pos0, const AttentionShape& s) {
  const int d = s.head_dim, g = s.n_head / s.n_head_kv, hk = h / g, n = pos0 + i + 1;
  const int64_t kv = static_cast<int64_t>(s.n_head_kv) * d;
  const float* qh = q.data() + (static_cast<int64_t>(i) * s.n_head + h) * d;
  std::vector<double> sc(n);
  double mx = -INFINITY, a_max = 0;
  for (int p = 0; p < n; ++p) {
    const float* kp = kc.data() + p * kv + hk * d;
    double dot = 0, a = 0;
    for (int e = 0; e < d; ++e) {
      dot += double(qh[e]) * kp[e];
      a += std::fabs(double(qh[e]) * kp[e]);
    }
    sc[p] = dot * s.scale;
    a_max = std::max(a_max, a * s.scale);
    mx = std::max(mx, sc[p]);
  }
  double sum = 0;
  for (int p = 0; p < n; ++p) sum += sc[p] = std::exp(sc[p] - mx);
  const double u = std::ldexp(1.0, -11), ds = d * std::ldexp(1.0, -23) * a_max, eta = 2 * ds + u;
  RefRow r{std::vector<double>(d, 0.0), std::vector<double>(d, 0.0)};
  for (int p = 0; p < n; ++p) {
    const float* vp = vc.data() + p * kv + hk * d;
    for (int e = 0; e < d; ++e) {
      r.o[e] += sc[p] / sum * vp[e];
      r.tol[e] = std::max(r.tol[e], std::fabs(double(vp[e])));
    }
  }
  for (int e = 0; e < d; ++e) r.tol[e] *= 2 * eta + u + n * (std::ldexp(1.0, -25) + std::ldexp(1.0, -23));
  return r;
}

TEST(CudaAttentionMma, MatchesFp16OperandReference) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  CudaBackend be(0);
  struct Case {
    int n_head, n_head_kv, head_dim, t, pos0;
    float q_std;
    const char* what;
  };
  int ran = 0;
  for (const Case& cs : {
           Case{24, 4, 256, 8, 0, 2.0f, "27B heads, the smallest batch: row 0 sees one position"},
           Case{24, 4, 256, 12, 0, 2.0f, "27B, one partial token tile"},
           Case{24, 4, 256, 300, 0, 2.0f, "27B, 300 tokens: 19 token tiles, the last partial"},
           Case{24, 4, 256, 37, 211, 2.0f, "27B after 211 cached positions: partial KV tiles, 2 splits"},
           Case{24, 4, 256, 40, 890, 2.0f, "27B after 890: 7 splits of which 2 are empty"},
           Case{24, 4, 256, 64, 200, 40.0f, "large score range (scores ~ ±40): nearly one-hot rows"},
           Case{4, 1, 256, 130, 0, 2.0f, "the small fixture's heads (4 per KV head)"},
           Case{2, 1, 128, 100, 5, 2.0f, "the tiny fixture's heads (head_dim 128)"},
           Case{16, 2, 128, 50, 77, 2.0f, "8 query heads per KV head"},
       }) {
    const AttentionShape s{cs.n_head, cs.n_head_kv, cs.head_dim, 1.0f / std::sqrt(float(cs.head_dim))};
    if (!CudaBackend::attention_on_tensor_cores(cs.t, s)) continue;  // BONSAI_CUDA_ATTN=0..2
    ++ran;
    const int n_ctx = cs.pos0 + cs.t + 5;
    const size_t kv = static_cast<size_t>(n_ctx) * cs.n_head_kv * cs.head_dim;
    auto q = randn(static_cast<size_t>(cs.t) * cs.n_head * cs.head_dim, 191, cs.q_std);
    auto kc = randn(kv, 192), vc = randn(kv, 193);
    float *dq = be.alloc(q.size()), *dk = be.alloc(kv), *dv = be.alloc(kv), *out = be.alloc(q.size());
    be.from_host(dq, q.data(), q.size());
    be.from_host(dk, kc.data(), kv);
    be.from_host(dv, vc.data(), kv);
    be.attention(dq, dk, dv, out, cs.t, cs.pos0, s);
    std::vector<float> got(q.size());
    be.to_host(got.data(), out, got.size());
    for (auto* v : {&q, &kc, &vc})
      for (float& x : *v) x = round_half(x);
    double worst = 0;  // largest error / bound
    int bad = 0;
    for (int i = 0; i < cs.t; ++i)
      for (int h = 0; h < cs.n_head; ++h) {
        const RefRow r = reference_row(q, kc, vc, i, h, cs.pos0, s);
        for (int e = 0; e < cs.head_dim; ++e) {
          const float y = got[(static_cast<size_t>(i) * cs.n_head + h) * cs.head_dim + e];
          const double err = std::fabs(y - r.o[e]);
          worst = std::max(worst, err / r.tol[e]);
          if (!(err <= r.tol[e]) && bad++ < 5)
            ADD_FAILURE() << cs.what << ": token " << i << " head " << h << " dim " << e << ": " << y
                          << " vs " << r.o[e] << " (bound " << r.tol[e] << ")";
        }
      }
    EXPECT_EQ(bad, 0) << cs.what;
    std::printf("%s: largest error %.3g of the bound\n", cs.what, worst);
    for (float* p : {dq, dk, dv, out}) be.release(p);
  }
  if (ran == 0) GTEST_SKIP() << "BONSAI_CUDA_ATTN selects the fp32 split kernel for every batch";
}

// The decode split kernels called directly, so that the one scoring 4 positions together
// (batch = true: attention_split_batch_kernel, group 6) runs at every split count and context size,
// not only where attention_decode_batch picks it: warps with 0..3 positions in their last batch,
// one position per split, empty splits, head_dim 128, a few tokens, scores of tens (nearly one-hot
// rows, exp underflow), and q = 0 (every weight equal). Both kernels against the reference: fp32
// dots of head_dim terms and an online softmax, summed in another order than the reference's one
// pass: a few ε of the O(1) outputs (the bound of CudaOps.AttentionMatchesReference) where the
// scores are O(1). A score's rounding error grows with Σ|q·k| and moves its weight by that much
// relative, so the large-score case uses small integers for q (times 8) and k: every dot is exact
// in fp32 (|products| <= 32, sums <= 8192) and so is the scale 1/16, leaving the exps and sums.
TEST(CudaAttentionDecode, BatchKernelMatchesReference) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  CudaBackend be(0);
  struct Case {
    int n_head, n_head_kv, head_dim, t, pos0, splits;
    float q_scale;  // < 0: q and k small integers, q times -q_scale (exact scores)
  };
  for (const Case& cs : {Case{24, 4, 256, 1, 0, 32, 2.0f}, Case{24, 4, 256, 1, 2, 32, 2.0f},
                         Case{24, 4, 256, 1, 300, 32, 2.0f}, Case{24, 4, 256, 1, 4999, 99, 2.0f},
                         Case{24, 4, 256, 1, 70, 1, 2.0f}, Case{24, 4, 256, 1, 77, 3, 2.0f},
                         Case{12, 2, 128, 1, 777, 99, 2.0f}, Case{12, 2, 128, 3, 41, 7, 2.0f},
                         Case{24, 4, 256, 2, 1000, 5, 2.0f}, Case{24, 4, 256, 1, 3000, 13, -8.0f},
                         Case{24, 4, 256, 1, 500, 9, 0.0f}}) {
    const AttentionShape s{cs.n_head, cs.n_head_kv, cs.head_dim, 1.0f / std::sqrt(float(cs.head_dim))};
    const int n_ctx = cs.pos0 + cs.t;
    const size_t kv = static_cast<size_t>(n_ctx) * cs.n_head_kv * cs.head_dim;
    const size_t nq = static_cast<size_t>(cs.t) * cs.n_head * cs.head_dim;
    auto q = randn(nq, 291, std::fabs(cs.q_scale)), kc = randn(kv, 292), vc = randn(kv, 293);
    if (cs.q_scale < 0) {
      auto small_int = [](float x) { return std::clamp(std::round(x), -2.0f, 2.0f); };
      for (float& x : q) x = -cs.q_scale * small_int(x / -cs.q_scale);
      for (float& x : kc) x = small_int(x);
    }
    std::vector<float> want(nq);
    ref::attention(q.data(), kc.data(), vc.data(), want.data(), cs.t, cs.pos0, s);
    float *dq = be.alloc(nq), *dk = be.alloc(kv), *dv = be.alloc(kv), *out = be.alloc(nq);
    float* part = be.alloc(static_cast<size_t>(cs.t) * cs.n_head * cs.splits * (cs.head_dim + 2));
    be.from_host(dq, q.data(), nq);
    be.from_host(dk, kc.data(), kv);
    be.from_host(dv, vc.data(), kv);
    for (const bool batch : {true, false}) {
      be.zero(out, nq);
      be.sync();
      cuda::attention(dq, dk, dv, KvType::F32, out, part, cs.t, cs.pos0, nullptr, cs.splits, batch, cs.n_head,
                      cs.n_head_kv, cs.head_dim, s.scale, nullptr, 0, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> got(nq);
      be.to_host(got.data(), out, nq);
      int bad = 0;
      for (size_t i = 0; i < nq; ++i)
        if (!(std::fabs(got[i] - want[i]) <= 2e-5f * std::max(1.0f, std::fabs(want[i]))) && bad++ < 3)
          ADD_FAILURE() << "batch " << batch << ", heads " << cs.n_head << "/" << cs.n_head_kv << " x "
                        << cs.head_dim << ", t " << cs.t << ", pos0 " << cs.pos0 << ", splits " << cs.splits
                        << ", q x" << cs.q_scale << ": output " << i << " = " << got[i] << ", want "
                        << want[i];
    }
    for (float* p : {dq, dk, dv, out, part}) be.release(p);
  }
}

// A recorded decode step keeps the attention plan it was recorded with (attention_decode_plan: the
// split count and the kernel). When the context grows into another split count (32 -> one wave, 99
// on the H200, at 4096 positions with the default 64 per split) or into the kernel that scores 4
// positions together (attention_decode_batch: 16384 positions by default), replay_step declines,
// that step runs eagerly and a later one records again. Every step, replayed or not, matches the
// reference at its position (the fp32 split kernels; the merge adds the splits' partials in another
// order than the reference's one pass: a few ε).
TEST(CudaAttentionDecode, RecordedStepRecordsAgainWhenThePlanChanges) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const AttentionShape s{24, 4, 256, 1.0f / 16.0f};
  int from = 2, crossings = 0;
  for (; crossings < 2; ++crossings) {
    CudaBackend be(0);
    const int wave = cuda::attention_split_wave(s.n_head, s.n_head_kv, s.head_dim);
    int cross = from;  // the first context size from `from` whose plan differs from the one before
    while (cross < (1 << 20) &&
           cuda::attention_decode_plan(cross, wave) == cuda::attention_decode_plan(cross - 1, wave))
      ++cross;
    if (cross >= (1 << 20)) break;
    from = cross + 1;
    const bool grows =
        cuda::attention_decode_splits(cross, wave) != cuda::attention_decode_splits(cross - 1, wave);
    const int first = cross - 5, steps = 9, n_ctx = first + steps + 1;  // position first + 4: cross positions
    const size_t kv = static_cast<size_t>(n_ctx) * s.n_head_kv * s.head_dim;
    auto q = randn(static_cast<size_t>(s.n_head) * s.head_dim, 194, 2.0f);
    auto kc = randn(kv, 195), vc = randn(kv, 196);
    float *dq = be.alloc(q.size()), *dk = be.alloc(kv), *dv = be.alloc(kv), *out = be.alloc(q.size());
    be.from_host(dq, q.data(), q.size());
    be.from_host(dk, kc.data(), kv);
    be.from_host(dv, vc.data(), kv);
    const int32_t tok = 0;
    std::vector<int> replayed;
    for (int pos = first; pos < first + steps; ++pos) {
      const bool replay = be.replay_step(&tok, 1, pos);  // as Graph::compute runs a decode step
      if (replay) replayed.push_back(pos);
      if (!replay) {
        const bool capturing = be.begin_capture(&tok, 1, pos);
        be.attention(dq, dk, dv, out, 1, pos, s);
        if (capturing) be.end_capture();
      }
      std::vector<float> got(q.size()), want(q.size());
      be.to_host(got.data(), out, got.size());
      ref::attention(q.data(), kc.data(), vc.data(), want.data(), 1, pos, s);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 2e-5 * std::max(1.0f, std::fabs(want[i])))
            << "crossing at " << cross << ", position " << pos << " at " << i;
    }
    if (grows) {
      // Any growth of a buffer makes the backend warm up again (one eager step) before it records.
      // first: eager, the partials' buffer allocated; + 1: eager; + 2: recorded; + 3: replayed;
      // + 4 (`cross` positions): declined, eager, the buffer grows for more splits; + 5: eager; + 6:
      // recorded with them; + 7, + 8: replayed.
      EXPECT_EQ(replayed, (std::vector<int>{first + 3, first + 7, first + 8})) << "crossing at " << cross;
    } else {
      // The kernel alone changes: the step at `cross` positions is not a replay of the old recording,
      // and the new plan is recorded and replayed afterwards.
      EXPECT_TRUE(std::find(replayed.begin(), replayed.end(), first + 4) == replayed.end()) << cross;
      EXPECT_TRUE(std::find(replayed.begin(), replayed.end(), first + 3) != replayed.end()) << cross;
      EXPECT_TRUE(std::find(replayed.begin(), replayed.end(), first + 8) != replayed.end()) << cross;
    }
    for (float* p : {dq, dk, dv, out}) be.release(p);
  }
  ASSERT_GE(crossings, 1) << "one plan for every context (BONSAI_CUDA_ATTN_DEC_MAX=32?)";
  std::printf("%d plan crossings checked\n", crossings);
}

// An f16 cache's rows on the device: the halves of x, two per float slot (the count is even here).
float* upload_halves(CudaBackend& be, const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_fp16(x[i]);
  std::vector<float> bits(x.size() / 2);
  std::memcpy(bits.data(), h.data(), bits.size() * sizeof(float));
  float* p = be.alloc(bits.size());
  be.from_host(p, bits.data(), bits.size());
  return p;
}

// got [n_head][D] (one token at pos0) against the double reference on the tensor cores' operands
// (q as the kernel rounds it, k and v the cache's halves: qr, kr, vr), within reference_row's bound;
// returns the largest error / bound.
double check_fp16_operand_rows(const std::vector<float>& got, const std::vector<float>& qr,
                               const std::vector<float>& kr, const std::vector<float>& vr, int pos0,
                               const AttentionShape& s, const std::string& what) {
  double worst = 0;
  int bad = 0;
  for (int h = 0; h < s.n_head; ++h) {
    const RefRow r = reference_row(qr, kr, vr, 0, h, pos0, s);
    for (int e = 0; e < s.head_dim; ++e) {
      const float y = got[static_cast<size_t>(h) * s.head_dim + e];
      const double err = std::fabs(y - r.o[e]);
      worst = std::max(worst, err / r.tol[e]);
      if (!(err <= r.tol[e]) && bad++ < 5)
        ADD_FAILURE() << what << ": head " << h << " dim " << e << ": " << y << " vs " << r.o[e] << " (bound "
                      << r.tol[e] << ")";
    }
  }
  return worst;
}

// An f16 KV cache: store_rows rounds as f32_to_fp16 (bit for bit), and the fp32 attention kernels
// over it equal the same kernels over an f32 cache holding the rounded rows bit for bit: the decode
// split kernels (the ring kernel and the one scoring 4 positions together, called directly at several
// split counts) widen each half exactly where a lane reads it, and the tensor cores' prefill batch
// (through the backend) copies the halves where the f32 path rounds to the same ones. The split
// kernels also against the reference over the rounded rows with CudaOps.AttentionMatchesReference's bound
// (test_backend_cuda.cpp). A decode step over an f16 cache past BONSAI_CUDA_ATTN_DEC_MMA_MIN takes the
// tensor cores' decode kernel instead, other numerics: CudaAttentionDecodeMma below.
TEST(CudaAttentionF16Cache, EqualsTheF32PathOverRoundedRows) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  CudaBackend be(0);
  auto up = [&](const std::vector<float>& v) { return testing_util::upload(be, v); };
  auto down = [&](const float* p, size_t n) { return testing_util::download(be, p, n); };
  struct Case {
    int n_head, n_head_kv, head_dim, t, pos0, splits;
  };
  for (const Case& cs :
       {Case{6, 2, 128, 1, 37, 32}, Case{24, 4, 256, 1, 1500, 32}, Case{24, 4, 256, 1, 20000, 99},
        Case{12, 2, 128, 1, 777, 99}, Case{12, 2, 128, 3, 41, 7}, Case{24, 4, 256, 72, 97, 0}}) {
    const int n_ctx = cs.pos0 + cs.t + 3;
    const int64_t KV = static_cast<int64_t>(cs.n_head_kv) * cs.head_dim;
    const size_t n = static_cast<size_t>(n_ctx) * KV,
                 nq = static_cast<size_t>(cs.t) * cs.n_head * cs.head_dim;
    const AttentionShape s{cs.n_head, cs.n_head_kv, cs.head_dim, 1.0f / std::sqrt(float(cs.head_dim))};
    AttentionShape h = s;
    h.kv = KvType::F16;
    auto q = randn(nq, 94, 2.0f);
    auto kc = randn(n, 95), vc = randn(n, 96);
    float *dkh = be.alloc((n + 1) / 2), *dvh = be.alloc((n + 1) / 2);
    be.store_rows(dkh, up(kc), KV, n_ctx, 0, KvType::F16);
    be.store_rows(dvh, up(vc), KV, n_ctx, 0, KvType::F16);
    std::vector<uint16_t> kh(n), vh(n);
    const auto kraw = down(dkh, n / 2), vraw = down(dvh, n / 2);  // n is even: KV is
    std::memcpy(kh.data(), kraw.data(), n * 2);
    std::memcpy(vh.data(), vraw.data(), n * 2);
    std::vector<float> kr(n), vr(n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(kh[i], f32_to_fp16(kc[i])) << i;
      ASSERT_EQ(vh[i], f32_to_fp16(vc[i])) << i;
      kr[i] = fp16_to_f32(kh[i]);
      vr[i] = fp16_to_f32(vh[i]);
    }
    float *dq = up(q), *dkr = up(kr), *dvr = up(vr), *o16 = be.alloc(nq), *o32 = be.alloc(nq);
    const std::string what = std::to_string(cs.t) + " tokens at " + std::to_string(cs.pos0);
    if (cs.splits == 0) {  // the tensor cores' prefill, through the backend
      ASSERT_TRUE(CudaBackend::attention_on_tensor_cores(cs.t, s)) << what;
      be.attention(dq, dkh, dvh, o16, cs.t, cs.pos0, h);
      be.attention(dq, dkr, dvr, o32, cs.t, cs.pos0, s);
      EXPECT_EQ(down(o16, nq), down(o32, nq)) << what;
      continue;
    }
    std::vector<float> ref(nq);
    ref::attention(q.data(), kr.data(), vr.data(), ref.data(), cs.t, cs.pos0, s);
    float* part = be.alloc(nq * cs.splits * (cs.head_dim + 2) / cs.head_dim);
    for (const bool batch : {false, true}) {
      be.sync();
      cuda::attention(dq, dkh, dvh, KvType::F16, o16, part, cs.t, cs.pos0, nullptr, cs.splits, batch,
                      cs.n_head, cs.n_head_kv, cs.head_dim, s.scale, nullptr, 0, nullptr);
      cuda::attention(dq, dkr, dvr, KvType::F32, o32, part, cs.t, cs.pos0, nullptr, cs.splits, batch,
                      cs.n_head, cs.n_head_kv, cs.head_dim, s.scale, nullptr, 0, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto a = down(o16, nq);
      EXPECT_EQ(a, down(o32, nq)) << what << ", batch " << batch;
      for (size_t i = 0; i < nq; ++i)  // AttentionMatchesReference's bound: |a - ref| <= 2e-5·max(1, |ref|)
        ASSERT_NEAR(a[i], ref[i], 2e-5 * std::max(1.0, std::fabs(static_cast<double>(ref[i]))))
            << "f16 cache, " << what << (batch ? ", batch kernel" : ", ring kernel") << " at " << i;
    }
  }
}

// The tensor cores' decode kernel over an f16 cache (kernels/cuda/attention_dec_mma.cu) called
// directly at split counts and sizes the plan never picks (one split, empty splits and empty warps,
// positions ending mid-tile and mid-warp, 8 query heads per KV head, head_dim 128, the large-score
// rows), merged by attention_merge, against the double reference on its own fp16 operands with
// CudaAttentionMma's bound (reference_row: the same numerics).
TEST(CudaAttentionDecodeMma, MatchesFp16OperandReference) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  CudaBackend be(0);
  struct Case {
    int n_head, n_head_kv, head_dim, pos0, splits;
    float q_std;
  };
  for (const Case& cs :
       {Case{24, 4, 256, 0, 1, 2.0f}, Case{24, 4, 256, 15, 3, 2.0f}, Case{24, 4, 256, 64, 1, 2.0f},
        Case{24, 4, 256, 1000, 33, 2.0f}, Case{24, 4, 256, 5000, 99, 2.0f}, Case{24, 4, 256, 3000, 7, 40.0f},
        Case{16, 2, 128, 777, 5, 2.0f}, Case{4, 1, 256, 200, 2, 2.0f}, Case{12, 2, 128, 4500, 33, 2.0f}}) {
    const AttentionShape s{cs.n_head, cs.n_head_kv, cs.head_dim, 1.0f / std::sqrt(float(cs.head_dim))};
    ASSERT_TRUE(cuda::attention_decode_mma_shape(cs.n_head, cs.n_head_kv, cs.head_dim));
    if (cuda::attention_decode_mma_wave(cs.n_head, cs.n_head_kv, cs.head_dim) == 0)
      GTEST_SKIP() << "the decode kernel does not fit this device";
    const int n_ctx = cs.pos0 + 1;
    const size_t kv = static_cast<size_t>(n_ctx) * cs.n_head_kv * cs.head_dim, nq = cs.n_head * cs.head_dim;
    auto q = randn(nq, 391, cs.q_std), kc = randn(kv, 392), vc = randn(kv, 393);
    float *dq = be.alloc(nq), *out = be.alloc(nq), *dk = upload_halves(be, kc), *dv = upload_halves(be, vc);
    float* part = be.alloc(static_cast<size_t>(cs.n_head) * cs.splits * (cs.head_dim + 2));
    be.from_host(dq, q.data(), nq);
    be.sync();
    cuda::attention_decode_mma(dq, dk, dv, part, cs.pos0, nullptr, cs.splits, cs.n_head, cs.n_head_kv,
                               cs.head_dim, s.scale, nullptr);
    cuda::attention_merge(part, out, 1, cs.n_head, cs.splits, cs.head_dim, nullptr, 0, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got(nq);
    be.to_host(got.data(), out, nq);
    for (auto* v : {&q, &kc, &vc})
      for (float& x : *v) x = round_half(x);
    const std::string what = "heads " + std::to_string(cs.n_head) + "/" + std::to_string(cs.n_head_kv) +
                             " x " + std::to_string(cs.head_dim) + " at " + std::to_string(cs.pos0) + ", " +
                             std::to_string(cs.splits) + " splits, q x" + std::to_string(cs.q_std);
    const double worst = check_fp16_operand_rows(got, q, kc, vc, cs.pos0, s, what);
    std::printf("%s: largest error %.3g of the bound\n", what.c_str(), worst);
    for (float* p : {dq, dk, dv, out, part}) be.release(p);
  }
}

// Through the backend with an f16 cache, eagerly and as recorded steps across the crossing into the
// decode kernel on the tensor cores (attention_decode_mma_on: 1024 positions by default, where the
// plan changes kernel and split count): the step at the crossing runs eagerly and a later one records
// again; before it the split kernels match the f32 reference over the rounded rows (2e-5), after it
// the kernel matches the fp16-operand reference within its bound.
TEST(CudaAttentionDecodeMma, RecordedStepsCrossIntoTheTensorCores) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  AttentionShape s{24, 4, 256, 1.0f / 16.0f};
  s.kv = KvType::F16;
  const int wave = cuda::attention_split_wave(s.n_head, s.n_head_kv, s.head_dim, KvType::F16);
  const int mma_wave = cuda::attention_decode_mma_wave(s.n_head, s.n_head_kv, s.head_dim);
  if (mma_wave == 0) GTEST_SKIP() << "the decode kernel does not fit this device";
  int cross = 2;
  while (cross < (1 << 20) && !cuda::attention_decode_mma_on(cross, mma_wave)) ++cross;
  if (cross >= (1 << 20)) GTEST_SKIP() << "BONSAI_CUDA_ATTN_DEC_MMA=0";
  ASSERT_NE(cuda::attention_decode_plan(cross, wave, mma_wave),
            cuda::attention_decode_plan(cross - 1, wave, mma_wave));
  CudaBackend be(0);
  const int first = cross - 5, steps = 9, n_ctx = first + steps + 1;
  const size_t kv = static_cast<size_t>(n_ctx) * s.n_head_kv * s.head_dim, nq = s.n_head * s.head_dim;
  auto q = randn(nq, 394, 2.0f), kc = randn(kv, 395), vc = randn(kv, 396);
  float *dq = be.alloc(nq), *out = be.alloc(nq), *dk = upload_halves(be, kc), *dv = upload_halves(be, vc);
  be.from_host(dq, q.data(), nq);
  for (auto* v : {&kc, &vc})
    for (float& x : *v) x = round_half(x);
  auto qr = q;
  for (float& x : qr) x = round_half(x);
  const AttentionShape s32{s.n_head, s.n_head_kv, s.head_dim, s.scale};
  const int32_t tok = 0;
  std::vector<int> replayed;
  for (int pos = first; pos < first + steps; ++pos) {
    const bool replay = be.replay_step(&tok, 1, pos);
    if (replay) replayed.push_back(pos);
    if (!replay) {
      const bool capturing = be.begin_capture(&tok, 1, pos);
      be.attention(dq, dk, dv, out, 1, pos, s);
      if (capturing) be.end_capture();
    }
    std::vector<float> got(nq);
    be.to_host(got.data(), out, nq);
    const std::string what =
        "position " + std::to_string(pos) + " (crossing at " + std::to_string(cross) + ")";
    if (pos + 1 >= cross) {
      check_fp16_operand_rows(got, qr, kc, vc, pos, s32, what);
    } else {
      std::vector<float> want(nq);
      ref::attention(q.data(), kc.data(), vc.data(), want.data(), 1, pos, s32);
      for (size_t i = 0; i < nq; ++i)
        ASSERT_NEAR(got[i], want[i], 2e-5 * std::max(1.0f, std::fabs(want[i]))) << what << " at " << i;
    }
  }
  // first: eager; + 1: eager; + 2: recorded; + 3: replayed; + 4 (`cross` positions): declined, eager (the
  // partials' buffer may grow); then recorded and replayed again by the end.
  EXPECT_TRUE(std::find(replayed.begin(), replayed.end(), first + 3) != replayed.end());
  EXPECT_TRUE(std::find(replayed.begin(), replayed.end(), first + 4) == replayed.end());
  EXPECT_TRUE(std::find(replayed.begin(), replayed.end(), first + 8) != replayed.end());
  for (float* p : {dq, dk, dv, out}) be.release(p);
}

// A CUDA session that does not choose a cache type gets the backend's default, f16 (as llama.cpp),
// half the f32 cache's bytes; an explicit f32 is honoured. The logits of the two stay within the
// rounding's reach of each other: 0.9999, the bound of
// ReferenceModel.F16CacheWalkPrefillSnapshotAndDistanceToF32.
TEST(CudaSessionCache, DefaultsToF16AndHonoursAnExplicitF32) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const bonsai::testing::TempSynthModel tm(bonsai::testing::tiny_no_vocab(21), "cuda_kv_default.gguf");
  const Model& model = *tm.model;
  SessionOptions so;
  so.n_ctx = 32;
  so.path = "cuda";
  Session def(model, so);
  so.kv_type = KvType::F32;
  Session f32(model, so);
  EXPECT_EQ(def.kv_type(), KvType::F16);
  EXPECT_EQ(f32.kv_type(), KvType::F32);
  EXPECT_EQ(2 * def.kv_cache_bytes(), f32.kv_cache_bytes());
  for (int32_t t : {3, 17, 5, 40, 9, 2, 77, 11}) {
    const auto a = def.decode(t);
    const std::vector<float> av(a.begin(), a.end());
    const auto b = f32.decode(t);
    double dot = 0, na = 0, nb = 0;
    for (size_t i = 0; i < av.size(); ++i) {
      dot += double(av[i]) * b[i];
      na += double(av[i]) * av[i];
      nb += double(b[i]) * b[i];
    }
    EXPECT_GE(dot / std::sqrt(na * nb), 0.9999) << "token " << t;
  }
}

}  // namespace
}  // namespace bonsai
#endif  // BONSAI_HAVE_CUDA
