// The prefill GDN alpha/beta rows on the tensor cores: alpha / beta_in [t][n_v] = x [t][k] · the
// raw ssm_alpha / ssm_beta rows (F32, F16 or BF16 [n_v][k]), as mma.sync m16n8k8 TF32 products
// with fp32 accumulators.
//
// Precision. alpha feeds g = ssm_a·softplus(alpha + dt_bias) and the decay exp(g), so an error
// δ in alpha is a relative error of up to |ssm_a|·δ in every decay, compounded over the tokens
// the state remembers; beta feeds a sigmoid (slope <= 1/4). Plain TF32 rounds x to 11
// significant bits: δ up to 2^-11·Σ|x_c w_c|, and over k = 5120 terms of mixed sign Σ|x w| is
// easily 10..100x |alpha|: errors up to 1e-3..1e-2 in g (worst case; rounding errors partly
// cancel), far above the fp32 SIMT kernel (~1e-6) that the gate and the CUDA tests were tuned
// on. So the operands are split: x = x_hi + x_lo (x_hi = tf32(x), x_lo = tf32(x - x_hi),
// x - x_hi exact in fp32), and alike for F32 weights;
// F16 and BF16 weights are exact in TF32 (10 / 7 fraction bits, 8 exponent bits >= F16's 5).
// The products x_hi·w_hi + x_lo·w_hi (+ x_hi·w_lo for F32) drop only x_lo·w_lo and the two
// rounding residues, each <= 2^-22·|x w|; TF32 x TF32 products are exact in fp32. With the
// accumulation (fp32, n adds in the tensor core's and the block reduction's order) the result
// is within (3·2^-22 + n·2^-23)·Σ|x w| of the exact sum: fp32's accuracy, tested so in
// tests/test_backend_cuda_gdn_ab.cpp. The 2-3x tensor-core work costs nothing measurable: on
// the H200 (27B, t = 512, BF16 rows) session 6's launch took 31-33 us under ncu: its 128 blocks
// read 128 x (320 KB of x + 240 KB of weights) = 72 MB from L2 at ~2.2 TB/s, and ptxas kept only
// one chunk's loads in registers (68 registers: the "4 chunks in flight" were issued one by one).
// Session 7: the next kUnroll chunks are loaded into a second set of registers while the current
// ones are multiplied (kPipe; 130 registers): 27.1 -> 15.5 us in the microbenchmark, 30.2 -> 18.3
// us per layer under ncu (docs/performance.md, session 7: the GDN pipeline). Fewer rows per
// block (more blocks) read x more often and measured slower.
//
// Layout (the default variant). Block per (24 of the 2·n_v rows: three n8 tiles, 16 tokens: one m16 tile), 8
// warps splitting k in chunks of 16 columns (warp w takes chunks w, w+8, ...); the 8 warps' partial tiles are
// added in warp order through shared memory (deterministic). Within a chunk, lane (g = lane/4, q = lane%4)
// loads the float4 of columns 16c + 4q .. +3 of tokens g and g+8 and of weight rows g of each n8 tile, and
// feeds elements 0,1 as the mma's k = q, q+4 and elements 2,3 to a second mma: a permutation of the 16
// columns, the same for the A and B operands, so the products pair up as in the plain order. The grid runs
// the row groups of one token tile next to each other (blockIdx.x), so x is read from DRAM once and from L2
// by the others.
#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "bonsai/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gdn_ab_mma.h"
#include "kernels/cuda/knobs.h"
#include "kernels/cuda/tf32_split.cuh"

namespace bonsai::cuda {
namespace {

constexpr int kTok = 16;  // tokens per block: one m16 tile
constexpr int kWarps = 8;

using tc::mma_tf32;  // kernels/cuda/tf32_split.cuh
using tc::split_tf32;
using tc::to_tf32;

// Elements c .. c+3 of a raw row (c % 4 == 0; the row aligned as gdn_ab_mma_fits requires).
template <RawType T>
__device__ __forceinline__ float4 load4(const uint8_t* row, int c) {
  if constexpr (T == RawType::F32) {
    return __ldg(reinterpret_cast<const float4*>(row) + c / 4);
  } else {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(row) + c / 4);
    if constexpr (T == RawType::F16) {
      const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
      const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
      return make_float4(lo.x, lo.y, hi.x, hi.y);
    } else {  // BF16: the high half of an fp32 (little-endian: element c in the low bits)
      return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                         __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
    }
  }
}

// One k8 step: A columns (x of tokens g, g+8 at the two permuted columns), B the weights.
template <RawType T, int kTiles>
__device__ __forceinline__ void step(float (&acc)[kTiles][4], float xa0, float xa1, float xb0, float xb1,
                                     const float (&w0)[kTiles], const float (&w1)[kTiles]) {
  uint32_t hi[4], lo[4];  // a0 (g, q), a1 (g+8, q), a2 (g, q+4), a3 (g+8, q+4)
  split_tf32(xa0, hi[0], lo[0]);
  split_tf32(xb0, hi[1], lo[1]);
  split_tf32(xa1, hi[2], lo[2]);
  split_tf32(xb1, hi[3], lo[3]);
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    if constexpr (T == RawType::F32) {
      uint32_t bh0, bl0, bh1, bl1;
      split_tf32(w0[j], bh0, bl0);
      split_tf32(w1[j], bh1, bl1);
      mma_tf32(acc[j], lo, bh0, bh1);  // the small terms first
      mma_tf32(acc[j], hi, bl0, bl1);
      mma_tf32(acc[j], hi, bh0, bh1);
    } else {  // exact in TF32
      const uint32_t b0 = __float_as_uint(w0[j]), b1 = __float_as_uint(w1[j]);
      mma_tf32(acc[j], lo, b0, b1);
      mma_tf32(acc[j], hi, b0, b1);
    }
  }
}

// The loads of kUnroll 16-column chunks of one warp (chunks c0, c0 + kWarps, ...): x of tokens g
// and g + 8, and the kTiles weight rows; columns past k read as zeros (they add +0 products).
template <RawType T, int kTiles, int kUnroll>
struct AbLoads {
  float4 a[kUnroll], b[kUnroll], w[kUnroll][kTiles];
  __device__ __forceinline__ void load(const float* xa, const float* xb, const uint8_t* const (&rows)[kTiles],
                                       int c0, int q, int k) {
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int col = (c0 + u * kWarps) * 16 + 4 * q;
      const bool in = col < k;  // k % 4 == 0: a float4 is whole or past the end (zeros)
      a[u] = in ? *reinterpret_cast<const float4*>(xa + col) : zero;
      b[u] = in ? *reinterpret_cast<const float4*>(xb + col) : zero;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) w[u][j] = in ? load4<T>(rows[j], col) : zero;
    }
  }
  __device__ __forceinline__ void mma(float (&acc)[kTiles][4]) const {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float w0[kTiles], w1[kTiles], w2[kTiles], w3[kTiles];
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        w0[j] = w[u][j].x;
        w1[j] = w[u][j].y;
        w2[j] = w[u][j].z;
        w3[j] = w[u][j].w;
      }
      step<T, kTiles>(acc, a[u].x, a[u].y, b[u].x, b[u].y, w0, w1);
      step<T, kTiles>(acc, a[u].z, a[u].w, b[u].z, b[u].w, w2, w3);
    }
  }
};

// kTiles n8 tiles of rows per block, kUnroll chunks per warp loaded together; kPipe: the next
// kUnroll chunks are loaded before the current ones are multiplied (two sets of registers). Every
// variant adds a warp's chunks in the same order (c0 = warp, warp + kWarps, ...) and the warps in
// warp order: the same sums, bit for bit.
template <RawType T, int kTiles, int kUnroll, bool kPipe>
__global__ void __launch_bounds__(kWarps * 32)
    gdn_ab_mma_kernel(const float* __restrict__ x, const uint8_t* __restrict__ wa,
                      const uint8_t* __restrict__ wb, size_t row_bytes, int k, int n_v, int t,
                      float* __restrict__ alpha, float* __restrict__ beta_in) {
  constexpr int kRows = 8 * kTiles;
  __shared__ float part[kWarps][kTok][kRows];
  pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int rows = 2 * n_v, row0 = blockIdx.x * kRows, i0 = blockIdx.y * kTok;
  const uint8_t* w[kTiles];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int rr = min(row0 + 8 * j + g, rows - 1);  // rows past 2·n_v read the last one, not stored
    w[j] =
        rr < n_v ? wa + static_cast<size_t>(rr) * row_bytes : wb + static_cast<size_t>(rr - n_v) * row_bytes;
  }
  pdl_wait();
  // tokens past t read token t-1 and are not stored
  const float* xa = x + static_cast<int64_t>(min(i0 + g, t - 1)) * k;
  const float* xb = x + static_cast<int64_t>(min(i0 + g + 8, t - 1)) * k;
  float acc[kTiles][4] = {};
  const int chunks = (k + 15) / 16;
  constexpr int kStride = kWarps * kUnroll;
  if constexpr (kPipe) {
    AbLoads<T, kTiles, kUnroll> cur, next;
    cur.load(xa, xb, w, warp, q, k);
    for (int c0 = warp; c0 < chunks; c0 += kStride) {
      next.load(xa, xb, w, c0 + kStride, q, k);  // past the end: predicated off (zeros)
      cur.mma(acc);
      cur = next;
    }
  } else {
    for (int c0 = warp; c0 < chunks; c0 += kStride) {
      AbLoads<T, kTiles, kUnroll> cur;
      cur.load(xa, xb, w, c0, q, k);
      cur.mma(acc);
    }
  }
  // c0 (g, 2q), c1 (g, 2q+1), c2 (g+8, 2q), c3 (g+8, 2q+1) of each n8 tile
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    part[warp][g][8 * j + 2 * q] = acc[j][0];
    part[warp][g][8 * j + 2 * q + 1] = acc[j][1];
    part[warp][g + 8][8 * j + 2 * q] = acc[j][2];
    part[warp][g + 8][8 * j + 2 * q + 1] = acc[j][3];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kTok * kRows; e += kWarps * 32) {
    const int i = e / kRows, r = e % kRows, token = i0 + i, row = row0 + r;
    if (token >= t || row >= rows) continue;
    float v = 0.0f;
#pragma unroll
    for (int ww = 0; ww < kWarps; ++ww) v += part[ww][i][r];
    if (row < n_v)
      alpha[static_cast<int64_t>(token) * n_v + row] = v;
    else
      beta_in[static_cast<int64_t>(token) * n_v + row - n_v] = v;
  }
}

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

GdnAbKernel gdn_ab_kernel() {
  // simt: fp32 dot products, mma (default): tensor cores; parsed in kernels/cuda/knobs.cpp.
  static const GdnAbKernel kernel = knob::gdn_ab_mma() ? GdnAbKernel::mma : GdnAbKernel::simt;
  return kernel;
}

bool gdn_ab_mma_fits(const float* x, const uint8_t* wa, const uint8_t* wb, size_t row_bytes, RawType type,
                     int k) {
  if (type != RawType::F32 && type != RawType::F16 && type != RawType::BF16) return false;
  const size_t wal = type == RawType::F32 ? 16 : 8;
  return k > 0 && k % 4 == 0 && aligned(x, 16) && aligned(wa, wal) && aligned(wb, wal) &&
         row_bytes % wal == 0;
}

namespace {

template <RawType T, int kTiles, int kUnroll, bool kPipe>
void launch_ab(const float* x, const uint8_t* wa, const uint8_t* wb, size_t row_bytes, int k, int n_v, int t,
               float* alpha, float* beta_in, cudaStream_t s) {
  constexpr int kRows = 8 * kTiles;
  const dim3 grid(static_cast<unsigned>((2 * n_v + kRows - 1) / kRows),
                  static_cast<unsigned>((t + kTok - 1) / kTok));
  launch(gdn_ab_mma_kernel<T, kTiles, kUnroll, kPipe>, grid, kWarps * 32, 0, s, x, wa, wb, row_bytes, k, n_v,
         t, alpha, beta_in);
}

// Variant v of kGdnAbMmaVariants: (n8 tiles per block, chunks loaded together, pipelined).
template <RawType T>
void launch_variant(int v, const float* x, const uint8_t* wa, const uint8_t* wb, size_t row_bytes, int k,
                    int n_v, int t, float* alpha, float* beta_in, cudaStream_t s) {
  switch (v) {
    case 0:
      return launch_ab<T, 3, 4, false>(x, wa, wb, row_bytes, k, n_v, t, alpha, beta_in, s);
    case 1:
      return launch_ab<T, 3, 8, false>(x, wa, wb, row_bytes, k, n_v, t, alpha, beta_in, s);
    case 2:
      return launch_ab<T, 3, 4, true>(x, wa, wb, row_bytes, k, n_v, t, alpha, beta_in, s);
    case 3:
      return launch_ab<T, 2, 4, true>(x, wa, wb, row_bytes, k, n_v, t, alpha, beta_in, s);
    case 4:
      return launch_ab<T, 1, 4, true>(x, wa, wb, row_bytes, k, n_v, t, alpha, beta_in, s);
    default:
      return launch_ab<T, 1, 8, false>(x, wa, wb, row_bytes, k, n_v, t, alpha, beta_in, s);
  }
}

}  // namespace

int gdn_ab_mma_variant() {
  static const int variant = knob::gdn_ab_variant();  // 0..kGdnAbMmaVariants - 1
  return variant;
}

void gdn_ab_mma(const float* x, const uint8_t* wa, const uint8_t* wb, size_t row_bytes, RawType type, int k,
                int n_v, int t, float* alpha, float* beta_in, cudaStream_t s, int variant) {
  const int v = variant < 0 ? gdn_ab_mma_variant() : std::min(variant, kGdnAbMmaVariants - 1);
  if (type == RawType::F32)
    launch_variant<RawType::F32>(v, x, wa, wb, row_bytes, k, n_v, t, alpha, beta_in, s);
  else if (type == RawType::F16)
    launch_variant<RawType::F16>(v, x, wa, wb, row_bytes, k, n_v, t, alpha, beta_in, s);
  else
    launch_variant<RawType::BF16>(v, x, wa, wb, row_bytes, k, n_v, t, alpha, beta_in, s);
}

void gdn_ab_rows(const float* x, const uint8_t* wa, const uint8_t* wb, size_t row_bytes, RawType type, int k,
                 int n_v, int t, float* alpha, float* beta_in, GdnAbKernel kernel, cudaStream_t s) {
  if (kernel == GdnAbKernel::mma && t >= kGdnAbMmaMinTokens && gdn_ab_mma_fits(x, wa, wb, row_bytes, type, k))
    gdn_ab_mma(x, wa, wb, row_bytes, type, k, n_v, t, alpha, beta_in, s);
  else
    gdn_ab_batch(x, wa, wb, row_bytes, type, k, n_v, t, alpha, beta_in, s);
}

}  // namespace bonsai::cuda
