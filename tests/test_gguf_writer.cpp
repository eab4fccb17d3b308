// GgufWriter: round trips through the reader, and byte-for-byte re-creation of
// every fixture model from its parsed metadata and tensor bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/gguf_writer.h"
#include "gguf_samples.h"

namespace bonsai {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Re-creates a parsed file with a fresh writer: same version, every pair in
// file order through add_value (general.alignment included, which also sets
// the writer's data alignment), every tensor's bytes in file order.
GgufWriter copy_of(const GgufFile& f) {
  GgufWriter w(f.version());
  for (const auto& [k, v] : f.metadata()) w.add_value(k, v);
  for (const auto& t : f.tensors())
    w.add_tensor_bytes(t.name, t.ggml_type, t.ne, {t.data, t.data + t.nbytes});
  return w;
}

TEST(GgufWriter, RoundTripEveryValueTypeAndSeveralTensors) {
  GgufWriter w;
  samples::add_every_value_type(w);
  const auto f16 = samples::pattern_bytes(2 * 6, 11);
  const auto q8 = samples::pattern_bytes(34 * 2, 12);
  const auto pq2 = samples::ternary_bytes(DType::PQ2_0, 256, 13);
  const auto ptq1 = samples::ternary_bytes(DType::PTQ1_0, 128, 14);
  w.add_tensor_bytes("x.f32", ggml_type::F32, {3}, samples::f32_bytes({1.5f, -2, 1e-3f}));
  w.add_tensor_bytes("x.f16", ggml_type::F16, {3, 2}, f16);
  w.add_tensor_bytes("x.q8", ggml_type::Q8_0, {64}, q8);
  w.add_tensor_bytes("x.pq2", ggml_type::PQ2_0, {128, 2}, pq2);
  w.add_tensor_bytes("x.ptq1", ggml_type::PTQ1_0, {128, 1, 1, 1}, ptq1);
  const auto bytes = w.write_memory();
  GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size(), "roundtrip.gguf");

  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 21u);
  EXPECT_EQ(f.get_u64("t.u8"), 200u);
  EXPECT_EQ(f.get_i64("t.i8"), -100);
  EXPECT_EQ(f.get_u64("t.u16"), 60000u);
  EXPECT_EQ(f.get_i64("t.i16"), -30000);
  EXPECT_EQ(f.get_u32("t.u32"), 4000000000u);
  EXPECT_EQ(f.get_i64("t.i32"), -2000000000);
  EXPECT_EQ(f.get_u64("t.u64"), 18000000000000000000ull);
  EXPECT_EQ(f.get_i64("t.i64"), -9000000000000000000ll);
  EXPECT_EQ(f.get_f32("t.f32"), 0.15625f);
  EXPECT_EQ(f.get_f64("t.f64"), -1e300);
  EXPECT_TRUE(f.get_bool("t.bool"));
  EXPECT_EQ(f.get_string("t.string"), "h\xC3\xA9llo");
  EXPECT_EQ(f.get_string("t.empty_string"), "");
  const auto& strs = f.get_array("t.arr_str", GgufType::STRING);
  ASSERT_EQ(strs.count, 3u);
  EXPECT_EQ(strs.strings[0], "a");
  EXPECT_EQ(strs.strings[1], "");
  EXPECT_EQ(strs.strings[2], "\xE2\x82\xAC");
  const auto& i32 = f.get_array("t.arr_i32", GgufType::I32);
  ASSERT_EQ(i32.count, 4u);
  EXPECT_EQ(i32.elem_i64(1), -1);
  EXPECT_EQ(f.get_array("t.arr_f32", GgufType::F32).elem_f64(1), -2.0);
  EXPECT_EQ(f.get_array("t.arr_bool", GgufType::BOOL).elem_i64(2), 1);
  EXPECT_EQ(f.get_array("t.arr_i8", GgufType::I8).elem_i64(0), -1);
  EXPECT_EQ(f.get_array("t.arr_u64", GgufType::U64).elem_f64(0), 1099511627776.0);
  EXPECT_EQ(f.get_array("t.arr_f64", GgufType::F64).elem_f64(1), 1e-300);
  EXPECT_EQ(f.get_array("t.arr_empty", GgufType::U16).count, 0u);

  ASSERT_EQ(f.tensors().size(), 5u);
  const std::vector<std::pair<std::string, const std::vector<uint8_t>*>> want = {
      {"x.f16", &f16}, {"x.q8", &q8}, {"x.pq2", &pq2}, {"x.ptq1", &ptq1}};
  for (const auto& [name, data] : want) {
    const GgufTensor& t = f.tensor(name);
    ASSERT_EQ(t.nbytes, data->size()) << name;
    EXPECT_TRUE(std::equal(data->begin(), data->end(), t.data)) << name;
    EXPECT_EQ(t.offset % 32, 0u) << name;
  }
  EXPECT_EQ(f.tensor("x.ptq1").ne, (std::vector<uint64_t>{128, 1, 1, 1}));
  EXPECT_EQ(f.tensor("x.pq2").dtype, DType::PQ2_0);
  float x[3];
  dequantize_row(DType::F32, f.tensor("x.f32").data, x, 3);
  EXPECT_EQ(x[0], 1.5f);
  EXPECT_EQ(x[2], 1e-3f);

  // Parse -> copy -> write reproduces the image exactly.
  EXPECT_EQ(copy_of(f).write_memory(), bytes);
}

TEST(GgufWriter, NestedArraysCopyVerbatim) {
  for (uint32_t version : {2u, 3u}) {
    const auto img = samples::nested_image(version);
    GgufFile f = GgufFile::from_memory(img.data(), img.size(), "nested.gguf");
    EXPECT_EQ(copy_of(f).write_memory(), img) << version;
  }
}

TEST(GgufWriter, WriteFileEqualsWriteMemory) {
  GgufWriter w = samples::minimal_writer();
  const auto path =
      (fs::temp_directory_path() / ("bonsai_writer_" + std::to_string(::getpid()) + ".gguf")).string();
  size_t calls = 0;
  w.write_file(path, [&](size_t done, size_t total) {
    ++calls;
    EXPECT_EQ(total, 2u);
    EXPECT_EQ(done, calls);
  });
  EXPECT_EQ(calls, 2u);
  EXPECT_EQ(read_all(path), w.write_memory());
  GgufFile f = GgufFile::open(path);  // the mmap path reads what the memory path reads
  EXPECT_EQ(f.tensor("b.weight").nbytes, 32u);
  std::remove(path.c_str());
}

TEST(GgufWriter, AlignmentKeySetsDataAlignment) {
  for (uint32_t al : {1u, 64u, 256u}) {
    GgufWriter w;
    w.set_alignment(al);
    w.add_tensor_bytes("a", ggml_type::F32, {3}, samples::f32_bytes({1, 2, 3}));
    w.add_tensor_bytes("b", ggml_type::F32, {1}, samples::f32_bytes({4}));
    const auto img = w.write_memory();
    GgufFile f = GgufFile::from_memory(img.data(), img.size(), "al.gguf");
    EXPECT_EQ(f.alignment(), al);
    EXPECT_EQ(f.data_offset() % al, 0u);
    // a occupies 12 bytes; b starts at the next multiple of the alignment.
    EXPECT_EQ(f.tensor("b").offset, (12 + al - 1) / al * al) << al;
    EXPECT_EQ(img.size() - f.data_offset(), f.tensor("b").offset + (4 + al - 1) / al * al) << al;
  }
  // The same key given as a plain value (as a copy does) has the same effect.
  GgufWriter w;
  w.add_u64("general.alignment", 64);
  w.add_tensor_bytes("a", ggml_type::F32, {3}, samples::f32_bytes({1, 2, 3}));
  w.add_tensor_bytes("b", ggml_type::F32, {1}, samples::f32_bytes({4}));
  const auto img = w.write_memory();
  GgufFile f = GgufFile::from_memory(img.data(), img.size(), "al64.gguf");
  EXPECT_EQ(f.tensor("b").offset, 64u);
}

TEST(GgufWriter, RejectsBadInput) {
  GgufWriter w;
  EXPECT_THROW(w.set_alignment(0), Error);
  EXPECT_THROW(w.set_alignment(48), Error);
  EXPECT_THROW(w.add_array_raw("k", GgufType::STRING, nullptr, 0), Error);
  w.add_tensor("short", ggml_type::F32, {4}, 16, [](ByteSink& s) {
    const uint8_t b[8] = {};
    s.write(b, sizeof b);
  });
  try {
    (void)w.write_memory();
    FAIL() << "a producer writing fewer bytes than declared must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'short'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(w.write_file("/nonexistent-dir/x.gguf"), Error);
}

// Every fixture model: parse, copy everything into a writer, and the bytes
// come out identical. This pins the writer to the layout the reference
// converter (gguf-py) produces: padding after the tensor infos and after every
// tensor (the last one included), offsets relative to the data section.
TEST(GgufWriter, FixturesRoundTripByteForByte) {
  const fs::path dir = BONSAI_FIXTURES_DIR;
  if (!fs::is_directory(dir)) GTEST_SKIP() << "fixtures folder not found: " << dir;
  const char* files[] = {"tiny-b128/model.pq2_0.gguf", "tiny-b128/model.ptq1_0.gguf",
                         "small-b1024/model.pq2_0.gguf", "tiny-tied/model.pq2_0.gguf",
                         "tokenizer/qwen3-vocab.gguf"};
  for (const char* rel : files) {
    SCOPED_TRACE(rel);
    const std::string path = (dir / rel).string();
    ASSERT_TRUE(fs::exists(path)) << path;
    GgufFile f = GgufFile::open(path);
    const auto original = read_all(path);
    const auto copy = copy_of(f).write_memory();
    ASSERT_EQ(copy.size(), original.size());
    const auto mismatch = std::mismatch(copy.begin(), copy.end(), original.begin());
    EXPECT_TRUE(mismatch.first == copy.end())
        << "first difference at byte " << (mismatch.first - copy.begin());
  }
}

}  // namespace
}  // namespace bonsai
