// Weight formats: GGML type ids, block geometry, and scalar reference
// (de)quantizers. The scalar code here is the specification every SIMD/GPU
// kernel is tested against. Layouts are documented in docs/formats.md.
//
//  PQ2_0  (142) 128 w / 34 B : fp16 d | qs[32]       code q=(qs[j/4]>>2(j%4))&3, w=(q-1)d
//  PTQ1_0 (143) 128 w / 28 B : qs[24] | qh[2] | fp16 d   base-3 trits, see ptq1 below
//  Q2_0   (42)  two layouts the type id cannot tell apart:
//                 g128: 128 w / 34 B (identical to PQ2_0, PrismML legacy)
//                 g64 :  64 w / 18 B (fp16 d | qs[16], mainline ggml)
//  Q1_0   (41)  128 w / 18 B : fp16 d | qs[16]       bit j of qs[j/8]: 1 -> +d, 0 -> -d
//  Q8_0   (8)    32 w / 34 B : fp16 d | int8 q[32]   w = q d
//  F32 (0), F16 (1), BF16 (30)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace bonsai {

// GGML type ids as they appear in GGUF tensor infos.
namespace ggml_type {
inline constexpr uint32_t F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
                          Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, I8 = 24, I16 = 25,
                          I32 = 26, I64 = 27, F64 = 28, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, Q1_0 = 41,
                          Q2_0 = 42, PQ2_0 = 142, PTQ1_0 = 143;
}

// The resolved storage format of a tensor. Q2_0 is split by layout, so code
// downstream of the loader never has to guess.
enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  Q8_0,
  PQ2_0,
  PTQ1_0,
  Q2_0_G128,  // ggml id 42, PrismML legacy layout (== PQ2_0 bytes)
  Q2_0_G64,   // ggml id 42, mainline ggml layout
  Q1_0,
  Other,  // a known ggml type bonsai can describe (inspect) but not compute with
};

struct TypeInfo {
  uint32_t ggml_id;
  const char* name;
  uint32_t block_size;  // elements per block
  uint32_t type_size;   // bytes per block
};

// Static description of a GGML type id; nullptr if the id is unknown.
// For Q2_0 this returns the g128 geometry; use q2_0_layouts() for both.
const TypeInfo* type_info(uint32_t ggml_id);

// Geometry of a resolved DType.
struct DTypeInfo {
  const char* name;
  uint32_t block_size;
  uint32_t type_size;
  uint32_t ggml_id;
};
DTypeInfo dtype_info(DType t);
DType dtype_from_ggml(uint32_t ggml_id);  // Q2_0 -> Q2_0_G128 (caller resolves the layout); unknown -> Other
std::string_view dtype_name(DType t);

// Bytes needed for n elements of t (n must be a multiple of the block size).
uint64_t row_bytes(DType t, uint64_t n);

// ---- scalar half / bfloat16 conversion (round-to-nearest-even) --------------
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

// ---- reference dequantization -------------------------------------------------
// Dequantize n elements (a whole number of blocks) from src into dst.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// ---- ternary encoding ------------------------------------------------------------
// Ternary weights are given as codes c in {0,1,2} (value (c-1)*d; 3 is accepted
// by the 2-bit formats and means +2d) and one scale per group.
// encode_ternary_row writes n elements (multiple of the group) in format t,
// which must be PQ2_0, PTQ1_0, Q2_0_G128, Q2_0_G64 (codes 0..3) or PTQ1_0
// (codes 0..2 only). `scales` has n / group entries, rounded to fp16.
void encode_ternary_row(DType t, const uint8_t* codes, const float* scales, void* dst, int64_t n);
// Inverse: codes (0..3) and fp16 scale bits for every group of a ternary row.
void decode_ternary_codes(DType t, const void* src, uint8_t* codes, uint16_t* scales_fp16, int64_t n);

// PTQ1_0 -> PQ2_0 bit-exact transcode of one row (n multiple of 128).
void transcode_ptq1_to_pq2(const void* src, void* dst, int64_t n);

// One PTQ1_0 byte holding trits t0..t4 (t0 most significant), and the reverse.
uint8_t ptq1_pack_byte(const uint8_t trits[5]);
inline uint8_t ptq1_trit(uint8_t byte, int n) {
  static constexpr uint16_t pow3[5] = {1, 3, 9, 27, 81};
  return static_cast<uint8_t>((static_cast<uint8_t>(byte * pow3[n]) * 3u) >> 8);
}

// Q8_0 quantization of a float row (used for small tensors and tests).
void quantize_row_q8_0(const float* src, void* dst, int64_t n);

}  // namespace bonsai
