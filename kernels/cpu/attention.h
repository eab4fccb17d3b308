// Decode/prefill attention over the KV cache on the CPU (reference: ref::attention).
#pragma once

#include "kernels/backend.h"
#include "runtime/thread_pool.h"

namespace bonsai::cpu {

// Same contract as Backend::attention. The K and V rows of a KV head are
// streamed once for all the query heads sharing it (GQA), scores in f32 with
// 8-wide FMA partial sums, exp by exp8 (head_dim % 8 == 0; other shapes fall
// back to the reference loop).
//  - A batch (t > 1): one task per (KV head, tile of 8 tokens), walking the
//    cache in blocks of 32 positions with an online softmax, so that a block is
//    read from memory once per tile instead of once per token
//    (BONSAI_CPU_ATTN_TILED=0: one task per (token, KV head), as before).
//  - A decode step (t = 1) over more than BONSAI_CPU_ATTN_CHUNK positions
//    (default 512; 0 = never): one task per (KV head, chunk of that many
//    positions), the chunks' partial softmaxes merged in order; shorter ones
//    one task per KV head.
// Tile, block and chunk sizes are fixed, so the result does not depend on the
// thread count. An F16 cache (s.kv) is widened 8 elements at a time by F16C where
// it is loaded; the arithmetic is the F32 path's.
void attention_avx2(const float* q, const void* k_cache, const void* v_cache, float* out, int t, int pos0,
                    const AttentionShape& s, ThreadPool& pool);
// Backend::store_rows; F16 rows converted 8 at a time by F16C (bit-identical to ref::store_rows).
void store_rows_f16c(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv);

}  // namespace bonsai::cpu
