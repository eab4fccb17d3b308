// Hostile model files: a small valid synthetic model (tests/synth_mini.h)
// rewritten with malformed qwen35 / prism.hadamard metadata or tensors. Each
// must be refused by Model::from_gguf with one bonsai::Error naming the file
// and the key — never loaded, never another exception, never a huge
// allocation. These are the model-loader findings of tests/fuzz/fuzz_model
// (and of reading the code it covers), kept here so CI checks them without
// clang; docs/building.md says how to run the fuzzer.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/gguf_writer.h"
#include "bonsai/model.h"
#include "bonsai/synth.h"
#include "synth_mini.h"
#include "temp_path.h"

namespace bonsai {
namespace {

using Image = std::vector<uint8_t>;
// Returns true when it wrote (or dropped) the key / tensor itself.
using MetaEdit = std::function<bool(const std::string&, const GgufValue&, GgufWriter&)>;
using TensorEdit = std::function<bool(const GgufTensor&, GgufWriter&)>;

const Image& base() {
  static const Image img = [] {
    const auto path = bonsai::testing::unique_temp_path("hostile_model_base.gguf");
    write_synthetic_model(bonsai::testing::synth_mini(), path.string());
    std::ifstream in(path, std::ios::binary);
    Image bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::filesystem::remove(path);
    return bytes;
  }();
  return img;
}

Image rewrite(const MetaEdit& meta, const TensorEdit& tensor = {}) {
  const Image& b = base();
  const GgufFile f = GgufFile::from_memory(b.data(), b.size(), "base.gguf");
  GgufWriter w(f.version());
  for (const auto& [k, v] : f.metadata())
    if (!meta || !meta(k, v, w)) w.add_value(k, v);
  for (const auto& t : f.tensors())
    if (!tensor || !tensor(t, w))
      w.add_tensor_bytes(t.name, t.ggml_type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  return w.write_memory();
}

// "" when the image loads; the message of the bonsai::Error otherwise. Any
// other exception is returned marked, so the expectations fail on it.
std::string load_error(const Image& img, const std::string& name) {
  try {
    Model::from_gguf(GgufFile::from_memory(img.data(), img.size(), name));
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("NOT a bonsai::Error: ") + e.what();
  }
  return "";
}

void expect_refused(const Image& img, const std::string& name, const std::string& field) {
  const std::string msg = load_error(img, name);
  EXPECT_EQ(msg.rfind(name + ": ", 0), 0u) << "message must start with the file: " << msg;
  EXPECT_NE(msg.find(field), std::string::npos) << "message must name " << field << ": " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

MetaEdit set_u32(const std::string& key, uint32_t v) {
  return [key, v](const std::string& k, const GgufValue&, GgufWriter& w) {
    if (k != key) return false;
    w.add_u32(k, v);
    return true;
  };
}

// Keeps the first `rows` rows of tensor `name` and sets its ne[1] to match.
TensorEdit keep_rows(const std::string& name, uint64_t rows) {
  return [name, rows](const GgufTensor& t, GgufWriter& w) {
    if (t.name != name) return false;
    const uint64_t row = t.nbytes / t.ne[1];
    w.add_tensor_bytes(t.name, t.ggml_type, {t.ne[0], rows},
                       std::vector<uint8_t>(t.data, t.data + rows * row));
    return true;
  };
}

TEST(HostileModel, BaseLoads) {
  // The cases below are refused because of their edits, not the base.
  EXPECT_EQ(load_error(rewrite({}), "same.gguf"), "");
}

// ssm.state_size = 2^31 with one key head: 2·n_k·d_state wrapped to 0 in the
// uint32 ModelConfig::ssm_conv_channels(), so attn_qkv / ssm_conv1d of
// ssm.inner_size rows matched and the model loaded; the forward pass would
// then read q and k 2^31 floats wide.
TEST(HostileModel, SsmStateSizeWrappingTheChannelCount) {
  const Image img =
      rewrite(set_u32("qwen35.ssm.state_size", 0x80000000u), [](const GgufTensor& t, GgufWriter& w) {
        return keep_rows("blk.0.attn_qkv.weight", 128)(t, w) ||
               keep_rows("blk.0.ssm_conv1d.weight", 128)(t, w);
      });
  expect_refused(img, "state_size.gguf", "ssm.state_size");
}

// attention.head_count = 2^26 + 2 with key_length 64: head_count x 64 wraps
// to 128 and 2 x head_count x 64 to 256, exactly the base's attn_output width
// and attn_q rows, so the shapes matched and the model loaded.
TEST(HostileModel, HeadCountWrappingTheAttentionWidths) {
  const Image img = rewrite(set_u32("qwen35.attention.head_count", (1u << 26) + 2));
  expect_refused(img, "head_count.gguf", "attention.head_count");
}

// fuzz_model finding (out-of-memory, malloc(654311426) in ModelConfig::from_gguf):
// block_count = 654311426 sized the per-layer vector (654 MB; 2^32-1 would be
// 4 GiB) before anything noticed that the file has 28 tensors.
TEST(HostileModel, BlockCountBeyondTheTensors) {
  for (uint32_t n : {654311426u, 0xFFFFFFFFu, 32u})
    expect_refused(rewrite(set_u32("qwen35.block_count", n)), "block_count.gguf", "qwen35.block_count");
}

// Adds `key` through `put` (written right after general.architecture) and drops any
// earlier value of it.
MetaEdit add_key(const std::string& key, std::function<void(GgufWriter&)> put) {
  return [key, put](const std::string& k, const GgufValue& v, GgufWriter& w) {
    if (k == key) return true;
    if (k != "general.architecture") return false;
    w.add_value(k, v);
    put(w);
    return true;
  };
}

MetaEdit both(MetaEdit a, MetaEdit b) {
  return [a, b](const std::string& k, const GgufValue& v, GgufWriter& w) { return a(k, v, w) || b(k, v, w); };
}

// Loader paths fuzz_model did not reach (docs/building.md, "Fuzzing"): each gets one
// error naming the file and the key or tensor.
TEST(HostileModel, TiedOutputNeedsVersion2) {
  const auto tied = add_key("prism.hadamard.tied_output",
                            [](GgufWriter& w) { w.add_bool("prism.hadamard.tied_output", true); });
  expect_refused(rewrite(both(tied, set_u32("prism.hadamard.version", 1))), "tied_v1.gguf",
                 "prism.hadamard.tied_output");
}

TEST(HostileModel, TiedOutputNextToAnOutputWeight) {
  const auto tied = add_key("prism.hadamard.tied_output",
                            [](GgufWriter& w) { w.add_bool("prism.hadamard.tied_output", true); });
  const std::string msg =
      load_error(rewrite(both(tied, set_u32("prism.hadamard.version", 2))), "tied_out.gguf");
  EXPECT_EQ(msg.rfind("tied_out.gguf: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("prism.hadamard.tied_output"), std::string::npos) << msg;
  EXPECT_NE(msg.find("output.weight"), std::string::npos) << msg;
}

TEST(HostileModel, InverseNamesWithoutTheEmbedding) {
  const auto none = add_key("prism.hadamard.inverse_weight_names", [](GgufWriter& w) {
    w.add_array_strings("prism.hadamard.inverse_weight_names", {});
  });
  expect_refused(rewrite(none), "inverse_empty.gguf", "prism.hadamard.inverse_weight_names");
  const auto other = add_key("prism.hadamard.inverse_weight_names", [](GgufWriter& w) {
    w.add_array_strings("prism.hadamard.inverse_weight_names", {"output.weight"});
  });
  expect_refused(rewrite(other), "inverse_other.gguf", "prism.hadamard.inverse_weight_names");
}

TEST(HostileModel, FoldedLinearOfAnIntegerType) {
  // A linear stored as I32 (right shape, right byte count; F32/F16/BF16 linears are valid, e.g. the
  // unrotated float twin): the loader must refuse the type rather than bind it.
  const std::string name = "blk.0.ffn_down.weight";
  const auto f32 = [name](const GgufTensor& t, GgufWriter& w) {
    if (t.name != name) return false;
    w.add_tensor_bytes(t.name, ggml_type::I32, t.ne, std::vector<uint8_t>(t.ne[0] * t.ne[1] * 4, 0));
    return true;
  };
  expect_refused(rewrite({}, f32), "i32_linear.gguf", name);
}

// context_length = 0 used to load and fail later in the session with a message
// that named no key.
TEST(HostileModel, ZeroContextLength) {
  expect_refused(rewrite(set_u32("qwen35.context_length", 0)), "ctx.gguf", "qwen35.context_length");
}

// sign_widths whose uint64 sum wraps around to the number of sign values:
// (2^63-1) + (2^63-1) + 130 = 2^64 + 128. The check passed and a sign vector
// of 2^63-1 floats was allocated (std::length_error, not a bonsai::Error).
TEST(HostileModel, SignWidthsSummingPastUint64) {
  const Image img = rewrite([](const std::string& k, const GgufValue&, GgufWriter& w) {
    if (k != "prism.hadamard.sign_widths") return false;
    const int64_t widths[] = {INT64_MAX, INT64_MAX, 130};
    w.add_array_raw(k, GgufType::I64, widths, 3);
    return true;
  });
  expect_refused(img, "sign_sum.gguf", "prism.hadamard.sign_widths");
}

// A width listed twice was meant to be refused, but the check looked in the
// map that is only filled afterwards; the second vector was silently dropped.
TEST(HostileModel, SignWidthListedTwice) {
  const Image img = rewrite([](const std::string& k, const GgufValue&, GgufWriter& w) {
    if (k == "prism.hadamard.sign_widths") {
      w.add_array_i32(k, std::vector<int32_t>{128, 128});
      return true;
    }
    if (k == "prism.hadamard.sign_values") {
      w.add_array_i32(k, std::vector<int32_t>(256, 1));
      return true;
    }
    return false;
  });
  const std::string msg = load_error(img, "twice.gguf");
  EXPECT_NE(msg.find("prism.hadamard.sign_widths': width 128 is listed twice"), std::string::npos) << msg;
}

}  // namespace
}  // namespace bonsai
