#include "kernels/ref/fwht.h"

#include <cmath>

namespace bonsai::ref {

void fwht(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

void hadamard_forward(const float* x, const float* signs, float* out, int64_t k, int64_t block) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(block));
  for (int64_t i = 0; i < k; ++i) out[i] = signs ? x[i] * signs[i] : x[i];
  for (int64_t b = 0; b < k; b += block) {
    fwht(out + b, block);
    for (int64_t i = b; i < b + block; ++i) out[i] *= scale;
  }
}

void hadamard_inverse(const float* z, const float* signs, float* out, int64_t k, int64_t block) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(block));
  for (int64_t i = 0; i < k; ++i) out[i] = z[i];
  for (int64_t b = 0; b < k; b += block) {
    fwht(out + b, block);
    for (int64_t i = b; i < b + block; ++i) out[i] *= scale;
  }
  if (signs)
    for (int64_t i = 0; i < k; ++i) out[i] *= signs[i];
}

}  // namespace bonsai::ref
