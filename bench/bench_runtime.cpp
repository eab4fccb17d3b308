// Thread-pool dispatch cost: one parallel_for of `threads` empty tasks, back to
// back (the workers are spinning), as a decode step issues its ops.
#include <benchmark/benchmark.h>

#include <atomic>

#include "bench/bench_common.h"

namespace bonsai::bench {
namespace {

void BM_parallel_for(benchmark::State& state) {
  ThreadPool& tp = pool(static_cast<int>(state.range(0)));
  std::atomic<int64_t> sink{0};
  for (auto _ : state)
    tp.parallel_for(tp.size(), [&](int64_t t, int) { sink.fetch_add(t, std::memory_order_relaxed); });
  benchmark::DoNotOptimize(sink.load());
}
BENCHMARK(BM_parallel_for)->Name("parallel_for_dispatch")->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
}  // namespace bonsai::bench
