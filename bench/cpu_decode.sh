#!/bin/bash
# Reproduces the CPU decode figures of docs/performance.md (issue 5), each run
# under bench/watchdog.py (ACCEPT only when other processes used < 10 % CPU).
# Matvec modes: pq2_lanes (the AVX-512 default: block lanes on huge pages),
# pq2_stream (block stream: the same chunks, one sequential stream per row
# group), pq2_faithful (file layout, 4 KiB pages), pq2_faithful_thp (file
# layout, huge pages). CPU_DECODE_MAP=1 adds a whole-token run with
# BONSAI_CPU_WEIGHTS=map; CPU_DECODE_WEIGHTS="lanes stream" runs each whole
# token once per listed BONSAI_CPU_WEIGHTS value, alternating (default: the
# backend's default only); CPU_DECODE_PART=matvec or token runs only that
# half (~5 min each).
#
# Usage: bench/cpu_decode.sh BUILD_DIR OUT_DIR [PQ2_MODEL] [PTQ1_MODEL]
#   BUILD_DIR  a Release build (bin/bonsai, bench/bonsai_bench)
#   OUT_DIR    where logs and the benchmark JSON go (created)
#   models     default /work/models/27b-pq2.gguf, /work/models/27b-ptq1.gguf
#
# Page cache note: a model file that was just *written* (bonsai synth, cp)
# sits in the page cache in small folios and is mapped with 4 KiB pages; read
# back from disk it comes in 2 MiB folios and is mapped with huge pages, which
# streams ~15-40 % faster here (the log ends with the machine's FileHugePages,
# the page cache held in 2 MiB folios). To get the read-back state, drop the
# file's cache first while no process maps it:
#   python3 -c "import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)" FILE
set -u
B=$1
OUT=$2
PQ2=${3:-/work/models/27b-pq2.gguf}
PTQ1=${4:-/work/models/27b-ptq1.gguf}
HERE=$(cd "$(dirname "$0")" && pwd)
W="$HERE/watchdog.py"
mkdir -p "$OUT"
log="$OUT/cpu_decode.log"
echo "== $(date -u +%FT%TZ) $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null)" | tee -a "$log"

PART=${CPU_DECODE_PART:-all}  # matvec | token | all (each part fits one 10-minute quiet window)
if [ "$PART" != token ]; then
echo "== matvec ratios (bonsai_bench)" | tee -a "$log"
"$W" "$B/bench/bonsai_bench" \
  --benchmark_filter='read_bandwidth|BM_matvec/(pq2_lanes|pq2_stream|pq2_faithful|pq2_faithful_thp)/|BM_matvec_hot/(pq2_lanes|pq2_stream|pq2_faithful|ptq1_faithful|pq2_lanes_k17408|pq2_stream_k17408|pq2_faithful_k17408)$' \
  --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
  --benchmark_out="$OUT/matvec.json" --benchmark_out_format=json >/dev/null 2>>"$log"
tail -1 "$log"
python3 "$HERE/ratios.py" "$OUT/matvec.json" | tee -a "$log"
fi
[ "$PART" = matvec ] && exit 0

for m in "$PQ2" "$PTQ1"; do
  for wm in ${CPU_DECODE_WEIGHTS:-default}; do
    echo "== whole token: $m (BONSAI_CPU_WEIGHTS=$wm)" | tee -a "$log"
    if [ "$wm" = default ]; then
      "$W" "$B/bin/bonsai" bench -m "$m" -p 0 -n 16 -r 3 -t 2 --path fast 2>&1 | grep -v "^$" | tee -a "$log"
    else
      BONSAI_CPU_WEIGHTS=$wm "$W" "$B/bin/bonsai" bench -m "$m" -p 0 -n 16 -r 3 -t 2 --path fast 2>&1 |
        grep -v "^$" | tee -a "$log"
    fi
  done
done
if [ -n "${CPU_DECODE_MAP:-}" ]; then  # the zero-copy file layout, for comparison
  echo "== whole token, BONSAI_CPU_WEIGHTS=map: $PQ2" | tee -a "$log"
  BONSAI_CPU_WEIGHTS=map "$W" "$B/bin/bonsai" bench -m "$PQ2" -p 0 -n 16 -r 3 -t 2 --path fast 2>&1 | grep -v "^$" |
    tee -a "$log"
fi
echo "== per-op profile: $PQ2" | tee -a "$log"
"$W" "$B/bin/bonsai" bench -m "$PQ2" -p 0 -n 16 -r 2 -t 2 --path fast --profile 2>&1 | grep -v "^$" | tee -a "$log"
echo "== load time and resident memory" | tee -a "$log"
python3 "$HERE/load_time.py" "$B/bin/bonsai" "$PQ2" | tee -a "$log"
python3 "$HERE/load_time.py" "$B/bin/bonsai" "$PTQ1" | tee -a "$log"
echo "== page cache: FileHugePages $(awk '/FileHugePages/ {print $2, $3}' /proc/meminfo) (2 MiB folios machine-wide)" \
  | tee -a "$log"
