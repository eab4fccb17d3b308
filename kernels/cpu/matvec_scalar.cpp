// Scalar row kernels: the same quantized math as the SIMD kernels (same
// PreparedAct, same integer sums), one element at a time. They are the
// fallback for CPUs without AVX2 and the readable statement of what the SIMD
// kernels compute.
#include <cstring>

#include "bonsai/formats.h"
#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu::detail {
namespace {

float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// One block's contribution: d_b · s_b · (Σ c·q − Σ q), q = 256·hi + lo (faithful) or hi (int8).
// code(p, m) is the weight code of lane m of plane p; lanes past `lanes` are skipped.
template <class Code>
float block_dot(const PackedView& a, int64_t g, int h, int planes, int lanes, int lanes_per_block, float d,
                Code code) {
  const int8_t* hi = a.hi + g * planes * 64;
  const int8_t* lo = a.lo ? a.lo + g * planes * 64 : nullptr;
  int32_t acc_hi = 0, acc_lo = 0;
  for (int p = 0; p < planes; ++p)
    for (int m = 0; m < lanes; ++m) {
      const int c = code(p, m);
      const int i = p * 64 + h * lanes_per_block + m;
      acc_hi += c * hi[i];
      if (lo) acc_lo += c * lo[i];
    }
  const int l32 = lanes_per_block / 4;  // int32 lanes per block
  const int32_t t = (lo ? acc_hi * 256 + acc_lo : acc_hi) + a.corr[g * 16 + h * l32];
  return static_cast<float>(t) * (d * a.scale[g * 16 + h * l32]);
}

}  // namespace

void pq2_rows_scalar(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = args.w + r * args.row_bytes;
    float acc = 0.0f;
    for (int64_t b = 0; b < args.n_blocks; ++b) {
      const uint8_t* blk = row + b * 34;
      const uint8_t* qs = blk + 2;
      acc += block_dot(args.a, b / 2, static_cast<int>(b % 2), 4, 32, 32, load_half(blk),
                       [&](int p, int m) { return (qs[m] >> (2 * p)) & 3; });
    }
    y[r] = acc;
  }
}

void q2g64_rows_scalar(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = args.w + r * args.row_bytes;
    float acc = 0.0f;
    for (int64_t b = 0; b < args.n_blocks; ++b) {
      const uint8_t* blk = row + b * 18;
      const uint8_t* qs = blk + 2;
      acc += block_dot(args.a, b / 4, static_cast<int>(b % 4), 4, 16, 16, load_half(blk),
                       [&](int p, int m) { return (qs[m] >> (2 * p)) & 3; });
    }
    y[r] = acc;
  }
}

void ptq1_rows_scalar(const TernaryArgs& args, float* y, int64_t r0, int64_t r1) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = args.w + r * args.row_bytes;
    float acc = 0.0f;
    for (int64_t b = 0; b < args.n_blocks; ++b) {
      const uint8_t* blk = row + b * 28;
      // Trit n of byte v: ((v·3^n) mod 256)·3 >> 8 — the SIMD kernels use the same
      // formula. Lanes 26..31 (and trit 4 of the two qh bytes) hold zero activations.
      acc += block_dot(args.a, b / 2, static_cast<int>(b % 2), 5, 26, 32, load_half(blk + 26),
                       [&](int p, int m) { return (static_cast<uint8_t>(blk[m] * kPow3[p]) * 3) >> 8; });
    }
    y[r] = acc;
  }
}

void float_rows_scalar(const FloatArgs& args, float* y, int64_t r0, int64_t r1) {
  const int64_t elem = args.type == 0 ? 4 : 2;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = args.w + r * args.k * elem;
    float acc = 0.0f;
    for (int64_t j = 0; j < args.k; ++j) {
      float w;
      if (args.type == 0) {
        std::memcpy(&w, row + 4 * j, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, row + 2 * j, 2);
        w = args.type == 1 ? fp16_to_f32(h) : bf16_to_f32(h);
      }
      acc += w * args.x[j];
    }
    y[r] = acc;
  }
}

}  // namespace bonsai::cpu::detail
