// Host <-> backend memory for the op-level tests of a backend (the Backend interface's own calls).
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/backend.h"

namespace bonsai::testing_util {

// A backend buffer holding a copy of v (owned by the backend: released with it).
inline float* upload(Backend& be, const std::vector<float>& v) {
  float* p = be.alloc(v.size());
  be.from_host(p, v.data(), v.size());
  return p;
}

// n floats of a backend buffer.
inline std::vector<float> download(Backend& be, const float* p, size_t n) {
  std::vector<float> v(n);
  be.to_host(v.data(), p, n);
  return v;
}

}  // namespace bonsai::testing_util
