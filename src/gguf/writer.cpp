#include <cerrno>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include "bonsai/error.h"
#include "bonsai/gguf_writer.h"

namespace bonsai {
namespace {

template <typename T>
void put(std::vector<uint8_t>& b, T v) {
  uint8_t tmp[sizeof(T)];
  std::memcpy(tmp, &v, sizeof(T));
  b.insert(b.end(), tmp, tmp + sizeof(T));
}
void put_string(std::vector<uint8_t>& b, std::string_view s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

void put_value(std::vector<uint8_t>& b, const GgufValue& v, bool with_type) {
  if (with_type) put<uint32_t>(b, static_cast<uint32_t>(v.type));
  size_t sz = gguf_scalar_size(v.type);
  if (sz) {
    uint8_t tmp[8];
    std::memcpy(tmp, &v.bits, 8);  // little-endian host
    b.insert(b.end(), tmp, tmp + sz);
    return;
  }
  if (v.type == GgufType::STRING) {
    put_string(b, v.str);
    return;
  }
  put<uint32_t>(b, static_cast<uint32_t>(v.elem_type));
  put<uint64_t>(b, v.count);
  size_t es = gguf_scalar_size(v.elem_type);
  if (es)
    b.insert(b.end(), v.elems, v.elems + v.count * es);
  else if (v.elem_type == GgufType::STRING)
    for (auto s : v.strings) put_string(b, s);
  else
    for (const auto& n : v.nested) put_value(b, n, false);
}

class CountingSink : public ByteSink {
 public:
  explicit CountingSink(ByteSink& inner) : inner_(inner) {}
  void write(const void* data, size_t n) override {
    inner_.write(data, n);
    count += n;
  }
  uint64_t count = 0;

 private:
  ByteSink& inner_;
};

class FileSink : public ByteSink {
 public:
  explicit FileSink(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) fail("{}: cannot create: {}", path, std::strerror(errno));
    buf_.resize(1 << 20);
  }
  ~FileSink() override {
    if (f_) std::fclose(f_);
  }
  void write(const void* data, size_t n) override {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      size_t k = std::min(n, buf_.size() - used_);
      std::memcpy(buf_.data() + used_, p, k);
      used_ += k;
      p += k;
      n -= k;
      if (used_ == buf_.size()) flush();
    }
  }
  void close() {
    flush();
    if (std::fclose(f_) != 0) {
      f_ = nullptr;
      fail("{}: write failed: {}", path_, std::strerror(errno));
    }
    f_ = nullptr;
  }

 private:
  void flush() {
    if (used_ && std::fwrite(buf_.data(), 1, used_, f_) != used_)
      fail("{}: write failed: {}", path_, std::strerror(errno));
    used_ = 0;
  }
  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<uint8_t> buf_;
  size_t used_ = 0;
};

class VectorSink : public ByteSink {
 public:
  void write(const void* data, size_t n) override {
    const auto* p = static_cast<const uint8_t*>(data);
    out.insert(out.end(), p, p + n);
  }
  std::vector<uint8_t> out;
};

}  // namespace

GgufWriter::GgufWriter(uint32_t version) : version_(version) {}

// general.alignment decides where the data section and every tensor start, so
// the writer follows it however the key is added (set_alignment, add_u32,
// add_value when copying a parsed file). A value that is not a power of two is
// still written as given — the hostile-file tests need such files — and the
// data keeps the previous alignment; the reader refuses that file.
void GgufWriter::note_alignment(std::string_view key, uint64_t v) {
  if (key == "general.alignment" && v != 0 && (v & (v - 1)) == 0 && v <= (1u << 30))
    alignment_ = static_cast<uint32_t>(v);
}

namespace {
// The value of an integer key as an alignment candidate; floats and negative
// numbers never are one (0 is refused by note_alignment).
template <typename T>
uint64_t alignment_candidate(T v) {
  if constexpr (std::is_integral_v<T>)
    return std::cmp_greater_equal(v, 0) ? static_cast<uint64_t>(v) : 0;
  else
    return 0;
}
}  // namespace

#define BONSAI_SCALAR_ADDER(fn, T, tag)                   \
  void GgufWriter::fn(std::string key, T v) {             \
    put_string(kv_bytes_, key);                           \
    put<uint32_t>(kv_bytes_, static_cast<uint32_t>(tag)); \
    put<T>(kv_bytes_, v);                                 \
    ++n_kv_;                                              \
    note_alignment(key, alignment_candidate(v));          \
  }
BONSAI_SCALAR_ADDER(add_u8, uint8_t, GgufType::U8)
BONSAI_SCALAR_ADDER(add_i8, int8_t, GgufType::I8)
BONSAI_SCALAR_ADDER(add_u16, uint16_t, GgufType::U16)
BONSAI_SCALAR_ADDER(add_i16, int16_t, GgufType::I16)
BONSAI_SCALAR_ADDER(add_u32, uint32_t, GgufType::U32)
BONSAI_SCALAR_ADDER(add_i32, int32_t, GgufType::I32)
BONSAI_SCALAR_ADDER(add_u64, uint64_t, GgufType::U64)
BONSAI_SCALAR_ADDER(add_i64, int64_t, GgufType::I64)
BONSAI_SCALAR_ADDER(add_f32, float, GgufType::F32)
BONSAI_SCALAR_ADDER(add_f64, double, GgufType::F64)
#undef BONSAI_SCALAR_ADDER

void GgufWriter::add_bool(std::string key, bool v) {
  put_string(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::BOOL));
  put<uint8_t>(kv_bytes_, v ? 1 : 0);
  ++n_kv_;
}

void GgufWriter::add_string(std::string key, std::string_view v) {
  put_string(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::STRING));
  put_string(kv_bytes_, v);
  ++n_kv_;
}

void GgufWriter::add_array_strings(std::string key, const std::vector<std::string>& v) {
  put_string(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::ARRAY));
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::STRING));
  put<uint64_t>(kv_bytes_, v.size());
  for (const auto& s : v) put_string(kv_bytes_, s);
  ++n_kv_;
}

void GgufWriter::add_array_raw(std::string key, GgufType elem, const void* data, uint64_t count) {
  size_t es = gguf_scalar_size(elem);
  if (!es) fail("GgufWriter: add_array_raw('{}') needs a numeric element type", key);
  put_string(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::ARRAY));
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(elem));
  put<uint64_t>(kv_bytes_, count);
  const auto* p = static_cast<const uint8_t*>(data);
  kv_bytes_.insert(kv_bytes_.end(), p, p + count * es);
  ++n_kv_;
}

void GgufWriter::add_array_i32(std::string key, std::span<const int32_t> v) {
  add_array_raw(std::move(key), GgufType::I32, v.data(), v.size());
}
void GgufWriter::add_array_f32(std::string key, std::span<const float> v) {
  add_array_raw(std::move(key), GgufType::F32, v.data(), v.size());
}

void GgufWriter::add_value(std::string key, const GgufValue& v) {
  put_string(kv_bytes_, key);
  put_value(kv_bytes_, v, true);
  ++n_kv_;
  if (v.is_integer() && v.type != GgufType::BOOL && v.as_i64() >= 0) note_alignment(key, v.as_u64());
}

void GgufWriter::set_alignment(uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)))
    fail("GgufWriter: alignment {} is not a power of two", alignment);
  add_u32("general.alignment", alignment);  // sets alignment_ (note_alignment)
}

void GgufWriter::add_tensor(std::string name, uint32_t ggml_type, std::vector<uint64_t> ne, uint64_t nbytes,
                            Producer producer) {
  tensors_.push_back({std::move(name), ggml_type, std::move(ne), nbytes, std::move(producer)});
}

void GgufWriter::add_tensor_bytes(std::string name, uint32_t ggml_type, std::vector<uint64_t> ne,
                                  std::vector<uint8_t> bytes) {
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  uint64_t n = shared->size();
  add_tensor(std::move(name), ggml_type, std::move(ne), n,
             [shared](ByteSink& s) { s.write(shared->data(), shared->size()); });
}

void GgufWriter::write_to(ByteSink& out, const std::function<void(size_t, size_t)>& progress) const {
  std::vector<uint8_t> head;
  put<uint32_t>(head, 0x46554747);
  put<uint32_t>(head, version_);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, n_kv_);
  head.insert(head.end(), kv_bytes_.begin(), kv_bytes_.end());
  auto align = [&](uint64_t x) { return (x + alignment_ - 1) / alignment_ * alignment_; };
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) put<uint64_t>(head, d);
    put<uint32_t>(head, t.type);
    put<uint64_t>(head, offset);
    offset = align(offset + t.nbytes);
  }
  // The header is padded to the alignment even when there are no tensors:
  // gguf-py and ggml do so, and a tensor-less vocabulary file round-trips
  // byte for byte only with it (tests/test_gguf_writer.cpp).
  head.resize(align(head.size()), 0);
  out.write(head.data(), head.size());
  static const uint8_t zeros[256] = {};
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    CountingSink counting(out);
    t.producer(counting);
    if (counting.count != t.nbytes)
      fail("GgufWriter: tensor '{}' producer wrote {} bytes, declared {}", t.name, counting.count, t.nbytes);
    uint64_t pad = align(t.nbytes) - t.nbytes;
    while (pad > 0) {
      uint64_t k = std::min<uint64_t>(pad, sizeof zeros);
      out.write(zeros, k);
      pad -= k;
    }
    if (progress) progress(i + 1, tensors_.size());
  }
}

void GgufWriter::write_file(const std::string& path,
                            const std::function<void(size_t, size_t)>& progress) const {
  FileSink sink(path);
  write_to(sink, progress);
  sink.close();
}

std::vector<uint8_t> GgufWriter::write_memory() const {
  VectorSink sink;
  write_to(sink, {});
  return std::move(sink.out);
}

}  // namespace bonsai
