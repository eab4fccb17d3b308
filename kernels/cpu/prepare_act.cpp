// Activation preparation: per-block quantization and the permuted layouts the
// ternary kernels read (see the Numerics / Layouts notes in matvec.h).
//
// Written as plain loops the compiler vectorises for the baseline ISA (the
// amax search uses SSE2 where available): prepare_act runs once per
// activation site per token, ~1 ns per element.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "bonsai/error.h"
#include "kernels/cpu/matvec.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace bonsai::cpu {
namespace {

// Largest |q|: 32639 = 127·256 + 127 keeps hi = (q + 128) >> 8 within int8.
constexpr int kQFaithful = 32639;
constexpr int kQInt8 = 127;

// max |x| over n values; NaN propagates (the bit patterns of |x| order like
// the values as int32, with NaN above infinity), so callers can reject it.
float abs_max(const float* x, int64_t n) {
  int64_t j = 0;
  int32_t m = 0;
#if defined(__SSE2__)
  const __m128i abs_mask = _mm_set1_epi32(0x7FFFFFFF);
  __m128i m4 = _mm_setzero_si128();
  for (; j + 4 <= n; j += 4) {
    const __m128i v = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + j)), abs_mask);
    const __m128i gt = _mm_cmpgt_epi32(v, m4);
    m4 = _mm_or_si128(_mm_and_si128(gt, v), _mm_andnot_si128(gt, m4));
  }
  alignas(16) int32_t t[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), m4);
  m = std::max(std::max(t[0], t[1]), std::max(t[2], t[3]));
#endif
  for (; j < n; ++j) {
    int32_t v;
    std::memcpy(&v, x + j, 4);
    m = std::max(m, v & 0x7FFFFFFF);
  }
  float f;
  std::memcpy(&f, &m, 4);
  return f;
}

// q[j] = round(x[j] · inv) for |x · inv| ≤ Q < 2^22: adding and removing
// 1.5·2^23 rounds to nearest even in float (vectorises; lrint does not).
int32_t round_block(const float* x, int64_t n, float inv, int16_t* q) {
  constexpr float kMagic = 12582912.0f;
  int32_t sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float r = (x[j] * inv + kMagic) - kMagic;
    const int v = static_cast<int>(r);
    q[j] = static_cast<int16_t>(v);
    sum += v;
  }
  return sum;
}

// q[b·B + j] = round(x / s_b), s[b] = amax_b / Q, sum[b] = Σ_j q (zero past k).
void quantize_blocks(const float* x, int64_t k, int B, int Q, int16_t* q, float* s, int32_t* sum) {
  const int64_t nb = (k + B - 1) / B;
  std::memset(q, 0, nb * B * sizeof(int16_t));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t j0 = b * B, n = std::min<int64_t>(B, k - j0);
    const float amax = abs_max(x + j0, n);
    s[b] = 0.0f;
    sum[b] = 0;
    if (!std::isfinite(amax)) fail("prepare_act: activation block {} holds a non-finite value", b);
    if (amax == 0.0f) continue;  // all zero: the block contributes nothing
    s[b] = amax / static_cast<float>(Q);
    const double inv = static_cast<double>(Q) / static_cast<double>(amax);
    if (inv < 1e30) {
      // |x·inv| ≤ Q(1 + 2^-23): rounds to at most Q.
      sum[b] = round_block(x + j0, n, static_cast<float>(inv), q + j0);
    } else {  // amax below ~1e-26: keep the inverse in double
      int32_t acc = 0;
      for (int64_t j = 0; j < n; ++j) {
        const long v = std::clamp<long>(std::lrint(static_cast<double>(x[j0 + j]) * inv), -Q, Q);
        q[j0 + j] = static_cast<int16_t>(v);
        acc += static_cast<int32_t>(v);
      }
      sum[b] = acc;
    }
  }
}

// The halves of q: hi = ⌊(q + 128) / 256⌋, lo = q − 256·hi ∈ [−128, 127].
inline int8_t hi_of(int v) { return static_cast<int8_t>((v + 128) >> 8); }
inline int8_t lo_of(int v) { return static_cast<int8_t>(v - 256 * ((v + 128) >> 8)); }

// Writes plane bytes: dst_hi[i] / dst_lo[i] from q[src[i]] (faithful) or q itself (int8).
template <int kLanes, class Src>
inline void emit(const int16_t* q, bool faithful, int8_t* dst_hi, int8_t* dst_lo, Src src) {
  if (faithful) {
    for (int i = 0; i < kLanes; ++i) {
      const int v = src(i) < 0 ? 0 : q[src(i)];
      dst_hi[i] = hi_of(v);
      dst_lo[i] = lo_of(v);
    }
  } else {
    for (int i = 0; i < kLanes; ++i) dst_hi[i] = static_cast<int8_t>(src(i) < 0 ? 0 : q[src(i)]);
  }
}

// Geometry of a layout family: G blocks of B elements per group, P planes of
// 64 byte lanes, 64 / G lanes per block in each plane.
struct Family {
  int B, G, P;
};
// (Lanes16 is packed by pack_lanes below; its entry gives the block size only.)
constexpr Family kFamilies[kNumActLayouts] = {{128, 2, 4}, {64, 4, 4}, {128, 2, 5}, {128, 16, 32}};

// Sizes `out` for ng groups of group_bytes per half and zeroes the halves
// (padding lanes and blocks must read as q = 0).
void size_packed(PackedAct& out, int64_t ng, int64_t group_bytes, bool faithful) {
  out.n_groups = ng;
  out.hi.resize(ng * group_bytes);
  out.lo.resize(faithful ? ng * group_bytes : 0);
  out.corr.resize(ng * 16);
  out.scale.resize(ng * 16);
  std::memset(out.hi.data(), 0, ng * group_bytes);
  if (faithful) std::memset(out.lo.data(), 0, ng * group_bytes);
}

// ActLayout::Lanes16 (matvec.h): per group j of 16 blocks, chunk c and plane s,
// byte 4b + i = q of element 16c + 4i + s of block 16j + b; corr / scale in
// lane b; a last group of ≤ 8 blocks folded (chunk c + 4 in lanes 8 + b of chunk c).
void pack_lanes(bool faithful, int64_t nb, const int16_t* q, const float* s, const int32_t* sum,
                PackedAct& out) {
  constexpr int G = kLanesGroup;
  const int64_t ng = (nb + G - 1) / G;
  constexpr int group_bytes = 8 * 4 * 64;
  size_packed(out, ng, group_bytes, faithful);
  for (int64_t g = 0; g < ng; ++g)
    for (int b = 0; b < G; ++b) {
      const int64_t blk = g * G + b;
      out.corr.data()[g * 16 + b] = blk < nb ? -sum[blk] : 0;
      out.scale.data()[g * 16 + b] = blk < nb ? s[blk] : 0.0f;
      if (blk >= nb) continue;  // padding block: zero activation, scale and correction
      const int16_t* qb = q + blk * 128;
      // A tail group of ≤ 8 blocks is folded: chunk c ≥ 4 goes to chunk c − 4, lanes 8 + b.
      const bool fold = nb - g * G <= G / 2;
      for (int c = 0; c < 8; ++c)
        for (int p = 0; p < 4; ++p) {
          const int cc = fold ? c % 4 : c, lane = fold ? b + 8 * (c / 4) : b;
          const int64_t off = ((g * 8 + cc) * 4 + p) * 64 + 4 * lane;
          int8_t* dh = out.hi.data() + off;
          int8_t* dl = faithful ? out.lo.data() + off : nullptr;
          emit<4>(qb, faithful, dh, dl, [c, p](int i) { return 16 * c + 4 * i + p; });
        }
    }
}

void pack(ActLayout l, bool faithful, int64_t nb, const int16_t* q, const float* s, const int32_t* sum,
          PackedAct& out) {
  const Family f = kFamilies[static_cast<int>(l)];
  const int64_t ng = (nb + f.G - 1) / f.G;
  const int group_bytes = f.P * 64;
  size_packed(out, ng, group_bytes, faithful);
  const int lanes32 = 16 / f.G;  // int32 lanes per block
  for (int64_t g = 0; g < ng; ++g) {
    for (int h = 0; h < f.G; ++h) {
      const int64_t b = g * f.G + h;
      int32_t* corr = out.corr.data() + g * 16 + h * lanes32;
      float* scale = out.scale.data() + g * 16 + h * lanes32;
      for (int i = 0; i < lanes32; ++i) corr[i] = 0, scale[i] = b < nb ? s[b] : 0.0f;
      if (b >= nb) continue;  // padding block: zero activation, scale and correction
      corr[0] = -sum[b];
      const int16_t* qb = q + b * f.B;
      for (int p = 0; p < f.P; ++p) {
        const int64_t off = (g * f.P + p) * 64 + h * (64 / f.G);
        int8_t* dh = out.hi.data() + off;
        int8_t* dl = faithful ? out.lo.data() + off : nullptr;
        switch (l) {
          case ActLayout::Q2x128:  // lane m of plane p: element 4m + p
            emit<32>(qb, faithful, dh, dl, [p](int m) { return 4 * m + p; });
            break;
          case ActLayout::Q2x64:
            emit<16>(qb, faithful, dh, dl, [p](int m) { return 4 * m + p; });
            break;
          case ActLayout::Trit128:  // trit p of byte m (see matvec.h); lanes 26..31 unused
            emit<16>(qb, faithful, dh, dl, [p](int m) { return 16 * p + m; });
            emit<8>(qb, faithful, dh + 16, dl ? dl + 16 : nullptr, [p](int m) { return 80 + 8 * p + m; });
            if (p < 4)
              emit<2>(qb, faithful, dh + 24, dl ? dl + 24 : nullptr, [p](int m) { return 120 + 2 * p + m; });
            break;
          case ActLayout::Lanes16:  // packed by pack_lanes
            break;
        }
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
  for (int B : {128, 64}) {
    bool quantized = false;
    const int64_t nb = (k + B - 1) / B;
    for (int l = 0; l < kNumActLayouts; ++l) {
      if (!(out.layouts & (1u << l)) || kFamilies[l].B != B) continue;
      if (!quantized) {
        out.q_scratch.resize(nb * B);
        out.s_scratch.resize(nb);
        out.sum_scratch.resize(nb);
        quantize_blocks(x, k, B, Q, out.q_scratch.data(), out.s_scratch.data(), out.sum_scratch.data());
        quantized = true;
      }
      if (static_cast<ActLayout>(l) == ActLayout::Lanes16)
        pack_lanes(faithful, nb, out.q_scratch.data(), out.s_scratch.data(), out.sum_scratch.data(),
                   out.packed[l]);
      else
        pack(static_cast<ActLayout>(l), faithful, nb, out.q_scratch.data(), out.s_scratch.data(),
             out.sum_scratch.data(), out.packed[l]);
    }
  }
}

}  // namespace bonsai::cpu
