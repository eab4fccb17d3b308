// libFuzzer entry point for the model loader: the qwen35 config, the Hadamard
// metadata, the weight binding and the tokenizer, on top of the GGUF reader.
//
// Every input must either load or throw bonsai::Error; anything else (a crash,
// an ASan/UBSan report, another exception type such as std::bad_alloc, a
// leak, a hang) is a finding. The image is copied into an exactly sized heap
// buffer and loaded with Model::from_gguf(GgufFile::from_memory(...)) rather
// than through a file: an mmap'd file would hide reads past its end up to the
// page boundary, the heap copy lets ASan see them. (Model::load(path) is
// GgufFile::open + the same from_gguf.)
//
// On success the target touches what a caller would, without a forward pass:
// the config is re-validated, every bound weight is checked against the
// widths the graph derives from the config (in 64-bit, so a uint32 product
// that wrapped in the loader shows up as a mismatch), every byte of every
// weight is read (ASan checks the bounds), and the tokenizer and chat format
// load from the same file and encode/decode a short text.
#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bonsai/chat.h"
#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/model.h"
#include "bonsai/tokenizer.h"
#include "model/hadamard.h"
#include "model/weights.h"

namespace {

using bonsai::Weight;

[[noreturn]] void finding(const char* what) {
  // A message first, so a crash report says which property broke.
  std::fprintf(stderr, "fuzz_model: property violated: %s\n", what);
  __builtin_trap();
}

// Reads every byte of `w` and checks its geometry; `k` and `n` are the
// widths the graph would use, computed in 64-bit from the config.
size_t touch(const Weight& w, uint64_t k, uint64_t n, const bonsai::GgufFile& f) {
  if (w.data == nullptr) finding("a bound weight has no data");
  if (w.k <= 0 || w.n <= 0) finding("a bound weight has a non-positive dimension");
  if (static_cast<uint64_t>(w.k) != k || static_cast<uint64_t>(w.n) != n)
    finding("a bound weight's shape disagrees with the config (64-bit)");
  uint64_t want = 0;
  if (__builtin_mul_overflow(bonsai::row_bytes(w.type, k), n, &want) || want != w.nbytes)
    finding("a bound weight's byte size is not rows x row_bytes");
  // Either inside the image or a loader-owned F32 conversion (heap, exact size).
  const uint8_t* lo = f.base();
  const uint8_t* hi = f.base() + f.file_size();
  const bool in_image = w.data >= lo && w.data <= hi && w.nbytes <= static_cast<size_t>(hi - w.data);
  if (!in_image && w.type != bonsai::DType::F32) finding("a non-F32 weight points outside the image");
  size_t sink = 0;
  for (size_t i = 0; i < w.nbytes; ++i) sink += w.data[i];
  return sink;
}

size_t check_model(const bonsai::Model& m) {
  const bonsai::ModelConfig& c = m.config();
  try {
    c.validate("fuzz re-validate");  // the config a caller gets must pass its own checks
  } catch (const bonsai::Error&) {
    finding("the loaded config fails ModelConfig::validate");
  }
  const bonsai::GgufFile& f = m.file();
  const bonsai::ModelWeights& w = m.weights();
  const uint64_t E = c.n_embd, F = c.n_ff, V = c.n_vocab;
  if (w.layers.size() != c.n_layer || c.recurrent.size() != c.n_layer) finding("layer count");
  size_t s = 0;
  s += touch(w.tok_embd, E, V, f);
  s += touch(w.output_norm, E, 1, f);
  s += touch(w.output, E, V, f);
  const uint64_t H = c.n_head, HKV = c.n_head_kv, DK = c.head_dim_k, DV = c.head_dim_v;
  const uint64_t NK = c.ssm_n_k, NV = c.ssm_n_v, DS = c.ssm_d_state, DI = c.ssm_d_inner;
  const uint64_t C = 2 * NK * DS + DI;
  for (uint32_t il = 0; il < c.n_layer; ++il) {
    const bonsai::LayerWeights& L = w.layers[il];
    if (L.recurrent != (c.recurrent[il] != 0)) finding("layer kind");
    s += touch(L.attn_norm, E, 1, f);
    s += touch(L.post_norm, E, 1, f);
    s += touch(L.ffn_gate, E, F, f);
    s += touch(L.ffn_up, E, F, f);
    s += touch(L.ffn_down, F, E, f);
    if (L.recurrent) {
      if (DI % NV != 0) finding("ssm.inner_size not a multiple of time_step_rank");
      s += touch(L.ssm_qkv, E, C, f);
      s += touch(L.ssm_z, E, DI, f);
      s += touch(L.ssm_conv1d, c.ssm_conv, C, f);
      s += touch(L.ssm_dt_bias, NV, 1, f);
      s += touch(L.ssm_a, NV, 1, f);
      s += touch(L.ssm_alpha, E, NV, f);
      s += touch(L.ssm_beta, E, NV, f);
      s += touch(L.ssm_norm, DI / NV, 1, f);
      s += touch(L.ssm_out, DI, E, f);
    } else {
      s += touch(L.attn_q, E, 2 * H * DK, f);
      s += touch(L.attn_k, E, HKV * DK, f);
      s += touch(L.attn_v, E, HKV * DV, f);
      s += touch(L.attn_out, H * DV, E, f);
      s += touch(L.attn_q_norm, DK, 1, f);
      s += touch(L.attn_k_norm, DK, 1, f);
    }
  }
  if (const bonsai::HadamardSpec* h = m.hadamard()) {
    for (const auto& kv : h->signs) {
      if (kv.second.size() != static_cast<uint64_t>(kv.first))
        finding("a sign vector's length is not its width");
      if (kv.first % h->block != 0) finding("the block size does not divide a sign width");
    }
    if (h->explicit_signs && h->signs_for(c.n_embd) == nullptr) finding("no sign vector for n_embd");
  }
  s += m.has_vocab() + m.weight_bytes() + m.n_params();
  return s;
}

size_t check_tokenizer(const bonsai::GgufFile& f) {
  auto tok = bonsai::Tokenizer::from_gguf(f);
  size_t s = 0;
  const std::vector<int32_t> ids = tok->encode("Hello, world! <think>x</think> 12 caf\xc3\xa9\n", true);
  for (int32_t id : ids)
    if (id < 0 || id >= tok->n_vocab()) finding("encode produced an id outside the vocabulary");
  s += tok->decode(ids).size();
  for (int32_t id : {tok->bos(), tok->eos(), tok->pad()})
    if (id >= 0) s += tok->piece(id).size();
  const bonsai::ChatFormat chat = bonsai::ChatFormat::from_gguf(f, *tok);
  s += chat.stop_tokens().size();
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // the loader's warnings would flood the fuzzer's output
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Exactly sized copy so ASan catches any read past the end.
  std::vector<uint8_t> buf(data, data + size);
  size_t sink = 0;
  try {
    auto m = bonsai::Model::from_gguf(bonsai::GgufFile::from_memory(buf.data(), buf.size(), "fuzz.gguf"));
    sink += check_model(*m);
  } catch (const bonsai::Error&) {
  }
  // The tokenizer is loaded by text commands independently of the model, so
  // it is fuzzed even when the weights are refused.
  try {
    const bonsai::GgufFile f = bonsai::GgufFile::from_memory(buf.data(), buf.size(), "fuzz.gguf");
    sink += check_tokenizer(f);
  } catch (const bonsai::Error&) {
  }
  asm volatile("" : : "r"(sink));
  return 0;
}
