// The split half of the causal GQA attention over the KV cache (flash-decoding style): the
// positions of each (token, KV head) are cut into `splits` ranges and each block computes an
// online-softmax partial (max, sum, weighted V) for the query heads that share that KV head;
// attention.cu merges the partials (attention_merge) and holds the prefill kernels' siblings.
// Decode steps and small batches run here: the ring kernel (attention_split_kernel) and, at long
// contexts, the kernel that scores 4 positions together (attention_split_batch_kernel).
// Both take the cache's element type T: float, or __half for an f16 cache, whose rows (half the
// bytes) go through the same rings and are widened to f32 where a lane reads its element; the
// arithmetic after that is the same.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace bonsai::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxE = 8;          // head_dim / 32 <= 8
constexpr int kMaxGroup = 8;      // query heads per KV head
constexpr int kRow = kMaxE * 32;  // elements of one cache row slot (head_dim <= 256)

// The split kernel's shared memory: the warps' partials for the final merge and, with PIPE = 2,
// before them (the same bytes: a block barrier separates the two uses) each warp's ring of D
// positions' K and V rows.
constexpr int kSplitAcc = static_cast<int>(sizeof(float)) * kWarps * kMaxGroup * (kRow + 2);
template <int PIPE, int D>
struct SplitSmem {
  static constexpr int kAcc = kSplitAcc;
  static constexpr int kRing = PIPE == 2 ? static_cast<int>(sizeof(float)) * kWarps * D * 2 * kRow : 0;
  static constexpr int kBytes = kAcc > kRing ? kAcc : kRing;
};

__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {  // L2 only (.cg): streamed once
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The end of a split block: each warp's (max, sum, unnormalized O) per query head of the group,
// through shared memory (sm_raw: at least kSplitAcc bytes, free of copies in flight), merged
// into the split's partial in `part` by a thread per (head, dim).
template <int G>
__device__ __forceinline__ void store_split_partial(unsigned char* sm_raw, const float (&m)[kMaxGroup],
                                                    const float (&l)[kMaxGroup],
                                                    const float (&acc)[kMaxGroup][kMaxE], float* part, int i,
                                                    int n_head, int hk, int group, int splits, int split,
                                                    int head_dim) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  auto& sm_acc = *reinterpret_cast<float(*)[kWarps][kMaxGroup][kRow]>(sm_raw);
  auto& sm_m =
      *reinterpret_cast<float(*)[kWarps][kMaxGroup]>(sm_raw + sizeof(float) * kWarps * kMaxGroup * kRow);
  auto& sm_l = *reinterpret_cast<float(*)[kWarps][kMaxGroup]>(sm_raw + sizeof(float) * kWarps * kMaxGroup *
                                                                           (kRow + 1));
#pragma unroll
  for (int hh = 0; hh < kMaxGroup; ++hh) {
    if (lane == 0) {
      sm_m[warp][hh] = m[hh];
      sm_l[warp][hh] = l[hh];
    }
#pragma unroll
    for (int e = 0; e < kMaxE; ++e) sm_acc[warp][hh][e * 32 + lane] = acc[hh][e];
  }
  __syncthreads();
  // thread per (head in group, dim): merge the warps
  const int row = head_dim + 2;
  if constexpr (G > 0) {
    // The group known at compile time: each thread takes the warps' weights of its heads
    // once (G·kWarps exps instead of that many per dim) and then runs the dims' sums, all
    // heads unrolled, as independent loads and FMAs. The same operations per output in the
    // same order as below: bit-identical.
    float mx[G > 0 ? G : 1], f[G > 0 ? G : 1][kWarps], sum_l[G > 0 ? G : 1];
#pragma unroll
    for (int hh = 0; hh < G; ++hh) {
      mx[hh] = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mx[hh] = fmaxf(mx[hh], sm_m[w][hh]);
      sum_l[hh] = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        f[hh][w] = expf(sm_m[w][hh] - mx[hh]);  // 0 for an empty warp (m = -inf); unused if mx is
        if (mx[hh] != -INFINITY) sum_l[hh] += f[hh][w] * sm_l[w][hh];
      }
    }
    float* pr0 = part + ((static_cast<int64_t>(i) * n_head + hk * G) * splits + split) * row;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
#pragma unroll
      for (int hh = 0; hh < G; ++hh) {
        float sum_a = 0.0f;
        if (mx[hh] != -INFINITY) {
#pragma unroll
          for (int w = 0; w < kWarps; ++w) sum_a += f[hh][w] * sm_acc[w][hh][d];
        }
        float* pr = pr0 + static_cast<int64_t>(hh) * splits * row;
        pr[2 + d] = sum_a;
        if (d == 0) {
          pr[0] = mx[hh];
          pr[1] = sum_l[hh];
        }
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < group * head_dim; idx += blockDim.x) {
      const int hh = idx / head_dim, d = idx % head_dim;
      float mx = -INFINITY;
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w][hh]);
      float sum_l = 0.0f, sum_a = 0.0f;
      if (mx != -INFINITY) {
        for (int w = 0; w < kWarps; ++w) {
          const float f = expf(sm_m[w][hh] - mx);  // 0 for an empty warp (m = -inf)
          sum_l += f * sm_l[w][hh];
          sum_a += f * sm_acc[w][hh][d];
        }
      }
      float* pr = part + ((static_cast<int64_t>(i) * n_head + hk * group + hh) * splits + split) * row;
      pr[2 + d] = sum_a;
      if (d == 0) {
        pr[0] = mx;
        pr[1] = sum_l;
      }
    }
  }
}

// grid (n_head_kv, splits, t). Warp w takes positions p0 + w, p0 + w + 4, ...; lane holds
// dims lane + 32e. The warps' partials are merged in shared memory into one per split.
// PIPE = 1: each warp loads position p + 4's K and V rows while it scores position p (two
// register sets used in turn, so no copy waits for a load in flight), and blockIdx.z runs the
// tokens from the last one, so that the causal mask's longest rows start first instead of
// ending the launch alone. G > 0: the group size known at compile time (6 for the 27B), so
// the heads' score chains (dot, warp sum, exp, update) have no branch between them and
// interleave; with the group read at run time (G = 0) each head's chain waited for the one
// before. Same operations in the same order either way: bit-identical to PIPE = 0, G = 0 (the
// former kernel: BONSAI_CUDA_ATTN=0; =1: PIPE = 1, G = 0).
//
// PIPE = 2 (session 15): each warp streams its positions' K and V rows through a ring of D slots in
// shared memory filled by cp.async (D positions in flight per warp instead of 2, no register set per
// position in flight); the rows are read from the ring into the same registers and scored in the
// same order: bit-identical to PIPE = 1. In a recorded step the ring's first D positions are
// requested before the dependency wait; this step's own row (n_kv - 1) never goes through the ring
// there, it is loaded directly after the wait.
template <int PIPE, int G, int D, class T>
__global__ void __launch_bounds__(kWarps * 32)
    attention_split_kernel(const float* __restrict__ q, const T* __restrict__ k_cache,
                           const T* __restrict__ v_cache, float* part, int pos0, const int* pos_dev,
                           int n_head, int n_head_kv, int head_dim, float scale) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
  pdl_trigger();
  // A recorded decode step (pos_dev is given only then: CudaBackend::Impl::pos_dev) loads the
  // cache rows of earlier steps before the dependency wait, so their DRAM round trip overlaps
  // attention_prep: a replay starts after the previous one has finished and only this step's
  // row (position n_kv - 1, stored by attention_prep) is written during it; the position
  // itself comes from the step's copy node, which precedes every kernel. The eager path and
  // prefill batches (rows of the same batch) wait first.
  const bool early = PIPE && pos_dev != nullptr;
  if (!early) pdl_wait();
  using Smem = SplitSmem<PIPE, D>;
  __shared__ __align__(16) unsigned char sm_raw[Smem::kBytes];
  const int hk = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int i = PIPE ? gridDim.z - 1 - blockIdx.z : blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = G ? G : n_head / n_head_kv, ne = head_dim / 32;
  const int n_kv = position(pos0, pos_dev) + i + 1;
  const int per = (n_kv + splits - 1) / splits;
  const int p0 = split * per, p1 = min(n_kv, p0 + per);
  const int64_t kv_stride = static_cast<int64_t>(n_head_kv) * head_dim;

  auto load = [&](int p, float(&kr)[kMaxE], float(&vr)[kMaxE]) {
    const T* kp = k_cache + p * kv_stride + static_cast<int64_t>(hk) * head_dim;
    const T* vp = v_cache + p * kv_stride + static_cast<int64_t>(hk) * head_dim;
#pragma unroll
    for (int e = 0; e < kMaxE; ++e) {
      kr[e] = e < ne ? from_cache(kp[e * 32 + lane]) : 0.0f;
      vr[e] = e < ne ? from_cache(vp[e * 32 + lane]) : 0.0f;
    }
  };
  float ka[kMaxE], va[kMaxE], kb[kMaxE], vb[kMaxE];  // PIPE 1: positions p and p + 4
  const int pw = p0 + warp, last = n_kv - 1;
  // PIPE 2: this warp's ring [D][K row, V row], and the positions that go through it.
  T* const ring = reinterpret_cast<T*>(sm_raw) + warp * D * 2 * kRow;
  const int pend = early ? min(p1, last) : p1;
  auto issue = [&](int p, int slot) {  // one commit group per call (empty past pend)
    if (p < pend) {
      const T* kp = k_cache + p * kv_stride + static_cast<int64_t>(hk) * head_dim;
      const T* vp = v_cache + p * kv_stride + static_cast<int64_t>(hk) * head_dim;
      T* dk = ring + slot * 2 * kRow;
#pragma unroll
      for (int c = lane * kVec; c < kRow; c += 32 * kVec) {  // unrolled: no loop for the compiler to peel
        if (c < head_dim) {
          cp_async_16(dk + c, kp + c);
          cp_async_16(dk + kRow + c, vp + c);
        }
      }
    }
    cp_async_commit();
  };
  if constexpr (PIPE == 2) {
#pragma unroll
    for (int d = 0; d < D; ++d) issue(pw + d * kWarps, d);
    if (early) pdl_wait();
  } else if (early) {
    if (pw < p1 && pw < last) load(pw, ka, va);
    if (pw + kWarps < p1 && pw + kWarps < last) load(pw + kWarps, kb, vb);
    pdl_wait();
  }

  float qr[kMaxGroup][kMaxE], acc[kMaxGroup][kMaxE], m[kMaxGroup], l[kMaxGroup];
#pragma unroll
  for (int hh = 0; hh < kMaxGroup; ++hh) {
    m[hh] = -INFINITY;
    l[hh] = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxE; ++e) {
      acc[hh][e] = 0.0f;
      qr[hh][e] = (hh < group && e < ne)
                      ? q[(static_cast<int64_t>(i) * n_head + hk * group + hh) * head_dim + e * 32 + lane]
                      : 0.0f;
    }
  }
  auto score = [&](const float(&kr)[kMaxE], const float(&vr)[kMaxE]) {
#pragma unroll
    for (int hh = 0; hh < kMaxGroup; ++hh) {
      if (hh >= group) break;  // (a constant for G > 0)
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kMaxE; ++e) dot += qr[hh][e] * kr[e];
      const float sc = warp_sum(dot) * scale;
      const float mn = fmaxf(m[hh], sc);
      const float corr = expf(m[hh] - mn), pe = expf(sc - mn);
      l[hh] = l[hh] * corr + pe;
#pragma unroll
      for (int e = 0; e < kMaxE; ++e) acc[hh][e] = acc[hh][e] * corr + pe * vr[e];
      m[hh] = mn;
    }
  };
  if constexpr (PIPE == 2) {
    int slot = 0;
    for (int p = pw; p < p1; p += kWarps) {
      float kr[kMaxE], vr[kMaxE];
      if (p < pend) {
        cp_async_wait<D - 1>();  // this lane's copies of position p have landed
        __syncwarp();            // ... and every lane's
        const T* sk = ring + slot * 2 * kRow;
#pragma unroll
        for (int e = 0; e < kMaxE; ++e) {
          kr[e] = e < ne ? from_cache(sk[e * 32 + lane]) : 0.0f;
          vr[e] = e < ne ? from_cache(sk[kRow + e * 32 + lane]) : 0.0f;
        }
        __syncwarp();  // the slot is read before it is refilled
        issue(p + D * kWarps, slot);
        slot = slot + 1 == D ? 0 : slot + 1;
      } else {
        load(p, kr, vr);  // this step's row in a recorded step, after the wait
      }
      score(kr, vr);
    }
    cp_async_wait<0>();  // no copy in flight into the bytes that now hold the partials
    __syncthreads();
  } else if (PIPE) {
    int p = pw;
    if (early) {  // this step's row, after the wait
      if (p < p1 && p == last) load(p, ka, va);
      if (p + kWarps < p1 && p + kWarps == last) load(p + kWarps, kb, vb);
    } else {
      if (p < p1) load(p, ka, va);
      if (p + kWarps < p1) load(p + kWarps, kb, vb);
    }
    for (; p < p1; p += 2 * kWarps) {
      score(ka, va);  // position p
      if (p + 2 * kWarps < p1) load(p + 2 * kWarps, ka, va);
      if (p + kWarps >= p1) break;
      score(kb, vb);  // position p + 4
      if (p + 3 * kWarps < p1) load(p + 3 * kWarps, kb, vb);
    }
  } else {
    for (int p = p0 + warp; p < p1; p += kWarps) {
      float kr[kMaxE], vr[kMaxE];
      load(p, kr, vr);
      score(kr, vr);
    }
  }
  store_split_partial<G>(sm_raw, m, l, acc, part, i, n_head, hk, group, splits, split, head_dim);
}

// The decode split kernel scoring kBatch = 4 of a warp's positions together (session 16; G = 6, the
// 27B's group, known at compile time; BONSAI_CUDA_ATTN_SCORE=4, the default). Same grid, warps and
// position walk as attention_split_kernel<2, G, D>, whose per-position work was issue-bound (ncu at
// 16384 positions: 0.70 instructions issued per scheduler per cycle, DRAM at 61 %): each position
// paid, per query head, a 5-step warp sum of its dot, two exps and a rescale of the accumulator
// (a multiply and an FMA per dimension). Here a warp reduces the 4 positions' dots of a head
// together (a butterfly that halves the values carried at each of the first two steps: 6 shuffles
// instead of 20), each lane of an 8-lane group finishes one position's softmax (one max, one exp
// of its own), and the accumulator is rescaled once per 4 positions (a multiply, then 4 FMAs per
// dimension). The ring holds D = 2 x kBatch positions per warp: one batch scored while the next
// lands. K and V are read from the ring in shared memory (dynamic: 64 KB per block), this step's
// own row in a recorded step straight from global memory (generic loads), as in PIPE = 2.
// Not bit-identical to PIPE = 2: the dots' sums and the online softmax run in another order
// (a few ulps; the tests' 2e-5 and the gate hold, tests/test_backend_cuda.cpp).
constexpr int kBatch = 4, kBatchRing = 2 * kBatch;
constexpr int kBatchSmem = static_cast<int>(sizeof(float)) * kWarps * kBatchRing * 2 * kRow;
static_assert(kBatchSmem >= kSplitAcc, "the warps' partials reuse the ring's bytes");

template <int G, class T>
__global__ void __launch_bounds__(kWarps * 32, 3)
    attention_split_batch_kernel(const float* __restrict__ q, const T* __restrict__ k_cache,
                                 const T* __restrict__ v_cache, float* part, int pos0, const int* pos_dev,
                                 int n_head, int n_head_kv, int head_dim, float scale) {
  static_assert(G > 0 && G <= kMaxGroup, "the group at compile time");
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
  constexpr int D = kBatchRing;
  pdl_trigger();
  const bool early = pos_dev != nullptr;  // a recorded step: rows of earlier steps before the wait
  if (!early) pdl_wait();
  extern __shared__ __align__(16) unsigned char sm_dyn[];
  const int hk = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int i = gridDim.z - 1 - blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ne = head_dim / 32;
  const int n_kv = position(pos0, pos_dev) + i + 1;
  const int per = (n_kv + splits - 1) / splits;
  const int p0 = split * per, p1 = min(n_kv, p0 + per);
  const int64_t kv_stride = static_cast<int64_t>(n_head_kv) * head_dim;
  T* const ring = reinterpret_cast<T*>(sm_dyn) + warp * D * 2 * kRow;
  const int pw = p0 + warp, pend = early ? min(p1, n_kv - 1) : p1;
  auto issue = [&](int p, int slot) {  // one commit group per call (empty past pend)
    if (p < pend) {
      const T* kp = k_cache + p * kv_stride + static_cast<int64_t>(hk) * head_dim;
      const T* vp = v_cache + p * kv_stride + static_cast<int64_t>(hk) * head_dim;
      T* dk = ring + slot * 2 * kRow;
#pragma unroll
      for (int c = lane * kVec; c < kRow; c += 32 * kVec) {  // unrolled: no loop for the compiler to peel
        if (c < head_dim) {
          cp_async_16(dk + c, kp + c);
          cp_async_16(dk + kRow + c, vp + c);
        }
      }
    }
    cp_async_commit();
  };
  auto load_row = [&](const T* src, float(&r)[kMaxE], bool valid) {
#pragma unroll
    for (int e = 0; e < kMaxE; ++e) r[e] = (valid && e < ne) ? from_cache(src[e * 32 + lane]) : 0.0f;
  };
#pragma unroll
  for (int d = 0; d < D; ++d) issue(pw + d * kWarps, d);
  if (early) pdl_wait();

  float qr[kMaxGroup][kMaxE], acc[kMaxGroup][kMaxE], m[kMaxGroup], l[kMaxGroup];
#pragma unroll
  for (int hh = 0; hh < kMaxGroup; ++hh) {
    m[hh] = -INFINITY;
    l[hh] = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxE; ++e) {
      acc[hh][e] = 0.0f;
      qr[hh][e] = (hh < G && e < ne)
                      ? q[(static_cast<int64_t>(i) * n_head + hk * G + hh) * head_dim + e * 32 + lane]
                      : 0.0f;
    }
  }
  // After the two butterfly steps that carry 2 values and then 1, lane l holds the sum for
  // position b = 2·bit4(l) + bit3(l) of the batch; kSrc[b] is a lane holding it.
  const int mine = ((lane >> 4) & 1) * 2 + ((lane >> 3) & 1);
  int slot0 = 0;
  for (int p = pw; p < p1; p += kBatch * kWarps) {
    cp_async_wait<D - kBatch>();  // this lane's copies of the batch's positions have landed
    __syncwarp();                 // ... and every lane's
    const T* rows[kBatch];        // K row of each position (its V row kRow elements on in the ring)
    int n = 0;                    // valid positions of the batch (>= 1: p < p1)
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int pb = p + b * kWarps;
      rows[b] = ring + (slot0 + b) * 2 * kRow;
      if (pb < p1) n = b + 1;
    }
    const bool direct = p + (n - 1) * kWarps >= pend;  // this step's row: not in the ring
    float dot[kMaxGroup][kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      float kr[kMaxE];
      const int pb = p + b * kWarps;
      if (direct && pb >= pend && pb < p1)  // two call sites: the ring's loads stay ld.shared
        load_row(k_cache + pb * kv_stride + static_cast<int64_t>(hk) * head_dim, kr, true);
      else
        load_row(rows[b], kr, b < n);
#pragma unroll
      for (int hh = 0; hh < G; ++hh) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < kMaxE; ++e) d += qr[hh][e] * kr[e];
        dot[hh][b] = d;
      }
    }
    float pe_b[kMaxGroup][kBatch], corr[kMaxGroup];
#pragma unroll
    for (int hh = 0; hh < G; ++hh) {
      // butterfly over lanes: bit 4 splits the 4 values into two pairs, bit 3 a pair into one
      const bool hi = lane & 16, h8 = lane & 8;
      const float a0 =
          (hi ? dot[hh][2] : dot[hh][0]) + __shfl_xor_sync(~0u, hi ? dot[hh][0] : dot[hh][2], 16);
      const float a1 =
          (hi ? dot[hh][3] : dot[hh][1]) + __shfl_xor_sync(~0u, hi ? dot[hh][1] : dot[hh][3], 16);
      float c = (h8 ? a1 : a0) + __shfl_xor_sync(~0u, h8 ? a0 : a1, 8);
      c += __shfl_xor_sync(~0u, c, 4);
      c += __shfl_xor_sync(~0u, c, 2);
      c += __shfl_xor_sync(~0u, c, 1);
      const float sc = mine < n ? c * scale : -INFINITY;
      float mx = fmaxf(sc, __shfl_xor_sync(~0u, sc, 8));
      mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 16));
      const float mn = fmaxf(m[hh], mx);  // finite: the batch's first position is valid
      const float pe = expf(sc - mn);     // 0 for a position past p1
      corr[hh] = expf(m[hh] - mn);        // 0 for the first batch (m = -inf)
      float ps = pe + __shfl_xor_sync(~0u, pe, 8);
      ps += __shfl_xor_sync(~0u, ps, 16);
      l[hh] = l[hh] * corr[hh] + ps;
      m[hh] = mn;
#pragma unroll
      for (int b = 0; b < kBatch; ++b) pe_b[hh][b] = __shfl_sync(~0u, pe, (b >> 1) * 16 + (b & 1) * 8);
    }
#pragma unroll
    for (int hh = 0; hh < G; ++hh)
#pragma unroll
      for (int e = 0; e < kMaxE; ++e) acc[hh][e] *= corr[hh];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (b >= n) break;
      const int pb = p + b * kWarps;
      float vr[kMaxE];
      if (direct && pb >= pend)
        load_row(v_cache + pb * kv_stride + static_cast<int64_t>(hk) * head_dim, vr, true);
      else
        load_row(rows[b] + kRow, vr, true);
#pragma unroll
      for (int hh = 0; hh < G; ++hh)
#pragma unroll
        for (int e = 0; e < kMaxE; ++e) acc[hh][e] += pe_b[hh][b] * vr[e];
    }
    __syncwarp();  // the batch's slots are read before they are refilled
#pragma unroll
    for (int b = 0; b < kBatch; ++b) issue(p + (D + b) * kWarps, slot0 + b);
    slot0 = slot0 + kBatch == D ? 0 : slot0 + kBatch;
  }
  cp_async_wait<0>();  // no copy in flight into the bytes that now hold the partials
  __syncthreads();
  store_split_partial<G>(sm_dyn, m, l, acc, part, i, n_head, hk, G, splits, split, head_dim);
}

template <class T>
using SplitKernel = void (*)(const float*, const T*, const T*, float*, int, const int*, int, int, int, float);
template <class T>
struct SplitLaunch {
  SplitKernel<T> kernel;
  int smem;  // dynamic shared memory bytes
};

// BONSAI_CUDA_ATTN=0: the split kernel without the K/V prefetch and token order, =1 with them
// but the group read at run time (A/B); else the group at compile time where it is 6.
// BONSAI_CUDA_ATTN_RING (attention_ring): the ring of PIPE = 2 and its depth, or 0 for PIPE = 1.
// batch (attention_decode_batch): with the group 6 and a ring, the kernel that scores 4 positions
// together (attention_split_batch_kernel; its own ring).
template <class T>
SplitLaunch<T> split_kernel(int n_head, int n_head_kv, int head_dim, bool batch) {
  const int mode = attention_mode(), ring = head_dim % 8 == 0 ? attention_ring() : 0;
  const bool g6 = mode >= 2 && n_head == 6 * n_head_kv;
  if (batch && g6 && ring > 0) {
    static const bool sized =
        cudaFuncSetAttribute(attention_split_batch_kernel<6, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kBatchSmem) == cudaSuccess;
    if (sized) return {attention_split_batch_kernel<6, T>, kBatchSmem};
    cudaGetLastError();  // not sized (a device with less shared memory per block): the ring kernel
  }
  SplitKernel<T> kernel = mode == 0 ? attention_split_kernel<0, 0, 1, T> : attention_split_kernel<1, 0, 1, T>;
  if (g6) kernel = attention_split_kernel<1, 6, 1, T>;
  if (mode >= 1 && ring > 0) {
    if (ring == 3) kernel = g6 ? attention_split_kernel<2, 6, 3, T> : attention_split_kernel<2, 0, 3, T>;
    if (ring == 4) kernel = g6 ? attention_split_kernel<2, 6, 4, T> : attention_split_kernel<2, 0, 4, T>;
    if (ring == 6) kernel = g6 ? attention_split_kernel<2, 6, 6, T> : attention_split_kernel<2, 0, 6, T>;
  }
  return {kernel, 0};
}

template <class T>
void launch_splits(const float* q, const T* k_cache, const T* v_cache, float* part, int t, int pos0,
                   const int* pos_dev, int splits, bool batch, int n_head, int n_head_kv, int head_dim,
                   float scale, cudaStream_t s) {
  const dim3 grid(n_head_kv, splits, t);
  const SplitLaunch<T> k = split_kernel<T>(n_head, n_head_kv, head_dim, batch);
  launch(k.kernel, grid, kWarps * 32, k.smem, s, q, k_cache, v_cache, part, pos0, pos_dev, n_head, n_head_kv,
         head_dim, scale);
}

template <class T>
int occupancy(int n_head, int n_head_kv, int head_dim, int* per_sm) {
  const SplitLaunch<T> k = split_kernel<T>(n_head, n_head_kv, head_dim, attention_score_batch() == kBatch);
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, k.kernel, kWarps * 32, k.smem);
}

}  // namespace

void attention_splits(const float* q, const void* k_cache, const void* v_cache, KvType kv, float* part, int t,
                      int pos0, const int* pos_dev, int splits, bool batch, int n_head, int n_head_kv,
                      int head_dim, float scale, cudaStream_t s) {
  if (kv == KvType::F16)
    launch_splits(q, static_cast<const __half*>(k_cache), static_cast<const __half*>(v_cache), part, t, pos0,
                  pos_dev, splits, batch, n_head, n_head_kv, head_dim, scale, s);
  else
    launch_splits(q, static_cast<const float*>(k_cache), static_cast<const float*>(v_cache), part, t, pos0,
                  pos_dev, splits, batch, n_head, n_head_kv, head_dim, scale, s);
}

int attention_split_wave(int n_head, int n_head_kv, int head_dim, KvType kv) {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      (kv == KvType::F16 ? occupancy<__half>(n_head, n_head_kv, head_dim, &per_sm)
                         : occupancy<float>(n_head, n_head_kv, head_dim, &per_sm)) != cudaSuccess) {
    cudaGetLastError();  // a failed query is not an error of the next launch: the doubling rule runs
    return 0;
  }
  return per_sm * sms / std::max(1, n_head_kv);
}

}  // namespace bonsai::cuda
