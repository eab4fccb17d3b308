#!/usr/bin/env python3
"""Per-step decode timeline from tools/cuda/cupti_trace.cpp's CSV (start_ns,end_ns,grid,block,stream,
graph_node,name). A step starts at the graph's first node (the smallest graph_node id) so only kernels
replayed from a graph count. Prints, over the last STEPS complete steps: per kernel kind, launches per
step, the mean in-graph duration (start = first block resident, PDL preamble included), and the mean
advance of the chain it causes (its end minus the previous kernel's end: these sum to the step time),
then one step's kernels in order. Usage: trace_summary.py TRACE.csv [STEPS] [--list]"""
import csv
import shutil
import subprocess
import sys
from collections import defaultdict


def demangle(names):
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def short(full, grid):
    n = full.replace("(anonymous namespace)::", "").replace("bonsai::cuda::", "")
    if n.startswith("void "):
        n = n[5:]
    n = n.split("(")[0]
    return n[:60] + f" [{grid}]"


def main():
    path = sys.argv[1]
    want = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 8
    rows = list(csv.DictReader(open(path)))
    names = sorted({r["name"] for r in rows})
    dm = demangle(names)
    ev = [(int(r["start_ns"]), int(r["end_ns"]), short(dm[r["name"]], r["grid"]), int(r["graph_node"]))
          for r in rows if int(r["graph_node"]) != 0]
    ev.sort()
    if not ev:
        print("no graph kernels in the trace"); return
    first = min(g for _, _, _, g in ev)
    starts = [i for i, e in enumerate(ev) if e[3] == first]
    if len(starts) < 3:
        print("too few steps:", len(starts)); return
    lo = max(0, len(starts) - 2 - want)
    steps = [(starts[i], starts[i + 1]) for i in range(lo, len(starts) - 1)]
    cnt = defaultdict(int); dur = defaultdict(float); adv = defaultdict(float); gap = defaultdict(float)
    total = 0.0
    for a, b in steps:
        prev_end = ev[a - 1][1] if a > 0 else ev[a][0]
        total += ev[b - 1][1] - prev_end
        pe = prev_end
        for s, e, n, _ in ev[a:b]:
            cnt[n] += 1; dur[n] += e - s; adv[n] += e - pe; gap[n] += s - pe
            pe = max(pe, e)
    ns = len(steps)
    print(f"{ns} steps, {total / ns / 1e3:.1f} us per step (end of the previous step's last kernel to this one's)")
    print("| kernel [grid] | per step | mean duration us | mean start - previous end us | chain advance us/step | share |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in sorted(adv, key=lambda n: -adv[n]):
        c = cnt[n]
        print(f"| {n} | {c / ns:.0f} | {dur[n] / c / 1e3:.2f} | {gap[n] / c / 1e3:.2f} | {adv[n] / ns / 1e3:.1f} | "
              f"{100 * adv[n] / total:.1f} % |")
    if "--list" in sys.argv:
        a, b = steps[-1]
        t0 = ev[a][0]; pe = ev[a - 1][1] if a > 0 else t0
        print("\none step: start offset, duration, start - previous end, advance (us)")
        for s, e, n, _ in ev[a:b]:
            print(f"{(s - t0) / 1e3:9.2f} {(e - s) / 1e3:8.2f} {(s - pe) / 1e3:7.2f} {(e - pe) / 1e3:7.2f}  {n}")
            pe = max(pe, e)


if __name__ == "__main__":
    main()
