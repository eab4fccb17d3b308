#include "kernels/cuda/cuda_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_f16_layout.h"
#include "kernels/cuda/knobs.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai {

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

// Runs the held-back GDN ops: the fused kernel when the shapes allow, else one by one.
void CudaBackend::Impl::flush(MvLaunch held, int room) {
  Pending& p = pend;
  if (p.merge) {
    p.merge = false;
    cuda::attention_merge(p.merge_part, p.merge_out, p.merge_t, p.merge_heads, p.merge_splits, p.merge_dim,
                          p.merge_gate, p.merge_gate_stride, stream);
    check_launch("attention merge");
  }
  if (p.mv) {
    p.mv = false;
    matvec(p.mv_jobs, p.mv_groups, p.mv_xq, p.mv_meta, p.mv_t, p.mv_k, cuda::matvec_fixup(), nullptr, held,
           room);
  }
  if (!p.gates && !p.rec) return;
  const bool fusable = p.rec && p.f.d_k % 32 == 0 && p.f.d_v % 32 == 0 && (p.f.d_k / 32) * p.f.d_v <= 512;
  if (p.gates && !(p.rec && fusable)) {
    cuda::gdn_gates(p.alpha, p.beta_in, p.ssm_a, p.dt_bias, p.g, p.beta, p.gates_t, p.gates_nv, stream);
    check_launch("gdn_gates");
  }
  if (p.rec && fusable) {
    cuda::GdnFused f = p.f;
    if (p.gates) {
      f.alpha = p.alpha;
      f.beta_in = p.beta_in;
      f.ssm_a = p.ssm_a;
      f.dt_bias = p.dt_bias;
    }
    if (p.norm) {
      f.z = p.z;
      f.norm_w = p.norm_w;
      f.norm_eps = p.norm_eps;
      if (!f.transpose) f.out = p.norm_y;
    }
    cuda::gdn_fused(f, stream);
    check_launch("gdn (fused)");
  } else if (p.rec) {
    const cuda::GdnFused& f = p.f;
    cuda::gdn_recurrence(f.conv, f.g, f.beta, f.state, f.out, f.t, f.n_k, f.n_v, f.d_k, f.d_v, f.eps, stream);
    check_launch("gdn_recurrence");
  }
  p = Pending{};
}

CudaBackend::CudaBackend(int device) : impl_(std::make_unique<Impl>()) {
  // Every knob first (cuda/knobs.h; host code, no device): a bad value is the user's input and
  // fails the same way on any machine, here and never in the middle of a recorded step.
  cuda::check_knobs();
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) fail("cuda: no usable device ({})", why);
  if (device < 0 || device >= n) fail("cuda: device {} does not exist ({} found)", device, n);
  Impl& m = *impl_;
  m.device = device;
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaGetDeviceProperties(&m.prop, device), "cudaGetDeviceProperties");
  if (m.prop.major < 8)
    fail("cuda: device {} ({}) has compute capability {}.{}; the int8 tensor-core kernels need 8.0 or newer",
         device, m.prop.name, m.prop.major, m.prop.minor);
  // The backend's knobs, and the kernel choices that depend on the device (BONSAI_CUDA_MV=ws or
  // BONSAI_CUDA_GEMM=wgmma where the device has no code for them).
  static_cast<BackendKnobs&>(m) = read_backend_knobs();
  cuda::matvec_kernel();
  cuda::gemm_kernel();
  check(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  m.step_mem = device_alloc(2 * sizeof(int), "step parameters");
  m.step_dev = static_cast<int*>(m.step_mem.get());
  void* h = nullptr;
  check(cudaMallocHost(&h, 2 * sizeof(int)), "cudaMallocHost");
  m.step_host.reset(h);
}

CudaBackend::~CudaBackend() = default;

std::string CudaBackend::device_name() const { return impl_->prop.name; }
size_t CudaBackend::device_bytes() const { return impl_->weight_bytes + impl_->buffer_bytes; }
int64_t CudaBackend::site_f16_launches() const { return impl_->site_f16_launches; }
int64_t CudaBackend::site_quant_skips() const { return impl_->site_quant_skips; }
void CudaBackend::set_site_f16(int mode, bool skip_quant) {
  if (mode < 0 || mode > 4) fail("cuda: set_site_f16({}): expected 0 .. 4", mode);
  impl_->site_f16_mode = mode;
  impl_->site_skip_quant = skip_quant;
}
void CudaBackend::set_site_cluster(int narrow, int wide) {
  if (narrow < 0 || narrow > 4 || wide < 0 || wide > 4)
    fail("cuda: set_site_cluster({}, {}): expected 0 .. 4", narrow, wide);
  impl_->site_cluster[0] = narrow;
  impl_->site_cluster[1] = wide;
}
int64_t CudaBackend::site_f16_cluster_launches() const { return impl_->site_cluster_launches; }
void CudaBackend::set_cache_hints(bool matvec_evict_first, bool gdn_state_stream) {
  impl_->mv_evict = matvec_evict_first;
  impl_->gdn_stream = gdn_state_stream;
}
void CudaBackend::set_matvec_defer(int mode) {
  impl_->flush();
  impl_->mv_defer = mode;
}
void CudaBackend::set_ffn_defer(bool on) {
  impl_->flush();
  impl_->ffn_defer = on;
}
void CudaBackend::set_qkv_defer(int mask) {
  if (mask < 0 || mask > 3) fail("cuda: set_qkv_defer({}): expected 0 .. 3", mask);
  impl_->flush();
  impl_->qkv_defer = mask;
}
void CudaBackend::set_swi_site(int ctas, bool low_regs) {
  if (ctas != 0 && ctas != 1 && ctas != 2 && ctas != 4)
    fail("cuda: set_swi_site({}): expected 0, 1, 2 or 4", ctas);
  impl_->flush();
  impl_->swi_site = ctas;
  impl_->swi_low_regs = low_regs;
}
void CudaBackend::set_attn_fwht(bool on) {
  impl_->flush();
  impl_->attn_fwht = on;
}
void CudaBackend::set_fwht_cluster(int swiglu, int plain) {
  auto ok = [](int c) { return c == 1 || c == 2 || c == 4 || c == 8; };
  if (!ok(swiglu) || !ok(plain)) fail("cuda: set_fwht_cluster({}, {}): expected 1, 2, 4 or 8", swiglu, plain);
  impl_->fwht_ctas[0] = swiglu;
  impl_->fwht_ctas[1] = plain;
}

// ---- memory ------------------------------------------------------------------------

float* CudaBackend::alloc(size_t n) {
  impl_->flush();
  Impl& m = *impl_;
  if (m.capturing) fail("cuda: alloc while a step is being recorded");
  DevicePtr p = device_alloc(n * sizeof(float), "an activation / cache buffer");
  check(cudaMemsetAsync(p.get(), 0, std::max<size_t>(n, 1) * sizeof(float), m.stream), "cudaMemsetAsync");
  auto* f = static_cast<float*>(p.get());
  m.buffers.emplace(f, std::move(p));
  m.buffer_bytes += n * sizeof(float);
  return f;
}

void CudaBackend::release(float* p) {
  impl_->flush();
  Impl& m = *impl_;
  auto it = m.buffers.find(p);
  if (it == m.buffers.end()) return;
  check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
  m.invalidate_quant();  // the cached quantization may be of this buffer
  m.drop_recording();    // a recorded step may use it
  m.buffers.erase(it);
}

void CudaBackend::to_host(float* dst, const float* src, size_t n) {
  impl_->flush();
  Impl& m = *impl_;
  check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, m.stream), "cudaMemcpy D2H");
  check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
}

void CudaBackend::from_host(float* dst, const float* src, size_t n) {
  impl_->flush();
  Impl& m = *impl_;
  check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, m.stream), "cudaMemcpy H2D");
  m.wrote(dst, n * sizeof(float));
}

void CudaBackend::copy(float* dst, const float* src, size_t n) {
  impl_->flush();
  Impl& m = *impl_;
  check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, m.stream), "cudaMemcpy D2D");
  m.wrote(dst, n * sizeof(float));
}

void CudaBackend::zero(float* p, size_t n) {
  impl_->flush();
  Impl& m = *impl_;
  check(cudaMemsetAsync(p, 0, n * sizeof(float), m.stream), "cudaMemsetAsync");
  m.wrote(p, n * sizeof(float));
}

void CudaBackend::sync() {
  impl_->flush();
  check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
}

// ---- weights -------------------------------------------------------------------------

void CudaBackend::prepare(Weight& w) {
  impl_->flush();
  if (w.prepared || w.empty()) return;
  w.prepared = impl_->upload(w);
}

void CudaBackend::unprepare(Weight& w) {
  impl_->flush();
  Impl& m = *impl_;
  auto it = m.weights.find(static_cast<const DeviceWeight*>(w.prepared));
  if (it == m.weights.end()) return;
  check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
  m.drop_recording();
  m.weight_bytes -=
      it->second->tiled
          ? static_cast<size_t>(cuda::tiled_bytes(it->second->n, it->second->k, it->second->groups))
          : it->second->row_bytes * it->second->n;
  m.weights.erase(it);
  w.prepared = nullptr;
}

DeviceWeight* CudaBackend::Impl::upload(const Weight& w) {
  if (capturing) fail("cuda: weight '{}' uploaded while a step is being recorded", w.name);
  auto d = std::make_unique<DeviceWeight>();
  d->n = w.n;
  d->k = w.k;
  const bool ternary2 = w.type == DType::PQ2_0 || w.type == DType::Q2_0_G128 || w.type == DType::PTQ1_0 ||
                        w.type == DType::Q2_0_G64;
  if (ternary2 && w.k % cuda::kBlockK == 0) {
    d->tiled = true;
    d->groups = w.type == DType::Q2_0_G64 ? 2 : 1;
  } else if (!raw_type(w.type, d->raw)) {
    fail("cuda: weight '{}' has type {}, which the CUDA backend cannot compute with", w.name,
         dtype_name(w.type));
  }
  d->row_bytes = w.row_stride();
  const size_t bytes =
      d->tiled ? static_cast<size_t>(cuda::tiled_bytes(w.n, w.k, d->groups)) : d->row_bytes * w.n;
  d->mem = device_alloc(bytes, fmt::format("weight '{}'", w.name));
  upload_rows(w, *d);
  weight_bytes += bytes;
  if (weight_bytes >> 30 > reported_gb) {
    reported_gb = weight_bytes >> 30;
    spdlog::info("cuda: {} GiB of weights on {}", reported_gb, prop.name);
  }
  DeviceWeight* raw = d.get();
  weights.emplace(raw, std::move(d));
  return raw;
}

// Rows go through pinned staging in slices (PTQ1_0 transcoded to PQ2_0 on the way);
// ternary slices are repacked into tiles on the device, so slices are whole 32-row pairs.
void CudaBackend::Impl::upload_rows(const Weight& w, DeviceWeight& d) {
  for (int s = 0; s < 2; ++s) {
    if (pinned[s]) continue;
    void* h = nullptr;
    check(cudaMallocHost(&h, kStagingBytes), "cudaMallocHost (upload staging)");
    pinned[s].reset(h);
    raw_slot[s] = device_alloc(kStagingBytes, "the upload staging");
    check(cudaEventCreateWithFlags(&slot_free[s], cudaEventDisableTiming), "cudaEventCreate");
  }
  const bool ptq1 = w.type == DType::PTQ1_0;
  const size_t src_stride = w.row_stride();
  const size_t dev_stride = ptq1 ? static_cast<size_t>(row_bytes(DType::PQ2_0, w.k)) : src_stride;
  int64_t slice = std::max<int64_t>(1, static_cast<int64_t>(kStagingBytes / dev_stride));
  if (d.tiled) {
    slice = slice / cuda::kPairRows * cuda::kPairRows;
    if (slice == 0)
      fail("cuda: weight '{}' rows of {} bytes do not fit the upload staging", w.name, dev_stride);
  }
  // The fp16 GEMM takes a weight only if every scale keeps (c - 1)·d exact in fp16 (checked on
  // the PQ2_0 rows as staged: 34-byte blocks, fp16 d first); adversarial scales stay on int8.
  d.f16 = d.tiled && d.groups == 1;
  int s = 0;
  for (int64_t r0 = 0; r0 < w.n; r0 += slice, s ^= 1) {
    const int64_t rows = std::min(slice, w.n - r0);
    check(cudaEventSynchronize(slot_free[s]), "cudaEventSynchronize");  // the slot's previous copy is done
    auto* host = static_cast<uint8_t*>(pinned[s].get());
    const uint8_t* src = w.data + static_cast<size_t>(r0) * src_stride;
    if (ptq1) {
      for (int64_t r = 0; r < rows; ++r)
        transcode_ptq1_to_pq2(src + r * src_stride, host + r * dev_stride, w.k);
    } else {
      std::memcpy(host, src, static_cast<size_t>(rows) * src_stride);
    }
    const size_t bytes = static_cast<size_t>(rows) * dev_stride;
    for (size_t b = 0; d.f16 && b < bytes; b += 34) {
      uint16_t bits = 0;
      std::memcpy(&bits, host + b, 2);
      d.f16 = cuda::f16_scale_ok(bits);
    }
    if (d.tiled) {
      check(cudaMemcpyAsync(raw_slot[s].get(), host, bytes, cudaMemcpyHostToDevice, stream),
            "cudaMemcpy (weight)");
      const size_t pair_bytes =
          cuda::kWarpTiles * static_cast<size_t>(w.k / cuda::kBlockK) * cuda::chunk_bytes(d.groups);
      auto* dst = static_cast<uint8_t*>(d.mem.get()) + static_cast<size_t>(r0 / cuda::kPairRows) * pair_bytes;
      cuda::repack_tiled(static_cast<const uint8_t*>(raw_slot[s].get()), dev_stride, rows, w.k, d.groups, dst,
                         stream);
      check_launch("repack");
    } else {
      check(cudaMemcpyAsync(static_cast<uint8_t*>(d.mem.get()) + static_cast<size_t>(r0) * src_stride, host,
                            bytes, cudaMemcpyHostToDevice, stream),
            "cudaMemcpy (weight)");
    }
    check(cudaEventRecord(slot_free[s], stream), "cudaEventRecord");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (weight upload)");
}

// ---- ops --------------------------------------------------------------------------------

void CudaBackend::embed(const Weight& table, const int32_t* tokens, int t, float* out) {
  impl_->flush();
  Impl& m = *impl_;
  const DeviceWeight& d = m.dev(table);
  const int32_t* tok = m.step_dev + 1;
  if (!m.capturing) {
    m.grow(m.tokens, static_cast<size_t>(t) * sizeof(int32_t), "token buffer");
    check(cudaMemcpyAsync(m.tokens.as<int32_t>(), tokens, static_cast<size_t>(t) * sizeof(int32_t),
                          cudaMemcpyHostToDevice, m.stream),
          "cudaMemcpy (tokens)");
    tok = m.tokens.as<int32_t>();
  }
  if (d.tiled)
    cuda::embed_tiled(d.bytes(), d.k, d.groups, tok, t, out, m.stream);
  else
    cuda::embed_raw(d.raw, d.bytes(), d.row_bytes, d.k, tok, t, out, m.stream);
  check_launch("embed");
  m.wrote(out, static_cast<size_t>(t) * d.k * sizeof(float));
}

void CudaBackend::rmsnorm(const float* x, const Weight& gain, float* y, int64_t rows, int64_t n, float eps) {
  impl_->flush();
  Impl& m = *impl_;
  cuda::rmsnorm(x, m.dev(gain).f32(), y, rows, n, eps, m.stream);
  check_launch("rmsnorm");
  m.wrote(y, rows * n * sizeof(float));
}

void CudaBackend::hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k,
                           int64_t block, bool inverse) {
  Impl& m = *impl_;
  Impl::Pending& pm = m.pend;
  // x the held-back decode merge's output: the merge and this site as one launch (attn_fwht)
  if (pm.merge && x == pm.merge_out && !inverse && rows == pm.merge_t && k == pm.merge_heads * pm.merge_dim &&
      block % cuda::kBlockK == 0 && m.site_out(rows, k, block) == Impl::SiteOut::int8) {
    m.reserve_quant(rows, k);
    if (cuda::attention_merge_fwht(pm.merge_part, pm.merge_out, pm.merge_t, pm.merge_heads, pm.merge_splits,
                                   pm.merge_dim, pm.merge_gate, pm.merge_gate_stride, signs, y, block,
                                   m.xq.as<uint8_t>(), m.meta.as<float4>(), m.stream)) {
      pm.merge = false;
      check_launch("attention merge + hadamard");
      m.wrote(y, rows * k * sizeof(float));
      m.q_src = y;
      m.q_rows = rows;
      m.q_k = k;
      return;
    }
    cudaGetLastError();  // a refused cluster launch is not an error of the next launch
  }
  m.flush();
  if (block > 8192 || k % block) fail("cuda: Hadamard block {} of width {} is not supported", block, k);
  // A forward site feeds a ternary matvec: quantize its output in the same pass.
  bool quant = !inverse && block % cuda::kBlockK == 0;
  const Impl::SiteOut out = quant ? m.site_out(rows, k, block) : Impl::SiteOut::int8;
  if (out == Impl::SiteOut::fused || out == Impl::SiteOut::two_pass) {  // the consumer is the fp16 GEMM
    cuda::SiteF16Args a;
    a.x = x;
    a.signs = signs;
    a.rotated = y;
    m.launch_site_f16(out, cuda::SiteF16Kind::hadamard, a, rows, k, block);
    m.wrote(y, rows * k * sizeof(float));
    m.site_f16_done(y, rows, k);
    return;
  }
  if (out == Impl::SiteOut::none) {  // the fp16 GEMM converts y: no quantization
    quant = false;
    ++m.site_quant_skips;
  }
  if (quant) m.reserve_quant(rows, k);
  // A decode site over a cluster of blocks per Hadamard block (BONSAI_CUDA_FWHT_CLUSTER)
  bool split = false;
  if (quant && m.fwht_ctas[1] > 1 && rows < cuda::kGemmMinTokens) {
    split = cuda::fwht_site_split(cuda::split_whole(x, static_cast<int>(rows), static_cast<int>(k)),
                                  cuda::SplitSums{}, nullptr, signs, y, rows, k, block, m.fwht_ctas[1],
                                  m.xq.as<uint8_t>(), m.meta.as<float4>(), m.stream);
    if (!split) cudaGetLastError();  // a refused cluster launch is not an error of the next launch
  }
  if (!split)
    cuda::hadamard(x, signs, y, rows, k, block, inverse, quant ? m.xq.as<uint8_t>() : nullptr,
                   quant ? m.meta.as<float4>() : nullptr, m.stream);
  check_launch("hadamard");
  m.wrote(y, rows * k * sizeof(float));
  if (quant) {
    m.q_src = y;
    m.q_rows = rows;
    m.q_k = k;
  }
}

void CudaBackend::matmul(const Weight& w, const float* x, float* y, int t) {
  impl_->flush();
  const Weight* ws[] = {&w};
  float* ys[] = {y};
  matmul_multi(ws, x, ys, t);
}

void CudaBackend::matmul_multi(std::span<const Weight* const> ws, const float* x, std::span<float* const> ys,
                               int t) {
  impl_->flush();
  Impl& m = *impl_;
  // Weights sharing the input go into as few launches as possible: tiled ones with the same
  // scale grouping into one tensor-core launch, raw ones of one type and row size into another.
  cuda::TiledJobs tiled;
  cuda::RawJobs raw;
  int groups = 0;
  int64_t k = 0;
  const DeviceWeight* raw_first = nullptr;
  bool tiled_f16 = true;  // every weight of the pending tiled launch has fp16-exact scales
  auto flush_tiled = [&] {
    if (tiled.count == 0) return;
    const bool f16 = tiled_f16;
    tiled_f16 = true;
    const bool use_f16 =
        t >= cuda::kGemmMinTokens && cuda::gemm_f16_launch(tiled, groups, t, m.prop.multiProcessorCount, f16);
    if (t >= cuda::kGemmMinTokens) m.saw_gemm(k, t, use_f16);  // (what the sites go by)
    if (use_f16) {                                             // BONSAI_CUDA_GEMM=f16
      const int sms = m.prop.multiProcessorCount;
      m.halved(x, t, k);
      m.grow(m.mv_partial, cuda::gemm_tiled_scratch(tiled, t, k, sms) * sizeof(float), "gemm partial sums");
      // (the split-K fix-up's counters: the matvec's, kept zero by both)
      int* counters =
          m.counters(m.mv_counters, static_cast<size_t>(cuda::gemm_f16_counters(tiled, t)), "gemm counters");
      cuda::gemm_f16(tiled, m.xh.as<uint8_t>(), m.hscale.as<float>(), t, k, sms, m.mv_partial.as<float>(),
                     m.stream, 0, 0, 0, -1, 0, -1, counters);
      check_launch("gemm (f16)");
      tiled.count = 0;
      return;
    }
    m.quantized(x, t, k);
    if (t >= cuda::kGemmMinTokens) {  // prefill: each weight tile decoded once per 64 tokens
      const int sms = m.prop.multiProcessorCount;
      // split-K partial sums (the matvec's scratch: the two never run at the same time)
      m.grow(m.mv_partial, cuda::gemm_tiled_scratch(tiled, t, k, sms) * sizeof(float), "gemm partial sums");
      cuda::gemm_tiled(tiled, groups, m.xq.as<uint8_t>(), m.meta.as<float4>(), t, k, sms,
                       m.mv_partial.as<float>(), m.stream);
      check_launch("gemm (tiled)");
      tiled.count = 0;
      return;
    }
    const bool hold = static_cast<size_t>(tiled.count) == ws.size() &&
                      ((ws.size() == 1 && m.mv_defer != 0) ||
                       (ws.size() == 2 && (m.ffn_defer || (m.qkv_defer & kQkvDeferGdn))) ||
                       (ws.size() == 3 && (m.qkv_defer & kQkvDeferAttn)));
    if (hold && cuda::matvec_kernel() != cuda::MatvecKernel::legacy) {
      // The call's only launch, held back: its consumer may be a site that adds the split sums
      // itself (a residual site: one job; the SwiGLU site: gate and up; the GDN decode step: qkv
      // and z; the attention prep: q, k and v).
      Impl::Pending& p = m.pend;
      p.mv = true;
      p.mv_jobs = tiled;
      p.mv_groups = groups;
      p.mv_t = t;
      p.mv_k = k;
      p.mv_xq = m.xq.as<uint8_t>();
      p.mv_meta = m.meta.as<float4>();
      p.mv_x = x;
    } else {
      m.matvec(tiled, groups, m.xq.as<uint8_t>(), m.meta.as<float4>(), t, k, cuda::matvec_fixup(), nullptr);
    }
    tiled.count = 0;
  };
  auto flush_raw = [&] {
    if (raw.count == 0) return;
    cuda::matvec_raw(raw_first->raw, raw, raw_first->row_bytes, raw_first->k, x, t, m.stream);
    check_launch("matvec (raw)");
    raw.count = 0;
  };
  for (size_t i = 0; i < ws.size(); ++i) {
    const DeviceWeight& d = m.dev(*ws[i]);
    if (d.tiled) {
      if (tiled.count == cuda::kMaxJobs || (tiled.count > 0 && (d.groups != groups || d.k != k)))
        flush_tiled();
      groups = d.groups;
      k = d.k;
      tiled.job[tiled.count++] = {d.bytes(), ys[i], static_cast<int>(d.n)};
      tiled_f16 = tiled_f16 && d.f16;
    } else {
      if (raw.count == cuda::kMaxJobs ||
          (raw.count > 0 &&
           (d.raw != raw_first->raw || d.row_bytes != raw_first->row_bytes || d.k != raw_first->k)))
        flush_raw();
      if (raw.count == 0) raw_first = &d;
      raw.job[raw.count++] = {d.bytes(), ys[i], static_cast<int>(d.n)};
    }
  }
  flush_tiled();
  flush_raw();
  for (size_t i = 0; i < ws.size(); ++i) m.wrote(ys[i], static_cast<size_t>(t) * ws[i]->n * sizeof(float));
}

cuda::MatvecFixup CudaBackend::Impl::matvec(const cuda::TiledJobs& jobs, int groups, const uint8_t* act,
                                            const float4* act_meta, int t, int64_t k, cuda::MatvecFixup fixup,
                                            cuda::SplitSums* split, MvLaunch kind, int room) {
  const int sms = prop.multiProcessorCount;
  const cuda::MatvecPlanHint hint = mv_hint(kind, room);
  size_t partial = 0, n_counters = 0;
  cuda::matvec_tiled_scratch(jobs, t, k, sms, &partial, &n_counters, hint);
  grow(mv_partial, partial * sizeof(float), "matvec partial sums");
  if (n_counters * sizeof(int) > mv_counters.bytes) {
    grow(mv_counters, n_counters * sizeof(int), "matvec counters");
    check(cudaMemsetAsync(mv_counters.mem.get(), 0, mv_counters.bytes, stream), "cudaMemsetAsync");
  }
  float* slots = nullptr;  // the flag-free fix-up's scratch of empty words, when it is chosen
  if (fixup == cuda::MatvecFixup::slots) {
    if (partial * sizeof(float) > mv_slots.bytes) {
      grow(mv_slots, partial * sizeof(float), "matvec fix-up slots");
      check(cudaMemsetAsync(mv_slots.mem.get(), 0xff, mv_slots.bytes, stream), "cudaMemsetAsync");
    }
    slots = mv_slots.as<float>();
  }
  const cuda::MatvecFixup used = cuda::matvec_tiled(
      jobs, groups, act, act_meta, t, k, sms, mv_partial.as<float>(), mv_counters.as<int>(), stream, mv_evict,
      cuda::matvec_kernel(), fixup, slots, split, cuda::matvec_ws_loop(), hint);
  check_launch("matvec (tiled)");
  return used;
}

// The rule: a decode matvec leaves one block slot free for each CTA of the site after it
// (blocks <= SMs x blocks per SM - room, with per_warp = ceil(units / (blocks x 8 warps)) as
// ever), so that the site's CTAs become resident beside the matvec's last blocks and their
// dependency wait is all that is left when it ends. The site's grid comes from its shapes at
// the call (residual site: one CTA per Hadamard block and row; SwiGLU site: the same times its
// CTAs per block; attention prep: n_head + 2 n_head_kv per row). gdn_decode asks none: its CTAs
// (256 threads above 128 registers, in clusters) never fit beside a ws block, so a smaller grid
// only slows the qkv+z (H200, 27B: 214 / 183 blocks -2.7 / -3.7 %, gdn_decode's chain advance
// unchanged); the head is the step's last launch. On the 27B (H200, 132 SMs) it moves only the
// FFN gate+up: 248 blocks (11 units per warp) left 16 slots for the SwiGLU site's 17 CTAs, 227
// (12) leave 37: tg128 +0.5 %, where 210 (13) lost 1 %; the down and the out-projections (227 and
// 160 blocks before the residual site's 5) and q/k/v (224 before the prep's 32) have room
// already, and more lost there (down on 195 / 170 blocks -1.6 / -2.9 %, q/k/v on 187 -0.6 %).
// docs/performance.md, "Session 10: matvec plan per launch".
cuda::MatvecPlanHint CudaBackend::Impl::mv_hint(MvLaunch kind, int room) const {
  cuda::MatvecPlanHint h;
  if (const int units = mv_units[static_cast<int>(kind)]; units >= 0)
    h.min_units = units;  // BONSAI_CUDA_MV_UNITS_*: the sweep's arms (0: the global plan)
  else if (kind != MvLaunch::other)
    h.room = std::max(0, room);
  return h;
}

void CudaBackend::add(const float* a, const float* b, float* y, int64_t n) {
  impl_->flush();
  cuda::add(a, b, y, n, impl_->stream);
  check_launch("add");
  impl_->wrote(y, n * sizeof(float));
}

void CudaBackend::swiglu(const float* gate, const float* up, float* y, int64_t n) {
  impl_->flush();
  cuda::swiglu(gate, up, y, n, impl_->stream);
  check_launch("swiglu");
  impl_->wrote(y, n * sizeof(float));
}

void CudaBackend::sigmoid_mul(const float* x, const float* gate, float* y, int64_t n) {
  impl_->flush();
  cuda::sigmoid_mul(x, gate, y, n, impl_->stream);
  check_launch("sigmoid_mul");
  impl_->wrote(y, n * sizeof(float));
}

void CudaBackend::transpose_heads(const float* x, float* y, int64_t rows, int a, int b, int64_t d) {
  Impl& m = *impl_;
  Impl::Pending& p = m.pend;
  if (p.norm && x == p.norm_y && rows == p.f.t && b == p.f.n_k && a * b == p.f.n_v && d == p.f.d_v) {
    p.f.transpose = true;  // the fused kernel writes the normed heads straight to their grouped place
    p.f.out = y;
    m.flush();
  } else {
    m.flush();
    cuda::transpose_heads(x, y, rows, a, b, d, m.stream);
    check_launch("transpose_heads");
  }
  m.wrote(y, rows * a * b * d * sizeof(float));
}

void CudaBackend::take_part(const float* x, float* y, int64_t rows, int parts, int part, int64_t d) {
  impl_->flush();
  cuda::take_part(x, y, rows, parts, part, d, impl_->stream);
  check_launch("take_part");
  impl_->wrote(y, rows * d * sizeof(float));
}

void CudaBackend::residual_norm_site(const float* x, const float* delta, float* x_out, const Weight& gain,
                                     const float* signs, int64_t block, float* normed, float* rotated,
                                     int64_t rows, int64_t n, float eps) {
  Impl& m = *impl_;
  const bool usual = block > 0 && block <= 4096 && n % block == 0 && block % cuda::kBlockK == 0;
  // delta the held-back matvec's y: launched with its split sums left to this site (or to a
  // standalone sum kernel right before it, BONSAI_CUDA_MV_DEFER=2, or where the site's cluster
  // launch does not apply). Its slots stay intact until the site has read them: the next
  // kernel that writes mv_partial is a matvec or GEMM, and they write it only after their
  // griddepcontrol.wait, i.e. after this site's grid has completed.
  Impl::Pending& pm = m.pend;
  cuda::SplitSums split;
  bool deferred = false;
  const bool held = pm.mv && pm.mv_jobs.count == 1 && delta == pm.mv_jobs.job[0].y;
  const Impl::MvLaunch kind = !held                                              ? Impl::MvLaunch::other
                              : pm.mv_x == m.swiglu_out && pm.mv_k == m.swiglu_n ? Impl::MvLaunch::ffn_down
                                                                                 : Impl::MvLaunch::out_proj;
  const int room = usual ? static_cast<int>(rows * (n / block)) : 0;  // the site's CTAs
  if (usual && held && rows == pm.mv_t && n == pm.mv_jobs.job[0].n) {
    pm.mv = false;
    deferred = m.matvec(pm.mv_jobs, pm.mv_groups, pm.mv_xq, pm.mv_meta, pm.mv_t, pm.mv_k,
                        cuda::MatvecFixup::defer, &split, kind, room) == cuda::MatvecFixup::defer;
  }
  m.flush(kind, room);
  // unrotated or unusual: the composed ops
  if (!usual)
    return Backend::residual_norm_site(x, delta, x_out, gain, signs, block, normed, rotated, rows, n, eps);
  const Impl::SiteOut out = deferred ? Impl::SiteOut::int8 : m.site_out(rows, n, block);
  if (out == Impl::SiteOut::fused || out == Impl::SiteOut::two_pass) {  // the consumer is the fp16 GEMM
    cuda::SiteF16Args a;
    a.x = x;
    a.delta = delta;
    a.x_out = x_out;
    a.gain = m.dev(gain).f32();
    a.normed = normed;
    a.eps = eps;
    a.signs = signs;
    a.rotated = rotated;
    m.launch_site_f16(out, cuda::SiteF16Kind::residual, a, rows, n, block);
    for (const float* p : {static_cast<const float*>(x_out), static_cast<const float*>(normed),
                           static_cast<const float*>(rotated)})
      m.wrote(p, static_cast<size_t>(rows * n) * sizeof(float));
    m.site_f16_done(rotated, rows, n);
    return;
  }
  const bool quant = out != Impl::SiteOut::none;  // else the fp16 GEMM converts rotated
  if (quant)
    m.reserve_quant(rows, n);
  else
    ++m.site_quant_skips;
  uint8_t* xq = quant ? m.xq.as<uint8_t>() : nullptr;
  float4* meta = quant ? m.meta.as<float4>() : nullptr;
  bool done = false;
  if (deferred && m.mv_defer == 1) {
    done = cuda::residual_norm_site_split(x, split, x_out, m.dev(gain).f32(), signs, block, normed, rotated,
                                          rows, n, eps, xq, meta, m.stream);
    if (!done) cudaGetLastError();  // a refused cluster launch is not an error of the next launch
  }
  if (deferred && !done) {
    cuda::matvec_split_sum(split, m.stream);
    check_launch("matvec split sum");
  }
  if (!done)
    cuda::residual_norm_site(x, delta, x_out, m.dev(gain).f32(), signs, block, normed, rotated, rows, n, eps,
                             xq, meta, m.stream);
  check_launch(done ? "residual_norm_site (split sums)" : "residual_norm_site");
  for (const float* p : {static_cast<const float*>(x_out), static_cast<const float*>(normed),
                         static_cast<const float*>(rotated)})
    m.wrote(p, static_cast<size_t>(rows * n) * sizeof(float));
  if (!quant) return;
  m.q_src = rotated;
  m.q_rows = rows;
  m.q_k = n;
}

void CudaBackend::swiglu_site(const float* gate, const float* up, float* act, const float* signs,
                              int64_t block, float* rotated, int64_t rows, int64_t n) {
  Impl& m = *impl_;
  const bool usual = block > 0 && block <= 8192 && n % block == 0 && block % cuda::kBlockK == 0;
  // gate and up the held-back gate+up launch's two outputs: launched with its split sums left to
  // this site (as residual_norm_site; where the split site does not apply, the standalone sums
  // first). The slots stay intact until the site has read them (see residual_norm_site).
  Impl::Pending& pm = m.pend;
  cuda::SplitSums split[cuda::kMaxJobs];
  bool deferred = false;
  const bool held =
      pm.mv && pm.mv_jobs.count == 2 && gate == pm.mv_jobs.job[0].y && up == pm.mv_jobs.job[1].y;
  constexpr Impl::MvLaunch kind = Impl::MvLaunch::gate_up;
  const int room = usual ? static_cast<int>(rows * (n / block) * std::max(1, m.swi_site)) : 0;  // its CTAs
  if (usual && m.ffn_defer && held && rows == pm.mv_t && n == pm.mv_jobs.job[0].n &&
      n == pm.mv_jobs.job[1].n) {
    pm.mv = false;
    deferred = m.matvec(pm.mv_jobs, pm.mv_groups, pm.mv_xq, pm.mv_meta, pm.mv_t, pm.mv_k,
                        cuda::MatvecFixup::defer, split, kind, room) == cuda::MatvecFixup::defer;
  }
  m.flush(held ? kind : Impl::MvLaunch::other, room);
  m.swiglu_out = rotated;  // the FFN down's input
  m.swiglu_n = n;
  if (!usual) return Backend::swiglu_site(gate, up, act, signs, block, rotated, rows, n);
  const Impl::SiteOut out = deferred ? Impl::SiteOut::int8 : m.site_out(rows, n, block);
  if (out == Impl::SiteOut::fused || out == Impl::SiteOut::two_pass) {  // the consumer is the fp16 GEMM
    cuda::SiteF16Args a;
    a.x = gate;
    a.up = up;
    a.act = act;
    a.signs = signs;
    a.rotated = rotated;
    m.launch_site_f16(out, cuda::SiteF16Kind::swiglu, a, rows, n, block);
    m.wrote(act, static_cast<size_t>(rows * n) * sizeof(float));
    m.wrote(rotated, static_cast<size_t>(rows * n) * sizeof(float));
    m.site_f16_done(rotated, rows, n);
    return;
  }
  const bool quant = out != Impl::SiteOut::none;  // else the fp16 GEMM converts rotated
  if (quant)
    m.reserve_quant(rows, n);
  else
    ++m.site_quant_skips;
  uint8_t* xq = quant ? m.xq.as<uint8_t>() : nullptr;
  float4* meta = quant ? m.meta.as<float4>() : nullptr;
  bool done = false;
  if (quant && deferred && m.swi_site > 0 && m.fwht_ctas[0] == 1) {
    // act null: nothing reads gate / up after the site (Backend::swiglu_site), no write-back
    done = cuda::swiglu_site_lean(split[0], split[1], act, signs, rotated, rows, n, block, xq, meta,
                                  act != nullptr, m.stream, m.swi_site, m.swi_low_regs);
    if (!done) cudaGetLastError();  // a refused cluster launch is not an error of the next launch
  }
  if (!done && quant && (deferred || (m.fwht_ctas[0] > 1 && rows < cuda::kGemmMinTokens))) {
    const int r = static_cast<int>(rows), c = static_cast<int>(n);
    done = cuda::fwht_site_split(deferred ? split[0] : cuda::split_whole(gate, r, c),
                                 deferred ? split[1] : cuda::split_whole(up, r, c), act, signs, rotated, rows,
                                 n, block, m.fwht_ctas[0], xq, meta, m.stream);
    if (!done) cudaGetLastError();  // a refused cluster launch is not an error of the next launch
    if (!done && deferred && m.fwht_ctas[0] > 1) {  // one block per Hadamard block
      done = cuda::fwht_site_split(split[0], split[1], act, signs, rotated, rows, n, block, 1, xq, meta,
                                   m.stream);
      if (!done) cudaGetLastError();
    }
  }
  if (deferred && !done)
    for (int j = 0; j < 2; ++j) {
      cuda::matvec_split_sum(split[j], m.stream);
      check_launch("matvec split sum");
    }
  if (!done) cuda::swiglu_hadamard(gate, up, act, signs, rotated, rows, n, block, false, xq, meta, m.stream);
  check_launch(done ? "swiglu_site (split)" : "swiglu_site");
  m.wrote(act, static_cast<size_t>(rows * n) * sizeof(float));
  m.wrote(rotated, static_cast<size_t>(rows * n) * sizeof(float));
  if (!quant) return;
  m.q_src = rotated;
  m.q_rows = rows;
  m.q_k = n;
}

}  // namespace bonsai
