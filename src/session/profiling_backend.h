// A Backend decorator that times every op of the backend it wraps (after a
// sync, so GPU work is attributed to the op that queued it). Used by
// `bonsai bench --profile` for the per-op breakdown of a decode step.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace bonsai {

struct OpStat {
  double seconds = 0;
  uint64_t calls = 0;
  uint64_t weight_bytes = 0;  // bytes of weights the op streamed (matmuls)
};

class ProfilingBackend : public Backend {
 public:
  explicit ProfilingBackend(std::unique_ptr<Backend> inner);
  std::string_view name() const override { return inner_->name(); }
  const std::map<std::string, OpStat>& stats() const { return stats_; }
  void clear() { stats_.clear(); }

  float* alloc(size_t n) override { return inner_->alloc(n); }
  void release(float* p) override { inner_->release(p); }
  void to_host(float* d, const float* s, size_t n) override;
  void from_host(float* d, const float* s, size_t n) override;
  void copy(float* d, const float* s, size_t n) override;
  void zero(float* p, size_t n) override;
  void prepare(Weight& w) override { inner_->prepare(w); }
  void unprepare(Weight& w) override { inner_->unprepare(w); }
  void sync() override { inner_->sync(); }
  int preferred_prefill_chunk() const override { return inner_->preferred_prefill_chunk(); }
  KvType default_kv_type() const override { return inner_->default_kv_type(); }
  void top_k(const float* x, int64_t n, int k, int32_t* ids, float* values) override;

  void embed(const Weight& table, const int32_t* tokens, int t, float* out) override;
  void rmsnorm(const float* x, const Weight& gain, float* y, int64_t rows, int64_t n, float eps) override;
  void hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k, int64_t block,
                bool inverse) override;
  void matmul(const Weight& w, const float* x, float* y, int t) override;
  void matmul_multi(std::span<const Weight* const> ws, const float* x, std::span<float* const> ys,
                    int t) override;
  void add(const float* a, const float* b, float* y, int64_t n) override;
  void swiglu(const float* gate, const float* up, float* y, int64_t n) override;
  void sigmoid_mul(const float* x, const float* gate, float* y, int64_t n) override;
  void transpose_heads(const float* x, float* y, int64_t rows, int a, int b, int64_t d) override;
  void take_part(const float* x, float* y, int64_t rows, int parts, int part, int64_t d) override;
  void residual_norm_site(const float* x, const float* delta, float* x_out, const Weight& gain,
                          const float* signs, int64_t block, float* normed, float* rotated, int64_t rows,
                          int64_t n, float eps) override;
  void swiglu_site(const float* gate, const float* up, float* act, const float* signs, int64_t block,
                   float* rotated, int64_t rows, int64_t n) override;
  void store_rows(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv) override;
  // The capture hooks keep their no-op defaults: a profiled run executes every op eagerly.
  void rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0) override;
  void attention(const float* q, const void* k_cache, const void* v_cache, float* out, int t, int pos0,
                 const AttentionShape& s) override;
  void ssm_conv(const float* x, float* state, const Weight& w, float* out, int t, int64_t channels,
                int taps) override;
  void gdn_gates(const float* alpha, const float* beta_in, const Weight& ssm_a, const Weight& dt_bias,
                 float* g, float* beta, int t, int n_v) override;
  void gdn_recurrence(const float* conv, const float* g, const float* beta, float* state, float* out, int t,
                      const GdnShape& s) override;
  void gated_rmsnorm(const float* o, const float* z, const Weight& w, float* y, int64_t rows, int64_t d,
                     float eps) override;

 private:
  template <class F>
  void timed(const std::string& key, uint64_t bytes, F&& f);
  std::unique_ptr<Backend> inner_;
  std::map<std::string, OpStat> stats_;
};

// "blk.12.ffn_down.weight" -> "ffn_down"; "output.weight" -> "output".
std::string weight_kind(const std::string& name);

}  // namespace bonsai
