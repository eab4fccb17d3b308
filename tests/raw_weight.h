// A weight owning its bytes, and raw F32 / F16 / BF16 weights of normal values for the tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bonsai/formats.h"
#include "kernels/weight.h"

namespace bonsai::testing_util {

// A weight matrix in its file layout, owning its bytes (w.data points into them).
struct HostWeight {
  std::vector<uint8_t> bytes;
  Weight w;
};

// A raw F32 / F16 / BF16 weight [n][k] of normal values (mean 0, std `std`), deterministic for a seed.
inline HostWeight raw_weight(DType type, int64_t n, int64_t k, uint32_t seed, float std = 0.5f) {
  HostWeight h;
  const size_t elem = type == DType::F32 ? 4 : 2;
  h.bytes.resize(elem * static_cast<size_t>(n * k));
  std::mt19937 rng(seed);
  std::normal_distribution<float> val(0.0f, std);
  for (int64_t i = 0; i < n * k; ++i) {
    const float v = val(rng);
    if (type == DType::F32) {
      std::memcpy(h.bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t bits = type == DType::F16 ? f32_to_fp16(v) : f32_to_bf16(v);
      std::memcpy(h.bytes.data() + 2 * i, &bits, 2);
    }
  }
  h.w.name = std::string(dtype_name(type)) + " test weight";
  h.w.type = type;
  h.w.n = n;
  h.w.k = k;
  h.w.data = h.bytes.data();
  h.w.nbytes = h.bytes.size();
  return h;
}

}  // namespace bonsai::testing_util
