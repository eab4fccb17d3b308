// Synthetic Bonsai 2 (qwen35) model writer: every engine test and benchmark
// runs on files written here, because real weights cannot be downloaded.
//
// The files follow the conventions of a real converted file (SPEC §1-§3):
// the qwen35 keys ModelConfig::from_gguf reads, the tensor list and order of
// tensor_inventory(), ternary weights in a Walsh-Hadamard-folded basis with
// the prism.hadamard.* keys, and (optionally) a GPT-2 byte-level BPE
// vocabulary. Weights are random but chosen so activations stay O(1):
//   ternary codes -1/0/+1 with p ~ 31/38/31 % (E[c^2] ~ 0.62), one scale per
//   128 inputs d ~ 1/sqrt(0.62 K) * (1 +- 30 %) (K = input width), so a
//   folded matvec maps an O(1) activation to an O(1) one.
// Output is a pure function of the options: every tensor (every row of a
// matrix) draws from its own RNG stream keyed by (seed, tensor name, row), so
// the bytes are identical run to run, and PQ2_0 / PTQ1_0 / Q2_0 files with the
// same seed hold the same values (Q2_0 g64 repeats each 128-block scale).
//
// Writing streams: tensors are produced in row chunks at write time, so the
// 27B preset (7.1 GB) never holds a tensor in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "bonsai/config.h"
#include "bonsai/formats.h"

namespace bonsai {

struct SynthOptions {
  ModelConfig config;                // shapes; config.tied_output = no output.weight
  DType weight_type = DType::PQ2_0;  // every ternary tensor: PQ2_0 | PTQ1_0 | Q2_0_G128 | Q2_0_G64
  DType ab_type = DType::F32;        // ssm_alpha / ssm_beta: F32 | F16 | BF16
  uint32_t hadamard_block = 128;     // power of two dividing every folded input width
  uint32_t hadamard_version = 1;     // 1 | 2; a tied head needs 2 (prism.hadamard.tied_output)
  uint64_t seed = 0;
  bool with_vocab = true;             // false: tokenizer.ggml.model = no_vocab (like the fixtures)
  std::string name = "bonsai-synth";  // general.name
};

// "tiny" (fixture tiny-b128 shape, vocab 1024), "small" (fixture small-b1024
// shape, vocab 2048), "27b" (ModelConfig::bonsai2_27b(), block 1024, BF16
// alpha/beta). Throws bonsai::Error for another name.
SynthOptions synth_preset(std::string_view name);
std::vector<std::string> synth_preset_names();

// Distinct input widths K of the folded (ternary, rotated) tensors in
// ascending order: the prism.hadamard.sign_widths of the file. The embedding
// width n_embd is always among them.
std::vector<uint32_t> folded_input_widths(const ModelConfig& c);

// Throws bonsai::Error naming the field when the options cannot be written
// (config inconsistent, block not a power of two dividing every folded K,
// K not a multiple of 128, tied head without version 2, vocab too small, ...).
void validate_synth_options(const SynthOptions& o);

// Smallest n_vocab a file with a vocabulary can have: 256 byte tokens + 5 specials.
inline constexpr uint32_t kSynthMinVocab = 261;

struct SynthProgress {
  size_t tensors_done = 0, tensors_total = 0;
  uint64_t bytes_done = 0, bytes_total = 0;  // tensor data bytes
};
using SynthProgressFn = std::function<void(const SynthProgress&)>;

// Sum of the tensor data bytes (no alignment padding) the model file holds.
uint64_t synth_tensor_bytes(const SynthOptions& o);

// Writes the model. Throws bonsai::Error on invalid options or I/O failure.
// `progress` (optional) is called after each tensor.
void write_synthetic_model(const SynthOptions& o, const std::string& path,
                           const SynthProgressFn& progress = {});

// The mathematically equivalent UNROTATED F32 twin: same metadata without the
// prism.hadamard keys, every tensor F32. For a folded weight with stored
// (dequantized) row w of width K the twin row is s_K ⊙ FWHT_B(w)/√B, because
// y = W·R·x with R = H·S/√B blockwise (H symmetric) gives (W·R)ᵀ row-wise;
// ssm_out's input columns additionally go from grouped to tiled head order;
// token_embd rows are s_E ⊙ FWHT_B(z)/√B (SPEC §3). A tied head stays tied.
// Both files produce the same logits; the twin tests the rotation.
uint64_t unfolded_f32_twin_bytes(const SynthOptions& o);  // tensor data bytes
inline constexpr uint64_t kMaxTwinBytes = 2ull << 30;     // refused above this
void write_unfolded_f32_twin(const SynthOptions& o, const std::string& path,
                             const SynthProgressFn& progress = {});

// ---- vocabulary ----------------------------------------------------------------
// GPT-2 byte-level BPE: ids 0..255 are the 256 byte tokens in bytes_to_unicode
// order ("!" = 0, like GPT-2 / Qwen), then tokens learned by BPE training on a
// built-in English text (pre-tokenised with the qwen35 regex; merges never
// cross a pre-token; most frequent pair first, ties to the smaller (left,
// right) id pair), then, when the text runs out of pairs before n_vocab - 5
// tokens, filler tokens "filler_NNNNNN" (no merge produces them; they hold two
// or more digits, which the qwen35 pre-tokeniser never keeps together), then
// the 5 special tokens: <|endoftext|>, <|im_start|>, <|im_end|> (type 3,
// control), <think>, </think> (type 4, user-defined).
struct SynthVocab {
  std::vector<std::string> tokens;  // byte-level strings, by id
  std::vector<int32_t> types;       // 1 normal, 3 control, 4 user-defined
  std::vector<std::string> merges;  // "a b", rank order
  uint32_t n_learned = 0;           // tokens made by merges (ids 256 .. 256+n_learned-1)
  uint32_t n_filler = 0;            // filler tokens after them
  uint32_t bos_id = 0;              // = padding = <|endoftext|>
  uint32_t eos_id = 0;              // <|im_end|>
  uint32_t im_start_id = 0;
};
SynthVocab build_synth_vocab(uint32_t n_vocab);  // n_vocab >= kSynthMinVocab
std::string_view synth_chat_template();          // Qwen-style ChatML Jinja template
std::string_view synth_training_text();          // the built-in English text
// The GPT-2 bytes_to_unicode mapping: byte b -> UTF-8 of its code point.
std::string byte_to_unicode(uint8_t b);

}  // namespace bonsai
