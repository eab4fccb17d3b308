// BONSAI_CUDA_ATTN: which kernel runs the attention (kernels/cuda/launch.h, attention_mode);
// BONSAI_CUDA_ATTN_SPLITS: the tensor-core prefill kernel's split count (attention_mma_forced_splits).
// The knob:: functions parse (kernels/cuda/knobs.h); the others cache their result once per process.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/knobs.h"
#include "kernels/cuda/launch.h"
#include "runtime/env.h"

namespace bonsai::cuda {

// Default 3: prefill batches on the tensor cores (docs/performance.md, "The prefill attention").
// 0, 1, 2: the fp32 split kernel's variants; 3, 4: prefill batches on the tensor cores with KV
// tiles of 64 / 32 positions.
int knob::attn() { return env_int("BONSAI_CUDA_ATTN", 3, 0, 4); }

int attention_mode() {
  static const int mode = knob::attn();
  return mode;
}

// The decode split kernel's cp.async ring: positions in flight per warp (default 3; 0 = the two
// register sets of PIPE = 1). Bit-identical either way. docs/performance.md, "Decode and prefill at
// context depth", session 15.
int knob::attn_ring() { return env_int_in("BONSAI_CUDA_ATTN_RING", 3, {0, 3, 4, 6}); }

int attention_ring() {
  static const int ring = knob::attn_ring();
  return ring;
}

// The decode split kernel's positions scored together per warp (default 4: attention_split.cu,
// attention_split_batch_kernel, where the group is 6 and a ring is on; 1 = the ring kernel of
// session 15, bit-identical to the earlier ones). docs/performance.md, session 16.
int knob::attn_score() { return env_int_in("BONSAI_CUDA_ATTN_SCORE", 4, {1, 4}); }

int attention_score_batch() {
  static const int batch = knob::attn_score();
  return batch;
}

int knob::attn_score_min() { return env_int("BONSAI_CUDA_ATTN_SCORE_MIN", 16384, 1, 1 << 30); }

bool attention_decode_batch(int n_kv) {
  static const int batch = attention_score_batch(), min_kv = knob::attn_score_min();
  return batch == 4 && n_kv >= min_kv;
}

// The tensor cores' decode kernel over an f16 cache (attention_dec_mma.cu; docs/performance.md, session 17).
bool knob::attn_dec_mma() { return env_flag("BONSAI_CUDA_ATTN_DEC_MMA", true); }
int knob::attn_dec_mma_min() { return env_int("BONSAI_CUDA_ATTN_DEC_MMA_MIN", 1024, 1, 1 << 30); }

bool attention_decode_mma_on(int n_kv, int mma_wave) {
  static const bool on = knob::attn_dec_mma();
  static const int min_kv = knob::attn_dec_mma_min();
  return on && mma_wave > 0 && n_kv >= min_kv;
}

// 0 when unset: the plan of attention_mma_splits.
int knob::attn_splits() { return env_int("BONSAI_CUDA_ATTN_SPLITS", 0, 1, 32); }

int attention_mma_forced_splits() {
  static const int splits = knob::attn_splits();
  return splits;
}

// The decode rule (attention_decode_splits, kernels/cuda/launch.h): kAttentionDecodeMinSplits below
// 2 x kAttentionDecodeMinSplits x `per` positions, then one wave of the device (the default, `wave`)
// or session 14's doubling while every split would still get `per` positions (`double`).
int knob::attn_dec_per() { return env_int("BONSAI_CUDA_ATTN_DEC_PER", 64, 1, 1 << 20); }
int knob::attn_dec_max() { return env_int_in("BONSAI_CUDA_ATTN_DEC_MAX", 256, {32, 64, 128, 256}); }
bool knob::attn_dec_wave() {
  return env_choice<bool>("BONSAI_CUDA_ATTN_DEC_RULE", {{"wave", true}, {"double", false}}, true);
}

// BONSAI_CUDA_ATTN_DEC_SPLITS=33..256 (0 = unset): the count wherever the rule gives more than 32
// (an experiment on the grid's waves, session 15).
static int attn_dec_splits() { return env_int("BONSAI_CUDA_ATTN_DEC_SPLITS", 0, 0, kAttentionMaxSplits); }

int attention_decode_splits(int n_kv, int wave) {
  static const int per = knob::attn_dec_per(), cap = knob::attn_dec_max(), forced = attn_dec_splits();
  static const bool by_wave = knob::attn_dec_wave();
  int splits = kAttentionDecodeMinSplits;
  if (by_wave && wave > kAttentionDecodeMinSplits && cap > kAttentionDecodeMinSplits) {
    if (static_cast<int64_t>(2 * splits) * per <= n_kv) splits = std::min(wave, kAttentionMaxSplits);
  } else {
    while (splits < cap && static_cast<int64_t>(2 * splits) * per <= n_kv) splits *= 2;
  }
  if (forced > kAttentionDecodeMinSplits && splits > kAttentionDecodeMinSplits) splits = forced;
  return splits;
}

}  // namespace bonsai::cuda
