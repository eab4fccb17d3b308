// A bound weight tensor as the graph and the backends see it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "bonsai/formats.h"

namespace bonsai {

// A matrix of n rows (outputs) by k columns (inputs, ggml ne[0]) in its file
// layout, or a vector (n = 1). Rows are contiguous: row r starts at
// data + r * row_bytes(type, k).
struct Weight {
  std::string name;
  DType type = DType::F32;
  int64_t k = 0;                  // input width (ne[0])
  int64_t n = 0;                  // rows (ne[1]); 1 for vectors
  const uint8_t* data = nullptr;  // host bytes (mmap, or loader-owned for converted small tensors)
  size_t nbytes = 0;
  void* prepared = nullptr;  // backend-owned copy/repack (Backend::prepare), nullptr if unused

  bool empty() const { return data == nullptr; }
  size_t row_stride() const { return static_cast<size_t>(row_bytes(type, static_cast<uint64_t>(k))); }
  const float* f32() const { return reinterpret_cast<const float*>(data); }  // only for type F32

  // An F32 view of n rows of k host floats (not owned; tests, benchmarks).
  static Weight f32_view(const float* p, int64_t k, int64_t n = 1) {
    Weight w;
    w.type = DType::F32;
    w.k = k;
    w.n = n;
    w.data = reinterpret_cast<const uint8_t*>(p);
    w.nbytes = static_cast<size_t>(k * n) * sizeof(float);
    return w;
  }
};

}  // namespace bonsai
