#!/usr/bin/env python3
"""Turn a bonsai_bench JSON report into the tables of docs/performance.md.

Usage: bonsai_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
           --benchmark_out=bench.json --benchmark_out_format=json
       python3 bench/ratios.py bench.json

Yardstick (issue 5, lead's decision of session 3): the LARGER of the
read_bandwidth (4 KiB pages) and read_bandwidth_thp (2 MiB pages) medians,
2 threads, of the same run. Every matvec figure is stated against it, and
also against the 4 KiB loop (the yardstick of earlier runs). The projected
decode time per token sums, over the 27B's weight inventory, weight bytes /
measured GB/s for each shape.

Modes: pq2_lanes is what the AVX-512 decode streams by default (PQ2_0, Q2_0
g128 and transcoded PTQ1_0 re-laid into block lanes on huge pages at load);
pq2_stream the same chunks as one sequential stream per row group
(BONSAI_CPU_WEIGHTS=stream, kernels/cpu/matvec.h "block-stream");
pq2_faithful is the file layout on 4 KiB pages (BONSAI_CPU_WEIGHTS=map of a
file in small page-cache folios); pq2_faithful_thp the file layout on huge
pages (BONSAI_CPU_WEIGHTS=copy, or map of a huge-mapped file).
"""
import json
import re
import sys

# Bonsai 2 27B linear layers per token: (K, N, count). 48 GDN + 16 attention layers.
GDN, ATT = 48, 16
INVENTORY = [
    (5120, 10240, GDN),  # attn_qkv
    (5120, 6144, GDN),  # attn_gate (z)
    (6144, 5120, GDN + ATT),  # ssm_out / attn_output
    (5120, 12288, ATT),  # attn_q (query | gate)
    (5120, 1024, 2 * ATT),  # attn_k, attn_v
    (5120, 17408, 2 * (GDN + ATT)),  # ffn_gate, ffn_up
    (17408, 5120, GDN + ATT),  # ffn_down
    (5120, 248320, 1),  # output (head)
]
BYTES_PER_WEIGHT = {"pq2": 34 / 128, "ptq1": 28 / 128}


def main(path):
    data = json.load(open(path))
    med = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") == "median":
            med[b["run_name"]] = b
    reads = {name: b["bytes_per_second"] for name, b in med.items() if re.match(r"read_bandwidth(_\w+)?/threads:2", name)}
    bw4k = reads.get("read_bandwidth/threads:2/real_time")
    if not bw4k:
        sys.exit("no read_bandwidth/threads:2 median in the report")
    bw_thp = reads.get("read_bandwidth_thp/threads:2/real_time")
    bw = max(bw4k, bw_thp or 0)
    for name, v in sorted(reads.items()):
        print(f"{name}: {v / 1e9:.2f} GB/s")
    ctx = data.get("context", {})
    print(f"run: {ctx.get('date', '?')}, load average {ctx.get('load_avg', '?')}")
    print(f"yardstick: larger read_bandwidth median = {bw / 1e9:.2f} GB/s; 4 KiB loop {bw4k / 1e9:.2f} GB/s\n")

    rows = {}
    for name, b in med.items():
        m = re.match(r"BM_matvec/(\w+)/K:(\d+)/N:(\d+)/threads:(\d+)", name)
        if not m:
            continue
        mode, k, n, t = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
        rows.setdefault(mode, {})[(k, n, t)] = b["bytes_per_second"]
    modes = sorted(rows)
    shapes = sorted({s for mode in rows.values() for s in mode})
    print("| K × N (threads) | " + " | ".join(modes) + " |")
    print("|---" * (len(modes) + 1) + "|")
    for s in shapes:
        cells = []
        for mode in modes:
            v = rows[mode].get(s)
            cells.append(f"{v / bw:.2f} / {v / bw4k:.2f} ({v / 1e9:.1f})" if v else "")
        print(f"| {s[0]} × {s[1]} ({s[2]}) | " + " | ".join(cells) + " |")
    print("\ncells: fraction of the yardstick / of the 4 KiB loop (GB/s)\n")
    for mode in modes:
        vals = [rows[mode][s] for s in shapes if s in rows[mode] and s[2] == 2]
        if vals:
            lo = min(vals)
            print(f"{mode}: worst 27B shape {lo / bw:.2f} of the yardstick ({lo / bw4k:.2f} of the 4 KiB loop); "
                  f"criterion >= 0.80 at every shape: {'met' if lo / bw >= 0.80 else 'NOT met'}")
    print()

    for mode in modes:
        fmt = "ptq1" if mode.startswith("ptq1") else "pq2"
        total_bytes = total_s = 0.0
        ok = True
        for k, n, count in INVENTORY:
            v = rows[mode].get((k, n, 2))
            if not v:
                ok = False
                break
            nbytes = k * n * BYTES_PER_WEIGHT[fmt] * count
            total_bytes += nbytes
            total_s += nbytes / v
        if ok:
            print(f"{mode}: ternary weights {total_bytes / 1e9:.2f} GB/token, matvec time "
                  f"{total_s * 1e3:.0f} ms/token = {total_s / (total_bytes / bw):.2f} × (bytes ÷ yardstick); "
                  f"{total_s / (total_bytes / bw4k):.2f} × against the 4 KiB loop")

    # PTQ1_0 files are transcoded to PQ2_0 at load (kernels/cpu/repack.h) and,
    # on AVX-512, re-laid into block lanes: their token time is pq2_lanes's
    # (pq2_faithful_thp's with BONSAI_CPU_WEIGHTS=map/copy), but the bound is
    # PTQ1_0's bytes.
    for mode in ("pq2_lanes", "pq2_stream", "pq2_faithful_thp"):
        if mode in rows and all((k, n, 2) in rows[mode] for k, n, _ in INVENTORY):
            t = sum(k * n * BYTES_PER_WEIGHT["pq2"] * c / rows[mode][(k, n, 2)] for k, n, c in INVENTORY)
            ptq1_bytes = sum(k * n * BYTES_PER_WEIGHT["ptq1"] * c for k, n, c in INVENTORY)
            print(f"ptq1 transcoded ({mode}): matvec time {t * 1e3:.0f} ms/token = "
                  f"{t / (ptq1_bytes / bw):.2f} × (PTQ1_0 bytes ÷ yardstick); {t / (ptq1_bytes / bw4k):.2f} × "
                  "against the 4 KiB loop")

    hot = {name.split("/")[1]: b for name, b in med.items() if name.startswith("BM_matvec_hot/")}
    if hot:
        print("\ncompute ceiling, one core, L2-resident 5120×128 (CPU time); per-core share of the yardstick "
              f"= {bw / 2e9:.1f} GB/s (4 KiB loop {bw4k / 2e9:.1f})")
        for mode, b in sorted(hot.items()):
            v = b["bytes_per_second"]
            print(f"  {mode}: {v / 1e9:.1f} GB/s = {v / (bw / 2):.2f} × share ({v / (bw4k / 2):.2f} × 4 KiB share)")


if __name__ == "__main__":
    main(sys.argv[1])
