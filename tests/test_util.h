// Small helpers shared by the op-level tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace bonsai::testing_util {

// n normally distributed floats (mean 0, std `scale`), deterministic for a seed.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace bonsai::testing_util
