// The smallest synthetic model the writer accepts: 2 layers (one gated delta
// net, one full attention), every folded width 128, vocabulary 300 (a few
// learned merges). About 100 KB as PQ2_0; the base of the hostile-model tests
// and of fuzz_model's seed corpus, where small files keep mutations fast.
#pragma once

#include "bonsai/config.h"
#include "bonsai/synth.h"

namespace bonsai::testing {

inline SynthOptions synth_mini() {
  ModelConfig c;
  c.n_layer = 2;
  c.recurrent = {1, 0};  // GDN then full attention: full_attention_interval = 2
  c.n_embd = 128;
  c.n_ff = 128;
  c.n_vocab = 300;
  c.n_ctx_train = 256;
  c.n_head = 2;
  c.n_head_kv = 1;
  c.head_dim_k = c.head_dim_v = 64;  // attn_output width 2 x 64 = 128
  c.n_rot = 32;
  c.rope_base = 1e7f;
  c.rope_sections = {6, 5, 5, 0};
  c.ssm_d_state = 32;
  c.ssm_n_k = 1;
  c.ssm_n_v = 2;
  c.ssm_d_inner = 128;  // attn_qkv rows 2 x 1 x 32 + 128 = 192
  c.ssm_conv = 4;
  c.rms_eps = 1e-6f;
  SynthOptions o;
  o.config = c;
  o.hadamard_block = 128;
  o.name = "synth-mini";
  return o;
}

}  // namespace bonsai::testing
