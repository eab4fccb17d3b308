// The CUDA backend: every Backend op as a kernel on one stream, weights
// uploaded once at prepare() (ternary ones repacked for the int8 tensor-core
// matvec, kernels/cuda/tile_layout.h), and decode steps recorded once as a CUDA
// graph and replayed (Backend::begin_capture / replay_step).
//
// This header is plain C++ (no CUDA types), so host code can create and use
// the backend; it exists only in builds with BONSAI_HAVE_CUDA.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace bonsai {

// Number of usable CUDA devices; 0 with the reason in *why (no driver, no device, ...).
int cuda_device_count(std::string* why = nullptr);

class CudaBackend : public Backend {
 public:
  // Throws bonsai::Error when the device is unusable. Makes `device` the calling thread's current
  // device: the backend's calls run on the current device, so use it from that thread (or from one
  // whose current device is the same).
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  float* alloc(size_t n) override;
  void release(float* p) override;
  void to_host(float* dst_host, const float* src, size_t n) override;
  void from_host(float* dst, const float* src_host, size_t n) override;
  void copy(float* dst, const float* src, size_t n) override;
  void zero(float* p, size_t n) override;
  void prepare(Weight& w) override;
  void unprepare(Weight& w) override;
  void sync() override;
  // 1024: the prefill GEMM reads each weight once per chunk, and more tokens per chunk fill its
  // rounds of blocks better (H200, 27B, session 6, `bonsai bench ... -ub 256,512,1024`: pp512 at
  // 256 / 512 6724 / 7139 t/s, pp2048 at 256 / 512 / 1024 6668 / 6993 / 7225; docs/performance.md).
  // -ub/--ubatch-size overrides it.
  int preferred_prefill_chunk() const override { return 1024; }
  // f16, as llama.cpp: decode attention reads half the bytes and runs on the tensor cores past
  // 1024 positions (+9 % tg at 16384 positions, +24 % at 65536 on the H200; the gate's fast
  // criteria hold with the same margins as with f32: docs/performance.md, session 17).
  KvType default_kv_type() const override { return KvType::F16; }

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
  // With act null (nothing reads the site's intermediates: Backend::swiglu_site), a gate+up
  // matvec whose split sums the lean site adds (set_ffn_defer, set_swi_site > 0) leaves gate and
  // up unsummed: the sums are not stored back.
  void swiglu_site(const float* gate, const float* up, float* act, const float* signs, int64_t block,
                   float* rotated, int64_t rows, int64_t n) override;
  void rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0) override;
  void store_rows(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv) override;
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
  void attention_site(const AttentionSite& a, int t, int pos0) override;
  void gdn_site(const GdnSite& a, int t) override;
  // Two-pass selection on the device (kernels/cuda/topk.cu); only the 2k words are copied.
  void top_k(const float* x, int64_t n, int k, int32_t* ids, float* values) override;

  bool replay_step(const int32_t* tokens, int t, int pos0) override;
  bool begin_capture(const int32_t* tokens, int t, int pos0) override;
  void end_capture() override;
  void drop_capture() override;

  // ---- for tests and benchmarks ----
  std::string device_name() const;
  // Device-to-device copy rate in bytes per second (bytes read + bytes written).
  double copy_bandwidth(size_t bytes, int reps);
  // Seconds per launch of a pure streaming read of `bytes` from one of `copies` buffers by
  // blocks_per_sm x SMs blocks of 512 threads, launched and recorded like the decode matvecs
  // (cuda::measure_read_chain): the matvec benchmark's yardstick for what any kernel reading that
  // many bytes per call reaches. With 4 blocks per SM the next launch becomes resident only as this
  // one drains (as the matvec's); with fewer it can start beside it.
  double read_chain_seconds(size_t bytes, int copies, int reps, int blocks_per_sm);
  // GPU seconds per call of `ops`: the ops are recorded once as a CUDA graph and the
  // graph is replayed `reps` times between two events.
  double time_recorded(const std::function<void()>& ops, int reps);
  size_t device_bytes() const;  // weights + buffers currently allocated
  // Site launches (hadamard, residual_norm_site, swiglu_site) so far that wrote the fp16 GEMM's
  // activation instead of the int8 quantization (BONSAI_CUDA_SITE_F16).
  int64_t site_f16_launches() const;
  // Site launches so far whose consumer was the fp16 GEMM that skipped the int8 quantization.
  int64_t site_quant_skips() const;
  // Which prefill sites may write the fp16 GEMM's activation: 0 none, 1 all (a block per row),
  // 2 rows of at most 8 Hadamard blocks, 3 as 2 and wider rows in two passes, 4 all in two
  // passes; skip_quant: the others whose consumer is the fp16 GEMM skip the int8 quantization
  // (defaults: BONSAI_CUDA_SITE_F16, BONSAI_CUDA_SITE_SKIPQ; results do not depend on them).
  void set_site_f16(int mode, bool skip_quant = true);
  // With mode 3: the sites write the fp16 record in one launch of a cluster per row
  // (cuda::site_f16_cluster), `narrow` / `wide` Hadamard blocks per thread block (1..4; 0: the
  // block-per-row kernel / two passes) for rows of at most / more than 8 Hadamard blocks
  // (default: BONSAI_CUDA_SITE_CLUSTER="narrow,wide"; results do not depend on it).
  void set_site_cluster(int narrow, int wide);
  // Site launches so far that ran as a cluster per row.
  int64_t site_f16_cluster_launches() const;
  // Cache hints of launches issued afterwards (results do not depend on them): the matvec's
  // weight loads with an L2 evict-first policy (default: BONSAI_CUDA_MV_EVICT, else on), the
  // GDN site's state loads and stores streaming (BONSAI_CUDA_GDN_STREAM, else on).
  void set_cache_hints(bool matvec_evict_first, bool gdn_state_stream);
  // How a lone matvec feeding residual_norm_site is summed (default: BONSAI_CUDA_MV_DEFER,
  // else 1): 0 its own fix-up, 1 the site adds the split sums, 2 a standalone sum kernel.
  void set_matvec_defer(int mode);
  // Whether the FFN gate+up matvec (one launch of two jobs) feeding swiglu_site leaves its split
  // sums to the site (default: BONSAI_CUDA_FFN_DEFER, else on; results do not depend on it), and
  // the thread blocks per Hadamard block (1, 2, 4 or 8) of the decode SwiGLU site and of the
  // plain FWHT site (BONSAI_CUDA_FWHT_CLUSTER="swiglu,plain", else 1,1: one block, as hadamard();
  // results do not depend on it).
  void set_ffn_defer(bool on);
  // Which of the mixers' input launches leave their split sums to their decode sites, a bit
  // mask: 1 the GDN qkv+z launch (cuda::gdn_decode at t = 1), 2 the attention q/k/v launch
  // (cuda::attention_prep) (default: BONSAI_CUDA_QKV_DEFER=0..3, else kQkvDefer; results do
  // not depend on it; other values are errors).
  void set_qkv_defer(int mask);
  void set_fwht_cluster(int swiglu, int plain);
  // The deferred decode SwiGLU site's lean kernel over 1, 2 or 4 blocks per Hadamard block, 0:
  // fwht_split_kernel, low_regs: its registers capped at 64 (cuda::swiglu_site_lean; default:
  // BONSAI_CUDA_SWI_SITE, BONSAI_CUDA_SWI_REGS), and the decode attention merge run with the next
  // FWHT site of its output (cuda::attention_merge_fwht; BONSAI_CUDA_ATTN_FWHT, else on); results
  // do not depend on either.
  void set_swi_site(int ctas, bool low_regs = false);
  void set_attn_fwht(bool on);
  // Whether attention() of a t-token batch of this shape runs the tensor-core prefill kernel
  // (BONSAI_CUDA_ATTN; fp16 operands) rather than the fp32 split kernel.
  static bool attention_on_tensor_cores(int t, const AttentionShape& s);

 private:
  bool gdn_site_run(const GdnSite& a, int t);  // gdn_site; whether it wrote a.rotated
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bonsai
