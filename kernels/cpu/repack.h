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
#include <memory>

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

// What the CPU backend does with ternary weights at load (Backend::prepare),
// from the environment:
//  * BONSAI_CPU_PTQ1 = transcode (default) | direct: PTQ1_0 → PQ2_0 copy, or
//    the PTQ1_0 kernels on the file layout;
//  * BONSAI_CPU_WEIGHTS = map (default) | copy: PQ2_0 / Q2_0 read where the
//    file maps them (4 KiB page-cache pages, zero copy), or copied once into
//    huge-page-advised memory (+ their size in resident memory).
// Other values are a UsageError naming the variable.
struct RepackPolicy {
  bool ptq1_transcode = true;
  bool copy_ternary = false;
};
RepackPolicy repack_policy_from_env();

// A weight's decode-time copy: `type` rows (same n, k) in a HugeBuffer.
struct Repack {
  Repack(DType t, size_t n_bytes) : type(t), bytes(n_bytes) {}
  DType type;
  HugeBuffer bytes;  // [n][row_bytes(type, k)]
};

// The repack `policy` asks for w (nullptr: read w in place). Work is split
// across the pool.
std::unique_ptr<Repack> make_repack(const Weight& w, const RepackPolicy& policy, ThreadPool& pool, Isa isa);

}  // namespace bonsai::cpu
