#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "bonsai/error.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("cuda: {}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

// After a kernel launch: launch-configuration errors surface here, execution errors at the next sync.
void check_launch(const char* what) { check(cudaGetLastError(), what); }

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct HostFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;
using PinnedPtr = std::unique_ptr<void, HostFree>;

DevicePtr device_alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<size_t>(bytes, 256)), what);
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
  int groups = 1;  // tiled: scales per row per 128 columns
  int64_t n = 0, k = 0;
  size_t row_bytes = 0;  // raw layout
  DevicePtr mem;
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(mem.get()); }
  const float* f32() const { return static_cast<const float*>(mem.get()); }
};

bool raw_type(DType t, cuda::RawType& out) {
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

constexpr int kDecodeSplits = 32;            // attention splits of a (recordable) single-token step
constexpr size_t kStagingBytes = 32u << 20;  // per upload staging slot (two slots)

}  // namespace

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

struct CudaBackend::Impl {
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

  Growable part, tokens;
  int* step_dev = nullptr;  // {pos0, token}: what a recorded step reads
  PinnedPtr step_host;
  DevicePtr step_mem;

  // Upload staging: two pinned + two device slots, so filling one overlaps the copy of the other.
  PinnedPtr pinned[2];
  DevicePtr raw_slot[2];
  cudaEvent_t slot_free[2] = {nullptr, nullptr};

  bool capturing = false, warm = false;
  cudaGraphExec_t exec = nullptr;

  ~Impl() {
    if (stream) cudaStreamSynchronize(stream);
    if (exec) cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : slot_free)
      if (e) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
  }

  void invalidate_quant() { q_src = nullptr; }
  // Every op reports what it wrote, so the cached quantization never goes stale.
  void wrote(const void* p, size_t bytes) {
    if (!q_src) return;
    const auto* a = static_cast<const uint8_t*>(p);
    const auto* s = reinterpret_cast<const uint8_t*>(q_src);
    if (a < s + q_rows * q_k * sizeof(float) && s < a + bytes) invalidate_quant();
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
  void reserve_quant(int64_t rows, int64_t k) {
    grow(xq, static_cast<size_t>(rows) * (k / cuda::kBlockK) * cuda::kActBytes,
         "activation quantization buffer");
    grow(meta, static_cast<size_t>(rows) * (k / cuda::kBlockK) * sizeof(float4), "activation scale buffer");
  }
  const int* pos_dev() const { return capturing ? step_dev : nullptr; }
};

CudaBackend::CudaBackend(int device) : impl_(std::make_unique<Impl>()) {
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

// ---- memory ------------------------------------------------------------------------

float* CudaBackend::alloc(size_t n) {
  Impl& m = *impl_;
  if (m.capturing) fail("cuda: alloc while a step is being recorded");
  DevicePtr p = device_alloc(n * sizeof(float), "cudaMalloc (activation buffer)");
  check(cudaMemsetAsync(p.get(), 0, std::max<size_t>(n, 1) * sizeof(float), m.stream), "cudaMemsetAsync");
  auto* f = static_cast<float*>(p.get());
  m.buffers.emplace(f, std::move(p));
  m.buffer_bytes += n * sizeof(float);
  return f;
}

void CudaBackend::release(float* p) {
  Impl& m = *impl_;
  auto it = m.buffers.find(p);
  if (it == m.buffers.end()) return;
  check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
  m.invalidate_quant();  // the cached quantization may be of this buffer
  m.drop_recording();    // a recorded step may use it
  m.buffers.erase(it);
}

void CudaBackend::to_host(float* dst, const float* src, size_t n) {
  Impl& m = *impl_;
  check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, m.stream), "cudaMemcpy D2H");
  check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
}

void CudaBackend::from_host(float* dst, const float* src, size_t n) {
  Impl& m = *impl_;
  check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, m.stream), "cudaMemcpy H2D");
  m.wrote(dst, n * sizeof(float));
}

void CudaBackend::copy(float* dst, const float* src, size_t n) {
  Impl& m = *impl_;
  check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, m.stream), "cudaMemcpy D2D");
  m.wrote(dst, n * sizeof(float));
}

void CudaBackend::zero(float* p, size_t n) {
  Impl& m = *impl_;
  check(cudaMemsetAsync(p, 0, n * sizeof(float), m.stream), "cudaMemsetAsync");
  m.wrote(p, n * sizeof(float));
}

void CudaBackend::sync() { check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize"); }

// ---- weights -------------------------------------------------------------------------

void CudaBackend::prepare(Weight& w) {
  if (w.prepared || w.empty()) return;
  w.prepared = impl_->upload(w);
}

void CudaBackend::unprepare(Weight& w) {
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
  d->mem = device_alloc(bytes, "cudaMalloc (weight)");
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
    raw_slot[s] = device_alloc(kStagingBytes, "cudaMalloc (upload staging)");
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
    if (d.tiled) {
      check(cudaMemcpyAsync(raw_slot[s].get(), host, bytes, cudaMemcpyHostToDevice, stream),
            "cudaMemcpy (weight)");
      const size_t pair_bytes = 2 * static_cast<size_t>(w.k / cuda::kBlockK) * cuda::chunk_bytes(d.groups);
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
  Impl& m = *impl_;
  cuda::rmsnorm(x, m.dev(gain).f32(), y, rows, n, eps, m.stream);
  check_launch("rmsnorm");
  m.wrote(y, rows * n * sizeof(float));
}

void CudaBackend::hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k,
                           int64_t block, bool inverse) {
  Impl& m = *impl_;
  if (block > 8192 || k % block) fail("cuda: Hadamard block {} of width {} is not supported", block, k);
  // A forward site feeds a ternary matvec: quantize its output in the same pass.
  const bool quant = !inverse && block % cuda::kBlockK == 0;
  if (quant) m.reserve_quant(rows, k);
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
  const Weight* ws[] = {&w};
  float* ys[] = {y};
  matmul_multi(ws, x, ys, t);
}

void CudaBackend::matmul_multi(std::span<const Weight* const> ws, const float* x, std::span<float* const> ys,
                               int t) {
  Impl& m = *impl_;
  cuda::TiledJobs jobs;
  int groups = 0;
  int64_t k = 0;
  auto flush = [&] {
    if (jobs.count == 0) return;
    m.quantized(x, t, k);
    cuda::matvec_tiled(jobs, groups, m.xq.as<uint8_t>(), m.meta.as<float4>(), t, k, m.stream);
    check_launch("matvec (tiled)");
    jobs.count = 0;
  };
  for (size_t i = 0; i < ws.size(); ++i) {
    const DeviceWeight& d = m.dev(*ws[i]);
    if (!d.tiled) {
      cuda::matvec_raw(d.raw, d.bytes(), d.row_bytes, d.n, d.k, x, ys[i], t, m.stream);
      check_launch("matvec (raw)");
      continue;
    }
    // weights sharing the input and the scale grouping go into one launch
    if (jobs.count == cuda::kMaxJobs || (jobs.count > 0 && (d.groups != groups || d.k != k))) flush();
    groups = d.groups;
    k = d.k;
    jobs.job[jobs.count++] = {d.bytes(), ys[i], static_cast<int>(d.n)};
  }
  flush();
  for (size_t i = 0; i < ws.size(); ++i) m.wrote(ys[i], static_cast<size_t>(t) * ws[i]->n * sizeof(float));
}

void CudaBackend::add(const float* a, const float* b, float* y, int64_t n) {
  cuda::add(a, b, y, n, impl_->stream);
  check_launch("add");
  impl_->wrote(y, n * sizeof(float));
}

void CudaBackend::swiglu(const float* gate, const float* up, float* y, int64_t n) {
  cuda::swiglu(gate, up, y, n, impl_->stream);
  check_launch("swiglu");
  impl_->wrote(y, n * sizeof(float));
}

void CudaBackend::sigmoid_mul(const float* x, const float* gate, float* y, int64_t n) {
  cuda::sigmoid_mul(x, gate, y, n, impl_->stream);
  check_launch("sigmoid_mul");
  impl_->wrote(y, n * sizeof(float));
}

void CudaBackend::transpose_heads(const float* x, float* y, int64_t rows, int a, int b, int64_t d) {
  cuda::transpose_heads(x, y, rows, a, b, d, impl_->stream);
  check_launch("transpose_heads");
  impl_->wrote(y, rows * a * b * d * sizeof(float));
}

void CudaBackend::take_part(const float* x, float* y, int64_t rows, int parts, int part, int64_t d) {
  cuda::take_part(x, y, rows, parts, part, d, impl_->stream);
  check_launch("take_part");
  impl_->wrote(y, rows * d * sizeof(float));
}

void CudaBackend::residual_norm_site(const float* x, const float* delta, float* x_out, const Weight& gain,
                                     const float* signs, int64_t block, float* normed, float* rotated,
                                     int64_t rows, int64_t n, float eps) {
  Impl& m = *impl_;
  if (block <= 0 || n > 12288 || n % block ||
      block % cuda::kBlockK)  // unrotated or unusual: the composed ops
    return Backend::residual_norm_site(x, delta, x_out, gain, signs, block, normed, rotated, rows, n, eps);
  m.reserve_quant(rows, n);
  cuda::residual_norm_site(x, delta, x_out, m.dev(gain).f32(), signs, block, normed, rotated, rows, n, eps,
                           m.xq.as<uint8_t>(), m.meta.as<float4>(), m.stream);
  check_launch("residual_norm_site");
  for (const float* p : {static_cast<const float*>(x_out), static_cast<const float*>(normed),
                         static_cast<const float*>(rotated)})
    m.wrote(p, static_cast<size_t>(rows * n) * sizeof(float));
  m.q_src = rotated;
  m.q_rows = rows;
  m.q_k = n;
}

void CudaBackend::swiglu_site(const float* gate, const float* up, float* act, const float* signs,
                              int64_t block, float* rotated, int64_t rows, int64_t n) {
  Impl& m = *impl_;
  if (block <= 0 || block > 8192 || n % block || block % cuda::kBlockK)
    return Backend::swiglu_site(gate, up, act, signs, block, rotated, rows, n);
  m.reserve_quant(rows, n);
  cuda::swiglu_hadamard(gate, up, act, signs, rotated, rows, n, block, false, m.xq.as<uint8_t>(),
                        m.meta.as<float4>(), m.stream);
  check_launch("swiglu_site");
  m.wrote(act, static_cast<size_t>(rows * n) * sizeof(float));
  m.wrote(rotated, static_cast<size_t>(rows * n) * sizeof(float));
  m.q_src = rotated;
  m.q_rows = rows;
  m.q_k = n;
}

void CudaBackend::rope(float* x, int t, int n_head, int head_dim, int n_rot, float base, int pos0) {
  Impl& m = *impl_;
  cuda::rope(x, t, n_head, head_dim, n_rot, base, pos0, m.pos_dev(), m.stream);
  check_launch("rope");
  m.wrote(x, static_cast<size_t>(t) * n_head * head_dim * sizeof(float));
}

void CudaBackend::store_rows(float* cache, const float* src, int64_t width, int t, int pos0) {
  Impl& m = *impl_;
  cuda::store_rows(cache, src, width, t, pos0, m.pos_dev(), m.stream);
  check_launch("store_rows");
  m.invalidate_quant();  // the written rows depend on a device-side position
}

void CudaBackend::attention(const float* q, const float* k_cache, const float* v_cache, float* out, int t,
                            int pos0, const AttentionShape& s) {
  Impl& m = *impl_;
  if (s.head_dim % 32 || s.head_dim > 256 || s.n_head % s.n_head_kv || s.n_head / s.n_head_kv > 8)
    fail("cuda: attention with {} heads, {} KV heads and head_dim {} is not supported", s.n_head, s.n_head_kv,
         s.head_dim);
  // One token (a recordable decode step): a fixed split count, so the launch does not depend
  // on the position. Batches: enough blocks to fill the device.
  int splits = kDecodeSplits;
  if (t > 1) {
    const int blocks = t * s.n_head_kv;
    splits = std::clamp((2 * m.prop.multiProcessorCount + blocks - 1) / blocks, 1, kDecodeSplits);
    splits = std::min(splits, std::max(1, (pos0 + t + 63) / 64));
  }
  m.grow(m.part, static_cast<size_t>(t) * s.n_head * splits * (s.head_dim + 2) * sizeof(float),
         "attention partials");
  cuda::attention(q, k_cache, v_cache, out, m.part.as<float>(), t, pos0, m.pos_dev(), splits, s.n_head,
                  s.n_head_kv, s.head_dim, s.scale, m.stream);
  check_launch("attention");
  m.wrote(out, static_cast<size_t>(t) * s.n_head * s.head_dim * sizeof(float));
}

void CudaBackend::ssm_conv(const float* x, float* state, const Weight& w, float* out, int t, int64_t channels,
                           int taps) {
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
  cuda::gdn_gates(alpha, beta_in, m.dev(ssm_a).f32(), m.dev(dt_bias).f32(), g, beta, t, n_v, m.stream);
  check_launch("gdn_gates");
  m.wrote(g, static_cast<size_t>(t) * n_v * sizeof(float));
  m.wrote(beta, static_cast<size_t>(t) * n_v * sizeof(float));
}

void CudaBackend::gdn_recurrence(const float* conv, const float* g, const float* beta, float* state,
                                 float* out, int t, const GdnShape& s) {
  Impl& m = *impl_;
  if (s.d_k % 32 || s.d_k > 1024 || s.d_v % 32)
    fail("cuda: delta rule with d_k {} and d_v {} is not supported (multiples of 32, d_k <= 1024)", s.d_k,
         s.d_v);
  cuda::gdn_recurrence(conv, g, beta, state, out, t, s.n_k, s.n_v, s.d_k, s.d_v, s.eps, m.stream);
  check_launch("gdn_recurrence");
  m.wrote(state, static_cast<size_t>(s.n_v) * s.d_k * s.d_v * sizeof(float));
  m.wrote(out, static_cast<size_t>(t) * s.n_v * s.d_v * sizeof(float));
}

void CudaBackend::gated_rmsnorm(const float* o, const float* z, const Weight& w, float* y, int64_t rows,
                                int64_t d, float eps) {
  Impl& m = *impl_;
  cuda::gated_rmsnorm(o, z, m.dev(w).f32(), y, rows, d, eps, m.stream);
  check_launch("gated_rmsnorm");
  m.wrote(y, rows * d * sizeof(float));
}

// ---- recorded steps -------------------------------------------------------------------------

bool CudaBackend::replay_step(const int32_t* tokens, int t, int pos0) {
  Impl& m = *impl_;
  if (!m.exec || t != 1) return false;
  // The previous step ended with a synchronous read of its logits, so the graph's copy of
  // these pinned words has finished and they can be rewritten.
  int* h = static_cast<int*>(m.step_host.get());
  h[0] = pos0;
  h[1] = tokens[0];
  check(cudaGraphLaunch(m.exec, m.stream), "cudaGraphLaunch");
  m.invalidate_quant();
  return true;
}

bool CudaBackend::begin_capture(const int32_t* tokens, int t, int pos0) {
  Impl& m = *impl_;
  if (t != 1 || m.capturing) return false;
  if (!m.warm) {  // the first step runs eagerly, so every buffer already has its size when recording
    m.warm = true;
    return false;
  }
  check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
  int* h = static_cast<int*>(m.step_host.get());
  h[0] = pos0;
  h[1] = tokens[0];
  check(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  m.capturing = true;
  m.invalidate_quant();
  // Recorded as a copy node: every replay reads the pinned words as they are at launch.
  check(cudaMemcpyAsync(m.step_dev, h, 2 * sizeof(int), cudaMemcpyHostToDevice, m.stream),
        "cudaMemcpy (step)");
  return true;
}

void CudaBackend::end_capture() {
  Impl& m = *impl_;
  if (!m.capturing) return;
  m.capturing = false;
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(m.stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(e, "cudaGraphInstantiate");
  if (m.exec) cudaGraphExecDestroy(m.exec);
  m.exec = exec;
  check(cudaGraphLaunch(m.exec, m.stream), "cudaGraphLaunch");
  m.invalidate_quant();
}

void CudaBackend::drop_capture() {
  Impl& m = *impl_;
  if (m.capturing) {
    m.capturing = false;
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(m.stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  m.drop_recording();
  m.invalidate_quant();
}

// ---- benchmarks ------------------------------------------------------------------------------

double CudaBackend::copy_bandwidth(size_t bytes, int reps) {
  sync();
  return cuda::measure_copy_bandwidth(bytes, reps, impl_->stream);
}

double CudaBackend::time_recorded(const std::function<void()>& ops, int reps) {
  Impl& m = *impl_;
  ops();  // once eagerly: every buffer gets its size before recording
  sync();
  check(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  m.capturing = true;
  m.invalidate_quant();
  try {
    ops();
  } catch (...) {
    drop_capture();
    throw;
  }
  m.capturing = false;
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(m.stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(e, "cudaGraphInstantiate");
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  check(cudaGraphLaunch(exec, m.stream), "cudaGraphLaunch");  // warm-up
  check(cudaEventRecord(e0, m.stream), "cudaEventRecord");
  for (int r = 0; r < reps; ++r) check(cudaGraphLaunch(exec, m.stream), "cudaGraphLaunch");
  check(cudaEventRecord(e1, m.stream), "cudaEventRecord");
  check(cudaEventSynchronize(e1), "cudaEventSynchronize");
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  m.invalidate_quant();
  return ms * 1e-3 / reps;
}

}  // namespace bonsai
