#!/usr/bin/env bash
# Precise against approximate cache routing over many runs (docs/KV_EVENTS.md,
# "Over a sweep"): policy cost fed by the simulated engines' KV events
# (--kv-events) against cost on its own guess, on the runs where the guess
# drifts (the KV cache oversubscribed). One run's P99 is a handful of
# requests and moves by 10-20% under any change of order, so each trace is
# replayed at five speeds with three rotation starts (cost:rotation_start=N:
# the order in which equal estimates are met), and chat with six seeds.
# Prints one markdown row per run set: how many runs, the geometric means of
# precise / approximate for TTFT p50 and P99, the mean hit rates, and the
# runs where precise's P99 is worse.
#
#   scripts/kvsweep.sh            # 72 runs, ~4-6 minutes on 2 cores
#
# Environment: SPEEDS ("0.8 0.9 1 1.1 1.2"), SEEDS ("1 2 3 4 5 6"),
# REPLICAS (4).
set -euo pipefail
cd "$(dirname "$0")/.."

SPEEDS=${SPEEDS:-0.8 0.9 1 1.1 1.2}
SEEDS=${SEEDS:-1 2 3 4 5 6}
REPLICAS=${REPLICAS:-4}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
BIN=$TMP/llmlb
go build -o "$BIN" ./cmd/llmlb

# pair NAME ARGS...: appends one line per result of the run with and
# without events to $TMP/NAME: {mode, p50, p99, hit}.
pair() {
	local name=$1
	shift
	for mode in approximate precise; do
		local flag=()
		[ "$mode" = precise ] && flag=(--kv-events)
		"$BIN" bench --quiet --json --replicas "$REPLICAS" "$@" "${flag[@]}" |
			jq -c --arg mode "$mode" '.results[] | {mode: $mode, p50: .ttft_seconds.p50,
				p99: .ttft_seconds.p99, hit: .prefix_cache_hit_rate}' >>"$TMP/$name"
	done
}

rotations=cost:rotation_start=0,cost:rotation_start=1,cost:rotation_start=2
for t in mooncake_conversation_head mooncake_synthetic_trace; do
	for s in $SPEEDS; do
		pair "$t" --trace "traces/$t.jsonl" --trace-speed "$s" --policies "$rotations"
	done
done
for seed in $SEEDS; do
	pair chat --workload chat --seed "$seed" --policies cost
done

echo "replicas $REPLICAS; ratios precise / approximate, geometric means over the runs"
echo
echo "| runs | count | p50 | P99 | hit rate, approximate / precise | P99 worse with events |"
echo "|---|---:|---:|---:|---|---:|"
for name in mooncake_conversation_head mooncake_synthetic_trace chat; do
	jq -rs --arg name "$name" '
		def gmean(f): (map(f | log) | add / length | exp);
		(map(select(.mode == "approximate"))) as $a | (map(select(.mode == "precise"))) as $p |
		[range(0; $a | length) | {p50: ($p[.].p50 / $a[.].p50), p99: ($p[.].p99 / $a[.].p99)}] as $r |
		"| \($name) | \($r | length) | \($r | gmean(.p50) * 1000 | round / 1000) | \($r | gmean(.p99) * 1000 | round / 1000) | \($a | map(.hit) | add / length * 1000 | round / 10)% / \($p | map(.hit) | add / length * 1000 | round / 10)% | \($r | map(select(.p99 > 1)) | length) |"' "$TMP/$name"
done
