#include "kernels/cpu/backend_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fwht.h"
#include "kernels/cpu/gemm.h"
#include "kernels/ref/ops.h"

namespace bonsai {

CpuBackend::CpuBackend(int n_threads, Isa isa, cpu::Precision precision)
    : pool_(n_threads > 0 ? n_threads : default_thread_count()), isa_(isa), precision_(precision) {
  name_ = fmt::format("cpu-{}{}", isa_name(isa_), precision_ == cpu::Precision::Int8 ? "-int8" : "");
  repack_policy_ = cpu::repack_policy_from_env();
  (void)cpu::stream_prefetch_bytes(4);  // the knobs refused here, not in the middle of a step
  (void)cpu::stream_prefetch_bytes(8);
}

void CpuBackend::prepare(Weight& w) {
  if (w.prepared) return;
  // The token embedding is read row by row from the file (embed); a repack
  // of it (338 MB for the 27B) only serves a tied head, which then reads the
  // file layout instead.
  if (w.name == "token_embd.weight") return;
  if (auto r = cpu::make_repack(w, repack_policy_, pool_, isa_)) {
    w.prepared = r.get();
    repacks_.push_back(std::move(r));
  }
}

void CpuBackend::unprepare(Weight& w) {
  if (!w.prepared) return;
  std::erase_if(repacks_, [&](const auto& r) { return r.get() == w.prepared; });
  w.prepared = nullptr;
}

float* CpuBackend::alloc(size_t n) {
  constexpr size_t kHugeMin = size_t{1} << 20;  // bytes
  if (n * sizeof(float) < kHugeMin) return RefBackend::alloc(n);
  auto b = std::make_unique<cpu::HugeBuffer>(n * sizeof(float));  // anonymous mapping: zero-filled
  // Fault small persistent buffers in now (the 27B's 48 GDN states of 3 MiB):
  // first-touching fresh memory runs at ~0.7 GB/s in this VM, so a session's
  // first decode step paid ~4 ms per GDN layer (~200 ms; measured in place,
  // where it made profiled steps show gdn_recurrence at 17-52 ms per token
  // instead of ~11). Larger buffers (KV caches: n_ctx rows) are left to fault
  // as they fill.
  constexpr size_t kPrefaultMax = size_t{4} << 20;  // bytes
  if (n * sizeof(float) <= kPrefaultMax)
    for (size_t o = 0; o < n * sizeof(float); o += 4096) b->data()[o] = 0;
  float* p = reinterpret_cast<float*>(b->data());
  huge_.emplace(p, std::move(b));
  return p;
}

void CpuBackend::release(float* p) {
  if (huge_.erase(p) == 0) RefBackend::release(p);
}

cpu::WeightView CpuBackend::view(const Weight& w) {
  if (w.prepared) {
    auto* r = static_cast<cpu::Repack*>(w.prepared);
    if (r->layout == cpu::WeightLayout::Lanes16) return cpu::lanes_view(r->type, r->bytes.data(), w.n, w.k);
    if (r->layout == cpu::WeightLayout::Stream16) return cpu::stream_view(r->type, r->bytes.data(), w.n, w.k);
    return {r->type, r->bytes.data(), w.n, w.k};
  }
  return cpu::view_of(w);
}

bool CpuBackend::fast_type(DType t) {
  switch (t) {
    case DType::PQ2_0:
    case DType::Q2_0_G128:
    case DType::Q2_0_G64:
    case DType::PTQ1_0:
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return true;
    default:
      return false;
  }
}

namespace {
// Sites run on the pool once they hold this many elements (smaller ones: the hand-out costs more
// than it saves). The work is split at Hadamard blocks (or rows), each piece computed by the same
// functions on the same elements as one pass over the row, so the floats do not depend on it.
constexpr int64_t kSiteParallelElems = 4096;
// ... and at least this many tasks: on 16 cores a hand-out to the pool costs about what one core
// spends on 5-6 Hadamard blocks of 1024 (the 27B's residual site, 5 blocks, measured slower split
// up: 1.79 -> 2.27 ms per token; its SwiGLU site, 17 blocks, faster: 2.39 -> 0.66 ms).
constexpr int64_t kSiteMinTasks = 8;
// A block a task may take alone: a whole number of 16-float vectors, so that a vector kernel
// (swiglu_avx2) sees the same lanes and no tail it would not see in one pass.
bool block_tasks(int64_t n, int64_t block) { return block >= 16 && block % 16 == 0 && n % block == 0; }
}  // namespace

void CpuBackend::hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k,
                          int64_t block, bool inverse) {
  if (rows * k < kSiteParallelElems || pool_.size() == 1 || !block_tasks(k, block) ||
      rows * (k / block) < kSiteMinTasks) {
    for (int64_t r = 0; r < rows; ++r)
      cpu::hadamard_row(x + r * k, signs, y + r * k, k, block, inverse, isa_);
    return;
  }
  const int64_t nb = k / block;  // one task per (row, Hadamard block)
  pool_.parallel_for(rows * nb, [&](int64_t i, int) {
    const int64_t o = (i / nb) * k + (i % nb) * block, c = (i % nb) * block;
    cpu::hadamard_row(x + o, signs ? signs + c : nullptr, y + o, block, block, inverse, isa_);
  });
}

void CpuBackend::residual_norm_site(const float* x, const float* delta, float* x_out, const Weight& gain,
                                    const float* signs, int64_t block, float* normed, float* rotated,
                                    int64_t rows, int64_t n, float eps) {
  // One pass adds the residual and accumulates Σx², a second writes the normed
  // row; the FWHT then runs on the (cache-hot) row. Same f32 operations as the
  // reference ops in the same order, so results are bit-identical to them.
  const float* gw = gain.f32();
  // Rows are independent: one task per row for a batch (a single row stays on this thread: its
  // norm is one Σx² in order, and the 27B's 5-block FWHT did not pay for a hand-out).
  const bool par = rows * n >= kSiteParallelElems && rows >= kSiteMinTasks && pool_.size() > 1;
  auto row = [&](int64_t r) {
    const float* xr = x + r * n;
    float* xo = x_out + r * n;
    float ss = 0;
    if (delta) {
      const float* dr = delta + r * n;
      for (int64_t i = 0; i < n; ++i) {
        xo[i] = xr[i] + dr[i];
        ss += xo[i] * xo[i];
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        xo[i] = xr[i];
        ss += xo[i] * xo[i];
      }
    }
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    float* nr = normed + r * n;
    for (int64_t i = 0; i < n; ++i) nr[i] = xo[i] * scale * gw[i];
    if (block > 0)
      cpu::hadamard_row(nr, signs, rotated + r * n, n, block, false, isa_);
    else
      std::copy(nr, nr + n, rotated + r * n);
  };
  if (par)
    pool_.parallel_for(rows, [&](int64_t r, int) { row(r); });
  else
    for (int64_t r = 0; r < rows; ++r) row(r);
}

void CpuBackend::swiglu_site(const float* gate, const float* up, float* act, const float* signs,
                             int64_t block, float* rotated, int64_t rows, int64_t n) {
  // Elements [o, o + len) of row r: SwiGLU, then their FWHT (len a whole number of blocks).
  auto piece = [&](int64_t r, int64_t o, int64_t len) {
    const float* g = gate + r * n + o;
    const float* u = up + r * n + o;
    float* a = (act ? act : rotated) + r * n + o;  // act null: in place (hadamard_row reads x first)
    if (isa_ == Isa::Scalar)
      for (int64_t i = 0; i < len; ++i) a[i] = ref::silu(g[i]) * u[i];
    else
      cpu::swiglu_avx2(g, u, a, len);  // polynomial exp: a few ulp from the reference
    if (block > 0)
      cpu::hadamard_row(a, signs ? signs + o : nullptr, rotated + r * n + o, len, block, false, isa_);
    else if (act)
      std::copy(a, a + len, rotated + r * n + o);
  };
  const bool by_block = block > 0 && block_tasks(n, block);
  const int64_t tasks = by_block ? rows * (n / block) : rows;
  if (rows * n < kSiteParallelElems || pool_.size() == 1 || tasks < kSiteMinTasks) {
    for (int64_t r = 0; r < rows; ++r) piece(r, 0, n);
  } else if (by_block) {  // one task per (row, Hadamard block)
    const int64_t nb = n / block;
    pool_.parallel_for(tasks, [&](int64_t i, int) { piece(i / nb, (i % nb) * block, block); });
  } else {
    pool_.parallel_for(rows, [&](int64_t r, int) { piece(r, 0, n); });
  }
}

void CpuBackend::matmul(const Weight& w, const float* x, float* y, int t) {
  if (!fast_type(w.type)) return RefBackend::matmul(w, x, y, t);
  if (t > 1 &&
      cpu::gemm_supported(view(w).type, isa_)) {  // prefill: each weight block decoded once per batch
    cpu::prepare_batch(x, t, w.k, cpu::gemm_block(view(w).type), precision_, batch_, &pool_);
    return cpu::gemm(view(w), batch_, y, pool_, isa_);
  }
  // Decode-shaped: one matvec per row of x (also prefill where no GEMM kernel exists).
  for (int i = 0; i < t; ++i) {
    cpu::prepare_act(x + static_cast<int64_t>(i) * w.k, w.k, precision_, act_, cpu::layouts_for(view(w)),
                     &pool_);
    cpu::matvec(view(w), act_, y + static_cast<int64_t>(i) * w.n, pool_, isa_);
  }
}

void CpuBackend::matmul_multi(std::span<const Weight* const> ws, const float* x, std::span<float* const> ys,
                              int t) {
  uint32_t layouts = 0;
  for (const Weight* w : ws) {
    if (!fast_type(w->type) || w->k != ws[0]->k) return Backend::matmul_multi(ws, x, ys, t);
    layouts |= cpu::layouts_for(view(*w));
  }
  if (t > 1 && std::all_of(ws.begin(), ws.end(), [&](const Weight* w) {
        return cpu::gemm_supported(view(*w).type, isa_) &&
               cpu::gemm_block(view(*w).type) == cpu::gemm_block(view(*ws[0]).type);
      })) {
    cpu::prepare_batch(x, t, ws[0]->k, cpu::gemm_block(view(*ws[0]).type), precision_, batch_, &pool_);
    std::vector<cpu::MatvecJob> gjobs(ws.size());
    for (size_t j = 0; j < ws.size(); ++j) gjobs[j] = {view(*ws[j]), ys[j]};
    return cpu::gemm_multi(gjobs, batch_, pool_, isa_);
  }
  std::vector<cpu::MatvecJob> jobs(ws.size());
  for (int i = 0; i < t; ++i) {
    const int64_t k = ws[0]->k;
    cpu::prepare_act(x + i * k, k, precision_, act_, layouts, &pool_);
    for (size_t j = 0; j < ws.size(); ++j)
      jobs[j] = {view(*ws[j]), ys[j] + static_cast<int64_t>(i) * ws[j]->n};
    cpu::matvec_multi(jobs, act_, pool_, isa_);
  }
}

void CpuBackend::store_rows(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv) {
  if (isa_ == Isa::Scalar) return RefBackend::store_rows(cache, src, width, t, pos0, kv);
  cpu::store_rows_f16c(cache, src, width, t, pos0, kv);
}

void CpuBackend::attention(const float* q, const void* k_cache, const void* v_cache, float* out, int t,
                           int pos0, const AttentionShape& s) {
  if (isa_ == Isa::Scalar) return RefBackend::attention(q, k_cache, v_cache, out, t, pos0, s);
  cpu::attention_avx2(q, k_cache, v_cache, out, t, pos0, s, pool_);
}

void CpuBackend::ssm_conv(const float* x, float* state, const Weight& w, float* out, int t, int64_t channels,
                          int taps) {
  if (isa_ == Isa::Scalar) return RefBackend::ssm_conv(x, state, w, out, t, channels, taps);
  // Channels are independent: chunks of 1024 (a multiple of the 8 lanes).
  constexpr int64_t kChunk = 1024;
  const float* wf = w.f32();
  pool_.parallel_for((channels + kChunk - 1) / kChunk, [&](int64_t i, int) {
    cpu::ssm_conv_avx2(x, state, wf, out, t, channels, taps, i * kChunk,
                       std::min(channels, (i + 1) * kChunk));
  });
}

void CpuBackend::gated_rmsnorm(const float* o, const float* z, const Weight& w, float* y, int64_t rows,
                               int64_t d, float eps) {
  if (isa_ == Isa::Scalar) return RefBackend::gated_rmsnorm(o, z, w, y, rows, d, eps);
  ref::rmsnorm(o, w.f32(), y, rows, d, eps);  // the reference's norm, then y ← silu(z)·y 8 lanes at a time
  cpu::swiglu_avx2(z, y, y, rows * d);
}

void CpuBackend::sigmoid_mul(const float* x, const float* gate, float* y, int64_t n) {
  if (isa_ == Isa::Scalar) return RefBackend::sigmoid_mul(x, gate, y, n);
  // One token's gate (6144 at the 27B) is a few µs on one core, less than a pool round trip; a
  // prompt's goes to the pool in pieces of kSiteParallelElems (a multiple of the 8 lanes).
  const int64_t pieces = (n + kSiteParallelElems - 1) / kSiteParallelElems;
  if (pool_.size() == 1 || pieces < kSiteMinTasks) return cpu::sigmoid_mul_avx2(x, gate, y, n);
  pool_.parallel_for(pieces, [&](int64_t i, int) {
    const int64_t o = i * kSiteParallelElems;
    cpu::sigmoid_mul_avx2(x + o, gate + o, y + o, std::min(kSiteParallelElems, n - o));
  });
}

void CpuBackend::gdn_recurrence(const float* conv, const float* g, const float* beta, float* state,
                                float* out, int t, const GdnShape& s) {
  // Tokens are sequential; value heads are independent: one task per head, the
  // state [d_k][d_v] swept twice per token (decay + Sᵀk, then update + Sᵀq).
  const int64_t qk = static_cast<int64_t>(s.n_k) * s.d_k;
  const int64_t width = 2 * qk + static_cast<int64_t>(s.n_v) * s.d_v;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(s.d_k));
  pool_.parallel_for(s.n_v, [&](int64_t h, int) {
    const int hk = static_cast<int>(h % s.n_k);
    std::vector<float> q(s.d_k), k(s.d_k), kv(s.d_v);
    float* S = state + h * s.d_k * s.d_v;
    for (int i = 0; i < t; ++i) {
      const float* ci = conv + i * width;
      auto l2 = [&](const float* src, float* dst, float extra) {
        float ss = 0;
        for (int a = 0; a < s.d_k; ++a) ss += src[a] * src[a];
        const float sc = extra / std::max(std::sqrt(ss), s.eps);
        for (int a = 0; a < s.d_k; ++a) dst[a] = src[a] * sc;
      };
      l2(ci + hk * s.d_k, q.data(), q_scale);
      l2(ci + qk + hk * s.d_k, k.data(), 1.0f);
      const float* v = ci + 2 * qk + h * s.d_v;
      const float decay = std::exp(g[i * s.n_v + h]), b = beta[i * s.n_v + h];
      float* oh = out + (i * s.n_v + h) * s.d_v;
      if (isa_ == Isa::Avx512 && s.d_v % 16 == 0) {  // same step, 16 columns per FMA (elementwise.h)
        cpu::gdn_head_step_avx512(q.data(), k.data(), v, decay, b, S, oh, s.d_k, s.d_v);
        continue;
      }
      if (isa_ != Isa::Scalar && s.d_v % 8 == 0) {
        cpu::gdn_head_step_avx2(q.data(), k.data(), v, decay, b, S, oh, s.d_k, s.d_v);
        continue;
      }
      std::fill(kv.begin(), kv.end(), 0.0f);
      for (int a = 0; a < s.d_k; ++a) {
        float* Sa = S + a * s.d_v;
        const float ka = k[a];
        for (int e = 0; e < s.d_v; ++e) {
          Sa[e] *= decay;
          kv[e] += Sa[e] * ka;
        }
      }
      for (int e = 0; e < s.d_v; ++e) kv[e] = b * (v[e] - kv[e]);
      float* o = out + (static_cast<int64_t>(i) * s.n_v + h) * s.d_v;
      std::fill(o, o + s.d_v, 0.0f);
      for (int a = 0; a < s.d_k; ++a) {
        float* Sa = S + a * s.d_v;
        const float ka = k[a], qa = q[a];
        for (int e = 0; e < s.d_v; ++e) {
          Sa[e] += ka * kv[e];
          o[e] += Sa[e] * qa;
        }
      }
    }
  });
}

}  // namespace bonsai
