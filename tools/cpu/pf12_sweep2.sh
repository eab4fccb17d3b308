#!/usr/bin/env bash
# CPU decode of the 27B on the 16-core host, round 2: longer leads, the 8-row lead, few threads, profile.
set -uo pipefail
out=$1; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.deps/lib/x86_64-linux-gnu
b=.prebuilt-cpu12
m=/tmp/bonsai-27b.gguf
[ -f $m ] || $b/bonsai synth --preset 27b --no-vocab -q -o $m > /dev/null
tg() {  # tg LABEL THREADS TOKENS ENV...
  local lab=$1 t=$2 n=$3; shift 3
  env "$@" $b/bonsai bench -m $m --path fast -t $t -p 0 -n $n -r 2 --no-bandwidth > $out/tg.txt 2>&1
  echo "$lab t$t: $(grep "| tg$n |" $out/tg.txt | awk -F'|' '{print $8}')"
}
for rep in 1 2; do
  tg pf4=8192 16 16 BONSAI_CPU_STREAM_PF4=8192
  tg pf4=16384 16 16 BONSAI_CPU_STREAM_PF4=16384
  tg pf4=32768 16 16 BONSAI_CPU_STREAM_PF4=32768
done
tg default 16 16 X=1
tg pf4=8192,pf8=16384 16 16 BONSAI_CPU_STREAM_PF4=8192 BONSAI_CPU_STREAM_PF8=16384
tg pf4=8192,pf8=32768 16 16 BONSAI_CPU_STREAM_PF4=8192 BONSAI_CPU_STREAM_PF8=32768
tg default 4 8 X=1
tg pf4=8192 4 8 BONSAI_CPU_STREAM_PF4=8192
tg default 2 4 X=1
tg pf4=8192 2 4 BONSAI_CPU_STREAM_PF4=8192
BONSAI_CPU_STREAM_PF4=8192 $b/bonsai bench -m $m --path fast -t 16 -p 0 -n 16 -r 1 --profile > $out/prof.txt 2>&1
grep -E "read bandwidth \(|\| tg16|^\| (matmul|swiglu|residual|gdn|total)" $out/prof.txt
