// The op-level backend interface: everything the qwen35 graph computes goes
// through one of these calls, and the graph (src/model/graph.cpp) knows
// nothing else about where or how it runs.
//
// Memory model: activations, KV caches and recurrent states are float buffers
// allocated by the backend (host memory for CPU backends, device memory for a
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

#include "kernels/weight.h"

namespace bonsai {

struct AttentionShape {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f;
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
  virtual void matmul_multi(std::span<const Weight* const> ws, const float* x, std::span<float* const> ys, int t) {
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

  // ---- full attention ---------------------------------------------------------
  // NeoX rotate-half RoPE on the first n_rot dims of each head, positions pos0 + i for row i.
  virtual void rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0) = 0;
  // Causal attention of q [t][n_head][d] (positions pos0..pos0+t-1) over the cache rows
  // [0, pos0+t) of k_cache / v_cache ([n_ctx][n_head_kv][d]); out [t][n_head][d].
  virtual void attention(const float* q, const float* k_cache, const float* v_cache, float* out, int t, int pos0,
                         const AttentionShape& s) = 0;

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
  virtual void gated_rmsnorm(const float* o, const float* z, const Weight& w, float* y, int64_t rows, int64_t d,
                             float eps) = 0;
};

}  // namespace bonsai
