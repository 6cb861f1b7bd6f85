#!/usr/bin/env bash
# Sets up (scripts/setup.sh), configures and builds into $SMLA_BUILD (default: build).
# CUDA kernels are built when nvcc is found (PATH or /usr/local/cuda/bin); tests always, whatever
# an earlier configure of that directory cached.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
build=${SMLA_BUILD:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSMLA_TESTS=ON >/dev/null
cmake --build "$build" -j "$(nproc)"
