// Fast CPU matrix-vector products for decode: y[r] = Σ_k W[r,k]·x[k].
//
// Ternary weights (PQ2_0, Q2_0 g128/g64, PTQ1_0) are read in their file layout
// straight from the mmap, or (AVX-512 default) in the block-lanes layout the
// backend makes at load (below); the activation is quantized once per
// activation site into a PreparedAct, which every matvec sharing that input reuses.
//
// ---- Numerics (the central design decision) --------------------------------
// A ternary dot product Σ (c_j − 1)·d_b·x_j is computed per weight block b as
// d_b · s_b · (Σ_j c_j·q_j − Σ_j q_j), with x_j ≈ s_b·q_j quantized per
// activation block (128 elements; 64 for Q2_0 g64), codes c_j ∈ {0..3} used
// as unsigned bytes (vpdpbusd / vpmaddubsw) and the "−1" applied as the
// precomputed block sum Σ q_j. Integer sums are exact; float rounding enters
// only in s_b, d_b·s_b and the per-block float accumulation.
//
//   Precision::Faithful (default): q_j = round(x_j / s_b), s_b = amax_b / 32639,
//     stored as two int8 halves q = 256·hi + lo (hi, lo ∈ [−127, 127] and
//     [−128, 127]); each half is one int8 dot product, combined exactly in int32.
//     Per-element error |x_j − s_b q_j| ≤ s_b/2 = amax_b / 65278, so per row
//       |y − y_exact| ≤ Σ_b |d_b| · (s_b/2) · Σ_{j∈b} |c_j − 1|   (+ float rounding)
//     For Gaussian-like (rotated) activations the errors are independent and
//     the relative error of a whole matvec is ≈ amax/(rms·65278·√3) ≈ 3e-5
//     (amax/rms ≈ 3.5 over a 128-block), well under the 1e-4 budget that keeps
//     whole-model logits at cosine ≥ 0.999.
//   Precision::Int8: q_j = round(x_j / s_b), s_b = amax_b / 127, one int8 dot
//     product (half the integer work). Same bound with 127 in place of 32639:
//     relative error ≈ 7e-3 per matvec (the PrismML fork's level of fidelity).
//
// ---- Layouts ----------------------------------------------------------------
// The SIMD kernels unpack 2-bit codes with shifts (byte m of a block, shifted
// by 2s, holds element 4m+s) and PTQ1_0 trits with the ×3 trick (lane m of trit
// plane n holds element 16n+m, 80+8n+m or 120+2n+m), so codes come out in a
// permuted order. Rather than permuting codes (per weight, per row), the
// activation is laid out once in that permuted order: the ActLayout families.
// Blocks are grouped so that one group fills a 512-bit register (two 128-blocks
// or four 64-blocks); AVX2 and scalar kernels read the same layout.
//
// ---- The block-lanes weight layout (WeightLayout::Lanes16) --------------------
// For the AVX-512 kernels the CPU backend re-lays 128-blocks of 2-bit codes
// (PQ2_0, Q2_0 g128, and PTQ1_0 after its transcode) at load so that one
// 32-bit lane holds one *block* across a whole group of 16 blocks: the int32
// accumulators of vpdpbusd then sum each block in its own lane for 8 code
// registers in a row, and the per-block float work (fp16 scale, cvt, FMA)
// is paid once per 16 blocks instead of once per 2. Per row:
//   codes: groups of 16 blocks (2048 weights), 512 bytes = 8 chunks of 64 B;
//          byte 4b + i of chunk c = qs[4c + i] of block 16j + b (its lane b).
//          A tail group of g < 16 blocks uses chunks of 4g bytes (kernels load
//          it masked). Rows are lanes_code_row_bytes(k) apart (64-byte multiple).
//   scales: fp16 d of every block, [n][k/128], in a separate array.
// Same bytes as the file (up to 32 B of row padding when k/128 is odd).
// ActLayout::Lanes16 is the matching activation: per group j, chunk c and
// shift plane s, 64 bytes with byte 4b + i = q of element 16c + 4i + s of
// block 16j + b (byte 4c + i of a block holds elements 16c + 4i + s at bit 2s).
// A last group of g ≤ 8 blocks is "folded" (the kernel runs it in 4 chunk
// steps, chunks c and c + 4 in one register): its chunk c < 4 holds chunk c
// in lanes b < g and chunk c + 4 in lanes 8 + b; chunks 4..7 are zero.
//
// ---- The block-stream weight layout (WeightLayout::Stream16) -----------------
// The same 64-byte code chunks and fp16 scales as Lanes16, re-ordered so that
// a row group of RL = stream_group_rows(k) rows (4, or 8 for long rows: the
// rows the AVX-512 kernel walks side by side) is ONE sequential stream in the
// order the kernel consumes it; a thread's row range (a multiple of 8 rows)
// is then one linear read, as in the read-bandwidth loop, instead of RL code
// streams plus a scale stream. Per row group (the last one zero-padded to RL
// rows), for each full group j of 16 blocks (stream_group_stride(k) bytes):
//   codes  [8 chunks c][RL rows i][64 B]   = Lanes16 chunk c of row i, group j
//   scales [RL rows i][16 fp16]            = d of blocks 16j..16j+15 of row i
// then, for a tail group of g = (k/128) % 16 > 0 blocks, S = 4 (g ≤ 8) or 8
// steps of [RL rows][64 B]: g ≤ 8 "folded" (bytes 4b.. of step c = chunk c of
// block 16j + b, bytes 32 + 4b.. = its chunk c + 4, as the kernel's register
// holds them), g > 8 chunk c in bytes [0, 4g); zeros elsewhere; then
// [RL rows][g fp16], padded to 64 B. For the 27B's shapes this is exactly
// the file's bytes (k/128 = 40, 48, 136 blocks: tails of 8 or none).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>

#include "bonsai/formats.h"
#include "kernels/weight.h"
#include "runtime/cpu_features.h"
#include "runtime/thread_pool.h"

namespace bonsai::cpu {

enum class Precision : uint8_t { Faithful, Int8 };

// Activation layout families, one per weight-code arrangement.
enum class ActLayout : uint8_t {
  Q2x128 = 0,   // PQ2_0, Q2_0 g128: 2 blocks × 4 shift planes × 32 lanes per group
  Q2x64 = 1,    // Q2_0 g64: 4 blocks × 4 shift planes × 16 lanes per group
  Trit128 = 2,  // PTQ1_0: 2 blocks × 5 trit planes × 32 lanes (26 used) per group
  Lanes16 = 3,  // block-lanes weights: 16 blocks × 8 chunks × 4 shift planes per group
};
inline constexpr int kNumActLayouts = 4;
inline constexpr uint32_t layout_bit(ActLayout l) { return 1u << static_cast<unsigned>(l); }
inline constexpr uint32_t kAllActLayouts = (1u << kNumActLayouts) - 1;
// The layout bit a weight type needs in its file layout (0 for float types,
// which read PreparedAct::x); layouts_for(WeightView) below follows the view's layout.
uint32_t layouts_for(DType t);

// 64-byte aligned, grow-only storage (so steady-state prepare_act allocates nothing).
template <class T>
class AlignedBuffer {
 public:
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  size_t size() const { return n_; }
  void resize(size_t n) {  // contents are unspecified after a resize
    if (n > cap_) {
      p_.reset(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{64})));
      cap_ = n;
    }
    n_ = n;
  }

 private:
  struct Free {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<T, Free> p_;
  size_t n_ = 0, cap_ = 0;
};

// One activation quantized into one layout family. A "group" is what one
// 512-bit register holds: G blocks of B elements, as P planes of 64 bytes
// (Lanes16: 16 blocks as 8 chunks × 4 planes of 64 bytes, P = 32).
struct PackedAct {
  int64_t n_groups = 0;
  AlignedBuffer<int8_t> hi;     // [n_groups][P][64]  high half (int8 mode: the only half)
  AlignedBuffer<int8_t> lo;     // [n_groups][P][64]  low half (faithful only)
  AlignedBuffer<int32_t> corr;  // [n_groups][16]     −Σq of block h in int32 lane h·16/G, 0 elsewhere
  AlignedBuffer<float> scale;   // [n_groups][16]     s_b of block h in lanes [h·16/G, (h+1)·16/G)
};
inline constexpr int kLanesGroup = 16;  // blocks per Lanes16 group

struct PreparedAct {
  int64_t k = 0;
  Precision precision = Precision::Faithful;
  uint32_t layouts = 0;    // which `packed` entries are valid
  AlignedBuffer<float> x;  // [k] the activation as given (float-weight matvecs)
  PackedAct packed[kNumActLayouts];
  // prepare_act's scratch (natural-order q, per-block s and Σq), kept to avoid allocations.
  AlignedBuffer<int16_t> q_scratch;
  AlignedBuffer<float> s_scratch;
  AlignedBuffer<int32_t> sum_scratch;
};

// Quantize x[0..k) once for every layout in `layouts` (default: all ternary
// families; pass layouts_for(weight type) to skip the others). With a pool of
// more than one thread, a wide activation is quantized and packed in pieces
// of 16 blocks across it: the same bytes as on one thread.
void prepare_act(const float* x, int64_t k, Precision precision, PreparedAct& out,
                 uint32_t layouts = kAllActLayouts, ThreadPool* pool = nullptr);

enum class WeightLayout : uint8_t {
  File = 0,      // as stored in the GGUF
  Lanes16 = 1,   // block lanes (see "The block-lanes weight layout" above); PQ2_0 / Q2_0 g128 only
  Stream16 = 2,  // Lanes16 chunks, one sequential stream per row group (above); PQ2_0 / Q2_0 g128 only
};

// A weight matrix: n rows of k inputs. File layout: row r at
// data + r·row_bytes(type, k); types PQ2_0, Q2_0_G128, Q2_0_G64, PTQ1_0, F32,
// F16, BF16. Lanes16: codes row r at data + r·lanes_code_row_bytes(k), fp16
// scales [n][k/128] at `scales` (what make_lanes / the backend's repack write).
struct WeightView {
  DType type = DType::F32;
  const uint8_t* data = nullptr;
  int64_t n = 0;  // rows (outputs)
  int64_t k = 0;  // inputs
  WeightLayout layout = WeightLayout::File;
  const uint8_t* scales = nullptr;  // Lanes16 only: [n][k/128] fp16 (Stream16: interleaved, nullptr)
};
inline WeightView view_of(const Weight& w) { return {w.type, w.data, w.n, w.k}; }
uint32_t layouts_for(const WeightView& w);
// How far ahead (bytes) the Stream16 kernels prefetch a row group stream of `group_rows` rows
// into L2 (0: none), read once per process: BONSAI_CPU_STREAM_PF4 for 4-row groups (K <= 6144)
// and BONSAI_CPU_STREAM_PF8 for 8-row groups (K = 17408), each 0..65536, default 8192 for both;
// any other value is a UsageError (CpuBackend's constructor reads both, so it fails there).
// 4-row groups had no software prefetch until session 12 (on the 2-core development VM the
// hardware prefetchers kept up); on a 16-core Xeon 8 KiB ahead made the 27B's decode 1.3-1.6x
// faster at 2 to 16 threads: docs/performance.md, "CPU decode on 16 cores (session 12)".
int64_t stream_prefetch_bytes(int64_t group_rows);

// Lanes16 geometry: code bytes per row (k/128 blocks × 32, padded to 64) and
// the whole weight's bytes (codes, then the scales 64-byte aligned).
inline int64_t lanes_code_row_bytes(int64_t k) { return (k / 128 * 32 + 63) / 64 * 64; }
inline int64_t lanes_scales_offset(int64_t n, int64_t k) { return n * lanes_code_row_bytes(k); }
inline int64_t lanes_total_bytes(int64_t n, int64_t k) {
  return lanes_scales_offset(n, k) + n * (k / 128) * 2;
}
// Re-lays rows [r0, r1) of a PQ2_0 / Q2_0 g128 weight in its file layout
// (src.layout == File, src.k a multiple of 128) into the Lanes16 buffer `dst`
// of lanes_total_bytes(src.n, src.k) bytes (codes at dst, scales at
// dst + lanes_scales_offset). A lossless permutation of the bytes.
void pack_lanes_rows(const WeightView& src, uint8_t* dst, int64_t r0, int64_t r1);
// One row: k/128 file-layout blocks at src → lanes_code_row_bytes(k) code
// bytes at codes and k/128 fp16 at scales.
void pack_lanes_row(const uint8_t* src, int64_t k, uint8_t* codes, uint8_t* scales);
// The Lanes16 view of such a buffer.
inline WeightView lanes_view(DType type, const uint8_t* buf, int64_t n, int64_t k) {
  return {type, buf, n, k, WeightLayout::Lanes16, buf + lanes_scales_offset(n, k)};
}

// Stream16 geometry (layout above): rows per row group, bytes of one full
// group of 16 blocks for a row group, bytes of the tail part, of a row group,
// of the whole weight.
inline int stream_group_rows(int64_t k) { return lanes_code_row_bytes(k) * 4 > 8192 ? 8 : 4; }
inline int64_t stream_group_stride(int64_t k) { return 544 * stream_group_rows(k); }
inline int64_t stream_tail_bytes(int64_t k) {
  const int64_t g = k / 128 % 16, rl = stream_group_rows(k);
  return g == 0 ? 0 : ((g <= 8 ? 4 : 8) * 64 * rl + 2 * g * rl + 63) / 64 * 64;
}
inline int64_t stream_rowgroup_bytes(int64_t k) {
  return k / 2048 * stream_group_stride(k) + stream_tail_bytes(k);
}
inline int64_t stream_total_bytes(int64_t n, int64_t k) {
  const int rl = stream_group_rows(k);
  return (n + rl - 1) / rl * stream_rowgroup_bytes(k);
}
// Re-lays rows [r0, r1) (r0 and r1 multiples of stream_group_rows(src.k), or
// r1 == src.n) of a file-layout PQ2_0 / Q2_0 g128 weight into the Stream16
// buffer dst of stream_total_bytes(src.n, src.k) bytes (padding rows zeroed).
void pack_stream_rows(const WeightView& src, uint8_t* dst, int64_t r0, int64_t r1);
inline WeightView stream_view(DType type, const uint8_t* buf, int64_t n, int64_t k) {
  return {type, buf, n, k, WeightLayout::Stream16, nullptr};
}

// y[r] for r in [r0, r1) on the calling thread.
void matvec_rows(const WeightView& w, const PreparedAct& a, float* y, int64_t r0, int64_t r1, Isa isa);

// y[0..w.n) split across the pool's threads.
void matvec(const WeightView& w, const PreparedAct& a, float* y, ThreadPool& pool, Isa isa);

// Several weights sharing one input (q/k/v, qkv/z, gate/up): the rows of all
// of them are split across the threads in one parallel_for (one barrier).
struct MatvecJob {
  WeightView w;
  float* y;  // [w.n]
};
void matvec_multi(std::span<const MatvecJob> jobs, const PreparedAct& a, ThreadPool& pool, Isa isa);

// Bit-exact PTQ1_0 → PQ2_0 transcode of a whole weight (w.type must be
// PTQ1_0; dst holds w.n rows of row_bytes(PQ2_0, w.k)). For a backend that
// repacks PTQ1_0 at load (+21 % bytes) to stream it at PQ2_0 speed; the rows
// are split across the pool.
void transcode_ptq1_to_pq2(const WeightView& w, uint8_t* dst, ThreadPool& pool, Isa isa);
// The same for rows [r0, r1) on the calling thread (dst: row r0's output).
void transcode_ptq1_rows(const WeightView& w, uint8_t* dst, int64_t r0, int64_t r1, Isa isa);

}  // namespace bonsai::cpu
