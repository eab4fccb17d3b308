// Causal GQA attention over the f32 KV cache, flash-decoding style: the
// positions of each (token, KV head) are cut into `splits` ranges, each block
// computes an online-softmax partial (max, sum, weighted V) for the query heads
// that share that KV head, and a second kernel merges the partials.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace bonsai::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxE = 8;      // head_dim / 32 <= 8
constexpr int kMaxGroup = 8;  // query heads per KV head

// grid (n_head_kv, splits, t). Warp w takes positions p0 + w, p0 + w + 4, ...; lane holds
// dims lane + 32e. The warps' partials are merged in shared memory into one per split.
__global__ void __launch_bounds__(kWarps * 32)
    attention_split_kernel(const float* __restrict__ q, const float* __restrict__ k_cache,
                           const float* __restrict__ v_cache, float* __restrict__ part, int pos0,
                           const int* pos_dev, int n_head, int n_head_kv, int head_dim, float scale) {
  pdl_trigger();
  pdl_wait();
  __shared__ float sm_acc[kWarps][kMaxGroup][kMaxE * 32];
  __shared__ float sm_m[kWarps][kMaxGroup], sm_l[kWarps][kMaxGroup];
  const int hk = blockIdx.x, split = blockIdx.y, splits = gridDim.y, i = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = n_head / n_head_kv, ne = head_dim / 32;
  const int n_kv = position(pos0, pos_dev) + i + 1;
  const int per = (n_kv + splits - 1) / splits;
  const int p0 = split * per, p1 = min(n_kv, p0 + per);
  const int64_t kv_stride = static_cast<int64_t>(n_head_kv) * head_dim;

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
  for (int p = p0 + warp; p < p1; p += kWarps) {
    const float* kp = k_cache + p * kv_stride + static_cast<int64_t>(hk) * head_dim;
    const float* vp = v_cache + p * kv_stride + static_cast<int64_t>(hk) * head_dim;
    float kr[kMaxE], vr[kMaxE];
#pragma unroll
    for (int e = 0; e < kMaxE; ++e) {
      kr[e] = e < ne ? kp[e * 32 + lane] : 0.0f;
      vr[e] = e < ne ? vp[e * 32 + lane] : 0.0f;
    }
#pragma unroll
    for (int hh = 0; hh < kMaxGroup; ++hh) {
      if (hh >= group) break;
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
  }
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

// Block per (token, head), thread per dim.
__global__ void attention_merge_kernel(const float* __restrict__ part, float* __restrict__ out, int splits,
                                       int head_dim) {
  pdl_trigger();
  pdl_wait();
  const int64_t th = blockIdx.x;  // token * n_head + head
  const int row = head_dim + 2;
  const float* pr = part + th * splits * row;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, pr[s * row]);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float m = pr[s * row];
      if (m == -INFINITY) continue;  // empty split
      const float f = expf(m - mx);
      den += f * pr[s * row + 1];
      num += f * pr[s * row + 2 + d];
    }
    out[th * head_dim + d] = num / den;
  }
}

}  // namespace

void attention(const float* q, const float* k_cache, const float* v_cache, float* out, float* part, int t,
               int pos0, const int* pos_dev, int splits, int n_head, int n_head_kv, int head_dim, float scale,
               cudaStream_t s) {
  launch(attention_split_kernel, dim3(n_head_kv, splits, t), kWarps * 32, 0, s, q, k_cache, v_cache, part,
         pos0, pos_dev, n_head, n_head_kv, head_dim, scale);
  launch(attention_merge_kernel, static_cast<unsigned>(t) * n_head, head_dim <= 128 ? 128 : 256, 0, s, part,
         out, splits, head_dim);
}

}  // namespace bonsai::cuda
