#!/usr/bin/env bash
# Sets up, builds and runs every test (CTest). GPU tests skip themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir "${SMLA_BUILD:-build}" --output-on-failure -j "$(nproc)"
