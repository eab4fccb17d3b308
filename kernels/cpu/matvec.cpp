// Matvec dispatch: argument checks, ISA selection and the row split across threads.
#include "kernels/cpu/matvec.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "bonsai/error.h"
#include "kernels/cpu/matvec_kernels.h"
#include "runtime/env.h"

namespace bonsai::cpu {
namespace {

using detail::FloatKernel;
using detail::TernaryKernel;
static_assert(kLanesGroup == detail::kLanesGroupBlocks);

TernaryKernel ternary_kernel(DType t, Isa isa) {
  switch (t) {
    case DType::PQ2_0:
    case DType::Q2_0_G128:
      return isa == Isa::Avx512 ? detail::pq2_rows_avx512
             : isa == Isa::Avx2 ? detail::pq2_rows_avx2
                                : detail::pq2_rows_scalar;
    case DType::Q2_0_G64:
      return isa == Isa::Avx512 ? detail::q2g64_rows_avx512
             : isa == Isa::Avx2 ? detail::q2g64_rows_avx2
                                : detail::q2g64_rows_scalar;
    case DType::PTQ1_0:
      return isa == Isa::Avx512 ? detail::ptq1_rows_avx512
             : isa == Isa::Avx2 ? detail::ptq1_rows_avx2
                                : detail::ptq1_rows_scalar;
    default:
      return nullptr;
  }
}

int float_code(DType t) {
  switch (t) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::BF16:
      return 2;
    default:
      return -1;
  }
}

// Checks a (weight, activation) pair and binds it to a row kernel.
struct Bound {
  TernaryKernel tk = nullptr;
  detail::TernaryArgs targs{};
  FloatKernel fk = nullptr;
  detail::FloatArgs fargs{};
  void run(float* y, int64_t r0, int64_t r1) const {
    if (r0 >= r1) return;
    if (tk)
      tk(targs, y, r0, r1);
    else
      fk(fargs, y, r0, r1);
  }
};

detail::PackedView packed_view(const PreparedAct& a, ActLayout l) {
  const PackedAct& p = a.packed[static_cast<int>(l)];
  return {p.hi.data(), a.precision == Precision::Faithful ? p.lo.data() : nullptr, p.corr.data(),
          p.scale.data(), p.n_groups};
}

void check_lanes(const WeightView& w, const char* who) {
  if (w.type != DType::PQ2_0 && w.type != DType::Q2_0_G128)
    fail("{}: the block-lanes layout holds PQ2_0 / Q2_0 g128 weights, not {}", who, dtype_name(w.type));
  if (w.k % 128) fail("{}: block-lanes weight width {} is not a multiple of 128", who, w.k);
}

Bound bind(const WeightView& w, const PreparedAct& a, Isa isa) {
  if (!isa_supported(isa)) fail("matvec: instruction set {} is not supported by this CPU", isa_name(isa));
  if (w.k != a.k)
    fail("matvec: {} weight has {} inputs but the activation has {}", dtype_name(w.type), w.k, a.k);
  if (w.n < 0 || (w.n > 0 && !w.data)) fail("matvec: {} weight has no data", dtype_name(w.type));
  Bound b;
  if (w.layout == WeightLayout::Stream16) {
    check_lanes(w, "matvec");
    if (isa != Isa::Avx512)
      fail("matvec: block-stream {} weights need the AVX-512 kernels (asked for {})", dtype_name(w.type),
           isa_name(isa));
    if (!(a.layouts & layout_bit(ActLayout::Lanes16)))
      fail("matvec: the activation was not prepared for block-stream weights (prepare_act layouts {:#x})",
           a.layouts);
    b.tk = detail::pq2_stream_rows_avx512;
    b.targs.w = w.data;
    b.targs.row_bytes = stream_group_rows(w.k);  // Stream16: rows per row group
    b.targs.n_blocks = w.k / 128;
    b.targs.end = w.data + stream_total_bytes(w.n, w.k);
    b.targs.a = packed_view(a, ActLayout::Lanes16);
    b.targs.scales = nullptr;
    b.targs.prefetch = stream_prefetch_bytes(b.targs.row_bytes);
    return b;
  }
  if (w.layout == WeightLayout::Lanes16) {
    check_lanes(w, "matvec");
    if (w.n > 0 && !w.scales) fail("matvec: block-lanes {} weight has no scales", dtype_name(w.type));
    if (isa != Isa::Avx512)
      fail("matvec: block-lanes {} weights need the AVX-512 kernels (asked for {})", dtype_name(w.type),
           isa_name(isa));
    if (!(a.layouts & layout_bit(ActLayout::Lanes16)))
      fail("matvec: the activation was not prepared for block-lanes weights (prepare_act layouts {:#x})",
           a.layouts);
    b.tk = detail::pq2_lanes_rows_avx512;
    b.targs.w = w.data;
    b.targs.row_bytes = lanes_code_row_bytes(w.k);
    b.targs.n_blocks = w.k / 128;
    b.targs.end = w.data + b.targs.row_bytes * w.n;
    b.targs.a = packed_view(a, ActLayout::Lanes16);
    b.targs.scales = w.scales;
    return b;
  }
  const DTypeInfo info = dtype_info(w.type);
  if (TernaryKernel tk = ternary_kernel(w.type, isa)) {
    const uint32_t need = layouts_for(w.type);
    if (!(a.layouts & need))
      fail("matvec: the activation was not prepared for {} weights (prepare_act layouts {:#x})",
           dtype_name(w.type), a.layouts);
    if (w.k % info.block_size)
      fail("matvec: {} weight width {} is not a multiple of its block {}", dtype_name(w.type), w.k,
           info.block_size);
    b.tk = tk;
    b.targs.w = w.data;
    b.targs.row_bytes = static_cast<int64_t>(row_bytes(w.type, w.k));
    b.targs.n_blocks = w.k / info.block_size;
    b.targs.end = w.data + b.targs.row_bytes * w.n;
    b.targs.a = packed_view(a, static_cast<ActLayout>(std::countr_zero(need)));
    b.targs.scales = nullptr;
    return b;
  }
  const int fc = float_code(w.type);
  if (fc < 0) fail("matvec: weight type {} is not supported by the CPU kernels", dtype_name(w.type));
  b.fk = isa == Isa::Avx512 ? detail::float_rows_avx512
         : isa == Isa::Avx2 ? detail::float_rows_avx2
                            : detail::float_rows_scalar;
  b.fargs = {w.data, w.k, fc, a.x.data()};
  return b;
}

// Rows are handed out in contiguous chunks (each a sequential stream for the
// prefetchers) of at least kMinChunkBytes, a few per thread so that a thread
// the OS delays does not hold up the others (dynamic scheduling), and of at
// most kMaxChunkBytes: with a handful of chunks per thread, a 340 MB head or a
// 47 MB gate+up pair ends with one thread finishing a 6–42 MB chunk alone
// whenever the two threads' speeds differ (they do on a shared machine); with
// 1 MiB chunks (~60 µs of work each; the atomic hand-out costs ~0.1 µs and a
// chunk start loses ~4 KB of prefetch lead) the tail is ≤ 60 µs. Chunk row
// counts are multiples of 8 so multi-row kernels see full row groups.
constexpr int64_t kMinChunkBytes = 64 * 1024;
constexpr int64_t kMaxChunkBytes = 1024 * 1024;
constexpr int64_t kChunksPerThread = 4;
constexpr int64_t kMinTailSplitBytes = 256 * 1024;

int64_t chunk_rows(int64_t total_rows, int64_t bytes_per_row, int threads) {
  const int64_t total_bytes = total_rows * std::max<int64_t>(bytes_per_row, 1);
  int64_t chunks = std::min<int64_t>(kChunksPerThread * threads, total_bytes / kMinChunkBytes);
  chunks = std::max<int64_t>({chunks, total_bytes / kMaxChunkBytes, 1});
  int64_t rows = (total_rows + chunks - 1) / chunks;
  return (rows + 7) / 8 * 8;
}

// The task → rows map of one matvec: chunk_rows() chunks, except that the
// last `threads` chunks' worth of rows is cut 8× finer when there are many
// chunks of ≥ 256 KiB, so the threads finish within ~1/8 chunk of each other (with 1 MiB
// chunks a thread otherwise waits ~30 µs on average at the end of every
// matvec, ~8 ms per 27B token over its ~260 matvec calls).
struct ChunkPlan {
  int64_t total = 0, big = 1, n_big = 0, small = 1, n_tasks = 0;
  ChunkPlan(int64_t total_rows, int64_t bytes_per_row, int threads) : total(total_rows) {
    big = chunk_rows(total_rows, bytes_per_row, threads);
    const int64_t n = (total_rows + big - 1) / big;
    if (n <= 2 * threads || big * bytes_per_row < kMinTailSplitBytes) {
      n_big = n, small = big, n_tasks = n;
      return;
    }
    n_big = (total_rows - static_cast<int64_t>(threads) * big) / big;
    small = std::max<int64_t>(8, (big / 8 + 7) / 8 * 8);
    n_tasks = n_big + (total_rows - n_big * big + small - 1) / small;
  }
  int64_t begin(int64_t t) const { return t <= n_big ? t * big : n_big * big + (t - n_big) * small; }
  int64_t end(int64_t t) const { return std::min(total, begin(t + 1)); }
};

int64_t weight_row_bytes(const WeightView& w) {
  if (w.layout == WeightLayout::Lanes16) return lanes_code_row_bytes(w.k) + w.k / 128 * 2;
  if (w.layout == WeightLayout::Stream16) return stream_rowgroup_bytes(w.k) / stream_group_rows(w.k);
  return static_cast<int64_t>(row_bytes(w.type, w.k));
}

}  // namespace

int64_t stream_prefetch_bytes(int64_t group_rows) {
  static const int64_t four = env_int("BONSAI_CPU_STREAM_PF4", 8192, 0, 65536);
  static const int64_t eight = env_int("BONSAI_CPU_STREAM_PF8", 8192, 0, 65536);
  return group_rows >= 8 ? eight : four;
}

uint32_t layouts_for(const WeightView& w) {
  return w.layout != WeightLayout::File ? layout_bit(ActLayout::Lanes16) : layouts_for(w.type);
}

void pack_lanes_row(const uint8_t* src, int64_t k, uint8_t* codes, uint8_t* scales) {
  const int64_t nb = k / 128, rb = lanes_code_row_bytes(k);
  const int64_t n_full = nb / kLanesGroup, tail = nb % kLanesGroup;
  std::memset(codes + nb * 32, 0, static_cast<size_t>(rb - nb * 32));  // row padding (odd nb)
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = src + b * 34;  // {fp16 d; uint8 qs[32]}
    const int64_t j = b / kLanesGroup, lane = b % kLanesGroup;
    const int64_t chunk = j < n_full ? 64 : 4 * tail;  // bytes per chunk of this group
    for (int c = 0; c < 8; ++c) std::memcpy(codes + j * 512 + c * chunk + 4 * lane, blk + 2 + 4 * c, 4);
    std::memcpy(scales + b * 2, blk, 2);
  }
}

void pack_lanes_rows(const WeightView& src, uint8_t* dst, int64_t r0, int64_t r1) {
  if (src.layout != WeightLayout::File) fail("pack_lanes_rows: the source must be in its file layout");
  check_lanes(src, "pack_lanes_rows");
  if (r0 < 0 || r1 > src.n || r0 > r1)
    fail("pack_lanes_rows: row range [{}, {}) outside 0..{}", r0, r1, src.n);
  const int64_t src_rb = static_cast<int64_t>(row_bytes(src.type, src.k));
  uint8_t* scales = dst + lanes_scales_offset(src.n, src.k);
  for (int64_t r = r0; r < r1; ++r)
    pack_lanes_row(src.data + r * src_rb, src.k, dst + r * lanes_code_row_bytes(src.k),
                   scales + r * (src.k / 128) * 2);
}

void pack_stream_rows(const WeightView& src, uint8_t* dst, int64_t r0, int64_t r1) {
  if (src.layout != WeightLayout::File) fail("pack_stream_rows: the source must be in its file layout");
  check_lanes(src, "pack_stream_rows");
  const int64_t k = src.k, rl = stream_group_rows(k);
  if (r0 < 0 || r1 > src.n || r0 > r1 || r0 % rl || (r1 % rl && r1 != src.n))
    fail("pack_stream_rows: row range [{}, {}) outside 0..{} or not in whole row groups of {}", r0, r1, src.n,
         rl);
  const int64_t src_rb = static_cast<int64_t>(row_bytes(src.type, k));
  const int64_t nb = k / 128, n_full = nb / kLanesGroup, g = nb % kLanesGroup;
  const int64_t gs = stream_group_stride(k), rgb = stream_rowgroup_bytes(k), steps = g <= 8 ? 4 : 8;
  const int64_t g0 = r0 / rl, g1 = (r1 + rl - 1) / rl;
  std::memset(dst + g0 * rgb, 0, static_cast<size_t>((g1 - g0) * rgb));  // padding lanes, rows and bytes
  std::vector<uint8_t> codes(static_cast<size_t>(lanes_code_row_bytes(k))), sc(static_cast<size_t>(nb * 2));
  for (int64_t r = r0; r < r1; ++r) {
    pack_lanes_row(src.data + r * src_rb, k, codes.data(), sc.data());
    uint8_t* base = dst + r / rl * rgb;
    const int64_t i = r % rl;
    for (int64_t j = 0; j < n_full; ++j) {
      for (int64_t c = 0; c < 8; ++c)
        std::memcpy(base + j * gs + c * 64 * rl + i * 64, codes.data() + j * 512 + c * 64, 64);
      std::memcpy(base + j * gs + 512 * rl + i * 32, sc.data() + j * 32, 32);
    }
    if (g == 0) continue;
    uint8_t* t = base + n_full * gs;
    for (int64_t c = 0; c < 8; ++c) {  // Lanes16 tail chunk c: 4g bytes at n_full·512 + c·4g
      const int64_t step = g <= 8 ? c % 4 : c, half = g <= 8 ? c / 4 * 32 : 0;
      std::memcpy(t + step * 64 * rl + i * 64 + half, codes.data() + n_full * 512 + c * 4 * g,
                  static_cast<size_t>(4 * g));
    }
    std::memcpy(t + steps * 64 * rl + i * 2 * g, sc.data() + n_full * 32, static_cast<size_t>(2 * g));
  }
}

void matvec_rows(const WeightView& w, const PreparedAct& a, float* y, int64_t r0, int64_t r1, Isa isa) {
  if (r0 < 0 || r1 > w.n || r0 > r1) fail("matvec: row range [{}, {}) outside 0..{}", r0, r1, w.n);
  bind(w, a, isa).run(y, r0, r1);
}

void matvec(const WeightView& w, const PreparedAct& a, float* y, ThreadPool& pool, Isa isa) {
  const Bound b = bind(w, a, isa);
  const ChunkPlan plan(w.n, weight_row_bytes(w), pool.size());
  pool.parallel_for(plan.n_tasks, [&](int64_t t, int) { b.run(y, plan.begin(t), plan.end(t)); });
}

void matvec_multi(std::span<const MatvecJob> jobs, const PreparedAct& a, ThreadPool& pool, Isa isa) {
  // Bind everything first so argument errors surface before any work starts.
  constexpr size_t kMaxJobs = 8;
  if (jobs.size() > kMaxJobs)
    fail("matvec_multi: at most {} weights per call (got {})", kMaxJobs, jobs.size());
  Bound bound[kMaxJobs];
  int64_t first_row[kMaxJobs + 1] = {0};  // jobs laid end to end in one row space
  int64_t max_row_bytes = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    bound[i] = bind(jobs[i].w, a, isa);
    first_row[i + 1] = first_row[i] + jobs[i].w.n;
    max_row_bytes = std::max(max_row_bytes, weight_row_bytes(jobs[i].w));
  }
  const int64_t total = first_row[jobs.size()];
  if (total == 0) return;
  const ChunkPlan plan(total, max_row_bytes, pool.size());
  pool.parallel_for(plan.n_tasks, [&](int64_t t, int) {
    const int64_t lo = plan.begin(t), hi = plan.end(t);
    for (size_t i = 0; i < jobs.size(); ++i) {
      const int64_t r0 = std::max(lo, first_row[i]) - first_row[i];
      const int64_t r1 = std::min(hi, first_row[i + 1]) - first_row[i];
      bound[i].run(jobs[i].y, r0, r1);
    }
  });
}

void transcode_ptq1_rows(const WeightView& w, uint8_t* dst, int64_t r0, int64_t r1, Isa isa) {
  if (w.type != DType::PTQ1_0) fail("transcode_ptq1_rows: weight is {}, not PTQ1_0", dtype_name(w.type));
  if (w.k % 128) fail("transcode_ptq1_rows: width {} is not a multiple of 128", w.k);
  if (r0 < 0 || r1 > w.n || r0 > r1)
    fail("transcode_ptq1_rows: row range [{}, {}) outside 0..{}", r0, r1, w.n);
  const int64_t src_row = static_cast<int64_t>(row_bytes(DType::PTQ1_0, w.k));
  const int64_t dst_row = static_cast<int64_t>(row_bytes(DType::PQ2_0, w.k));
  const uint8_t* end = w.data + src_row * w.n;
  for (int64_t r = r0; r < r1; ++r) {
    uint8_t* d = dst + (r - r0) * dst_row;
    if (isa == Isa::Scalar || !isa_supported(Isa::Avx2))
      bonsai::transcode_ptq1_to_pq2(w.data + r * src_row, d, w.k);
    else
      detail::transcode_ptq1_blocks_avx2(w.data + r * src_row, d, w.k / 128, end);
  }
}

void transcode_ptq1_to_pq2(const WeightView& w, uint8_t* dst, ThreadPool& pool, Isa isa) {
  if (w.type != DType::PTQ1_0) fail("transcode_ptq1_to_pq2: weight is {}, not PTQ1_0", dtype_name(w.type));
  if (w.k % 128) fail("transcode_ptq1_to_pq2: width {} is not a multiple of 128", w.k);
  if (!isa_supported(isa))
    fail("transcode_ptq1_to_pq2: instruction set {} is not supported by this CPU", isa_name(isa));
  const int64_t src_row = static_cast<int64_t>(row_bytes(DType::PTQ1_0, w.k));
  const int64_t dst_row = static_cast<int64_t>(row_bytes(DType::PQ2_0, w.k));
  const uint8_t* end = w.data + src_row * w.n;
  const int64_t rows = chunk_rows(w.n, src_row, pool.size());
  pool.parallel_for((w.n + rows - 1) / rows, [&](int64_t t, int) {
    for (int64_t r = t * rows; r < std::min(w.n, (t + 1) * rows); ++r) {
      if (isa == Isa::Scalar)
        bonsai::transcode_ptq1_to_pq2(w.data + r * src_row, dst + r * dst_row, w.k);
      else
        detail::transcode_ptq1_blocks_avx2(w.data + r * src_row, dst + r * dst_row, w.k / 128, end);
    }
  });
}

}  // namespace bonsai::cpu
