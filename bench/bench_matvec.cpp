// Ternary matvec at every distinct Bonsai 2 27B shape (K × N), as stored
// (PQ2_0, PTQ1_0), faithful and int8 activations, weights streamed from DRAM.
// Each reports bytes processed = weight bytes read, so GB/s ÷ read_bandwidth
// (same run) is the fraction of memory bandwidth the kernel reaches.
//
// Weights are random bytes with sane fp16 scales; for each benchmark a buffer
// of ≥ cold_bytes() (bench_common.h: ≥ 256 MiB and ≥ 4x the L3) holds enough copies of
// the matrix that every timed pass reads weights no cache holds (only one such buffer is
// alive at a time).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "bonsai/formats.h"
#include "kernels/cpu/matvec.h"
#include "runtime/cpu_features.h"

namespace bonsai::bench {
namespace {

using cpu::Precision;

struct WeightSet {
  DType type = DType::F32;
  int64_t k = 0, n = 0;
  size_t matrix_bytes = 0;  // one copy (Lanes16: codes + scales, rounded up to 64)
  int copies = 0;
  bool huge = false;  // on 2 MiB pages (as repacked / copied weights are)
  // PQ2_0 in the Lanes16 / Stream16 layouts the AVX-512 decode reads (kernels/cpu/matvec.h)
  cpu::WeightLayout layout = cpu::WeightLayout::File;
  Bytes bytes;
  cpu::WeightView view(int copy) const {
    const uint8_t* p = bytes.get() + matrix_bytes * copy;
    if (layout == cpu::WeightLayout::Lanes16) return cpu::lanes_view(type, p, n, k);
    if (layout == cpu::WeightLayout::Stream16) return cpu::stream_view(type, p, n, k);
    return cpu::WeightView{type, p, n, k};
  }
};

// The buffer of the benchmark running now (regenerated when the shape changes).
WeightSet& weights(DType type, int64_t k, int64_t n, bool huge = false,
                   cpu::WeightLayout layout = cpu::WeightLayout::File) {
  static WeightSet ws;
  if (ws.type == type && ws.k == k && ws.n == n && ws.huge == huge && ws.layout == layout && ws.bytes)
    return ws;
  ws.bytes.reset();
  ws.type = type, ws.k = k, ws.n = n, ws.huge = huge, ws.layout = layout;
  const bool lanes = layout == cpu::WeightLayout::Lanes16;
  ws.matrix_bytes = lanes                                   ? (cpu::lanes_total_bytes(n, k) + 63) / 64 * 64
                    : layout == cpu::WeightLayout::Stream16 ? cpu::stream_total_bytes(n, k)
                                                            : row_bytes(type, k) * n;
  ws.copies = static_cast<int>(std::max<size_t>(2, (cold_bytes() + ws.matrix_bytes - 1) / ws.matrix_bytes));
  const size_t total = ws.matrix_bytes * ws.copies;
  ws.bytes = alloc_bytes(total, huge);
  fill_random(ws.bytes.get(), total, static_cast<uint64_t>(k * 131 + n));
  // Replace each block's scale by a normal fp16 value (random bytes could be
  // NaN/Inf/subnormal, which is not what real weights look like).
  const uint16_t d = f32_to_fp16(0.0123f);
  if (layout == cpu::WeightLayout::Stream16) {
    // Every fp16 slot of the layout (matvec.h) of every row group, per copy.
    const int64_t rl = cpu::stream_group_rows(k), nb = k / 128, n_full = nb / 16, g = nb % 16;
    const int64_t gs = cpu::stream_group_stride(k), rgb = cpu::stream_rowgroup_bytes(k);
    for (int c = 0; c < ws.copies; ++c)
      for (int64_t r0 = 0; r0 < n; r0 += rl) {
        uint8_t* base = ws.bytes.get() + ws.matrix_bytes * c + r0 / rl * rgb;
        for (int64_t j = 0; j < n_full; ++j)
          for (int64_t e = 0; e < 16 * rl; ++e) std::memcpy(base + j * gs + 512 * rl + 2 * e, &d, 2);
        for (int64_t e = 0; e < g * rl; ++e)
          std::memcpy(base + n_full * gs + (g <= 8 ? 4 : 8) * 64 * rl + 2 * e, &d, 2);
      }
    return ws;
  }
  if (lanes) {
    for (int c = 0; c < ws.copies; ++c) {
      uint8_t* sc = ws.bytes.get() + ws.matrix_bytes * c + cpu::lanes_scales_offset(n, k);
      for (int64_t b = 0; b < n * (k / 128); ++b) std::memcpy(sc + 2 * b, &d, 2);
    }
    return ws;
  }
  const DTypeInfo info = dtype_info(type);
  const size_t scale_off = type == DType::PTQ1_0 ? 26 : 0;
  for (size_t b = 0; b < total / info.type_size; ++b)
    std::memcpy(ws.bytes.get() + b * info.type_size + scale_off, &d, 2);
  return ws;
}

void BM_matvec(benchmark::State& state, DType type, Precision prec, Isa isa, bool huge = false,
               cpu::WeightLayout layout = cpu::WeightLayout::File) {
  if (!isa_supported(isa)) {
    state.SkipWithError("instruction set not supported by this CPU");
    return;
  }
  const int64_t k = state.range(0), n = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  WeightSet& ws = weights(type, k, n, huge, layout);
  std::vector<float> x(k), y(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  cpu::PreparedAct act;
  cpu::prepare_act(x.data(), k, prec, act, cpu::layouts_for(ws.view(0)));
  ThreadPool& tp = pool(threads);
  int copy = 0;
  for (auto _ : state) {
    cpu::matvec(ws.view(copy), act, y.data(), tp, isa);
    benchmark::DoNotOptimize(y.data());
    copy = (copy + 1) % ws.copies;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * ws.matrix_bytes));
}

// Every distinct K × N of the 27B: attn q (5120×12288), k/v (5120×1024), o
// (6144×5120), GDN qkv (5120×10240), z (5120×6144), ssm_out (6144×5120),
// gate/up (5120×17408), down (17408×5120), head (5120×248320).
// At 2 threads, and at each count of BONSAI_BENCH_THREADS (bench_common.h).
void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"K", "N", "threads"});
  std::vector<int> counts = {2};
  for (int t : extra_thread_counts()) counts.push_back(t);
  for (int t : counts) {
    for (int64_t n : {10240, 6144, 12288, 1024, 17408, 248320}) b->Args({5120, n, t});
    b->Args({6144, 5120, t});
    b->Args({17408, 5120, t});
  }
  b->UseRealTime();
}

void shapes_1t(benchmark::internal::Benchmark* b) {
  b->ArgNames({"K", "N", "threads"});
  b->Args({5120, 17408, 1});
  b->UseRealTime();
}

BENCHMARK_CAPTURE(BM_matvec, pq2_faithful, DType::PQ2_0, Precision::Faithful, Isa::Avx512)->Apply(shapes);
BENCHMARK_CAPTURE(BM_matvec, pq2_int8, DType::PQ2_0, Precision::Int8, Isa::Avx512)->Apply(shapes);
BENCHMARK_CAPTURE(BM_matvec, ptq1_faithful, DType::PTQ1_0, Precision::Faithful, Isa::Avx512)->Apply(shapes);
BENCHMARK_CAPTURE(BM_matvec, ptq1_int8, DType::PTQ1_0, Precision::Int8, Isa::Avx512)->Apply(shapes);
// PQ2_0 on huge pages: what the decode streams for PTQ1_0 files (transcoded
// at load) and for PQ2_0 with BONSAI_CPU_WEIGHTS=copy; compare with
// read_bandwidth_thp.
BENCHMARK_CAPTURE(BM_matvec, pq2_faithful_thp, DType::PQ2_0, Precision::Faithful, Isa::Avx512, true)
    ->Apply(shapes);
// What the AVX-512 decode streams by default: every PQ2_0 / Q2_0 g128 / PTQ1_0
// weight repacked at load into the Lanes16 layout on huge pages.
BENCHMARK_CAPTURE(BM_matvec, pq2_lanes, DType::PQ2_0, Precision::Faithful, Isa::Avx512, true,
                  cpu::WeightLayout::Lanes16)
    ->Apply(shapes);
BENCHMARK_CAPTURE(BM_matvec, pq2_lanes_int8, DType::PQ2_0, Precision::Int8, Isa::Avx512, true,
                  cpu::WeightLayout::Lanes16)
    ->Apply(shapes);
// The same chunks as one sequential stream per row group (Stream16, BONSAI_CPU_WEIGHTS=stream).
BENCHMARK_CAPTURE(BM_matvec, pq2_stream, DType::PQ2_0, Precision::Faithful, Isa::Avx512, true,
                  cpu::WeightLayout::Stream16)
    ->Apply(shapes);
BENCHMARK_CAPTURE(BM_matvec, pq2_stream_int8, DType::PQ2_0, Precision::Int8, Isa::Avx512, true,
                  cpu::WeightLayout::Stream16)
    ->Apply(shapes);
// The AVX2 baseline on the same machine, and single-thread figures.
BENCHMARK_CAPTURE(BM_matvec, pq2_faithful_avx2, DType::PQ2_0, Precision::Faithful, Isa::Avx2)->Apply(shapes);
BENCHMARK_CAPTURE(BM_matvec, ptq1_faithful_avx2, DType::PTQ1_0, Precision::Faithful, Isa::Avx2)
    ->Apply(shapes);
BENCHMARK_CAPTURE(BM_matvec, pq2_faithful_1t, DType::PQ2_0, Precision::Faithful, Isa::Avx512)
    ->Apply(shapes_1t);
BENCHMARK_CAPTURE(BM_matvec, ptq1_faithful_1t, DType::PTQ1_0, Precision::Faithful, Isa::Avx512)
    ->Apply(shapes_1t);

// Compute ceiling: a 5120 × 128 matrix (L2-resident) on one thread, timed in
// CPU time so other load on the machine does not distort it. Compare with the
// per-core share of read_bandwidth (threads:2 / 2).
void BM_matvec_hot(benchmark::State& state, DType type, Precision prec, Isa isa,
                   cpu::WeightLayout layout = cpu::WeightLayout::File, int64_t k = 5120) {
  if (!isa_supported(isa)) {
    state.SkipWithError("instruction set not supported by this CPU");
    return;
  }
  const int64_t n = 128 * 5120 / k;  // ~700 KB of weights: L2-resident
  std::vector<uint8_t> w(row_bytes(type, k) * n);
  fill_random(w.data(), w.size(), 3);
  const DTypeInfo info = dtype_info(type);
  const uint16_t d = f32_to_fp16(0.0123f);
  for (size_t b = 0; b < w.size() / info.type_size; ++b)
    std::memcpy(w.data() + b * info.type_size + (type == DType::PTQ1_0 ? 26 : 0), &d, 2);
  std::vector<float> x(k, 0.5f), y(n);
  cpu::WeightView view{type, w.data(), n, k};
  Bytes packed;
  size_t bytes = w.size();
  if (layout == cpu::WeightLayout::Lanes16) {  // the same matrix in the Lanes16 layout (64-byte aligned)
    bytes = static_cast<size_t>(cpu::lanes_total_bytes(n, k));
    packed = alloc_bytes(bytes);
    cpu::pack_lanes_rows(view, packed.get(), 0, n);
    view = cpu::lanes_view(type, packed.get(), n, k);
  } else if (layout == cpu::WeightLayout::Stream16) {
    bytes = static_cast<size_t>(cpu::stream_total_bytes(n, k));
    packed = alloc_bytes(bytes);
    cpu::pack_stream_rows(view, packed.get(), 0, n);
    view = cpu::stream_view(type, packed.get(), n, k);
  }
  cpu::PreparedAct act;
  cpu::prepare_act(x.data(), k, prec, act, cpu::layouts_for(view));
  for (auto _ : state) {
    cpu::matvec_rows(view, act, y.data(), 0, n, isa);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_faithful, DType::PQ2_0, Precision::Faithful, Isa::Avx512);
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_int8, DType::PQ2_0, Precision::Int8, Isa::Avx512);
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_lanes, DType::PQ2_0, Precision::Faithful, Isa::Avx512,
                  cpu::WeightLayout::Lanes16);
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_lanes_int8, DType::PQ2_0, Precision::Int8, Isa::Avx512,
                  cpu::WeightLayout::Lanes16);
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_stream, DType::PQ2_0, Precision::Faithful, Isa::Avx512,
                  cpu::WeightLayout::Stream16);
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_stream_int8, DType::PQ2_0, Precision::Int8, Isa::Avx512,
                  cpu::WeightLayout::Stream16);
// Long rows (K = 17408, ffn_down: 8 rows side by side, 36 KB activation from L2).
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_faithful_k17408, DType::PQ2_0, Precision::Faithful, Isa::Avx512,
                  cpu::WeightLayout::File, 17408);
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_lanes_k17408, DType::PQ2_0, Precision::Faithful, Isa::Avx512,
                  cpu::WeightLayout::Lanes16, 17408);
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_stream_k17408, DType::PQ2_0, Precision::Faithful, Isa::Avx512,
                  cpu::WeightLayout::Stream16, 17408);
BENCHMARK_CAPTURE(BM_matvec_hot, ptq1_faithful, DType::PTQ1_0, Precision::Faithful, Isa::Avx512);
BENCHMARK_CAPTURE(BM_matvec_hot, ptq1_int8, DType::PTQ1_0, Precision::Int8, Isa::Avx512);
BENCHMARK_CAPTURE(BM_matvec_hot, q2g64_faithful, DType::Q2_0_G64, Precision::Faithful, Isa::Avx512);
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_faithful_avx2, DType::PQ2_0, Precision::Faithful, Isa::Avx2);
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_int8_avx2, DType::PQ2_0, Precision::Int8, Isa::Avx2);
BENCHMARK_CAPTURE(BM_matvec_hot, ptq1_faithful_avx2, DType::PTQ1_0, Precision::Faithful, Isa::Avx2);
BENCHMARK_CAPTURE(BM_matvec_hot, q2g64_faithful_avx2, DType::Q2_0_G64, Precision::Faithful, Isa::Avx2);
BENCHMARK_CAPTURE(BM_matvec_hot, pq2_faithful_scalar, DType::PQ2_0, Precision::Faithful, Isa::Scalar);

// Load-time PTQ1_0 → PQ2_0 transcode (bytes read per second), 2 threads.
void BM_transcode_ptq1(benchmark::State& state) {
  const int64_t k = 5120, n = 17408;
  WeightSet& ws = weights(DType::PTQ1_0, k, n);
  std::vector<uint8_t> dst(row_bytes(DType::PQ2_0, k) * n);
  ThreadPool& tp = pool(2);
  int copy = 0;
  for (auto _ : state) {
    cpu::transcode_ptq1_to_pq2({DType::PTQ1_0, ws.bytes.get() + ws.matrix_bytes * copy, n, k}, dst.data(), tp,
                               select_isa());
    benchmark::DoNotOptimize(dst.data());
    copy = (copy + 1) % ws.copies;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * ws.matrix_bytes));
}
BENCHMARK(BM_transcode_ptq1)->UseRealTime();

// One activation quantized and packed (what every decode matmul does first), in the layout the
// AVX2 file-layout kernels read (q2x128) or the AVX-512 Stream16 one (lanes16); threads > 1
// passes the pool (pieces of 16 blocks).
void BM_prepare_act(benchmark::State& state, Precision prec, uint32_t layouts) {
  const int64_t k = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  std::vector<float> x(k);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  cpu::PreparedAct act;
  ThreadPool* tp = threads > 1 ? &pool(threads) : nullptr;
  for (auto _ : state) {
    cpu::prepare_act(x.data(), k, prec, act, layouts, tp);
    benchmark::DoNotOptimize(act.packed[0].hi.data());
  }
  state.SetItemsProcessed(state.iterations() * k);
}
void prepare_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"k", "threads"})->UseRealTime();
  std::vector<int> counts = {1, 2};
  for (int t : extra_thread_counts()) counts.push_back(t);
  for (int t : counts)
    for (int64_t k : {5120, 6144, 17408}) b->Args({k, t});
}
BENCHMARK_CAPTURE(BM_prepare_act, q2x128, Precision::Faithful, cpu::layout_bit(cpu::ActLayout::Q2x128))
    ->Apply(prepare_args);
BENCHMARK_CAPTURE(BM_prepare_act, lanes16, Precision::Faithful, cpu::layout_bit(cpu::ActLayout::Lanes16))
    ->Apply(prepare_args);

}  // namespace
}  // namespace bonsai::bench
