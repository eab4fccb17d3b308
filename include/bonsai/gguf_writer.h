// GGUF writer: the inverse of GgufFile. Metadata is kept in memory; tensor
// data is produced by callbacks at write time, one tensor after another, so a
// multi-GB model streams to disk with bounded memory (bonsai synth --preset 27b).
// Reading a file and writing its metadata and tensors back in order yields the
// same bytes (tests/test_gguf_writer.cpp).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "bonsai/gguf.h"

namespace bonsai {

// Where tensor bytes go; counts what was written.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(const void* data, size_t n) = 0;
};

class GgufWriter {
 public:
  using Producer = std::function<void(ByteSink&)>;

  explicit GgufWriter(uint32_t version = 3);

  // Scalars.
  void add_u8(std::string key, uint8_t v);
  void add_i8(std::string key, int8_t v);
  void add_u16(std::string key, uint16_t v);
  void add_i16(std::string key, int16_t v);
  void add_u32(std::string key, uint32_t v);
  void add_i32(std::string key, int32_t v);
  void add_u64(std::string key, uint64_t v);
  void add_i64(std::string key, int64_t v);
  void add_f32(std::string key, float v);
  void add_f64(std::string key, double v);
  void add_bool(std::string key, bool v);
  void add_string(std::string key, std::string_view v);
  // Arrays.
  void add_array_strings(std::string key, const std::vector<std::string>& v);
  void add_array_i32(std::string key, std::span<const int32_t> v);
  void add_array_f32(std::string key, std::span<const float> v);
  // Numeric array of any element type from raw little-endian bytes.
  void add_array_raw(std::string key, GgufType elem, const void* data, uint64_t count);
  // Copy any parsed value (including nested arrays) verbatim.
  void add_value(std::string key, const GgufValue& v);
  // Sets general.alignment (u32) and uses it for the data section. Adding the
  // key any other way (add_u64, add_value, ...) with a power-of-two value has
  // the same effect on the data section.
  void set_alignment(uint32_t alignment);

  // Tensors, written in the order added. nbytes must equal what the producer
  // writes (checked). ne in ggml order.
  void add_tensor(std::string name, uint32_t ggml_type, std::vector<uint64_t> ne, uint64_t nbytes,
                  Producer producer);
  void add_tensor_bytes(std::string name, uint32_t ggml_type, std::vector<uint64_t> ne,
                        std::vector<uint8_t> bytes);
  size_t tensor_count() const { return tensors_.size(); }

  // Writes the whole file. Throws bonsai::Error on I/O failure. `progress`, if
  // set, is called after each tensor with (done, total) tensor counts.
  void write_file(const std::string& path, const std::function<void(size_t, size_t)>& progress = {}) const;
  std::vector<uint8_t> write_memory() const;

 private:
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    uint64_t nbytes;
    Producer producer;
  };
  void write_to(ByteSink& out, const std::function<void(size_t, size_t)>& progress) const;
  void note_alignment(std::string_view key, uint64_t v);

  uint32_t version_;
  uint32_t alignment_ = 32;
  std::vector<uint8_t> kv_bytes_;  // serialized key/value pairs
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace bonsai
