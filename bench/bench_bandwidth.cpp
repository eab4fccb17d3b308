// read_bandwidth: the memory read rate of this machine, the yardstick every
// streaming kernel is stated against (as a fraction, measured in the same run).
// A 1 GiB buffer (≫ L3) is summed with wide loads, split across the threads
// of the same pool the kernels use.
#include <benchmark/benchmark.h>

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bench/bench_common.h"
#include "runtime/cpu_features.h"

namespace bonsai::bench {
namespace {

constexpr size_t kBufferBytes = size_t{1} << 30;

#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t sum_avx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  return static_cast<uint64_t>(_mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1) +
                               _mm256_extract_epi64(s, 2) + _mm256_extract_epi64(s, 3));
}
#endif

uint64_t sum_plain(const uint8_t* p, size_t n) {
  uint64_t a[8] = {};
  for (size_t i = 0; i < n; i += 64)
    for (int j = 0; j < 8; ++j) {
      uint64_t v;
      std::memcpy(&v, p + i + 8 * j, 8);
      a[j] += v;
    }
  return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

uint64_t sum(const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  if (isa_supported(Isa::Avx2)) return sum_avx2(p, n);
#endif
  return sum_plain(p, n);
}

void BM_read_bandwidth(benchmark::State& state) {
  static Bytes buf = [] {
    Bytes b = alloc_bytes(kBufferBytes);
    fill_random(b.get(), kBufferBytes, 1);
    return b;
  }();
  const int threads = static_cast<int>(state.range(0));
  ThreadPool& tp = pool(threads);
  // Split in 2 MiB tasks handed out dynamically (as the matvec chunks are).
  constexpr size_t kTask = size_t{2} << 20;
  uint64_t sink[8] = {};
  for (auto _ : state) {
    tp.parallel_for(kBufferBytes / kTask,
                    [&](int64_t t, int th) { sink[th] += sum(buf.get() + t * kTask, kTask); });
    benchmark::DoNotOptimize(sink);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBufferBytes));
}
BENCHMARK(BM_read_bandwidth)->Name("read_bandwidth")->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
}  // namespace bonsai::bench
