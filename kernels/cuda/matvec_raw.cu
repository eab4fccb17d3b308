// The file-layout side of the linear kernels: the load-time repack of 2-bit rows into
// the tiled layout of the tensor-core matvec (kernels/cuda/tile_layout.h), the raw
// (file-layout) matvec for small float tensors, and the embedding gather.
#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tile_layout.h"

namespace bonsai::cuda {
namespace {

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

// Block per row of any job; 16-bit and f32 rows are read 16 bytes at a time when aligned.
template <RawType T>
__global__ void __launch_bounds__(128)
    matvec_raw_kernel(RawJobs jobs, size_t row_bytes, int64_t k, const float* __restrict__ x, int t) {
  pdl_trigger();
  pdl_wait();
  int row = blockIdx.x;
  RawJob job = jobs.job[0];
  bool found = false;
#pragma unroll
  for (int j = 0; j < kMaxJobs; ++j)  // constant indices only (see matvec_tiled_kernel)
    if (!found && j < jobs.count) {
      if (row < jobs.job[j].n) {
        job = jobs.job[j];
        found = true;
      } else {
        row -= jobs.job[j].n;
      }
    }
  const uint8_t* wr = job.w + static_cast<size_t>(row) * row_bytes;
  constexpr bool kHalf = T == RawType::F16 || T == RawType::BF16;
  constexpr int V = kHalf ? 8 : 4;  // elements per 16-byte load
  const bool vec = (T == RawType::F32 || kHalf) && k % V == 0 && row_bytes % 16 == 0;
  for (int i = 0; i < t; ++i) {
    const float* xi = x + static_cast<int64_t>(i) * k;
    float acc = 0.0f;
    if (vec) {
#pragma unroll 4
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
    if (threadIdx.x == 0) job.y[static_cast<int64_t>(i) * job.n + row] = acc;
  }
}

template <RawType T>
__global__ void embed_raw_kernel(const uint8_t* __restrict__ table, size_t row_bytes, int64_t k,
                                 const int32_t* __restrict__ tokens, float* __restrict__ out) {
  pdl_trigger();
  pdl_wait();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= k) return;
  const int i = blockIdx.y;
  out[static_cast<int64_t>(i) * k + c] = raw_elem<T>(table + static_cast<size_t>(tokens[i]) * row_bytes, c);
}

__global__ void embed_tiled_kernel(const uint8_t* __restrict__ table, int64_t k, int groups,
                                   const int32_t* __restrict__ tokens, float* __restrict__ out) {
  pdl_trigger();
  pdl_wait();
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
  static void run(const RawJobs& jobs, size_t row_bytes, int64_t k, const float* x, int t, cudaStream_t s) {
    int rows = 0;
    for (int j = 0; j < jobs.count; ++j) rows += jobs.job[j].n;
    launch(matvec_raw_kernel<T>, static_cast<unsigned>(rows), 128, 0, s, jobs, row_bytes, k, x, t);
  }
};

template <RawType T>
struct EmbedRaw {
  static void run(const uint8_t* table, size_t row_bytes, int64_t k, const int32_t* tokens, int t, float* out,
                  cudaStream_t s) {
    launch(embed_raw_kernel<T>, dim3(blocks_for(k, 256), t), 256, 0, s, table, row_bytes, k, tokens, out);
  }
};

}  // namespace

void repack_tiled(const uint8_t* src, size_t row_bytes, int64_t rows, int64_t k, int groups, uint8_t* dst,
                  cudaStream_t s) {
  const int kblocks = static_cast<int>(k / kBlockK);
  const int64_t chunks = tiled_pairs(rows) * kWarpTiles * kblocks;
  repack_codes_kernel<<<blocks_for(chunks * 128, 256), 256, 0, s>>>(src, row_bytes, rows, kblocks, groups,
                                                                    chunks * 128, dst);
  repack_scales_kernel<<<blocks_for(chunks * 8 * groups, 256), 256, 0, s>>>(src, row_bytes, rows, kblocks,
                                                                            groups, chunks * 8 * groups, dst);
}

void matvec_raw(RawType type, const RawJobs& jobs, size_t row_bytes, int64_t k, const float* x, int t,
                cudaStream_t s) {
  dispatch_raw<MatvecRaw>(type, jobs, row_bytes, k, x, t, s);
}

void embed_raw(RawType type, const uint8_t* table, size_t row_bytes, int64_t k, const int32_t* tokens, int t,
               float* out, cudaStream_t s) {
  dispatch_raw<EmbedRaw>(type, table, row_bytes, k, tokens, t, out, s);
}

void embed_tiled(const uint8_t* table, int64_t k, int groups, const int32_t* tokens, int t, float* out,
                 cudaStream_t s) {
  launch(embed_tiled_kernel, dim3(blocks_for(k, 256), t), 256, 0, s, table, k, groups, tokens, out);
}

}  // namespace bonsai::cuda
