// qwen35 hyperparameters and the tensor inventory they imply.
//
// ModelConfig is read from the GGUF `qwen35.*` keys at run time (nothing is
// hard-coded for a model size). tensor_inventory() lists every tensor a
// Bonsai 2 file must contain, with its ggml-order shape and its role; the
// loader binds against it and the synthesizer writes from it, so the two can
// never disagree about names or shapes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace bonsai {

class GgufFile;

struct ModelConfig {
  uint32_t n_layer = 0;      // block_count
  uint32_t n_embd = 0;       // embedding_length
  uint32_t n_ff = 0;         // feed_forward_length
  uint32_t n_vocab = 0;      // vocab_size key, else tokenizer tokens, else token_embd rows
  uint32_t n_ctx_train = 0;  // context_length
  // full attention
  uint32_t n_head = 0, n_head_kv = 0;
  uint32_t head_dim_k = 0, head_dim_v = 0;  // key_length / value_length
  uint32_t n_rot = 0;                       // rope.dimension_count
  float rope_base = 10000.0f;
  std::array<int32_t, 4> rope_sections{};
  // gated delta net
  uint32_t ssm_d_state = 0;  // key/query head dim (128)
  uint32_t ssm_d_inner = 0;  // value width (n_v * head_v_dim)
  uint32_t ssm_n_v = 0;      // value heads (time_step_rank)
  uint32_t ssm_n_k = 0;      // key heads (group_count)
  uint32_t ssm_conv = 0;     // conv taps
  float rms_eps = 1e-6f;
  std::vector<uint8_t> recurrent;  // per layer: 1 = GatedDeltaNet, 0 = full attention
  bool tied_output = false;        // no output.weight: token_embd is the head

  uint32_t ssm_head_v_dim() const { return ssm_d_inner / ssm_n_v; }
  uint32_t ssm_qk_dim() const { return ssm_n_k * ssm_d_state; }  // width of q (and of k)
  uint32_t ssm_conv_channels() const { return 2 * ssm_qk_dim() + ssm_d_inner; }
  uint32_t attn_q_rows() const { return 2 * n_head * head_dim_k; }  // query|gate interleaved per head
  uint32_t attn_out_width() const { return n_head * head_dim_v; }

  // Reads and validates the qwen35 keys. `n_vocab_hint` is used when neither
  // qwen35.vocab_size nor a tokenizer is present (token_embd's rows).
  static ModelConfig from_gguf(const GgufFile& f);
  // The Bonsai 2 27B shape (for the synthesizer's `27b` preset and tests).
  static ModelConfig bonsai2_27b();
  void validate(const std::string& where) const;
};

enum class TensorRole : uint8_t {
  Folded,     // ternary linear, rotated on its input (prism.hadamard.weight_names)
  Embedding,  // token_embd: inverse-rotated after lookup
  Norm,       // F32 RMSNorm gain, stored as used
  SsmAB,      // ssm_alpha / ssm_beta: small float linear, NOT rotated (BF16/F16/F32)
  SsmParam,   // ssm_a, ssm_dt.bias, ssm_conv1d: F32
};

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order
  TensorRole role;
  int layer = -1;  // -1 for globals
};

// Every tensor of a qwen35 model in file order (globals, then layer by layer).
std::vector<TensorSpec> tensor_inventory(const ModelConfig& c);

}  // namespace bonsai
