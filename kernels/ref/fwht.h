// Reference blockwise Walsh–Hadamard transform (the spec for every fast FWHT).
//
// H_B is the Sylvester (natural-order) Hadamard matrix, H[r][c] = (-1)^popcount(r&c).
// A K-wide activation is split into K/B consecutive blocks, each transformed
// independently (block-diagonal R). See SPEC §3 and docs/loader-conventions.md.
#pragma once

#include <cstdint>

namespace bonsai::ref {

// In place, unnormalised: x <- H_n x for one block of n (power of two) values.
void fwht(float* x, int64_t n);

// Folded-linear input site: out = FWHT_B(s ⊙ x) / sqrt(B) per block (sign first).
// `signs` holds K values of ±1 (nullptr = identity). out may alias x.
void hadamard_forward(const float* x, const float* signs, float* out, int64_t k, int64_t block);

// Embedding inverse: out = s ⊙ (FWHT_B(z) / sqrt(B)) per block (transform first).
void hadamard_inverse(const float* z, const float* signs, float* out, int64_t k, int64_t block);

}  // namespace bonsai::ref
