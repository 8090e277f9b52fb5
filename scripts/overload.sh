#!/usr/bin/env bash
# Overload sweeps of flow control (BENCHMARKS.md, "Overload and flow
# control"): each run is `llmlb bench --json` written to $OUT/NAME.json (an
# existing file is kept, so an interrupted sweep resumes), then
# scripts/overload summarizes them as the section's tables.
#
#   scripts/overload.sh traces     # 24 trace runs, every policy and cost+fc (~10 min on 2 cores)
#   scripts/overload.sh flood      # the flood workload and its polite tenants alone
#   scripts/overload.sh priority   # a priority mix at 1x and 2x
#   scripts/overload.sh workloads  # 30 workload runs, every policy and cost+fc (~15 min)
#   scripts/overload.sh all        # the four; then the tables
#   scripts/overload.sh tables     # the tables of what $OUT holds
#
# Trace runs: TRACE on 4 and 8 replicas at 1x, 1.5x, 2x and 3x (--speed).
# 1x is the trace's load per 4 replicas: --trace-speed REPLICAS/4 for the
# Mooncake traces (conv: the conversation trace's first 1,546 requests; mc:
# the synthetic trace), 2xREPLICAS for Azure code (az), whose own rate keeps
# 4 replicas about 5% busy. Every run has every policy and cost+fc (cost
# behind flow control with the learned limits); a second, cheap run of each
# has cost+fc alone with the limit configured to the engine's max_num_seqs
# (--max-running 64, NAME-mr64.json).
#
# Workload runs (wl-WORKLOAD-NxS): the bundled workloads on 4 and 8 replicas
# at 1.5x, 2x and 3x (--speed S: a workload's default rate already scales
# with --replicas).
#
# ROTATIONS=N (default 1) also runs cost and cost+fc at rotation_start 1 to
# N-1 in the trace and workload runs (not the max_running 64 ones): one run is one order in which equal
# estimates are met, and a saturated replay moves by 10-20% with it. The
# tables then add the criteria counted on the medians over the N starts.
#
# REQUESTS=1 also writes each run's request log beside it (NAME.csv, about
# 1 MB per 1,000 requests and policy): `go run ./scripts/pairedci
# $OUT/NAME.csv` then says which of cost+fc's differences that run shows
# and which are ties (docs/BENCH.md).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/llmlb-overload}
mkdir -p "$OUT"
go build -o "$OUT/llmlb" ./cmd/llmlb
B="$OUT/llmlb"
ALL=rr,least-request,sticky,prefix-tree,llm-d,llmlb,llmlb-warm,cost,cost+fc
ROTATIONS=${ROTATIONS:-1}
ROT=""   # ,cost:rotation_start=1,cost+fc:rotation_start=1,...
for ((k = 1; k < ROTATIONS; k++)); do
  ROT+=",cost:rotation_start=$k,cost+fc:rotation_start=$k"
done

runs=()   # NAME|ARGS
traces() {
  for n in 4 8; do
    for s in 1 1.5 2 3; do
      for t in conv mc az; do
        case $t in
          conv) f=traces/mooncake_conversation_head.jsonl; ts=$(echo "$n/4" | bc -l) ;;
          mc) f=traces/mooncake_synthetic_trace.jsonl; ts=$(echo "$n/4" | bc -l) ;;
          az) f=traces/azure_llm_inference_2023_code.csv; ts=$((2 * n)) ;;
        esac
        args="--trace $f --trace-speed $ts --replicas $n --speed $s"
        runs+=("$t-${n}x$s|$args --policies $ALL$ROT")
        runs+=("$t-${n}x$s-mr64|$args --policies cost+fc --max-running 64")
      done
    done
  done
}
flood() {
  for n in 4 8; do
    runs+=("flood-$n|--workload flood --replicas $n --duration 10m --policies rr,least-request,prefix-tree,cost,cost+fc")
    runs+=("flood-$n-mr63h0|--workload flood --replicas $n --duration 10m --policies cost+fc --max-running 63 --headroom 0")
    runs+=("polite-$n|--workload flood-polite --replicas $n --duration 10m --policies rr,least-request,prefix-tree,cost,cost+fc")
  done
}
workloads() {
  for w in chat agentic mixed oneshot longshort; do
    for n in 4 8; do
      for s in 1.5 2 3; do
        runs+=("wl-$w-${n}x$s|--workload $w --replicas $n --speed $s --policies $ALL$ROT")
      done
    done
  done
}
priority() {
  for n in 4 8; do
    for s in 1 2; do
      runs+=("prio-oneshot-${n}x$s|--workload oneshot --replicas $n --duration 10m --speed $s --priority-mix 0.2,0.2 --policies cost,cost+fc")
      runs+=("prio-oneshot-${n}x$s-mr63h0|--workload oneshot --replicas $n --duration 10m --speed $s --priority-mix 0.2,0.2 --policies cost+fc --max-running 63 --headroom 0")
      ts=$(echo "$n/4" | bc -l)
      # One run's P99 is the 3rd-slowest of ~300 high-class requests: three
      # rotation starts at two seeds.
      for seed in 1 2; do
        runs+=("prio-conv-${n}x$s-seed$seed|--trace traces/mooncake_conversation_head.jsonl --trace-speed $ts --replicas $n --speed $s --seed $seed --priority-mix 0.2,0.2 --policies cost,cost+fc,cost:rotation_start=1,cost+fc:rotation_start=1,cost:rotation_start=2,cost+fc:rotation_start=2")
      done
    done
  done
}
case ${1:-all} in
  traces) traces ;;
  flood) flood ;;
  priority) priority ;;
  workloads) workloads ;;
  all) traces; flood; priority; workloads ;;
  tables) ;;
  *) echo "usage: $0 traces|flood|priority|workloads|all|tables" >&2; exit 2 ;;
esac

i=0
for r in "${runs[@]}"; do
  i=$((i + 1))
  name=${r%%|*}; args=${r#*|}
  if [ -s "$OUT/$name.json" ]; then continue; fi
  start=$(date +%s)
  req=()
  if [ "${REQUESTS:-0}" = 1 ]; then req=(--requests "$OUT/$name.csv"); fi
  # shellcheck disable=SC2086
  "$B" bench --quiet --json "${req[@]}" $args > "$OUT/$name.json.tmp"
  mv "$OUT/$name.json.tmp" "$OUT/$name.json"
  echo "[$i/${#runs[@]}] $name: $(( $(date +%s) - start )) s" >&2
done
go run ./scripts/overload "$OUT"
