// The op-level backend interface: everything the qwen35 graph computes goes
// through one of these calls, and the graph (src/model/graph.cpp) knows
// nothing else about where or how it runs.
//
// Memory model: activations, KV caches and recurrent states are float buffers
// allocated by the backend (a KV cache of type F16 packs two halves per float
// slot and is passed as void*: see AttentionShape::kv) (host memory for CPU backends, device memory for a
// GPU backend). The graph passes them between ops but never dereferences them;
// results come back to the host only through to_host(). Weights stay in their
// file layout on the host (mmap); prepare() lets a backend repack or upload
// each weight once at load.
//
// Shapes: activations are row-major [t][width] (t = tokens in the batch; 1 for
// decode). Head-structured activations are [t][heads][head_dim].
//
// Every op has a plain-loop reference in kernels/ref/ (the spec) that each
// fast implementation is tested against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "bonsai/kv_type.h"
#include "kernels/ref/topk.h"
#include "kernels/weight.h"

namespace bonsai {

struct AttentionShape {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f;
  KvType kv = KvType::F32;  // element type of k_cache / v_cache (bonsai/kv_type.h)
};

struct GdnShape {
  int n_k = 0;        // key heads
  int n_v = 0;        // value heads (tiled order: value head h uses key head h % n_k)
  int d_k = 0;        // key/query head dim (ssm state size)
  int d_v = 0;        // value head dim
  float eps = 1e-6f;  // L2-norm epsilon
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // ---- memory -------------------------------------------------------------
  virtual float* alloc(size_t n) = 0;  // zero-initialised; owned by the backend
  virtual void release(float* p) = 0;
  virtual void to_host(float* dst_host, const float* src, size_t n) = 0;
  virtual void from_host(float* dst, const float* src_host, size_t n) = 0;
  virtual void copy(float* dst, const float* src, size_t n) = 0;
  virtual void zero(float* p, size_t n) = 0;
  virtual void prepare(Weight& w) {}
  virtual void unprepare(Weight& w) {}
  // Blocks until queued work is done (GPU backends); no-op on the CPU.
  virtual void sync() {}
  // Tokens per prefill chunk this backend runs best with (0: no preference; Session uses 64).
  virtual int preferred_prefill_chunk() const { return 0; }
  // KV cache element type of a session that does not choose one (SessionOptions::kv_type unset):
  // f32, the reference's type, unless the backend is a fast path that gains from halving the
  // cache's bytes (CUDA: f16, as llama.cpp).
  virtual KvType default_kv_type() const { return KvType::F32; }

  // ---- the head's candidates ------------------------------------------------------
  // The k best of x[0..n) (backend memory) into host arrays ids[k] / values[k], best first:
  // the larger value first, NaN as -inf, equal values by the lower index (ref::top_k; the
  // order Sampler ranks logits in, so k = 1 is the greedy token). 1 <= k <= min(n, kMaxTopK).
  // The default brings x to the host and selects there; a GPU backend selects on the device
  // so that only the 2k words cross.
  virtual void top_k(const float* x, int64_t n, int k, int32_t* ids, float* values) {
    ref::check_top_k(n, k);
    std::vector<float> host(static_cast<size_t>(n));
    to_host(host.data(), x, host.size());
    ref::top_k(host.data(), n, k, ids, values);
  }

  // ---- embedding and norms -------------------------------------------------
  // out[i] = dequantized row tokens[i] of table ([t][table.k]); token ids are host memory.
  virtual void embed(const Weight& table, const int32_t* tokens, int t, float* out) = 0;
  // y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * gain, for `rows` rows of width n (gain: F32, length n).
  virtual void rmsnorm(const float* x, const Weight& gain, float* y, int64_t rows, int64_t n, float eps) = 0;
  // Blockwise signed Walsh–Hadamard on each row of width k (block | k, power of two).
  // forward: y = FWHT(s ⊙ x)/√B (folded-linear input); inverse: y = s ⊙ FWHT(x)/√B (embedding).
  // signs: backend memory of k values ±1, or nullptr for identity.
  virtual void hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k, int64_t block,
                        bool inverse) = 0;

  // ---- linear --------------------------------------------------------------
  // y[t][w.n] = x[t][w.k] · Wᵀ for any weight format.
  virtual void matmul(const Weight& w, const float* x, float* y, int t) = 0;
  // Several weights reading the same input (q/k/v, qkv/z, gate/up): one pass over x.
  virtual void matmul_multi(std::span<const Weight* const> ws, const float* x, std::span<float* const> ys,
                            int t) {
    for (size_t i = 0; i < ws.size(); ++i) matmul(*ws[i], x, ys[i], t);
  }

  // ---- elementwise / layout ---------------------------------------------------
  virtual void add(const float* a, const float* b, float* y, int64_t n) = 0;
  // y = silu(gate) ⊙ up
  virtual void swiglu(const float* gate, const float* up, float* y, int64_t n) = 0;
  // y = x ⊙ sigmoid(gate)
  virtual void sigmoid_mul(const float* x, const float* gate, float* y, int64_t n) = 0;
  // [rows][a][b][d] -> [rows][b][a][d]  (e.g. GDN value heads tiled (r, k) -> grouped (k, r))
  virtual void transpose_heads(const float* x, float* y, int64_t rows, int a, int b, int64_t d) = 0;
  // [rows][parts][d] -> part p as [rows][d] (e.g. split attn_q's per-head query|gate).
  virtual void take_part(const float* x, float* y, int64_t rows, int parts, int part, int64_t d) = 0;

  // ---- fused activation sites ---------------------------------------------------
  // Defaults compose the ops above; a backend overrides them to do the work in
  // one pass (one launch on a GPU). block == 0 means an unrotated model: the
  // "rotated" output is then a copy of its input.
  //
  // x_out = x + delta (delta may be nullptr: x_out = x; x_out may alias x),
  // normed = rmsnorm(x_out)·gain (kept: ssm_alpha/beta read it un-rotated),
  // rotated = FWHT_B(s ⊙ normed)/√B — the input of every folded linear after a norm.
  virtual void residual_norm_site(const float* x, const float* delta, float* x_out, const Weight& gain,
                                  const float* signs, int64_t block, float* normed, float* rotated,
                                  int64_t rows, int64_t n, float eps) {
    if (delta)
      add(x, delta, x_out, rows * n);
    else if (x_out != x)
      copy(x_out, x, static_cast<size_t>(rows * n));
    rmsnorm(x_out, gain, normed, rows, n, eps);
    if (block > 0)
      hadamard(normed, signs, rotated, rows, n, block, false);
    else
      copy(rotated, normed, static_cast<size_t>(rows * n));
  }
  // act = silu(gate) ⊙ up; rotated = FWHT_B(s ⊙ act)/√B (the input of ffn_down). act may be
  // null: nothing reads it (the graph passes it only when it dumps activations), so only rotated
  // is written (a GPU saves the act row's store: 36 MB per FFN layer at 512 tokens of the 27B).
  virtual void swiglu_site(const float* gate, const float* up, float* act, const float* signs, int64_t block,
                           float* rotated, int64_t rows, int64_t n) {
    float* a = act ? act : rotated;  // hadamard runs in place (every implementation reads x first)
    swiglu(gate, up, a, rows * n);
    if (block > 0)
      hadamard(a, signs, rotated, rows, n, block, false);
    else if (a != rotated)
      copy(rotated, a, static_cast<size_t>(rows * n));
  }

  // ---- full attention ---------------------------------------------------------
  // NeoX rotate-half RoPE on the first n_rot dims of each head, positions pos0 + i for row i.
  virtual void rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0) = 0;
  // Causal attention of q [t][n_head][d] (positions pos0..pos0+t-1) over the cache rows
  // [0, pos0+t) of k_cache / v_cache ([n_ctx][n_head_kv][d] of type s.kv); out [t][n_head][d].
  virtual void attention(const float* q, const void* k_cache, const void* v_cache, float* out, int t,
                         int pos0, const AttentionShape& s) = 0;
  // cache rows [pos0, pos0+t) of width `width` (elements of type kv) = src [t][width], rounded
  // to nearest even for F16 (the KV-cache append).
  virtual void store_rows(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv) = 0;

  // ---- gated delta net -------------------------------------------------------------
  // Depthwise causal conv over the last `taps` inputs of each channel, then SiLU.
  // x [t][C]; state [(taps-1)][C] holds the previous inputs (oldest first) and is updated;
  // w is ssm_conv1d (F32, ne {taps, C}).
  virtual void ssm_conv(const float* x, float* state, const Weight& w, float* out, int t, int64_t channels,
                        int taps) = 0;
  // g = ssm_a · softplus(alpha + dt_bias); beta = sigmoid(beta_in). [t][n_v] each.
  virtual void gdn_gates(const float* alpha, const float* beta_in, const Weight& ssm_a, const Weight& dt_bias,
                         float* g, float* beta, int t, int n_v) = 0;
  // The delta rule over t tokens. conv [t][2·n_k·d_k + n_v·d_v] holds q|k|v after conv+SiLU;
  // q and k are L2-normalised per head and q scaled by 1/√d_k inside. state [n_v][d_k][d_v]
  // fp32 is updated; out [t][n_v][d_v].
  virtual void gdn_recurrence(const float* conv, const float* g, const float* beta, float* state, float* out,
                              int t, const GdnShape& s) = 0;
  // y = rmsnorm(o)·w ⊙ silu(z) per head of width d (w: F32 length d). rows = t·heads.
  virtual void gated_rmsnorm(const float* o, const float* z, const Weight& w, float* y, int64_t rows,
                             int64_t d, float eps) = 0;

  // ---- mixer sites: a layer's mixer between its input projections and its output linear ----
  // The defaults compose the ops above in the graph's order; a backend overrides them to
  // run the whole mixer in a few launches. Buffers marked scratch may be left with any
  // content (a fused implementation need not write them).

  // Full attention. qf [t][n_head][2][d] is attn_q's output (per head: query | gate); k, v
  // [t][n_head_kv][d] are attn_k / attn_v's. q = rmsnorm(query)·q_norm and k = rmsnorm(k)·k_norm
  // per head, NeoX RoPE on the first n_rot dims of both (positions pos0 + i), k and v appended
  // to the caches at rows [pos0, pos0 + t), then out [t][n_head][d] = attention(q) ⊙ sigmoid(gate).
  struct AttentionSite {
    const float* qf = nullptr;
    float* k = nullptr;  // scratch after the call (normed and rotated in place by the default)
    const float* v = nullptr;
    const Weight* q_norm = nullptr;
    const Weight* k_norm = nullptr;
    float eps = 1e-6f;
    int n_rot = 0;
    float rope_base = 10000.0f;
    void* k_cache = nullptr;  // [n_ctx][n_head_kv][d] of type shape.kv
    void* v_cache = nullptr;
    float* q = nullptr;      // scratch [t][n_head][d]
    float* qgate = nullptr;  // scratch [t][n_head][d]
    float* out = nullptr;    // [t][n_head][d]
    AttentionShape shape;
  };
  virtual void attention_site(const AttentionSite& a, int t, int pos0) {
    const AttentionShape& s = a.shape;
    const int64_t rows_q = static_cast<int64_t>(t) * s.n_head, rows_k = static_cast<int64_t>(t) * s.n_head_kv;
    const int64_t kv = static_cast<int64_t>(s.n_head_kv) * s.head_dim;
    take_part(a.qf, a.q, rows_q, 2, 0, s.head_dim);
    take_part(a.qf, a.qgate, rows_q, 2, 1, s.head_dim);
    rmsnorm(a.q, *a.q_norm, a.q, rows_q, s.head_dim, a.eps);
    rmsnorm(a.k, *a.k_norm, a.k, rows_k, s.head_dim, a.eps);
    rope(a.q, t, s.n_head, s.head_dim, a.n_rot, a.rope_base, pos0);
    rope(a.k, t, s.n_head_kv, s.head_dim, a.n_rot, a.rope_base, pos0);
    store_rows(a.k_cache, a.k, kv, t, pos0, s.kv);
    store_rows(a.v_cache, a.v, kv, t, pos0, s.kv);
    attention(a.q, a.k_cache, a.v_cache, a.out, t, pos0, s);
    sigmoid_mul(a.out, a.qgate, a.out, rows_q * s.head_dim);
  }

  // Gated delta net. qkv [t][2·n_k·d_k + n_v·d_v] and z [t][n_v·d_v] are ssm_qkv / ssm_z's
  // outputs, normed [t][alpha_w.k] the un-rotated normed layer input (ssm_alpha/beta read it).
  // conv = ssm_conv(qkv) (conv_state updated), alpha/beta_in = normed · ssm_alpha/ssm_betaᵀ,
  // gates, the delta rule (state updated), then out = gated_rmsnorm(o, z)·norm_w, with the value
  // heads moved from tiled to grouped order when `grouped` (transpose_heads a = n_v/n_k, b = n_k).
  // rotated (optional): then also the out-projection's input site, hadamard(out, signs, rotated,
  // t, n_v·d_v, block, forward) (a backend may fold it into the site's own launch).
  struct GdnSite {
    const float* qkv = nullptr;
    const float* z = nullptr;
    const float* normed = nullptr;
    const Weight* conv1d = nullptr;  // F32 ne {taps, channels}
    const Weight* alpha_w = nullptr;
    const Weight* beta_w = nullptr;
    const Weight* ssm_a = nullptr;
    const Weight* dt_bias = nullptr;
    const Weight* norm_w = nullptr;
    int taps = 4;
    float* conv_state = nullptr;  // [taps-1][channels]
    float* state = nullptr;       // [n_v][d_k][d_v]
    // scratch: conv [t][channels]; alpha, beta_in, g, beta [t][n_v]; o, normed_o [t][n_v·d_v]
    float *conv = nullptr, *alpha = nullptr, *beta_in = nullptr, *g = nullptr, *beta = nullptr;
    float *o = nullptr, *normed_o = nullptr;
    float* out = nullptr;  // [t][n_v·d_v]
    GdnShape shape;
    float norm_eps = 1e-6f;
    bool grouped = false;
    float* rotated = nullptr;  // [t][n_v·d_v] or null
    const float* signs = nullptr;
    int64_t block = 0;
  };
  virtual void gdn_site(const GdnSite& a, int t) {
    const GdnShape& s = a.shape;
    const int64_t channels = 2 * static_cast<int64_t>(s.n_k) * s.d_k + static_cast<int64_t>(s.n_v) * s.d_v;
    const Weight* ab[] = {a.alpha_w, a.beta_w};
    float* ab_out[] = {a.alpha, a.beta_in};
    matmul_multi(ab, a.normed, ab_out, t);
    ssm_conv(a.qkv, a.conv_state, *a.conv1d, a.conv, t, channels, a.taps);
    gdn_gates(a.alpha, a.beta_in, *a.ssm_a, *a.dt_bias, a.g, a.beta, t, s.n_v);
    gdn_recurrence(a.conv, a.g, a.beta, a.state, a.o, t, s);
    float* y = a.grouped ? a.normed_o : a.out;
    gated_rmsnorm(a.o, a.z, *a.norm_w, y, static_cast<int64_t>(t) * s.n_v, s.d_v, a.norm_eps);
    if (a.grouped) transpose_heads(y, a.out, t, s.n_v / s.n_k, s.n_k, s.d_v);
    if (a.rotated)
      hadamard(a.out, a.signs, a.rotated, t, static_cast<int64_t>(s.n_v) * s.d_v, a.block, false);
  }

  // ---- recorded decode steps (optional; GPU backends: one CUDA graph per step) ----------
  // A decode step issues the same ops on the same buffers every time; only pos0 and the
  // token ids change. replay_step() runs the recorded step for new tokens/pos0 and returns
  // true, or returns false when there is no recording. Then the caller may call
  // begin_capture(); if it returns true, the ops issued until end_capture() are recorded
  // (and run by end_capture()). Ops that depend on pos0 or the token ids (embed, rope,
  // store_rows, attention) read them from backend memory while recording, so one
  // recording serves every position. A recording is dropped when a buffer is released
  // or by drop_capture() (which also abandons a capture in progress).
  virtual bool replay_step(const int32_t* tokens, int t, int pos0) { return false; }
  virtual bool begin_capture(const int32_t* tokens, int t, int pos0) { return false; }
  virtual void end_capture() {}
  virtual void drop_capture() {}
};

}  // namespace bonsai
