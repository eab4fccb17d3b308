// Load-time repacks of weights for the CPU backend (Backend::prepare).
//
// PTQ1_0 (1.75 bits/weight, base-3) is transcoded bit-exactly to PQ2_0
// (2.125 bits/weight): the direct PTQ1_0 kernels are bound by the trit decode
// at ~0.42 of read bandwidth (docs/performance.md), the PQ2_0 kernel streams
// at ~0.8, so reading 21 % more bytes is still ~1.6× faster. Costs: the
// PQ2_0 copy is resident (6.8 GB for the 27B, on top of the reclaimable page
// cache of the file) and the transcode runs at ~3.4 GB/s of input on 2
// threads (~1.7 s for the 27B).
//
// Buffers are anonymous mappings advised MADV_HUGEPAGE (2 MiB pages where the
// kernel grants them: fewer TLB misses while streaming).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/weight.h"
#include "runtime/cpu_features.h"
#include "runtime/thread_pool.h"

namespace bonsai::cpu {

// An anonymous, page-aligned, huge-page-advised byte buffer (RAII munmap).
class HugeBuffer {
 public:
  explicit HugeBuffer(size_t bytes);
  ~HugeBuffer();
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
  uint8_t* data() { return p_; }
  size_t size() const { return n_; }

 private:
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

// Whether the CPU backend repacks PTQ1_0 at load: yes unless
// BONSAI_CPU_PTQ1=direct (then the PTQ1_0 kernels read the file layout).
// Any other value than "direct" / "transcode" is an error naming the variable.
bool ptq1_transcode_enabled();

// A PTQ1_0 weight transcoded to PQ2_0 rows (same n, k) in a HugeBuffer.
struct Ptq1Repack {
  explicit Ptq1Repack(const Weight& w, ThreadPool& pool, Isa isa);
  HugeBuffer bytes;  // [n][row_bytes(PQ2_0, k)]
};

}  // namespace bonsai::cpu
