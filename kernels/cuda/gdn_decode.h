// The GDN site's decode step (t = 1) as one launch over clusters of CTAs per value head
// (kernels/cuda/gdn_decode.cu): conv, q/k L2 norms, alpha/beta rows, gates, delta rule, gated
// RMSNorm and head order, like cuda::gdn_fused (gdn.cu) with a shorter dependency chain.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/launch.h"

namespace bonsai::cuda {

// Which decode kernel the CUDA backend's GDN site runs at t = 1, from the environment (read when
// a backend is made):
//   BONSAI_CUDA_GDN_DEC=0|1 (default 1): 0 = gdn_fused (the former kernel), 1 = gdn_decode;
//   BONSAI_CUDA_GDN_DEC_CLUSTER=1|2|4 (default kGdnDecCluster): CTAs per value head;
//   BONSAI_CUDA_GDN_DEC_AB=0|1 (default kGdnDecAbEarly): the alpha/beta rows' first weights
//   loaded before the grid-dependency wait;
//   BONSAI_CUDA_GDN_DEC_MEMBAR=0|1 (default kGdnDecMembarFree): 1 = at clusters of 2 or 4, the
//   state's stores after the norm barrier's release arrive and a relaxed done-reading arrive
//   (no MEMBAR waits for the stores); the same results;
//   BONSAI_CUDA_GDN_DEC_COUNT=0|1 (default kGdnDecCountEarly; with split sums only): 1 = the conv
//   hand-off's count right after the states' loads (before the wait when recorded), behind a
//   barrier of its own; 0 = after the barrier that publishes the summed q/k conv;
//   BONSAI_CUDA_QKV_LOAD=0|1 (default kSplitWeakLoads; with split sums only, also the attention
//   prep's): the slots read with plain loads (1) or ld.global.cg (0; split::sum_slots);
//   BONSAI_CUDA_GDN_FWHT=0|1 (default kGdnDecFwht): 1 = the out-projection's input site (sign,
//   FWHT, quantization: CudaBackend::hadamard) folded into the step where gdn_decode takes it
//   (GdnDecodeFwht below), 0 = its own launch after the step;
//   BONSAI_CUDA_GDN_FWHT_POLL=0|1 (default kGdnDecFwhtPoll; with the fold): 1 = the Hadamard block's
//   outputs handed to a fixed CTA of the block through words that are their own flags (polled),
//   0 = counted on an atomic, the last CTA to count running the site (GdnDecodeFwht.poll);
//   BONSAI_CUDA_GDN_EARLY=0|1 (default 1): 1 = in a recorded step the states loaded before the
//   grid-dependency wait (GdnFused.state_early), 0 = after it;
//   BONSAI_CUDA_GDN_DEC_PUSH=0|1 (default kGdnDecPush; at clusters of 2 or 4): 1 = the gated norm's
//   partial sums pushed to the cluster's other CTAs (st.async on an mbarrier), 0 = read from
//   theirs after a cluster barrier; the same results.
// Any other value is an error naming the variable.
inline constexpr int kGdnDecCluster = 2;
inline constexpr bool kGdnDecAbEarly = true;
inline constexpr bool kGdnDecMembarFree = false;
inline constexpr bool kGdnDecCountEarly = true;
inline constexpr bool kSplitWeakLoads = true;
inline constexpr bool kGdnDecFwht = true;
inline constexpr bool kGdnDecFwhtPoll = true;
inline constexpr bool kGdnDecPush = true;
struct GdnDecodeConfig {
  bool on = true;
  int cluster = kGdnDecCluster;
  bool ab_early = kGdnDecAbEarly;
  bool membar_free = kGdnDecMembarFree;
  bool count_early = kGdnDecCountEarly;
  bool split_weak = kSplitWeakLoads;
  bool fwht = kGdnDecFwht;
  bool fwht_poll = kGdnDecFwhtPoll;
  bool early = true;
  bool push = kGdnDecPush;
};
GdnDecodeConfig gdn_decode_config();

// Whether gdn_decode takes p: t == 1 with the conv (qkv), the alpha/beta rows (F16 or BF16,
// ab_k % 4 == 0, 8-byte aligned rows, 16-byte aligned normed), the gated norm and the conv
// counters; d_k in {32, 64, 128, 256}, d_v % 32 == 0, (d_k/32)·d_v <= 512, taps 1..4.
bool gdn_decode_fits(const GdnFused& p);
// One decode step of p (gdn_decode_fits(p)) over clusters of `cluster` CTAs per value head (1, 2
// or 4; fewer where the head's warps do not divide or the device has no clusters). Same
// results as gdn_fused up to the summation order of the norms, dot products and reductions.
// split (optional): p.qkv and p.z are the unsummed outputs of one deferred matvec launch
// (split[0].y == p.qkv, split[1].y == p.z, t == 1; launch.h, SplitSums): the kernel adds their
// slots itself (the same floats as the matvec's own fix-up, so the same results bit for bit)
// and writes the sums back to qkv and z.
// fwht (optional, without split): also the forward Hadamard site of the output for the
// out-projection (what cuda::hadamard(p.out, signs, rotated, 1, n_v·d_v, block, false, xq, meta)
// writes, bit for bit), by one CTA of each Hadamard block: by default (fwht.poll given) the CTA
// holding the block's first columns, once it has polled every output word of the block; else
// the last CTA to count itself in. Returns whether it did (else the caller runs the site).
// Taken when gdn_decode_folds: the step runs at most 2 CTAs per head and block % 128 == 0,
// block % d_v == 0, (n_v·d_v) % block == 0, block <= 4·threads per CTA.
struct GdnDecodeFwht {
  const float* signs = nullptr;  // [n_v·d_v] or null (identity)
  float* rotated = nullptr;      // [n_v·d_v] FWHT(signs ⊙ out)/√block
  uint8_t* xq = nullptr;         // its activation quantization (quantize_act's layout)
  float4* meta = nullptr;
  unsigned* counters = nullptr;  // [(n_v·d_v) / block] zero, left zero
  int block = 0;
  // The polled hand-off (optional): [n_v·d_v] words, every one 0xFFFFFFFF (a NaN no arithmetic
  // returns) before the launch and left so. Each CTA stores its outputs there too (relaxed); the
  // CTA holding the block's first columns polls the block's words until none is empty, empties
  // them again and runs the site: no counter, no release, no second read. Taken only where the
  // launch's CTAs fit on the device at once (grid <= sm_count: the polling CTA waits for the
  // others), else the counted hand-off.
  float* poll = nullptr;
  int sm_count = 0;
};
// Whether gdn_decode(p, c, s, nullptr, fwht) folds a Hadamard site of `block` columns.
bool gdn_decode_folds(const GdnFused& p, const GdnDecodeConfig& c, int block);
bool gdn_decode(const GdnFused& p, const GdnDecodeConfig& c, cudaStream_t s, const SplitSums* split = nullptr,
                const GdnDecodeFwht* fwht = nullptr);

}  // namespace bonsai::cuda
