#!/usr/bin/env bash
# Compiles the decode kernel with ptxas' report and fails when ptxas serialized its wgmma
# instructions (any "wgmma.mma_async instructions are serialized" info: C7512, C7514, C7515,
# C7520, ...) or spilled registers (both silently cost 1.5-2x of its speed), or gave it a stack
# frame (local memory in the loops).
#   scripts/check_ptxas.sh [nvcc]
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${1:-nvcc}
# A failed compile prints what nvcc said; the greps read a here-string (a pipe into grep -q could
# end in SIGPIPE on a long report, and pipefail would read a match as none).
report=$("$nvcc" -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc --expt-relaxed-constexpr \
  -Xptxas -v -c src/cuda/decode_launch.cu -o /dev/null 2>&1) ||
  { printf '%s\n' "$report"; echo "FAIL: $nvcc could not compile the kernel"; exit 1; }
grep -E "registers|spill|stack|serialized" <<<"$report" || true
if grep -q "instructions are serialized" <<<"$report"; then
  echo "FAIL: wgmma serialized"; exit 1
fi
if grep -qE "[1-9][0-9]* bytes spill" <<<"$report"; then echo "FAIL: register spills"; exit 1; fi
if grep -qE "[1-9][0-9]* bytes stack frame" <<<"$report"; then echo "FAIL: stack frame"; exit 1; fi
echo "ok: no wgmma serialization, no spills, no stack frame"
