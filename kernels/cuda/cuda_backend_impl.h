// Internals of the CUDA backend shared by its translation units (cuda_backend.cpp:
// memory, weights, ops; cuda_backend_record.cpp: recorded steps and benchmarks).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "bonsai/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gdn_decode.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/site_f16.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai {
namespace cuda_detail {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("cuda: {}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

// After a kernel launch: launch-configuration errors surface here, execution errors at the next sync.
inline void check_launch(const char* what) { check(cudaGetLastError(), what); }

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct HostFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;
using PinnedPtr = std::unique_ptr<void, HostFree>;

// what: the allocation's purpose, for the error. Out of device memory, the error says how much was
// asked for and how much the device had free, in GiB (the caller may add what to do about it: the
// KV cache's names -c and -ctk, src/model/graph.cpp).
inline DevicePtr device_alloc(size_t bytes, std::string_view what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 256));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky; clear it so that the next call's check does not report it
    size_t free_b = 0, total_b = 0;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaMemGetInfo(&free_b, &total_b);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    fail("cuda: out of device memory: {} needs {:.2f} GiB, device {} has {:.2f} GiB free of {:.2f} GiB", what,
         static_cast<double>(bytes) / gib, dev, static_cast<double>(free_b) / gib,
         static_cast<double>(total_b) / gib);
  }
  check(e, std::string(what).c_str());
  return DevicePtr(p);
}

// A device buffer that only grows. grow() reports whether the address changed (a
// recorded step that used the old one is then stale).
struct Growable {
  DevicePtr mem;
  size_t bytes = 0;
  bool grow(size_t need, const char* what) {
    if (need <= bytes) return false;
    mem.reset();
    mem = device_alloc(need, what);
    bytes = need;
    return true;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(mem.get());
  }
};

// A weight in device memory: tiled ternary codes (tile_layout.h) or the file layout.
struct DeviceWeight {
  bool tiled = false;
  cuda::RawType raw = cuda::RawType::F32;
  int groups = 1;    // tiled: scales per row per 128 columns
  bool f16 = false;  // tiled, 128-column groups, every scale exact in fp16 (cuda::f16_scale_ok)
  int64_t n = 0, k = 0;
  size_t row_bytes = 0;  // raw layout
  DevicePtr mem;
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(mem.get()); }
  const float* f32() const { return static_cast<const float*>(mem.get()); }
};

inline bool raw_type(DType t, cuda::RawType& out) {
  switch (t) {
    case DType::F32:
      out = cuda::RawType::F32;
      return true;
    case DType::F16:
      out = cuda::RawType::F16;
      return true;
    case DType::BF16:
      out = cuda::RawType::BF16;
      return true;
    case DType::Q8_0:
      out = cuda::RawType::Q8_0;
      return true;
    case DType::Q1_0:
      out = cuda::RawType::Q1_0;
      return true;
    case DType::PQ2_0:
    case DType::Q2_0_G128:
      out = cuda::RawType::Q2_128;
      return true;
    case DType::Q2_0_G64:
      out = cuda::RawType::Q2_64;
      return true;
    default:
      return false;
  }
}

constexpr int kDecodeSplits = cuda::kAttentionDecodeMinSplits;  // the most splits of a batch (t > 1)
// Default of BONSAI_CUDA_MV_EVICT: the matvec's weight copies marked L2 evict-first, so that a
// weight streamed through the L2 (up to 47 MB per launch, 60 MB of L2) does not push out the
// activations, states and partial sums the site kernels read next (docs/performance.md).
constexpr bool kMatvecEvictFirst = true;
constexpr bool kGdnStateStream = true;  // default of BONSAI_CUDA_GDN_STREAM (cuda::GdnFused::state_stream)
// Default of BONSAI_CUDA_MV_DEFER: how a lone matvec whose output feeds residual_norm_site is
// summed (cuda::SplitSums): 0 by its own fix-up (cuda::matvec_fixup()); 1 by the site, which
// adds the slots while it loads them (cuda::residual_norm_site_split); 2 by a standalone sum
// kernel (cuda::matvec_split_sum) before the site. docs/performance.md, "Split-K fix-up".
constexpr int kMatvecDefer = 1;
// Default of BONSAI_CUDA_FFN_DEFER: the FFN gate+up launch (two jobs, t < kGemmMinTokens) held
// back like a lone matvec and, when swiglu_site reads its two outputs, launched with the
// deferred fix-up and summed by the site (cuda::fwht_site_split); 0: its own fix-up.
// docs/performance.md, "Session 8: FFN split sums in the SwiGLU site".
constexpr bool kFfnDefer = true;
// Default of BONSAI_CUDA_QKV_DEFER (a bit mask): the mixers' input launches held back the same
// way and summed by their decode sites: bit kQkvDeferGdn the GDN qkv+z launch (two jobs) when
// gdn_site runs cuda::gdn_decode (t = 1), bit kQkvDeferAttn the attention q/k/v launch (three
// jobs, t < kGemmMinTokens) in attention_site's prep (cuda::attention_prep with SplitSums); 0:
// their own fix-ups. The attention half alone wins (tg128 261.02 / 261.10 against 260.24 /
// 260.31 and 259.63 / 259.72, two H200 calls); the GDN half loses in every form built
// (gdn_decode 11.2 -> 15.4 us per launch under ncu; tg128 -1.6 .. -2.0 %), so it is off:
// docs/performance.md, "Session 8: q/k/v split sums in their sites".
constexpr int kQkvDeferGdn = 1, kQkvDeferAttn = 2;
constexpr int kQkvDefer = kQkvDeferAttn;
// Default of BONSAI_CUDA_FWHT_CLUSTER ("swiglu,plain"): thread blocks per Hadamard block of the
// decode (t < kGemmMinTokens) SwiGLU site and plain FWHT site (cuda::fwht_site_split); 1: one
// block (hadamard_kernel, or fwht_split_kernel<1> for deferred inputs). More is slower: the
// cluster launch and barrier cost more than the spread loads save (tg128 236.0 with 4,1, 229.0
// with 8,1, 224.4 with 4,4 against 250.1 with 1,1; docs/performance.md, session 8).
constexpr int kFwhtCtasSwiglu = 1, kFwhtCtasPlain = 1;
// Default of BONSAI_CUDA_SWI_SITE: the deferred decode SwiGLU site as cuda::swiglu_site_lean (the
// slot addresses before the dependency wait, no write-back of the gate / up sums when act is null,
// the cross-warp FWHT stages after one barrier) over 1, 2 or 4 thread blocks per Hadamard block
// (a cluster exchanging the last stages with st.async pushes), instead of fwht_split_kernel (0).
// The same floats. docs/performance.md, session 9.
constexpr int kSwiSite = 1;
// Default of BONSAI_CUDA_SWI_REGS: the lean SwiGLU site's registers capped at 64 per thread
// (cuda::swiglu_site_lean's low_regs), so that its blocks fit beside a ws matvec block.
constexpr bool kSwiLowRegs = true;
// Default of BONSAI_CUDA_ATTN_FWHT: a decode step's attention merge (32 splits) held back and, when
// the next op is the forward, quantizing hadamard() of its output, run with it as one launch
// (cuda::attention_merge_fwht: a cluster of block / head_dim merge blocks per Hadamard block);
// 0: the merge and hadamard_kernel. The same floats. docs/performance.md, session 9.
constexpr bool kAttnFwht = true;
// Default of BONSAI_CUDA_SITE_F16: whether a prefill site whose consumer is the fp16 GEMM writes
// the GEMM's fp16 activation itself (cuda::site_f16) instead of the int8 quantization, so that
// the GEMM needs no conversion (CudaBackend::Impl::site_out): 0 never, 1 every site the
// kernel takes (cuda::site_f16: a block per row), 2 sites of at most 8 Hadamard blocks (the 27B's
// residual and projection sites, not its SwiGLU site), 3 as 2 and wider rows in two passes
// (cuda::site_f16_two_pass: the per-block kernel writing block amaxes, then the fp16 record),
// 4 every site in two passes. With 1 pp512 lost 4.4 % (the 17-block SwiGLU row in one block of 8
// warps, 80 us against ~36 for the site and the conversion; docs/performance.md, "Prefill GEMM",
// session 6, rounds 2 and 3).
constexpr int kSiteF16 = 3;
// Default of BONSAI_CUDA_SITE_SKIPQ: a prefill site whose consumer is the fp16 GEMM and that does
// not write the fp16 record itself skips the int8 quantization nobody reads (the GEMM converts
// the float output; a wrong guess costs one quantization in matmul).
constexpr bool kSiteSkipQuant = true;
// Default of BONSAI_CUDA_SITE_CLUSTER ("narrow,wide"): with BONSAI_CUDA_SITE_F16=3, the Hadamard
// blocks per thread block of cuda::site_f16_cluster (the row over a cluster of thread blocks, the
// fp16 record in one launch from registers) for rows of at most 8 Hadamard blocks (else the
// block-per-row kernel) and wider ones (else two passes); 0: not used.
constexpr int kSiteClusterNarrow = 0, kSiteClusterWide = 3;

// What a CudaBackend takes from its BONSAI_CUDA_* knobs at construction (the set_* calls change
// them afterwards); the initializers are the defaults. read_backend_knobs (knobs.cpp) parses them.
struct BackendKnobs {
  int site_f16_mode = kSiteF16;                                  // BONSAI_CUDA_SITE_F16
  bool site_skip_quant = kSiteSkipQuant;                         // BONSAI_CUDA_SITE_SKIPQ
  int site_cluster[2] = {kSiteClusterNarrow, kSiteClusterWide};  // BONSAI_CUDA_SITE_CLUSTER
  bool mv_evict = kMatvecEvictFirst;                             // BONSAI_CUDA_MV_EVICT
  bool gdn_stream = kGdnStateStream;                             // BONSAI_CUDA_GDN_STREAM
  cuda::GdnDecodeConfig gdn_dec;                                 // BONSAI_CUDA_GDN_DEC(_CLUSTER, _AB)
  int mv_defer = kMatvecDefer;                                   // BONSAI_CUDA_MV_DEFER
  bool ffn_defer = kFfnDefer;                                    // BONSAI_CUDA_FFN_DEFER
  int qkv_defer = kQkvDefer;                                     // BONSAI_CUDA_QKV_DEFER (bit mask)
  int fwht_ctas[2] = {kFwhtCtasSwiglu, kFwhtCtasPlain};          // BONSAI_CUDA_FWHT_CLUSTER
  int swi_site = kSwiSite;                                       // BONSAI_CUDA_SWI_SITE
  bool swi_low_regs = kSwiLowRegs;                               // BONSAI_CUDA_SWI_REGS
  bool attn_fwht = kAttnFwht;                                    // BONSAI_CUDA_ATTN_FWHT
  static constexpr int kMvLaunches = 7;                          // CudaBackend::Impl::MvLaunch's kinds
  // BONSAI_CUDA_MV_UNITS_{GDN,ATTN,GATEUP,DOWN,OUT,HEAD}, per kind: -1 (unset) the rule of
  // mv_hint, 0 no hint (the global plan), n >= 1 at least n units per warp.
  int mv_units[kMvLaunches] = {-1, -1, -1, -1, -1, -1, -1};
};
// The knobs now (every one; the first bad value throws UsageError naming it). Needs no device.
BackendKnobs read_backend_knobs();

constexpr size_t kStagingBytes = 32u << 20;  // per upload staging slot (two slots)

}  // namespace cuda_detail

using namespace cuda_detail;

// The knob-set fields (BackendKnobs) come first, as a base.
struct CudaBackend::Impl : BackendKnobs {
  int device = 0;
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  std::unordered_map<float*, DevicePtr> buffers;
  size_t buffer_bytes = 0;
  std::unordered_map<const DeviceWeight*, std::unique_ptr<DeviceWeight>> weights;
  size_t weight_bytes = 0, reported_gb = 0;

  // Quantized activation of the last matvec input (or Hadamard output): reused while
  // nothing has written to the source since.
  Growable xq, meta;
  const float* q_src = nullptr;
  int64_t q_rows = 0, q_k = 0;
  // The fp16 form of the last input of the fp16 GEMM (cuda::act_to_f16), cached the same way.
  Growable xh, hscale;
  const float* h_src = nullptr;
  int64_t h_rows = 0, h_k = 0;
  // What the prefill matmuls of each input width ran (matmul_multi): the fewest tokens that ran
  // the fp16 GEMM, the most that ran the int8 kernels. A site does not know its consumer's
  // weights; this is what consumer_f16 goes by. Widths beyond the table are not recorded.
  struct GemmSeen {
    int64_t k = 0;
    int f16_min_t = INT_MAX, int8_max_t = 0;
  };
  std::array<GemmSeen, 8> gemm_seen{};
  int64_t site_f16_launches = 0, site_quant_skips = 0;
  Growable bamax;  // [rows][k / block] the two-pass sites' block amaxes
  int64_t site_cluster_launches = 0;

  // Which decode matvec a launch is, i.e. which site runs after it (Impl::mv_hint picks its plan
  // by that): the GDN qkv+z (gdn_decode), attention q/k/v (its prep), FFN gate+up (the SwiGLU
  // site), FFN down and the mixers' out-projections (the residual site), the head (the step's end).
  enum class MvLaunch { other, gdn_qkvz, attn_qkv, gate_up, ffn_down, out_proj, head };
  static_assert(static_cast<int>(MvLaunch::head) + 1 == kMvLaunches);
  const float* swiglu_out = nullptr;  // the last SwiGLU site's rotated output [rows][swiglu_n]: the
  int64_t swiglu_n = 0;               // FFN down's input (how residual_norm_site tells down apart)
  Growable part, tokens;
  Growable mv_partial, mv_counters;  // split-K matvec partial sums and per-pair counters (kept zero)
  // The flag-free split fix-up's slots (BONSAI_CUDA_MV_FIXUP=slots; cuda::matvec_tiled): every
  // word 0xFFFFFFFF between launches. Filled so when allocated or grown; the matvec leaves it
  // so; nothing else may write it (unlike mv_partial, which the prefill GEMM shares).
  Growable mv_slots;
  int* step_dev = nullptr;  // {pos0, token}: what a recorded step reads
  Growable gdn_counters;    // last-block hand-off of the GDN site's conv state (kept zero)
  Growable gdn_poll;        // the GDN fold's polled hand-off (every word 0xFFFFFFFF between launches)
  Growable gdn_scratch;     // the prefill walk's per-chunk products (cuda::gdn_walk_scratch_bytes)
  PinnedPtr step_host;
  DevicePtr step_mem;
  Growable topk;        // top_k: pass-1 candidates, then the result (ids[k], values[k])
  PinnedPtr topk_host;  // the result's host copy, 2 * kMaxTopK words

  // Upload staging: two pinned + two device slots, so filling one overlaps the copy of the other.
  PinnedPtr pinned[2];
  DevicePtr raw_slot[2];
  cudaEvent_t slot_free[2] = {nullptr, nullptr};

  // The GDN core is issued as gdn_gates, gdn_recurrence, gated_rmsnorm, transpose_heads;
  // they are held back here and run as one kernel (cuda::gdn_fused). Any other op first
  // flushes what is pending, so every op still sees the results of the ops before it.
  struct Pending {
    bool gates = false, rec = false, norm = false;
    const float *alpha = nullptr, *beta_in = nullptr, *ssm_a = nullptr, *dt_bias = nullptr;
    float *g = nullptr, *beta = nullptr;
    int gates_t = 0, gates_nv = 0;
    cuda::GdnFused f;  // the recurrence (g/beta or the gates, state, out, shape)
    const float *z = nullptr, *norm_w = nullptr;
    float* norm_y = nullptr;
    float norm_eps = 0.0f;
    // A matmul's only ternary matvec launch (t < kGemmMinTokens; one job, two under ffn_defer or
    // qkv_defer, three under qkv_defer) held back until the next op: a residual_norm_site whose
    // delta is its one y (mv_defer), a swiglu_site whose gate and up are its two (ffn_defer), a
    // gdn_site whose qkv and z are its two and that runs cuda::gdn_decode, or an attention_site
    // whose qf, k and v are its three (qkv_defer) launches it deferred and adds its slots itself;
    // any other op launches it first, as it would have been launched. Never pending together
    // with the GDN ops above (each side flushes the other first).
    bool mv = false;
    cuda::TiledJobs mv_jobs;
    int mv_groups = 0, mv_t = 0;
    int64_t mv_k = 0;
    const uint8_t* mv_xq = nullptr;
    const float4* mv_meta = nullptr;
    const float* mv_x = nullptr;  // the matmul's float input
    // A decode step's attention merge (attn_fwht) held back until the next op: a forward,
    // quantizing hadamard() of `out` runs it with the FWHT (cuda::attention_merge_fwht); any other
    // op launches it first (cuda::attention_merge). Never pending with anything else (set last by
    // attention_site, after its flush; every op flushes before it holds anything back).
    bool merge = false;
    const float* merge_part = nullptr;
    float* merge_out = nullptr;
    const float* merge_gate = nullptr;
    int64_t merge_gate_stride = 0;
    int merge_t = 0, merge_heads = 0, merge_splits = 0, merge_dim = 0;
  } pend;
  // held, room: what a pending matvec is and the room its consumer's CTAs want (mv_hint), when
  // the caller knows.
  void flush(MvLaunch held = MvLaunch::other, int room = 0);
  // The ternary matvec launch (scratch grown here); returns the fix-up used (split: defer).
  cuda::MatvecFixup matvec(const cuda::TiledJobs& jobs, int groups, const uint8_t* act,
                           const float4* act_meta, int t, int64_t k, cuda::MatvecFixup fixup,
                           cuda::SplitSums* split, MvLaunch kind = MvLaunch::other, int room = 0);
  // The plan hint of a decode matvec of `kind` whose consumer launches `room` CTAs that fit
  // beside a ws matvec block (cuda::MatvecPlanHint): the rule, or the kind's BONSAI_CUDA_MV_UNITS_*.
  cuda::MatvecPlanHint mv_hint(MvLaunch kind, int room) const;

  bool capturing = false, warm = false;
  // Recording a decode step (begin_capture .. end_capture): each GDN layer's site runs once
  // in it, and replays are serialized, so the site may read its states early (GdnFused).
  bool step_recording = false;
  cudaGraphExec_t exec = nullptr;
  // The attention plan (cuda::attention_decode_plan: split count and kernel) the recording in
  // progress used / exec was recorded with (0: the step has no attention); a replay whose context
  // wants another plan records again.
  int rec_attn_plan = 0, exec_attn_plan = 0;
  // cuda::attention_split_wave and cuda::attention_decode_mma_wave (0 for an f32 cache) of the last
  // decode attention's shape (key: heads, KV heads, head_dim, cache type), which replay_step's plan
  // uses too; -1 until an attention has run.
  int attn_wave = -1, attn_mma_wave = 0;
  int64_t attn_wave_key = -1;

  ~Impl() {
    if (stream) cudaStreamSynchronize(stream);
    if (exec) cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : slot_free)
      if (e) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
  }

  void invalidate_quant() {
    q_src = nullptr;
    h_src = nullptr;
  }
  // Every op reports what it wrote, so the cached quantizations never go stale.
  void wrote(const void* p, size_t bytes) {
    if (!p) return;  // an output the caller did not ask for (swiglu_site's act)
    const auto* a = static_cast<const uint8_t*>(p);
    auto overlaps = [&](const float* src, int64_t rows, int64_t k) {
      const auto* s = reinterpret_cast<const uint8_t*>(src);
      return src && a < s + rows * k * sizeof(float) && s < a + bytes;
    };
    if (overlaps(q_src, q_rows, q_k)) q_src = nullptr;
    if (overlaps(h_src, h_rows, h_k)) h_src = nullptr;
  }
  void drop_recording() {
    if (exec) cudaGraphExecDestroy(exec);
    exec = nullptr;
    warm = false;
  }
  void grow(Growable& g, size_t need, const char* what) {
    if (need <= g.bytes) return;
    if (capturing) fail("cuda: {} must grow while a step is being recorded", what);
    if (g.grow(need, what)) drop_recording();
  }

  // Weights live in device memory only after prepare(); host bytes are never read by an op.
  static const DeviceWeight& dev(const Weight& w) {
    if (!w.prepared) fail("cuda: weight '{}' was not prepared (Backend::prepare) before use", w.name);
    return *static_cast<const DeviceWeight*>(w.prepared);
  }

  DeviceWeight* upload(const Weight& w);
  void upload_rows(const Weight& w, DeviceWeight& d);

  // The quantized form of x [t][k], computing it unless it is the cached one.
  void quantized(const float* x, int t, int64_t k) {
    if (q_src == x && q_rows == t && q_k == k) return;
    reserve_quant(t, k);
    cuda::quantize_act(x, xq.as<uint8_t>(), meta.as<float4>(), t, k, stream);
    check_launch("quantize");
    q_src = x;
    q_rows = t;
    q_k = k;
  }
  // The fp16 form of x [t][k] for the fp16 GEMM, computing it unless it is the cached one.
  void halved(const float* x, int t, int64_t k) {
    if (h_src == x && h_rows == t && h_k == k) return;
    const int terms = cuda::gemm_f16_terms();
    grow(xh, static_cast<size_t>(t) * (k / cuda::kBlockK) * cuda::kActBytes * terms,
         "fp16 activation buffer");
    grow(hscale, static_cast<size_t>(t) * sizeof(float), "fp16 activation scales");
    cuda::act_to_f16(x, xh.as<uint8_t>(), hscale.as<float>(), t, k, stream, terms);
    check_launch("act_to_f16");
    h_src = x;
    h_rows = t;
    h_k = k;
  }
  void saw_gemm(int64_t k, int t, bool f16) {
    for (GemmSeen& g : gemm_seen) {
      if (g.k != k && g.k != 0) continue;
      g.k = k;
      if (f16)
        g.f16_min_t = std::min(g.f16_min_t, t);
      else
        g.int8_max_t = std::max(g.int8_max_t, t);
      return;
    }
  }
  // THE rule for a site whose output [rows][k] feeds a matmul: its consumer is the fp16 GEMM
  // (so the int8 quantization is not needed; site_out says what is written instead). A prefill
  // batch (rows >= kGemmMinTokens) and this width's prefill matmuls so far ran the fp16 GEMM at
  // rows tokens or fewer and never the int8 kernels at rows or more (the fp16 GEMM's grid rule is
  // monotonic in t: gemm_f16_launch). A wrong guess costs one conversion or quantization: matmul
  // quantizes (or converts) the float output, which the site writes either way.
  bool consumer_f16(int64_t rows, int64_t k) const {
    if (rows < cuda::kGemmMinTokens || cuda::gemm_kernel() != cuda::GemmKernel::f16) return false;
    for (const GemmSeen& g : gemm_seen)
      if (g.k == k) return g.f16_min_t <= rows && rows > g.int8_max_t;
    return false;
  }
  // What a site whose consumer is (by consumer_f16) the fp16 GEMM writes besides its floats:
  // the fp16 record in one block per row (fused) or in two passes (BONSAI_CUDA_SITE_F16), else
  // nothing (BONSAI_CUDA_SITE_SKIPQ: matmul converts the floats); int8: the quantization.
  enum class SiteOut { int8, none, fused, two_pass };
  SiteOut site_out(int64_t rows, int64_t k, int64_t block) const {
    if (!consumer_f16(rows, k)) return SiteOut::int8;
    if (site_f16_mode != 0 && cuda::gemm_f16_terms() == 1) {
      const bool narrow = k / block <= 8;
      if (cuda::site_f16_fits(k, block) && (site_f16_mode == 1 || (narrow && site_f16_mode != 4)))
        return SiteOut::fused;
      if (site_f16_mode >= 3 && cuda::site_f16_two_pass_fits(k, block)) return SiteOut::two_pass;
    }
    return site_skip_quant ? SiteOut::none : SiteOut::int8;
  }
  // cuda::site_f16 (or site_f16_two_pass) with the fp16 buffers grown; the caller reports the
  // outputs (wrote), then calls site_f16_done.
  void launch_site_f16(SiteOut how, cuda::SiteF16Kind kind, cuda::SiteF16Args a, int64_t rows, int64_t k,
                       int64_t block) {
    grow(xh, static_cast<size_t>(rows) * (k / cuda::kBlockK) * cuda::kActBytes, "fp16 activation buffer");
    grow(hscale, static_cast<size_t>(rows) * sizeof(float), "fp16 activation scales");
    a.xh = xh.as<uint8_t>();
    a.tscale = hscale.as<float>();
    const int per_block = site_f16_mode == 3 ? site_cluster[k / block > 8 ? 1 : 0] : 0;
    if (per_block > 0 && cuda::site_f16_cluster(kind, a, rows, k, block, per_block, stream)) {
      ++site_cluster_launches;  // (false: not launched; the form below runs)
    } else if (how == SiteOut::two_pass) {
      grow(bamax, static_cast<size_t>(rows) * (k / block) * sizeof(float), "site block amaxes");
      cuda::site_f16_two_pass(kind, a, bamax.as<float>(), rows, k, block, stream);
    } else {
      cuda::site_f16(kind, a, rows, k, block, stream);
    }
    check_launch("site (fp16 activation)");
    ++site_f16_launches;
  }
  void site_f16_done(const float* rotated, int64_t rows, int64_t k) {
    h_src = rotated;
    h_rows = rows;
    h_k = k;
  }
  void reserve_quant(int64_t rows, int64_t k) {
    grow(xq, static_cast<size_t>(rows) * (k / cuda::kBlockK) * cuda::kActBytes,
         "activation quantization buffer");
    grow(meta, static_cast<size_t>(rows) * (k / cuda::kBlockK) * sizeof(float4), "activation scale buffer");
  }
  const int* pos_dev() const { return capturing ? step_dev : nullptr; }
  // `n` zero ints that kernels leave zero (zeroed once, when the buffer grows).
  int* counters(Growable& g, size_t n, const char* what) {
    if (n * sizeof(int) > g.bytes) {
      grow(g, n * sizeof(int), what);
      check(cudaMemsetAsync(g.mem.get(), 0, g.bytes, stream), "cudaMemsetAsync");
    }
    return g.as<int>();
  }
  void attention(const float* q, const void* k_cache, const void* v_cache, float* out, int t, int pos0,
                 const AttentionShape& s, const float* gate, int64_t gate_stride);
};

}  // namespace bonsai
