// Ceiling of the ws matvec's consumer loop, in isolation (issue 7; docs/performance.md, "Session 10:
// the matvec consumers' ceiling (probe)"). The production block shape (8 consumer warps + 2 producer
// warps, 2 blocks per SM, one wave of 2 x SMs blocks), but no producers and no DRAM: every consumer
// warp's ring of R unit slots is filled once in shared memory, and the consumers then walk their
// unit range many times around it with the production loop's bookkeeping (slot pointer and
// full-barrier walk, an mbarrier wait per unit on an already-complete phase, the release arrive, the
// next unit's activation words from global memory (L1/L2), finish_pair at each row group's end). The
// full barrier of a slot counts the warp's own 32 release arrivals (empty_off = 0), so the j-th use
// of a slot waits for phase j, which the (j-1)-th release completed: the wait never blocks.
// Variants (weight bytes = 2176 per unit: 4 tiles x (512 B codes + 32 B scales), G = 1):
//   A   production: consume_v1 + unit_dot_v1 of kernels/cuda/matvec_ws.cu (this TU includes it);
//   A'  the probe's copy of that loop (templated on the dot), with unit_dot_v1: must match A;
//   Ab  A' without the mbarrier wait / arrive (the barrier ops' share);
//   B   A' without the decode: the raw code words as the IMMA A operands (timing only);
//   C*  binary tensor cores (mma.m16n8k{128,256}.b1.and.popc): the weights as two bit planes
//       (code c = b0 + 2·b1, value c - 1) stored as the A fragments (no decode), the activation q
//       (16-bit two's complement, |q| <= 32639) as 16 bit planes in the B columns (plane j of q in
//       n8 column group j / 8, column j % 8); a lane ends with planes 2·tig, 2·tig + 1, 8 + 2·tig,
//       9 + 2·tig of rows g, g + 8 and weighs them 1, 2, 256, ±512 (plane 15 is -2^15) times
//       2^(2·tig) (folded into the float scale); Σq (the -1 offset) is subtracted on tig 0; the four
//       tig lanes' float partials are added at the row group's end (two shuffles). Forms:
//       C4 4 x k128 per tile (b0 and b1 apart, S = P0 + 2·P1 in integers), C6 6 x k128 (b1 twice
//       into one accumulator), Cm 2 x (k256 [b0|b1]·[β|β] + k128 b1·β);
//   D   8 tiles per slot (one wait / arrive / activation load per 8 tiles), unit_dot_v1 and Cm.
// Before timing: each dot's integer per (row, 128-block) against a scalar reference on random data
// (codes 0..3 incl. all-3 rows, q at ±32639, zero scales), exactly, and each dot's float for one
// block (A: bit for bit; C: rel. error, the tig partials summed in another order).
// Also the raw rate of mma.sync u8 k32 and b1 k128 / k256 (1 and 8 independent chains per warp).
// Part 2: the production matvec itself (matvec_tiled of kernels/cuda/matvec.cu, linked: ws kernel,
// consumer loop 1, first-rank fix-up, evict-first copies, PDL) at the 27B decode shapes, t = 1,
// chained on one stream, cold (a rotation of weight copies the L2 cannot hold) and L2-resident (one
// copy every launch), and the D2D copy rate (BONSAI_CUDA_MV_RING=2..8 picks its ring, as in bonsai).
//
// Build (here; runs only on an sm_90 GPU; one line):
//   nvcc -O3 -std=c++20 -I. -gencode arch=compute_90a,code=sm_90a -Xptxas -v
//        -o .prebuilt-cons10/consumer_probe tools/cuda/consumer_probe.cu kernels/cuda/matvec.cu
// Run: consumer_probe [--groups 48] [--reps 5] [--part 3]   (~2 s on the H200; --part 1: the loops and
// the MMA rates, 2: the production matvec; SASS: cuobjdump -sass consumer_probe, on the device)
// Prints: the verification, the raw MMA rates, per variant registers / spills, ms, weight GB/s per
// GPU and per SM, SM cycles per unit per warp; per shape the production matvec's µs cold and from L2.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/matvec_ws.cu"  // consume_v1, unit_dot_v1 (anonymous namespace: this TU's copy)

// The run-time selection without the library (part 2 launches the production matvec through
// matvec_tiled, kernels/cuda/matvec.cu).
#include "tools/cuda/probe_selection.h"

#include "tools/cuda/consumer_probe_device.cuh"  // the kernels (same anonymous namespace below)

namespace bonsai::cuda::mv {
namespace {

// ---- host ------------------------------------------------------------------------------------
// Random ternary data in natural layout and its three device images.
struct HostData {
  int rows, kblocks;
  std::vector<uint8_t> codes;  // [rows][k]
  std::vector<float> scale;    // [rows][kblocks] (fp16 values)
  std::vector<int> q;          // [k]
  std::vector<float> s;        // [kblocks]
};

HostData make_data(int pairs, int kblocks, uint32_t seed) {
  std::mt19937 rng(seed);
  HostData h{pairs * kPairRows, kblocks, {}, {}, {}, {}};
  const int k = kblocks * kBlockK;
  h.codes.resize(static_cast<size_t>(h.rows) * k);
  h.scale.resize(static_cast<size_t>(h.rows) * kblocks);
  for (int r = 0; r < h.rows; ++r)
    for (int c = 0; c < k; ++c) {
      int v = static_cast<int>(rng() & 3);
      if (r % 13 == 5) v = 3;  // all-3 rows (the largest products)
      if (r % 17 == 9) v = 0;
      h.codes[static_cast<size_t>(r) * k + c] = static_cast<uint8_t>(v);
    }
  for (auto& d : h.scale) {
    const uint32_t z = rng() % 8;
    d = z == 0 ? 0.0f : __half2float(__float2half(std::ldexp(static_cast<float>(rng() % 1000 + 1), -14)));
  }
  h.q.resize(k);
  for (int c = 0; c < k; ++c) {
    const int kb = c / kBlockK;
    int v = static_cast<int>(rng() % 65279) - 32639;
    if (kb % 4 == 1) v = 32639;  // extremes
    if (kb % 4 == 2) v = -32639;
    if (kb % 4 == 3 && c % 3 == 0) v = (c % 2) ? -32639 : 32639;
    h.q[c] = v;
  }
  h.s.resize(kblocks);
  for (auto& v : h.s) v = std::ldexp(static_cast<float>(rng() % 1000 + 1), -20);
  return h;
}

// Production tiled weight (tile_layout.h) and the bit-plane one, [pairs][4][kblocks][544 B].
void pack_weights(const HostData& h, std::vector<uint8_t>& tiled, std::vector<uint8_t>& bits) {
  const int k = h.kblocks * kBlockK, tiles = h.rows / kTileRows;
  tiled.assign(static_cast<size_t>(tiles) * h.kblocks * kChunk, 0);
  bits.assign(tiled.size(), 0);
  for (int t = 0; t < tiles; ++t)
    for (int kb = 0; kb < h.kblocks; ++kb) {
      uint8_t* ct = tiled.data() + (static_cast<size_t>(t) * h.kblocks + kb) * kChunk;
      uint8_t* cb = bits.data() + (static_cast<size_t>(t) * h.kblocks + kb) * kChunk;
      for (int r = 0; r < kTileRows; ++r) {
        const int row = t * kTileRows + r;
        for (int c = 0; c < kBlockK; ++c) {
          const int code = h.codes[static_cast<size_t>(row) * k + kb * kBlockK + c];
          const CodePos p = code_pos(r, c);
          ct[p.byte] |= static_cast<uint8_t>(code << p.shift);
          // bit plane: lane 4·(r & 7) + c / 32, word (r >> 3) + 2·plane, bit c % 32
          const int lane = 4 * (r & 7) + c / 32, bit = c % 32;
          for (int pl = 0; pl < 2; ++pl)
            if ((code >> pl) & 1) {
              uint32_t* word = reinterpret_cast<uint32_t*>(cb + lane * 16) + (r >> 3) + 2 * pl;
              *word |= 1u << bit;
            }
        }
        const __half d = __float2half(h.scale[static_cast<size_t>(row) * h.kblocks + kb]);
        std::memcpy(ct + scale_pos(r, 0), &d, 2);
        std::memcpy(cb + scale_pos(r, 0), &d, 2);
      }
    }
}

void pack_act(const HostData& h, std::vector<uint8_t>& xq, std::vector<uint8_t>& xbits,
              std::vector<float4>& meta) {
  xq.assign(static_cast<size_t>(h.kblocks) * kActBytes, 0);
  xbits.assign(xq.size(), 0);
  meta.resize(h.kblocks);
  for (int kb = 0; kb < h.kblocks; ++kb) {
    uint8_t* xb = xq.data() + kb * kActBytes;
    uint32_t* bw = reinterpret_cast<uint32_t*>(xbits.data() + kb * kActBytes);
    int sum[2] = {0, 0};
    for (int c = 0; c < kBlockK; ++c) {
      const int q = h.q[kb * kBlockK + c];
      sum[c / 64] += q;
      const int w = act_word(c);
      xb[4 * w + (c & 3)] = static_cast<uint8_t>(act_hi(q) & 0xff);
      xb[128 + 4 * w + (c & 3)] = static_cast<uint8_t>(act_lo(q) & 0xff);
      const uint32_t u = static_cast<uint32_t>(q) & 0xffffu;
      for (int j = 0; j < 16; ++j)
        if ((u >> j) & 1) bw[2 * (4 * (j % 8) + c / 32) + j / 8] |= 1u << (c % 32);
    }
    float s0, s1;
    std::memcpy(&s0, &sum[0], 4);
    std::memcpy(&s1, &sum[1], 4);
    meta[kb] = make_float4(h.s[kb], h.s[kb], s0, s1);
  }
}

template <class T>
T* to_dev(const std::vector<T>& v) {
  T* p = nullptr;
  CK(cudaMalloc(&p, v.size() * sizeof(T)));
  CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

bool verify() {
  const int pairs = 8, kblocks = 8;
  const HostData h = make_data(pairs, kblocks, 12345);
  std::vector<uint8_t> tiled, bits, xq, xbits;
  std::vector<float4> meta;
  pack_weights(h, tiled, bits);
  pack_act(h, xq, xbits, meta);
  const int k = kblocks * kBlockK, n = h.rows * kblocks;
  std::vector<int> ref(n);
  for (int r = 0; r < h.rows; ++r)
    for (int kb = 0; kb < kblocks; ++kb) {
      long long t = 0;
      for (int c = kb * kBlockK; c < (kb + 1) * kBlockK; ++c)
        t += static_cast<long long>(h.codes[static_cast<size_t>(r) * k + c] - 1) * h.q[c];
      ref[r * kblocks + kb] = static_cast<int>(t);
    }
  uint8_t *dt = to_dev(tiled), *db = to_dev(bits), *dx = to_dev(xq), *dxb = to_dev(xbits);
  float4* dm = to_dev(meta);
  int* dT = nullptr;
  float* dY = nullptr;
  CK(cudaMalloc(&dT, n * sizeof(int)));
  CK(cudaMalloc(&dY, n * sizeof(float)));
  std::vector<int> T(n);
  std::vector<float> Y(n);
  bool ok = true;
  auto check = [&](const char* name, bool bitwise) {
    CK(cudaGetLastError());
    CK(cudaMemcpy(T.data(), dT, n * sizeof(int), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(Y.data(), dY, n * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0, zeros = 0, maxabs = 0;
    double maxrel = 0;
    for (int i = 0; i < n; ++i) {
      bad += T[i] != ref[i];
      maxabs = std::max(maxabs, std::abs(ref[i]));
      const float yr = static_cast<float>(ref[i]) * (h.scale[i] * h.s[i % kblocks]);  // unit_dot's product
      if (h.scale[i] == 0.0f) {
        zeros++;
        bad += Y[i] != 0.0f;
      } else if (bitwise) {
        bad += std::memcmp(&Y[i], &yr, 4) != 0;
      } else {
        // C: four lane partials V_t·(d·s·4^t), each rounded once (the integers are exact, d·s·4^t
        // is d·s scaled by a power of two), summed in two rounds: |error| <= ~6 ulp of the terms'
        // magnitudes, which can exceed |y| by cancellation; bound it by the sum of |terms| <=
        // 4·|max V|·|d·s·64| and report the ratio to |yr| too.
        const double e = std::fabs(static_cast<double>(Y[i]) -
                                   static_cast<double>(ref[i]) * h.scale[i] * h.s[i % kblocks]);
        const double bound = 8.0 * 1.2e-7 * (4.0 * 384 * 771 * 64) * h.scale[i] * h.s[i % kblocks];
        if (e > bound) ++bad;
        if (yr != 0.0f) maxrel = std::max(maxrel, e / std::fabs(static_cast<double>(yr)));
      }
    }
    std::printf("verify %-4s: %d of %d (row, block) integers and floats wrong (%d zero-scale, max |T| %d)%s",
                name, bad, n, zeros, maxabs, bitwise ? ", floats bit for bit\n" : "");
    if (!bitwise) std::printf(", float max rel. error %.2e\n", maxrel);
    ok = ok && bad == 0;
  };
  verify_kernel<DotV1, false><<<pairs * kblocks, 32>>>(dt, dx, dm, kblocks, dT, dY);
  check("A", true);
  verify_kernel<DotB1<0>, true><<<pairs * kblocks, 32>>>(db, dxb, dm, kblocks, dT, dY);
  check("C4", false);
  verify_kernel<DotB1<1>, true><<<pairs * kblocks, 32>>>(db, dxb, dm, kblocks, dT, dY);
  check("C6", false);
  verify_kernel<DotB1<2>, true><<<pairs * kblocks, 32>>>(db, dxb, dm, kblocks, dT, dY);
  check("Cm", false);
  for (void* p :
       {static_cast<void*>(dt), static_cast<void*>(db), static_cast<void*>(dx), static_cast<void*>(dxb),
        static_cast<void*>(dm), static_cast<void*>(dT), static_cast<void*>(dY)})
    cudaFree(p);
  return ok;
}

template <int Kind, int CH>
void mma_row(const char* name, int sms, double ghz) {
  const int iters = 4096, nb = sms * 2, threads = 256;
  int* out = nullptr;
  CK(cudaMalloc(&out, sizeof(int) * nb * threads));
  mma_rate<Kind, CH><<<nb, threads>>>(16, out);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  mma_rate<Kind, CH><<<nb, threads>>>(iters, out);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  const double mmas = static_cast<double>(nb) * (threads / 32) * iters * 4 * CH;
  const double per_sm_clk = mmas / sms / (ms * 1e-3 * ghz * 1e9);
  const double bitk = Kind == 0 ? 32 : Kind == 1 ? 128 : 256;  // k per instruction
  std::printf(
      "mma %-22s %d chain(s)/warp, 16 warps/SM: %7.3f ms, %.3f MMA per SM-cycle (%.1f SM-cycles per MMA "
      "per warp), %.0f T k-products/s\n",
      name, CH, ms, per_sm_clk, 16.0 / per_sm_clk, mmas * 16 * 8 * bitk / (ms * 1e-3) / 1e12);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(out);
}

template <int V>
void time_variant(ProbeArgs a, int sms, int reps, double ghz) {
  constexpr int M = kTilesPerSlot[V];
  const size_t smem = static_cast<size_t>(kWarps) * kRing * M * kUnitBytes;
  CK(cudaFuncSetAttribute(probe_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(smem)));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, probe_kernel<V>, kProbeThreads, smem));
  cudaFuncAttributes fa{};
  CK(cudaFuncGetAttributes(&fa, probe_kernel<V>));
  const int nb = sms * kBlocksPerSm;
  a.per_warp /= M;  // the same weight bytes per warp
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> t;
  std::vector<long long> clk(static_cast<size_t>(nb) * kWarps * 2);
  double cyc = 0, ghz_run = 0;  // ghz_run: block 0 warp 0's clock64 over globaltimer
  for (int r = 0; r <= reps; ++r) {
    CK(cudaEventRecord(e0));
    probe_kernel<V><<<nb, kProbeThreads, smem>>>(a);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r == 0) continue;  // warm-up
    t.push_back(ms);
    CK(cudaMemcpy(clk.data(), a.clk, clk.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    double s = 0;
    for (size_t i = 0; i < clk.size(); i += 2) s += static_cast<double>(clk[i + 1] - clk[i]);
    cyc += s / (clk.size() / 2) / a.per_warp / M / reps;  // per 4-tile unit
    unsigned long long ns[2];
    CK(cudaMemcpy(ns, a.ns, sizeof ns, cudaMemcpyDeviceToHost));
    ghz_run += static_cast<double>(clk[1] - clk[0]) / static_cast<double>(ns[1] - ns[0]) / reps;
  }
  std::sort(t.begin(), t.end());
  const double bytes = static_cast<double>(nb) * kWarps * a.per_warp * M * kUnitBytes;
  const double best = t.front(), med = t[t.size() / 2];
  std::printf(
      "%-31s %3d regs %3zu B spill(lmem) %d blk/SM | best %.3f ms (median %.3f) | %6.0f GB/s = %5.1f GB/s "
      "per SM "
      "(%4.2fx copy rate) | %5.1f SM-cycles per 4-tile unit per warp (%.1f per SM) at %.3f GHz\n",
      kNames[V], fa.numRegs, fa.localSizeBytes, per_sm, best, med, bytes / (best * 1e-3) / 1e9,
      bytes / (best * 1e-3) / 1e9 / sms, bytes / (best * 1e-3) / 1e9 / sms / (4.25e3 / 132), cyc,
      cyc / (kWarps * kBlocksPerSm), ghz_run);
  (void)ghz;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

template <int... V>
void time_all(ProbeArgs a, int sms, int reps, double ghz, std::integer_sequence<int, V...>) {
  (time_variant<V>(a, sms, reps, ghz), ...);
}

// Part 2: the production matvec (matvec_tiled: ws kernel, loop 1, first-rank fix-up, evict-first
// copies, PDL) at the 27B decode shapes, t = 1, launches chained on one stream: "cold" walks
// through enough copies of the weight (random bytes) that none is still in the L2 when it comes
// round again, "L2" uses one copy every launch (resident after the first: the rate the kernel
// reaches when DRAM is not the limit).
void production_matvecs(int sms) {
  struct Shape {
    const char* name;
    int k, n;
  };
  const Shape shapes[] = {{"GDN qkv+z", 5120, 16384},   {"attn q+k+v", 5120, 14336}, {"out-proj", 6144, 5120},
                          {"FFN gate+up", 5120, 34816}, {"FFN down", 17408, 5120},   {"head", 5120, 248320}};
  {  // the copy rate, for the ratios
    const size_t bytes = size_t{1} << 30;
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 5; ++i) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    std::printf("D2D copy: %.0f GB/s (read + write: %.0f GB/s of traffic)\n", 5.0 * bytes / (ms * 1e-3) / 1e9,
                10.0 * bytes / (ms * 1e-3) / 1e9);
    cudaFree(a);
    cudaFree(b);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (const Shape& sh : shapes) {
    const size_t wbytes = static_cast<size_t>(tiled_bytes(sh.n, sh.k, 1));
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{640} << 20) / wbytes + 1));
    std::vector<uint8_t*> w(copies);
    for (auto& p : w) {
      CK(cudaMalloc(&p, wbytes));
      CK(cudaMemset(p, 0x55, wbytes));  // codes 1 and scales 0x5555 (finite fp16): any bytes time alike
    }
    const int kblocks = sh.k / kBlockK;
    std::vector<float> x(sh.k);
    std::mt19937 rng(3);
    for (auto& v : x) v = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
    float* dx = to_dev(x);
    uint8_t* xq = nullptr;
    float4* meta = nullptr;
    float* y = nullptr;
    CK(cudaMalloc(&xq, static_cast<size_t>(kblocks) * kActBytes));
    CK(cudaMalloc(&meta, static_cast<size_t>(kblocks) * sizeof(float4)));
    CK(cudaMalloc(&y, static_cast<size_t>(sh.n) * sizeof(float)));
    quantize_act(dx, xq, meta, 1, sh.k, st);
    TiledJobs jobs;
    jobs.count = 1;
    jobs.job[0].n = sh.n;
    jobs.job[0].y = y;
    size_t pf = 0, pc = 0;
    matvec_tiled_scratch(jobs, 1, sh.k, sms, &pf, &pc);
    float* partial = nullptr;
    int* counters = nullptr;
    CK(cudaMalloc(&partial, pf * sizeof(float)));
    CK(cudaMalloc(&counters, pc * sizeof(int)));
    CK(cudaMemset(counters, 0, pc * sizeof(int)));
    auto chain = [&](bool resident, int launches) {
      cudaEvent_t e0, e1;
      CK(cudaEventCreate(&e0));
      CK(cudaEventCreate(&e1));
      for (int i = 0; i < copies; ++i) {  // warm-up (and the L2 arm's first touch)
        jobs.job[0].w = w[resident ? 0 : i];
        matvec_tiled(jobs, 1, xq, meta, 1, sh.k, sms, partial, counters, st, true);
      }
      CK(cudaEventRecord(e0, st));
      for (int i = 0; i < launches; ++i) {
        jobs.job[0].w = w[resident ? 0 : i % copies];
        matvec_tiled(jobs, 1, xq, meta, 1, sh.k, sms, partial, counters, st, true);
      }
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      CK(cudaGetLastError());
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      return ms * 1e3 / launches;  // us per matvec
    };
    const int launches = std::max(20, static_cast<int>((size_t{4} << 30) / wbytes));
    const double cold = chain(false, launches), warm = sh.n > 100000 ? 0.0 : chain(true, launches);
    const double gb = static_cast<double>(wbytes) / 1e9;
    std::printf(
        "matvec %-11s %5d x %6d %6.1f MB (%5.2f units/warp): cold %7.2f us = %5.0f GB/s (%4.1f GB/s per SM)",
        sh.name, sh.k, sh.n, gb * 1e3,
        static_cast<double>(tiled_pairs(sh.n)) * kblocks / (sms * kBlocksPerSm * kWarps), cold,
        gb / (cold * 1e-6), gb / (cold * 1e-6) / sms);
    if (warm > 0)
      std::printf(" | L2 %7.2f us = %5.0f GB/s (%4.1f GB/s per SM)\n", warm, gb / (warm * 1e-6),
                  gb / (warm * 1e-6) / sms);
    else
      std::printf(" | L2 - (larger than the L2)\n");
    for (auto* p : w) cudaFree(p);
    for (void* p : {static_cast<void*>(dx), static_cast<void*>(xq), static_cast<void*>(meta),
                    static_cast<void*>(y), static_cast<void*>(partial), static_cast<void*>(counters)})
      cudaFree(p);
  }
  cudaStreamDestroy(st);
}

int run(int argc, char** argv) {
  int groups = 48, reps = 5, part = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string o = argv[i];
    if (o == "--groups")
      groups = std::atoi(argv[i + 1]);
    else if (o == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (o == "--part")
      part = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "usage: consumer_probe [--groups 48] [--reps 5] [--part 3 (1: the loops, 2: the "
                   "production matvec, 3: both)]\n");
      return 2;
    }
  }
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  double* dghz = nullptr;
  CK(cudaMalloc(&dghz, sizeof(double)));
  clock_rate<<<1, 1>>>(20000000ull, dghz);
  double ghz = 0;
  CK(cudaMemcpy(&ghz, dghz, sizeof ghz, cudaMemcpyDeviceToHost));
  std::printf("%s, %d SMs, SM clock %.3f GHz (clock64 over 20 ms of globaltimer, one idle-ish SM)\n",
              prop.name, sms, ghz);
  const bool ok = verify();
  if (part & 1) {
    mma_row<0, 1>("u8.s8 m16n8k32", sms, ghz);
    mma_row<0, 8>("u8.s8 m16n8k32", sms, ghz);
    mma_row<1, 1>("b1.and.popc m16n8k128", sms, ghz);
    mma_row<1, 8>("b1.and.popc m16n8k128", sms, ghz);
    mma_row<2, 1>("b1.and.popc m16n8k256", sms, ghz);
    mma_row<2, 8>("b1.and.popc m16n8k256", sms, ghz);

    // Timed loops: random bytes as the rings (scales: finite fp16), activation of K = 5120.
    const int nb = sms * kBlocksPerSm;
    std::mt19937 rng(7);
    std::vector<uint8_t> ring(static_cast<size_t>(kWarps) * kRing * 2 * kUnitBytes);
    for (auto& b : ring) b = static_cast<uint8_t>(rng());
    for (size_t c = 0; c + kChunk <= ring.size(); c += kChunk)
      for (int i = 0; i < 16; ++i) {
        const __half d = __float2half(0.5f + static_cast<float>(rng() % 1000) / 1000.0f);
        std::memcpy(ring.data() + c + kCodeBytes + 2 * i, &d, 2);
      }
    std::vector<uint8_t> xq(static_cast<size_t>(kKblocks) * kActBytes), xbits(xq.size());
    for (auto& b : xq) b = static_cast<uint8_t>(rng());
    for (auto& b : xbits) b = static_cast<uint8_t>(rng());
    std::vector<float4> meta(kKblocks);
    for (auto& m : meta) {
      const int s0 = static_cast<int>(rng() % 20000) - 10000, s1 = static_cast<int>(rng() % 20000) - 10000;
      float f0, f1;
      std::memcpy(&f0, &s0, 4);
      std::memcpy(&f1, &s1, 4);
      m = make_float4(1e-3f, 1e-3f, f0, f1);
    }
    ProbeArgs a{};
    a.ring = to_dev(ring);
    a.xq = to_dev(xq);
    a.xbits = to_dev(xbits);
    a.meta = to_dev(meta);
    a.kblocks = kKblocks;
    a.per_warp = kKblocks * groups;
    const size_t pairs =
        static_cast<size_t>(nb) * kWarps * groups;  // 4-tile row groups (D: 2x per 8-tile group)
    float* y = nullptr;
    CK(cudaMalloc(&y, pairs * kPairRows * sizeof(float)));
    a.jobs.count = 1;
    a.jobs.job[0].y = y;
    a.jobs.job[0].n = static_cast<int>(pairs * kPairRows);
    a.plan.per_warp = 1 << 30;  // finish_pair: first == last, y written directly
    a.plan.units = a.per_warp * nb * kWarps;
    a.plan.pairs = static_cast<int>(pairs);
    a.plan.slots = 1;
    a.plan.ring = kRing;
    long long* clk = nullptr;
    unsigned long long* ns = nullptr;
    CK(cudaMalloc(&clk, sizeof(long long) * nb * kWarps * 2));
    CK(cudaMalloc(&ns, sizeof(unsigned long long) * 2));
    a.clk = clk;
    a.ns = ns;
    std::printf(
        "timed: %d blocks x 8 consumer warps, %d units (%d row groups x %d k-blocks) per warp, ring %d, "
        "%.1f MB of weight reads per launch; %d reps (best, median)\n",
        nb, a.per_warp, groups, kKblocks, kRing,
        static_cast<double>(nb) * kWarps * a.per_warp * kUnitBytes / 1e6, reps);
    time_all(a, sms, reps, ghz, std::make_integer_sequence<int, kVariants>{});
  }
  if (part & 2) production_matvecs(sms);
  std::printf("%s\n", ok ? "verify: all exact" : "verify: FAILED");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace bonsai::cuda::mv

int main(int argc, char** argv) { return bonsai::cuda::mv::run(argc, argv); }
