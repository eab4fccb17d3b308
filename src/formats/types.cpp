// GGML type table, half-precision conversions and the dequantize dispatcher.
#include <cmath>
#include <cstring>

#include "bonsai/error.h"
#include "bonsai/formats.h"

namespace bonsai {
namespace {

constexpr TypeInfo kTypes[] = {
    {ggml_type::F32, "F32", 1, 4},        {ggml_type::F16, "F16", 1, 2},
    {ggml_type::Q4_0, "Q4_0", 32, 18},    {ggml_type::Q4_1, "Q4_1", 32, 20},
    {ggml_type::Q5_0, "Q5_0", 32, 22},    {ggml_type::Q5_1, "Q5_1", 32, 24},
    {ggml_type::Q8_0, "Q8_0", 32, 34},    {ggml_type::Q8_1, "Q8_1", 32, 36},
    {ggml_type::Q2_K, "Q2_K", 256, 84},   {ggml_type::Q3_K, "Q3_K", 256, 110},
    {ggml_type::Q4_K, "Q4_K", 256, 144},  {ggml_type::Q5_K, "Q5_K", 256, 176},
    {ggml_type::Q6_K, "Q6_K", 256, 210},  {ggml_type::Q8_K, "Q8_K", 256, 292},
    {ggml_type::I8, "I8", 1, 1},          {ggml_type::I16, "I16", 1, 2},
    {ggml_type::I32, "I32", 1, 4},        {ggml_type::I64, "I64", 1, 8},
    {ggml_type::F64, "F64", 1, 8},        {ggml_type::BF16, "BF16", 1, 2},
    {ggml_type::TQ1_0, "TQ1_0", 256, 54}, {ggml_type::TQ2_0, "TQ2_0", 256, 66},
    {ggml_type::Q1_0, "Q1_0", 128, 18},   {ggml_type::Q2_0, "Q2_0", 128, 34},
    {ggml_type::PQ2_0, "PQ2_0", 128, 34}, {ggml_type::PTQ1_0, "PTQ1_0", 128, 28},
};

}  // namespace

const TypeInfo* type_info(uint32_t id) {
  for (const auto& t : kTypes)
    if (t.ggml_id == id) return &t;
  return nullptr;
}

DTypeInfo dtype_info(DType t) {
  switch (t) {
    case DType::F32:
      return {"F32", 1, 4, ggml_type::F32};
    case DType::F16:
      return {"F16", 1, 2, ggml_type::F16};
    case DType::BF16:
      return {"BF16", 1, 2, ggml_type::BF16};
    case DType::Q8_0:
      return {"Q8_0", 32, 34, ggml_type::Q8_0};
    case DType::PQ2_0:
      return {"PQ2_0", 128, 34, ggml_type::PQ2_0};
    case DType::PTQ1_0:
      return {"PTQ1_0", 128, 28, ggml_type::PTQ1_0};
    case DType::Q2_0_G128:
      return {"Q2_0(g128)", 128, 34, ggml_type::Q2_0};
    case DType::Q2_0_G64:
      return {"Q2_0(g64)", 64, 18, ggml_type::Q2_0};
    case DType::Q1_0:
      return {"Q1_0", 128, 18, ggml_type::Q1_0};
    case DType::Other:
      break;
  }
  return {"other", 1, 0, 0xFFFFFFFFu};
}

std::string_view dtype_name(DType t) { return dtype_info(t).name; }

DType dtype_from_ggml(uint32_t id) {
  switch (id) {
    case ggml_type::F32:
      return DType::F32;
    case ggml_type::F16:
      return DType::F16;
    case ggml_type::BF16:
      return DType::BF16;
    case ggml_type::Q8_0:
      return DType::Q8_0;
    case ggml_type::PQ2_0:
      return DType::PQ2_0;
    case ggml_type::PTQ1_0:
      return DType::PTQ1_0;
    case ggml_type::Q2_0:
      return DType::Q2_0_G128;
    case ggml_type::Q1_0:
      return DType::Q1_0;
    default:
      return DType::Other;
  }
}

uint64_t row_bytes(DType t, uint64_t n) {
  DTypeInfo i = dtype_info(t);
  return n / i.block_size * i.type_size;
}

float fp16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3FF) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t ax = x & 0x7FFFFFFF;
  if (ax > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00);   // NaN
  if (ax >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // >= 65520 rounds to inf
  if (ax < 0x38800000) {  // below the smallest normal half (2^-14): subnormal or zero
    // value * 2^24 rounded to nearest even gives the subnormal mantissa.
    float a;
    std::memcpy(&a, &ax, 4);
    float m = std::nearbyint(a * 16777216.0f);  // exact: a*2^24 < 1024
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(m));
  }
  uint32_t e = ((ax >> 23) - 127 + 15);
  uint32_t man = ax & 0x7FFFFF;
  uint32_t h = (e << 10) | (man >> 13);
  uint32_t rest = man & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // RNE; carry into the exponent is correct
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace bonsai
