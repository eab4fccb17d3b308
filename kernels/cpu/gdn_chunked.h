// The gated delta rule over a chunk of tokens in the WY (chunked) form.
//
// Per value head, with state S0 [d_k][d_v] at the chunk start, tokens t = 1..C,
// cumulative log-decay G_t = g_1 + … + g_t, L2-normalised k_t and q_t (q scaled
// by 1/√d_k), the token walk
//     S_t = e^{g_t} S_{t-1} + k_t u_tᵀ,   u_t = β_t (v_t − e^{g_t} S_{t-1}ᵀ k_t),   o_t = S_tᵀ q_t
// unrolls to S_t = e^{G_t} S0 + Σ_{s≤t} e^{G_t−G_s} k_s u_sᵀ, so the deltas solve
//     u_t + β_t Σ_{s<t} e^{G_t−G_s} (k_t·k_s) u_s = β_t (v_t − e^{G_t} S0ᵀ k_t)
// (unit lower-triangular: forward substitution), and
//     o_t = e^{G_t} S0ᵀ q_t + Σ_{s≤t} e^{G_t−G_s} (k_s·q_t) u_s,
//     S_C = e^{G_C} S0 + Σ_s e^{G_C−G_s} k_s u_sᵀ.
// Numerics: everything in fp32 (as the token walk); decays only ever appear as
// e^{G_t−G_s} with s ≤ t (≤ 1, no division by a vanishing e^{G_s}); the state is
// read once and written once per chunk instead of per token. Differences to the
// token walk are summation-order rounding (tests/test_gdn_chunked.cpp).
#pragma once

#include "kernels/backend.h"
#include "runtime/thread_pool.h"

namespace bonsai::cpu {

// Same contract as Backend::gdn_recurrence; tokens are processed in chunks of
// at most `chunk` (the last may be shorter). Heads are split across the pool.
void gdn_recurrence_chunked(const float* conv, const float* g, const float* beta, float* state, float* out,
                            int t, const GdnShape& s, int chunk, ThreadPool& pool);

}  // namespace bonsai::cpu
