// CudaBackend's ops of the two mixers (kernels/cuda/cuda_backend.h): the attention layer (rope,
// cache rows, attention and its fused site: attention.cu, attention_mma.cu) and the GatedDeltaNet
// layer (conv, gates, recurrence, gated norm and the fused site: gdn.cu, gdn_walk.cu,
// gdn_tc2.cu, gdn_ab_mma.cu, gdn_pipe.cu). Split from cuda_backend.cpp (the memory, weight, matmul and
// norm/FWHT site ops) to keep both files readable; they share CudaBackend::Impl (cuda_backend_impl.h).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/gdn_ab_mma.h"
#include "kernels/cuda/gdn_pipe.h"

namespace bonsai {

namespace {

// The GDN kernels' shape fields: t tokens of the layer's heads (GdnFused, kernels/cuda/launch.h).
void gdn_shape(cuda::GdnFused& f, const GdnShape& s, int t) {
  f.t = t;
  f.n_k = s.n_k;
  f.n_v = s.n_v;
  f.d_k = s.d_k;
  f.d_v = s.d_v;
  f.eps = s.eps;
}

}  // namespace

void CudaBackend::rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0) {
  impl_->flush();
  Impl& m = *impl_;
  cuda::rope(x, t, n_head, head_dim, n_rot, base, pos0, m.pos_dev(), m.stream);
  check_launch("rope");
  m.wrote(x, static_cast<size_t>(t) * n_head * head_dim * sizeof(float));
}

void CudaBackend::store_rows(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv) {
  impl_->flush();
  Impl& m = *impl_;
  cuda::store_rows(cache, src, width, t, pos0, m.pos_dev(), kv, m.stream);
  check_launch("store_rows");
  m.invalidate_quant();  // the written rows depend on a device-side position
}

void CudaBackend::attention(const float* q, const void* k_cache, const void* v_cache, float* out, int t,
                            int pos0, const AttentionShape& s) {
  impl_->flush();
  impl_->attention(q, k_cache, v_cache, out, t, pos0, s, nullptr, 0);
}

bool CudaBackend::attention_on_tensor_cores(int t, const AttentionShape& s) {
  return cuda::attention_mma_fits(nullptr, nullptr, nullptr, t, s.n_head, s.n_head_kv, s.head_dim);
}

void CudaBackend::Impl::attention(const float* q, const void* k_cache, const void* v_cache, float* out, int t,
                                  int pos0, const AttentionShape& s, const float* gate, int64_t gate_stride) {
  if (s.head_dim % 32 || s.head_dim > 256 || s.n_head % s.n_head_kv || s.n_head / s.n_head_kv > 8)
    fail("cuda: attention with {} heads, {} KV heads and head_dim {} is not supported", s.n_head, s.n_head_kv,
         s.head_dim);
  // A prefill batch on the tensor cores (kernels/cuda/attention_mma.cu; not while recording).
  if (pos_dev() == nullptr &&
      cuda::attention_mma_fits(q, k_cache, v_cache, t, s.n_head, s.n_head_kv, s.head_dim)) {
    const int splits = cuda::attention_mma_splits(t, pos0, s.n_head, s.n_head_kv, prop.multiProcessorCount);
    grow(part, cuda::attention_mma_scratch(t, pos0, s.n_head, s.n_head_kv, s.head_dim, splits),
         "attention partials");
    cuda::attention_mma(q, k_cache, v_cache, s.kv, out, part.as<void>(), t, pos0, splits, s.n_head,
                        s.n_head_kv, s.head_dim, s.scale, gate, gate_stride, stream);
    check_launch("attention (tensor cores)");
    wrote(out, static_cast<size_t>(t) * s.n_head * s.head_dim * sizeof(float));
    return;
  }
  // One token (a decode step): the split count of its context (cuda::attention_decode_splits),
  // which a recorded step keeps for as long as the count does not change (replay_step records
  // again when it would). Batches: enough blocks to fill the device.
  const int64_t key = (static_cast<int64_t>(s.kv) << 60) | (static_cast<int64_t>(s.n_head) << 40) |
                      (static_cast<int64_t>(s.n_head_kv) << 20) | s.head_dim;
  if (attn_wave_key != key) {
    attn_wave = cuda::attention_split_wave(s.n_head, s.n_head_kv, s.head_dim, s.kv);
    attn_mma_wave =
        s.kv == KvType::F16 ? cuda::attention_decode_mma_wave(s.n_head, s.n_head_kv, s.head_dim) : 0;
    attn_wave_key = key;
  }
  // An f16 cache at long contexts: the tensor cores' decode kernel, one wave of its blocks.
  const bool mma = t == 1 && cuda::attention_decode_mma_on(pos0 + 1, attn_mma_wave);
  int splits = cuda::attention_decode_splits(pos0 + 1, mma ? attn_mma_wave : attn_wave);
  const bool batch = t == 1 && cuda::attention_decode_batch(pos0 + 1);
  if (capturing) rec_attn_plan = cuda::attention_decode_plan(pos0 + 1, attn_wave, attn_mma_wave);
  // the split half: the decode kernel on the tensor cores or the split kernels
  auto split_half = [&] {
    if (mma)
      cuda::attention_decode_mma(q, k_cache, v_cache, part.as<float>(), pos0, pos_dev(), splits, s.n_head,
                                 s.n_head_kv, s.head_dim, s.scale, stream);
    else
      cuda::attention_splits(q, k_cache, v_cache, s.kv, part.as<float>(), t, pos0, pos_dev(), splits, batch,
                             s.n_head, s.n_head_kv, s.head_dim, s.scale, stream);
  };
  if (t > 1) {
    const int blocks = t * s.n_head_kv;
    splits = std::clamp((2 * prop.multiProcessorCount + blocks - 1) / blocks, 1, kDecodeSplits);
    splits = std::min(splits, std::max(1, (pos0 + t + 63) / 64));
  }
  grow(part, static_cast<size_t>(t) * s.n_head * splits * (s.head_dim + 2) * sizeof(float),
       "attention partials");
  if (attn_fwht && splits == cuda::kAttentionDecodeMinSplits && (s.head_dim == 128 || s.head_dim == 256)) {
    // the merge held back: the next op may be the FWHT site of out (CudaBackend::hadamard)
    split_half();
    check_launch(mma ? "attention (decode on the tensor cores)" : "attention");
    pend.merge = true;
    pend.merge_part = part.as<float>();
    pend.merge_out = out;
    pend.merge_gate = gate;
    pend.merge_gate_stride = gate_stride;
    pend.merge_t = t;
    pend.merge_heads = s.n_head;
    pend.merge_splits = splits;
    pend.merge_dim = s.head_dim;
    wrote(out, static_cast<size_t>(t) * s.n_head * s.head_dim * sizeof(float));
    return;
  }
  split_half();
  check_launch(mma ? "attention (decode on the tensor cores)" : "attention");
  cuda::attention_merge(part.as<float>(), out, t, s.n_head, splits, s.head_dim, gate, gate_stride, stream);
  check_launch("attention merge");
  wrote(out, static_cast<size_t>(t) * s.n_head * s.head_dim * sizeof(float));
}

// Three launches: q/k norms + RoPE + the KV store, then attention (split, and merge with the gate).
void CudaBackend::attention_site(const AttentionSite& a, int t, int pos0) {
  Impl& m = *impl_;
  const AttentionShape& s = a.shape;
  const bool usual = !(s.head_dim % 32 || s.head_dim > 256 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv ||
                       s.n_head / s.n_head_kv > 8 || a.n_rot % 2 || a.n_rot > s.head_dim);
  // qf, k and v the held-back q/k/v launch's three outputs: launched with its split sums left to
  // the prep (BONSAI_CUDA_QKV_DEFER). Its slots stay intact until the prep has read them (see
  // residual_norm_site); the merge reads the gate from qf, which the prep writes back.
  Impl::Pending& pm = m.pend;
  cuda::SplitSums split[cuda::kMaxJobs];
  bool deferred = false;
  const int64_t hd = s.head_dim;
  const bool held = pm.mv && pm.mv_jobs.count == 3 && pm.mv_jobs.job[0].y == a.qf &&
                    pm.mv_jobs.job[1].y == a.k && pm.mv_jobs.job[2].y == a.v;
  constexpr Impl::MvLaunch kind = Impl::MvLaunch::attn_qkv;
  const int room = usual ? (s.n_head + 2 * s.n_head_kv) * t : 0;  // the prep's CTAs
  if (usual && (m.qkv_defer & kQkvDeferAttn) && held && pm.mv_t == t &&
      pm.mv_jobs.job[0].n == 2 * s.n_head * hd && pm.mv_jobs.job[1].n == s.n_head_kv * hd &&
      pm.mv_jobs.job[2].n == s.n_head_kv * hd) {
    pm.mv = false;
    deferred = m.matvec(pm.mv_jobs, pm.mv_groups, pm.mv_xq, pm.mv_meta, pm.mv_t, pm.mv_k,
                        cuda::MatvecFixup::defer, split, kind, room) == cuda::MatvecFixup::defer;
  }
  m.flush(held ? kind : Impl::MvLaunch::other, room);
  if (!usual) return Backend::attention_site(a, t, pos0);
  cuda::AttnPrep p;
  p.qf = a.qf;
  p.k = a.k;
  p.v = a.v;
  p.q_norm = m.dev(*a.q_norm).f32();
  p.k_norm = m.dev(*a.k_norm).f32();
  p.eps = a.eps;
  p.base = a.rope_base;
  p.n_rot = a.n_rot;
  p.n_head = s.n_head;
  p.n_head_kv = s.n_head_kv;
  p.head_dim = s.head_dim;
  p.q = a.q;
  p.k_cache = a.k_cache;
  p.v_cache = a.v_cache;
  p.kv = s.kv;
  cuda::attention_prep(p, t, pos0, m.pos_dev(), m.stream, deferred ? split : nullptr, m.gdn_dec.split_weak);
  check_launch(deferred ? "attention_prep (split sums)" : "attention_prep");
  m.wrote(a.q, static_cast<size_t>(t) * s.n_head * s.head_dim * sizeof(float));
  m.invalidate_quant();  // the cache rows written depend on a device-side position
  m.attention(a.q, a.k_cache, a.v_cache, a.out, t, pos0, s, a.qf + s.head_dim,
              2 * static_cast<int64_t>(s.head_dim));
}

// A few tokens: one launch (cuda::gdn_fused with the conv and the alpha/beta rows inside).
// A batch: alpha/beta rows, conv + q/k norms, the walk, the gated norm (and head order).
// a.rotated: the out-projection's input site, folded into the decode step's launch where
// cuda::gdn_decode takes it (BONSAI_CUDA_GDN_FWHT), else hadamard() after the site.
void CudaBackend::gdn_site(const GdnSite& a, int t) {
  if (gdn_site_run(a, t) || !a.rotated) return;
  hadamard(a.out, a.signs, a.rotated, t, static_cast<int64_t>(a.shape.n_v) * a.shape.d_v, a.block, false);
}

// gdn_site without its hadamard(); returns whether a.rotated was written.
bool CudaBackend::gdn_site_run(const GdnSite& a, int t) {
  Impl& m = *impl_;
  // Every path launches only after m.flush(), except the decode step, which may first launch a
  // held-back qkv+z matvec deferred (below).
  if (!m.pend.mv) m.flush();
  const GdnShape& s = a.shape;
  const DeviceWeight &cw = m.dev(*a.conv1d), &aw = m.dev(*a.alpha_w), &bw = m.dev(*a.beta_w);
  const bool fusable = s.d_k % 32 == 0 && s.d_v % 32 == 0 && (s.d_k / 32) * s.d_v <= 512 && s.n_k > 0 &&
                       s.n_v % s.n_k == 0 && a.taps >= 1 && a.taps <= 4 && !cw.tiled &&
                       cw.raw == cuda::RawType::F32 && cw.k == a.taps;
  if (!fusable) {
    m.flush();
    Backend::gdn_site(a, t);
    return true;
  }
  const bool ab_raw =
      !aw.tiled && !bw.tiled && aw.raw == bw.raw && aw.row_bytes == bw.row_bytes && aw.k == bw.k &&
      aw.n >= s.n_v && bw.n >= s.n_v &&
      (aw.raw == cuda::RawType::F32 || aw.raw == cuda::RawType::F16 || aw.raw == cuda::RawType::BF16);
  // A few tokens: one kernel (the alpha/beta rows inside); a batch: the prefill pipeline.
  const bool ab_fused = ab_raw && t <= 4;
  if (!ab_fused) m.flush();
  if (!ab_fused && t < a.taps - 1) {  // the walk's conv-state write needs them
    Backend::gdn_site(a, t);
    return true;
  }
  const int64_t channels = 2 * static_cast<int64_t>(s.n_k) * s.d_k + static_cast<int64_t>(s.n_v) * s.d_v;
  const float* norm_w = m.dev(*a.norm_w).f32();
  if (!ab_fused) {  // a batch: everything but the walk parallel over tokens
    if (ab_raw) {
      // tensor cores or fp32 SIMT (BONSAI_CUDA_GDN_AB; kernels/cuda/gdn_ab_mma.h)
      cuda::gdn_ab_rows(a.normed, aw.bytes(), bw.bytes(), aw.row_bytes, aw.raw, static_cast<int>(aw.k), s.n_v,
                        t, a.alpha, a.beta_in, cuda::gdn_ab_kernel(), m.stream);
      check_launch("gdn_ab_rows");
    } else {
      const Weight* ab[] = {a.alpha_w, a.beta_w};
      float* ab_out[] = {a.alpha, a.beta_in};
      matmul_multi(ab, a.normed, ab_out, t);
    }
    // BONSAI_CUDA_GDN_PIPE (kernels/cuda/gdn_pipe.h): the warp-per-tile conv + norms and the gated
    // norm writing the head order itself, or the block-per-token kernels and transpose_heads
    const int pipe = cuda::gdn_pipe_mask();
    if ((pipe & cuda::kGdnPipeConv) && cuda::gdn_conv_norm_tiled_fits(a.taps, s.d_k, s.d_v))
      cuda::gdn_conv_norm_tiled(a.qkv, a.conv_state, cw.f32(), a.conv, t, a.taps, s.n_k, s.n_v, s.d_k, s.d_v,
                                s.eps, m.stream);
    else
      cuda::gdn_conv_norm(a.qkv, a.conv_state, cw.f32(), a.conv, t, a.taps, s.n_k, s.n_v, s.d_k, s.d_v, s.eps,
                          m.stream);
    check_launch("gdn_conv_norm");
    cuda::GdnFused f;
    f.conv = a.conv;
    f.qkv = a.qkv;  // the walk writes the new conv state
    f.conv_state = a.conv_state;
    f.taps = a.taps;
    f.alpha = a.alpha;
    f.beta_in = a.beta_in;
    f.ssm_a = m.dev(*a.ssm_a).f32();
    f.dt_bias = m.dev(*a.dt_bias).f32();
    f.state = a.state;
    f.out = a.o;
    gdn_shape(f, s, t);
    if (const size_t need = cuda::gdn_walk_scratch_bytes(f)) {  // BONSAI_CUDA_WALK=6 (gdn_tc2.cu)
      m.gdn_scratch.grow(need, "GDN walk scratch");
      f.scratch = m.gdn_scratch.as<float>();
    }
    cuda::gdn_walk(f, m.stream);
    check_launch("gdn_walk");
    float* y = a.out;
    if (pipe & cuda::kGdnPipeNorm) {
      cuda::gated_rmsnorm_heads(a.o, a.z, norm_w, a.out, t, s.n_v, s.n_k, s.d_v, a.norm_eps, a.grouped,
                                m.stream);
      check_launch("gated_rmsnorm_heads");
    } else {
      y = a.grouped ? a.normed_o : a.out;
      cuda::gated_rmsnorm(a.o, a.z, norm_w, y, static_cast<int64_t>(t) * s.n_v, s.d_v, a.norm_eps, m.stream);
      check_launch("gated_rmsnorm");
      if (a.grouped) {
        cuda::transpose_heads(y, a.out, t, s.n_v / s.n_k, s.n_k, s.d_v, m.stream);
        check_launch("transpose_heads");
      }
    }
    for (const float* p : {a.conv, a.o, y, a.alpha, a.beta_in})
      m.wrote(p, static_cast<size_t>(t) * channels * sizeof(float));  // a bound: conv is the widest
    m.wrote(a.conv_state, static_cast<size_t>(a.taps - 1) * channels * sizeof(float));
    m.wrote(a.state, static_cast<size_t>(s.n_v) * s.d_k * s.d_v * sizeof(float));
    m.wrote(a.out, static_cast<size_t>(t) * s.n_v * s.d_v * sizeof(float));
    return false;
  }
  cuda::GdnFused f;
  f.qkv = a.qkv;
  f.conv_w = cw.f32();
  f.conv_state = a.conv_state;
  // [n_k] the conv hand-off's, then [n_v·d_v / block] the folded Hadamard site's (one request:
  // a grown buffer moves)
  const int64_t width = static_cast<int64_t>(s.n_v) * s.d_v;
  const int64_t fold_blocks = a.rotated && a.block > 0 && width % a.block == 0 ? width / a.block : 0;
  int* counters = m.counters(m.gdn_counters, static_cast<size_t>(s.n_k + fold_blocks), "GDN conv counters");
  f.conv_counters = counters;
  f.taps = a.taps;
  f.ssm_a = m.dev(*a.ssm_a).f32();
  f.dt_bias = m.dev(*a.dt_bias).f32();
  f.alpha_w = aw.bytes();
  f.beta_w = bw.bytes();
  f.normed = a.normed;
  f.ab_type = aw.raw;
  f.ab_row_bytes = aw.row_bytes;
  f.ab_k = static_cast<int>(aw.k);
  f.state = a.state;
  f.z = a.z;
  f.norm_w = norm_w;
  f.norm_eps = a.norm_eps;
  f.out = a.out;
  f.transpose = a.grouped;
  gdn_shape(f, s, t);
  f.state_early = m.step_recording && m.gdn_dec.early;  // BONSAI_CUDA_GDN_EARLY
  f.state_stream = m.gdn_stream;
  const bool decode = m.gdn_dec.on && cuda::gdn_decode_fits(f);  // t = 1 over clusters (gdn_decode.h)
  // qkv and z the held-back qkv+z launch's two outputs: launched with its split sums left to the
  // decode step (BONSAI_CUDA_QKV_DEFER); its slots stay intact until the step has read them (see
  // residual_norm_site).
  Impl::Pending& pm = m.pend;
  cuda::SplitSums split[cuda::kMaxJobs];
  bool deferred = false;
  const bool held =
      pm.mv && pm.mv_jobs.count == 2 && pm.mv_jobs.job[0].y == a.qkv && pm.mv_jobs.job[1].y == a.z;
  constexpr Impl::MvLaunch kind = Impl::MvLaunch::gdn_qkvz;
  if (decode && (m.qkv_defer & kQkvDeferGdn) && held && pm.mv_t == t && pm.mv_jobs.job[0].n == channels &&
      pm.mv_jobs.job[1].n == static_cast<int64_t>(s.n_v) * s.d_v) {
    pm.mv = false;
    deferred = m.matvec(pm.mv_jobs, pm.mv_groups, pm.mv_xq, pm.mv_meta, pm.mv_t, pm.mv_k,
                        cuda::MatvecFixup::defer, split, kind) == cuda::MatvecFixup::defer;
  }
  m.flush(held ? kind : Impl::MvLaunch::other);
  // The out-projection's input site in the same launch (cuda::GdnDecodeFwht): a decode row, so
  // the int8 quantization (as hadamard() would write it)
  cuda::GdnDecodeFwht fw;
  const bool fold_asked = decode && !deferred && m.gdn_dec.fwht && fold_blocks > 0 &&
                          a.block % cuda::kBlockK == 0 &&
                          m.site_out(t, width, a.block) == Impl::SiteOut::int8;
  if (fold_asked) {
    m.reserve_quant(t, width);
    fw.signs = a.signs;
    fw.rotated = a.rotated;
    fw.xq = m.xq.as<uint8_t>();
    fw.meta = m.meta.as<float4>();
    fw.counters = reinterpret_cast<unsigned*>(counters + s.n_k);
    fw.block = static_cast<int>(a.block);
    if (m.gdn_dec.fwht_poll) {  // the polled hand-off's words: all 0xFFFFFFFF, left so by the kernel
      if (static_cast<size_t>(width) * sizeof(float) > m.gdn_poll.bytes) {
        m.grow(m.gdn_poll, static_cast<size_t>(width) * sizeof(float), "GDN fold poll words");
        check(cudaMemsetAsync(m.gdn_poll.mem.get(), 0xff, m.gdn_poll.bytes, m.stream), "cudaMemsetAsync");
      }
      fw.poll = m.gdn_poll.as<float>();
      fw.sm_count = m.prop.multiProcessorCount;
    }
  }
  bool folded = false;
  if (decode)
    folded = cuda::gdn_decode(f, m.gdn_dec, m.stream, deferred ? split : nullptr, fold_asked ? &fw : nullptr);
  else
    cuda::gdn_fused(f, m.stream);
  check_launch(deferred ? "gdn_site (split sums)"
               : folded ? "gdn_site (with the Hadamard site)"
                        : "gdn_site");
  m.wrote(a.conv_state, static_cast<size_t>(a.taps - 1) * channels * sizeof(float));
  m.wrote(a.state, static_cast<size_t>(s.n_v) * s.d_k * s.d_v * sizeof(float));
  m.wrote(a.out, static_cast<size_t>(t) * s.n_v * s.d_v * sizeof(float));
  if (folded) {
    m.wrote(a.rotated, static_cast<size_t>(t) * width * sizeof(float));
    m.q_src = a.rotated;  // its quantization is in xq / meta
    m.q_rows = t;
    m.q_k = width;
  }
  return folded;
}

void CudaBackend::ssm_conv(const float* x, float* state, const Weight& w, float* out, int t, int64_t channels,
                           int taps) {
  impl_->flush();
  Impl& m = *impl_;
  if (taps < 1 || taps > 8) fail("cuda: ssm_conv with {} taps is not supported (1..8)", taps);
  cuda::ssm_conv(x, state, m.dev(w).f32(), out, t, channels, taps, m.stream);
  check_launch("ssm_conv");
  m.wrote(state, static_cast<size_t>(taps - 1) * channels * sizeof(float));
  m.wrote(out, static_cast<size_t>(t) * channels * sizeof(float));
}

void CudaBackend::gdn_gates(const float* alpha, const float* beta_in, const Weight& ssm_a,
                            const Weight& dt_bias, float* g, float* beta, int t, int n_v) {
  Impl& m = *impl_;
  m.flush();
  Impl::Pending& p = m.pend;
  p.gates = true;
  p.alpha = alpha;
  p.beta_in = beta_in;
  p.ssm_a = m.dev(ssm_a).f32();
  p.dt_bias = m.dev(dt_bias).f32();
  p.g = g;
  p.beta = beta;
  p.gates_t = t;
  p.gates_nv = n_v;
  m.wrote(g, static_cast<size_t>(t) * n_v * sizeof(float));
  m.wrote(beta, static_cast<size_t>(t) * n_v * sizeof(float));
}

void CudaBackend::gdn_recurrence(const float* conv, const float* g, const float* beta, float* state,
                                 float* out, int t, const GdnShape& s) {
  Impl& m = *impl_;
  if (s.d_k % 32 || s.d_k > 1024 || s.d_v % 32)
    fail("cuda: delta rule with d_k {} and d_v {} is not supported (multiples of 32, d_k <= 1024)", s.d_k,
         s.d_v);
  Impl::Pending& p = m.pend;
  // Gates held back for exactly these g/beta are computed inside the recurrence.
  if (!(p.gates && !p.rec && p.g == g && p.beta == beta && p.gates_t == t && p.gates_nv == s.n_v)) m.flush();
  p.rec = true;
  p.f = cuda::GdnFused{};
  p.f.conv = conv;
  p.f.g = g;
  p.f.beta = beta;
  p.f.state = state;
  p.f.out = out;
  gdn_shape(p.f, s, t);
  m.wrote(state, static_cast<size_t>(s.n_v) * s.d_k * s.d_v * sizeof(float));
  m.wrote(out, static_cast<size_t>(t) * s.n_v * s.d_v * sizeof(float));
}

void CudaBackend::gated_rmsnorm(const float* o, const float* z, const Weight& w, float* y, int64_t rows,
                                int64_t d, float eps) {
  Impl& m = *impl_;
  Impl::Pending& p = m.pend;
  if (p.rec && !p.norm && o == p.f.out && rows == static_cast<int64_t>(p.f.t) * p.f.n_v && d == p.f.d_v) {
    p.norm = true;  // y = gated_rmsnorm(o): done by the fused kernel, o itself is not written
    p.z = z;
    p.norm_w = m.dev(w).f32();
    p.norm_y = y;
    p.norm_eps = eps;
  } else {
    m.flush();
    cuda::gated_rmsnorm(o, z, m.dev(w).f32(), y, rows, d, eps, m.stream);
    check_launch("gated_rmsnorm");
  }
  m.wrote(y, rows * d * sizeof(float));
}

}  // namespace bonsai
