#!/usr/bin/env bash
# Timing probes: A = main, P1..P4; each shape run A P1..P4 then P4..P1 A; prints us and ratios.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bins=(build-gpu/a build-gpu/p1 build-gpu/p2 build-gpu/p3 build-gpu/p4)
csv=$(mktemp)
us() { "$1" --kv "$2" --shape "$3" --csv "$csv" >/dev/null 2>&1 && awk -F, -v kv="$2" '$1 == kv { print $8 }' "$csv"; }
printf '%-10s %-16s %s\n' kv shape "A P1 P2 P3 P4 (sums of two runs, us; then ratios to A)"
for spec in ${SPECS:-fp8_e4m3/64:128:2:512 fp8_e4m3/128:128:2:1024 fp8_e4m3/64:2:2:512 bf16/64:128:2:512 bf16/128:128:2:1024}; do
  kv=${spec%%/*} s=${spec#*/}
  declare -A t=()
  for i in 0 1 2 3 4; do t[$i]=$(us "${bins[$i]}" "$kv" "$s"); done
  for i in 4 3 2 1 0; do t[$i]="${t[$i]} $(us "${bins[$i]}" "$kv" "$s")"; done
  line=""; ratios=""
  a=$(echo ${t[0]} | awk '{print $1+$2}')
  for i in 0 1 2 3 4; do
    v=$(echo ${t[$i]} | awk '{print $1+$2}')
    line="$line ${t[$i]// //} |"
    ratios="$ratios $(awk -v v="$v" -v a="$a" 'BEGIN{printf "%.3f", v/a}')"
  done
  printf '%-10s %-16s %s ratios:%s\n' "$kv" "$s" "$line" "$ratios"
done
