// Matvec dispatch: argument checks, ISA selection and the row split across threads.
#include "kernels/cpu/matvec.h"

#include <algorithm>
#include <bit>

#include "bonsai/error.h"
#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu {
namespace {

using detail::FloatKernel;
using detail::TernaryKernel;

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

Bound bind(const WeightView& w, const PreparedAct& a, Isa isa) {
  if (!isa_supported(isa)) fail("matvec: instruction set {} is not supported by this CPU", isa_name(isa));
  if (w.k != a.k)
    fail("matvec: {} weight has {} inputs but the activation has {}", dtype_name(w.type), w.k, a.k);
  if (w.n < 0 || (w.n > 0 && !w.data)) fail("matvec: {} weight has no data", dtype_name(w.type));
  Bound b;
  const DTypeInfo info = dtype_info(w.type);
  if (TernaryKernel tk = ternary_kernel(w.type, isa)) {
    const uint32_t need = layouts_for(w.type);
    if (!(a.layouts & need))
      fail("matvec: the activation was not prepared for {} weights (prepare_act layouts {:#x})",
           dtype_name(w.type), a.layouts);
    if (w.k % info.block_size)
      fail("matvec: {} weight width {} is not a multiple of its block {}", dtype_name(w.type), w.k,
           info.block_size);
    const PackedAct& p = a.packed[std::countr_zero(need)];
    b.tk = tk;
    b.targs.w = w.data;
    b.targs.row_bytes = static_cast<int64_t>(row_bytes(w.type, w.k));
    b.targs.n_blocks = w.k / info.block_size;
    b.targs.end = w.data + b.targs.row_bytes * w.n;
    b.targs.a = {p.hi.data(), a.precision == Precision::Faithful ? p.lo.data() : nullptr, p.corr.data(),
                 p.scale.data(), p.n_groups};
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

int64_t weight_row_bytes(const WeightView& w) { return static_cast<int64_t>(row_bytes(w.type, w.k)); }

}  // namespace

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
