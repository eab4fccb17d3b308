// Ternary matvec on the int8 tensor cores, the activation quantizer, the raw
// (file-layout) matvec for small float tensors, the load-time repack and the
// embedding gather. Layouts: kernels/cuda/tile_layout.h.
#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {
namespace {

// ---- activation quantization ------------------------------------------------------

__global__ void quantize_kernel(const float* __restrict__ x, uint8_t* __restrict__ xq,
                                float4* __restrict__ meta, int64_t blocks, int kblocks, int64_t k) {
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (blk >= blocks) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = blk / kblocks, kb = blk % kblocks;
  const float4 v = *reinterpret_cast<const float4*>(x + row * k + kb * kBlockK + lane * 4);
  quantize_block(v, lane, reinterpret_cast<uint32_t*>(xq + blk * kActBytes), meta + blk);
}

// ---- tiled ternary matvec ----------------------------------------------------------------

__device__ __forceinline__ void mma_u8s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

constexpr int kWarps = 8;   // warps per block; they split the k-blocks of one 32-row pair
constexpr int kUnroll = 4;  // k-blocks each warp has in flight
constexpr int kTok = 4;     // tokens per block: B columns 2i, 2i+1 are token i's hi, lo

// Block (pair of tiles, group of 4 tokens). Warp w handles k-blocks w, w+8, ...;
// lane (g, tig) ends up holding token tig's sums for rows g and g+8 of both tiles,
// and the warps' partial sums are added in shared memory.
template <int G>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_tiled_kernel(TiledJobs jobs, const uint8_t* __restrict__ xq, const float4* __restrict__ meta,
                        int t, int kblocks) {
  __shared__ float red[kWarps][kTok][kPairRows];
  // blockIdx.x enumerates the pairs of every job in turn. (Constant indices only: a
  // run-time index into the parameter struct would copy it to local memory.)
  int pair = blockIdx.x;
  TiledJob job = jobs.job[0];
  bool found = false;
#pragma unroll
  for (int j = 0; j < kMaxJobs; ++j) {
    const int pairs = static_cast<int>(tiled_pairs(jobs.job[j].n));
    if (!found && j < jobs.count) {
      if (pair < pairs || j == jobs.count - 1) {
        job = jobs.job[j];
        found = true;
      } else {
        pair -= pairs;
      }
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int tok0 = blockIdx.y * kTok, ntok = min(kTok, t - tok0);
  constexpr int CB = kCodeBytes + 32 * G;
  const size_t tile_stride = static_cast<size_t>(kblocks) * CB;
  const uint8_t* base = job.w + static_cast<size_t>(pair) * 2 * tile_stride;
  const bool has_x = g < 2 * ntok;  // B column g is token g/2's hi (g even) or lo (g odd)
  const uint8_t* xp =
      xq + static_cast<size_t>(tok0 + (has_x ? g >> 1 : 0)) * kblocks * kActBytes + (g & 1) * 128 + tig * 32;
  const float4* mp = meta + static_cast<size_t>(tok0 + min(tig, ntok - 1)) * kblocks;

  float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [tile][row g, row g + 8]
  for (int kb0 = warp; kb0 < kblocks; kb0 += kWarps * kUnroll) {
    uint4 wc[kUnroll][2], xa[kUnroll][2];
    uint32_t sc[kUnroll][2][G];
    float4 m[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // all loads first: kUnroll x 1 KB of weights per warp in flight
      const int kb = kb0 + u * kWarps;
      if (kb < kblocks) {
#pragma unroll
        for (int tile = 0; tile < 2; ++tile) {
          const uint8_t* chunk = base + tile * tile_stride + static_cast<size_t>(kb) * CB;
          wc[u][tile] = __ldcs(reinterpret_cast<const uint4*>(chunk + lane * 16));
#pragma unroll
          for (int sub = 0; sub < G; ++sub)
            sc[u][tile][sub] =
                __ldcs(reinterpret_cast<const unsigned*>(chunk + kCodeBytes + sub * 32 + g * 4));
        }
        if (has_x) {
          xa[u][0] = __ldg(reinterpret_cast<const uint4*>(xp + static_cast<size_t>(kb) * kActBytes));
          xa[u][1] = __ldg(reinterpret_cast<const uint4*>(xp + static_cast<size_t>(kb) * kActBytes + 16));
        } else {
          xa[u][0] = xa[u][1] = make_uint4(0, 0, 0, 0);
        }
        m[u] = __ldg(mp + kb);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kb = kb0 + u * kWarps;
      if (kb < kblocks) {
        const uint32_t xb[8] = {xa[u][0].x, xa[u][0].y, xa[u][0].z, xa[u][0].w,
                                xa[u][1].x, xa[u][1].y, xa[u][1].z, xa[u][1].w};
#pragma unroll
        for (int tile = 0; tile < 2; ++tile) {
          const uint32_t wd[4] = {wc[u][tile].x, wc[u][tile].y, wc[u][tile].z, wc[u][tile].w};
#pragma unroll
          for (int sub = 0; sub < 2; ++sub) {
            int c[4] = {0, 0, 0, 0};
#pragma unroll
            for (int st = 0; st < 2; ++st) {
              const int s = sub * 2 + st;
              const uint32_t w = wd[s], mask = 0x03030303u;
              mma_u8s8(c, w & mask, (w >> 2) & mask, (w >> 4) & mask, (w >> 6) & mask, xb[2 * s],
                       xb[2 * s + 1]);
            }
            const float sx = sub ? m[u].y : m[u].x;
            const int sq = __float_as_int(sub ? m[u].w : m[u].z);
            const float2 d =
                __half22float2(*reinterpret_cast<const __half2*>(&sc[u][tile][G == 2 ? sub : 0]));
            acc[tile][0] += static_cast<float>(256 * c[0] + c[1] - sq) * (d.x * sx);
            acc[tile][1] += static_cast<float>(256 * c[2] + c[3] - sq) * (d.y * sx);
          }
        }
      }
    }
  }
  red[warp][tig][g] = acc[0][0];
  red[warp][tig][g + 8] = acc[0][1];
  red[warp][tig][16 + g] = acc[1][0];
  red[warp][tig][24 + g] = acc[1][1];
  __syncthreads();
  if (threadIdx.x < kTok * kPairRows) {
    const int tok = threadIdx.x / kPairRows, r = threadIdx.x % kPairRows, row = pair * kPairRows + r;
    if (tok < ntok && row < job.n) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red[w][tok][r];
      job.y[static_cast<size_t>(tok0 + tok) * job.n + row] = sum;
    }
  }
}

// ---- repack ---------------------------------------------------------------------------

__device__ __forceinline__ int raw_code(const uint8_t* row, int64_t col, int groups) {
  if (groups == 1) return (row[(col >> 7) * 34 + 2 + ((col & 127) >> 2)] >> (2 * (col & 3))) & 3;
  return (row[(col >> 6) * 18 + 2 + ((col & 63) >> 2)] >> (2 * (col & 3))) & 3;
}

// Thread per destination code word (chunk, lane, step).
__global__ void repack_codes_kernel(const uint8_t* __restrict__ src, size_t row_bytes, int64_t rows,
                                    int kblocks, int groups, int64_t words, uint8_t* __restrict__ dst) {
  const int64_t wi = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (wi >= words) return;
  const int64_t chunk = wi / 128;
  const int lane = static_cast<int>(wi % 128) / 4, step = static_cast<int>(wi % 4);
  const int64_t tile = chunk / kblocks, kb = chunk % kblocks;
  const int g = lane >> 2, tig = lane & 3;
  uint32_t word = 0;
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) {
    const int64_t r = tile * kTileRows + g + 8 * (jj & 1);
    if (r >= rows) continue;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int64_t col = kb * kBlockK + step * 32 + (jj >> 1) * 16 + tig * 4 + b;
      word |= static_cast<uint32_t>(raw_code(src + r * row_bytes, col, groups)) << (8 * b + 2 * jj);
    }
  }
  *reinterpret_cast<uint32_t*>(dst + chunk * chunk_bytes(groups) + lane * 16 + step * 4) = word;
}

// Thread per destination scale word (chunk, sub, g).
__global__ void repack_scales_kernel(const uint8_t* __restrict__ src, size_t row_bytes, int64_t rows,
                                     int kblocks, int groups, int64_t words, uint8_t* __restrict__ dst) {
  const int64_t wi = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (wi >= words) return;
  const int per_chunk = 8 * groups;
  const int64_t chunk = wi / per_chunk;
  const int sub = static_cast<int>(wi % per_chunk) / 8, g = static_cast<int>(wi % 8);
  const int64_t tile = chunk / kblocks, kb = chunk % kblocks;
  uint32_t word = 0;
  for (int upper = 0; upper < 2; ++upper) {
    const int64_t r = tile * kTileRows + g + 8 * upper;
    if (r >= rows) continue;
    const uint8_t* p = src + r * row_bytes + (groups == 1 ? kb * 34 : (kb * 2 + sub) * 18);
    word |= static_cast<uint32_t>(*reinterpret_cast<const unsigned short*>(p)) << (16 * upper);
  }
  *reinterpret_cast<uint32_t*>(dst + chunk * chunk_bytes(groups) + kCodeBytes + sub * 32 + g * 4) = word;
}

// ---- raw (file layout) weights ------------------------------------------------------------

template <RawType T>
__device__ __forceinline__ float raw_elem(const uint8_t* row, int64_t c) {
  if constexpr (T == RawType::F32) {
    return reinterpret_cast<const float*>(row)[c];
  } else if constexpr (T == RawType::F16) {
    return __half2float(reinterpret_cast<const __half*>(row)[c]);
  } else if constexpr (T == RawType::BF16) {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[c]);
  } else if constexpr (T == RawType::Q8_0) {
    const uint8_t* b = row + (c >> 5) * 34;
    return static_cast<float>(static_cast<int8_t>(b[2 + (c & 31)])) * load_half(b);
  } else if constexpr (T == RawType::Q1_0) {
    const uint8_t* b = row + (c >> 7) * 18;
    const float d = load_half(b);
    return ((b[2 + ((c & 127) >> 3)] >> (c & 7)) & 1) ? d : -d;
  } else if constexpr (T == RawType::Q2_128) {
    return static_cast<float>(raw_code(row, c, 1) - 1) * load_half(row + (c >> 7) * 34);
  } else {
    return static_cast<float>(raw_code(row, c, 2) - 1) * load_half(row + (c >> 6) * 18);
  }
}

// Block per row; 16-bit and f32 rows are read 16 bytes at a time when aligned.
template <RawType T>
__global__ void __launch_bounds__(128)
    matvec_raw_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int64_t k,
                      const float* __restrict__ x, float* __restrict__ y, int t) {
  const int row = blockIdx.x;
  const uint8_t* wr = w + static_cast<size_t>(row) * row_bytes;
  constexpr bool kHalf = T == RawType::F16 || T == RawType::BF16;
  constexpr int V = kHalf ? 8 : 4;  // elements per 16-byte load
  const bool vec = (T == RawType::F32 || kHalf) && k % V == 0 && row_bytes % 16 == 0;
  for (int i = 0; i < t; ++i) {
    const float* xi = x + static_cast<int64_t>(i) * k;
    float acc = 0.0f;
    if (vec) {
      for (int64_t c = threadIdx.x * V; c < k; c += blockDim.x * V) {
        const uint4 raw = *reinterpret_cast<const uint4*>(wr + c * (kHalf ? 2 : 4));
        const float4 x0 = *reinterpret_cast<const float4*>(xi + c);
        if constexpr (kHalf) {
          const float4 x1 = *reinterpret_cast<const float4*>(xi + c + 4);
          const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
          const uint8_t* rb = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc += raw_elem<T>(rb, e) * xs[e];
        } else {
          acc += __uint_as_float(raw.x) * x0.x + __uint_as_float(raw.y) * x0.y +
                 __uint_as_float(raw.z) * x0.z + __uint_as_float(raw.w) * x0.w;
        }
      }
    } else {
      for (int64_t c = threadIdx.x; c < k; c += blockDim.x) acc += raw_elem<T>(wr, c) * xi[c];
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) y[static_cast<int64_t>(i) * n + row] = acc;
  }
}

template <RawType T>
__global__ void embed_raw_kernel(const uint8_t* __restrict__ table, size_t row_bytes, int64_t k,
                                 const int32_t* __restrict__ tokens, float* __restrict__ out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= k) return;
  const int i = blockIdx.y;
  out[static_cast<int64_t>(i) * k + c] = raw_elem<T>(table + static_cast<size_t>(tokens[i]) * row_bytes, c);
}

__global__ void embed_tiled_kernel(const uint8_t* __restrict__ table, int64_t k, int groups,
                                   const int32_t* __restrict__ tokens, float* __restrict__ out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= k) return;
  const int i = blockIdx.y;
  const int64_t tok = tokens[i], kblocks = k / kBlockK;
  const int r = static_cast<int>(tok % kTileRows), kk = static_cast<int>(c % kBlockK);
  const uint8_t* chunk = table + ((tok / kTileRows) * kblocks + c / kBlockK) * chunk_bytes(groups);
  const CodePos p = code_pos(r, kk);
  const int code = (chunk[p.byte] >> p.shift) & 3;
  const float d = load_half(chunk + scale_pos(r, groups == 2 ? kk >> 6 : 0));
  out[static_cast<int64_t>(i) * k + c] = static_cast<float>(code - 1) * d;
}

template <template <RawType> class Fn, class... Args>
void dispatch_raw(RawType type, Args&&... args) {
  switch (type) {
    case RawType::F32:
      Fn<RawType::F32>::run(args...);
      break;
    case RawType::F16:
      Fn<RawType::F16>::run(args...);
      break;
    case RawType::BF16:
      Fn<RawType::BF16>::run(args...);
      break;
    case RawType::Q8_0:
      Fn<RawType::Q8_0>::run(args...);
      break;
    case RawType::Q1_0:
      Fn<RawType::Q1_0>::run(args...);
      break;
    case RawType::Q2_128:
      Fn<RawType::Q2_128>::run(args...);
      break;
    case RawType::Q2_64:
      Fn<RawType::Q2_64>::run(args...);
      break;
  }
}

template <RawType T>
struct MatvecRaw {
  static void run(const uint8_t* w, size_t row_bytes, int64_t n, int64_t k, const float* x, float* y, int t,
                  cudaStream_t s) {
    matvec_raw_kernel<T>
        <<<static_cast<unsigned>(n), 128, 0, s>>>(w, row_bytes, static_cast<int>(n), k, x, y, t);
  }
};

template <RawType T>
struct EmbedRaw {
  static void run(const uint8_t* table, size_t row_bytes, int64_t k, const int32_t* tokens, int t, float* out,
                  cudaStream_t s) {
    embed_raw_kernel<T><<<dim3(blocks_for(k, 256), t), 256, 0, s>>>(table, row_bytes, k, tokens, out);
  }
};

}  // namespace

void quantize_act(const float* x, uint8_t* xq, float4* meta, int t, int64_t k, cudaStream_t s) {
  const int kblocks = static_cast<int>(k / kBlockK);
  const int64_t blocks = static_cast<int64_t>(t) * kblocks;
  quantize_kernel<<<blocks_for(blocks, 8), 256, 0, s>>>(x, xq, meta, blocks, kblocks, k);
}

void matvec_tiled(const TiledJobs& jobs, int groups, const uint8_t* xq, const float4* meta, int t, int64_t k,
                  cudaStream_t s) {
  int64_t pairs = 0;
  for (int j = 0; j < jobs.count; ++j) pairs += tiled_pairs(jobs.job[j].n);
  const dim3 grid(static_cast<unsigned>(pairs), static_cast<unsigned>((t + kTok - 1) / kTok));
  const int kblocks = static_cast<int>(k / kBlockK);
  if (groups == 2)
    matvec_tiled_kernel<2><<<grid, kWarps * 32, 0, s>>>(jobs, xq, meta, t, kblocks);
  else
    matvec_tiled_kernel<1><<<grid, kWarps * 32, 0, s>>>(jobs, xq, meta, t, kblocks);
}

void repack_tiled(const uint8_t* src, size_t row_bytes, int64_t rows, int64_t k, int groups, uint8_t* dst,
                  cudaStream_t s) {
  const int kblocks = static_cast<int>(k / kBlockK);
  const int64_t chunks = tiled_pairs(rows) * 2 * kblocks;
  repack_codes_kernel<<<blocks_for(chunks * 128, 256), 256, 0, s>>>(src, row_bytes, rows, kblocks, groups,
                                                                    chunks * 128, dst);
  repack_scales_kernel<<<blocks_for(chunks * 8 * groups, 256), 256, 0, s>>>(src, row_bytes, rows, kblocks,
                                                                            groups, chunks * 8 * groups, dst);
}

void matvec_raw(RawType type, const uint8_t* w, size_t row_bytes, int64_t n, int64_t k, const float* x,
                float* y, int t, cudaStream_t s) {
  dispatch_raw<MatvecRaw>(type, w, row_bytes, n, k, x, y, t, s);
}

void embed_raw(RawType type, const uint8_t* table, size_t row_bytes, int64_t k, const int32_t* tokens, int t,
               float* out, cudaStream_t s) {
  dispatch_raw<EmbedRaw>(type, table, row_bytes, k, tokens, t, out, s);
}

void embed_tiled(const uint8_t* table, int64_t k, int groups, const int32_t* tokens, int t, float* out,
                 cudaStream_t s) {
  embed_tiled_kernel<<<dim3(blocks_for(k, 256), t), 256, 0, s>>>(table, k, groups, tokens, out);
}

}  // namespace bonsai::cuda
