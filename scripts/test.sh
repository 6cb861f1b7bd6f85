#!/usr/bin/env bash
# Sets up, builds and runs every test: the C++ tests (CTest; GPU tests skip themselves without
# a GPU), then the Python package's (scripts/python_test.sh: builds it and runs pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir "${SMLA_BUILD:-build}" --output-on-failure --no-tests=error -j "$(nproc)"
scripts/python_test.sh
