// GgufFile: every metadata value type (v2 and v3), alignment handling, typed
// getter errors, and Q2_0 layout resolution.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
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

// Runs f, expects a bonsai::Error whose message contains every needle.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string_view> needles) {
  try {
    f();
    ADD_FAILURE() << "expected bonsai::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (auto n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

class ReaderVersions : public ::testing::TestWithParam<uint32_t> {};

TEST_P(ReaderVersions, EveryValueType) {
  GgufWriter w(GetParam());
  samples::add_every_value_type(w);
  const auto img = w.write_memory();
  GgufFile f = GgufFile::from_memory(img.data(), img.size(), "types.gguf");
  EXPECT_EQ(f.version(), GetParam());
  EXPECT_EQ(f.path(), "types.gguf");
  EXPECT_EQ(f.file_size(), img.size());
  EXPECT_TRUE(f.tensors().empty());

  // Metadata keeps file order.
  ASSERT_EQ(f.metadata().size(), 21u);
  EXPECT_EQ(f.metadata()[0].first, "t.u8");
  EXPECT_EQ(f.metadata()[20].first, "t.arr_empty");

  const std::pair<const char*, GgufType> types[] = {
      {"t.u8", GgufType::U8},        {"t.i8", GgufType::I8},     {"t.u16", GgufType::U16},
      {"t.i16", GgufType::I16},      {"t.u32", GgufType::U32},   {"t.i32", GgufType::I32},
      {"t.u64", GgufType::U64},      {"t.i64", GgufType::I64},   {"t.f32", GgufType::F32},
      {"t.f64", GgufType::F64},      {"t.bool", GgufType::BOOL}, {"t.string", GgufType::STRING},
      {"t.arr_str", GgufType::ARRAY}};
  for (const auto& [k, t] : types) EXPECT_EQ(f.get(k).type, t) << k;

  // Raw bits of the scalars, as written.
  EXPECT_EQ(f.get("t.u8").bits, 200u);
  EXPECT_EQ(f.get("t.i8").as_i64(), -100);
  EXPECT_EQ(f.get("t.i16").as_i64(), -30000);
  EXPECT_EQ(f.get("t.u64").as_u64(), 18000000000000000000ull);
  EXPECT_EQ(f.get("t.i64").as_i64(), -9000000000000000000ll);
  EXPECT_EQ(f.get("t.f32").as_f64(), 0.15625);
  EXPECT_EQ(f.get("t.f64").as_f64(), -1e300);
  EXPECT_TRUE(f.get("t.f64").is_float());
  EXPECT_TRUE(f.get("t.u16").is_integer());
  EXPECT_FALSE(f.get("t.string").is_numeric());

  // The getters convert within range.
  EXPECT_EQ(f.get_f64("t.i32"), -2000000000.0);
  EXPECT_EQ(f.get_u64("t.u16"), 60000u);
  EXPECT_EQ(f.get_i64("t.u32"), 4000000000ll);
  EXPECT_EQ(f.get_u32("t.u8"), 200u);

  const GgufValue& s = f.get_array("t.arr_str");
  EXPECT_EQ(s.elem_type, GgufType::STRING);
  EXPECT_EQ(s.strings, (std::vector<std::string_view>{"a", "", "\xE2\x82\xAC"}));
  const GgufValue& b = f.get_array("t.arr_bool", GgufType::BOOL);
  EXPECT_EQ(b.count, 3u);
  EXPECT_EQ(b.elem_i64(0) + b.elem_i64(1) + b.elem_i64(2), 2);
  const GgufValue& u = f.get_array("t.arr_u64");
  EXPECT_EQ(u.elem_i64(0), 1ll << 40);
  EXPECT_EQ(f.get_array("t.arr_f64").elem_f64(0), 0.1);

  // Summaries (used by inspect) abbreviate arrays and quote strings.
  EXPECT_EQ(f.get("t.arr_i32").summary(2), "[i32 x 4: 1, -1, ...]");
  EXPECT_EQ(f.get("t.arr_str").summary(), "[string x 3: \"a\", \"\", \"\xE2\x82\xAC\"]");
  EXPECT_EQ(f.get("t.bool").summary(), "true");
  EXPECT_EQ(f.get("t.u64").summary(), "18000000000000000000");
  EXPECT_EQ(f.get("t.i8").summary(), "-100");
  EXPECT_EQ(f.get("t.arr_empty").summary(), "[u16 x 0: ]");
}

TEST_P(ReaderVersions, NestedArrays) {
  const auto img = samples::nested_image(GetParam());
  GgufFile f = GgufFile::from_memory(img.data(), img.size(), "nested.gguf");
  EXPECT_EQ(f.version(), GetParam());
  const GgufValue& v = f.get_array("t.nested", GgufType::ARRAY);
  ASSERT_EQ(v.count, 2u);
  ASSERT_EQ(v.nested.size(), 2u);
  EXPECT_EQ(v.nested[0].type, GgufType::ARRAY);
  EXPECT_EQ(v.nested[0].elem_type, GgufType::I16);
  EXPECT_EQ(v.nested[0].elem_i64(0), 5);
  EXPECT_EQ(v.nested[0].elem_i64(1), -6);
  EXPECT_EQ(v.nested[1].elem_type, GgufType::STRING);
  ASSERT_EQ(v.nested[1].strings.size(), 1u);
  EXPECT_EQ(v.nested[1].strings[0], "xy");
  EXPECT_EQ(v.summary(), "[array x 2: [i16 x 2: 5, -6], [string x 1: \"xy\"]]");
}

INSTANTIATE_TEST_SUITE_P(V2V3, ReaderVersions, ::testing::Values(2u, 3u));

TEST(GgufReader, DefaultAlignmentIs32) {
  const auto img = samples::minimal_writer().write_memory();
  GgufFile f = GgufFile::from_memory(img.data(), img.size(), "min.gguf");
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_FALSE(f.has("general.alignment"));
  EXPECT_EQ(f.data_offset() % 32, 0u);
  const GgufTensor& a = f.tensor("a.weight");
  const GgufTensor& b = f.tensor("b.weight");
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(b.offset, 32u);  // a's 32 bytes end exactly on the boundary
  EXPECT_EQ(b.ne, (std::vector<uint64_t>{4, 2}));
  EXPECT_EQ(b.nelements, 8u);
  EXPECT_EQ(b.nbytes, 32u);
  EXPECT_EQ(b.dim(1), 2u);
  EXPECT_EQ(b.dim(3), 1u);
  EXPECT_EQ(b.shape_str(), "{4, 2}");
  EXPECT_EQ(b.data, img.data() + f.data_offset() + 32);
  EXPECT_EQ(f.base(), img.data());
}

// Alignment 64 and 1: offsets, padding and data pointers follow the key.
TEST(GgufReader, NonDefaultAlignment) {
  for (uint32_t al : {64u, 1u}) {
    SCOPED_TRACE(al);
    GgufWriter w;
    w.set_alignment(al);
    w.add_tensor_bytes("x", ggml_type::F32, {5}, samples::f32_bytes({1, 2, 3, 4, 5}));
    w.add_tensor_bytes("y", ggml_type::F16, {3}, samples::pattern_bytes(6, 1));
    w.add_tensor_bytes("z", ggml_type::F32, {1}, samples::f32_bytes({7}));
    const auto img = w.write_memory();
    GgufFile f = GgufFile::from_memory(img.data(), img.size(), "al.gguf");
    EXPECT_EQ(f.alignment(), al);
    EXPECT_EQ(f.get_u32("general.alignment"), al);
    EXPECT_EQ(f.data_offset() % al, 0u);
    const uint64_t y_off = al == 1 ? 20 : 64, z_off = al == 1 ? 26 : 128;
    EXPECT_EQ(f.tensor("y").offset, y_off);
    EXPECT_EQ(f.tensor("z").offset, z_off);
    float z;
    dequantize_row(DType::F32, f.tensor("z").data, &z, 1);
    EXPECT_EQ(z, 7.0f);
    EXPECT_EQ(img.size(), f.data_offset() + z_off + (al == 1 ? 4 : 64));
  }
}

// A small file opened through the mmap path; open() errors name the path.
TEST(GgufReader, OpenFromDisk) {
  const auto dir = fs::temp_directory_path();
  const std::string path = (dir / ("bonsai_reader_" + std::to_string(::getpid()) + ".gguf")).string();
  samples::minimal_writer().write_file(path);
  {
    GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.get_string("general.architecture"), "qwen35");
    GgufFile moved = std::move(f);
    EXPECT_EQ(moved.tensor("a.weight").nbytes, 32u);
  }
  // An empty file is truncated at the magic.
  {
    std::FILE* fp = std::fopen(path.c_str(), "wb");
    std::fclose(fp);
  }
  expect_error([&] { GgufFile::open(path); }, {path, "magic"});
  std::remove(path.c_str());
  expect_error([&] { GgufFile::open(path); }, {path, "cannot open"});
  expect_error([&] { GgufFile::open(dir.string()); }, {dir.string(), "not a regular file"});
}

TEST(GgufReader, GetterErrorsNameFileAndKey) {
  GgufWriter w;
  samples::add_every_value_type(w);
  w.add_i32("t.negative", -5);
  w.add_u64("t.huge", 1ull << 63);
  const auto img = w.write_memory();
  GgufFile f = GgufFile::from_memory(img.data(), img.size(), "getters.gguf");
  const char* file = "getters.gguf";

  expect_error([&] { f.get("no.such.key"); }, {file, "'no.such.key'", "missing"});
  expect_error([&] { f.get_u64("no.such.key"); }, {file, "'no.such.key'"});
  expect_error([&] { f.get_string("no.such.key"); }, {file, "'no.such.key'"});
  expect_error([&] { f.get_array("no.such.key"); }, {file, "'no.such.key'"});
  expect_error([&] { f.tensor("no.such.tensor"); }, {file, "'no.such.tensor'"});

  expect_error([&] { f.get_u64("t.string"); }, {file, "'t.string'", "string", "integer"});
  expect_error([&] { f.get_i64("t.f32"); }, {file, "'t.f32'", "f32", "integer"});
  expect_error([&] { f.get_u32("t.bool"); }, {file, "'t.bool'", "bool"});
  expect_error([&] { f.get_f64("t.arr_f32"); }, {file, "'t.arr_f32'", "array", "number"});
  expect_error([&] { f.get_bool("t.u8"); }, {file, "'t.u8'", "u8", "bool"});
  expect_error([&] { f.get_string("t.arr_str"); }, {file, "'t.arr_str'", "array", "string"});
  expect_error([&] { f.get_array("t.string"); }, {file, "'t.string'", "string", "array"});
  expect_error([&] { f.get_array("t.arr_str", GgufType::I32); }, {file, "'t.arr_str'", "string", "i32"});

  // Out-of-range conversions.
  expect_error([&] { f.get_u64("t.negative"); }, {file, "'t.negative'", "-5", "negative"});
  expect_error([&] { f.get_u32("t.u64"); }, {file, "'t.u64'", "32 bits"});
  expect_error([&] { f.get_i64("t.huge"); }, {file, "'t.huge'", "out of range"});
  EXPECT_EQ(f.get_u64("t.huge"), 1ull << 63);

  // Optional getters: fallback only when absent, still typed when present.
  EXPECT_EQ(f.get_u64_or("absent", 9), 9u);
  EXPECT_EQ(f.get_u64_or("t.u16", 9), 60000u);
  EXPECT_EQ(f.get_f64_or("absent", 0.5), 0.5);
  EXPECT_EQ(f.get_bool_or("absent", true), true);
  EXPECT_EQ(f.get_bool_or("t.bool", false), true);
  EXPECT_EQ(f.get_string_or("absent", "fb"), "fb");
  expect_error([&] { f.get_string_or("t.u8", "fb"); }, {file, "'t.u8'"});
  expect_error([&] { f.get_bool_or("t.string", false); }, {file, "'t.string'"});
  EXPECT_EQ(f.find("absent"), nullptr);
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
}

// Float -> integer conversions saturate instead of invoking undefined
// behaviour (fuzzer finding: elem_i64 on an f64 array holding -1e270).
TEST(GgufReader, FloatToIntegerSaturates) {
  GgufWriter w;
  const double f64s[] = {-1e270, 1e300, std::numeric_limits<double>::quiet_NaN(), -2.75, 3.5};
  w.add_array_raw("t.f64s", GgufType::F64, f64s, 5);
  w.add_f32("t.f32_inf", std::numeric_limits<float>::infinity());
  const auto img = w.write_memory();
  GgufFile f = GgufFile::from_memory(img.data(), img.size(), "sat.gguf");
  const GgufValue& a = f.get_array("t.f64s");
  EXPECT_EQ(a.elem_i64(0), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(a.elem_i64(1), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(a.elem_i64(2), 0);
  EXPECT_EQ(a.elem_i64(3), -2);  // truncation toward zero, like a cast
  EXPECT_EQ(a.elem_i64(4), 3);
  EXPECT_EQ(f.get("t.f32_inf").as_i64(), std::numeric_limits<int64_t>::max());
}

// ---- Q2_0: one type id, two layouts; the space a tensor occupies decides ----

// Q2_0's readings of n elements need n/128*34 (g128) and n/64*18 (g64) bytes,
// which differ by n/64. With alignment 32 a tensor of 4096 elements is far from
// ambiguous (difference 64 >= 32).
TEST(GgufQ2_0, ResolvesG128AndG64InOneFile) {
  GgufWriter w;
  const auto g128 = samples::ternary_bytes(DType::Q2_0_G128, 4096, 1);
  const auto g64 = samples::ternary_bytes(DType::Q2_0_G64, 4096, 2);
  ASSERT_EQ(g128.size(), 32u * 34);
  ASSERT_EQ(g64.size(), 64u * 18);
  w.add_tensor_bytes("legacy", ggml_type::Q2_0, {256, 16}, g128);
  w.add_tensor_bytes("mainline", ggml_type::Q2_0, {64, 64}, g64);
  w.add_tensor_bytes("after", ggml_type::F32, {1}, samples::f32_bytes({1}));
  const auto img = w.write_memory();
  GgufFile f = GgufFile::from_memory(img.data(), img.size(), "q2.gguf");
  const GgufTensor& a = f.tensor("legacy");
  const GgufTensor& b = f.tensor("mainline");
  EXPECT_EQ(a.dtype, DType::Q2_0_G128);
  EXPECT_EQ(a.nbytes, g128.size());
  EXPECT_EQ(b.dtype, DType::Q2_0_G64);
  EXPECT_EQ(b.nbytes, g64.size());
  EXPECT_EQ(a.ggml_type, ggml_type::Q2_0);
  EXPECT_EQ(b.ggml_type, ggml_type::Q2_0);
  // The resolved layout decodes to the values that were encoded.
  std::vector<float> x(4096), y(4096);
  dequantize_row(a.dtype, a.data, x.data(), 4096);
  dequantize_row(DType::Q2_0_G128, g128.data(), y.data(), 4096);
  EXPECT_EQ(x, y);
  dequantize_row(b.dtype, b.data, x.data(), 4096);
  dequantize_row(DType::Q2_0_G64, g64.data(), y.data(), 4096);
  EXPECT_EQ(x, y);
}

// ne[0] = 64 (not a multiple of 128) can only be g64; the size still has to fit.
TEST(GgufQ2_0, Ne0Of64IsG64) {
  GgufWriter w;
  w.set_alignment(1);
  w.add_tensor_bytes("m", ggml_type::Q2_0, {64, 3}, samples::ternary_bytes(DType::Q2_0_G64, 192, 3));
  const auto img = w.write_memory();
  GgufFile f = GgufFile::from_memory(img.data(), img.size(), "q2_64.gguf");
  EXPECT_EQ(f.tensor("m").dtype, DType::Q2_0_G64);
  EXPECT_EQ(f.tensor("m").nbytes, 54u);
}

TEST(GgufQ2_0, BothReadingsFitIsAnError) {
  // 128 elements: g128 needs 34 bytes, g64 36; the 34 bytes are padded to 64,
  // and both readings fit the padded space.
  GgufWriter w;
  w.add_tensor_bytes("small", ggml_type::Q2_0, {128}, samples::ternary_bytes(DType::Q2_0_G128, 128, 4));
  const auto img = w.write_memory();
  expect_error([&] { GgufFile::from_memory(img.data(), img.size(), "amb.gguf"); },
               {"amb.gguf", "'small'", "ambiguous", "group-128", "34", "group-64", "36"});
}

TEST(GgufQ2_0, NeitherReadingFitsIsAnError) {
  // 256 elements: g128 needs 68 bytes, g64 72; give it 100 (alignment 1, so
  // the space is exactly what follows).
  GgufWriter w;
  w.set_alignment(1);
  w.add_tensor_bytes("odd", ggml_type::Q2_0, {256}, samples::pattern_bytes(100, 5));
  const auto img = w.write_memory();
  expect_error([&] { GgufFile::from_memory(img.data(), img.size(), "neither.gguf"); },
               {"neither.gguf", "'odd'", "inconsistent", "68", "72", "100"});
}

// ---- fixtures -------------------------------------------------------------

TEST(GgufReader, FixtureModelsParse) {
  const fs::path dir = BONSAI_FIXTURES_DIR;
  if (!fs::is_directory(dir)) GTEST_SKIP() << "fixtures folder not found: " << dir;
  GgufFile f = GgufFile::open((dir / "tiny-b128/model.ptq1_0.gguf").string());
  EXPECT_EQ(f.get_string("general.architecture"), "qwen35");
  EXPECT_EQ(f.get_u64("qwen35.embedding_length"), 256u);
  const GgufTensor& e = f.tensor("token_embd.weight");
  EXPECT_EQ(e.dtype, DType::PTQ1_0);
  EXPECT_EQ(e.ne, (std::vector<uint64_t>{256, 512}));
  EXPECT_EQ(e.nbytes, 256u * 512 / 128 * 28);
  GgufFile p = GgufFile::open((dir / "tiny-b128/model.pq2_0.gguf").string());
  EXPECT_EQ(p.tensor("token_embd.weight").dtype, DType::PQ2_0);
  EXPECT_EQ(p.tensors().size(), f.tensors().size());
}

}  // namespace
}  // namespace bonsai
