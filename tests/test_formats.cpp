// Weight formats: hand-built blocks, element order, round trips, transcodes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

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
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7C00);  // rounds to inf
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
    uint8_t t[5] = {static_cast<uint8_t>(v / 81), static_cast<uint8_t>(v / 27 % 3), static_cast<uint8_t>(v / 9 % 3),
                    static_cast<uint8_t>(v / 3 % 3), static_cast<uint8_t>(v % 3)};
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
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], (codes[i] - 1.0f) * scales[i / g]) << dtype_name(t) << " " << i;
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

}  // namespace
}  // namespace bonsai
