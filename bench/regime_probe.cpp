// bonsai_regime_probe: does a kernel see the host's fast read windows? In one
// process, cycle pass by pass (~1 GiB each, 15-40 ms) through (1) the
// 2-thread read loop over a 1 GiB huge-page buffer, (2) faithful Stream16
// matvecs, (3) faithful Lanes16 matvecs, (4) int8 Stream16 and (5) int8
// Lanes16 matvecs, each streaming
// ~1 GiB of distinct 5120 x 17408 weight copies (huge pages), and print the
// mean GB/s of each per ~1 s window, so that the host's fast read windows can
// be seen in the kernels too (this VM's read rate switches between ~34 and
// ~60 GB/s within seconds; docs/performance.md, CPU section).
//
// Usage: bonsai_regime_probe [SECONDS=40] [K=5120] [N=17408]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/matvec.h"
#include "kernels/cpu/repack.h"
#include "runtime/bandwidth.h"
#include "runtime/thread_pool.h"

using clk = std::chrono::steady_clock;
static double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

int main(int argc, char** argv) {
  using namespace bonsai;
  const double secs = argc > 1 ? atof(argv[1]) : 40;
  const int64_t k = argc > 2 ? atoll(argv[2]) : 5120, n = argc > 3 ? atoll(argv[3]) : 17408;
  ThreadPool pool(2);
  const size_t kRead = size_t{1} << 30;
  cpu::HugeBuffer rd(kRead);
  for (size_t i = 0; i < kRead; i += 8) {
    uint64_t v = i * 0x9E3779B97F4A7C15ull;
    memcpy(rd.data() + i, &v, 8);
  }
  const uint16_t d = f32_to_fp16(0.0123f);
  // Weight copies: lanes and stream of the same bytes count.
  const int64_t sb = cpu::stream_total_bytes(n, k), lb = (cpu::lanes_total_bytes(n, k) + 63) / 64 * 64;
  const int copies = static_cast<int>(kRead / sb);
  cpu::HugeBuffer ws(static_cast<size_t>(sb * copies)), wl(static_cast<size_t>(lb * copies));
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= ws.size(); i += 8) {
    uint64_t v = rng();
    memcpy(ws.data() + i, &v, 8);
  }
  for (size_t i = 0; i + 8 <= wl.size(); i += 8) {
    uint64_t v = rng();
    memcpy(wl.data() + i, &v, 8);
  }
  const int64_t rl = cpu::stream_group_rows(k), nb = k / 128, n_full = nb / 16, g = nb % 16;
  const int64_t gs = cpu::stream_group_stride(k), rgb = cpu::stream_rowgroup_bytes(k);
  for (int c = 0; c < copies; ++c) {
    for (int64_t r0 = 0; r0 < n; r0 += rl) {
      uint8_t* base = ws.data() + sb * c + r0 / rl * rgb;
      for (int64_t j = 0; j < n_full; ++j)
        for (int64_t e = 0; e < 16 * rl; ++e) memcpy(base + j * gs + 512 * rl + 2 * e, &d, 2);
      for (int64_t e = 0; e < g * rl; ++e)
        memcpy(base + n_full * gs + (g <= 8 ? 4 : 8) * 64 * rl + 2 * e, &d, 2);
    }
    uint8_t* sc = wl.data() + lb * c + cpu::lanes_scales_offset(n, k);
    for (int64_t b = 0; b < n * nb; ++b) memcpy(sc + 2 * b, &d, 2);
  }
  std::vector<float> x(k), y(n);
  std::mt19937 r2(1);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(r2);
  cpu::PreparedAct af, ai;
  cpu::prepare_act(x.data(), k, cpu::Precision::Faithful, af, cpu::layout_bit(cpu::ActLayout::Lanes16));
  cpu::prepare_act(x.data(), k, cpu::Precision::Int8, ai, cpu::layout_bit(cpu::ActLayout::Lanes16));
  uint64_t sink[8] = {};
  auto read_pass = [&] {
    pool.parallel_for(kRead / (2 << 20),
                      [&](int64_t t, int th) { sink[th] += sum_bytes(rd.data() + t * (2 << 20), 2 << 20); });
    return double(kRead);
  };
  auto stream_pass = [&](const cpu::PreparedAct& a) {
    for (int c = 0; c < copies; ++c)
      cpu::matvec(cpu::stream_view(DType::PQ2_0, ws.data() + sb * c, n, k), a, y.data(), pool, Isa::Avx512);
    return double(sb) * copies;
  };
  auto lanes_pass = [&](const cpu::PreparedAct& a) {
    for (int c = 0; c < copies; ++c)
      cpu::matvec(cpu::lanes_view(DType::PQ2_0, wl.data() + lb * c, n, k), a, y.data(), pool, Isa::Avx512);
    return double(lb) * copies;
  };
  const char* names[5] = {"read", "stream", "lanes", "stream_int8", "lanes_int8"};
  double bytes[5] = {}, tsec[5] = {};
  printf("k %lld n %lld, %d copies (%.2f GB per pass)\n", (long long)k, (long long)n, copies,
         sb * copies / 1e9);
  const auto T0 = clk::now();
  auto win = clk::now();
  while (since(T0) < secs) {
    for (int m = 0; m < 5; ++m) {
      const auto t = clk::now();
      const double b = m == 0   ? read_pass()
                       : m == 1 ? stream_pass(af)
                       : m == 2 ? lanes_pass(af)
                       : m == 3 ? stream_pass(ai)
                                : lanes_pass(ai);
      tsec[m] += since(t), bytes[m] += b;
    }
    if (since(win) > 1.0) {
      printf("%6.1f s", std::chrono::duration<double>(win - T0).count());
      for (int m = 0; m < 5; ++m)
        printf("  %s %5.1f", names[m], bytes[m] / tsec[m] / 1e9), bytes[m] = tsec[m] = 0;
      printf("\n");
      fflush(stdout);
      win = clk::now();
    }
  }
  return sink[0] == 42;
}
