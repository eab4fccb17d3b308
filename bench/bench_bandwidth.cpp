// read_bandwidth: the memory read rate of this machine, the yardstick every
// streaming kernel is stated against (as a fraction, measured in the same run).
// A 1 GiB buffer (≫ L3) is summed with wide loads, split across the threads
// of the same pool the kernels use.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "bench/bench_common.h"
#include "runtime/bandwidth.h"
#include "runtime/cpu_features.h"

namespace bonsai::bench {
namespace {

constexpr size_t kBufferBytes = size_t{1} << 30;

void BM_read_bandwidth(benchmark::State& state, bool huge) {
  static Bytes bufs[2];
  Bytes& buf = bufs[huge];
  if (!buf) {
    buf = alloc_bytes(kBufferBytes, huge);
    fill_random(buf.get(), kBufferBytes, 1);
  }
  const int threads = static_cast<int>(state.range(0));
  ThreadPool& tp = pool(threads);
  // Split in 2 MiB tasks handed out dynamically (as the matvec chunks are).
  constexpr size_t kTask = size_t{2} << 20;
  uint64_t sink[8] = {};
  for (auto _ : state) {
    tp.parallel_for(kBufferBytes / kTask,
                    [&](int64_t t, int th) { sink[th] += sum_bytes(buf.get() + t * kTask, kTask); });
    benchmark::DoNotOptimize(sink);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBufferBytes));
}
BENCHMARK_CAPTURE(BM_read_bandwidth, 4k, false)
    ->Name("read_bandwidth")
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime();
// The same loop on huge pages: the yardstick for weights the CPU backend
// repacks or copies at load (kernels/cpu/repack.h).
BENCHMARK_CAPTURE(BM_read_bandwidth, thp, true)
    ->Name("read_bandwidth_thp")
    ->ArgName("threads")
    ->Arg(2)
    ->UseRealTime();

}  // namespace
}  // namespace bonsai::bench
