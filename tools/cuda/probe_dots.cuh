// The probes' dots (tools/cuda/consumer_probe.cu says what each form is; persistent_probe.cu runs
// them in its persistent kernel): one unit's products of a consumer warp, with its activation
// loader. Production's unit_dot_v1 (DotV1), the same without the decode (DotRaw, timing only),
// and the b1 bit-plane forms (DotB1<0..2>: the weights as two bit planes, the activation as 16).
// A dot: X (the lane's activation words of one k-block), load (from global memory, __ldg),
// load_plain (any address space: the persistent kernel's staged activation in shared memory),
// operator() (one unit's 4 tiles into acc), finish (the lanes' partials combined before a row
// group's fix-up), tile_int (one tile's integers, for the exact verification).
// Include after kernels/cuda/matvec_ws.cu (unit_dot_v1).
#pragma once

#include <cuda_fp16.h>

namespace bonsai::cuda::mv {
namespace {

__device__ __forceinline__ void mma_b1_k128(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm("mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b));
}
__device__ __forceinline__ void mma_b1_k256(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- the dots: load the lane's activation words of k-block k; one unit's products ----------
// Production (unit_dot_v1; B columns 2i, 2i + 1 = token i's hi, lo bytes).
struct DotV1 {
  using X = XStage;
  __device__ explicit DotV1(int) {}
  __device__ static void load(X& d, const uint8_t* xrow, const float4* mrow, int k) {
    d.x[0] = __ldg(reinterpret_cast<const uint4*>(xrow + k * kActBytes));
    d.x[1] = __ldg(reinterpret_cast<const uint4*>(xrow + k * kActBytes + 16));
    d.m = __ldg(mrow + k);
  }
  __device__ static void load_plain(X& d, const uint8_t* xrow, const float4* mrow, int k) {
    d.x[0] = *reinterpret_cast<const uint4*>(xrow + k * kActBytes);
    d.x[1] = *reinterpret_cast<const uint4*>(xrow + k * kActBytes + 16);
    d.m = mrow[k];
  }
  __device__ void operator()(float (&acc)[kWarpTiles][2], const uint4 (&w)[kWarpTiles],
                             const uint32_t (&sc)[kWarpTiles][1], const X& d) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (the production helpers exist only there)
    unit_dot_v1<1>(acc, w, sc, d);
#endif
  }
  __device__ void finish(float (&)[kWarpTiles][2]) const {}
  // The integer of rows g, g + 8 of one tile (token 0: valid on tig 0), as unit_dot_v1 forms it.
  __device__ void tile_int(const uint4& w, const X& d, int (&v)[2]) const {
    const uint32_t xb[8] = {d.x[0].x, d.x[0].y, d.x[0].z, d.x[0].w, d.x[1].x, d.x[1].y, d.x[1].z, d.x[1].w};
    const uint32_t wd[4] = {w.x, w.y, w.z, w.w};
    int c[4] = {0, 0, 0, 0};
    for (int q = 0; q < 4; ++q) {
      const uint32_t x = wd[q], h = x >> 4;
      mma_u8s8(c, x & 0x03030303u, x & 0x0C0C0C0Cu, h & 0x03030303u, h & 0x0C0C0C0Cu, xb[2 * q],
               xb[2 * q + 1]);
    }
    const int sq = __float_as_int(d.m.z) + __float_as_int(d.m.w);
    v[0] = 256 * c[0] + c[1] - sq;
    v[1] = ((256 * c[2] + c[3]) >> 2) - sq;
  }
};

// Timing only: unit_dot_v1 without the decode (the code words themselves as A).
struct DotRaw : DotV1 {
  __device__ explicit DotRaw(int l) : DotV1(l) {}
  __device__ void operator()(float (&acc)[kWarpTiles][2], const uint4 (&w)[kWarpTiles],
                             const uint32_t (&sc)[kWarpTiles][1], const X& d) const {
    const uint32_t xb[8] = {d.x[0].x, d.x[0].y, d.x[0].z, d.x[0].w, d.x[1].x, d.x[1].y, d.x[1].z, d.x[1].w};
    const int sq = __float_as_int(d.m.z) + __float_as_int(d.m.w);
#pragma unroll
    for (int tile = 0; tile < kWarpTiles; ++tile) {
      int c[4] = {0, 0, 0, 0};
#pragma unroll
      for (int q = 0; q < 4; ++q)
        mma_u8s8(c, w[tile].x, w[tile].y, w[tile].z, w[tile].w, xb[2 * q], xb[2 * q + 1]);
      const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&sc[tile][0]));
      acc[tile][0] += static_cast<float>(256 * c[0] + c[1] - sq) * (dd.x * d.m.y);
      acc[tile][1] += static_cast<float>(((256 * c[2] + c[3]) >> 2) - sq) * (dd.y * d.m.y);
    }
  }
};

// Bit-plane activation of one 128-column block for one token: word (lane, h) = bit 8·h + g of q
// at columns 32·tig + i (bit i), lane = 4·g + tig: the B fragment of n8 column group h.
struct XB1 {
  uint2 x;
  float4 m;
};

// Binary tensor cores. Weights of a tile: lane word 0 / 1 = bit 0 of the codes of row g / g + 8 at
// columns 32·tig + i (bit i), words 2 / 3 = bit 1 (the A fragments of m16n8k128; [w0 w1 w2 w3] is
// also the k256 A fragment of [b0 | b1]). Form 0: C4, 1: C6, 2: Cm (header).
template <int Form>
struct DotB1 {
  using X = XB1;
  int mc;      // weight of plane 9 + 2·tig relative to 2^(2·tig): 512, or -512 for plane 15
  float pw;    // 2^(2·tig)
  bool first;  // tig 0: subtracts Σq
  __device__ explicit DotB1(int lane)
      : mc((lane & 3) == 3 ? -512 : 512),
        pw(static_cast<float>(1 << (2 * (lane & 3)))),
        first((lane & 3) == 0) {}
  __device__ static void load(X& d, const uint8_t* xrow, const float4* mrow, int k) {
    d.x = __ldg(reinterpret_cast<const uint2*>(xrow + k * kActBytes));
    d.m = __ldg(mrow + k);
  }
  __device__ static void load_plain(X& d, const uint8_t* xrow, const float4* mrow, int k) {
    d.x = *reinterpret_cast<const uint2*>(xrow + k * kActBytes);
    d.m = mrow[k];
  }
  // s[h][e] = P0 + 2·P1 of plane 8·h + 2·tig + (e & 1), row g (e < 2) or g + 8.
  __device__ static void planes(int (&s)[2][4], const uint4& w, const uint2& x) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t b = h ? x.y : x.x;
      s[h][0] = s[h][1] = s[h][2] = s[h][3] = 0;
      if constexpr (Form == 0) {
        int p1[4] = {0, 0, 0, 0};
        mma_b1_k128(s[h], w.x, w.y, b);
        mma_b1_k128(p1, w.z, w.w, b);
#pragma unroll
        for (int e = 0; e < 4; ++e) s[h][e] += 2 * p1[e];
      } else if constexpr (Form == 1) {
        mma_b1_k128(s[h], w.x, w.y, b);
        mma_b1_k128(s[h], w.z, w.w, b);
        mma_b1_k128(s[h], w.z, w.w, b);
      } else {
        mma_b1_k256(s[h], w.x, w.y, w.z, w.w, b, b);
        mma_b1_k128(s[h], w.z, w.w, b);
      }
    }
  }
  // This lane's share of row g (r = 0) or g + 8 of the block's integer, / 2^(2·tig).
  __device__ int lane_int(const int (&s)[2][4], int r, int sq) const {
    return s[0][2 * r] + 2 * s[0][2 * r + 1] + 256 * s[1][2 * r] + mc * s[1][2 * r + 1] - sq;
  }
  __device__ void operator()(float (&acc)[kWarpTiles][2], const uint4 (&w)[kWarpTiles],
                             const uint32_t (&sc)[kWarpTiles][1], const X& d) const {
    const int sq = first ? __float_as_int(d.m.z) + __float_as_int(d.m.w) : 0;
    const float s = d.m.y * pw;
#pragma unroll
    for (int tile = 0; tile < kWarpTiles; ++tile) {
      int p[2][4];
      planes(p, w[tile], d.x);
      const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&sc[tile][0]));
      acc[tile][0] += static_cast<float>(lane_int(p, 0, sq)) * (dd.x * s);
      acc[tile][1] += static_cast<float>(lane_int(p, 1, sq)) * (dd.y * s);
    }
  }
  // The tig lanes' partials of each row, into every lane (tig 0's is finish_pair's).
  __device__ void finish(float (&acc)[kWarpTiles][2]) const {
#pragma unroll
    for (int tile = 0; tile < kWarpTiles; ++tile)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        acc[tile][r] += __shfl_xor_sync(kFullMask, acc[tile][r], 1);
        acc[tile][r] += __shfl_xor_sync(kFullMask, acc[tile][r], 2);
      }
  }
  __device__ void tile_int(const uint4& w, const X& d, int (&v)[2]) const {
    const int sq = first ? __float_as_int(d.m.z) + __float_as_int(d.m.w) : 0;
    const int sh = 2 * (threadIdx.x & 3);
    int p[2][4];
    planes(p, w, d.x);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int t = lane_int(p, r, sq) << sh;  // exact: |t| < 2^31 (|lane_int| <= 384·771 + Σq)
      t += __shfl_xor_sync(kFullMask, t, 1);
      t += __shfl_xor_sync(kFullMask, t, 2);
      v[r] = t;
    }
  }
};

}  // namespace
}  // namespace bonsai::cuda::mv
