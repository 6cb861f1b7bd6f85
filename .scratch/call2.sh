#!/usr/bin/env bash
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T=build-gpu/tests/smla_gpu_tests
timeout 300 $T --gtest_filter='GpuDecode.*' > $OUT/tests.log 2>&1; echo "tests rc=$? $(grep -E 'PASSED|FAILED' $OUT/tests.log | tr '\n' ' ')"
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 $T --gtest_filter='GpuDecode.Fp8GraphReplayEqualsEagerBitwise:GpuDecode.UnsplitPlansAgainstOracleAndCpu' > $OUT/race.log 2>&1; echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|hazard' $OUT/race.log | head -3 | tr '\n' ' ')"
build-gpu/smla run --device cuda --kv fp8_e4m3 --requests 64 --mtp 2 --check 8 > $OUT/run.log 2>&1; echo "run rc=$? $(tail -2 $OUT/run.log | tr '\n' ' ')"
SMLA_AB_KV=fp8_e4m3 scripts/ab_bench.sh build-gpu/a build-gpu/b ${SHAPES:-64:128:2:512 128:128:2:1024 64:2:2:512 128:2:2:1024 32:128:2:512 32:2:2:512 64:8:2:512} 2>&1 | tee $OUT/ab.txt
SMLA_AB_KV="bf16 fp8_ds_mla" scripts/ab_bench.sh build-gpu/a build-gpu/b 64:2:2:512 2>&1 | tee -a $OUT/ab.txt
