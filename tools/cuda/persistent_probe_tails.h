// Session 15's section of tools/cuda/persistent_probe.cu (`--tails 1`; docs/performance.md, "Session 15:
// where the persistent kernel's per-matvec wait comes from"). Host code only; included by the probe after
// pk::Shape.
//
// Question: B (no site, no fix-up) streams a block's own units at about the copy rate and then waits
// 1.3-3.1 us per matvec for the slowest block (session 14). Is the slowest block slow because of its SM
// (a systematic per-SM rate: then ranges weighted per SM remove most of the wait) or by chance (then only
// a dynamic split can)? Every block stamps its arrival at each barrier and its SM; per run this prints, per
// shape, how far the last block trails the mean one, and per SM its mean lateness, whether the two halves
// of the reps agree on it (split-half correlation) and how much of the lateness's variance is per SM.
// Then ranges weighted per SM (Tails::cum) from the measured durations, refined three times.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace pk {

struct TailsCtx {
  const std::vector<Shape>& seq;
  int count, grid, reps;
  size_t blk_rep;  // longs per rep in TailsRun::blk
  double copy, wbytes;
};

struct TailsRun {
  double us = 0;
  std::vector<long long> st;   // block 0's stamps per rep ([3 * count + 1])
  std::vector<long long> blk;  // Tails::blk per rep
};

// Per SM (index = smid) mean duration of the big matvecs (>= 19 MB: barrier passed -> arrival); 0 = unseen.
inline std::vector<double> tails_analyse(const TailsCtx& c, const TailsRun& r, const char* label) {
  struct Shp {
    double max_mean = 0, max_min = 0, mean_dur = 0, max_dur = 0;
    int n = 0;
  };
  struct Sm {
    double late = 0, late2[2] = {0, 0}, dur = 0, sq = 0;
    int n = 0, n2[2] = {0, 0}, nd = 0;
  };
  std::map<std::string, Shp> by;
  std::vector<Sm> sm(256);
  double slot_late[2] = {0, 0}, tail_sum = 0, all_sq = 0;
  int slot_n[2] = {0, 0};
  long all_n = 0;
  for (int rep = 0; rep < c.reps; ++rep) {
    const long long* st = r.st.data() + static_cast<size_t>(rep) * (3 * c.count + 1);
    const long long* b = r.blk.data() + rep * c.blk_rep;
    const long long* where = b + static_cast<size_t>(c.count) * c.grid;
    for (int i = 0; i < c.count; ++i) {
      const long long* a = b + static_cast<size_t>(i) * c.grid;
      double mn = 1e300, mx = -1e300, mean = 0;
      for (int j = 0; j < c.grid; ++j) {
        mn = std::min(mn, static_cast<double>(a[j]));
        mx = std::max(mx, static_cast<double>(a[j]));
        mean += static_cast<double>(a[j]);
      }
      mean /= c.grid;
      const double t0 = static_cast<double>(st[3 * i]);
      Shp& p = by[c.seq[i].name];
      p.max_mean += (mx - mean) * 1e-3;
      p.max_min += (mx - mn) * 1e-3;
      p.mean_dur += (mean - t0) * 1e-3;
      p.max_dur += (mx - t0) * 1e-3;
      ++p.n;
      tail_sum += (mx - mean) * 1e-3;
      const bool big = static_cast<double>(c.seq[i].k) * c.seq[i].n >= 19e6 * 4.0;  // 2 bits per weight
      for (int j = 0; j < c.grid; ++j) {
        const int id = static_cast<int>(where[j] & 0xffff), slot = static_cast<int>(where[j] >> 16) & 1;
        if (id >= 256) continue;
        const double late = (static_cast<double>(a[j]) - mean) * 1e-3;
        Sm& q = sm[id];
        q.late += late;
        q.sq += late * late;
        ++q.n;
        q.late2[rep & 1] += late;
        ++q.n2[rep & 1];
        slot_late[slot] += late;
        ++slot_n[slot];
        all_sq += late * late;
        ++all_n;
        if (big) {
          q.dur += (static_cast<double>(a[j]) - t0) * 1e-3;
          ++q.nd;
        }
      }
    }
  }
  std::printf("B %-52s %8.1f us/step, %5.0f GB/s (%.0f %% of copy)\n", label, r.us,
              c.wbytes / (r.us * 1e-6) * 1e-9, 100.0 * c.wbytes / (r.us * 1e-6) / c.copy);
  std::printf("  per matvec (us): last block - mean block | last - first | mean block's duration | last's\n");
  for (auto& [name, p] : by)
    std::printf("    %-24s %6.2f | %6.2f | %6.2f | %6.2f\n", name.c_str(), p.max_mean / p.n, p.max_min / p.n,
                p.mean_dur / p.n, p.max_dur / p.n);
  std::printf("  sum over the step of (last - mean): %.0f us\n", tail_sum / c.reps);
  // Per SM: mean lateness, split-half agreement, share of the variance that is per SM.
  std::vector<int> ids;
  for (int id = 0; id < 256; ++id)
    if (sm[id].n > 0) ids.push_back(id);
  std::sort(ids.begin(), ids.end(),
            [&](int x, int y) { return sm[x].late / sm[x].n < sm[y].late / sm[y].n; });
  double ma = 0, mb = 0, sab = 0, saa = 0, sbb = 0, between = 0;
  int nh = 0;
  for (int id : ids) {
    const Sm& q = sm[id];
    between += (q.late / q.n) * (q.late / q.n) * q.n;
    if (q.n2[0] == 0 || q.n2[1] == 0) continue;
    ma += q.late2[0] / q.n2[0];
    mb += q.late2[1] / q.n2[1];
    ++nh;
  }
  if (nh > 0) {
    ma /= nh;
    mb /= nh;
    for (int id : ids) {
      const Sm& q = sm[id];
      if (q.n2[0] == 0 || q.n2[1] == 0) continue;
      const double x = q.late2[0] / q.n2[0] - ma, y = q.late2[1] / q.n2[1] - mb;
      sab += x * y;
      saa += x * x;
      sbb += y * y;
    }
  }
  std::printf(
      "  %zu SMs; lateness rms %.2f us, of its variance %.0f %% per SM; split-half (even / odd reps) "
      "correlation"
      " of the per-SM means %.2f; slot 0 / slot 1 mean %.3f / %.3f us\n",
      ids.size(), std::sqrt(all_sq / std::max<long>(1, all_n)), 100.0 * between / std::max(1e-30, all_sq),
      saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0, slot_late[0] / std::max(1, slot_n[0]),
      slot_late[1] / std::max(1, slot_n[1]));
  auto line = [&](const char* what, int from, int to) {
    std::printf("  %s:", what);
    for (int k = from; k < to; ++k)
      if (k >= 0 && k < static_cast<int>(ids.size()))
        std::printf(" sm%d %+.2f", ids[k], sm[ids[k]].late / sm[ids[k]].n);
    std::printf("\n");
  };
  line("earliest SMs (mean lateness, us)", 0, 6);
  line("latest SMs", static_cast<int>(ids.size()) - 6, static_cast<int>(ids.size()));
  std::vector<double> dur(256, 0.0);
  for (int id : ids)
    if (sm[id].nd > 0) dur[id] = sm[id].dur / sm[id].nd;
  return dur;
}

// Cumulative shares (cum[0] = 0 .. cum[max id + 1] = 1) from per-SM weights; unseen SMs get none.
inline std::vector<float> tails_cum(const std::vector<double>& w) {
  int last = 0;
  double tot = 0;
  for (int id = 0; id < static_cast<int>(w.size()); ++id)
    if (w[id] > 0) {
      last = id;
      tot += w[id];
    }
  std::vector<float> cum(last + 2, 0.0f);
  double acc = 0;
  for (int id = 0; id <= last; ++id) {
    acc += w[id];
    cum[id + 1] = static_cast<float>(acc / tot);
  }
  cum[last + 1] = 1.0f;
  return cum;
}

// run(flags, keep stamps, cum): one timed variant (DotV1, ring 4, one grid barrier per matvec).
template <class Run>
void tails_section(const TailsCtx& c, Run run, float* dcum) {
  auto upload = [&](const std::vector<float>& cum) {
    CK(cudaMemcpy(dcum, cum.data(), cum.size() * sizeof(float), cudaMemcpyHostToDevice));
  };
  std::printf("-- session 15: the per-matvec wait, block by block (DotV1)\n");
  const int nosite = kSkipSite | kNoFixup;
  std::vector<double> dur = tails_analyse(c, run(nosite, true, nullptr), "no site, no fix-up, plan's ranges");
  tails_analyse(c, run(kAtomicOut, true, nullptr), "quantize site, red.add outputs, plan's ranges");
  tails_analyse(c, run(0, true, nullptr), "quantize site, split fix-up (bitwise = A)");
  // Equal shares per SM (every warp busy): the control for the weighted ranges below.
  std::vector<double> w(256, 0.0);
  for (int id = 0; id < 256; ++id) w[id] = dur[id] > 0 ? 1.0 : 0.0;
  upload(tails_cum(w));
  tails_analyse(c, run(nosite, true, dcum), "no site, no fix-up, equal shares per SM");
  tails_analyse(c, run(kAtomicOut, true, dcum), "red.add, equal shares per SM");
  // Weighted: start from 1 / duration, then move each SM's share toward the mean duration.
  for (int id = 0; id < 256; ++id) w[id] = dur[id] > 0 ? 1.0 / dur[id] : 0.0;
  for (int it = 0; it < 4; ++it) {
    upload(tails_cum(w));
    char label[64];
    std::snprintf(label, sizeof label, "no site, no fix-up, weighted ranges (round %d)", it + 1);
    const std::vector<double> d = tails_analyse(c, run(nosite, true, dcum), label);
    double mean = 0;
    int n = 0;
    for (int id = 0; id < 256; ++id)
      if (d[id] > 0) {
        mean += d[id];
        ++n;
      }
    mean /= std::max(1, n);
    for (int id = 0; id < 256; ++id)
      if (d[id] > 0 && w[id] > 0) w[id] *= std::pow(mean / d[id], 0.7);
  }
  upload(tails_cum(w));
  tails_analyse(c, run(kAtomicOut, true, dcum), "red.add, weighted ranges (the last round's weights)");
  tails_analyse(c, run(nosite, true, nullptr), "no site, no fix-up, plan's ranges (again: drift)");
}

}  // namespace pk
