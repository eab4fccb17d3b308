// Hostile-file corpus: malformed GGUF images generated from small valid files
// by mutating bytes. Every one must be refused with exactly one bonsai::Error
// whose message names the file and the offending key / tensor / field — never
// a crash, another exception type, or a huge allocation (the huge-count cases
// would otherwise throw std::bad_alloc / length_error, or trip ASan's
// allocation-size check, instead of bonsai::Error).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/gguf_writer.h"
#include "gguf_samples.h"

namespace bonsai {
namespace {

namespace fs = std::filesystem;
using Image = std::vector<uint8_t>;

// ---- the valid bases and mutation helpers ----------------------------------

// minimal_writer() (see gguf_samples.h), 256 bytes:
//   0 magic | 4 version | 8 n_tensors=2 | 16 n_kv=2
//   24 key "general.architecture" | 52 type 8 | 56 len 6 | 64 "qwen35"
//   70 key "test.count" | 88 type 4 | 92 u32 7
//   96 tensor "a.weight" | 112 n_dims 1 | 116 ne 8 | 124 type 0 | 128 offset 0
//   136 tensor "b.weight" | 152 n_dims 2 | 156 ne 4, 2 | 172 type 0 | 176 offset 32
//   184 padding | 192 data: a (32 B), b (32 B)
// The cases below locate fields by searching for the key / tensor name, so
// they follow the layout if the base changes; BaseLayout pins the numbers.
Image base() { return samples::minimal_writer().write_memory(); }

// A base with arrays: strings, i32, bool; and one string scalar.
Image arrays_base() {
  GgufWriter w;
  w.add_array_strings("t.strs", {"alpha", "beta"});
  const int32_t ints[] = {1, 2, 3};
  w.add_array_i32("t.ints", ints);
  const uint8_t bools[] = {0, 1};
  w.add_array_raw("t.bools", GgufType::BOOL, bools, 2);
  w.add_bool("t.flag", true);
  w.add_tensor_bytes("w", ggml_type::F32, {1}, samples::f32_bytes({1}));
  return w.write_memory();
}

// Offset just past the first occurrence of `s` in the image.
size_t after(const Image& img, std::string_view s) {
  auto it = std::search(img.begin(), img.end(), s.begin(), s.end());
  if (it == img.end()) throw std::logic_error("hostile test: marker not found: " + std::string(s));
  return static_cast<size_t>(it - img.begin()) + s.size();
}
size_t at(const Image& img, std::string_view s) { return after(img, s) - s.size(); }

template <typename T>
void poke(Image& img, size_t off, T v) {
  std::memcpy(img.data() + off, &v, sizeof(T));
}
Image cut(Image img, size_t n) {
  img.resize(n);
  return img;
}

// A file whose only tensor is `ne` of `type` with `bytes` of data.
Image one_tensor(uint32_t type, std::vector<uint64_t> ne, size_t bytes) {
  GgufWriter w;
  w.add_tensor_bytes("t.weight", type, std::move(ne), samples::pattern_bytes(bytes, 9));
  return w.write_memory();
}

// Nested arrays `depth` levels deep, innermost [u8 x 1].
Image nested(int depth) {
  samples::Bytes x;
  x.u32(0x46554747).u32(3).u64(0).u64(1).str("t.deep").u32(9);
  for (int i = 0; i < depth - 1; ++i) x.u32(9).u64(1);
  x.u32(0).u64(1).put<uint8_t>(1);
  return x.b;
}

struct Case {
  std::string name;
  std::function<Image()> make;
  std::vector<std::string> needles;  // the message must contain each (plus the file name)
};

std::vector<Case> cases() {
  constexpr uint64_t kHuge = 1ull << 62;
  std::vector<Case> c;
  auto add = [&](std::string name, std::function<Image()> make, std::vector<std::string> needles) {
    c.push_back({std::move(name), std::move(make), std::move(needles)});
  };

  // Truncation at every section.
  add("empty", [] { return Image{}; }, {"magic"});
  add("trunc_in_magic", [] { return cut(base(), 2); }, {"magic"});
  add("trunc_in_version", [] { return cut(base(), 6); }, {"version"});
  add("trunc_in_tensor_count", [] { return cut(base(), 12); }, {"tensor count"});
  add("trunc_in_kv_count", [] { return cut(base(), 20); }, {"metadata count"});
  add("trunc_in_key_length", [] { return cut(base(), 28); }, {"key #0"});
  add("trunc_in_key", [] { return cut(base(), 40); }, {"key #0"});
  add("trunc_in_value_type",
      [] {
        auto b = base();
        return cut(b, after(b, "architecture") + 2);
      },
      {"'general.architecture'"});
  add("trunc_in_string_length",
      [] {
        auto b = base();
        return cut(b, after(b, "architecture") + 7);
      },
      {"general.architecture"});
  add("trunc_in_string_value",
      [] {
        auto b = base();
        return cut(b, after(b, "qwe"));
      },
      {"general.architecture"});
  add("trunc_in_u32_value",
      [] {
        auto b = base();
        return cut(b, after(b, "test.count") + 6);
      },
      {"test.count"});
  add("trunc_in_string_array",
      [] {
        auto b = arrays_base();
        return cut(b, after(b, "be"));
      },
      {"t.strs"});
  add("trunc_in_i32_array",
      [] {
        auto b = arrays_base();
        return cut(b, after(b, "t.ints") + 22);
      },
      {"t.ints"});
  add("trunc_in_tensor_name",
      [] {
        auto b = base();
        return cut(b, after(b, "a.we"));
      },
      {"tensor #0 name"});
  add("trunc_in_tensor_dims",
      [] {
        auto b = base();
        return cut(b, after(b, "a.weight") + 8);
      },
      {"'a.weight'"});
  add("trunc_in_tensor_offset",
      [] {
        auto b = base();
        return cut(b, after(b, "b.weight") + 30);
      },
      {"b.weight"});
  add("trunc_in_padding",
      [] {
        auto b = base();
        return cut(b, after(b, "b.weight") + 36);
      },
      {"data section"});
  add("trunc_in_data", [] { return cut(base(), 240); }, {"'b.weight'", "end of the file"});
  add("trunc_first_tensor_data", [] { return cut(base(), 200); }, {"'a.weight'"});

  // Header fields.
  add("bad_magic",
      [] {
        auto b = base();
        b[3] = 'G';
        return b;
      },
      {"magic"});
  add("version_1",
      [] {
        auto b = base();
        poke<uint32_t>(b, 4, 1);
        return b;
      },
      {"version 1"});
  add("version_4",
      [] {
        auto b = base();
        poke<uint32_t>(b, 4, 4);
        return b;
      },
      {"version 4"});
  add("huge_kv_count",
      [] {
        auto b = base();
        poke<uint64_t>(b, 16, kHuge);
        return b;
      },
      {"4611686018427387904 metadata pairs"});
  add("huge_tensor_count",
      [] {
        auto b = base();
        poke<uint64_t>(b, 8, ~0ull);
        return b;
      },
      {"18446744073709551615 tensors"});
  add("kv_count_one_too_many",
      [] {
        auto b = base();
        poke<uint64_t>(b, 16, 3);
        return b;
      },
      {"tensor #0"});  // key #2 swallows tensor a's info

  // Keys and values.
  add("huge_key_length",
      [] {
        auto b = base();
        poke<uint64_t>(b, 24, kHuge);
        return b;
      },
      {"key #0"});
  add("huge_string_length",
      [] {
        auto b = base();
        poke<uint64_t>(b, after(b, "architecture") + 4, ~0ull);
        return b;
      },
      {"'general.architecture'"});
  add("huge_array_count_overflow",
      [] {
        auto b = arrays_base();
        poke<uint64_t>(b, after(b, "t.ints") + 8, 1ull << 62);
        return b;
      },
      {"'t.ints'", "does not fit"});
  add("huge_array_count",
      [] {
        auto b = arrays_base();
        poke<uint64_t>(b, after(b, "t.ints") + 8, 1ull << 40);
        return b;
      },
      {"'t.ints'", "does not fit"});
  add("huge_string_array_count",
      [] {
        auto b = arrays_base();
        poke<uint64_t>(b, after(b, "t.strs") + 8, ~0ull);
        return b;
      },
      {"'t.strs'", "does not fit"});
  add("huge_nested_array_count",
      [] {
        auto b = nested(2);
        poke<uint64_t>(b, after(b, "t.deep") + 8, kHuge);
        return b;
      },
      {"'t.deep'", "does not fit"});
  add("nested_too_deep", [] { return nested(9); }, {"'t.deep'", "nested deeper"});
  add("unknown_value_type",
      [] {
        auto b = base();
        poke<uint32_t>(b, after(b, "architecture"), 13);
        return b;
      },
      {"'general.architecture'", "unknown value type 13"});
  add("unknown_array_elem_type",
      [] {
        auto b = arrays_base();
        poke<uint32_t>(b, after(b, "t.ints") + 4, 0x100);
        return b;
      },
      {"'t.ints'", "unknown array element type 256"});
  add("bool_not_0_1",
      [] {
        auto b = arrays_base();
        b[after(b, "t.flag") + 4] = 2;
        return b;
      },
      {"'t.flag'", "bool"});
  add("bool_array_element_not_0_1",
      [] {
        auto b = arrays_base();
        b[after(b, "t.bools") + 16 + 1] = 0xFF;
        return b;
      },
      {"'t.bools'", "element 1"});
  add("key_invalid_utf8",
      [] {
        auto b = base();
        b[at(b, "general") + 3] = 0xFF;
        return b;
      },
      {"key #0", "UTF-8", "gen\\xffral"});
  add("key_overlong_utf8",
      [] {
        auto b = base();
        const size_t p = at(b, "test");
        b[p] = 0xC0;  // "te" -> C0 AE: an overlong encoding of '.'
        b[p + 1] = 0xAE;
        return b;
      },
      {"key #1", "UTF-8"});
  add("key_truncated_utf8",
      [] {
        auto b = base();
        b[after(b, "test.count") - 1] = 0xE2;
        return b;
      },
      {"key #1", "UTF-8"});
  add("key_surrogate_utf8",
      [] {
        auto b = base();
        auto p = at(b, "test");
        b[p] = 0xED;
        b[p + 1] = 0xA0;
        b[p + 2] = 0x80;
        return b;
      },
      {"key #1", "UTF-8"});
  add("key_with_newline",
      [] {
        GgufWriter w;
        w.add_u8("bad\nkey", 1);
        auto b = w.write_memory();
        poke<uint32_t>(b, after(b, "bad\nkey"), 13);
        return b;
      },
      {"'bad\\x0akey'", "unknown value type 13"});
  add("empty_key",
      [] {
        GgufWriter w;
        w.add_u8("", 1);
        return w.write_memory();
      },
      {"key #0", "empty"});
  add("duplicate_key_exact",
      [] {
        GgufWriter w;
        w.add_u32("k.x", 1);
        w.add_string("k.x", "again");
        return w.write_memory();
      },
      {"duplicate metadata key 'k.x'"});

  // Tensor infos.
  add("tensor_name_invalid_utf8",
      [] {
        auto b = base();
        b[at(b, "a.weight")] = 0xC0;
        return b;
      },
      {"tensor #0", "UTF-8"});
  add("tensor_name_empty",
      [] {
        GgufWriter w;
        w.add_tensor_bytes("", 0, {1}, samples::f32_bytes({1}));
        return w.write_memory();
      },
      {"tensor #0", "empty name"});
  add("duplicate_tensor_name",
      [] {
        auto b = base();
        b[at(b, "b.weight")] = 'a';
        return b;
      },
      {"duplicate tensor name 'a.weight'"});
  add("n_dims_0",
      [] {
        auto b = base();
        poke<uint32_t>(b, after(b, "a.weight"), 0);
        return b;
      },
      {"'a.weight'", "0 dimensions"});
  add("n_dims_5",
      [] {
        auto b = base();
        poke<uint32_t>(b, after(b, "a.weight"), 5);
        return b;
      },
      {"'a.weight'", "5 dimensions"});
  add("dims_product_overflows",
      [] {
        return one_tensor(ggml_type::F32, {1ull << 32, 1ull << 32}, 4);
      },
      {"'t.weight'", "overflows"});
  add("dim_above_int64", [] { return one_tensor(ggml_type::F32, {1ull << 63}, 4); },
      {"'t.weight'", "overflows"});
  add("byte_size_overflows",
      [] {
        return one_tensor(ggml_type::F64, {1ull << 61, 2}, 8);
      },
      {"'t.weight'", "byte size overflows"});
  add("ne0_not_block_multiple", [] { return one_tensor(ggml_type::PQ2_0, {100}, 34); },
      {"'t.weight'", "ne[0] = 100", "block size 128"});
  add("ne0_not_block_multiple_q2_0", [] { return one_tensor(ggml_type::Q2_0, {96}, 34); },
      {"'t.weight'", "ne[0] = 96", "64"});
  add("unknown_ggml_type",
      [] {
        auto b = base();
        poke<uint32_t>(b, after(b, "a.weight") + 12, 77);
        return b;
      },
      {"'a.weight'", "unknown ggml type 77"});
  add("offset_not_aligned",
      [] {
        auto b = base();
        poke<uint64_t>(b, after(b, "b.weight") + 24, 33);
        return b;
      },
      {"'b.weight'", "offset 33", "not aligned to 32"});
  add("offset_past_end",
      [] {
        auto b = base();
        poke<uint64_t>(b, after(b, "b.weight") + 24, 4096);
        return b;
      },
      {"'b.weight'", "past the end"});
  add("offset_huge",
      [] {
        auto b = base();
        poke<uint64_t>(b, after(b, "b.weight") + 24, ~0ull << 5);
        return b;
      },
      {"'b.weight'", "past the end"});
  add("tensors_same_offset",
      [] {
        auto b = base();
        poke<uint64_t>(b, after(b, "b.weight") + 24, 0);
        return b;
      },
      {"overlap"});
  add("tensors_overlap",
      [] {
        auto b = base();
        poke<uint64_t>(b, after(b, "a.weight") + 4, 16);
        return b;
      },
      {"'a.weight'", "overlap", "'b.weight'"});
  add("tensor_past_end_of_file",
      [] {
        auto b = base();
        poke<uint64_t>(b, after(b, "b.weight") + 12, 3);
        return b;
      },
      {"'b.weight'", "end of the file"});

  // general.alignment.
  add("alignment_0",
      [] {
        auto w = samples::minimal_writer();
        w.add_u32("general.alignment", 0);
        return w.write_memory();
      },
      {"'general.alignment'", "= 0", "power of two"});
  add("alignment_3",
      [] {
        auto w = samples::minimal_writer();
        w.add_u32("general.alignment", 3);
        return w.write_memory();
      },
      {"'general.alignment'", "= 3"});
  add("alignment_negative",
      [] {
        auto w = samples::minimal_writer();
        w.add_i32("general.alignment", -32);
        return w.write_memory();
      },
      {"'general.alignment'", "-32"});
  add("alignment_huge",
      [] {
        auto w = samples::minimal_writer();
        w.add_u64("general.alignment", 1ull << 40);
        return w.write_memory();
      },
      {"'general.alignment'"});
  add("alignment_string",
      [] {
        auto w = samples::minimal_writer();
        w.add_string("general.alignment", "32");
        return w.write_memory();
      },
      {"'general.alignment'", "string"});
  add("alignment_bool",
      [] {
        auto w = samples::minimal_writer();
        w.add_bool("general.alignment", true);
        return w.write_memory();
      },
      {"'general.alignment'", "bool"});

  // Q2_0 layout cannot be resolved.
  add("q2_0_ambiguous", [] { return one_tensor(ggml_type::Q2_0, {128}, 34); },
      {"'t.weight'", "ambiguous", "group-128", "group-64"});
  add("q2_0_neither", [] { return one_tensor(ggml_type::Q2_0, {1024}, 200); },
      {"'t.weight'", "inconsistent"});
  return c;
}

class Hostile : public ::testing::TestWithParam<Case> {};

TEST_P(Hostile, RefusedWithOneErrorNamingFileAndField) {
  const Case& k = GetParam();
  const Image img = k.make();
  const std::string name = "hostile/" + k.name + ".gguf";
  try {
    GgufFile f = GgufFile::from_memory(img.data(), img.size(), name);
    FAIL() << "accepted a malformed file";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(name + ": ", 0), 0u) << "message does not start with the file name: " << msg;
    for (const auto& n : k.needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, Hostile, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(HostileBase, BaseLayoutAndValidity) {
  const Image b = base();
  ASSERT_EQ(b.size(), 256u);
  EXPECT_EQ(at(b, "general.architecture"), 32u);
  EXPECT_EQ(at(b, "test.count"), 78u);
  EXPECT_EQ(at(b, "a.weight"), 104u);
  EXPECT_EQ(at(b, "b.weight"), 144u);
  GgufFile f = GgufFile::from_memory(b.data(), b.size(), "base.gguf");
  EXPECT_EQ(f.data_offset(), 192u);
  const Image a = arrays_base();
  EXPECT_NO_THROW(GgufFile::from_memory(a.data(), a.size(), "arrays.gguf"));
  for (int depth : {1, 2, 8}) {
    const Image n = nested(depth);
    EXPECT_NO_THROW(GgufFile::from_memory(n.data(), n.size(), "nested.gguf")) << depth;
  }
  EXPECT_GE(cases().size(), 30u);
}

// Every prefix of a valid file is refused, not only the handpicked cuts above.
TEST(HostileBase, EveryPrefixIsRefused) {
  for (const Image& b : {base(), arrays_base()}) {
    // The padding after the last tensor is optional; every shorter prefix
    // cuts something the reader needs.
    const GgufFile f = GgufFile::from_memory(b.data(), b.size(), "whole.gguf");
    uint64_t end = 0;
    for (const auto& t : f.tensors()) end = std::max(end, f.data_offset() + t.offset + t.nbytes);
    ASSERT_LE(end, b.size());
    for (size_t n = 0; n < b.size(); ++n) {
      const Image p = cut(b, n);
      if (n < end)
        EXPECT_THROW(GgufFile::from_memory(p.data(), p.size(), "prefix.gguf"), Error) << n;
      else
        EXPECT_NO_THROW(GgufFile::from_memory(p.data(), p.size(), "prefix.gguf")) << n;
    }
  }
}

// Every single-bit/byte change of the header and tensor infos either parses or
// throws bonsai::Error (never a crash or another exception type; under ASan
// never an out-of-bounds read).
TEST(HostileBase, EveryByteFlipParsesOrThrowsError) {
  const Image b = base();
  for (size_t i = 0; i < 192; ++i)  // header and tensor infos; data bytes are opaque
    for (uint8_t x : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      Image m = b;
      m[i] ^= x;
      try {
        GgufFile::from_memory(m.data(), m.size(), "flip.gguf");
      } catch (const Error&) {
      }
    }
}

// ---- fuzzer findings (tests/fuzz), kept as regressions ----------------------

// Finding 1 (run 1, ~160k executions): a valid file whose f64 array holds
// -1.06e270; GgufValue::elem_i64 cast it to int64 (undefined behaviour,
// UBSan float-cast-overflow). Now saturates. The key "ge\x08\0\0\0l.name"
// also shows that names reach messages escaped.
TEST(FuzzFindings, F64ArrayElemI64Saturates) {
  const Image img = {0x47, 0x47, 0x55, 0x46, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                     0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00,
                     0x00, 0x00, 0x67, 0x65, 0x08, 0x00, 0x00, 0x00, 0x6c, 0x2e, 0x6e, 0x61, 0x6d, 0x65, 0x08,
                     0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x6e, 0x65, 0x73, 0x74,
                     0x65, 0x64, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x74, 0x2e, 0x6e, 0x65, 0x73,
                     0x74, 0x65, 0x64, 0x09, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
                     0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x02, 0x00, 0x00,
                     0x01, 0x00, 0x61, 0x90, 0x00, 0x2a, 0xc7, 0x12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                     0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                     0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                     0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00,
                     0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                     0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x78, 0x79};
  GgufFile f = GgufFile::from_memory(img.data(), img.size(), "finding1.gguf");
  const GgufValue& a = f.get_array("t.nested", GgufType::F64);
  ASSERT_EQ(a.count, 2u);
  EXPECT_LT(a.elem_f64(0), -1e269);
  EXPECT_EQ(a.elem_i64(0), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(a.elem_i64(1), 0);  // ~1e-305 truncates to 0
  const std::string key = f.metadata()[0].first;
  ASSERT_EQ(key, std::string("ge\x08\0\0\0l.name", 12));
  try {
    f.get_u64(key);
    FAIL() << "a string key read as an integer must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'ge\\x08\\x00\\x00\\x00l.name'"), std::string::npos) << e.what();
  }
}

// ---- through the CLI ----------------------------------------------------------

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(HostileCli, InspectExitsOneWithOneErrorLine) {
  const std::string cli = BONSAI_CLI;
  if (!fs::exists(cli)) GTEST_SKIP() << "CLI not built: " << cli;
  const fs::path dir = fs::temp_directory_path() / ("bonsai_hostile_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const char* picks[] = {"trunc_in_string_value", "huge_kv_count",    "nested_too_deep", "key_invalid_utf8",
                         "tensors_overlap",       "alignment_string", "q2_0_ambiguous",  "empty"};
  for (const Case& k : cases()) {
    if (std::find_if(std::begin(picks), std::end(picks), [&](const char* p) { return k.name == p; }) ==
        std::end(picks))
      continue;
    SCOPED_TRACE(k.name);
    const std::string file = (dir / (k.name + ".gguf")).string();
    {
      const Image img = k.make();
      std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(img.data()), img.size());
    }
    const std::string out = (dir / "out.txt").string(), err = (dir / "err.txt").string();
    const std::string cmd = "'" + cli + "' inspect '" + file + "' >'" + out + "' 2>'" + err + "'";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << "killed by a signal: " << cmd;
    EXPECT_EQ(WEXITSTATUS(status), 1) << cmd;
    const std::string e = slurp(err);
    EXPECT_EQ(e.rfind("error: " + file + ": ", 0), 0u) << e;
    EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << e;
    EXPECT_EQ(e.back(), '\n');
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace bonsai
