// GGUF reader (versions 2 and 3), read-only and memory-mapped.
//
// File layout (all little-endian):
//   magic "GGUF" (u32 0x46554747) | version u32 | n_tensors u64 | n_kv u64
//   n_kv x { key: string | value_type u32 | value }
//   n_tensors x { name: string | n_dims u32 | ne[n_dims] u64 | type u32 | offset u64 }
//   padding to `general.alignment` (default 32)
//   data section: each tensor at data_start + offset (offset aligned)
// string = u64 length + bytes (no terminator). value types: 0 u8, 1 i8, 2 u16,
// 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array (u32 elem type + u64
// count + elements; arrays may nest), 10 u64, 11 i64, 12 f64.
// ne is in ggml order: ne[0] is the fastest-varying (for a weight, K).
//
// Validation happens once in GgufFile::open before anything is used: every read
// is bounds-checked against the mapped size; no count is trusted for
// allocation (reservations are capped by what the file can hold, array counts
// are checked against the bytes that remain); keys and tensor names must be
// valid UTF-8 and unique; each tensor's type must be known, ne[0] divisible by
// its block size, the element count must not overflow, and its bytes must lie
// inside the data section, aligned and not overlapping another tensor. Q2_0's
// layout (g128 vs g64) is resolved from the space the tensor occupies. Every
// failure throws one bonsai::Error naming the file and the offending key,
// tensor or header field (names escaped, so the message is one line). The full
// list of rules is in docs/formats.md.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bonsai/formats.h"

namespace bonsai {

enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
std::string_view gguf_type_name(GgufType t);
size_t gguf_scalar_size(GgufType t);  // 0 for STRING / ARRAY

// One metadata value. Strings and numeric arrays are views into the mapping
// (zero copy); they live as long as the GgufFile.
struct GgufValue {
  GgufType type = GgufType::U8;
  // Scalar payload (numeric and bool types).
  uint64_t bits = 0;     // raw little-endian bits, zero-extended
  std::string_view str;  // STRING
  // ARRAY
  GgufType elem_type = GgufType::U8;
  uint64_t count = 0;
  const uint8_t* elems = nullptr;         // numeric / bool arrays: count * scalar size bytes
  std::vector<std::string_view> strings;  // string arrays
  std::vector<GgufValue> nested;          // arrays of arrays

  bool is_integer() const;
  bool is_float() const;
  bool is_numeric() const { return is_integer() || is_float(); }
  // Numeric accessors; the caller checks the type first (see GgufFile getters).
  int64_t as_i64() const;
  uint64_t as_u64() const;
  double as_f64() const;
  // Element i of a numeric array, converted.
  double elem_f64(uint64_t i) const;
  int64_t elem_i64(uint64_t i) const;
  // Human summary, arrays abbreviated ("[i32 x 28672: 1, -1, 1, ...]").
  std::string summary(size_t max_items = 6) const;
};

struct GgufTensor {
  std::string name;
  uint32_t ggml_type = 0;
  DType dtype = DType::Other;  // resolved (Q2_0 split by layout)
  std::vector<uint64_t> ne;    // ggml order, ne[0] fastest
  uint64_t offset = 0;         // relative to the data section
  uint64_t nbytes = 0;
  uint64_t nelements = 0;
  const uint8_t* data = nullptr;  // into the mapping

  uint64_t dim(size_t i) const { return i < ne.size() ? ne[i] : 1; }
  std::string shape_str() const;  // "{5120, 248320}"
};

class MappedFile;  // RAII mmap, defined in src/gguf/mapped_file.h

class GgufFile {
 public:
  // Maps and validates `path`. Throws bonsai::Error on any problem.
  static GgufFile open(const std::string& path);
  // Validates an in-memory image (used by the fuzzer and tests); `name` is
  // used in error messages. The buffer must outlive the GgufFile.
  static GgufFile from_memory(const uint8_t* data, size_t size, const std::string& name);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters: throw bonsai::Error naming the file and key when the key is
  // missing or has an incompatible type / out-of-range value.
  const GgufValue& get(std::string_view key) const;
  uint64_t get_u64(std::string_view key) const;  // any non-negative integer type
  int64_t get_i64(std::string_view key) const;   // any integer type
  uint32_t get_u32(std::string_view key) const;
  double get_f64(std::string_view key) const;  // any numeric type
  float get_f32(std::string_view key) const { return static_cast<float>(get_f64(key)); }
  bool get_bool(std::string_view key) const;
  std::string_view get_string(std::string_view key) const;
  const GgufValue& get_array(std::string_view key) const;  // any element type
  const GgufValue& get_array(std::string_view key, GgufType elem) const;
  // Optional variants return the fallback when the key is absent (but still
  // throw on a present key of the wrong type).
  uint64_t get_u64_or(std::string_view key, uint64_t fallback) const;
  double get_f64_or(std::string_view key, double fallback) const;
  bool get_bool_or(std::string_view key, bool fallback) const;
  std::string_view get_string_or(std::string_view key, std::string_view fallback) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;
  const GgufTensor& tensor(std::string_view name) const;  // throws when missing

  // Raw pointer to the whole image (for the fuzzer / hexdump tools).
  const uint8_t* base() const { return base_; }

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  std::unique_ptr<MappedFile> map_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace bonsai
