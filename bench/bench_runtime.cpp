// Thread-pool dispatch cost: one parallel_for of `threads` empty tasks, back to
// back (the workers are spinning), as a decode step issues its ops.
#include <benchmark/benchmark.h>

#include <atomic>
#include <vector>

#include "bench/bench_common.h"

namespace bonsai::bench {
namespace {

// tasks = 0: one task per thread; else that many (fewer than the threads: the workers without
// a task still join, as for a small activation's prepare_act).
void BM_parallel_for(benchmark::State& state) {
  ThreadPool& tp = pool(static_cast<int>(state.range(0)));
  const int64_t tasks = state.range(1) > 0 ? state.range(1) : tp.size();
  std::atomic<int64_t> sink{0};
  for (auto _ : state)
    tp.parallel_for(tasks, [&](int64_t t, int) { sink.fetch_add(t, std::memory_order_relaxed); });
  benchmark::DoNotOptimize(sink.load());
}
void dispatch_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"threads", "tasks"})->UseRealTime();
  std::vector<int> counts = {1, 2};
  for (int t : extra_thread_counts()) counts.push_back(t);
  for (int t : counts) {
    b->Args({t, 0});
    if (t > 3) b->Args({t, 3});
  }
}
BENCHMARK(BM_parallel_for)->Name("parallel_for_dispatch")->Apply(dispatch_args);

}  // namespace
}  // namespace bonsai::bench
