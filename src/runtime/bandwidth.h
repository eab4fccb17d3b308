// Measured memory read bandwidth: the yardstick decode speed is stated against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/thread_pool.h"

namespace bonsai {

// Sums n bytes (n a multiple of 128, p 32-byte aligned) as 64-bit words with the
// widest loads this CPU has: the read loop behind the bandwidth figures.
uint64_t sum_bytes(const uint8_t* p, size_t n);

// Sums a `bytes`-sized buffer (≫ LLC) with wide loads split across the pool's
// threads, `reps` passes on 4 KiB pages and on huge pages (MADV_HUGEPAGE);
// returns the larger of the two medians, in bytes per second.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30, int reps = 5);

}  // namespace bonsai
