// Host <-> backend memory for the op-level tests of a backend (the Backend interface's own calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "bonsai/formats.h"
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

// An F32 vector weight [n][k] over the host floats v (norm gains, conv taps, gates), prepared on
// `be`; the Weight lives in `owned`, v must outlive it (the backend frees what it prepared when
// it goes, the Weight may be gone by then).
inline Weight& prepared_vector(Backend& be, std::vector<std::unique_ptr<Weight>>& owned,
                               std::vector<float>& v, int64_t k, int64_t n = 1) {
  owned.push_back(std::make_unique<Weight>());
  Weight& w = *owned.back();
  w.name = "test vector";
  w.type = DType::F32;
  w.k = k;
  w.n = n;
  w.data = reinterpret_cast<const uint8_t*>(v.data());
  w.nbytes = v.size() * 4;
  be.prepare(w);
  return w;
}

}  // namespace bonsai::testing_util
