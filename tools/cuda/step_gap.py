#!/usr/bin/env python3
"""Where the time between two replayed decode steps goes, from tools/cuda/cupti_trace.cpp's CSV recorded
with BONSAI_TRACE_MEMCPY=1 (kernels and memory copies). A step starts at the graph's first node (its
smallest graph_node id: the step words' host-to-device copy). Per step, in order on the GPU timeline:
the graph's own span (first node start to last graph node end), then everything outside the graph
(the head's top-k kernels, the device-to-host copy of the candidates) and the idle time until the next
step's first node. Prints the means over the last STEPS complete steps.
Usage: step_gap.py TRACE.csv [STEPS]"""
import csv
import sys
from collections import defaultdict


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    want = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    ev = sorted((int(r["start_ns"]), int(r["end_ns"]), r["name"], int(r["graph_node"])) for r in rows)
    graph = [e for e in ev if e[3] != 0]
    if not graph:
        print("no graph nodes in the trace")
        return
    first = min(e[3] for e in graph)
    starts = [e[0] for e in ev if e[3] == first]
    if len(starts) < 3:
        print("too few steps:", len(starts))
        return
    starts = starts[-(want + 1):]
    acc = defaultdict(float)
    n = 0
    for a, b in zip(starts, starts[1:]):
        step = [e for e in ev if a <= e[0] < b]
        g = [e for e in step if e[3] != 0]
        out = [e for e in step if e[3] == 0]
        g_end = max(e[1] for e in g)
        first_node = min(g, key=lambda e: e[0])
        kernels = sorted((e for e in g if not e[2].startswith("memcpy")), key=lambda e: e[0])
        acc["period"] += b - a
        acc["graph span (first node start .. last graph node end)"] += g_end - a
        acc["  first node (step words copy) duration"] += first_node[1] - first_node[0]
        acc["  first node end .. first kernel start"] += kernels[0][0] - first_node[1] if kernels else 0
        pe = g_end
        for s, e, name, _ in sorted(out):
            key = name if name.startswith("memcpy") else name.split("(")[0][-40:]
            acc[f"  outside: idle before {key}"] += s - pe
            acc[f"  outside: {key} duration"] += e - s
            pe = max(pe, e)
        acc["  outside: idle until the next step's first node"] += b - pe
        acc["outside the graph in all"] += b - g_end
        n += 1
    print(f"{n} steps (means, us)")
    for k, v in acc.items():
        print(f"{v / n / 1e3:10.2f}  {k}")


if __name__ == "__main__":
    main()
