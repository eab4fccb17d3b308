// Fast blockwise signed Walsh–Hadamard transform (reference: kernels/ref/fwht.h).
#pragma once

#include <cstdint>

#include "runtime/cpu_features.h"

namespace bonsai::cpu {

// Same contract as ref::hadamard_forward / hadamard_inverse for one row of k:
// forward: y = FWHT_B(s ⊙ x)/√B; inverse: y = s ⊙ FWHT_B(x)/√B. signs may be nullptr.
// Blocks of B >= 8 use AVX2 butterflies (in-register for h < 8); smaller B and
// Isa::Scalar use the reference loop. y may alias x.
void hadamard_row(const float* x, const float* signs, float* y, int64_t k, int64_t block, bool inverse,
                  Isa isa);

}  // namespace bonsai::cpu
