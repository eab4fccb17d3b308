// Presets and validation of the synthetic model options.
#include <algorithm>
#include <set>

#include "bonsai/error.h"
#include "bonsai/synth.h"

namespace bonsai {
namespace {

ModelConfig small_config(uint32_t n_embd, uint32_t n_ff, uint32_t n_vocab, uint32_t n_head, uint32_t head_dim,
                         uint32_t n_rot, std::array<int32_t, 4> sections, uint32_t ssm_inner, uint32_t n_v,
                         uint32_t n_k) {
  ModelConfig c;
  c.n_layer = 4;
  c.n_embd = n_embd;
  c.n_ff = n_ff;
  c.n_vocab = n_vocab;
  c.n_ctx_train = 4096;
  c.n_head = n_head;
  c.n_head_kv = 1;
  c.head_dim_k = c.head_dim_v = head_dim;
  c.n_rot = n_rot;
  c.rope_base = 1e7f;
  c.rope_sections = sections;
  c.ssm_d_state = 128;
  c.ssm_d_inner = ssm_inner;
  c.ssm_n_v = n_v;
  c.ssm_n_k = n_k;
  c.ssm_conv = 4;
  c.rms_eps = 1e-6f;
  c.recurrent = {1, 1, 1, 0};  // full attention every 4th layer
  return c;
}

bool is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace

std::vector<std::string> synth_preset_names() { return {"tiny", "small", "27b"}; }

SynthOptions synth_preset(std::string_view name) {
  SynthOptions o;
  o.name = "bonsai-synth-" + std::string(name);
  if (name == "tiny") {
    // fixtures/tiny-b128 with a vocabulary of 1024
    o.config = small_config(256, 512, 1024, 2, 128, 32, {6, 5, 5, 0}, 512, 4, 2);
    o.hadamard_block = 128;
    o.ab_type = DType::F32;
  } else if (name == "small") {
    // fixtures/small-b1024
    o.config = small_config(1024, 3072, 2048, 4, 256, 64, {12, 10, 10, 0}, 3072, 24, 8);
    o.hadamard_block = 1024;
    o.ab_type = DType::BF16;
  } else if (name == "27b") {
    o.config = ModelConfig::bonsai2_27b();
    o.hadamard_block = 1024;
    o.ab_type = DType::BF16;
  } else {
    fail("synth: unknown preset '{}' (valid: tiny, small, 27b)", name);
  }
  return o;
}

std::vector<uint32_t> folded_input_widths(const ModelConfig& c) {
  std::set<uint32_t> w{c.n_embd};  // the embedding's inverse rotation uses s_E too
  for (const TensorSpec& t : tensor_inventory(c))
    if (t.role == TensorRole::Folded) w.insert(static_cast<uint32_t>(t.ne[0]));
  return {w.begin(), w.end()};
}

void validate_synth_options(const SynthOptions& o) {
  const ModelConfig& c = o.config;
  const std::string where = "synth options";
  c.validate(where);
  switch (o.weight_type) {
    case DType::PQ2_0:
    case DType::PTQ1_0:
    case DType::Q2_0_G128:
    case DType::Q2_0_G64:
      break;
    default:
      fail("{}: weight type {} is not ternary (PQ2_0, PTQ1_0, Q2_0 g128, Q2_0 g64)", where,
           dtype_name(o.weight_type));
  }
  if (o.ab_type != DType::F32 && o.ab_type != DType::F16 && o.ab_type != DType::BF16)
    fail("{}: ssm_alpha/ssm_beta type {} must be F32, F16 or BF16", where, dtype_name(o.ab_type));
  if (o.hadamard_version != 1 && o.hadamard_version != 2)
    fail("{}: prism.hadamard.version {} must be 1 or 2", where, o.hadamard_version);
  if (c.tied_output && o.hadamard_version != 2)
    fail("{}: a tied output head needs prism.hadamard.version 2 (tied_output)", where);
  if (!is_pow2(o.hadamard_block))
    fail("{}: hadamard block size {} is not a power of two", where, o.hadamard_block);
  for (uint32_t k : folded_input_widths(c)) {
    if (k % 128)
      fail("{}: folded input width {} is not a multiple of 128 (one scale per 128 inputs)", where, k);
    if (k % o.hadamard_block)
      fail("{}: hadamard block size {} does not divide folded input width {}", where, o.hadamard_block, k);
  }
  if (o.with_vocab && c.n_vocab < kSynthMinVocab)
    fail("{}: a vocabulary needs n_vocab >= {} (256 bytes + 5 special tokens), got {}", where, kSynthMinVocab,
         c.n_vocab);
  if (c.rope_sections[0] + c.rope_sections[1] + c.rope_sections[2] + c.rope_sections[3] >
      static_cast<int32_t>(c.n_rot / 2))
    fail("{}: rope.dimension_sections sum exceeds rope.dimension_count / 2 = {}", where, c.n_rot / 2);
}

}  // namespace bonsai
