#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include "bonsai/formats.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/exp_avx2.h"
#include "kernels/ref/ops.h"
#include "runtime/env.h"

namespace bonsai::cpu {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// 8 cache elements as f32: a plain load, or 8 halves widened by F16C (exact).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <class T>
inline float dot(const float* a, const T* b, int d) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int e = 0;
  for (; e + 16 <= d; e += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), load8(b + e), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e + 8), load8(b + e + 8), acc1);
  }
  for (; e < d; e += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), load8(b + e), acc0);
  return hsum(_mm256_add_ps(acc0, acc1));
}

// dot() of H query rows (q + h·d) with one key row, the key's 8-element slices loaded (and, for an f16
// cache, widened) once for the H rows: per row the same two accumulator chains and reduction as dot(), so
// the same floats.
template <int H, class T>
inline void dot_rows(const float* q, const T* k, int d, float* out) {
  __m256 acc0[H], acc1[H];
  for (int h = 0; h < H; ++h) acc0[h] = acc1[h] = _mm256_setzero_ps();
  int e = 0;
  for (; e + 16 <= d; e += 16) {
    const __m256 k0 = load8(k + e), k1 = load8(k + e + 8);
    for (int h = 0; h < H; ++h) {
      acc0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + e), k0, acc0[h]);
      acc1[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + e + 8), k1, acc1[h]);
    }
  }
  for (; e < d; e += 8) {
    const __m256 k0 = load8(k + e);
    for (int h = 0; h < H; ++h) acc0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + e), k0, acc0[h]);
  }
  for (int h = 0; h < H; ++h) out[h] = hsum(_mm256_add_ps(acc0[h], acc1[h]));
}

// The dots of one query row with 4 key rows at once (4 independent accumulator chains instead
// of 2, and one reduction tree for the 4): the same products as dot(), summed in another order.
template <class T>
inline void dot4(const float* a, const T* k0, const T* k1, const T* k2, const T* k3, int d, float* out) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
         s3 = _mm256_setzero_ps();
  for (int e = 0; e < d; e += 8) {
    const __m256 x = _mm256_loadu_ps(a + e);
    s0 = _mm256_fmadd_ps(x, load8(k0 + e), s0);
    s1 = _mm256_fmadd_ps(x, load8(k1 + e), s1);
    s2 = _mm256_fmadd_ps(x, load8(k2 + e), s2);
    s3 = _mm256_fmadd_ps(x, load8(k3 + e), s3);
  }
  // lanes of s0..s3 summed pairwise: h = [s0 s1 s2 s3] horizontal sums in one 128-bit vector
  const __m256 h01 = _mm256_hadd_ps(s0, s1), h23 = _mm256_hadd_ps(s2, s3);
  const __m256 h = _mm256_hadd_ps(h01, h23);
  const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  _mm_storeu_ps(out, r);
}

// w[j] = exp(w[j] - mx) for j < n, 8 lanes at a time by exp8 (within 2 ulp of expf), the last
// n % 8 by expf; returns the sum of the n values in a fixed order (the 8 lanes' running sums
// added by hsum, then the tail in order).
float exp_shift_sum(float* w, int n, float mx) {
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(w + j), m));
    _mm256_storeu_ps(w + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (; j < n; ++j) sum += (w[j] = std::exp(w[j] - mx));
  return sum;
}

// Software prefetch of one cache row (d elements, a 64-byte line per 64 / sizeof(T)). Why: the rows of one KV
// head are n_head_kv·d floats apart (4 KB on the 27B), each in its own page, and the hardware's streaming
// prefetchers stay within a page, so every row of a long decode step waited for DRAM: on a 2-core
// EPYC the 27B's 16384-position step read its cache at 3.5-3.9 GB/s with 2 threads, 5.5-6.2 with
// rows prefetched 2-16 ahead (docs/performance.md, CPU, session 16).
template <class T>
inline void prefetch_row(const T* row, int d) {
  constexpr int kLine = 64 / static_cast<int>(sizeof(T));
  for (int e = 0; e < d; e += kLine) _mm_prefetch(reinterpret_cast<const char*>(row + e), _MM_HINT_T0);
}
constexpr int kPrefetchRows = 4;  // rows ahead of the one in use

constexpr int kBlockPos = 32;  // positions per block of the V passes (decode chunks, batch tiles)

// a[h·d + e] = a[h·d + e]·corr[h] + Σ_{p in [b0, b1)} w[h·w_stride + p - b0]·v_p[e] for H rows, 16 dims
// at a time in registers (2H accumulators, the V slice loaded once for the H rows), then the last
// 8-dim slice when d % 16 != 0. Per output the same multiply and FMA chain in position order as one
// row at a time: bit-identical.
template <int H, class T>
void pv_rows(float* a, int d, const float* corr, const float* w, int w_stride, const T* vh, int64_t kv_stride,
             int b0, int b1) {
  int e = 0;
  for (; e + 16 <= d; e += 16) {
    __m256 x0[H], x1[H];
    for (int h = 0; h < H; ++h) {
      const __m256 cv = _mm256_set1_ps(corr[h]);
      x0[h] = _mm256_mul_ps(cv, _mm256_loadu_ps(a + h * d + e));
      x1[h] = _mm256_mul_ps(cv, _mm256_loadu_ps(a + h * d + e + 8));
    }
    for (int p = b0; p < b1; ++p) {
      const T* vp = vh + p * kv_stride + e;
      const __m256 v0 = load8(vp), v1 = load8(vp + 8);
      for (int h = 0; h < H; ++h) {
        const __m256 wp = _mm256_set1_ps(w[h * w_stride + (p - b0)]);
        x0[h] = _mm256_fmadd_ps(wp, v0, x0[h]);
        x1[h] = _mm256_fmadd_ps(wp, v1, x1[h]);
      }
    }
    for (int h = 0; h < H; ++h) {
      _mm256_storeu_ps(a + h * d + e, x0[h]);
      _mm256_storeu_ps(a + h * d + e + 8, x1[h]);
    }
  }
  for (; e < d; e += 8) {
    __m256 x0[H];
    for (int h = 0; h < H; ++h)
      x0[h] = _mm256_mul_ps(_mm256_set1_ps(corr[h]), _mm256_loadu_ps(a + h * d + e));
    for (int p = b0; p < b1; ++p) {
      const __m256 v0 = load8(vh + p * kv_stride + e);
      for (int h = 0; h < H; ++h)
        x0[h] = _mm256_fmadd_ps(_mm256_set1_ps(w[h * w_stride + (p - b0)]), v0, x0[h]);
    }
    for (int h = 0; h < H; ++h) _mm256_storeu_ps(a + h * d + e, x0[h]);
  }
}

// pv_rows for the `group` rows of a KV head (a [group][d], corr [group], w [group][w_stride]), up to 6
// rows per pass over the V rows [b0, b1).
template <class T>
void pv_group(float* a, int d, int group, const float* corr, const float* w, int w_stride, const T* vh,
              int64_t kv_stride, int b0, int b1) {
  const auto pv = [&](auto n_rows, int g) {  // n_rows: std::integral_constant, the pass's row count
    pv_rows<decltype(n_rows)::value>(a + g * d, d, corr + g, w + g * w_stride, w_stride, vh, kv_stride, b0,
                                     b1);
  };
  int g = 0;
  for (; g + 6 <= group; g += 6) pv(std::integral_constant<int, 6>{}, g);
  if (group - g >= 3) {
    pv(std::integral_constant<int, 3>{}, g);
    g += 3;
  }
  if (group - g == 2) pv(std::integral_constant<int, 2>{}, g);
  if (group - g == 1) pv(std::integral_constant<int, 1>{}, g);
}

// A decode step (one token) over n_kv > chunk positions, flash-decoding style: one task per (KV
// head, chunk of `chunk` positions) computes for each query head of the group its chunk's maximum
// score m, the sum l of exp(score - m) and the sum of exp(score - m)·v; then one task per query
// head merges the chunks in order: out = Σ_c e^(m_c - M) acc_c / Σ_c e^(m_c - M) l_c (M = max m_c).
// Why: one task per (token, KV head) gives a decode step only n_head_kv tasks (4 on the 27B), so at
// long contexts most threads idled while 4 streamed the whole cache. The chunk size is fixed (not
// derived from the thread count), so the result does not depend on -t.
template <class T>
void attention_decode_chunked(const float* q, const T* k_cache, const T* v_cache, float* out, int pos0,
                              const AttentionShape& s, int chunk, ThreadPool& pool) {
  const int d = s.head_dim, group = s.n_head / s.n_head_kv, n_kv = pos0 + 1;
  const int chunks = (n_kv + chunk - 1) / chunk;
  const int64_t kv_stride = static_cast<int64_t>(s.n_head_kv) * d;
  const int64_t stride = 2 * group + static_cast<int64_t>(group) * d;  // per (KV head, chunk): m, l, acc
  // [n_head_kv][chunks][m[group] l[group] acc[group][d]]; every element is written by its task
  std::unique_ptr<float[]> part(new float[static_cast<size_t>(s.n_head_kv) * chunks * stride]);
  pool.parallel_for(static_cast<int64_t>(s.n_head_kv) * chunks, [&](int64_t task, int) {
    const int hk = static_cast<int>(task / chunks), c = static_cast<int>(task % chunks);
    const int p0 = c * chunk, p1 = std::min(n_kv, p0 + chunk);
    float* m = part.get() + task * stride;
    float *l = m + group, *acc = m + 2 * group;
    const float* qg = q + static_cast<int64_t>(hk) * group * d;
    const int np = p1 - p0;
    std::vector<float> w(static_cast<size_t>(np) * group);  // [g][p] scores, then exp(score - m)
    std::vector<float> dots(group);
    for (int p = p0; p < p1; ++p) {
      const T* kp = k_cache + p * kv_stride + hk * d;
      if (p + kPrefetchRows < p1) prefetch_row(kp + kPrefetchRows * kv_stride, d);
      // the group's dots, up to 6 rows per load of the key row (dot_rows: the floats of dot())
      int g = 0;
      for (; g + 6 <= group; g += 6) dot_rows<6>(qg + g * d, kp, d, dots.data() + g);
      if (group - g >= 3) {
        dot_rows<3>(qg + g * d, kp, d, dots.data() + g);
        g += 3;
      }
      for (; g < group; ++g) dots[g] = dot(qg + g * d, kp, d);
      for (g = 0; g < group; ++g) w[static_cast<size_t>(g) * np + (p - p0)] = dots[g] * s.scale;
    }
    for (int g = 0; g < group; ++g) {
      float* wg = w.data() + static_cast<size_t>(g) * np;
      float mx = -INFINITY;
      for (int p = 0; p < np; ++p) mx = std::max(mx, wg[p]);
      m[g] = mx;
      l[g] = exp_shift_sum(wg, np, mx);
    }
    // acc = Σ_p w_p·v_p in blocks of kBlockPos positions, up to 6 heads' rows per pass over a block's
    // V rows (pv_group; the rows of the next block prefetched first): each accumulator is loaded and
    // stored once per block instead of once per position. Per output the same FMA chain in position
    // order from 0 (corr = 1): bit-identical to one position at a time.
    std::fill(acc, acc + static_cast<int64_t>(group) * d, 0.0f);
    const std::vector<float> ones(group, 1.0f);
    const T* vh = v_cache + hk * d;
    for (int b0 = p0; b0 < p1; b0 += kBlockPos) {
      const int b1 = std::min(b0 + kBlockPos, p1);
      for (int p = b1; p < std::min(b1 + kBlockPos, p1); ++p) prefetch_row(vh + p * kv_stride, d);
      pv_group(acc, d, group, ones.data(), w.data() + (b0 - p0), np, vh, kv_stride, b0, b1);
    }
  });
  pool.parallel_for(static_cast<int64_t>(s.n_head_kv) * group, [&](int64_t task, int) {
    const int hk = static_cast<int>(task / group), g = static_cast<int>(task % group);
    const float* base = part.get() + static_cast<int64_t>(hk) * chunks * stride;
    float mx = -INFINITY;
    for (int c = 0; c < chunks; ++c) mx = std::max(mx, base[c * stride + g]);
    float* o = out + (static_cast<int64_t>(hk) * group + g) * d;
    std::fill(o, o + d, 0.0f);
    float den = 0;
    for (int c = 0; c < chunks; ++c) {
      const float* pc = base + c * stride;
      const float f = std::exp(pc[g] - mx);  // every chunk has a position: its m is finite
      den += f * pc[group + g];
      const __m256 fv = _mm256_set1_ps(f);
      const float* a = pc + 2 * group + static_cast<int64_t>(g) * d;
      for (int e = 0; e < d; e += 8)
        _mm256_storeu_ps(o + e, _mm256_fmadd_ps(fv, _mm256_loadu_ps(a + e), _mm256_loadu_ps(o + e)));
    }
    const __m256 inv = _mm256_set1_ps(1.0f / den);
    for (int e = 0; e < d; e += 8) _mm256_storeu_ps(o + e, _mm256_mul_ps(inv, _mm256_loadu_ps(o + e)));
  });
}

// A batch (prefill, t > 1) in tiles of kTileTokens tokens: one task per (KV head, token tile) walks
// the cache in blocks of kBlockPos positions, and every (token, query head) row of the tile takes the
// block's K and V rows while they are in cache, with an online softmax (running maximum m, sum l,
// unnormalized acc, rescaled when m grows). Why: one task per (token, KV head) read a token's whole
// cache from memory for every token, so a 64-token chunk after 2048 positions streamed its K/V rows
// 64 times; here once per tile. Fixed tile and block sizes: the floats do not depend on -t.
constexpr int kTileTokens = 8;

template <class T>
void attention_batch_tiled(const float* q, const T* k_cache, const T* v_cache, float* out, int t, int pos0,
                           const AttentionShape& s, ThreadPool& pool) {
  const int d = s.head_dim, group = s.n_head / s.n_head_kv;
  const int tiles = (t + kTileTokens - 1) / kTileTokens;
  const int64_t kv_stride = static_cast<int64_t>(s.n_head_kv) * d;
  pool.parallel_for(static_cast<int64_t>(s.n_head_kv) * tiles, [&](int64_t task, int) {
    const int hk = static_cast<int>(task % s.n_head_kv), tile = static_cast<int>(task / s.n_head_kv);
    const int i0 = tile * kTileTokens, i1 = std::min(t, i0 + kTileTokens), rows = (i1 - i0) * group;
    std::vector<float> m(rows, -INFINITY), l(rows, 0.0f), acc(static_cast<size_t>(rows) * d, 0.0f);
    std::vector<float> wbuf(static_cast<size_t>(group) * kBlockPos), corr(group);  // [g][p], [g]
    const int n_end = pos0 + i1;  // the tile's last token sees positions [0, n_end)
    for (int b0 = 0; b0 < n_end; b0 += kBlockPos) {
      for (int i = i0; i < i1; ++i) {
        const int b1 = std::min(b0 + kBlockPos, pos0 + i + 1);  // causal: token i sees [0, pos0 + i]
        if (b1 <= b0) continue;
        for (int g = 0; g < group; ++g) {
          const int r = (i - i0) * group + g;
          float* w = wbuf.data() + static_cast<size_t>(g) * kBlockPos;
          const float* qr =
              q + (static_cast<int64_t>(i) * s.n_head + static_cast<int64_t>(hk) * group + g) * d;
          const T* kh = k_cache + hk * d;
          int p = b0;
          for (; p + 4 <= b1; p += 4)
            dot4(qr, kh + p * kv_stride, kh + (p + 1) * kv_stride, kh + (p + 2) * kv_stride,
                 kh + (p + 3) * kv_stride, d, w + (p - b0));
          for (; p < b1; ++p) w[p - b0] = dot(qr, kh + p * kv_stride, d);
          float mb = -INFINITY;
          for (int j = 0; j < b1 - b0; ++j) mb = std::max(mb, w[j] *= s.scale);
          const float mn = std::max(m[r], mb);
          corr[g] = std::exp(m[r] - mn);  // 0 on the first block (m = -inf)
          l[r] = l[r] * corr[g] + exp_shift_sum(w, b1 - b0, mn);
          m[r] = mn;
        }
        // acc = acc·corr + Σ_p w_p·v_p for the token's group rows, up to 6 rows per pass over the block's
        // V rows (pv_rows): each V slice is loaded once for the rows of the pass instead of once per row.
        float* a = acc.data() + static_cast<size_t>(i - i0) * group * d;
        const T* vh = v_cache + hk * d;
        pv_group(a, d, group, corr.data(), wbuf.data(), kBlockPos, vh, kv_stride, b0, b1);
      }
    }
    for (int i = i0; i < i1; ++i)
      for (int g = 0; g < group; ++g) {
        const int r = (i - i0) * group + g;
        const __m256 inv = _mm256_set1_ps(1.0f / l[r]);
        const float* a = acc.data() + static_cast<size_t>(r) * d;
        float* o = out + (static_cast<int64_t>(i) * s.n_head + static_cast<int64_t>(hk) * group + g) * d;
        for (int e = 0; e < d; e += 8) _mm256_storeu_ps(o + e, _mm256_mul_ps(inv, _mm256_loadu_ps(a + e)));
      }
  });
}

template <class T>
void attention_t(const float* q, const T* k_cache, const T* v_cache, float* out, int t, int pos0,
                 const AttentionShape& s, ThreadPool& pool) {
  const int d = s.head_dim, group = s.n_head / s.n_head_kv;
  // BONSAI_CPU_ATTN_CHUNK: positions per task of a long-context decode step (0: one task per KV
  // head at any length, as before session 14), read once per process.
  static const int chunk = env_int("BONSAI_CPU_ATTN_CHUNK", 512, 0, 1 << 20);
  if (t == 1 && chunk > 0 && pos0 + 1 > chunk) {
    attention_decode_chunked(q, k_cache, v_cache, out, pos0, s, chunk, pool);
    return;
  }
  // BONSAI_CPU_ATTN_TILED=0: batches one task per (token, KV head) as before session 14.
  static const bool tiled = env_flag("BONSAI_CPU_ATTN_TILED", true);
  if (t > 1 && tiled) {
    attention_batch_tiled(q, k_cache, v_cache, out, t, pos0, s, pool);
    return;
  }
  const int64_t kv_stride = static_cast<int64_t>(s.n_head_kv) * d;
  pool.parallel_for(static_cast<int64_t>(t) * s.n_head_kv, [&](int64_t task, int) {
    const int i = static_cast<int>(task / s.n_head_kv), hk = static_cast<int>(task % s.n_head_kv);
    const int n_kv = pos0 + i + 1;
    std::vector<float> w(static_cast<size_t>(n_kv) * group);  // [p][g] scores, then weights
    const float* qg = q + (static_cast<int64_t>(i) * s.n_head + static_cast<int64_t>(hk) * group) * d;
    for (int p = 0; p < n_kv; ++p) {
      const T* kp = k_cache + p * kv_stride + hk * d;
      for (int g = 0; g < group; ++g)
        w[static_cast<size_t>(p) * group + g] = dot(qg + g * d, kp, d) * s.scale;
    }
    std::vector<float> inv(group);
    for (int g = 0; g < group; ++g) {
      float mx = -INFINITY, sum = 0;
      for (int p = 0; p < n_kv; ++p) mx = std::max(mx, w[static_cast<size_t>(p) * group + g]);
      for (int p = 0; p < n_kv; ++p)
        sum += (w[static_cast<size_t>(p) * group + g] = std::exp(w[static_cast<size_t>(p) * group + g] - mx));
      inv[g] = 1.0f / sum;
    }
    float* og = out + (static_cast<int64_t>(i) * s.n_head + static_cast<int64_t>(hk) * group) * d;
    for (int64_t e = 0; e < static_cast<int64_t>(group) * d; ++e) og[e] = 0;
    for (int p = 0; p < n_kv; ++p) {
      const T* vp = v_cache + p * kv_stride + hk * d;
      for (int g = 0; g < group; ++g) {
        const __m256 wp = _mm256_set1_ps(w[static_cast<size_t>(p) * group + g] * inv[g]);
        float* o = og + g * d;
        for (int e = 0; e < d; e += 8)
          _mm256_storeu_ps(o + e, _mm256_fmadd_ps(wp, load8(vp + e), _mm256_loadu_ps(o + e)));
      }
    }
  });
}

}  // namespace

void attention_avx2(const float* q, const void* k_cache, const void* v_cache, float* out, int t, int pos0,
                    const AttentionShape& s, ThreadPool& pool) {
  if (s.head_dim % 8 != 0) {
    ref::attention(q, k_cache, v_cache, out, t, pos0, s);
    return;
  }
  if (s.kv == KvType::F16)
    attention_t(q, static_cast<const uint16_t*>(k_cache), static_cast<const uint16_t*>(v_cache), out, t, pos0,
                s, pool);
  else
    attention_t(q, static_cast<const float*>(k_cache), static_cast<const float*>(v_cache), out, t, pos0, s,
                pool);
}

void store_rows_f16c(void* cache, const float* src, int64_t width, int t, int pos0, KvType kv) {
  if (kv != KvType::F16) {
    ref::store_rows(cache, src, width, t, pos0, kv);
    return;
  }
  uint16_t* dst = static_cast<uint16_t*>(cache) + static_cast<int64_t>(pos0) * width;
  const int64_t n = width * t;
  int64_t j = 0;
  // _MM_FROUND_TO_NEAREST_INT: round to nearest even, as f32_to_fp16 (bonsai/formats.h) does
  for (; j + 8 <= n; j += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT));
  for (; j < n; ++j) dst[j] = f32_to_fp16(src[j]);
}

}  // namespace bonsai::cpu
