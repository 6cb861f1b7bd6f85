#!/usr/bin/env bash
# Everything GPU-side in one call on the GPU machine: GPU tests, compute-sanitizer on small
# cases, the decode benchmark and the copy, wgmma and distributed shared-memory probes, the main
# job on CUDA, the step benchmark, the Python package and the host time of a call; a short table
# last. Full logs go to $OUT (or ./gpu-out), at most 8 files: build.log, tests.log (tests and
# sanitizers), bench.log (benchmark, probes and profile), bench.csv, run.log, step.log, step.csv,
# python.log (package tests, host time). Uses a carried build dir (default build-cuda): brings it
# up to date where it was configured for this tree, takes its binaries as they are where it was
# not (binaries carried from another machine), configures and builds it where it has neither.
# Exits 1 when any step failed.
#   scripts/gpu_check.sh [tests] [sanitize] [bench] [probe] [profile] [run] [step] [python]
#   (default: all but profile)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${SMLA_BUILD:-build-cuda}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SMLA_REQUIRE_GPU=1  # the GPU tests fail, not skip, where no device is visible
export SMLA_TEST_HEADROOM=1  # the tests end with how close each tolerance came (headroom.h)
steps=${*:-tests sanitize bench probe run step python}
known="tests sanitize bench probe profile run step python"
for step in $steps; do  # before the build and the first step, not after them
  [[ " $known " == *" $step "* ]] || { echo "unknown step '$step' ($known)"; exit 2; }
done
status=()
failed=0
declare -A begun  # logs written by this call: the first step to use one truncates it

binaries="smla smla_bench smla_step_bench smla_copy_probe smla_wgmma_probe smla_dsmem_probe
  tests/smla_gpu_tests"
missing=$(for b in $binaries; do [ -x "$BUILD/$b" ] || echo "$b"; done)
home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
if [ "$home" = "$PWD" ] || { [ -z "$home" ] && [ -n "$missing" ]; }; then
  echo "== building in $BUILD"
  { [ -n "$home" ] || cmake -S . -B "$BUILD" -G Ninja; } >"$OUT/build.log" 2>&1 &&
    cmake --build "$BUILD" -j 16 >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
elif [ -n "$missing" ]; then
  echo "$BUILD lacks" $missing "and was configured for ${home:-no tree}: cannot build it here"
  exit 1
else
  echo "== $BUILD's binaries as they are (configured for ${home:-no tree here}, not rebuilt)"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv

run_step() {  # name, log, command...   (steps may share a log: each appends its part; returns
  # the command's status)
  local name=$1 log=$2; shift 2
  echo "== $name"
  [ -n "${begun[$log]:-}" ] || : >"$OUT/$log"
  begun[$log]=1
  local start=$SECONDS from
  from=$(($(wc -l <"$OUT/$log") + 1))
  echo "== $name: $*" >>"$OUT/$log"
  "$@" >>"$OUT/$log" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || failed=1
  tail -n +"$from" "$OUT/$log" | tail -n 25
  status+=("$(printf '%-10s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - start)) "$log")")
  return "$rc"
}

for step in $steps; do
  case $step in
    tests) run_step tests tests.log timeout -s KILL 300 "$BUILD/tests/smla_gpu_tests" ;;
    sanitize)  # small bf16 and fp8 decodes (split and unsplit plans, the query by TMA and its
      # fallback), index builders, quantizer, a 3-layer forked step and the decodes reading
      # their top-k (handed over through shared memory)
      filter='GpuDecode.SmallCountersOrWorkspaceFallBack:GpuDecode.WideClusterSplits:GpuDecode.Fp8GraphReplayEqualsEagerBitwise:GpuDecode.UnsplitPlansAgainstOracleAndCpu:GpuDecode.ReversedBroadcastAndPaddedQueryViews:GpuIndex.*:GpuQuantize.*:Models/GpuExecutor.StepEqualsDirectCallsBitForBit/v41flash_layers40to42_3groups_fp8_e4m3:GpuTopkColumns.*-GpuIndex.ManyRequestsMatchTheCpu'  # gtest: positives, then -negatives
      # memcheck also on windows that are not a multiple of 4 (a row's K may not be one either),
      # tokens past the last request, strides of size-1 dims and two waves of unsplit CTAs
      # (prefetch_next_wave reads the next wave's table: ~6 s under memcheck), and padding
      # heads in every reduction
      more=GpuDecode.ANanQuantizedIntoADsMlaRowReachesItsTokens:GpuDecode.OddWindowsAgainstOracleAndCpu:GpuDecode.TokensPastTheLastRequestReadNothingPastTheViews:GpuDecode.SizeOneDimsTakeAnyStride:GpuDecode.LargeQueriesAgainstOracleAndCpu
      sanitize=(timeout -k 30 260 compute-sanitizer --error-exitcode 9)
      run_step memcheck tests.log "${sanitize[@]}" --tool memcheck \
        "$BUILD/tests/smla_gpu_tests" --gtest_filter=$more:$filter
      for tool in racecheck synccheck initcheck; do
        run_step $tool tests.log "${sanitize[@]}" --tool $tool \
          "$BUILD/tests/smla_gpu_tests" --gtest_filter=$filter
      done ;;
    bench)
      run_step bench bench.log timeout -s KILL 300 "$BUILD/smla_bench" --csv "$OUT/bench.csv"
      # the target shapes again, each also timed after a second of it: the clock a card holds at
      # its power limit, where the table's bursts may run boosted (docs/benchmarks.md)
      run_step sustained bench.log timeout -s KILL 200 "$BUILD/smla_bench" --sustained 1000 \
        --shape 64:128:2:512,128:128:2:1024,64:2:2:512,128:2:2:1024 ;;
    probe)
      run_step probe bench.log timeout -s KILL 120 "$BUILD/smla_copy_probe"
      run_step wgmma bench.log timeout -s KILL 120 "$BUILD/smla_wgmma_probe"
      run_step dsmem bench.log timeout -s KILL 120 "$BUILD/smla_dsmem_probe" ;;
    profile)  # Nsight Compute's warp samples per instruction, one launch a layout (default 128 x 2,
      # SMLA_PROFILE_SHAPE=HEADS:REQUESTS:TOKENS:TOPK), a sample every 32 cycles, its caches as
      # the 40 launches before left them, as in the benchmark (flushed, a 2 x 2 fp8_ds_mla launch
      # waited for instructions 2x as often)
      for kv in bf16 fp8_ds_mla fp8_e4m3; do
        run_step "ncu $kv" bench.log bash -c "ncu --clock-control none --cache-control none \
          -k regex:decode_kernel --launch-skip 40 --launch-count 1 --warp-sampling-interval 0 \
          --section SourceCounters --section WarpStateStats -o '$OUT/profile' -f \
          '$BUILD/smla_bench' --kv $kv --shape ${SMLA_PROFILE_SHAPE:-64:128:2:512} >/dev/null &&
          ncu -i '$OUT/profile.ncu-rep' --page source --csv --print-source sass >'$OUT/profile.csv' &&
          scripts/ncu_stalls.py '$OUT/profile.csv'; rc=\$?; rm -f '$OUT'/profile.*; exit \$rc"
      done ;;
    run)  # each under a time limit, so that a hang still leaves the summary
      smla=(timeout -s KILL 120 "$BUILD/smla")
      run_step info run.log "${smla[@]}" info
      run_step run run.log "${smla[@]}" run --device cuda --requests 64 --q-len 2 --seq-len 16384 \
        --check 4
      run_step run-v41 run.log "${smla[@]}" run --device cuda --model v41-flash --swa-groups 3 \
        --q-len 2 --check 4
      run_step run-fp8 run.log "${smla[@]}" run --device cuda --kv fp8_ds_mla --requests 64 \
        --q-len 2 --check 4
      run_step run-e4m3 run.log "${smla[@]}" run --device cuda --kv fp8_e4m3 --requests 64 \
        --q-len 2 --check 8
      # ratio-128 top-k of 2343 columns, past the decode's 2048: those layers read built tables
      run_step run-300k run.log "${smla[@]}" run --device cuda --requests 2 --seq-len 300000 \
        --check 4 ;;
    step)  # the whole step four ways: auto, top-k in the decode, shared tables, none; auto
      # again at a sustained clock
      run_step step step.log timeout -s KILL 420 "$BUILD/smla_step_bench" --sustained 1000 \
        --csv "$OUT/step.csv" ;;
    python)  # builds the package with CUDA here (wheels it lacks come from a carried .whl/),
      # then, where that passed, times an eager call's host side with the same interpreter
      run_step python python.log timeout -s KILL 500 env SMLA_PYTHON_CUDA=ON \
        CMAKE_BUILD_PARALLEL_LEVEL=16 scripts/python_test.sh &&
        run_step host-cost python.log timeout -s KILL 120 "$(cat build-python/interpreter)" \
          bench/python_host_cost.py ;;
  esac
done

echo "== summary"
printf '%s\n' "${status[@]}"
# the issues' target shapes: H=64/128 at 2 and 128 requests x 2 tokens, H=8/16/32 at 128 x 2
# (from this call's logs only: an earlier call's may still lie in $OUT)
[ -n "${begun[bench.log]:-}" ] && grep -E "^(ceilings|workspace|kv |sustained)|^(bf16|fp8)[a-z0-9_]* +((64|128) +(2|128)|(8|16|32) +128) +2 " "$OUT/bench.log"
[ -n "${begun[step.log]:-}" ] && grep -E "^(sust|model|v4|  graph WRONG)" "$OUT/step.log"
exit $failed
