// Measured memory read bandwidth: the yardstick decode speed is stated against.
#pragma once

#include <cstddef>

#include "runtime/thread_pool.h"

namespace bonsai {

// Sums a `bytes`-sized buffer (≫ LLC) with wide loads split across the pool's
// threads; returns the best of `reps` passes in bytes per second.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30, int reps = 3);

}  // namespace bonsai
