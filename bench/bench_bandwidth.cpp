// read_bandwidth: the memory read rate of this machine, the yardstick every
// streaming kernel is stated against (as a fraction, measured in the same run).
// A 1 GiB buffer (≫ L3; larger where the L3 is) is summed with wide loads, split across the threads
// of the same pool the kernels use.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench/bench_common.h"
#include "runtime/bandwidth.h"
#include "runtime/cpu_features.h"

namespace bonsai::bench {
namespace {

// 1 GiB, or cold_bytes() where the L3 is larger than 256 MiB; a multiple of the 2 MiB task.
size_t buffer_bytes() {
  constexpr size_t kTask = size_t{2} << 20;
  return std::max(size_t{1} << 30, cold_bytes() / kTask * kTask);
}

void BM_read_bandwidth(benchmark::State& state, bool huge) {
  static Bytes bufs[2];
  Bytes& buf = bufs[huge];
  const size_t total = buffer_bytes();
  if (!buf) {
    buf = alloc_bytes(total, huge);
    fill_random(buf.get(), total, 1);
  }
  const int threads = static_cast<int>(state.range(0));
  ThreadPool& tp = pool(threads);
  // Split in 2 MiB tasks handed out dynamically (as the matvec chunks are).
  constexpr size_t kTask = size_t{2} << 20;
  std::vector<uint64_t> sink(static_cast<size_t>(threads) * 8);  // one cache line per thread
  for (auto _ : state) {
    tp.parallel_for(total / kTask, [&](int64_t t, int th) {
      sink[static_cast<size_t>(th) * 8] += sum_bytes(buf.get() + t * kTask, kTask);
    });
    benchmark::DoNotOptimize(sink.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * total));
}
void bandwidth_threads(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
  for (int n : extra_thread_counts()) b->Arg(n);
}
BENCHMARK_CAPTURE(BM_read_bandwidth, 4k, false)->Name("read_bandwidth")->Apply(bandwidth_threads);
// The same loop on huge pages: the yardstick for weights the CPU backend
// repacks or copies at load (kernels/cpu/repack.h).
void bandwidth_thp_threads(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(2)->UseRealTime();
  for (int n : extra_thread_counts()) b->Arg(n);
}
BENCHMARK_CAPTURE(BM_read_bandwidth, thp, true)->Name("read_bandwidth_thp")->Apply(bandwidth_thp_threads);

}  // namespace
}  // namespace bonsai::bench
