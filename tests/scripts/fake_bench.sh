#!/bin/sh
# Stands in for smla_bench in scripts/ab_bench.sh's test: writes the CSV of one shape's row, its
# kv column naming the layout as smla_bench does (fp8_e4m3 for --kv fp8), a sustained time with
# --sustained and none without.
sustained=
while [ $# -gt 0 ]; do
  case $1 in
    --kv) kv=$2; shift ;;
    --csv) csv=$2; shift ;;
    --sustained) sustained=58.70; shift ;;
  esac
  shift
done
[ "$kv" = fp8 ] && kv=fp8_e4m3
printf 'kv,heads,requests,tokens_per_request,topk,splits,ctas,us,alone_us,sustained_us\n%s,64,128,2,512,1,132,54.30,57.00,%s\n' \
  "$kv" "$sustained" >"$csv"
