// The CUDA backend's mixer sites (Backend::attention_site, Backend::gdn_site) against the
// reference backend's composition of the same ops. Need a device; skip with the reason
// when there is none (like CudaOps in test_backend_cuda.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bonsai/formats.h"
#include "kernels/ref/ref_backend.h"
#if BONSAI_HAVE_CUDA
#include "cuda_backend_fixture.h"
#include "kernels/cuda/cuda_backend.h"
#endif

#include "gdn_site_util.h"
#include "raw_weight.h"
#include "test_util.h"

#if BONSAI_HAVE_CUDA
namespace bonsai {
namespace {

using testing_util::HostWeight;
using testing_util::randn;
using testing_util::raw_weight;

// |a - b| <= tol·max(1, |b|) elementwise.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], tol * std::max(1.0, std::fabs(static_cast<double>(b[i])))) << what << " at " << i;
}

class CudaSites : public testing::CudaBackendFixture {};

// The attention site (norms, RoPE, KV store, attention, gate: three launches) against the
// reference backend's composition of the same ops, twice in a row (the merge hand-off
// counters must be left at zero), at odd head counts, partial RoPE and batches.
// With an f16 cache (kv = F16) the prep rounds the keys it computed and the values it copies: the
// values are the reference's halves bit for bit; a key the device computed ~1e-5 apart from the
// reference's may round to the neighbouring half (one f16 ulp, 2^-10 of it), so the caches are
// compared as floats within 1e-4 + 2^-10 relative, and the outputs within 1e-3: a flipped key element
// (~1 % of them) moves its score by |q_e|·2^-10·|k_e|/√d ≈ 1e-4 (q_e, k_e O(1) after the norms).
TEST_F(CudaSites, AttentionSiteMatchesComposedReference) {
  struct Case {
    int n_head, n_head_kv, head_dim, n_rot, t, pos0;
  };
  RefBackend ref_be;
  for (const KvType kvt : {KvType::F32, KvType::F16})
    for (const Case& cs : {Case{6, 2, 128, 32, 1, 37}, Case{24, 4, 256, 64, 1, 300}, Case{3, 3, 64, 64, 5, 2},
                           Case{10, 2, 96, 20, 3, 0}}) {
      const bool f16 = kvt == KvType::F16;
      const int n_ctx = cs.pos0 + 2 * cs.t + 3;
      const int64_t HD = static_cast<int64_t>(cs.n_head) * cs.head_dim, KV = cs.n_head_kv * cs.head_dim;
      AttentionShape shape{cs.n_head, cs.n_head_kv, cs.head_dim, 1.0f / std::sqrt(float(cs.head_dim))};
      shape.kv = kvt;
      auto kc = randn(n_ctx * KV, 140), vc = randn(n_ctx * KV, 141);
      // the host caches of the reference: f32, or the same rows as halves
      std::vector<uint16_t> kh(kc.size()), vh(vc.size());
      for (size_t e = 0; e < kc.size(); ++e) {
        kh[e] = f32_to_fp16(kc[e]);
        vh[e] = f32_to_fp16(vc[e]);
      }
      // the device caches: floats, or the halves' bits two per float slot (KV is even)
      auto bits = [](const std::vector<uint16_t>& x) {
        std::vector<float> f(x.size() / 2);
        std::memcpy(f.data(), x.data(), f.size() * sizeof(float));
        return f;
      };
      const size_t slots = f16 ? kc.size() / 2 : kc.size();
      float *dkc = f16 ? up(bits(kh)) : up(kc), *dvc = f16 ? up(bits(vh)) : up(vc);
      // a cache's elements as floats (device or host)
      auto widen = [&](const float* p, bool device) {
        std::vector<float> raw = device ? down(p, slots) : std::vector<float>(p, p + slots);
        if (!f16) return raw;
        std::vector<uint16_t> hb(kc.size());
        std::memcpy(hb.data(), raw.data(), hb.size() * 2);
        std::vector<float> w(hb.size());
        for (size_t e = 0; e < w.size(); ++e) w[e] = fp16_to_f32(hb[e]);
        return w;
      };
      auto qn = randn(cs.head_dim, 142, 0.3f), kn = randn(cs.head_dim, 143, 0.3f);
      for (auto& g : qn) g += 1.0f;
      for (auto& g : kn) g += 1.0f;
      Weight &wq = vec(qn, cs.head_dim), &wk = vec(kn, cs.head_dim);
      std::vector<float> rq(cs.t * HD), rgate(cs.t * HD), rout(cs.t * HD);
      float *dq = be_->alloc(cs.t * HD), *dgate = be_->alloc(cs.t * HD), *dout = be_->alloc(cs.t * HD);
      for (int step = 0; step < 2; ++step) {
        const int pos0 = cs.pos0 + step * cs.t;
        auto qf = randn(2 * cs.t * HD, 144 + step, 2.0f), k = randn(cs.t * KV, 146 + step),
             v = randn(cs.t * KV, 148 + step);
        Backend::AttentionSite site;
        site.eps = 1e-6f;
        site.n_rot = cs.n_rot;
        site.rope_base = 1e7f;
        site.shape = shape;
        site.q_norm = &wq;
        site.k_norm = &wk;
        site.qf = up(qf);
        site.k = up(k);
        site.v = up(v);
        site.k_cache = dkc;
        site.v_cache = dvc;
        site.q = dq;
        site.qgate = dgate;
        site.out = dout;
        be_->attention_site(site, cs.t, pos0);
        site.qf = qf.data();
        site.k = k.data();
        site.v = v.data();
        site.k_cache = f16 ? static_cast<void*>(kh.data()) : kc.data();
        site.v_cache = f16 ? static_cast<void*>(vh.data()) : vc.data();
        site.q = rq.data();
        site.qgate = rgate.data();
        site.out = rout.data();
        ref_be.attention_site(site, cs.t, pos0);
        const std::string what = std::string(f16 ? "f16" : "f32") + " attention site, head_dim " +
                                 std::to_string(cs.head_dim) + " step " + std::to_string(step);
        const auto dk = widen(dkc, true),
                   rk = widen(f16 ? reinterpret_cast<const float*>(kh.data()) : kc.data(), false);
        // RoPE (powf/sincosf: ~1e-5 relative at these positions, see RopeAndKvStore) and a norm
        // feed the keys; the softmax sums run in another order: outputs are O(1), 1e-4.
        if (f16) {
          for (size_t e = 0; e < dk.size(); ++e)
            ASSERT_LE(std::fabs(dk[e] - rk[e]), 1e-4 + 0x1p-10 * std::fabs(rk[e]))
                << what << " k cache " << e;
          EXPECT_EQ(down(dvc, slots), bits(vh)) << what;
          expect_close(down(dout, rout.size()), rout, 1e-3, what + " out");
        } else {
          expect_close(dk, rk, 1e-4, what + " k cache");
          EXPECT_EQ(down(dvc, vc.size()), vc) << what;
          expect_close(down(dout, rout.size()), rout, 1e-4, what + " out");
        }
      }
    }
}

// The GDN site (conv, alpha/beta rows, gates, delta rule, gated norm, head order: one launch)
// against the reference composition: decode and few-token batches (one kernel), longer
// batches (the prefill walk and the pipeline around it, gdn_pipe.cu), F32/F16/BF16 alpha/beta,
// tiled and grouped output.
// Every site runs twice, so the conv-state hand-off counters must come back to zero.
TEST_F(CudaSites, GdnSiteMatchesComposedReference) {
  struct Case {
    GdnShape s;
    int t, embd;
    DType ab;
    bool grouped;
  };
  RefBackend ref_be;
  for (const Case& cs : {Case{{4, 12, 128, 128, 1e-6f}, 1, 320, DType::BF16, true},
                         Case{{4, 12, 128, 128, 1e-6f}, 3, 256, DType::F32, false},
                         Case{{2, 4, 64, 96, 1e-6f}, 7, 200, DType::BF16, true},
                         Case{{4, 12, 128, 128, 1e-6f}, 20, 256, DType::BF16, true},
                         Case{{1, 3, 32, 64, 1e-6f}, 1, 96, DType::F16, false},
                         // the prefill pipeline around its thresholds: 16 tokens (alpha/beta rows on
                         // the tensor cores), conv tiles of 16, gated norm tiled and grouped
                         Case{{4, 12, 128, 128, 1e-6f}, 16, 256, DType::F32, false},
                         Case{{4, 8, 128, 128, 1e-6f}, 17, 128, DType::BF16, true},
                         Case{{2, 6, 64, 64, 1e-6f}, 33, 160, DType::F16, true}}) {
    const GdnShape& s = cs.s;
    const int t = cs.t, taps = 4;
    const int64_t C = 2 * s.n_k * s.d_k + static_cast<int64_t>(s.n_v) * s.d_v, DV = s.n_v * s.d_v;
    auto cw = randn(taps * C, 150, 0.5f), a = randn(s.n_v, 151), dt = randn(s.n_v, 152),
         nw = randn(s.d_v, 153, 0.2f);
    for (auto& v : a) v = -std::fabs(v);
    for (auto& v : nw) v += 1.0f;
    HostWeight wa = raw_weight(cs.ab, s.n_v, cs.embd, 154), wb = raw_weight(cs.ab, s.n_v, cs.embd, 155);
    auto conv_state = randn((taps - 1) * C, 156),
         state = randn(static_cast<size_t>(s.n_v) * s.d_k * s.d_v, 157, 0.1f);
    float *dcs = up(conv_state), *dst = up(state);
    std::vector<float> scr(testing_util::gdn_scratch_floats(s, t));
    float* dscr = be_->alloc(scr.size());
    Backend::GdnSite site;
    site.conv1d = &vec(cw, taps, C);
    site.alpha_w = &prep(wa.w);
    site.beta_w = &prep(wb.w);
    site.ssm_a = &vec(a, s.n_v);
    site.dt_bias = &vec(dt, s.n_v);
    site.norm_w = &vec(nw, s.d_v);
    site.taps = taps;
    site.shape = s;
    site.norm_eps = 1e-6f;
    site.grouped = cs.grouped;
    auto bind_scratch = [&](float* base) { testing_util::bind_gdn_scratch(site, base, s, t); };
    for (int step = 0; step < 2; ++step) {
      auto qkv = randn(t * C, 160 + step), z = randn(t * DV, 162 + step), xn = randn(t * cs.embd, 164 + step);
      site.qkv = up(qkv);
      site.z = up(z);
      site.normed = up(xn);
      site.conv_state = dcs;
      site.state = dst;
      bind_scratch(dscr);
      be_->gdn_site(site, t);
      const auto out = down(site.out, DV * t);
      site.qkv = qkv.data();
      site.z = z.data();
      site.normed = xn.data();
      site.conv_state = conv_state.data();
      site.state = state.data();
      bind_scratch(scr.data());
      ref_be.gdn_site(site, t);
      const std::string what = "gdn site d_k " + std::to_string(s.d_k) + " t " + std::to_string(t) +
                               " step " + std::to_string(step);
      // the conv is the reference's arithmetic (exact); alpha/beta dot products and the
      // d_k/d_v sums run in another order, then a norm: a few 1e-6 of O(1) values.
      EXPECT_EQ(down(dcs, conv_state.size()), conv_state) << what;
      expect_close(down(dst, state.size()), state, 1e-5, what + " state");
      expect_close(out, std::vector<float>(site.out, site.out + DV * t), 1e-5, what + " out");
    }
  }
}

}  // namespace
}  // namespace bonsai
#endif  // BONSAI_HAVE_CUDA
