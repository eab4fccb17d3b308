// Writes fuzz_model's seed corpus: small valid qwen35 models from the
// synthetic writer (src/synth), each of which must load (config, Hadamard
// metadata, weights) and, where it has a vocabulary, tokenize; a seed that
// does not load teaches the fuzzer nothing about the deep paths.
//   fuzz_model_seeds OUT_DIR [--with-tiny]
// The "mini" shape (tests/synth_mini.h: 2 layers, width 128, one GDN and one
// attention layer) is the smallest the writer accepts (folded widths are
// multiples of 128), so the files stay around 100 KB and the fuzzer's
// mutations stay fast. The
// variants cover each ternary format, both ways of giving the layer kinds
// (full_attention_interval / attention.recurrent_layers), the tied head
// (prism.hadamard.version 2), BF16/F16 alpha/beta, no vocabulary, identity
// signs, and the unrotated F32 twin (no prism.hadamard keys). --with-tiny adds the `tiny`
// preset (about 1 MB; it needs a larger -max_len).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/gguf_writer.h"
#include "bonsai/model.h"
#include "bonsai/synth.h"
#include "bonsai/tokenizer.h"
#include "synth_mini.h"

using namespace bonsai;

namespace {

SynthOptions mini() { return bonsai::testing::synth_mini(); }

// Loads the file the way fuzz_model does (from memory), so a seed is known to
// reach the success path.
void check(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto m = Model::from_gguf(GgufFile::from_memory(bytes.data(), bytes.size(), path));
  if (m->has_vocab()) Tokenizer::from_gguf(m->file());
  fmt::print("{} ({} bytes{})\n", path, bytes.size(), m->has_vocab() ? ", vocabulary" : "");
}

void model(const std::string& dir, const std::string& name, const SynthOptions& o) {
  const std::string path = dir + "/" + name + ".gguf";
  write_synthetic_model(o, path);
  check(path);
}

// The same model with prism.hadamard.sign_mode = identity and no sign keys.
// The writer only produces explicit signs, and the fuzzer did not turn
// "explicit" into "identity" (plus drop the sign keys) in ~37 minutes.
void identity_copy(const std::string& dir, const std::string& name, const std::string& src) {
  const GgufFile f = GgufFile::open(src);
  GgufWriter w(f.version());
  for (const auto& [k, v] : f.metadata()) {
    if (k == "prism.hadamard.sign_widths" || k == "prism.hadamard.sign_values") continue;
    if (k == "prism.hadamard.sign_mode") {
      w.add_string(k, "identity");
      continue;
    }
    w.add_value(k, v);
  }
  for (const auto& t : f.tensors())
    w.add_tensor_bytes(t.name, t.ggml_type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  const std::string path = dir + "/" + name + ".gguf";
  w.write_file(path);
  check(path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::string(argv[2]) != "--with-tiny")) {
    fmt::print(stderr, "usage: {} OUT_DIR [--with-tiny]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    std::filesystem::create_directories(dir);
    model(dir, "mini_pq2", mini());

    SynthOptions o = mini();
    o.weight_type = DType::PTQ1_0;
    o.with_vocab = false;
    model(dir, "mini_ptq1_novocab", o);
    identity_copy(dir, "mini_ptq1_identity", dir + "/mini_ptq1_novocab.gguf");

    o = mini();
    o.weight_type = DType::Q2_0_G128;
    o.ab_type = DType::BF16;
    model(dir, "mini_q2g128_bf16", o);

    o = mini();
    o.weight_type = DType::Q2_0_G64;
    o.ab_type = DType::F16;
    o.with_vocab = false;
    model(dir, "mini_q2g64_f16", o);

    o = mini();
    o.config.tied_output = true;
    o.hadamard_version = 2;
    o.config.recurrent = {0, 1};  // no interval gives this order: attention.recurrent_layers array
    model(dir, "mini_tied_v2_layers", o);

    o = mini();
    o.with_vocab = false;
    o.config.n_vocab = 128;
    const std::string twin = dir + "/mini_f32_twin.gguf";
    write_unfolded_f32_twin(o, twin);
    check(twin);

    if (argc == 3) model(dir, "tiny_pq2", synth_preset("tiny"));
  } catch (const Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
