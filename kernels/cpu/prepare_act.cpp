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

// prepare_act's pieces (16 blocks: 2048 elements at B = 128, one Lanes16 group) and the fewest
// that go to the pool: a piece is ~4 µs of work in the Lanes16 layout, more than a pool round
// trip, so every 27B activation (5120: 3 pieces, 17408: 9) is split.
constexpr int64_t kPieceBlocks = 16;
constexpr int64_t kMinPoolPieces = 2;

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

// q[b·B + j] = round(x / s_b), s[b] = amax_b / Q, sum[b] = Σ_j q (zero past k),
// for blocks [b0, b1) of x (B elements each, the last one cut at k).
void quantize_blocks(const float* x, int64_t k, int B, int Q, int16_t* q, float* s, int32_t* sum, int64_t b0,
                     int64_t b1) {
  std::memset(q + b0 * B, 0, (b1 - b0) * B * sizeof(int16_t));
  for (int64_t b = b0; b < b1; ++b) {
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

// Sizes `out` for ng groups of group_bytes per half.
void size_packed(PackedAct& out, int64_t ng, int64_t group_bytes, bool faithful) {
  out.n_groups = ng;
  out.hi.resize(ng * group_bytes);
  out.lo.resize(faithful ? ng * group_bytes : 0);
  out.corr.resize(ng * 16);
  out.scale.resize(ng * 16);
}

// Zeroes the halves of groups [g0, g1) before they are packed (padding lanes and
// blocks must read as q = 0).
void zero_groups(PackedAct& out, int64_t g0, int64_t g1, int64_t group_bytes, bool faithful) {
  std::memset(out.hi.data() + g0 * group_bytes, 0, (g1 - g0) * group_bytes);
  if (faithful) std::memset(out.lo.data() + g0 * group_bytes, 0, (g1 - g0) * group_bytes);
}

// ActLayout::Lanes16 (matvec.h): per group j of 16 blocks, chunk c and plane s,
// byte 4b + i = q of element 16c + 4i + s of block 16j + b; corr / scale in
// lane b; a last group of ≤ 8 blocks folded (chunk c + 4 in lanes 8 + b of chunk c).
// Groups [g0, g1) of out, already sized by size_packed for all nb blocks.
constexpr int kLanesGroupBytes = 8 * 4 * 64;
void pack_lanes(bool faithful, int64_t nb, const int16_t* q, const float* s, const int32_t* sum,
                PackedAct& out, int64_t g0, int64_t g1) {
  constexpr int G = kLanesGroup;
  zero_groups(out, g0, g1, kLanesGroupBytes, faithful);
  for (int64_t g = g0; g < g1; ++g)
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

// Groups [g0, g1) of out, already sized by size_packed for all nb blocks.
void pack(ActLayout l, bool faithful, int64_t nb, const int16_t* q, const float* s, const int32_t* sum,
          PackedAct& out, int64_t g0, int64_t g1) {
  const Family f = kFamilies[static_cast<int>(l)];
  const int group_bytes = f.P * 64;
  zero_groups(out, g0, g1, group_bytes, faithful);
  const int lanes32 = 16 / f.G;  // int32 lanes per block
  for (int64_t g = g0; g < g1; ++g) {
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

void prepare_act(const float* x, int64_t k, Precision precision, PreparedAct& out, uint32_t layouts,
                 ThreadPool* pool) {
  if (k <= 0) fail("prepare_act: activation width must be positive (got {})", k);
  out.k = k;
  out.precision = precision;
  out.layouts = layouts & kAllActLayouts;
  out.x.resize(k);
  std::memcpy(out.x.data(), x, k * sizeof(float));
  const bool faithful = precision == Precision::Faithful;
  const int Q = faithful ? kQFaithful : kQInt8;
  for (int B : {128, 64}) {
    uint32_t family = 0;  // the requested layouts of this block size
    for (int l = 0; l < kNumActLayouts; ++l)
      if ((out.layouts & (1u << l)) && kFamilies[l].B == B) family |= 1u << l;
    if (!family) continue;
    const int64_t nb = (k + B - 1) / B;
    out.q_scratch.resize(nb * B);
    out.s_scratch.resize(nb);
    out.sum_scratch.resize(nb);
    for (int l = 0; l < kNumActLayouts; ++l)
      if (family & (1u << l)) {
        const int G = kFamilies[l].G;
        size_packed(out.packed[l], (nb + G - 1) / G,
                    static_cast<ActLayout>(l) == ActLayout::Lanes16 ? kLanesGroupBytes : kFamilies[l].P * 64,
                    faithful);
      }
    // Pieces of kPieceBlocks blocks: a multiple of every family's group (2, 4, 2, 16 blocks),
    // so each group is quantized and packed by one piece, whichever thread runs it. Each
    // block's floats are the same either way (nothing is summed across blocks).
    auto piece = [&](int64_t i, int) {
      const int64_t b0 = i * kPieceBlocks, b1 = std::min(nb, b0 + kPieceBlocks);
      int16_t* q = out.q_scratch.data();
      const float* s = out.s_scratch.data();
      const int32_t* sum = out.sum_scratch.data();
      quantize_blocks(x, k, B, Q, q, out.s_scratch.data(), out.sum_scratch.data(), b0, b1);
      for (int l = 0; l < kNumActLayouts; ++l) {
        if (!(family & (1u << l))) continue;
        const int G = kFamilies[l].G;
        const int64_t g0 = b0 / G, g1 = (b1 + G - 1) / G;
        if (static_cast<ActLayout>(l) == ActLayout::Lanes16)
          pack_lanes(faithful, nb, q, s, sum, out.packed[l], g0, g1);
        else
          pack(static_cast<ActLayout>(l), faithful, nb, q, s, sum, out.packed[l], g0, g1);
      }
    };
    const int64_t pieces = (nb + kPieceBlocks - 1) / kPieceBlocks;
    if (pool && pool->size() > 1 && pieces >= kMinPoolPieces)
      pool->parallel_for(pieces, piece);
    else
      for (int64_t i = 0; i < pieces; ++i) piece(i, 0);
  }
}

}  // namespace bonsai::cpu
