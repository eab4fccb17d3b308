// Decode/prefill attention over the KV cache on the CPU (reference: ref::attention).
#pragma once

#include "kernels/backend.h"
#include "runtime/thread_pool.h"

namespace bonsai::cpu {

// Same contract as Backend::attention. One task per (token, KV head): the K and
// V rows of that head are streamed once for all the query heads sharing it
// (GQA), scores in f32 with 8-wide FMA partial sums (head_dim % 8 == 0; other
// shapes fall back to the reference loop). A decode step (t = 1) over more than
// BONSAI_CPU_ATTN_CHUNK positions (default 512; 0 = never) runs one task per (KV
// head, chunk of that many positions) and merges the chunks' partial softmaxes.
void attention_avx2(const float* q, const float* k_cache, const float* v_cache, float* out, int t, int pos0,
                    const AttentionShape& s, ThreadPool& pool);

}  // namespace bonsai::cpu
