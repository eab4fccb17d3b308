// Shared by the GDN kernels (gdn_tc2.cu, gdn_walk.cu, gdn_ab_mma.cu): cp.async staging (16 bytes:
// bytes < 16 zero-fill the rest), mma.sync m16n8k8 TF32 and its split ("3xTF32") form:
// x = hi + lo + r with hi = tf32(x), lo = tf32(x − hi), |r| <= 2^-22·|x|; x·y as
// lo_x·hi_y + hi_x·lo_y + hi_x·hi_y (each exact in fp32), <= 3·2^-22 |x y| per term, fp32
// accumulation.
#pragma once

#include <cstdint>

namespace bonsai::cuda::tc {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
// x = hi + lo + r, |r| <= 2^-22·|x| (both TF32 bit patterns)
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(x - __uint_as_float(hi));
}
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Fragments of m16n8k8 (g = lane/4, q = lane%4): A a0 (g, q), a1 (g+8, q), a2 (g, q+4),
// a3 (g+8, q+4); B b0 (k q, n g), b1 (k q+4, n g); C c0 (g, 2q), c1 (g, 2q+1), c2 (g+8, 2q),
// c3 (g+8, 2q+1).
struct FragA {
  uint32_t h[4], l[4];
};
struct FragB {
  uint32_t h0, h1, l0, l1;
};
__device__ __forceinline__ FragA frag_a(float a0, float a1, float a2, float a3) {
  FragA f;
  split_tf32(a0, f.h[0], f.l[0]);
  split_tf32(a1, f.h[1], f.l[1]);
  split_tf32(a2, f.h[2], f.l[2]);
  split_tf32(a3, f.h[3], f.l[3]);
  return f;
}
__device__ __forceinline__ FragB frag_b(float b0, float b1) {
  FragB f;
  split_tf32(b0, f.h0, f.l0);
  split_tf32(b1, f.h1, f.l1);
  return f;
}
// A tile rows r0.., columns k0.. of a row-major matrix
__device__ __forceinline__ FragA load_a(const float* m, int ld, int r0, int k0, int g, int q) {
  const float* p = m + (r0 + g) * ld + k0 + q;
  return frag_a(p[0], p[8 * ld], p[4], p[8 * ld + 4]);
}
// B(k, n) = m[n][k] (e.g. Kᵀ from k's rows)
__device__ __forceinline__ FragB load_bt(const float* m, int ld, int k0, int n0, int g, int q) {
  const float* p = m + (n0 + g) * ld + k0 + q;
  return frag_b(p[0], p[4]);
}
// B(k, n) = m[k][n]
__device__ __forceinline__ FragB load_b(const float* m, int ld, int k0, int n0, int g, int q) {
  const float* p = m + (k0 + q) * ld + n0 + g;
  return frag_b(p[0], p[4 * ld]);
}
// a·b in the split form: hi·hi into big, lo·hi + hi·lo into small (the tile's value is big +
// small): two accumulators, so consecutive k steps wait on at most two dependent mmas, not three.
__device__ __forceinline__ void mma3(float (&big)[4], float (&small)[4], const FragA& a, const FragB& b) {
  mma_tf32(small, a.l, b.h0, b.h1);
  mma_tf32(big, a.h, b.h0, b.h1);
  mma_tf32(small, a.h, b.l0, b.l1);
}
// B(k, n) from operands split once (hi and lo arrays of TF32 bit patterns, row k, column n)
__device__ __forceinline__ FragB load_b_split(const uint32_t* hi, const uint32_t* lo, int ld, int k0, int n0,
                                              int g, int q) {
  const int o = (k0 + q) * ld + n0 + g;
  return FragB{hi[o], hi[o + 4 * ld], lo[o], lo[o + 4 * ld]};
}

}  // namespace bonsai::cuda::tc
