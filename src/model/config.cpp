#include "bonsai/config.h"

#include <cstdint>

#include "bonsai/error.h"
#include "bonsai/gguf.h"

namespace bonsai {
namespace {
constexpr const char* kArch = "qwen35";
std::string key(const char* k) { return std::string(kArch) + "." + k; }
}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  std::string_view arch = f.get_string("general.architecture");
  if (arch != kArch) fail("{}: general.architecture is '{}', bonsai runs '{}' models", f.path(), arch, kArch);
  ModelConfig c;
  c.n_layer = f.get_u32(key("block_count"));
  c.n_embd = f.get_u32(key("embedding_length"));
  c.n_ff = f.get_u32(key("feed_forward_length"));
  c.n_ctx_train = f.get_u32(key("context_length"));
  if (c.n_ctx_train == 0)
    fail("{}: key '{}' must be > 0 (the trained context, in positions)", f.path(), key("context_length"));
  c.n_head = f.get_u32(key("attention.head_count"));
  c.n_head_kv = f.get_u32(key("attention.head_count_kv"));
  c.head_dim_k = f.get_u32(key("attention.key_length"));
  c.head_dim_v = f.get_u32(key("attention.value_length"));
  c.rms_eps = f.get_f32(key("attention.layer_norm_rms_epsilon"));
  c.n_rot = f.get_u32(key("rope.dimension_count"));
  c.rope_base = static_cast<float>(f.get_f64_or(key("rope.freq_base"), 10000.0));
  if (f.has(key("rope.dimension_sections"))) {
    const GgufValue& s = f.get_array(key("rope.dimension_sections"));
    if (!s.elems) fail("{}: key '{}' must be an integer array", f.path(), key("rope.dimension_sections"));
    for (uint64_t i = 0; i < s.count && i < 4; ++i) c.rope_sections[i] = static_cast<int32_t>(s.elem_i64(i));
  }
  c.ssm_conv = f.get_u32(key("ssm.conv_kernel"));
  c.ssm_d_inner = f.get_u32(key("ssm.inner_size"));
  c.ssm_d_state = f.get_u32(key("ssm.state_size"));
  c.ssm_n_v = f.get_u32(key("ssm.time_step_rank"));
  c.ssm_n_k = f.get_u32(key("ssm.group_count"));

  // Checked before the per-layer vector is sized from it: every block has at
  // least 11 tensors, so a count above the file's tensors cannot be valid, and
  // a hostile 2^32-1 must not cost a 4 GiB allocation before that is noticed.
  if (c.n_layer > f.tensors().size())
    fail("{}: key '{}' = {} is more than the {} tensors in the file (every block has at least 11)", f.path(),
         key("block_count"), c.n_layer, f.tensors().size());
  c.recurrent.assign(c.n_layer, 0);
  if (f.has(key("attention.recurrent_layers"))) {
    const GgufValue& r = f.get_array(key("attention.recurrent_layers"));
    if (r.count != c.n_layer || !r.elems)
      fail("{}: key '{}' must be a numeric/bool array of {} entries (block_count), found {}", f.path(),
           key("attention.recurrent_layers"), c.n_layer, r.count);
    for (uint32_t i = 0; i < c.n_layer; ++i) c.recurrent[i] = r.elem_i64(i) != 0;
  } else {
    uint32_t interval = f.get_u32(key("full_attention_interval"));
    if (interval == 0) fail("{}: key '{}' must be > 0", f.path(), key("full_attention_interval"));
    for (uint32_t i = 0; i < c.n_layer; ++i) c.recurrent[i] = ((i + 1) % interval) != 0;
  }

  c.tied_output = f.find_tensor("output.weight") == nullptr;
  if (f.has(key("vocab_size"))) {
    c.n_vocab = f.get_u32(key("vocab_size"));
  } else if (f.has("tokenizer.ggml.tokens")) {
    const uint64_t n = f.get_array("tokenizer.ggml.tokens").count;
    if (n > UINT32_MAX) fail("{}: key 'tokenizer.ggml.tokens' has {} entries, more than 2^32-1", f.path(), n);
    c.n_vocab = static_cast<uint32_t>(n);
  } else {
    c.n_vocab = static_cast<uint32_t>(f.tensor("token_embd.weight").dim(1));
  }
  c.validate(f.path());
  return c;
}

void ModelConfig::validate(const std::string& where) const {
  auto need = [&](bool ok, const char* what) {
    if (!ok) fail("{}: inconsistent qwen35 hyperparameters: {}", where, what);
  };
  need(n_layer > 0 && n_embd > 0 && n_ff > 0 && n_vocab > 0,
       "block_count, embedding_length, feed_forward_length and vocab must be > 0");
  need(n_head > 0 && n_head_kv > 0 && n_head % n_head_kv == 0,
       "attention.head_count must be a positive multiple of head_count_kv");
  need(head_dim_k > 0 && head_dim_k == head_dim_v, "attention.key_length must equal value_length (> 0)");
  need(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim_k,
       "rope.dimension_count must be even and <= key_length");
  need(ssm_n_k > 0 && ssm_n_v > 0 && ssm_n_v % ssm_n_k == 0,
       "ssm.time_step_rank must be a positive multiple of ssm.group_count");
  need(ssm_d_inner > 0 && ssm_d_inner % ssm_n_v == 0,
       "ssm.inner_size must be a multiple of ssm.time_step_rank");
  need(ssm_d_state > 0, "ssm.state_size must be > 0");
  need(ssm_conv >= 1 && ssm_conv <= 16, "ssm.conv_kernel must be in 1..16");
  need(rms_eps > 0 && rms_eps < 1, "attention.layer_norm_rms_epsilon must be in (0, 1)");
  need(rope_base > 0, "rope.freq_base must be > 0");
  need(recurrent.size() == n_layer, "one layer kind per block");
  // The widths the graph derives are uint32 products (config.h) and the graph
  // and kernels index with int: a product that wraps could match a small
  // tensor's shape and send the forward pass far out of bounds, so each is
  // computed in 64-bit here and must stay within int32.
  const uint64_t H = n_head, HKV = n_head_kv, DK = head_dim_k, DV = head_dim_v;
  const uint64_t NK = ssm_n_k, DS = ssm_d_state, DI = ssm_d_inner;
  // Two uint32 factors cannot overflow uint64, three can (2·H·DK up to 2^65): saturate.
  auto mul = [](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
  };
  auto add = [](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
  };
  const struct {
    uint64_t value;
    const char* what;
  } widths[] = {
      {n_embd, "embedding_length"},
      {n_ff, "feed_forward_length"},
      {n_vocab, "vocab"},
      {n_ctx_train, "context_length"},
      {mul(2 * H, DK), "2 x attention.head_count x key_length (attn_q rows)"},
      {H * DV, "attention.head_count x value_length (attn_output width)"},
      {HKV * DK, "attention.head_count_kv x key_length (attn_k rows)"},
      {add(mul(2 * NK, DS), DI), "2 x ssm.group_count x ssm.state_size + ssm.inner_size (attn_qkv rows)"},
      {DS * DI, "ssm.state_size x ssm.inner_size (recurrent state per layer)"},
  };
  for (const auto& w : widths)
    if (w.value > static_cast<uint64_t>(INT32_MAX))
      fail("{}: inconsistent qwen35 hyperparameters: {} = {} exceeds 2^31-1", where, w.what, w.value);
}

ModelConfig ModelConfig::bonsai2_27b() {
  ModelConfig c;
  c.n_layer = 64;
  c.n_embd = 5120;
  c.n_ff = 17408;
  c.n_vocab = 248320;
  c.n_ctx_train = 262144;
  c.n_head = 24;
  c.n_head_kv = 4;
  c.head_dim_k = c.head_dim_v = 256;
  c.n_rot = 64;
  c.rope_base = 1e7f;
  c.rope_sections = {11, 11, 10, 0};
  c.ssm_d_state = 128;
  c.ssm_d_inner = 6144;
  c.ssm_n_v = 48;
  c.ssm_n_k = 16;
  c.ssm_conv = 4;
  c.rms_eps = 1e-6f;
  c.recurrent.resize(64);
  for (int i = 0; i < 64; ++i) c.recurrent[i] = ((i + 1) % 4) != 0;
  return c;
}

std::vector<TensorSpec> tensor_inventory(const ModelConfig& c) {
  std::vector<TensorSpec> v;
  const uint64_t E = c.n_embd, F = c.n_ff, V = c.n_vocab;
  v.push_back({"token_embd.weight", {E, V}, TensorRole::Embedding});
  v.push_back({"output_norm.weight", {E}, TensorRole::Norm});
  if (!c.tied_output) v.push_back({"output.weight", {E, V}, TensorRole::Folded});
  for (uint32_t il = 0; il < c.n_layer; ++il) {
    const int L = static_cast<int>(il);
    auto name = [&](const char* n) { return "blk." + std::to_string(il) + "." + n; };
    v.push_back({name("attn_norm.weight"), {E}, TensorRole::Norm, L});
    v.push_back({name("post_attention_norm.weight"), {E}, TensorRole::Norm, L});
    if (c.recurrent[il]) {
      const uint64_t C = c.ssm_conv_channels(), NV = c.ssm_n_v;
      v.push_back({name("attn_qkv.weight"), {E, C}, TensorRole::Folded, L});
      v.push_back({name("attn_gate.weight"), {E, c.ssm_d_inner}, TensorRole::Folded, L});
      v.push_back({name("ssm_conv1d.weight"), {c.ssm_conv, C}, TensorRole::SsmParam, L});
      v.push_back({name("ssm_dt.bias"), {NV}, TensorRole::SsmParam, L});
      v.push_back({name("ssm_a"), {NV}, TensorRole::SsmParam, L});
      v.push_back({name("ssm_beta.weight"), {E, NV}, TensorRole::SsmAB, L});
      v.push_back({name("ssm_alpha.weight"), {E, NV}, TensorRole::SsmAB, L});
      v.push_back({name("ssm_norm.weight"), {c.ssm_head_v_dim()}, TensorRole::Norm, L});
      v.push_back({name("ssm_out.weight"), {c.ssm_d_inner, E}, TensorRole::Folded, L});
    } else {
      v.push_back({name("attn_q.weight"), {E, c.attn_q_rows()}, TensorRole::Folded, L});
      v.push_back({name("attn_k.weight"), {E, uint64_t{c.n_head_kv} * c.head_dim_k}, TensorRole::Folded, L});
      v.push_back({name("attn_v.weight"), {E, uint64_t{c.n_head_kv} * c.head_dim_v}, TensorRole::Folded, L});
      v.push_back({name("attn_output.weight"), {c.attn_out_width(), E}, TensorRole::Folded, L});
      v.push_back({name("attn_q_norm.weight"), {c.head_dim_k}, TensorRole::Norm, L});
      v.push_back({name("attn_k_norm.weight"), {c.head_dim_k}, TensorRole::Norm, L});
    }
    v.push_back({name("ffn_gate.weight"), {E, F}, TensorRole::Folded, L});
    v.push_back({name("ffn_up.weight"), {E, F}, TensorRole::Folded, L});
    v.push_back({name("ffn_down.weight"), {F, E}, TensorRole::Folded, L});
  }
  return v;
}

}  // namespace bonsai
