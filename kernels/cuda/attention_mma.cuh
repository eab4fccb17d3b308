// The tensor-core attention kernels' shared pieces (attention_mma.cu: prefill; attention_dec_mma.cu:
// decode over an f16 cache): fp16 rows in shared memory, cp.async staging, ldmatrix and mma.sync.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace bonsai::cuda::attn_mma {

constexpr float kLog2e = 1.4426950408889634f;

// Shared-memory rows of D fp16 values (D / 8 chunks of 16 bytes); chunk c of row r is stored
// at chunk c ^ (r & 7), so the 8 row addresses of every ldmatrix (8 consecutive rows, one
// chunk column) fall into 8 different 16-byte bank groups: conflict-free without padding.
template <int D>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>(r * (D * 2) + ((c ^ (r & 7)) << 4));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; zero-filled when !ok (rows past the cache end are never read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c (16×8 fp32) += a (16×16 fp16, row) · b (16×8 fp16, col).
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// A tile of K and V rows (KT rows of D fp16) into the swizzled shared rows at ks / vs, by the block's
// nthr threads, one commit group's worth of cp.async: row r is position p_first + r, read at
// kh / vh + position·stride; rows at or past p_end are zero-filled (their address: p_first's).
template <int D, int KT>
__device__ __forceinline__ void stage_kv_tile(uint32_t ks, uint32_t vs, const __half* kh, const __half* vh,
                                              int64_t stride, int p_first, int p_end, int nthr) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < KT * kChunks; c += nthr) {
    const int r = c / kChunks, cc = c % kChunks, p = p_first + r;
    const bool ok = p < p_end;
    const int64_t off = static_cast<int64_t>(ok ? p : p_first) * stride + cc * 8;
    cp_async16(ks + swz<D>(r, cc), kh + off, ok);
    cp_async16(vs + swz<D>(r, cc), vh + off, ok);
  }
}

// The head of a two-stage tile loop: the next tile's copies into the other stage (released by the
// barrier that ended the tile before) when there is one, then this tile's copies awaited, and every
// thread's.
template <class LoadNext>
__device__ __forceinline__ void tile_ready(bool has_next, LoadNext&& load_next) {
  if (has_next) {
    load_next();
    cp_commit();
    cp_wait<1>();
  } else {
    cp_wait<0>();
  }
  __syncthreads();
}

// Chunk cc (8 values) of query row r as fp16 into the swizzled shared rows q_s: src's 8 floats
// (16-byte aligned), or zeros when src is null.
template <int D>
__device__ __forceinline__ void store_q_chunk(uint8_t* q_s, int r, int cc, const float* src) {
  float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
  if (src) {
    x0 = reinterpret_cast<const float4*>(src)[0];
    x1 = reinterpret_cast<const float4*>(src)[1];
  }
  uint4 h;
  h.x = pack_half2(x0.x, x0.y);
  h.y = pack_half2(x0.z, x0.w);
  h.z = pack_half2(x1.x, x1.y);
  h.w = pack_half2(x1.z, x1.w);
  *reinterpret_cast<uint4*>(q_s + swz<D>(r, cc)) = h;
}

}  // namespace bonsai::cuda::attn_mma
