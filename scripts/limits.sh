#!/usr/bin/env bash
# Learned engine limits (BENCHMARKS.md "Learned engine limits"): policy cost
# told the engines' true sizes (--engine-sizes known: routing.cost.max_num_seqs
# and batch_tokens set to the profile's) against cost with every
# routing.cost.* engine size at its default (--engine-sizes default), on
# simulated fleets of 4, 16, 64 and 256 running slots per replica, with serial
# and parallel prefill. The arrival rate scales with the slots
# (--speed min(1, slots/32)) so that every fleet is loaded, not swamped.
# Prints one markdown row per fleet: TTFT p50 and p99 of both, their ratio
# (default / known; the bar is 1.05), and the median TTFT prediction error
# of cost with defaults (idle: no prefill pending ahead at the decision).
#
#   scripts/limits.sh                       # agentic, seeds 1 and 2 (~1 minute on 2 cores)
#   SEEDS="1 2 3" WORKLOAD=chat scripts/limits.sh
#
# Environment: WORKLOAD (agentic), SEEDS ("1 2"), SLOTS ("4 16 64 256"),
# PARALLEL (16: prefills sharing a step in the parallel model), ARGS (more
# llmlb bench flags).
set -euo pipefail
cd "$(dirname "$0")/.."

WORKLOAD=${WORKLOAD:-agentic}
SEEDS=${SEEDS:-1 2}
SLOTS=${SLOTS:-4 16 64 256}
PARALLEL=${PARALLEL:-16}
ARGS=${ARGS:-}
BIN=$(mktemp -d)/llmlb
trap 'rm -rf "$(dirname "$BIN")"' EXIT
go build -o "$BIN" ./cmd/llmlb

# run SLOTS PARTIAL SIZES SEED: one cost run's JSON result.
run() {
	local speed
	speed=$(awk -v s="$1" 'BEGIN { v = s / 32; if (v > 1) v = 1; print v }')
	# shellcheck disable=SC2086
	"$BIN" bench --quiet --json --workload "$WORKLOAD" --policies cost --seed "$4" \
		--max-num-seqs "$1" --partial-prefills "$2" --engine-sizes "$3" --speed "$speed" $ARGS |
		jq -c '.results[0] | {p50: .ttft_seconds.p50, p99: .ttft_seconds.p99,
			idle: .ttft_prediction.idle_error_median, loaded: .ttft_prediction.loaded_error_median}'
}

echo "workload $WORKLOAD, seeds $SEEDS; TTFT in seconds, means over the seeds"
echo
echo "| slots | prefill | known p50 | known p99 | default p50 | default p99 | p50 ratio | p99 ratio | error idle (known, default) | error loaded (known, default) |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for slots in $SLOTS; do
	for partial in 1 "$PARALLEL"; do
		model=serial
		[ "$partial" -gt 1 ] && model="parallel ($partial)"
		known=() defaults=()
		for seed in $SEEDS; do
			known+=("$(run "$slots" "$partial" known "$seed")")
			defaults+=("$(run "$slots" "$partial" default "$seed")")
		done
		printf '%s\n' "${known[@]}" >"$(dirname "$BIN")/k"
		printf '%s\n' "${defaults[@]}" >"$(dirname "$BIN")/d"
		jq -rn --arg slots "$slots" --arg model "$model" \
			--slurpfile k "$(dirname "$BIN")/k" --slurpfile d "$(dirname "$BIN")/d" '
			def mean(f): (map(f) | add / length);
			($k | mean(.p50)) as $kp50 | ($k | mean(.p99)) as $kp99 |
			($d | mean(.p50)) as $dp50 | ($d | mean(.p99)) as $dp99 |
			"| \($slots) | \($model) | \($kp50 * 1000 | round / 1000) | \($kp99 * 100 | round / 100) | \($dp50 * 1000 | round / 1000) | \($dp99 * 100 | round / 100) | \($dp50 / $kp50 * 100 | round / 100) | \($dp99 / $kp99 * 100 | round / 100) | \($k | mean(.idle) * 100 | round)%, \($d | mean(.idle) * 100 | round)% | \($k | mean(.loaded) * 100 | round)%, \($d | mean(.loaded) * 100 | round)% |"'
	done
done
