// Scalar reference (de)quantizers for every weight format bonsai computes with.
// These loops are the specification; SIMD kernels are tested against them.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "bonsai/error.h"
#include "bonsai/formats.h"

namespace bonsai {
namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// PTQ1_0 element -> (byte index within the 26 trit bytes, trit index n).
// qs[0..15] hold elements 16n+m, qs[16..23] hold 80+8n+m, qh[0..1] hold 120+2n+h.
struct TritPos {
  uint8_t byte, n;
};
constexpr TritPos ptq1_pos(int e) {
  if (e < 80) return {static_cast<uint8_t>(e % 16), static_cast<uint8_t>(e / 16)};
  if (e < 120) return {static_cast<uint8_t>(16 + (e - 80) % 8), static_cast<uint8_t>((e - 80) / 8)};
  return {static_cast<uint8_t>(24 + (e - 120) % 2), static_cast<uint8_t>((e - 120) / 2)};
}

// Codes (0..3) of one 2-bit block of `group` elements starting at qs.
void unpack2(const uint8_t* qs, uint8_t* codes, int group) {
  for (int j = 0; j < group; ++j) codes[j] = (qs[j / 4] >> (2 * (j % 4))) & 3;
}
void pack2(const uint8_t* codes, uint8_t* qs, int group) {
  std::memset(qs, 0, group / 4);
  for (int j = 0; j < group; ++j) qs[j / 4] |= static_cast<uint8_t>((codes[j] & 3) << (2 * (j % 4)));
}

void unpack_ptq1(const uint8_t* blk, uint8_t* codes) {
  for (int e = 0; e < 128; ++e) {
    TritPos p = ptq1_pos(e);
    codes[e] = ptq1_trit(blk[p.byte], p.n);
  }
}

void pack_ptq1(const uint8_t* codes, uint8_t* blk) {
  uint8_t trits[26][5] = {};
  for (int e = 0; e < 128; ++e) {
    if (codes[e] > 2) fail("PTQ1_0 cannot encode code {} (element {}): only ternary codes 0..2", codes[e], e);
    TritPos p = ptq1_pos(e);
    trits[p.byte][p.n] = codes[e];
  }
  for (int b = 0; b < 26; ++b) blk[b] = ptq1_pack_byte(trits[b]);
}

}  // namespace

uint8_t ptq1_pack_byte(const uint8_t t[5]) {
  unsigned v = t[0] * 81u + t[1] * 27u + t[2] * 9u + t[3] * 3u + t[4];
  return static_cast<uint8_t>((v * 256u + 242u) / 243u);  // ceil(256 v / 243)
}

void dequantize_row(DType t, const void* src_v, float* dst, int64_t n) {
  const auto* src = static_cast<const uint8_t*>(src_v);
  uint8_t codes[128];
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::Q8_0:
      for (int64_t b = 0; b < n / 32; ++b, src += 34) {
        float d = fp16_to_f32(load_u16(src));
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = static_cast<int8_t>(src[2 + j]) * d;
      }
      return;
    case DType::PQ2_0:
    case DType::Q2_0_G128:
    case DType::Q2_0_G64: {
      const int g = t == DType::Q2_0_G64 ? 64 : 128;
      for (int64_t b = 0; b < n / g; ++b, src += 2 + g / 4) {
        float d = fp16_to_f32(load_u16(src));
        unpack2(src + 2, codes, g);
        for (int j = 0; j < g; ++j) dst[b * g + j] = (static_cast<int>(codes[j]) - 1) * d;
      }
      return;
    }
    case DType::PTQ1_0:
      for (int64_t b = 0; b < n / 128; ++b, src += 28) {
        float d = fp16_to_f32(load_u16(src + 26));
        unpack_ptq1(src, codes);
        for (int j = 0; j < 128; ++j) dst[b * 128 + j] = (static_cast<int>(codes[j]) - 1) * d;
      }
      return;
    case DType::Q1_0:
      for (int64_t b = 0; b < n / 128; ++b, src += 18) {
        float d = fp16_to_f32(load_u16(src));
        for (int j = 0; j < 128; ++j) dst[b * 128 + j] = ((src[2 + j / 8] >> (j % 8)) & 1) ? d : -d;
      }
      return;
    case DType::Other:
      break;
  }
  fail("dequantize_row: unsupported type {}", dtype_name(t));
}

void encode_ternary_row(DType t, const uint8_t* codes, const float* scales, void* dst_v, int64_t n) {
  auto* dst = static_cast<uint8_t*>(dst_v);
  const DTypeInfo info = dtype_info(t);
  const int g = static_cast<int>(info.block_size);
  if (n % g) fail("encode_ternary_row: {} elements is not a multiple of {}'s group {}", n, info.name, g);
  for (int64_t b = 0; b < n / g; ++b, dst += info.type_size) {
    const uint8_t* c = codes + b * g;
    uint16_t d = f32_to_fp16(scales[b]);
    switch (t) {
      case DType::PQ2_0:
      case DType::Q2_0_G128:
      case DType::Q2_0_G64:
        store_u16(dst, d);
        pack2(c, dst + 2, g);
        break;
      case DType::PTQ1_0:
        pack_ptq1(c, dst);
        store_u16(dst + 26, d);
        break;
      case DType::Q1_0:
        store_u16(dst, d);
        std::memset(dst + 2, 0, 16);
        for (int j = 0; j < 128; ++j) {
          if (c[j] != 0 && c[j] != 2)
            fail("Q1_0 cannot encode code {} (element {}): only 0 (-d) and 2 (+d)", c[j], j);
          if (c[j] == 2) dst[2 + j / 8] |= static_cast<uint8_t>(1u << (j % 8));
        }
        break;
      default:
        fail("encode_ternary_row: {} is not a ternary/binary format", info.name);
    }
  }
}

void decode_ternary_codes(DType t, const void* src_v, uint8_t* codes, uint16_t* scales, int64_t n) {
  const auto* src = static_cast<const uint8_t*>(src_v);
  const DTypeInfo info = dtype_info(t);
  const int g = static_cast<int>(info.block_size);
  for (int64_t b = 0; b < n / g; ++b, src += info.type_size) {
    uint8_t* c = codes + b * g;
    switch (t) {
      case DType::PQ2_0:
      case DType::Q2_0_G128:
      case DType::Q2_0_G64:
        scales[b] = load_u16(src);
        unpack2(src + 2, c, g);
        break;
      case DType::PTQ1_0:
        scales[b] = load_u16(src + 26);
        unpack_ptq1(src, c);
        break;
      case DType::Q1_0:
        scales[b] = load_u16(src);
        for (int j = 0; j < 128; ++j) c[j] = ((src[2 + j / 8] >> (j % 8)) & 1) ? 2 : 0;
        break;
      default:
        fail("decode_ternary_codes: {} is not a ternary/binary format", info.name);
    }
  }
}

void transcode_ptq1_to_pq2(const void* src_v, void* dst_v, int64_t n) {
  const auto* src = static_cast<const uint8_t*>(src_v);
  auto* dst = static_cast<uint8_t*>(dst_v);
  uint8_t codes[128];
  for (int64_t b = 0; b < n / 128; ++b, src += 28, dst += 34) {
    unpack_ptq1(src, codes);
    std::memcpy(dst, src + 26, 2);  // the fp16 scale moves from last to first
    pack2(codes, dst + 2, 128);
  }
}

void quantize_row_q8_0(const float* src, void* dst_v, int64_t n) {
  auto* dst = static_cast<uint8_t*>(dst_v);
  for (int64_t b = 0; b < n / 32; ++b, dst += 34) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[b * 32 + j]));
    float d = amax / 127.0f;
    float id = d > 0 ? 1.0f / d : 0.0f;
    store_u16(dst, f32_to_fp16(d));
    for (int j = 0; j < 32; ++j)
      dst[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(src[b * 32 + j] * id)));
  }
}

}  // namespace bonsai
