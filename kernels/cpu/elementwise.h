// Vectorised elementwise ops of the decode step that sit between the matvecs:
// the GDN causal conv + SiLU (ssm_conv), SwiGLU and the attention output gate. Scalar loops with libm's
// expf cost ~10 ns per element here (ssm_conv: 10240 channels × 48 layers,
// SwiGLU: 17408 × 64 per token, ~10 ms per token together); these run 8
// lanes at a time with a polynomial exp.
//
// Numerics: exp8 (kernels/cpu/elementwise_avx2.cpp) is the Cephes expf
// reduction + degree-6 polynomial, within 2 ulp of the correctly rounded
// exp on [−87.3, 88.3] (inputs are clamped there: silu(x) for x < −87.3 is
// below 1e-36 in magnitude either way). silu(x) = x / (1 + exp(−x)) as in
// kernels/ref/ops.h, so results differ from the reference by a few ulp.
#pragma once

#include <cstdint>

namespace bonsai::cpu {

// Channels [c0, c1) of Backend::ssm_conv's contract (x [t][C], state
// [(taps−1)][C] oldest first, updated; w [C][taps]; out [t][C]); AVX2 + FMA.
void ssm_conv_avx2(const float* x, float* state, const float* w, float* out, int t, int64_t channels,
                   int taps, int64_t c0, int64_t c1);

// a[i] = silu(g[i]) · u[i] for i in [0, n); AVX2 + FMA. a may alias u (in place).
void swiglu_avx2(const float* g, const float* u, float* a, int64_t n);

// y[i] = x[i] · sigmoid(gate[i]) for i in [0, n) (Backend::sigmoid_mul: the attention output
// gate); AVX2 + FMA, the same exp8. y may alias x (in place).
void sigmoid_mul_avx2(const float* x, const float* gate, float* y, int64_t n);

// y[i] = silu(x[i]) for i in [0, n) (used by tests to bound the exp error).
void silu_avx2(const float* x, float* y, int64_t n);

// One token of the gated delta rule for one value head (Backend::gdn_recurrence's
// inner step), AVX2 + FMA: with q, k already L2-normalised (q scaled by 1/√d_k),
//   kv = β·(v − decay·Sᵀk);  S ← decay·S + k ⊗ kv;  o = Sᵀq
// S [d_k][d_v] row-major. d_v must be a multiple of 8. S is read twice (Sᵀk,
// then the update fused with Sᵀq) and written once, 32 columns at a time so a
// column tile (d_k × 128 B) stays in L1 between the two sweeps.
void gdn_head_step_avx2(const float* q, const float* k, const float* v, float decay, float beta, float* S,
                        float* o, int d_k, int d_v);
// The same step with AVX-512 (d_v a multiple of 16): 128-column tiles, so at
// d_v = 128 each sweep streams the state front to back.
void gdn_head_step_avx512(const float* q, const float* k, const float* v, float decay, float beta, float* S,
                          float* o, int d_k, int d_v);

}  // namespace bonsai::cpu
