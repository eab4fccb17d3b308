#!/usr/bin/env bash
# The CUDA backend's checks and measurements on a GPU machine, in one go
# (docs/performance.md, "CUDA"; docs/building.md, "Offline build").
#
#   tools/cuda_check.sh BIN_DIR FIXTURES_DIR OUT_DIR [steps...]
#
# BIN_DIR holds `bonsai` and `bonsai_tests`; every step writes OUT_DIR/<step>.txt
# and prints its last lines. Steps (default: info tests gate matvec):
#   info     device, driver, OS, compilers
#   tests    the CUDA unit tests (bonsai_tests --gtest_filter='Cuda*')
#   gate     bonsai gate on the fixtures with --path cuda, token walk and --prefill
#   matvec   matvec bandwidth at the 27B shapes vs the D2D copy rate (CudaBench)
#   27b      synthesize the full-size 27B (PQ2_0, no vocabulary) into $BONSAI_27B
#            (default /tmp/bonsai-27b.gguf) unless it exists, then
#            bonsai bench --path cuda -p 512 -n 128 -r 3, and a profiled decode
set -uo pipefail
bin=$1
fixtures=$2
out=$3
shift 3
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(info tests gate matvec)
mkdir -p "$out"
model=${BONSAI_27B:-/tmp/bonsai-27b.gguf}

run() {  # run STEP CMD... : output to $out/STEP.txt, tail on stdout
  local step=$1
  shift
  local t0=$SECONDS
  "$@" >>"$out/$step.txt" 2>&1
  local rc=$?
  echo "== $step: exit $rc, $((SECONDS - t0)) s"
  tail -n "${TAIL:-25}" "$out/$step.txt"
}

for step in "${steps[@]}"; do
  case $step in
    info)
      run info bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv;
        head -2 /etc/os-release; g++ --version | head -1; nvcc --version | tail -2; cmake --version | head -1; nproc' ;;
    tests) run tests "$bin/bonsai_tests" --gtest_filter='Cuda*' ;;
    gate)
      run gate "$bin/bonsai" gate "$fixtures/manifest.json" --path cuda
      run gate "$bin/bonsai" gate "$fixtures/manifest.json" --path cuda --prefill ;;
    matvec) BONSAI_CUDA_BENCH=1 run matvec "$bin/bonsai_tests" --gtest_filter='CudaBench*' ;;
    27b)
      [ -f "$model" ] || run synth "$bin/bonsai" synth --preset 27b --no-vocab -q -o "$model"
      run bench27b "$bin/bonsai" bench -m "$model" --path cuda -p 512 -n 128 -r 3 --no-bandwidth
      run profile27b "$bin/bonsai" bench -m "$model" --path cuda -p 0 -n 16 -r 1 --no-bandwidth --profile ;;
    *) echo "unknown step $step" >&2 ;;
  esac
done
