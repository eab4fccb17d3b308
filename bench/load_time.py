#!/usr/bin/env python3
"""Load time and resident memory of a model on the CPU backend.

Usage: bench/load_time.py BONSAI_BINARY MODEL [THREADS]

Runs `bonsai bench -m MODEL -p 0 -n 1 -r 1 -t THREADS --path fast --no-bandwidth`
and reports the seconds from process start to the first decode step (file
mapping + Backend::prepare, i.e. the load-time repacks of kernels/cpu/repack.h)
and, at that moment, the process's Rss, anonymous memory on huge pages
(AnonHugePages: the repacks) and file pages mapped with huge pages
(FilePmdMapped), from /proc/PID/smaps_rollup, and the peak Rss of the run
(which includes the mapped file pages the decode step touched).
BONSAI_CPU_WEIGHTS etc. are taken from the environment.
"""
import os
import subprocess
import sys
import time


def rollup(pid):
    out = {}
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    except FileNotFoundError:
        pass
    return out


def main():
    binary, model = sys.argv[1], sys.argv[2]
    threads = sys.argv[3] if len(sys.argv) > 3 else "2"
    cmd = [binary, "bench", "-m", model, "-p", "0", "-n", "1", "-r", "1", "-t", threads, "--path", "fast",
           "--no-bandwidth"]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    loaded = None
    mem = {}
    buf = ""
    while True:
        ch = p.stderr.read(1)
        if not ch:
            break
        buf += ch
        if loaded is None and buf.endswith("warm-up"):
            loaded = time.monotonic() - t0
            mem = rollup(p.pid)
    _, _, ru = os.wait4(p.pid, 0)
    mode = os.environ.get("BONSAI_CPU_WEIGHTS", "stream (default)")
    if loaded is None:
        sys.exit(f"no decode step seen; stderr:\n{buf}")
    gb = lambda k: mem.get(k, 0) / 1e9
    print(f"{os.path.basename(model)} BONSAI_CPU_WEIGHTS={mode}: load + prepare {loaded:.1f} s; "
          f"Rss {gb('Rss'):.2f} GB, AnonHugePages {gb('AnonHugePages'):.2f} GB, "
          f"FilePmdMapped {gb('FilePmdMapped'):.2f} GB at the first step; peak Rss {ru.ru_maxrss / 1e6:.2f} GB")


if __name__ == "__main__":
    main()
