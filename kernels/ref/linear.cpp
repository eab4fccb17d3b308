// Reference embedding gather, matmul, norms and the blockwise Hadamard site.
#include <cmath>
#include <vector>

#include "kernels/ref/fwht.h"
#include "kernels/ref/ops.h"

namespace bonsai::ref {

void embed(const Weight& table, const int32_t* tokens, int t, float* out) {
  const size_t stride = table.row_stride();
  for (int i = 0; i < t; ++i)
    dequantize_row(table.type, table.data + static_cast<size_t>(tokens[i]) * stride, out + i * table.k,
                   table.k);
}

void rmsnorm(const float* x, const float* gain, float* y, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    float ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * gain[i];
  }
}

void hadamard(const float* x, const float* signs, float* y, int64_t rows, int64_t k, int64_t block,
              bool inverse) {
  for (int64_t r = 0; r < rows; ++r) {
    if (inverse)
      hadamard_inverse(x + r * k, signs, y + r * k, k, block);
    else
      hadamard_forward(x + r * k, signs, y + r * k, k, block);
  }
}

void matmul(const Weight& w, const float* x, float* y, int t) {
  std::vector<float> row(static_cast<size_t>(w.k));
  const size_t stride = w.row_stride();
  for (int64_t r = 0; r < w.n; ++r) {
    dequantize_row(w.type, w.data + static_cast<size_t>(r) * stride, row.data(), w.k);
    for (int i = 0; i < t; ++i) {
      const float* xi = x + static_cast<int64_t>(i) * w.k;
      float acc = 0;
      for (int64_t c = 0; c < w.k; ++c) acc += row[c] * xi[c];
      y[static_cast<int64_t>(i) * w.n + r] = acc;
    }
  }
}

void add(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void swiglu(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = silu(gate[i]) * up[i];
}

void sigmoid_mul(const float* x, const float* gate, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(gate[i]);
}

void transpose_heads(const float* x, float* y, int64_t rows, int a, int b, int64_t d) {
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < a; ++i)
      for (int j = 0; j < b; ++j)
        for (int64_t e = 0; e < d; ++e) y[((r * b + j) * a + i) * d + e] = x[((r * a + i) * b + j) * d + e];
}

void take_part(const float* x, float* y, int64_t rows, int parts, int part, int64_t d) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t e = 0; e < d; ++e) y[r * d + e] = x[(r * parts + part) * d + e];
}

}  // namespace bonsai::ref
