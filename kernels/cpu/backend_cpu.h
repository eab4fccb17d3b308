// The fast CPU backend: ternary matvec kernels on the mapped weights
// (kernels/cpu/matvec.h), AVX2 FWHT, and threaded attention / delta rule. Ops
// whose cost is negligible next to the weight stream (norms, gates, conv,
// elementwise) are inherited from the reference backend unchanged.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/matvec.h"
#include "kernels/cpu/repack.h"
#include "kernels/ref/ref_backend.h"
#include "runtime/thread_pool.h"

namespace bonsai {

class CpuBackend : public RefBackend {
 public:
  CpuBackend(int n_threads, Isa isa, cpu::Precision precision);
  std::string_view name() const override { return name_; }

  void hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k, int64_t block,
                bool inverse) override;
  void matmul(const Weight& w, const float* x, float* y, int t) override;
  void matmul_multi(std::span<const Weight* const> ws, const float* x, std::span<float* const> ys,
                    int t) override;
  void residual_norm_site(const float* x, const float* delta, float* x_out, const Weight& gain,
                          const float* signs, int64_t block, float* normed, float* rotated, int64_t rows,
                          int64_t n, float eps) override;
  void swiglu_site(const float* gate, const float* up, float* act, const float* signs, int64_t block,
                   float* rotated, int64_t rows, int64_t n) override;
  void store_rows(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv) override;
  void attention(const float* q, const void* k_cache, const void* v_cache, float* out, int t, int pos0,
                 const AttentionShape& s) override;
  void gdn_recurrence(const float* conv, const float* g, const float* beta, float* state, float* out, int t,
                      const GdnShape& s) override;
  void ssm_conv(const float* x, float* state, const Weight& w, float* out, int t, int64_t channels,
                int taps) override;
  void gated_rmsnorm(const float* o, const float* z, const Weight& w, float* y, int64_t rows, int64_t d,
                     float eps) override;
  void sigmoid_mul(const float* x, const float* gate, float* y, int64_t n) override;
  // Load-time repacks (kernels/cpu/repack.h: PTQ1_0 → PQ2_0 by default, PQ2_0
  // copied to huge pages on request); w.data stays the file's bytes for other ops.
  void prepare(Weight& w) override;
  void unprepare(Weight& w) override;
  // Buffers of ≥ 1 MiB (the GDN state: 150 MB for the 27B, streamed every
  // token; the KV cache) on huge-page-advised memory; smaller ones as RefBackend.
  float* alloc(size_t n) override;
  void release(float* p) override;

  ThreadPool& pool() { return pool_; }
  Isa isa() const { return isa_; }

 private:
  static bool fast_type(DType t);
  // What the decode matvec reads: the repack prepare() made, else the file layout.
  static cpu::WeightView view(const Weight& w);
  ThreadPool pool_;
  Isa isa_;
  cpu::Precision precision_;
  cpu::PreparedAct act_;      // reused across calls: prepare_act allocates nothing in steady state
  cpu::PreparedBatch batch_;  // the prefill GEMM's quantized batch, reused likewise
  std::string name_;
  cpu::RepackPolicy repack_policy_;
  std::vector<std::unique_ptr<cpu::Repack>> repacks_;                  // owned targets of Weight::prepared
  std::unordered_map<float*, std::unique_ptr<cpu::HugeBuffer>> huge_;  // alloc() blocks ≥ 1 MiB
};

}  // namespace bonsai
