// AVX-512 variants of the decode-step elementwise ops (see elementwise.h).
// ISA unit: nothing here is inline-shared with baseline units.
#include <immintrin.h>

#include "kernels/cpu/elementwise.h"

namespace bonsai::cpu {

void gdn_head_step_avx512(const float* q, const float* k, const float* v, float decay, float beta, float* S,
                          float* o, int d_k, int d_v) {
  // Column tiles of up to 128 (8 zmm of kv + 8 of o, within 32 registers):
  // for the 27B's d_v = 128 one tile is a whole row, so both sweeps read the
  // head's 64 KB state front to back (the AVX2 step's 32-column tiles read it
  // with a 512-byte stride).
  constexpr int kTile = 8;
  constexpr int kPrefetchRows = 8;
  const __m512 vdecay = _mm512_set1_ps(decay), vbeta = _mm512_set1_ps(beta);
  for (int e0 = 0; e0 < d_v; e0 += 16 * kTile) {
    const int nt = (d_v - e0) / 16 < kTile ? (d_v - e0) / 16 : kTile;
    __m512 kv[kTile], acc[kTile];
    for (int j = 0; j < kTile; ++j) kv[j] = _mm512_setzero_ps();
    for (int a = 0; a < d_k; ++a) {  // Sᵀk over the tile
      const __m512 ka = _mm512_set1_ps(k[a]);
      const float* row = S + static_cast<int64_t>(a) * d_v + e0;
      // The state comes from DRAM (150 MB per 27B token): ask for the row
      // kPrefetchRows ahead (past the end: the next head's, harmless).
      for (int j = 0; j < nt; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchRows * d_v + 16 * j), _MM_HINT_T0);
      for (int j = 0; j < nt; ++j) kv[j] = _mm512_fmadd_ps(_mm512_loadu_ps(row + 16 * j), ka, kv[j]);
    }
    for (int j = 0; j < nt; ++j) {  // kv = β·(v − decay·Sᵀk)
      kv[j] = _mm512_mul_ps(vbeta, _mm512_fnmadd_ps(vdecay, kv[j], _mm512_loadu_ps(v + e0 + 16 * j)));
      acc[j] = _mm512_setzero_ps();
    }
    for (int a = 0; a < d_k; ++a) {  // S ← decay·S + k_a·kv; o += S·q_a
      const __m512 ka = _mm512_set1_ps(k[a]), qa = _mm512_set1_ps(q[a]);
      float* row = S + static_cast<int64_t>(a) * d_v + e0;
      for (int j = 0; j < nt; ++j) {
        const __m512 s = _mm512_fmadd_ps(_mm512_loadu_ps(row + 16 * j), vdecay, _mm512_mul_ps(ka, kv[j]));
        _mm512_storeu_ps(row + 16 * j, s);
        acc[j] = _mm512_fmadd_ps(s, qa, acc[j]);
      }
    }
    for (int j = 0; j < nt; ++j) _mm512_storeu_ps(o + e0 + 16 * j, acc[j]);
  }
}

}  // namespace bonsai::cpu
