#!/usr/bin/env bash
# CPU decode of the 27B on the 16-core host: Stream16 prefetch distance arms (branch cpu12).
set -uo pipefail
out=$1; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.deps/lib/x86_64-linux-gnu
b=.prebuilt-cpu12
m=/tmp/bonsai-27b.gguf
[ -f $m ] || $b/bonsai synth --preset 27b --no-vocab -q -o $m > /dev/null
tg() {  # tg LABEL THREADS ENV...
  local lab=$1 t=$2; shift 2
  env "$@" $b/bonsai bench -m $m --path fast -t $t -p 0 -n 16 -r 2 --no-bandwidth > $out/tg.txt 2>&1
  echo "$lab t$t: $(grep '| tg16 |' $out/tg.txt | awk -F'|' '{print $8}')"
}
for rep in 1 2; do
  tg default 16 X=1
  tg pf4=1024 16 BONSAI_CPU_STREAM_PF4=1024
  tg pf4=2048 16 BONSAI_CPU_STREAM_PF4=2048
  tg pf4=4096 16 BONSAI_CPU_STREAM_PF4=4096
  tg pf4=8192 16 BONSAI_CPU_STREAM_PF4=8192
  tg pf4=4096,pf8=16384 16 BONSAI_CPU_STREAM_PF4=4096 BONSAI_CPU_STREAM_PF8=16384
done
tg default 8 X=1
tg pf4=4096 8 BONSAI_CPU_STREAM_PF4=4096
