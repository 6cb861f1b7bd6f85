#!/usr/bin/env bash
# A/B timing of two smla_bench binaries on the same GPU, each shape and layout run A, B, B, A
# (a drift then weighs on both alike); prints the kernel microseconds of each run and B / A of
# the sums. A run that fails prints FAIL and leaves its ratio out; the script then exits 1.
#   scripts/ab_bench.sh BENCH_A BENCH_B [HEADS:REQUESTS:TOKENS:TOPK ...]
#   (default shapes: the issues' targets, H=64 128+512 and H=128 128+1024 at 128 x 2, 2 x 2)
#   SMLA_AB_KV="bf16 fp8_ds_mla fp8_e4m3" picks the layouts; SMLA_AB_SUSTAINED=MS compares the
#   sustained times (smla_bench --sustained MS), where the power limit makes a burst's noisy.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BENCH_A BENCH_B [SHAPE ...]"; exit 2; }
a=$1 b=$2; shift 2
for bench in "$a" "$b"; do
  command -v "$bench" >/dev/null || { echo "$0: $bench is not an executable"; exit 2; }
done
failed=0
shapes=${*:-64:128:2:512 128:128:2:1024 64:2:2:512 128:2:2:1024}
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
column=us extra=()
[ -n "${SMLA_AB_SUSTAINED:-}" ] && column=sustained_us extra=(--sustained "$SMLA_AB_SUSTAINED")
us() {  # the time column of the bench's one result row, to two decimals (from its CSV)
  # Row 2 whatever its kv column says: the bench names fp8 (its alias) fp8_e4m3 there.
  "$1" --kv "$2" --shape "$3" --rotate all ${extra[@]+"${extra[@]}"} --csv "$csv" >/dev/null &&
    awk -F, -v name="$column" 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == name) c = i }
      NR == 2 && c { print $c }' "$csv"
}
printf '%-10s %-16s %8s %8s %8s %8s %7s\n' kv shape A1 B1 B2 A2 'B/A'
for kv in ${SMLA_AB_KV:-bf16 fp8_ds_mla fp8_e4m3}; do
  for s in $shapes; do
    a1=$(us "$a" "$kv" "$s"); b1=$(us "$b" "$kv" "$s")
    b2=$(us "$b" "$kv" "$s"); a2=$(us "$a" "$kv" "$s")
    ratio=-
    if [ -n "$a1" ] && [ -n "$b1" ] && [ -n "$b2" ] && [ -n "$a2" ]; then
      ratio=$(awk -v a1="$a1" -v a2="$a2" -v b1="$b1" -v b2="$b2" \
        'BEGIN { printf "%.3f", (b1 + b2) / (a1 + a2) }')
    else
      failed=1
    fi
    printf '%-10s %-16s %8s %8s %8s %8s %7s\n' "$kv" "$s" "${a1:-FAIL}" "${b1:-FAIL}" \
      "${b2:-FAIL}" "${a2:-FAIL}" "$ratio"
  done
done
exit $failed
