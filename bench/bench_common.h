// Shared helpers for the Google Benchmark suites.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>

#include <sys/mman.h>

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

// Caches larger than this are assumed absent: each timed pass must read at
// least this many distinct bytes (L3 here is 32 MiB).
inline constexpr size_t kColdBytes = size_t{256} << 20;

}  // namespace bonsai::bench
