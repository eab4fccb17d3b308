// Non-matvec decode ops at Bonsai 2 27B shapes, on the fast CPU backend:
// the FWHT site (5120 / 6144 / 17408 wide, block 1024), the GDN delta-rule step
// (48 value heads × 128×128 fp32 state), and attention over the KV cache
// (24 query heads, 4 KV heads, head dim 256) at several cache lengths. Each
// reports the bytes it must touch, so GB/s compares with BM_read_bandwidth.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "bench/bench_common.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/gdn_chunked.h"
#include "kernels/ref/ref_backend.h"
#include "runtime/bandwidth.h"
#include "runtime/cpu_features.h"

namespace bonsai::bench {
namespace {

CpuBackend& backend(int threads) {
  static std::unique_ptr<CpuBackend> b[3];
  if (!b[threads]) b[threads] = std::make_unique<CpuBackend>(threads, select_isa(), cpu::Precision::Faithful);
  return *b[threads];
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void BM_fwht_site(benchmark::State& state) {
  const int64_t k = state.range(0), block = 1024;
  auto x = randn(k, 1), s = randn(k, 2), y = std::vector<float>(k);
  for (auto& v : s) v = v < 0 ? -1.0f : 1.0f;
  CpuBackend& be = backend(1);
  for (auto _ : state) {
    be.hadamard(x.data(), s.data(), y.data(), 1, k, block, false);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * k * 3 * 4);  // read x and signs, write y
}
BENCHMARK(BM_fwht_site)->Arg(5120)->Arg(6144)->Arg(17408);

void BM_gdn_step(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  GdnShape s{16, 48, 128, 128, 1e-6f};
  const int64_t width = 2 * 16 * 128 + 48 * 128;
  auto conv = randn(width, 3), g = randn(48, 4), beta = randn(48, 5);
  for (auto& v : g) v = -std::fabs(v) * 0.1f;
  for (auto& v : beta) v = 0.5f;
  std::vector<float> st(48 * 128 * 128, 0.01f), out(48 * 128);
  CpuBackend& be = backend(threads);
  for (auto _ : state) {
    be.gdn_recurrence(conv.data(), g.data(), beta.data(), st.data(), out.data(), 1, s);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(st.size()) * 4 *
                          2);  // state read + written
}
BENCHMARK(BM_gdn_step)->Arg(1)->Arg(2)->UseRealTime();

// The same step streaming the 27B's whole GDN state (48 layers × 3 MiB, far
// beyond L3): one layer per iteration, cycling, as a decode token does.
// Arg 0: instruction set (1 = AVX2 step, 2 = AVX-512 step); arg 1: threads;
// arg 2: state on huge pages (1) or 4 KiB pages (0).
void BM_gdn_step_stream(benchmark::State& state) {
  const Isa isa = state.range(0) == 2 ? Isa::Avx512 : Isa::Avx2;
  if (!isa_supported(isa)) return state.SkipWithError("instruction set not supported by this CPU");
  const int threads = static_cast<int>(state.range(1));
  GdnShape s{16, 48, 128, 128, 1e-6f};
  const int64_t width = 2 * 16 * 128 + 48 * 128, layer = 48 * 128 * 128, layers = 48;
  auto conv = randn(width, 3), g = randn(48, 4), beta = randn(48, 5);
  for (auto& v : g) v = -std::fabs(v) * 0.1f;
  for (auto& v : beta) v = 0.5f;
  bench::Bytes st_bytes = bench::alloc_bytes(static_cast<size_t>(layer * layers) * 4, state.range(2) != 0);
  float* st = reinterpret_cast<float*>(st_bytes.get());
  std::fill(st, st + layer * layers, 0.01f);
  std::vector<float> out(48 * 128);
  CpuBackend be(threads, isa, cpu::Precision::Faithful);
  int64_t l = 0;
  for (auto _ : state) {
    be.gdn_recurrence(conv.data(), g.data(), beta.data(), st + l * layer, out.data(), 1, s);
    benchmark::DoNotOptimize(out.data());
    l = (l + 1) % layers;
  }
  state.SetBytesProcessed(state.iterations() * layer * 4 * 2);  // state read + written
}
BENCHMARK(BM_gdn_step_stream)->ArgsProduct({{1, 2}, {1, 2}, {0, 1}})->UseRealTime();

// The same with each layer's state where the model puts it: its own
// CpuBackend::alloc buffer (3 MiB, 2 MiB-aligned huge-page mapping), as in
// a decode step; range(0): threads; range(1) != 0: between two calls (not
// timed) the pool streams 128 MiB of other memory, as a decode step's
// matvecs do between two GDN layers.
void BM_gdn_step_inplace(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const bool stream_between = state.range(1) != 0;
  constexpr size_t kOther = size_t{128} << 20;
  bench::Bytes other = bench::alloc_bytes(stream_between ? kOther : 64, true);
  if (stream_between) bench::fill_random(other.get(), kOther, 9);
  uint64_t sink[8] = {};
  GdnShape s{16, 48, 128, 128, 1e-6f};
  const int64_t width = 2 * 16 * 128 + 48 * 128, layer = 48 * 128 * 128, layers = 48;
  auto conv = randn(width, 3), g = randn(48, 4), beta = randn(48, 5);
  for (auto& v : g) v = -std::fabs(v) * 0.1f;
  for (auto& v : beta) v = 0.5f;
  CpuBackend be(threads, Isa::Avx512, cpu::Precision::Faithful);
  std::vector<float*> st(layers);
  for (auto& p : st) {
    p = be.alloc(static_cast<size_t>(layer));
    std::fill(p, p + layer, 0.01f);
  }
  std::vector<float> out(48 * 128);
  int64_t l = 0;
  ThreadPool& tp = bench::pool(threads);
  for (auto _ : state) {
    if (stream_between) {
      state.PauseTiming();
      tp.parallel_for(kOther / (2 << 20), [&](int64_t t, int th) {
        sink[th] += sum_bytes(other.get() + t * (2 << 20), 2 << 20);
      });
      state.ResumeTiming();
    }
    be.gdn_recurrence(conv.data(), g.data(), beta.data(), st[l], out.data(), 1, s);
    benchmark::DoNotOptimize(out.data());
    l = (l + 1) % layers;
  }
  benchmark::DoNotOptimize(sink);
  for (auto p : st) be.release(p);
  state.SetBytesProcessed(state.iterations() * layer * 4 * 2);
}
BENCHMARK(BM_gdn_step_inplace)->ArgsProduct({{1, 2}, {0, 1}})->UseRealTime();

// The GDN causal conv + SiLU at the 27B's 10240 channels (4 taps), one token:
// the reference loop vs the CPU backend (AVX2, threaded); and the SwiGLU site
// at 17408 (SiLU by libm expf vs the vector exp).
void BM_ssm_conv(benchmark::State& state) {
  const int64_t C = 10240;
  const int taps = 4, threads = static_cast<int>(state.range(0));
  auto x = randn(C, 6), wv = randn(C * taps, 7), st = randn((taps - 1) * C, 8);
  std::vector<float> out(C);
  Weight w;
  w.type = DType::F32, w.k = taps, w.n = C, w.data = reinterpret_cast<const uint8_t*>(wv.data());
  RefBackend ref;
  Backend& be = threads == 0 ? static_cast<Backend&>(ref) : backend(threads);
  for (auto _ : state) {
    be.ssm_conv(x.data(), st.data(), w, out.data(), 1, C, taps);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * C);
}
BENCHMARK(BM_ssm_conv)->ArgName("threads(0=ref)")->Arg(0)->Arg(1)->Arg(2)->UseRealTime();

// The 27B's SwiGLU and residual sites (17408 / 5120 wide, Hadamard blocks of 1024) for one row
// (decode) and a prefill batch, on the reference (threads 0) and the CPU backend's pool: from 8
// tasks a site is split at blocks or rows across the pool (kernels/cpu/backend_cpu.cpp).
void BM_swiglu_site(benchmark::State& state) {
  const int64_t n = 17408, block = 1024, rows = state.range(1);
  auto g = randn(n * rows, 9), u = randn(n * rows, 10), s = randn(n, 11);
  for (auto& v : s) v = v < 0 ? -1.0f : 1.0f;
  std::vector<float> a(n * rows), r(n * rows);
  RefBackend ref;
  Backend& be = state.range(0) == 0 ? static_cast<Backend&>(ref) : backend(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    be.swiglu_site(g.data(), u.data(), a.data(), s.data(), block, r.data(), rows, n);
    benchmark::DoNotOptimize(r.data());
  }
  state.SetItemsProcessed(state.iterations() * n * rows);
}
BENCHMARK(BM_swiglu_site)
    ->ArgNames({"threads(0=ref)", "rows"})
    ->ArgsProduct({{0, 1, 2}, {1, 32}})
    ->UseRealTime();

void BM_residual_site(benchmark::State& state) {
  const int64_t n = 5120, block = 1024, rows = state.range(1);
  auto x = randn(n * rows, 12), d = randn(n * rows, 13), gw = randn(n, 14), s = randn(n, 15);
  for (auto& v : s) v = v < 0 ? -1.0f : 1.0f;
  const Weight gain = Weight::f32_view(gw.data(), n);
  std::vector<float> xo(n * rows), nr(n * rows), r(n * rows);
  RefBackend ref;
  Backend& be = state.range(0) == 0 ? static_cast<Backend&>(ref) : backend(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    be.residual_norm_site(x.data(), d.data(), xo.data(), gain, s.data(), block, nr.data(), r.data(), rows, n,
                          1e-6f);
    benchmark::DoNotOptimize(r.data());
  }
  state.SetItemsProcessed(state.iterations() * n * rows);
}
BENCHMARK(BM_residual_site)
    ->ArgNames({"threads(0=ref)", "rows"})
    ->ArgsProduct({{0, 1, 2}, {1, 32}})
    ->UseRealTime();

// A 64-token prompt chunk through one 27B GDN layer: token walk vs chunked (WY) form.
void BM_gdn_prefill64(benchmark::State& state) {
  const bool chunked = state.range(0) != 0;
  const int t = 64;
  GdnShape s{16, 48, 128, 128, 1e-6f};
  const int64_t width = 2 * 16 * 128 + 48 * 128;
  auto conv = randn(t * width, 3), g = randn(t * 48, 4), beta = randn(t * 48, 5);
  for (auto& v : g) v = -std::fabs(v) * 0.1f;
  for (auto& v : beta) v = 0.5f;
  std::vector<float> st(48 * 128 * 128, 0.01f), out(t * 48 * 128);
  CpuBackend& be = backend(2);
  for (auto _ : state) {
    if (chunked)
      cpu::gdn_recurrence_chunked(conv.data(), g.data(), beta.data(), st.data(), out.data(), t, s, 64,
                                  be.pool());
    else
      be.gdn_recurrence(conv.data(), g.data(), beta.data(), st.data(), out.data(), t, s);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * t);  // tokens
}
BENCHMARK(BM_gdn_prefill64)->Arg(0)->Arg(1)->UseRealTime();

void BM_attention_decode(benchmark::State& state) {
  const int n_kv = static_cast<int>(state.range(0)), threads = static_cast<int>(state.range(1));
  AttentionShape s{24, 4, 256, 1.0f / 16.0f};
  auto kc = randn(static_cast<size_t>(n_kv) * 4 * 256, 6), vc = randn(static_cast<size_t>(n_kv) * 4 * 256, 7);
  auto q = randn(24 * 256, 8);
  std::vector<float> out(24 * 256);
  CpuBackend& be = backend(threads);
  for (auto _ : state) {
    be.attention(q.data(), kc.data(), vc.data(), out.data(), 1, n_kv - 1, s);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kc.size() + vc.size()) * 4);
}
BENCHMARK(BM_attention_decode)->ArgsProduct({{128, 1024, 4096}, {1, 2}})->UseRealTime();

}  // namespace
}  // namespace bonsai::bench
