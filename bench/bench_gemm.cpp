// Prefill GEMM vs this machine's int8 multiply-accumulate peak, in one run.
//
// BM_mac_peak: throughput of the GEMM's core instruction alone — vpdpbusd
// (u8 × s8, 4 products summed into each int32 lane: 64 MACs per zmm, 32 per
// ymm) on 12 independent accumulators per thread (more than latency ×
// throughput, so the loop is bound by issue rate only), on the bench thread
// pool. Also the alternatives the issue asks about: vdpbf16ps (bf16 pairs into
// f32, 32 MACs per zmm), vpdpwssd (s16 pairs, 32 per zmm) and AVX2's
// vpmaddubsw (32 u8 × s8 products per ymm, before the vpmaddwd it needs).
// Counter MAC/s = products per second over all threads.
//
// BM_gemm: the ternary GEMM (kernels/cpu/gemm.h) at the 27B's matmul shapes
// with a batch of T tokens (T = 64 is the prefill chunk). Counters:
//   wMAC/s — model multiply-accumulates (n·k·T) per second;
//   iMAC/s — instruction MACs: the faithful scheme runs two vpdpbusd products
//            per weight (hi and lo halves), int8 one; compare with mac_peak.
// Weights are random codes with sane fp16 scales; a matrix (≤ 25 MB) is small
// against the compute time, so it is not re-streamed from DRAM per pass.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench/bench_common.h"
#include "bonsai/formats.h"
#include "kernels/cpu/gemm.h"
#include "runtime/cpu_features.h"

namespace bonsai::bench {
namespace {

constexpr int64_t kPeakIters = 1 << 20;

#define BONSAI_PEAK_BODY(T, ZERO, OP)                                                    \
  T acc[12];                                                                             \
  for (auto& v : acc) v = ZERO;                                                          \
  for (int64_t i = 0; i < iters; ++i) {                                                  \
    acc[0] = OP(acc[0], a, b), acc[1] = OP(acc[1], a, b), acc[2] = OP(acc[2], a, b);     \
    acc[3] = OP(acc[3], a, b), acc[4] = OP(acc[4], a, b), acc[5] = OP(acc[5], a, b);     \
    acc[6] = OP(acc[6], a, b), acc[7] = OP(acc[7], a, b), acc[8] = OP(acc[8], a, b);     \
    acc[9] = OP(acc[9], a, b), acc[10] = OP(acc[10], a, b), acc[11] = OP(acc[11], a, b); \
  }

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) int dpbusd_zmm(int64_t iters, int seed) {
  const __m512i a = _mm512_set1_epi32(seed), b = _mm512_set1_epi32(seed * 7 + 1);
  BONSAI_PEAK_BODY(__m512i, _mm512_setzero_si512(), _mm512_dpbusd_epi32)
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_xor_si512(s, acc[i]);
  alignas(64) int out[16];
  _mm512_store_si512(out, s);
  return out[0] ^ out[15];
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) int dpbusd_ymm(int64_t iters, int seed) {
  const __m256i a = _mm256_set1_epi32(seed), b = _mm256_set1_epi32(seed * 7 + 1);
  BONSAI_PEAK_BODY(__m256i, _mm256_setzero_si256(), _mm256_dpbusd_epi32)
  __m256i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_xor_si256(s, acc[i]);
  return _mm256_extract_epi32(s, 0) ^ _mm256_extract_epi32(s, 7);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) int dpwssd_zmm(int64_t iters, int seed) {
  const __m512i a = _mm512_set1_epi32(seed), b = _mm512_set1_epi32(seed * 7 + 1);
  BONSAI_PEAK_BODY(__m512i, _mm512_setzero_si512(), _mm512_dpwssd_epi32)
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_xor_si512(s, acc[i]);
  alignas(64) int out[16];
  _mm512_store_si512(out, s);
  return out[0] ^ out[15];
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) int dpbf16_zmm(int64_t iters, int seed) {
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3F803F80 + seed));
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3F003F00));
  BONSAI_PEAK_BODY(__m512, _mm512_setzero_ps(), _mm512_dpbf16_ps)
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  return static_cast<int>(out[0] + out[15]);
}

__attribute__((target("avx2"))) int maddubs_ymm(int64_t iters, int seed) {
  const __m256i a = _mm256_set1_epi8(static_cast<char>(seed & 3)),
                b = _mm256_set1_epi8(static_cast<char>(seed));
  // vpmaddubsw has no accumulator: chain through the first operand's sign-free
  // low bits so the 12 streams stay independent but not loop-invariant.
  __m256i acc[12];
  for (auto& v : acc) v = a;
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) v = _mm256_and_si256(_mm256_maddubs_epi16(v, b), a);
  __m256i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_xor_si256(s, acc[i]);
  return _mm256_extract_epi32(s, 0);
}

using PeakFn = int (*)(int64_t, int);

void BM_mac_peak(benchmark::State& state, PeakFn fn, int macs_per_instr, Isa isa, bool needs_bf16) {
  if (!isa_supported(isa) || (needs_bf16 && !__builtin_cpu_supports("avx512bf16"))) {
    state.SkipWithError("instruction not supported by this CPU");
    return;
  }
  const int threads = static_cast<int>(state.range(0));
  ThreadPool& tp = pool(threads);
  std::vector<int> sink(threads);
  for (auto _ : state) {
    tp.parallel_for(threads,
                    [&](int64_t task, int) { sink[task] = fn(kPeakIters, static_cast<int>(task) + 3); });
    benchmark::DoNotOptimize(sink.data());
  }
  state.counters["MAC/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * threads * kPeakIters * 12 * macs_per_instr,
                         benchmark::Counter::kIsRate);
}

// Threads 1 and 2, plus the counts in BONSAI_BENCH_THREADS (bench_common.h).
void peak_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
  for (int n : extra_thread_counts()) b->Arg(n);
}

BENCHMARK_CAPTURE(BM_mac_peak, vpdpbusd_zmm, dpbusd_zmm, 64, Isa::Avx512, false)->Apply(peak_args);
BENCHMARK_CAPTURE(BM_mac_peak, vpdpbusd_ymm, dpbusd_ymm, 32, Isa::Avx512, false)->Apply(peak_args);
BENCHMARK_CAPTURE(BM_mac_peak, vpdpwssd_zmm, dpwssd_zmm, 32, Isa::Avx512, false)->Apply(peak_args);
BENCHMARK_CAPTURE(BM_mac_peak, vdpbf16ps_zmm, dpbf16_zmm, 32, Isa::Avx512, true)->Apply(peak_args);
BENCHMARK_CAPTURE(BM_mac_peak, vpmaddubsw_ymm, maddubs_ymm, 32, Isa::Avx2, false)->Apply(peak_args);

struct GemmWeights {
  DType type = DType::F32;
  int64_t k = 0, n = 0;
  std::vector<uint8_t> bytes;
};

const GemmWeights& gemm_weights(DType type, int64_t k, int64_t n) {
  static GemmWeights ws;
  if (ws.type == type && ws.k == k && ws.n == n) return ws;
  ws.type = type, ws.k = k, ws.n = n;
  ws.bytes.assign(row_bytes(type, k) * n, 0);
  fill_random(ws.bytes.data(), ws.bytes.size(), static_cast<uint64_t>(k * 17 + n));
  const DTypeInfo info = dtype_info(type);
  const uint16_t d = f32_to_fp16(0.0123f);
  for (size_t b = 0; b < ws.bytes.size() / info.type_size; ++b)
    std::memcpy(ws.bytes.data() + b * info.type_size + (type == DType::PTQ1_0 ? 26 : 0), &d, 2);
  return ws;
}

void BM_gemm(benchmark::State& state, DType type, cpu::Precision prec, Isa isa = Isa::Avx512) {
  if (!cpu::gemm_supported(type, isa)) {
    state.SkipWithError("no GEMM kernel for this CPU");
    return;
  }
  const int64_t k = state.range(0), n = state.range(1);
  const int t = static_cast<int>(state.range(2)), threads = static_cast<int>(state.range(3));
  const GemmWeights& ws = gemm_weights(type, k, n);
  std::vector<float> x(static_cast<size_t>(t * k)), y(static_cast<size_t>(t * n));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  cpu::PreparedBatch batch;
  cpu::prepare_batch(x.data(), t, k, cpu::gemm_block(type), prec, batch);
  ThreadPool& tp = pool(threads);
  const cpu::WeightView w{type, ws.bytes.data(), n, k};
  for (auto _ : state) {
    cpu::gemm(w, batch, y.data(), tp, isa);
    benchmark::DoNotOptimize(y.data());
  }
  const double macs = static_cast<double>(state.iterations()) * n * k * t;
  state.counters["wMAC/s"] = benchmark::Counter(macs, benchmark::Counter::kIsRate);
  state.counters["iMAC/s"] =
      benchmark::Counter(macs * (prec == cpu::Precision::Faithful ? 2 : 1), benchmark::Counter::kIsRate);
}

// The 27B's matmul shapes (K × N) at the prefill chunk of 64 tokens.
void gemm_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"K", "N", "T", "threads"});
  for (int64_t n : {10240, 6144, 12288, 1024, 17408}) b->Args({5120, n, 64, 2});
  b->Args({6144, 5120, 64, 2});
  b->Args({17408, 5120, 64, 2});
  b->UseRealTime();
}
// Batch size and thread scaling at the largest shape.
void gemm_scaling(benchmark::internal::Benchmark* b) {
  b->ArgNames({"K", "N", "T", "threads"});
  for (int64_t t : {6, 16, 32, 128}) b->Args({5120, 17408, t, 2});
  b->Args({5120, 17408, 64, 1});
  b->UseRealTime();
}

BENCHMARK_CAPTURE(BM_gemm, pq2_faithful, DType::PQ2_0, cpu::Precision::Faithful)->Apply(gemm_shapes);
BENCHMARK_CAPTURE(BM_gemm, pq2_faithful, DType::PQ2_0, cpu::Precision::Faithful)->Apply(gemm_scaling);
BENCHMARK_CAPTURE(BM_gemm, pq2_int8, DType::PQ2_0, cpu::Precision::Int8)
    ->Args({5120, 17408, 64, 2})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_gemm, ptq1_faithful, DType::PTQ1_0, cpu::Precision::Faithful)
    ->Args({5120, 17408, 64, 2})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_gemm, pq2_faithful_avx2, DType::PQ2_0, cpu::Precision::Faithful, Isa::Avx2)
    ->Args({5120, 17408, 64, 2})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_gemm, q2g64_faithful, DType::Q2_0_G64, cpu::Precision::Faithful)
    ->Args({5120, 17408, 64, 2})
    ->UseRealTime();

}  // namespace
}  // namespace bonsai::bench
