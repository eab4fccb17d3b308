#include "kernels/ref/topk.h"

#include <cmath>
#include <limits>

#include "bonsai/error.h"

namespace bonsai::ref {

void check_top_k(int64_t n, int k) {
  if (k < 1 || k > kMaxTopK) fail("top_k: k = {} is outside [1, {}]", k, kMaxTopK);
  if (n < k || n > std::numeric_limits<int32_t>::max())
    fail("top_k: {} values cannot give {} candidates (need k <= n < 2^31)", n, k);
}

void top_k(const float* x, int64_t n, int k, int32_t* ids, float* values) {
  check_top_k(n, k);
  // A sorted list of the best so far, grown by insertion (a shift of at most k). The first
  // k elements fill it; after that an element enters only when it beats the k-th best
  // (`cut`): one compare in the common case. A NaN never does (as -inf it could at most
  // tie), and strict compares keep the earlier of equal values first.
  const auto insert = [&](int64_t i, int at) {
    const float v = std::isnan(x[i]) ? -std::numeric_limits<float>::infinity() : x[i];
    for (; at > 0 && v > values[at - 1]; --at) {
      values[at] = values[at - 1];
      ids[at] = ids[at - 1];
    }
    values[at] = v;
    ids[at] = static_cast<int32_t>(i);
  };
  for (int i = 0; i < k; ++i) insert(i, i);
  float cut = values[k - 1];
  for (int64_t i = k; i < n; ++i) {
    if (x[i] > cut) {
      insert(i, k - 1);
      cut = values[k - 1];
    }
  }
}

}  // namespace bonsai::ref
