// Load-time repacks of weights for the CPU backend (Backend::prepare).
//
// Default on AVX-512: every 128-block 2-bit weight (PQ2_0, Q2_0 g128, and
// PTQ1_0 through the transcode below) is re-laid into the block-stream layout
// (WeightLayout::Stream16, kernels/cpu/matvec.h) that the AVX-512 matvec and
// GEMM read: a lossless permutation of the file's bytes (same size for the
// 27B), which raises the faithful matvec's compute ceiling (per-block scale
// work paid once per 16 blocks, aligned 64-byte code loads), makes each
// thread's rows one sequential stream, and puts every streamed
// weight on 2 MiB pages whatever state the file's page cache is in. Costs:
// the weights' size in resident memory (6.8 GB for the 27B; the file's page
// cache stays reclaimable) and the repack at load (docs/performance.md).
// BONSAI_CPU_WEIGHTS=map keeps the zero-copy file layout (the low-memory
// option). With the AVX2 / scalar kernels nothing is re-laid.
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

#include "kernels/cpu/matvec.h"
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
  const uint8_t* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

// What the CPU backend does with ternary weights at load (Backend::prepare),
// from the environment:
//  * BONSAI_CPU_PTQ1 = transcode (default) | direct: PTQ1_0 → PQ2_0 copy, or
//    the PTQ1_0 kernels on the file layout;
//  * BONSAI_CPU_WEIGHTS = stream (default) | lanes | map | copy: with the
//    AVX-512 kernels, PQ2_0 / Q2_0 g128 (and transcoded PTQ1_0) re-laid into
//    the Stream16 layout in huge-page memory (`lanes`: Lanes16, the same
//    chunks as one stream per row plus a scale stream; session 3's default,
//    kept for comparison); `map`: PQ2_0 / Q2_0 read where the
//    file maps them (zero copy; the low-memory option); `copy`: copied as they
//    are into huge-page memory. Q2_0 g64 is never re-laid (lanes = map for it),
//    nor is anything with the AVX2 / scalar kernels. Float matrices (F32 /
//    F16 / BF16, n > 1) are copied as they are whenever the ternary weights
//    leave the file (stream / lanes on AVX-512, or copy).
// Other values are a UsageError naming the variable.
enum class WeightsMode : uint8_t { Lanes, Map, Copy, Stream };
struct RepackPolicy {
  bool ptq1_transcode = true;
  WeightsMode weights = WeightsMode::Stream;
};
RepackPolicy repack_policy_from_env();

// A weight's decode-time copy in a HugeBuffer: file-layout `type` rows
// [n][row_bytes(type, k)], or (layout Lanes16) lanes_view()'s codes + scales.
struct Repack {
  Repack(DType t, size_t n_bytes, WeightLayout l = WeightLayout::File) : type(t), layout(l), bytes(n_bytes) {}
  DType type;
  WeightLayout layout;
  HugeBuffer bytes;
};

// The repack `policy` asks for w (nullptr: read w in place). Work is split
// across the pool.
std::unique_ptr<Repack> make_repack(const Weight& w, const RepackPolicy& policy, ThreadPool& pool, Isa isa);

}  // namespace bonsai::cpu
