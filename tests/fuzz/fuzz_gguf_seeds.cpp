// Writes the fuzzer's seed corpus: a few small valid GGUF files covering every
// metadata value type, nested arrays, versions 2 and 3, non-default alignment
// and one tensor of every format bonsai computes with (Q2_0 in both layouts).
//   fuzz_gguf_seeds OUT_DIR
#include <cstdio>
#include <string>

#include <fmt/core.h>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "gguf_samples.h"

using namespace bonsai;

namespace {

void save(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  // Every seed must be valid, or it teaches the fuzzer nothing about the deep paths.
  GgufFile::from_memory(bytes.data(), bytes.size(), name);
  std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) fail("{}: cannot write", path);
  std::fclose(f);
  fmt::print("{} ({} bytes)\n", path, bytes.size());
}

void add_formats(GgufWriter& w) {
  w.add_tensor_bytes("f16", ggml_type::F16, {4}, samples::pattern_bytes(8, 1));
  w.add_tensor_bytes("bf16", ggml_type::BF16, {2, 2}, samples::pattern_bytes(8, 2));
  w.add_tensor_bytes("q8", ggml_type::Q8_0, {32}, samples::pattern_bytes(34, 3));
  w.add_tensor_bytes("pq2", ggml_type::PQ2_0, {128}, samples::ternary_bytes(DType::PQ2_0, 128, 4));
  w.add_tensor_bytes("ptq1", ggml_type::PTQ1_0, {128}, samples::ternary_bytes(DType::PTQ1_0, 128, 5));
  w.add_tensor_bytes("q1", ggml_type::Q1_0, {128}, samples::ternary_bytes(DType::Q1_0, 128, 6));
  // Q2_0's two readings differ by n/64 bytes; below the alignment both fit the
  // padded space and the reader rightly refuses to guess, so these are large.
  w.add_tensor_bytes("q2g128", ggml_type::Q2_0, {256, 16}, samples::ternary_bytes(DType::Q2_0_G128, 4096, 7));
  w.add_tensor_bytes("q2g64", ggml_type::Q2_0, {64, 64}, samples::ternary_bytes(DType::Q2_0_G64, 4096, 8));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: {} OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    save(dir, "minimal.gguf", samples::minimal_writer().write_memory());

    GgufWriter types;
    samples::add_every_value_type(types);
    save(dir, "every_type.gguf", types.write_memory());

    save(dir, "nested_v2.gguf", samples::nested_image(2));

    GgufWriter fmts;
    fmts.set_alignment(64);
    fmts.add_string("general.architecture", "qwen35");
    add_formats(fmts);
    save(dir, "formats_align64.gguf", fmts.write_memory());

    GgufWriter packed(2);
    packed.set_alignment(1);
    add_formats(packed);
    save(dir, "formats_align1_v2.gguf", packed.write_memory());
  } catch (const Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
