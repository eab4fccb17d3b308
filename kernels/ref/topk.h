// The head's candidate selection (Backend::top_k), shared by the reference and the
// default (host) implementation of every backend. Plain C++: no backend types.
#pragma once

#include <cstdint>

namespace bonsai {

// Most candidates Backend::top_k returns (the CUDA kernel keeps them in registers and
// shared memory; a sampler that needs more reads the full logits).
inline constexpr int kMaxTopK = 64;

namespace ref {

// The k best of x[0..n), best first, into ids[k] / values[k]: the larger value first, a
// NaN counted (and returned) as -inf, equal values by the lower index — the order in
// which Sampler ranks logits, so k = 1 is its greedy choice. Throws bonsai::Error unless
// 1 <= k <= min(n, kMaxTopK) and n < 2^31.
void top_k(const float* x, int64_t n, int k, int32_t* ids, float* values);

// The argument check of top_k (shared with the device implementations).
void check_top_k(int64_t n, int k);

}  // namespace ref
}  // namespace bonsai
