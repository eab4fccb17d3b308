#include "model/graph.h"

#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>

#include "bonsai/error.h"
#include "model/hadamard.h"

namespace bonsai {

// Activation buffers in backend memory, sized for `capacity_` tokens.
struct Graph::Scratch {
  float *x, *h, *xn, *xr, *mix;      // [t][E]: residual, post-mixer residual, normed, rotated, mixer out
  float *qkv, *z, *alpha, *beta_in;  // GDN projections
  float *conv, *g, *beta, *o, *fo, *fog, *fr;
  float *qf, *q, *qgate, *k, *v, *att, *attr;  // attention
  float *fg, *fu, *fa, *far, *ffo;             // FFN
  float* logits;                               // [t][V]
};

namespace {
int64_t prod(int64_t a, int64_t b) { return a * b; }
}  // namespace

Graph::Graph(const Model& model, Backend& backend, int n_ctx, KvType kv)
    : model_(model), c_(model.config()), be_(backend) {
  const ModelWeights& mw = model.weights();
  w_.tok_embd = mw.tok_embd;
  w_.output_norm = mw.output_norm;
  w_.output = mw.output;
  w_.layers = mw.layers;
  auto prep = [&](Weight& w) {
    if (!w.empty()) be_.prepare(w);
  };
  prep(w_.tok_embd);
  prep(w_.output_norm);
  if (!c_.tied_output)
    prep(w_.output);
  else
    w_.output = w_.tok_embd;
  for (auto& L : w_.layers)
    for (Weight* w :
         {&L.attn_norm,  &L.post_norm,   &L.ffn_gate, &L.ffn_up,    &L.ffn_down,    &L.ssm_qkv,    &L.ssm_z,
          &L.ssm_conv1d, &L.ssm_dt_bias, &L.ssm_a,    &L.ssm_alpha, &L.ssm_beta,    &L.ssm_norm,   &L.ssm_out,
          &L.attn_q,     &L.attn_k,      &L.attn_v,   &L.attn_out,  &L.attn_q_norm, &L.attn_k_norm})
      prep(*w);

  if (const HadamardSpec* hs = model.hadamard()) {
    block_ = hs->block;
    permute_ssm_out_ = hs->gdn_v_grouped;
    for (const auto& [width, s] : hs->signs) {
      float* buf = be_.alloc(s.size());
      be_.from_host(buf, s.data(), s.size());
      signs_.emplace_back(width, buf);
    }
  }

  state_.n_ctx = n_ctx;
  state_.kv = kv;
  // The KV cache is the one allocation the user sizes (-c): a failure names it and its size.
  auto alloc_kv = [&] {
    try {
      return be_.alloc(kv_floats(n_ctx));
    } catch (const std::exception& e) {  // bonsai::Error from mmap/cudaMalloc, bad_alloc from the reference
      uint32_t n_attn = 0;
      for (uint32_t l = 0; l < c_.n_layer; ++l) n_attn += c_.recurrent[l] ? 0 : 1;
      const double gb = 2.0 * n_attn * static_cast<double>(kv_floats(n_ctx)) * 4 / 1e9;
      fail(
          "KV cache for a context of {} positions ({} attention layer{}, {:.2f} GB as {}) could not be "
          "allocated; use a smaller context size (-c){}: {}",
          n_ctx, n_attn, n_attn == 1 ? "" : "s", gb, kv_type_name(kv),
          kv == KvType::F32 ? " or an f16 cache (-ctk f16 -ctv f16)" : "", e.what());
    }
  };
  for (uint32_t il = 0; il < c_.n_layer; ++il) {
    if (c_.recurrent[il]) {
      state_.k_cache.push_back(nullptr);
      state_.v_cache.push_back(nullptr);
      state_.conv_state.push_back(be_.alloc(static_cast<size_t>(c_.ssm_conv - 1) * c_.ssm_conv_channels()));
      state_.ssm_state.push_back(
          be_.alloc(static_cast<size_t>(c_.ssm_n_v) * c_.ssm_d_state * c_.ssm_head_v_dim()));
    } else {
      state_.k_cache.push_back(alloc_kv());
      state_.v_cache.push_back(alloc_kv());
      state_.conv_state.push_back(nullptr);
      state_.ssm_state.push_back(nullptr);
    }
  }
  ensure_scratch(1);
}

Graph::~Graph() {
  auto rel = [&](float* p) {
    if (p) be_.release(p);
  };
  for (auto& [w, p] : signs_) rel(p);
  for (float* p : state_.k_cache) rel(p);
  for (float* p : state_.v_cache) rel(p);
  for (float* p : state_.conv_state) rel(p);
  for (float* p : state_.ssm_state) rel(p);
  if (s_) {
    for (float* p :
         {s_->x, s_->h,    s_->xn,   s_->xr, s_->mix, s_->qkv, s_->z,   s_->alpha, s_->beta_in, s_->conv,
          s_->g, s_->beta, s_->o,    s_->fo, s_->fog, s_->fr,  s_->qf,  s_->q,     s_->qgate,   s_->k,
          s_->v, s_->att,  s_->attr, s_->fg, s_->fu,  s_->fa,  s_->far, s_->ffo,   s_->logits})
      rel(p);
  }
  for (auto& L : w_.layers)
    for (Weight* w :
         {&L.attn_norm,  &L.post_norm,   &L.ffn_gate, &L.ffn_up,    &L.ffn_down,    &L.ssm_qkv,    &L.ssm_z,
          &L.ssm_conv1d, &L.ssm_dt_bias, &L.ssm_a,    &L.ssm_alpha, &L.ssm_beta,    &L.ssm_norm,   &L.ssm_out,
          &L.attn_q,     &L.attn_k,      &L.attn_v,   &L.attn_out,  &L.attn_q_norm, &L.attn_k_norm})
      if (!w->empty()) be_.unprepare(*w);
  be_.unprepare(w_.tok_embd);
  be_.unprepare(w_.output_norm);
  if (!c_.tied_output) be_.unprepare(w_.output);
}

void Graph::ensure_scratch(int t) {
  if (s_ && t <= capacity_) return;
  if (s_) {
    for (float* p :
         {s_->x, s_->h,    s_->xn,   s_->xr, s_->mix, s_->qkv, s_->z,   s_->alpha, s_->beta_in, s_->conv,
          s_->g, s_->beta, s_->o,    s_->fo, s_->fog, s_->fr,  s_->qf,  s_->q,     s_->qgate,   s_->k,
          s_->v, s_->att,  s_->attr, s_->fg, s_->fu,  s_->fa,  s_->far, s_->ffo,   s_->logits})
      be_.release(p);
  }
  s_ = std::make_unique<Scratch>();
  capacity_ = t;
  auto a = [&](int64_t width) { return be_.alloc(static_cast<size_t>(width) * t); };
  const int64_t E = c_.n_embd, F = c_.n_ff, C = c_.ssm_conv_channels(), DI = c_.ssm_d_inner, NV = c_.ssm_n_v;
  const int64_t HD = prod(c_.n_head, c_.head_dim_k), KV = prod(c_.n_head_kv, c_.head_dim_k);
  s_->x = a(E);
  s_->h = a(E);
  s_->xn = a(E);
  s_->xr = a(E);
  s_->mix = a(E);
  s_->qkv = a(C);
  s_->z = a(DI);
  s_->alpha = a(NV);
  s_->beta_in = a(NV);
  s_->conv = a(C);
  s_->g = a(NV);
  s_->beta = a(NV);
  s_->o = a(DI);
  s_->fo = a(DI);
  s_->fog = a(DI);
  s_->fr = a(DI);
  s_->qf = a(2 * HD);
  s_->q = a(HD);
  s_->qgate = a(HD);
  s_->k = a(KV);
  s_->v = a(KV);
  s_->att = a(HD);
  s_->attr = a(HD);
  s_->fg = a(F);
  s_->fu = a(F);
  s_->fa = a(F);
  s_->far = a(F);
  s_->ffo = a(E);
  s_->logits = a(c_.n_vocab);
}

size_t Graph::kv_floats(int64_t rows) const {
  const int64_t bytes =
      rows * prod(c_.n_head_kv, c_.head_dim_k) * static_cast<int64_t>(kv_type_bytes(state_.kv));
  return static_cast<size_t>((bytes + 3) / 4);  // an odd count of halves rounds up to a whole slot
}

uint64_t Graph::kv_cache_bytes() const {
  uint64_t n = 0;
  for (const float* p : state_.k_cache) n += p ? 2 * kv_floats(state_.n_ctx) * sizeof(float) : 0;
  return n;
}

void Graph::reset_state() {
  for (uint32_t il = 0; il < c_.n_layer; ++il) {
    if (c_.recurrent[il]) {
      be_.zero(state_.conv_state[il], static_cast<size_t>(c_.ssm_conv - 1) * c_.ssm_conv_channels());
      be_.zero(state_.ssm_state[il], static_cast<size_t>(c_.ssm_n_v) * c_.ssm_d_state * c_.ssm_head_v_dim());
    } else {
      be_.zero(state_.k_cache[il], kv_floats(state_.n_ctx));
      be_.zero(state_.v_cache[il], kv_floats(state_.n_ctx));
    }
  }
}

std::vector<float> Graph::save_state(int n_pos) const {
  std::vector<float> out;  // F16 rows travel as their bits, two halves per float slot
  const size_t kv = kv_floats(n_pos);
  const size_t cs = static_cast<size_t>(c_.ssm_conv - 1) * c_.ssm_conv_channels();
  const size_t ss = static_cast<size_t>(c_.ssm_n_v) * c_.ssm_d_state * c_.ssm_head_v_dim();
  for (uint32_t il = 0; il < c_.n_layer; ++il) {
    auto append = [&](const float* p, size_t n) {
      size_t at = out.size();
      out.resize(at + n);
      be_.to_host(out.data() + at, p, n);
    };
    if (c_.recurrent[il]) {
      append(state_.conv_state[il], cs);
      append(state_.ssm_state[il], ss);
    } else {
      append(state_.k_cache[il], kv);
      append(state_.v_cache[il], kv);
    }
  }
  return out;
}

void Graph::load_state(const std::vector<float>& s, int n_pos) {
  const size_t kv = kv_floats(n_pos);
  const size_t cs = static_cast<size_t>(c_.ssm_conv - 1) * c_.ssm_conv_channels();
  const size_t ss = static_cast<size_t>(c_.ssm_n_v) * c_.ssm_d_state * c_.ssm_head_v_dim();
  size_t at = 0;
  for (uint32_t il = 0; il < c_.n_layer; ++il) {
    auto take = [&](float* p, size_t n) {
      be_.from_host(p, s.data() + at, n);
      at += n;
    };
    if (c_.recurrent[il]) {
      take(state_.conv_state[il], cs);
      take(state_.ssm_state[il], ss);
    } else {
      take(state_.k_cache[il], kv);
      take(state_.v_cache[il], kv);
    }
  }
}

void Graph::name(const char* what, int layer, const float* p, int64_t width, int t, int pos0) {
  if (dump_dir_.empty()) return;
  std::vector<float> host(static_cast<size_t>(width) * t);
  be_.to_host(host.data(), p, host.size());
  std::string base = layer >= 0 ? fmt::format("{}-{}", what, layer) : std::string(what);
  for (int i = 0; i < t; ++i) {
    std::string dir = fmt::format("{}/pos{}", dump_dir_, pos0 + i);
    std::filesystem::create_directories(dir);
    std::string file = fmt::format("{}/{}.f32", dir, base);
    std::FILE* f = std::fopen(file.c_str(), "wb");
    if (!f) fail("{}: cannot write activation dump", file);
    std::fwrite(host.data() + static_cast<size_t>(i) * width, sizeof(float), static_cast<size_t>(width), f);
    std::fclose(f);
  }
}

// The shared input site of every folded linear: y = FWHT_B(s_K ⊙ x)/√B, or a
// copy for unrotated models (y == x is then fine for the caller).
void Graph::hadamard_site(const float* x, float* y, int64_t k, int t) {
  if (block_ == 0) {
    be_.copy(y, x, static_cast<size_t>(k) * t);
    return;
  }
  be_.hadamard(x, signs_for(k), y, t, k, block_, /*inverse=*/false);
}

const float* Graph::signs_for(int64_t k) const {
  for (const auto& [w, p] : signs_)
    if (w == k) return p;
  return nullptr;  // identity sign mode (or unrotated model)
}

void Graph::forward(const int32_t* tokens, int t, int pos0, float* logits_host, bool all_logits) {
  // Head: only the rows whose logits are wanted.
  const int first = all_logits ? 0 : t - 1;
  const int rows = t - first;
  compute(tokens, t, pos0, logits_host != nullptr, first);
  if (!logits_host) return;  // a prefill chunk whose logits nobody reads
  be_.to_host(logits_host, s_->logits, static_cast<size_t>(rows) * c_.n_vocab);
}

void Graph::forward_top_k(int32_t token, int pos0, int k, int64_t n, int32_t* ids, float* values) {
  if (n < 1 || n > static_cast<int64_t>(c_.n_vocab)) fail("top_k over {} logits of {}", n, c_.n_vocab);
  compute(&token, 1, pos0, true, 0);
  be_.top_k(s_->logits, n, k, ids, values);
}

void Graph::logits_to_host(float* host) {
  if (!s_) fail("logits_to_host: nothing has run yet");
  be_.to_host(host, s_->logits, c_.n_vocab);
}

void Graph::compute(const int32_t* tokens, int t, int pos0, bool head, int first) {
  if (pos0 + t > state_.n_ctx) fail("context full: {} positions needed, n_ctx = {}", pos0 + t, state_.n_ctx);
  ensure_scratch(t);
  // A decode step (one token, logits wanted) issues the same ops on the same buffers every
  // time; backends that can (CUDA graphs) record it once and replay it, with pos0 and the
  // token id read from backend memory (Backend::replay_step / begin_capture).
  const bool step = t == 1 && head && dump_dir_.empty();
  if (!(step && be_.replay_step(tokens, t, pos0))) {
    const bool capturing = step && be_.begin_capture(tokens, t, pos0);
    try {
      forward_ops(tokens, t, pos0, head, first);
    } catch (...) {
      if (capturing) be_.drop_capture();
      throw;
    }
    if (capturing) be_.end_capture();
  }
}

void Graph::forward_ops(const int32_t* tokens, int t, int pos0, bool head, int first) {
  Scratch& s = *s_;
  const int64_t E = c_.n_embd;
  be_.embed(w_.tok_embd, tokens, t, s.xn);
  if (block_ != 0) {
    be_.hadamard(s.xn, signs_for(E), s.x, t, E, block_, /*inverse=*/true);  // e = s ⊙ FWHT(z)/√B
  } else {
    be_.copy(s.x, s.xn, static_cast<size_t>(E) * t);
  }
  name("inp_embd", -1, s.x, E, t, pos0);

  // Each residual-add + RMSNorm + sign + FWHT is one fused site: before layer 0,
  // in the middle of each layer (post_attention_norm) and at its end (the next
  // layer's attn_norm, or output_norm for the head).
  const float* signs_e = signs_for(E);
  be_.residual_norm_site(s.x, nullptr, s.x, w_.layers[0].attn_norm, signs_e, block_, s.xn, s.xr, t, E,
                         c_.rms_eps);
  name("attn_norm", 0, s.xn, E, t, pos0);
  for (uint32_t il = 0; il < c_.n_layer; ++il) {
    const LayerWeights& L = w_.layers[il];
    const int l = static_cast<int>(il);
    if (L.recurrent)
      gdn_layer(l, t, pos0);
    else
      attention_layer(l, t, pos0);
    be_.residual_norm_site(s.x, s.mix, s.h, L.post_norm, signs_e, block_, s.xn, s.xr, t, E, c_.rms_eps);
    name("attn_residual", l, s.h, E, t, pos0);
    name("attn_post_norm", l, s.xn, E, t, pos0);
    ffn(l, t, pos0);
    const bool last = il + 1 == c_.n_layer;
    const Weight& next_gain = last ? w_.output_norm : w_.layers[il + 1].attn_norm;
    be_.residual_norm_site(s.h, s.ffo, s.x, next_gain, signs_e, block_, s.xn, s.xr, t, E, c_.rms_eps);
    name("l_out", l, s.x, E, t, pos0);
    if (last)
      name("result_norm", -1, s.xn, E, t, pos0);
    else
      name("attn_norm", l + 1, s.xn, E, t, pos0);
  }

  if (!head) return;  // a prefill chunk whose logits nobody reads: skip the head
  const int rows = t - first;
  be_.matmul(w_.output, s.xr + static_cast<int64_t>(first) * E, s.logits, rows);
  name("result_output", -1, s.logits, c_.n_vocab, rows, pos0 + first);
}

void Graph::gdn_layer(int il, int t, int pos0) {
  Scratch& s = *s_;
  const LayerWeights& L = w_.layers[il];
  const int64_t C = c_.ssm_conv_channels(), DI = c_.ssm_d_inner;
  const int NV = static_cast<int>(c_.ssm_n_v), NK = static_cast<int>(c_.ssm_n_k);
  const int DV = static_cast<int>(c_.ssm_head_v_dim());

  const Weight* proj[] = {&L.ssm_qkv, &L.ssm_z};
  float* proj_out[] = {s.qkv, s.z};
  be_.matmul_multi(proj, s.xr, proj_out, t);
  name("z", il, s.z, DI, t, pos0);
  GdnShape gs{NK, NV, static_cast<int>(c_.ssm_d_state), DV, c_.rms_eps};
  if (dump_dir_.empty()) {  // the whole mixer as one site (one launch on a GPU)
    Backend::GdnSite site;
    site.qkv = s.qkv;
    site.z = s.z;
    site.normed = s.xn;
    site.conv1d = &L.ssm_conv1d;
    site.alpha_w = &L.ssm_alpha;
    site.beta_w = &L.ssm_beta;
    site.ssm_a = &L.ssm_a;
    site.dt_bias = &L.ssm_dt_bias;
    site.norm_w = &L.ssm_norm;
    site.taps = static_cast<int>(c_.ssm_conv);
    site.conv_state = state_.conv_state[il];
    site.state = state_.ssm_state[il];
    site.conv = s.conv;
    site.alpha = s.alpha;
    site.beta_in = s.beta_in;
    site.g = s.g;
    site.beta = s.beta;
    site.o = s.o;
    site.normed_o = s.fo;
    site.out = permute_ssm_out_ ? s.fog : s.fo;
    site.shape = gs;
    site.norm_eps = c_.rms_eps;
    site.grouped = permute_ssm_out_;
    if (block_ != 0) {  // the out-projection's input site too (one launch with it on a GPU)
      site.rotated = s.fr;
      site.signs = signs_for(DI);
      site.block = block_;
    }
    be_.gdn_site(site, t);
    if (!site.rotated) hadamard_site(site.out, s.fr, DI, t);
    be_.matmul(L.ssm_out, s.fr, s.mix, t);
    name("linear_attn_out", il, s.mix, c_.n_embd, t, pos0);
    return;
  }
  // The same ops one by one, naming the intermediate activations for the dump.
  // alpha/beta read the UN-rotated normed input: they are not folded.
  const Weight* ab[] = {&L.ssm_alpha, &L.ssm_beta};
  float* ab_out[] = {s.alpha, s.beta_in};
  be_.matmul_multi(ab, s.xn, ab_out, t);
  name("alpha", il, s.alpha, NV, t, pos0);

  be_.ssm_conv(s.qkv, state_.conv_state[il], L.ssm_conv1d, s.conv, t, C, static_cast<int>(c_.ssm_conv));
  name("conv_output_silu", il, s.conv, C, t, pos0);
  be_.gdn_gates(s.alpha, s.beta_in, L.ssm_a, L.ssm_dt_bias, s.g, s.beta, t, NV);
  name("gate", il, s.g, NV, t, pos0);
  name("beta_sigmoid", il, s.beta, NV, t, pos0);

  be_.gdn_recurrence(s.conv, s.g, s.beta, state_.ssm_state[il], s.o, t, gs);
  name("attn_output", il, s.o, DI, t, pos0);
  be_.gated_rmsnorm(s.o, s.z, L.ssm_norm, s.fo, static_cast<int64_t>(t) * NV, DV, c_.rms_eps);
  name("final_output", il, s.fo, DI, t, pos0);

  const float* ssm_in = s.fo;
  if (permute_ssm_out_) {
    // tiled head r·n_k + k -> grouped head k·rep + r: view [rep][n_k][d] and swap the head axes.
    be_.transpose_heads(s.fo, s.fog, t, NV / NK, NK, DV);
    ssm_in = s.fog;
  }
  hadamard_site(ssm_in, s.fr, DI, t);
  be_.matmul(L.ssm_out, s.fr, s.mix, t);
  name("linear_attn_out", il, s.mix, c_.n_embd, t, pos0);
}

void Graph::attention_layer(int il, int t, int pos0) {
  Scratch& s = *s_;
  const LayerWeights& L = w_.layers[il];
  const int H = static_cast<int>(c_.n_head), HKV = static_cast<int>(c_.n_head_kv),
            D = static_cast<int>(c_.head_dim_k);
  const int64_t HD = prod(H, D);
  const Weight* proj[] = {&L.attn_q, &L.attn_k, &L.attn_v};
  float* proj_out[] = {s.qf, s.k, s.v};
  be_.matmul_multi(proj, s.xr, proj_out, t);
  AttentionShape as{H, HKV, D, 1.0f / std::sqrt(static_cast<float>(D)), state_.kv};
  if (dump_dir_.empty()) {  // norms, RoPE, KV store, attention and gate as one site
    Backend::AttentionSite site;
    site.qf = s.qf;
    site.k = s.k;
    site.v = s.v;
    site.q_norm = &L.attn_q_norm;
    site.k_norm = &L.attn_k_norm;
    site.eps = c_.rms_eps;
    site.n_rot = static_cast<int>(c_.n_rot);
    site.rope_base = c_.rope_base;
    site.k_cache = state_.k_cache[il];
    site.v_cache = state_.v_cache[il];
    site.q = s.q;
    site.qgate = s.qgate;
    site.out = s.att;
    site.shape = as;
    be_.attention_site(site, t, pos0);
  } else {
    attention_ops(il, t, pos0, as);
  }
  hadamard_site(s.att, s.attr, HD, t);
  be_.matmul(L.attn_out, s.attr, s.mix, t);
  name("attn_output", il, s.mix, c_.n_embd, t, pos0);
}

// attention_site's ops one by one, naming the intermediate activations for the dump.
void Graph::attention_ops(int il, int t, int pos0, const AttentionShape& as) {
  Scratch& s = *s_;
  const LayerWeights& L = w_.layers[il];
  const int H = static_cast<int>(c_.n_head), HKV = static_cast<int>(c_.n_head_kv),
            D = static_cast<int>(c_.head_dim_k);
  const int64_t HD = prod(H, D), KV = prod(HKV, D);
  // attn_q rows are per head [D query | D gate].
  be_.take_part(s.qf, s.q, static_cast<int64_t>(t) * H, 2, 0, D);
  be_.take_part(s.qf, s.qgate, static_cast<int64_t>(t) * H, 2, 1, D);
  be_.rmsnorm(s.q, L.attn_q_norm, s.q, static_cast<int64_t>(t) * H, D, c_.rms_eps);
  be_.rmsnorm(s.k, L.attn_k_norm, s.k, static_cast<int64_t>(t) * HKV, D, c_.rms_eps);
  name("Qcur_normed", il, s.q, HD, t, pos0);
  name("Kcur_normed", il, s.k, KV, t, pos0);
  be_.rope(s.q, t, H, D, static_cast<int>(c_.n_rot), c_.rope_base, pos0);
  be_.rope(s.k, t, HKV, D, static_cast<int>(c_.n_rot), c_.rope_base, pos0);
  be_.store_rows(state_.k_cache[il], s.k, KV, t, pos0, as.kv);
  be_.store_rows(state_.v_cache[il], s.v, KV, t, pos0, as.kv);
  be_.attention(s.q, state_.k_cache[il], state_.v_cache[il], s.att, t, pos0, as);
  name("attn_pregate", il, s.att, HD, t, pos0);
  be_.sigmoid_mul(s.att, s.qgate, s.att, HD * t);
  name("attn_gated", il, s.att, HD, t, pos0);
}

void Graph::ffn(int il, int t, int pos0) {
  // Input: s.xr = rotated post_attention_norm(h), produced by the fused site.
  Scratch& s = *s_;
  const LayerWeights& L = w_.layers[il];
  const int64_t E = c_.n_embd, F = c_.n_ff;
  const Weight* proj[] = {&L.ffn_gate, &L.ffn_up};
  float* proj_out[] = {s.fg, s.fu};
  be_.matmul_multi(proj, s.xr, proj_out, t);
  // act (s.fa) only for a dump: without one nothing reads it, and the site skips its store.
  be_.swiglu_site(s.fg, s.fu, dump_dir_.empty() ? nullptr : s.fa, signs_for(F), block_, s.far, t, F);
  name("ffn_swiglu", il, s.fa, F, t, pos0);
  be_.matmul(L.ffn_down, s.far, s.ffo, t);
  name("ffn_out", il, s.ffo, E, t, pos0);
}

}  // namespace bonsai
