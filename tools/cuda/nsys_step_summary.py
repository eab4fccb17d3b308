#!/usr/bin/env python3
"""Reduce `nsys stats --report cuda_gpu_trace --format csv` of replayed decode steps to one table:
per kernel name, launches per step, summed duration per step and summed *exposed* time per step
(the part of its interval during which no other kernel / copy runs), averaged over steady-state
steps. A step starts at an `embed` kernel. Usage: nsys_step_summary.py TRACE.csv [STEPS]"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    n = name.replace("(anonymous namespace)::", "")
    if n.startswith("void "):
        n = n[5:]
    n = n.split("(")[0] if not n.startswith("[") else n
    base = n.split("<")[0]
    return base.split("::")[-1] if not n.startswith("[") else n


def main():
    path = sys.argv[1]
    want = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    lines = open(path, newline="").read().splitlines()
    hdr = next(i for i, l in enumerate(lines) if "Start" in l and "Name" in l)
    rows = list(csv.reader(lines[hdr:]))
    cols = rows[0]
    ci = lambda key: next(i for i, c in enumerate(cols) if c.startswith(key))
    s_i, d_i, n_i = ci("Start"), ci("Duration"), ci("Name")
    ev = []
    for r in rows[1:]:
        if len(r) <= n_i or not r[s_i].strip():
            continue
        s = float(r[s_i]); d = float(r[d_i])
        ev.append((s, s + d, short(r[n_i])))
    ev.sort()
    starts = [s for s, e, n in ev if n.startswith("embed")]
    if len(starts) < 4:
        print("too few steps found:", len(starts)); return
    # steady state: the last `want` complete steps, leaving out the last one of the run
    lo = max(1, len(starts) - 2 - want)
    steps = [(starts[i], starts[i + 1]) for i in range(lo, len(starts) - 2)]
    dur = defaultdict(float); exp = defaultdict(float); cnt = defaultdict(int)
    idle = overlap = total = 0.0
    for a, b in steps:
        total += b - a
        iv = [(max(s, a), min(e, b), n) for s, e, n in ev if e > a and s < b]
        for s, e, n in iv:
            if s >= a and s < b:
                cnt[n] += 1
            dur[n] += e - s
        pts = []
        for k, (s, e, n) in enumerate(iv):
            pts.append((s, 1, k)); pts.append((e, -1, k))
        pts.sort(key=lambda p: (p[0], p[1]))
        active = set(); t = a
        for x, kind, k in pts:
            if x > t:
                if not active:
                    idle += x - t
                elif len(active) == 1:
                    exp[iv[next(iter(active))][2]] += x - t
                else:
                    overlap += x - t
                t = x
            if kind == 1:
                active.add(k)
            else:
                active.discard(k)
        if b > t:
            idle += b - t
    ns = len(steps)
    print(f"{ns} steps, {total / ns / 1e3:.1f} us per step (from embed to embed)")
    print("| kernel | launches/step | summed duration us/step | exposed us/step | exposed share of step |")
    print("|---|---:|---:|---:|---:|")
    for n in sorted(dur, key=lambda n: -exp[n]):
        print(f"| {n} | {cnt[n] / ns:.1f} | {dur[n] / ns / 1e3:.1f} | {exp[n] / ns / 1e3:.1f} | "
              f"{100 * exp[n] / total:.1f} % |")
    print(f"| (two or more at once) | | | {overlap / ns / 1e3:.1f} | {100 * overlap / total:.1f} % |")
    print(f"| (nothing on the GPU) | | | {idle / ns / 1e3:.1f} | {100 * idle / total:.1f} % |")


if __name__ == "__main__":
    main()
