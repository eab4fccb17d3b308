// Activation preparation: per-block quantization and the permuted layouts the
// ternary kernels read (see the Numerics / Layouts notes in matvec.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "bonsai/error.h"
#include "kernels/cpu/matvec.h"

namespace bonsai::cpu {
namespace {

// Geometry of a layout family: G blocks of B elements per group, P planes of
// 64 byte lanes, L = 64 / G lanes per block in each plane.
struct Family {
  int B, G, P, L;
};
constexpr Family kFamilies[kNumActLayouts] = {{128, 2, 4, 32}, {64, 4, 4, 16}, {128, 2, 5, 32}};

// Element (within its block) that lane m of plane p holds, or -1 for an unused lane.
constexpr int element_of(ActLayout l, int p, int m) {
  if (l != ActLayout::Trit128) return 4 * m + p;  // 2-bit codes: byte m >> 2p
  // PTQ1_0: trit p of byte m; qs[0..15] hold 16p+m, qs[16..23] 80+8p+m', qh[0..1] 120+2p+h (4 trits).
  if (m < 16) return 16 * p + m;
  if (m < 24) return 80 + 8 * p + (m - 16);
  if (m < 26 && p < 4) return 120 + 2 * p + (m - 24);
  return -1;
}

// For each byte of a group (plane p, lane i), the element offset within the
// group (h·B + e) or -1.
using GroupTable = std::array<int16_t, 5 * 64>;
constexpr GroupTable make_table(ActLayout l) {
  GroupTable t{};
  const Family f = kFamilies[static_cast<int>(l)];
  for (int p = 0; p < 5; ++p)
    for (int i = 0; i < 64; ++i) {
      const int h = i / f.L, m = i % f.L;
      const int e = p < f.P ? element_of(l, p, m) : -1;
      t[p * 64 + i] = static_cast<int16_t>(e < 0 ? -1 : h * f.B + e);
    }
  return t;
}
constexpr GroupTable kTables[kNumActLayouts] = {make_table(ActLayout::Q2x128), make_table(ActLayout::Q2x64),
                                                make_table(ActLayout::Trit128)};

// Largest |q|: 32639 = 127·256 + 127 keeps hi = (q + 128) >> 8 within int8.
constexpr int kQFaithful = 32639;
constexpr int kQInt8 = 127;

// q[b·B + j] = round(x / s_b), s[b] = amax_b / Q, sum[b] = Σ_j q (zero-padded past k).
void quantize_blocks(const float* x, int64_t k, int B, int Q, std::vector<int16_t>& q, std::vector<float>& s,
                     std::vector<int32_t>& sum) {
  const int64_t nb = (k + B - 1) / B;
  q.assign(nb * B, 0);
  s.assign(nb, 0.0f);
  sum.assign(nb, 0);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t j0 = b * B, n = std::min<int64_t>(B, k - j0);
    float amax = 0.0f;
    for (int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j0 + j]));
    if (!(amax > 0.0f)) continue;  // all zero (or NaN): the block contributes nothing
    if (!std::isfinite(amax)) fail("prepare_act: activation element in block {} is not finite", b);
    s[b] = amax / static_cast<float>(Q);
    // The inverse in double: Q / amax overflows float for amax below ~1e-34.
    const double inv = static_cast<double>(Q) / static_cast<double>(amax);
    int32_t acc = 0;
    for (int64_t j = 0; j < n; ++j) {
      long v = std::lrint(static_cast<double>(x[j0 + j]) * inv);
      v = std::clamp<long>(v, -Q, Q);
      q[j0 + j] = static_cast<int16_t>(v);
      acc += static_cast<int32_t>(v);
    }
    sum[b] = acc;
  }
}

void pack(ActLayout l, bool faithful, int64_t nb, const std::vector<int16_t>& q, const std::vector<float>& s,
          const std::vector<int32_t>& sum, PackedAct& out) {
  const Family f = kFamilies[static_cast<int>(l)];
  const GroupTable& table = kTables[static_cast<int>(l)];
  const int64_t ng = (nb + f.G - 1) / f.G;
  const int plane_bytes = f.P * 64;
  out.n_groups = ng;
  out.hi.resize(ng * plane_bytes);
  out.lo.resize(faithful ? ng * plane_bytes : 0);
  out.corr.resize(ng * 16);
  out.scale.resize(ng * 16);
  const int lanes32 = 16 / f.G;  // int32 lanes per block
  for (int64_t g = 0; g < ng; ++g) {
    int8_t* hi = out.hi.data() + g * plane_bytes;
    int8_t* lo = faithful ? out.lo.data() + g * plane_bytes : nullptr;
    const int64_t base = g * f.G * f.B;
    for (int i = 0; i < plane_bytes; ++i) {
      const int off = table[i];
      const int v = (off < 0 || base + off >= nb * f.B) ? 0 : q[base + off];
      if (faithful) {
        const int h = (v + 128) >> 8;  // floor: lo = v - 256 h in [-128, 127]
        hi[i] = static_cast<int8_t>(h);
        lo[i] = static_cast<int8_t>(v - 256 * h);
      } else {
        hi[i] = static_cast<int8_t>(v);
      }
    }
    int32_t* corr = out.corr.data() + g * 16;
    float* scale = out.scale.data() + g * 16;
    for (int h = 0; h < f.G; ++h) {
      const int64_t b = g * f.G + h;
      const bool real = b < nb;
      for (int i = 0; i < lanes32; ++i) {
        corr[h * lanes32 + i] = (i == 0 && real) ? -sum[b] : 0;
        scale[h * lanes32 + i] = real ? s[b] : 0.0f;
      }
    }
  }
}

}  // namespace

uint32_t layouts_for(DType t) {
  switch (t) {
    case DType::PQ2_0:
    case DType::Q2_0_G128:
      return layout_bit(ActLayout::Q2x128);
    case DType::Q2_0_G64:
      return layout_bit(ActLayout::Q2x64);
    case DType::PTQ1_0:
      return layout_bit(ActLayout::Trit128);
    default:
      return 0;
  }
}

void prepare_act(const float* x, int64_t k, Precision precision, PreparedAct& out, uint32_t layouts) {
  if (k <= 0) fail("prepare_act: activation width must be positive (got {})", k);
  out.k = k;
  out.precision = precision;
  out.layouts = layouts & kAllActLayouts;
  out.x.resize(k);
  std::memcpy(out.x.data(), x, k * sizeof(float));
  const bool faithful = precision == Precision::Faithful;
  const int Q = faithful ? kQFaithful : kQInt8;
  std::vector<int16_t> q;
  std::vector<float> s;
  std::vector<int32_t> sum;
  for (int B : {128, 64}) {
    bool quantized = false;
    for (int l = 0; l < kNumActLayouts; ++l) {
      if (!(out.layouts & (1u << l)) || kFamilies[l].B != B) continue;
      if (!quantized) quantize_blocks(x, k, B, Q, q, s, sum);
      quantized = true;
      pack(static_cast<ActLayout>(l), faithful, static_cast<int64_t>(s.size()), q, s, sum, out.packed[l]);
    }
  }
}

}  // namespace bonsai::cpu
