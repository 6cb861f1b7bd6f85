#!/usr/bin/env bash
# Sets up, builds and runs the main job: one model-shaped decode step (`smla run`).
# Flags are passed to `smla run`, e.g. scripts/run.sh --model v41-flash --swa-groups 3 --q-len 2
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec "${SMLA_BUILD:-build}/smla" run "$@"
