#!/usr/bin/env bash
# CPU decode of the 27B on the 16-core host: the new default (PF4 = 8192) against session 11's (PF4 = 0), branch cpu12.
set -uo pipefail
out=$1; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.deps/lib/x86_64-linux-gnu
b=.prebuilt-cpu12
m=/tmp/bonsai-27b.gguf
lscpu | grep -E "Model name|^CPU\(s\)" 
[ -f $m ] || $b/bonsai synth --preset 27b --no-vocab -q -o $m > /dev/null
tg() {  # tg LABEL THREADS ENV...
  local lab=$1 t=$2; shift 2
  env "$@" $b/bonsai bench -m $m --path fast -t $t -p 0 -n 32 -r 2 > $out/tg.txt 2>&1
  echo "$lab t$t: $(grep '| tg32 |' $out/tg.txt | awk -F'|' '{print $8, $9, $10}') (read pass $(grep -o 'measured in this run): [0-9.]* GB/s' $out/tg.txt | head -1))"
}
for rep in 1 2; do
  tg new 16 X=1
  tg old 16 BONSAI_CPU_STREAM_PF4=0
done
tg new 8 X=1
tg old 8 BONSAI_CPU_STREAM_PF4=0
