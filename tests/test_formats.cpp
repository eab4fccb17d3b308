// Weight formats: hand-built blocks, element order, round trips, transcodes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/formats.h"

namespace bonsai {
namespace {

TEST(Half, RoundTripAndRounding) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t hh = static_cast<uint16_t>(h);
    float f = fp16_to_f32(hh);
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_fp16(f), hh) << h;
  }
  EXPECT_EQ(fp16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(fp16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7C00);                      // rounds to inf
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie -> even
  EXPECT_EQ(f32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.5f)), 1.5f);
}

TEST(PQ2_0, HandBuiltBlock) {
  uint8_t blk[34] = {};
  uint16_t d = f32_to_fp16(0.5f);
  std::memcpy(blk, &d, 2);
  // element j gets code j % 4 (includes code 3)
  for (int j = 0; j < 128; ++j) blk[2 + j / 4] |= static_cast<uint8_t>((j % 4) << (2 * (j % 4)));
  float out[128];
  dequantize_row(DType::PQ2_0, blk, out, 128);
  for (int j = 0; j < 128; ++j) EXPECT_EQ(out[j], (j % 4 - 1) * 0.5f) << j;
}

TEST(PTQ1_0, ByteCodecIsExactForAll243Values) {
  for (int v = 0; v < 243; ++v) {
    uint8_t t[5] = {static_cast<uint8_t>(v / 81), static_cast<uint8_t>(v / 27 % 3),
                    static_cast<uint8_t>(v / 9 % 3), static_cast<uint8_t>(v / 3 % 3),
                    static_cast<uint8_t>(v % 3)};
    uint8_t b = ptq1_pack_byte(t);
    for (int n = 0; n < 5; ++n) EXPECT_EQ(ptq1_trit(b, n), t[n]) << v << " " << n;
  }
}

TEST(PTQ1_0, ElementOrderWithDistinctValues) {
  // Build the block by hand from the documented order, with codes chosen so that
  // neighbouring elements differ; decode must give them back at their positions.
  uint8_t codes[128];
  for (int e = 0; e < 128; ++e) codes[e] = static_cast<uint8_t>((e * 7 + e / 3) % 3);
  uint8_t trits[26][5] = {};
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 16; ++m) trits[m][n] = codes[16 * n + m];
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 8; ++m) trits[16 + m][n] = codes[80 + 8 * n + m];
  for (int n = 0; n < 4; ++n)
    for (int h = 0; h < 2; ++h) trits[24 + h][n] = codes[120 + 2 * n + h];
  uint8_t blk[28];
  for (int b = 0; b < 26; ++b) blk[b] = ptq1_pack_byte(trits[b]);
  uint16_t d = f32_to_fp16(0.25f);
  std::memcpy(blk + 26, &d, 2);
  float out[128];
  dequantize_row(DType::PTQ1_0, blk, out, 128);
  for (int e = 0; e < 128; ++e) EXPECT_EQ(out[e], (codes[e] - 1) * 0.25f) << e;
  uint8_t enc[28];
  float s = 0.25f;
  encode_ternary_row(DType::PTQ1_0, codes, &s, enc, 128);
  EXPECT_EQ(0, std::memcmp(enc, blk, 28));
}

TEST(Ternary, RoundTripEveryFormatAndTranscode) {
  std::mt19937 rng(7);
  const int64_t n = 128 * 6;
  std::vector<uint8_t> codes(n);
  std::vector<float> scales(n / 64);
  for (auto& c : codes) c = rng() % 3;
  for (auto& s : scales) s = fp16_to_f32(f32_to_fp16(0.001f + (rng() % 1000) * 1e-4f));
  for (DType t : {DType::PQ2_0, DType::PTQ1_0, DType::Q2_0_G128, DType::Q2_0_G64}) {
    const int g = static_cast<int>(dtype_info(t).block_size);
    std::vector<uint8_t> buf(row_bytes(t, n));
    encode_ternary_row(t, codes.data(), scales.data(), buf.data(), n);
    std::vector<float> out(n);
    dequantize_row(t, buf.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(out[i], (codes[i] - 1.0f) * scales[i / g]) << dtype_name(t) << " " << i;
    std::vector<uint8_t> back(n);
    std::vector<uint16_t> sc(n / g);
    decode_ternary_codes(t, buf.data(), back.data(), sc.data(), n);
    EXPECT_EQ(back, codes);
  }
  std::vector<uint8_t> ptq(row_bytes(DType::PTQ1_0, n)), pq(row_bytes(DType::PQ2_0, n)), pq2(pq.size());
  encode_ternary_row(DType::PTQ1_0, codes.data(), scales.data(), ptq.data(), n);
  encode_ternary_row(DType::PQ2_0, codes.data(), scales.data(), pq.data(), n);
  transcode_ptq1_to_pq2(ptq.data(), pq2.data(), n);
  EXPECT_EQ(pq, pq2);
}

// ---- hand-built blocks of every format (values derived by hand from the
// layouts in docs/formats.md, not from the encoder) ------------------------------

// Bytes from a hex string like "00 3c e4 55".
std::vector<uint8_t> hex(const char* s) {
  std::vector<uint8_t> out;
  while (*s) {
    while (*s == ' ') ++s;
    if (!*s) break;
    out.push_back(static_cast<uint8_t>(std::stoi(std::string(s, 2), nullptr, 16)));
    s += 2;
  }
  return out;
}

TEST(F16, EdgeCases) {
  EXPECT_EQ(fp16_to_f32(0x7BFF), 65504.0f);                  // largest finite half
  EXPECT_EQ(fp16_to_f32(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(fp16_to_f32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(fp16_to_f32(0x7C00), INFINITY);
  EXPECT_EQ(fp16_to_f32(0xFC00), -INFINITY);
  EXPECT_TRUE(std::signbit(fp16_to_f32(0x8000)));
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7C01)));  // signalling payload stays NaN
  EXPECT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(NAN))));
  EXPECT_EQ(f32_to_fp16(-INFINITY), 0xFC00);
  EXPECT_EQ(f32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_fp16(65519.0f), 0x7BFF);               // below the 65520 midpoint
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // half of the smallest subnormal: tie -> even (0)
  EXPECT_EQ(f32_to_fp16(std::ldexp(3.0f, -26)), 0x0001);  // 0.75 ulp rounds up
  EXPECT_EQ(f32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie -> even (2)
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(f32_to_fp16(-0.0f), 0x8000);
  // Rounding that carries into the exponent: 2047.5 -> 2048.
  EXPECT_EQ(fp16_to_f32(f32_to_fp16(2047.5f)), 2048.0f);
  const auto b = hex("00 3e 00 c0 01 00 00 80");
  float out[4];
  dequantize_row(DType::F16, b.data(), out, 4);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_TRUE(std::signbit(out[3]));
}

TEST(BF16, EdgeCases) {
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie -> even
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -9)), 0x3F81);  // above the midpoint
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest bf16
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  // A NaN whose payload lives only in the low 16 bits must stay NaN, not become inf.
  uint32_t nan_bits = 0x7F800001;
  float nan;
  std::memcpy(&nan, &nan_bits, 4);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(nan))));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every bf16 is exact in f32 and converts back
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), h) << h;
  }
  const auto b = hex("c0 3f 80 bf 80 7f");
  float out[3];
  dequantize_row(DType::BF16, b.data(), out, 3);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -1.0f);
  EXPECT_EQ(out[2], INFINITY);
}

TEST(Q8_0, HandBuiltBlock) {
  // d = 0x3800 = 0.5; q = 1, -1, 127, -128, 0, 2, ...
  auto b = hex("00 38 01 ff 7f 80 00 02");
  b.resize(34, 0x03);  // q = 3 for the rest
  float out[32];
  dequantize_row(DType::Q8_0, b.data(), out, 32);
  const float want[] = {0.5f, -0.5f, 63.5f, -64.0f, 0.0f, 1.0f};
  for (int j = 0; j < 6; ++j) EXPECT_EQ(out[j], want[j]) << j;
  for (int j = 6; j < 32; ++j) EXPECT_EQ(out[j], 1.5f) << j;
}

TEST(Q8_0, QuantizeRoundTripWithinHalfAStep) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> x(32 * 8), y(x.size());
  for (auto& v : x) v = u(rng);
  x[40] = 0;                                        // a block with one exact zero
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block: d = 0
  std::vector<uint8_t> q(34 * 8);
  quantize_row_q8_0(x.data(), q.data(), static_cast<int64_t>(x.size()));
  dequantize_row(DType::Q8_0, q.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t b = 0; b < 8; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    // q = round(x / d) with d = amax/127 is off by at most d/2; storing d as
    // fp16 (relative error <= 2^-11) moves q*d by at most 127 * d * 2^-11 more.
    const float d = amax / 127;
    const float tol = d * (0.5f + 127 * std::ldexp(1.0f, -11)) + 1e-7f;
    for (int j = 0; j < 32; ++j) EXPECT_NEAR(y[b * 32 + j], x[b * 32 + j], tol) << b << " " << j;
  }
  for (int j = 64; j < 96; ++j) EXPECT_EQ(y[j], 0.0f);
}

TEST(Q2_0_G64, HandBuiltBlockWithCode3) {
  // d = 0x3c00 = 1.0; qs[0] = 0xe4 = 0b11'10'01'00 -> codes 0,1,2,3; qs[15] = 0x1b -> codes 3,2,1,0.
  auto b = hex("00 3c e4");
  b.resize(17, 0x55);  // code 1 (value 0) everywhere else
  b.push_back(0x1b);
  ASSERT_EQ(b.size(), 18u);
  float out[64];
  dequantize_row(DType::Q2_0_G64, b.data(), out, 64);
  const float head[] = {-1, 0, 1, 2}, tail[] = {2, 1, 0, -1};
  for (int j = 0; j < 4; ++j) EXPECT_EQ(out[j], head[j]) << j;
  for (int j = 4; j < 60; ++j) EXPECT_EQ(out[j], 0.0f) << j;
  for (int j = 0; j < 4; ++j) EXPECT_EQ(out[60 + j], tail[j]) << j;
  // The g128 reading of the same type id is a different block: 34 bytes.
  EXPECT_EQ(row_bytes(DType::Q2_0_G64, 128), 36u);
  EXPECT_EQ(row_bytes(DType::Q2_0_G128, 128), 34u);
}

TEST(Q1_0, HandBuiltBlock) {
  // d = 0x3c00 = 1.0; bit j of qs[j/8] (LSB first): qs[0] = 0x05 -> elements 0 and 2 are +1;
  // qs[1] = 0x80 -> element 15 is +1; qs[15] = 0xff -> elements 120..127 are +1.
  auto b = hex("00 3c 05 80");
  b.resize(17, 0x00);
  b.push_back(0xff);
  float out[128];
  dequantize_row(DType::Q1_0, b.data(), out, 128);
  for (int j = 0; j < 128; ++j) {
    const bool plus = j == 0 || j == 2 || j == 15 || j >= 120;
    EXPECT_EQ(out[j], plus ? 1.0f : -1.0f) << j;
  }
  // Encoding codes 0 / 2 gives the same bytes back.
  uint8_t codes[128];
  for (int j = 0; j < 128; ++j) codes[j] = out[j] > 0 ? 2 : 0;
  uint8_t enc[18];
  const float one = 1.0f;
  encode_ternary_row(DType::Q1_0, codes, &one, enc, 128);
  EXPECT_EQ(std::vector<uint8_t>(enc, enc + 18), b);
  codes[5] = 1;  // a zero weight has no Q1_0 encoding
  EXPECT_THROW(encode_ternary_row(DType::Q1_0, codes, &one, enc, 128), Error);
}

TEST(PTQ1_0, HandBuiltBlockAndTranscode) {
  // Trits t = code (weight/d + 1), five per byte, first most significant:
  // byte = ceil(256 * v / 243), v = 81 t0 + 27 t1 + 9 t2 + 3 t3 + t4.
  // qs[0] holds elements 0, 16, 32, 48, 64: trits 2,1,0,2,1 -> v = 196 -> 0xcf.
  // qs[16] holds 80, 88, 96, 104, 112: trits 0,2,1,1,2 -> v = 68 -> 0x48.
  // qh[1] holds 121, 123, 125, 127 and a 0 fifth trit: trits 2,0,1,1,0 -> v = 174 -> 0xb8.
  // Other qs bytes: five 1-trits (zero weights), v = 121 -> 0x80; qh[0]: 1,1,1,1,0 -> v = 120 -> 0x7f.
  // d = 0x3400 = 0.25, stored last.
  auto b = hex("cf");
  b.resize(24, 0x80);
  b[16] = 0x48;
  b.push_back(0x7f);
  b.push_back(0xb8);
  b.push_back(0x00);
  b.push_back(0x34);
  float out[128];
  dequantize_row(DType::PTQ1_0, b.data(), out, 128);
  for (int j = 0; j < 128; ++j) {
    float want = 0;
    if (j == 0 || j == 48 || j == 88 || j == 112 || j == 121) want = 0.25f;
    if (j == 32 || j == 80 || j == 123) want = -0.25f;
    EXPECT_EQ(out[j], want) << j;
  }
  // PQ2_0 form: d first, then 2-bit codes, element j at bits 2(j%4) of qs[j/4]; code 1 (0) is 0x55 per byte.
  // qs[0]: element 0 code 2 -> 0x56; qs[8]: element 32 code 0 -> 0x54; qs[12]: 48 -> 0x56;
  // qs[20]: 80 code 0 -> 0x54; qs[22]: 88 -> 0x56; qs[28]: 112 -> 0x56;
  // qs[30]: 121 code 2 (bits 2-3), 123 code 0 (bits 6-7) -> 0b00'01'10'01 = 0x19.
  auto want = hex("00 34");
  want.resize(34, 0x55);
  for (auto [q, v] :
       {std::pair{0, 0x56}, {8, 0x54}, {12, 0x56}, {20, 0x54}, {22, 0x56}, {28, 0x56}, {30, 0x19}})
    want[2 + q] = static_cast<uint8_t>(v);
  uint8_t pq[34];
  transcode_ptq1_to_pq2(b.data(), pq, 128);
  EXPECT_EQ(std::vector<uint8_t>(pq, pq + 34), want);
}

TEST(Ternary, ZeroAndNegativeScales) {
  uint8_t codes[128];
  for (int j = 0; j < 128; ++j) codes[j] = static_cast<uint8_t>(j % 3);
  for (DType t : {DType::PQ2_0, DType::PTQ1_0, DType::Q2_0_G128}) {
    for (float d : {0.0f, -0.5f}) {
      uint8_t buf[34];
      encode_ternary_row(t, codes, &d, buf, 128);
      float out[128];
      dequantize_row(t, buf, out, 128);
      for (int j = 0; j < 128; ++j) EXPECT_EQ(out[j], (codes[j] - 1.0f) * d) << dtype_name(t) << " " << j;
    }
  }
}

TEST(Ternary, Code3RoundTripsIn2BitFormatsOnly) {
  std::vector<uint8_t> codes(128);
  for (int j = 0; j < 128; ++j) codes[j] = static_cast<uint8_t>(j % 4);
  const float d = 0.125f;
  for (DType t : {DType::PQ2_0, DType::Q2_0_G128, DType::Q2_0_G64}) {
    const float scales[2] = {d, d};
    std::vector<uint8_t> buf(row_bytes(t, 128));
    encode_ternary_row(t, codes.data(), scales, buf.data(), 128);
    std::vector<uint8_t> back(128);
    uint16_t sc[2];
    decode_ternary_codes(t, buf.data(), back.data(), sc, 128);
    EXPECT_EQ(back, codes) << dtype_name(t);
    EXPECT_EQ(fp16_to_f32(sc[0]), d);
    float out[128];
    dequantize_row(t, buf.data(), out, 128);
    EXPECT_EQ(out[3], 2 * d) << dtype_name(t);  // code 3 reads as +2d
  }
  uint8_t ptq[28];
  EXPECT_THROW(encode_ternary_row(DType::PTQ1_0, codes.data(), &d, ptq, 128), Error);
}

TEST(Formats, GeometryAndMisuse) {
  // type_info and dtype_info agree for every format bonsai computes with.
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::PQ2_0, DType::PTQ1_0,
                  DType::Q2_0_G128, DType::Q1_0}) {
    const DTypeInfo d = dtype_info(t);
    const TypeInfo* g = type_info(d.ggml_id);
    ASSERT_NE(g, nullptr) << d.name;
    EXPECT_EQ(g->block_size, d.block_size) << d.name;
    EXPECT_EQ(g->type_size, d.type_size) << d.name;
    EXPECT_EQ(dtype_from_ggml(d.ggml_id), t) << d.name;
  }
  EXPECT_EQ(dtype_from_ggml(ggml_type::Q4_K), DType::Other);
  EXPECT_EQ(type_info(77), nullptr);
  EXPECT_EQ(row_bytes(DType::PTQ1_0, 5120), 40u * 28);
  EXPECT_EQ(row_bytes(DType::Q8_0, 64), 68u);
  float out[128];
  uint8_t blk[34] = {};
  EXPECT_THROW(dequantize_row(DType::Other, blk, out, 1), Error);
  uint8_t codes[100] = {};
  float d = 1;
  EXPECT_THROW(encode_ternary_row(DType::PQ2_0, codes, &d, blk, 100), Error);
  EXPECT_THROW(encode_ternary_row(DType::F16, codes, &d, blk, 1), Error);
}

TEST(Ternary, RoundTripQ1_0) {
  std::mt19937 rng(11);
  const int64_t n = 128 * 3;
  std::vector<uint8_t> codes(n), back(n);
  for (auto& c : codes) c = (rng() & 1) * 2;
  const float scales[3] = {0.5f, -0.25f, 3.0f};
  std::vector<uint8_t> buf(row_bytes(DType::Q1_0, n));
  encode_ternary_row(DType::Q1_0, codes.data(), scales, buf.data(), n);
  std::vector<float> out(n);
  dequantize_row(DType::Q1_0, buf.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], (codes[i] - 1.0f) * scales[i / 128]) << i;
  uint16_t sc[3];
  decode_ternary_codes(DType::Q1_0, buf.data(), back.data(), sc, n);
  EXPECT_EQ(back, codes);
}

}  // namespace
}  // namespace bonsai
