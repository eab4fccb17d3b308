// The scalar reference backend: host memory, every op from kernels/ref/ops.h.
#pragma once

#include <memory>
#include <unordered_map>

#include "kernels/backend.h"

namespace bonsai {

// Host-memory allocations shared by the CPU backends (RAII: freed with the backend).
class HostArena {
 public:
  float* alloc(size_t n);
  void release(float* p);

 private:
  std::unordered_map<float*, std::unique_ptr<float[]>> blocks_;
};

class RefBackend : public Backend {
 public:
  std::string_view name() const override { return "ref"; }
  float* alloc(size_t n) override { return arena_.alloc(n); }
  void release(float* p) override { arena_.release(p); }
  void to_host(float* dst, const float* src, size_t n) override;
  void from_host(float* dst, const float* src, size_t n) override;
  void copy(float* dst, const float* src, size_t n) override;
  void zero(float* p, size_t n) override;
  // Host memory: selects in place, without the default's copy.
  void top_k(const float* x, int64_t n, int k, int32_t* ids, float* values) override {
    ref::top_k(x, n, k, ids, values);
  }

  void embed(const Weight& table, const int32_t* tokens, int t, float* out) override;
  void rmsnorm(const float* x, const Weight& gain, float* y, int64_t rows, int64_t n, float eps) override;
  void hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k, int64_t block,
                bool inverse) override;
  void matmul(const Weight& w, const float* x, float* y, int t) override;
  void add(const float* a, const float* b, float* y, int64_t n) override;
  void swiglu(const float* gate, const float* up, float* y, int64_t n) override;
  void sigmoid_mul(const float* x, const float* gate, float* y, int64_t n) override;
  void transpose_heads(const float* x, float* y, int64_t rows, int a, int b, int64_t d) override;
  void take_part(const float* x, float* y, int64_t rows, int parts, int part, int64_t d) override;
  void rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0) override;
  void attention(const float* q, const void* k_cache, const void* v_cache, float* out, int t, int pos0,
                 const AttentionShape& s) override;
  void store_rows(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv) override;
  void ssm_conv(const float* x, float* state, const Weight& w, float* out, int t, int64_t channels,
                int taps) override;
  void gdn_gates(const float* alpha, const float* beta_in, const Weight& ssm_a, const Weight& dt_bias,
                 float* g, float* beta, int t, int n_v) override;
  void gdn_recurrence(const float* conv, const float* g, const float* beta, float* state, float* out, int t,
                      const GdnShape& s) override;
  void gated_rmsnorm(const float* o, const float* z, const Weight& w, float* y, int64_t rows, int64_t d,
                     float eps) override;

 private:
  HostArena arena_;
};

}  // namespace bonsai
