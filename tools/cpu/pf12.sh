#!/usr/bin/env bash
# The three device calls of docs/performance.md, "CPU decode on 16 cores (session 12)": the 27B's CPU
# decode on the 16-core host with the Stream16 prefetch knobs (BONSAI_CPU_STREAM_PF4 / _PF8) alternated.
#
#   bash tools/cpu/pf12.sh sweep|sweep2|check OUT_DIR [BIN_DIR=.prebuilt-cpu12]
#
# BIN_DIR holds a `bonsai` built here and carried (docs/building.md, "Offline build"; .deps/ next to it).
# sweep: PF4 0 / 1024 / 2048 / 4096 / 8192 and PF4 4096 + PF8 16384 at 16 threads, twice; 0 / 4096 at 8.
# sweep2: PF4 8192 / 16384 / 32768 twice, PF8 16384 / 32768, and 0 / 8192 at 4 and 2 threads; a profile.
# check: the new default (PF4 8192) against PF4 = 0 at 16 threads twice and at 8, with the read pass.
# sites: BIN_DIR/bonsai (the sites on the thread pool) against BIN_DIR/bonsai_main (the binary before),
#   pp64 and tg32 at 16 threads, alternated three times, then the new binary's per-op profile.
# (The sweeps ran with a binary whose defaults were PF4 = 0, PF8 = 8192: their "default" arm is PF4 = 0.)
set -uo pipefail
mode=${1:?sweep|sweep2|check|sites}
out=${2:?OUT_DIR}
b=${3:-.prebuilt-cpu12}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.deps/lib/x86_64-linux-gnu
m=/tmp/bonsai-27b.gguf
[ -f $m ] || $b/bonsai synth --preset 27b --no-vocab -q -o $m > /dev/null
tg() {  # tg LABEL THREADS TOKENS BANDWIDTH(0|1) ENV...
  local lab=$1 t=$2 n=$3 bw=$4
  shift 4
  env "$@" $b/bonsai bench -m $m --path fast -t "$t" -p 0 -n "$n" -r 2 $([ "$bw" = 1 ] || echo --no-bandwidth) \
    > "$out/tg.txt" 2>&1
  echo "$lab t$t: $(grep "| tg$n |" "$out/tg.txt" | awk -F'|' '{print $8, $9, $10}')" \
    "$(grep -o 'measured in this run): [0-9.]* GB/s' "$out/tg.txt" | head -1)"
}
case $mode in
  sweep)
    for rep in 1 2; do
      tg default 16 16 0 BONSAI_CPU_STREAM_PF4=0
      for v in 1024 2048 4096 8192; do tg pf4=$v 16 16 0 BONSAI_CPU_STREAM_PF4=$v; done
      tg pf4=4096,pf8=16384 16 16 0 BONSAI_CPU_STREAM_PF4=4096 BONSAI_CPU_STREAM_PF8=16384
    done
    tg default 8 16 0 BONSAI_CPU_STREAM_PF4=0
    tg pf4=4096 8 16 0 BONSAI_CPU_STREAM_PF4=4096
    ;;
  sweep2)
    for rep in 1 2; do
      for v in 8192 16384 32768; do tg pf4=$v 16 16 0 BONSAI_CPU_STREAM_PF4=$v; done
    done
    tg default 16 16 0 BONSAI_CPU_STREAM_PF4=0
    for v in 16384 32768; do tg pf4=8192,pf8=$v 16 16 0 BONSAI_CPU_STREAM_PF4=8192 BONSAI_CPU_STREAM_PF8=$v; done
    tg default 4 8 0 BONSAI_CPU_STREAM_PF4=0
    tg pf4=8192 4 8 0 BONSAI_CPU_STREAM_PF4=8192
    tg default 2 4 0 BONSAI_CPU_STREAM_PF4=0
    tg pf4=8192 2 4 0 BONSAI_CPU_STREAM_PF4=8192
    BONSAI_CPU_STREAM_PF4=8192 $b/bonsai bench -m $m --path fast -t 16 -p 0 -n 16 -r 1 --profile > "$out/prof.txt" 2>&1
    grep -E "read bandwidth \(|\| tg16|^\| (matmul|swiglu|residual|gdn|total)" "$out/prof.txt"
    ;;
  check)
    for rep in 1 2; do
      tg new 16 32 1 BONSAI_CPU_STREAM_PF4=8192
      tg old 16 32 1 BONSAI_CPU_STREAM_PF4=0
    done
    tg new 8 32 1 BONSAI_CPU_STREAM_PF4=8192
    tg old 8 32 1 BONSAI_CPU_STREAM_PF4=0
    ;;
  sites)
    for rep in 1 2 3; do
      for bin in bonsai_main bonsai; do
        $b/$bin bench -m $m --path fast -t 16 -p 64 -n 32 -r 2 --no-bandwidth > "$out/b.txt" 2>&1
        echo "$bin: $(grep -E '\| (pp64|tg32) \|' "$out/b.txt" | awk -F'|' '{printf "%s %s  ", $7, $8}')"
      done
    done
    $b/bonsai bench -m $m --path fast -t 16 -p 0 -n 16 -r 1 --no-bandwidth --profile > "$out/prof.txt" 2>&1
    grep -E "\| tg16|^\| (swiglu|residual|hadamard|gdn|gated|total)" "$out/prof.txt"
    ;;
  *)
    echo "pf12.sh: unknown mode '$mode' (sweep, sweep2, check, sites)" >&2
    exit 2
    ;;
esac
