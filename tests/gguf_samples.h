// Small valid GGUF images built with GgufWriter, shared by the reader/writer
// tests, the hostile corpus and the fuzzer's seed generator.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "bonsai/formats.h"
#include "bonsai/gguf_writer.h"

namespace bonsai::samples {

// Deterministic pseudo-random bytes (no <random> so the byte stream is the same
// on every standard library).
inline std::vector<uint8_t> pattern_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : b) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = static_cast<uint8_t>(x >> 24);
  }
  return b;
}

// Ternary block bytes with codes 0..2 and a finite fp16 scale, for `n` elements
// of a ternary format (PQ2_0, PTQ1_0, Q2_0_G128, Q2_0_G64, Q1_0).
inline std::vector<uint8_t> ternary_bytes(DType t, uint64_t n, uint32_t seed) {
  const uint32_t g = dtype_info(t).block_size;
  std::vector<uint8_t> codes(n);
  std::vector<float> scales(n / g);
  auto r = pattern_bytes(n + scales.size(), seed);
  for (uint64_t i = 0; i < n; ++i) codes[i] = t == DType::Q1_0 ? (r[i] & 1) * 2 : r[i] % 3;
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.001f * (1 + r[n + i] % 100);
  std::vector<uint8_t> out(row_bytes(t, n));
  encode_ternary_row(t, codes.data(), scales.data(), out.data(), static_cast<int64_t>(n));
  return out;
}

inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The base of the hostile corpus: two metadata keys, two small tensors. Kept
// tiny so every byte position means something to a mutation.
//   kv: general.architecture = "qwen35" (string), test.count = 7 (u32)
//   tensors: "a.weight" F32 {8}, "b.weight" F32 {4, 2}
inline GgufWriter minimal_writer() {
  GgufWriter w;
  w.add_string("general.architecture", "qwen35");
  w.add_u32("test.count", 7);
  w.add_tensor_bytes("a.weight", ggml_type::F32, {8}, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  w.add_tensor_bytes("b.weight", ggml_type::F32, {4, 2}, f32_bytes({-1, -2, -3, -4, 0.5f, 0.25f, 0, 9}));
  return w;
}

// Every metadata value type, including string arrays and nested arrays.
inline void add_every_value_type(GgufWriter& w) {
  w.add_u8("t.u8", 200);
  w.add_i8("t.i8", -100);
  w.add_u16("t.u16", 60000);
  w.add_i16("t.i16", -30000);
  w.add_u32("t.u32", 4000000000u);
  w.add_i32("t.i32", -2000000000);
  w.add_u64("t.u64", 18000000000000000000ull);
  w.add_i64("t.i64", -9000000000000000000ll);
  w.add_f32("t.f32", 0.15625f);
  w.add_f64("t.f64", -1e300);
  w.add_bool("t.bool", true);
  w.add_string("t.string", "h\xC3\xA9llo");
  w.add_string("t.empty_string", "");
  w.add_array_strings("t.arr_str", {"a", "", "\xE2\x82\xAC"});
  const int32_t i32s[] = {1, -1, 1, 1};
  w.add_array_i32("t.arr_i32", i32s);
  const float f32s[] = {0.5f, -2.0f};
  w.add_array_f32("t.arr_f32", f32s);
  const uint8_t bools[] = {1, 0, 1};
  w.add_array_raw("t.arr_bool", GgufType::BOOL, bools, 3);
  const int8_t i8s[] = {-1, 1, -1};
  w.add_array_raw("t.arr_i8", GgufType::I8, i8s, 3);
  const uint64_t u64s[] = {1ull << 40, 3};
  w.add_array_raw("t.arr_u64", GgufType::U64, u64s, 2);
  const double f64s[] = {0.1, 1e-300};
  w.add_array_raw("t.arr_f64", GgufType::F64, f64s, 2);
  w.add_array_raw("t.arr_empty", GgufType::U16, nullptr, 0);
}

// Little-endian byte builder for hand-made images.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
};

// A tensor-less image with a nested array (the writer can only copy nested
// values from a parsed file, so this one is made by hand):
//   general.name = "nested"
//   t.nested = [[i16 x 2: 5, -6], [string x 1: "xy"]]
// padded to 32 bytes like every writer output.
inline std::vector<uint8_t> nested_image(uint32_t version) {
  Bytes x;
  x.u32(0x46554747).u32(version).u64(0).u64(2);
  x.str("general.name").u32(8).str("nested");
  x.str("t.nested").u32(9).u32(9).u64(2);
  x.u32(3).u64(2).put<int16_t>(5).put<int16_t>(-6);
  x.u32(8).u64(1).str("xy");
  x.b.resize((x.b.size() + 31) / 32 * 32, 0);
  return x.b;
}

}  // namespace bonsai::samples
