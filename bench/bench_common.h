// Shared helpers for the Google Benchmark suites.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "runtime/thread_pool.h"

namespace bonsai::bench {

// One pool per thread count, created on first use and kept for the process.
inline ThreadPool& pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

struct FreeAligned {
  void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t{4096}); }
};
using Bytes = std::unique_ptr<uint8_t[], FreeAligned>;

// huge: advise 2 MiB pages (MADV_HUGEPAGE; this machine's THP mode is
// "madvise"), as the CPU backend's repacked / copied weights are; otherwise
// 4 KiB pages, like the page cache behind the model's mmap.
inline Bytes alloc_bytes(size_t n, bool huge = false) {
  Bytes b(static_cast<uint8_t*>(::operator new[](n, std::align_val_t{4096})));
  if (huge) (void)madvise(b.get(), n / 4096 * 4096, MADV_HUGEPAGE);  // advice only
  return b;
}

// Fills n bytes with a fast xorshift stream (and thereby faults every page in).
inline void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    std::memcpy(p + i, &s, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(i * 131);
}

// The thread counts in BONSAI_BENCH_THREADS (a comma list, e.g. "16" on a larger machine; each
// 3..1024, anything else an error naming the variable): benchmarks that run at 1 and 2 threads
// here add these.
inline std::vector<int> extra_thread_counts() {
  std::vector<int> out;
  const char* e = std::getenv("BONSAI_BENCH_THREADS");
  for (const char* p = e; p && *p;) {
    char* end = nullptr;
    const long n = std::strtol(p, &end, 10);
    if (end == p || n < 3 || n > 1024 || (*end != ',' && *end != '\0')) {
      std::fprintf(stderr, "BONSAI_BENCH_THREADS='%s': expected a comma list of thread counts 3..1024\n", e);
      std::exit(2);
    }
    out.push_back(static_cast<int>(n));
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

// Each timed pass of a streaming benchmark reads at least this many distinct
// bytes, so that no cache holds them: 256 MiB (the dev VM's L3 is 32 MiB), or
// 4x the L3 where the machine reports a larger one. The 16-core Xeon host has
// a 300 MiB L3: a 256 MiB set mostly stayed in it, and its matvec figures read
// up to 1.5x its DRAM read pass (session 13).
inline size_t cold_bytes() {
  static const size_t bytes = [] {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return std::max(size_t{256} << 20, l3 > 0 ? 4 * static_cast<size_t>(l3) : size_t{0});
  }();
  return bytes;
}

}  // namespace bonsai::bench
