#!/usr/bin/env bash
# One-command set-up for a fresh Debian 12 machine (see README.md).
#   tools/setup.sh demo   install deps, build (release), write the embedded default
#                         tiny model and run a one-shot completion on it
#   tools/setup.sh test   install deps, build (ci preset: warnings as errors), run ctest
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-demo}

PKGS=(build-essential cmake ninja-build pkg-config git libcli11-dev libfmt-dev libspdlog-dev nlohmann-json3-dev
      libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev libedit-dev)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

jobs=$(nproc)
case "$mode" in
  demo)
    cmake --preset release >/dev/null
    cmake --build --preset release -j "$jobs"
    model=build/release/tiny-demo.gguf
    ./build/release/bin/bonsai synth --preset tiny --seed 1 -o "$model"
    ./build/release/bin/bonsai run -m "$model" -p "Hello, bonsai" -n 32 --seed 1
    ;;
  test)
    cmake --preset ci >/dev/null
    cmake --build --preset ci -j "$jobs"
    ctest --preset ci -j "$jobs"
    ;;
  *) echo "usage: tools/setup.sh demo|test" >&2; exit 2 ;;
esac
