// Every weight of a qwen35 model bound by name, checked for shape and type.
#pragma once

#include <memory>
#include <vector>

#include "kernels/weight.h"

namespace bonsai {

class GgufFile;
struct ModelConfig;

struct LayerWeights {
  bool recurrent = false;
  Weight attn_norm;  // [E] F32
  Weight post_norm;  // [E] F32 (post_attention_norm)
  Weight ffn_gate;   // {E, F} ternary, folded (signs E)
  Weight ffn_up;     // {E, F} ternary, folded (signs E)
  Weight ffn_down;   // {F, E} ternary, folded (signs F)
  // Gated DeltaNet layers (value heads in tiled order where noted)
  Weight ssm_qkv;      // attn_qkv {E, 2·n_k·d_k + n_v·d_v}: q | k | v(tiled)
  Weight ssm_z;        // attn_gate {E, n_v·d_v} (tiled)
  Weight ssm_conv1d;   // {taps, C} F32
  Weight ssm_dt_bias;  // [n_v] F32 (tiled)
  Weight ssm_a;        // [n_v] F32 = -exp(A_log) (tiled)
  Weight ssm_alpha;    // {E, n_v} BF16/F16/F32, NOT rotated (tiled)
  Weight ssm_beta;     // {E, n_v} BF16/F16/F32, NOT rotated (tiled)
  Weight ssm_norm;     // [d_v] F32
  Weight ssm_out;      // {n_v·d_v, E} ternary, folded; input columns grouped when gdn_v_grouped
  // Full-attention layers
  Weight attn_q;       // {E, 2·H·D}: per head [D query | D gate]
  Weight attn_k;       // {E, Hkv·D}
  Weight attn_v;       // {E, Hkv·D}
  Weight attn_out;     // {H·D, E}
  Weight attn_q_norm;  // [D] F32
  Weight attn_k_norm;  // [D] F32
};

struct ModelWeights {
  Weight tok_embd;     // {E, V}: rows are inverse-rotated after lookup when folded
  Weight output_norm;  // [E] F32
  Weight output;       // {E, V} (== tok_embd when tied)
  std::vector<LayerWeights> layers;
  // Small tensors stored as F16/BF16 in the file are converted to F32 here.
  std::vector<std::unique_ptr<float[]>> owned;

  // Binds every tensor of tensor_inventory(c); throws bonsai::Error naming the
  // tensor on a missing tensor, a wrong shape or a type outside its role's set.
  static std::unique_ptr<ModelWeights> bind(const GgufFile& f, const ModelConfig& c);
};

}  // namespace bonsai
