// libFuzzer entry point for the GGUF reader.
//
// Every input must either parse or throw bonsai::Error; anything else (a crash,
// an ASan/UBSan report, another exception type, a leak, a hang) is a finding.
// On success the target also walks everything a caller could touch: every
// metadata value through its summary and the typed getters, every tensor's
// shape and the first rows of its data through the reference dequantizer,
// and the file is copied through GgufWriter and read back (round_trip).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/formats.h"
#include "bonsai/gguf.h"
#include "bonsai/gguf_writer.h"

namespace {

// Calls a getter that may legitimately throw bonsai::Error (wrong type).
template <typename F>
void probe(F&& f) {
  try {
    f();
  } catch (const bonsai::Error&) {
  }
}

void walk(const bonsai::GgufFile& f) {
  size_t sink = 0;
  for (const auto& kv : f.metadata()) {
    const std::string& key = kv.first;  // clang 14 cannot capture structured bindings
    const bonsai::GgufValue& v = kv.second;
    sink += v.summary().size();
    probe([&] { sink += f.get_u64(key); });
    probe([&] { sink += static_cast<size_t>(f.get_i64(key)); });
    probe([&] { sink += f.get_u32(key); });
    probe([&] { sink += f.get_f64(key) > 0; });
    probe([&] { sink += f.get_bool(key); });
    probe([&] { sink += f.get_string(key).size(); });
    probe([&] { sink += f.get_array(key).count; });
    probe([&] { sink += f.get_array(key, bonsai::GgufType::I32).count; });
    if (v.type == bonsai::GgufType::ARRAY && v.elems != nullptr) {  // numeric array
      for (uint64_t i = 0; i < std::min<uint64_t>(v.count, 16); ++i) sink += v.elem_f64(i) > 0 ? 1 : 0;
      for (uint64_t i = 0; i < std::min<uint64_t>(v.count, 16); ++i)
        sink += static_cast<size_t>(v.elem_i64(i));
    }
  }
  probe([&] { sink += f.get_string("general.architecture").size(); });
  std::vector<float> row;
  for (const auto& t : f.tensors()) {
    sink += t.shape_str().size();
    if (f.find_tensor(t.name) != &t) __builtin_trap();  // the index must agree with the list
    if (t.dtype == bonsai::DType::Other || t.nelements == 0) continue;
    // Dequantize up to 1024 leading elements (a whole number of blocks).
    const bonsai::DTypeInfo info = bonsai::dtype_info(t.dtype);
    uint64_t n = std::min<uint64_t>(t.nelements, 1024) / info.block_size * info.block_size;
    if (n == 0) continue;
    row.resize(n);
    bonsai::dequantize_row(t.dtype, t.data, row.data(), static_cast<int64_t>(n));
    sink += row[0] > 0;
  }
  // Keep the work observable so the optimizer cannot drop it.
  asm volatile("" : : "r"(sink));
}

// Property: whatever the reader accepts, the writer can copy (every pair via
// add_value, every tensor's bytes) and the reader accepts the copy with the
// same metadata and tensors. The one allowed exception is a Q2_0 tensor that
// was unambiguous only because the original file stopped right after its
// bytes; the writer pads it, and the padded space may fit both readings.
void round_trip(const bonsai::GgufFile& f) {
  if (f.alignment() > 4096) return;  // the writer would pad to the alignment: keep memory bounded
  bonsai::GgufWriter w(f.version());
  for (const auto& kv : f.metadata()) w.add_value(kv.first, kv.second);
  for (const auto& t : f.tensors())
    w.add_tensor_bytes(t.name, t.ggml_type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  const std::vector<uint8_t> img = w.write_memory();
  try {
    const bonsai::GgufFile g = bonsai::GgufFile::from_memory(img.data(), img.size(), "copy.gguf");
    if (g.metadata().size() != f.metadata().size() || g.tensors().size() != f.tensors().size())
      __builtin_trap();
    for (size_t i = 0; i < f.metadata().size(); ++i) {
      const auto& a = f.metadata()[i];
      const auto& b = g.metadata()[i];
      if (a.first != b.first || a.second.type != b.second.type ||
          a.second.summary(SIZE_MAX) != b.second.summary(SIZE_MAX))
        __builtin_trap();
    }
    for (size_t i = 0; i < f.tensors().size(); ++i) {
      const auto& a = f.tensors()[i];
      const auto& b = g.tensors()[i];
      if (a.name != b.name || a.ne != b.ne || a.dtype != b.dtype || a.nbytes != b.nbytes ||
          (a.nbytes && std::memcmp(a.data, b.data, a.nbytes) != 0))
        __builtin_trap();
    }
  } catch (const bonsai::Error& e) {
    if (std::string_view(e.what()).find("Q2_0 layout") == std::string_view::npos) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy into an exactly sized heap buffer so ASan catches any read past the end.
  std::vector<uint8_t> buf(data, data + size);
  try {
    bonsai::GgufFile f = bonsai::GgufFile::from_memory(buf.data(), buf.size(), "fuzz.gguf");
    walk(f);
    round_trip(f);
  } catch (const bonsai::Error&) {
  }
  return 0;
}
