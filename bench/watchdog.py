#!/usr/bin/env python3
"""Run a benchmark command and report how much CPU *other* processes used meanwhile.

Usage: bench/watchdog.py [--max-others PCT] CMD ARGS...

The development machine is shared; a figure is only trusted when the others
stayed below PCT % (default 10) of the machine during the whole run. Others'
CPU = machine busy time (/proc/stat) minus this command's own threads
(/proc/PID/task/*/stat), sampled every second. Prints one line to stderr,
"[watchdog] others' CPU: mean M %, max X % ... ACCEPT|REJECT", and exits with
the command's status.
"""
import os
import subprocess
import sys
import time


def machine_busy():
    v = list(map(int, open("/proc/stat").readline().split()[1:9]))
    return sum(v) - v[3] - v[4], sum(v)  # busy jiffies (incl. niced), total


def own_jiffies(pid, seen):
    # Per-thread utime + stime; threads that exited keep their last value.
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                f = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                seen[tid] = int(f[11]) + int(f[12])
            except (FileNotFoundError, ProcessLookupError):
                pass
    except FileNotFoundError:
        pass
    return sum(seen.values())


def main():
    args = sys.argv[1:]
    limit = 10.0
    if args[:1] == ["--max-others"]:
        limit, args = float(args[1]), args[2:]
    seen = {}
    b0, t0 = machine_busy()
    p = subprocess.Popen(args)
    o0 = 0
    samples = []
    while p.poll() is None:
        time.sleep(1)
        o1 = own_jiffies(p.pid, seen)
        b1, t1 = machine_busy()
        if t1 > t0:
            samples.append(max(0.0, (b1 - b0) - (o1 - o0)) / (t1 - t0) * 100)
        b0, t0, o0 = b1, t1, o1
    rc = p.wait()
    mean = sum(samples) / len(samples) if samples else 0.0
    peak = max(samples) if samples else 0.0
    verdict = "ACCEPT" if mean < limit else "REJECT"
    print(f"[watchdog] others' CPU: mean {mean:.1f} %, max {peak:.1f} % of the machine over {len(samples)} s; "
          f"{verdict} (limit {limit:g} %)", file=sys.stderr)
    sys.exit(rc)


if __name__ == "__main__":
    main()
