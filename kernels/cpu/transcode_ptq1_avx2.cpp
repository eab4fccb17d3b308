// PTQ1_0 → PQ2_0 transcode (bit-exact), AVX2: for a backend that prefers to
// repack PTQ1_0 weights once at load and then stream them at PQ2_0 speed
// (the direct PTQ1_0 kernels are bound by the base-3 decode; see
// docs/performance.md). Same decode as the PTQ1_0 matvec kernels: plane n of
// a block's 26 trit bytes holds elements 16n+m (lanes 0..15), 80+8n+(m−16)
// (lanes 16..23) and 120+2n+(m−24) (lanes 24, 25; planes 0..3).
//
// PQ2_0 byte j holds elements 4j..4j+3 (2 bits each, low first), so four
// consecutive lanes of one plane make one PQ2_0 byte: vpmaddubsw by
// (1, 4, 16, 64) and vpmaddwd by (1, 1) pack them into a dword.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matvec_kernels.h"

namespace bonsai::cpu::detail {

void transcode_ptq1_blocks_avx2(const uint8_t* src, uint8_t* dst, int64_t n_blocks, const uint8_t* src_end) {
  const __m256i mc0 = _mm256_set1_epi8(static_cast<char>(0xC0));
  const __m256i weights = _mm256_set1_epi32(0x40100401);  // bytes 1, 4, 16, 64
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < n_blocks; ++b, src += 28, dst += 34) {
    __m256i t;
    if (src + 32 <= src_end) {
      t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    } else {  // the last block of the tensor: do not read past it
      alignas(32) uint8_t tmp[32] = {};
      std::memcpy(tmp, src, 28);
      t = _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
    }
    __m256i packed[5];  // dword j of plane n = lanes 4j..4j+3 packed 2 bits each
    for (int n = 0; n < 5; ++n) {
      const __m256i v = _mm256_add_epi8(_mm256_add_epi8(t, t), t);
      const __m256i c =
          _mm256_srli_epi16(_mm256_and_si256(_mm256_avg_epu8(t, _mm256_subs_epu8(t, v)), mc0), 6);
      packed[n] = _mm256_madd_epi16(_mm256_maddubs_epi16(c, weights), ones);
      t = v;
    }
    alignas(32) uint32_t d[5][8];
    for (int n = 0; n < 5; ++n) _mm256_store_si256(reinterpret_cast<__m256i*>(d[n]), packed[n]);
    std::memcpy(dst, src + 26, 2);  // fp16 scale: last in PTQ1_0, first in PQ2_0
    uint8_t* q = dst + 2;
    for (int n = 0; n < 5; ++n) {
      for (int j = 0; j < 4; ++j) q[4 * n + j] = static_cast<uint8_t>(d[n][j]);  // elements 16n .. 16n+15
      q[20 + 2 * n] = static_cast<uint8_t>(d[n][4]);                             // elements 80+8n ..
      q[21 + 2 * n] = static_cast<uint8_t>(d[n][5]);
    }
    // Elements 120..127: lanes 24, 25 of planes 0..3 (the low 4 bits of dword 6).
    q[30] = static_cast<uint8_t>((d[0][6] & 0xF) | (d[1][6] & 0xF) << 4);
    q[31] = static_cast<uint8_t>((d[2][6] & 0xF) | (d[3][6] & 0xF) << 4);
  }
}

}  // namespace bonsai::cpu::detail
