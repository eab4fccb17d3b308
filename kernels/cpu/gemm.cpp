// Ternary GEMM: batch quantization (bit-identical to prepare_act's per-block
// quantization), argument checks, and the panel split across threads.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "bonsai/error.h"
#include "kernels/cpu/gemm_kernels.h"

namespace bonsai::cpu {
namespace {

// Same constants and rounding as prepare_act.cpp (kept in step with it: the
// GEMM must produce the decode path's integers).
constexpr int kQFaithful = 32639;
constexpr int kQInt8 = 127;

float abs_max(const float* x, int64_t n) {
  int32_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    int32_t v;
    std::memcpy(&v, x + j, 4);
    m = std::max(m, v & 0x7FFFFFFF);  // NaN orders above infinity
  }
  float f;
  std::memcpy(&f, &m, 4);
  return f;
}

// q = round(x / s) for one block as prepare_act computes it; returns Σ q.
int32_t quantize_block(const float* x, int n, int Q, int16_t* q, float& s, int64_t token, int64_t block) {
  const float amax = abs_max(x, n);
  s = 0.0f;
  if (!std::isfinite(amax))
    fail("prepare_batch: token {} activation block {} holds a non-finite value", token, block);
  if (amax == 0.0f) {
    std::fill(q, q + n, int16_t{0});
    return 0;
  }
  s = amax / static_cast<float>(Q);
  const double inv = static_cast<double>(Q) / static_cast<double>(amax);
  int32_t sum = 0;
  if (inv < 1e30) {
    constexpr float kMagic = 12582912.0f;  // 1.5·2^23: float add rounds to nearest even
    const float invf = static_cast<float>(inv);
    for (int j = 0; j < n; ++j) {
      const float r = (x[j] * invf + kMagic) - kMagic;
      q[j] = static_cast<int16_t>(static_cast<int>(r));
      sum += q[j];
    }
  } else {
    for (int j = 0; j < n; ++j) {
      const long v = std::clamp<long>(std::lrint(static_cast<double>(x[j]) * inv), -Q, Q);
      q[j] = static_cast<int16_t>(v);
      sum += q[j];
    }
  }
  return sum;
}

detail::GemmArgs bind(const WeightView& w, const PreparedBatch& a, float* y, Isa isa) {
  if (!gemm_supported(w.type, isa))
    fail("gemm: no {} kernel for {} weights", isa_name(isa), dtype_name(w.type));
  if (w.k != a.k) fail("gemm: {} weight has {} inputs but the batch has {}", dtype_name(w.type), w.k, a.k);
  if (gemm_block(w.type) != a.block)
    fail("gemm: {} weights need {}-element activation blocks, the batch has {}", dtype_name(w.type),
         gemm_block(w.type), a.block);
  if (w.n < 0 || (w.n > 0 && !w.data)) fail("gemm: {} weight has no data", dtype_name(w.type));
  const bool lanes = w.layout == WeightLayout::Lanes16, stream = w.layout == WeightLayout::Stream16;
  if (stream) {
    if (w.type != DType::PQ2_0 && w.type != DType::Q2_0_G128)
      fail("gemm: the block-stream layout holds PQ2_0 / Q2_0 g128 weights, not {}", dtype_name(w.type));
    if (isa != Isa::Avx512)
      fail("gemm: block-stream {} weights need the AVX-512 kernels (asked for {})", dtype_name(w.type),
           isa_name(isa));
  }
  if (lanes) {
    if (w.type != DType::PQ2_0 && w.type != DType::Q2_0_G128)
      fail("gemm: the block-lanes layout holds PQ2_0 / Q2_0 g128 weights, not {}", dtype_name(w.type));
    if (isa != Isa::Avx512)
      fail("gemm: block-lanes {} weights need the AVX-512 kernels (asked for {})", dtype_name(w.type),
           isa_name(isa));
    if (w.n > 0 && !w.scales) fail("gemm: block-lanes {} weight has no scales", dtype_name(w.type));
  }
  const DTypeInfo info = dtype_info(w.type);
  if (w.k % info.block_size)
    fail("gemm: {} weight width {} is not a multiple of its block {}", dtype_name(w.type), w.k,
         info.block_size);
  detail::GemmArgs g{};
  g.w = w.data;
  g.row_bytes = lanes ? lanes_code_row_bytes(w.k) : static_cast<int64_t>(row_bytes(w.type, w.k));
  g.n_rows = w.n;
  g.n_blocks = w.k / info.block_size;
  g.block = static_cast<int>(info.block_size);
  g.block_bytes = static_cast<int>(info.type_size);
  g.ptq1 = w.type == DType::PTQ1_0;
  g.end = w.data + g.row_bytes * w.n;
  g.lanes = lanes;
  g.scales = lanes ? w.scales : nullptr;
  g.stream_rl = stream ? stream_group_rows(w.k) : 0;
  g.stream_rgb = stream ? stream_rowgroup_bytes(w.k) : 0;
  if (stream) g.end = w.data + stream_total_bytes(w.n, w.k);
  g.q = a.q.data();
  g.corr = a.corr.data();
  g.scale = a.scale.data();
  g.t = a.t;
  g.faithful = a.precision == Precision::Faithful;
  g.y = y;
  g.ldy = w.n;
  return g;
}

struct Scratch {
  std::vector<AlignedBuffer<uint8_t>> per_thread;
  Scratch(int threads, int t) : per_thread(static_cast<size_t>(threads)) {
    for (auto& b : per_thread) b.resize(detail::gemm_scratch_bytes(t));
  }
};

}  // namespace

int gemm_block(DType t) {
  switch (t) {
    case DType::PQ2_0:
    case DType::Q2_0_G128:
    case DType::PTQ1_0:
      return 128;
    case DType::Q2_0_G64:
      return 64;
    default:
      return 0;
  }
}

bool gemm_supported(DType t, Isa isa) {
  return gemm_block(t) != 0 && (isa == Isa::Avx512 || isa == Isa::Avx2) && isa_supported(isa);
}

void prepare_batch(const float* x, int t, int64_t k, int block, Precision precision, PreparedBatch& out,
                   ThreadPool* pool) {
  if (t <= 0 || k <= 0) fail("prepare_batch: batch of {} tokens × {} inputs is empty", t, k);
  if (block != 128 && block != 64) fail("prepare_batch: activation block must be 64 or 128 (got {})", block);
  if (k % block) fail("prepare_batch: width {} is not a multiple of the block {}", k, block);
  const bool faithful = precision == Precision::Faithful;
  const int Q = faithful ? kQFaithful : kQInt8;
  const int halves = faithful ? 2 : 1;
  out.t = t, out.k = k, out.block = block, out.precision = precision;
  out.n_blocks = k / block;
  out.q.resize(static_cast<size_t>(out.n_blocks * t * halves * block));
  out.corr.resize(static_cast<size_t>(out.n_blocks * t));
  out.scale.resize(static_cast<size_t>(out.n_blocks * t));
  // Tokens are independent: split across the pool (each task one token).
  auto one_token = [&](int64_t i, int) {
    int16_t q[128];
    for (int64_t b = 0; b < out.n_blocks; ++b) {
      float s = 0.0f;
      const int32_t sum = quantize_block(x + i * k + b * block, block, Q, q, s, i, b);
      out.corr.data()[b * t + i] = -sum;
      out.scale.data()[b * t + i] = s;
      int8_t* dst = out.q.data() + (b * t + i) * halves * block;
      // Step order: byte 4j + e ← element 16·(j/4) + 4e + j%4.
      for (int j = 0; j < block / 4; ++j)
        for (int e = 0; e < 4; ++e) {
          const int v = q[16 * (j / 4) + 4 * e + j % 4];
          if (faithful) {
            const int hi = (v + 128) >> 8;  // v = 256·hi + lo, hi ∈ [−127, 127], lo ∈ [−128, 127]
            dst[4 * j + e] = static_cast<int8_t>(hi);
            dst[block + 4 * j + e] = static_cast<int8_t>(v - 256 * hi);
          } else {
            dst[4 * j + e] = static_cast<int8_t>(v);
          }
        }
    }
  };
  if (pool)
    pool->parallel_for(t, one_token);
  else
    for (int i = 0; i < t; ++i) one_token(i, 0);
}

void gemm(const WeightView& w, const PreparedBatch& a, float* y, ThreadPool& pool, Isa isa) {
  const MatvecJob job{w, y};
  gemm_multi(std::span<const MatvecJob>(&job, 1), a, pool, isa);
}

void gemm_multi(std::span<const MatvecJob> jobs, const PreparedBatch& a, ThreadPool& pool, Isa isa) {
  std::vector<detail::GemmArgs> args;
  std::vector<int64_t> first_panel{0};  // jobs' panels laid end to end
  for (const MatvecJob& j : jobs) {
    args.push_back(bind(j.w, a, j.y, isa));
    first_panel.push_back(first_panel.back() + (j.w.n + detail::kGemmPanelRows - 1) / detail::kGemmPanelRows);
  }
  const int64_t total = first_panel.back();
  if (total == 0) return;
  Scratch scratch(pool.size(), a.t);
  const auto panel = isa == Isa::Avx512 ? detail::gemm_panel_avx512 : detail::gemm_panel_avx2;
  pool.parallel_for(total, [&](int64_t p, int thread) {
    const size_t j = static_cast<size_t>(std::upper_bound(first_panel.begin(), first_panel.end(), p) -
                                         first_panel.begin() - 1);
    panel(args[j], (p - first_panel[j]) * detail::kGemmPanelRows,
          scratch.per_thread[static_cast<size_t>(thread)].data());
  });
}

}  // namespace bonsai::cpu
