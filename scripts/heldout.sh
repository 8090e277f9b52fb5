#!/usr/bin/env bash
# The benchmark bar on the run sets of docs/benchmarks/LAB-2026.md ("Does `cost`
# meet the benchmark bar?"): each run is `llmlb bench --json` with every policy
# side by side, written to $OUT/NAME.json (an existing file is kept, so an
# interrupted set resumes), then scripts/barcheck judges $POLICY against the
# others and counts the runs that meet the rule.
#
#   scripts/heldout.sh held1            # 14 trace runs, a few minutes on 2 cores
#   scripts/heldout.sh held3            # 40 trace runs
#   scripts/heldout.sh held4            # 36 trace runs, drawn after the others were used
#   scripts/heldout.sh held5            # 30 trace runs, drawn 2026-12-02 before any variant ran on them
#   scripts/heldout.sh held6            # 30 more, drawn the same day; only the defaults ran on them
#   scripts/heldout.sh held7            # 30 more, drawn 2026-12-02, before the bounded-load exemption was judged and before any run on them
#   scripts/heldout.sh held8            # 30 more, drawn 2026-12-02, before any run on them
#   scripts/heldout.sh held9            # 30 more, drawn 2026-12-02, after the refused-prompt change, before any run on them
#   scripts/heldout.sh held10           # 30 more, drawn 2026-12-04, after the hot-prefix change, before any run on them
#   scripts/heldout.sh held11           # 30 more, drawn 2026-12-04, before any run on them
#   scripts/heldout.sh sess             # held11's 21 Mooncake and conversation runs with session keys
#   scripts/heldout.sh sess2            # 24 more runs with session keys, drawn 2026-12-04 after the marginal-reuse change
#   scripts/heldout.sh bar              # the bar's 12 runs (longshort at 32 replicas: ~5 GB, slow)
#   scripts/heldout.sh slow             # 18 runs with one replica of four twice as slow (--slow replica-4:2)
#   scripts/heldout.sh traces           # every trace run of the sets below (179; about 70 minutes)
#   POLICY=prefix-tree EXCLUDE=cost scripts/heldout.sh traces   # a baseline judged by the same rule against the other baselines
#   POLICIES=rr,least-request,cost:tie_steps=2 POLICY=cost:tie_steps=2 scripts/heldout.sh gen
#   VARIANT=cost:eviction_weight=100 scripts/heldout.sh held4   # one variant, cheaply
#
# Sets: bar (the twelve runs of the bar's table), gen (fifteen fleet sizes and
# speeds the bar does not name), held1, held2, held3, held4 (held-out runs:
# traces at REPLICASxSPEED; held4 was drawn at random, seed 20261202, 2-32
# replicas log-uniform, 0.1-0.4x speed per replica, 1.5x that for Azure,
# before any variant ran on it; held5 the same way with seed 20261203, before the
# changes it was kept to judge; held6 with seed
# 20261204, runs already in another set redrawn, judged with the defaults
# only), held7 (seed 20261205, drawn the same way before the bounded-load
# exemption was judged; runs already in another set redrawn), held8 (seed
# 20261206, the same way, on 2026-12-02, before any run on them),
# held9 (seed 20261207, the same way, after the refused-prompt
# change and before any run on them), held10 (seed 20261208, the same way,
# after the hot-prefix change had run on the other sets and
# before any run on them), held11 (seed 20261209, the same way, on
# 2026-12-04, before any run on them), sess (held11's Mooncake and
# conversation runs on those traces rewritten with session keys by
# scripts/mooncake2bailian into $OUT), sess2 (24 runs with session keys,
# seed 20261210, drawn after the marginal-reuse change had run on sess and
# before any run on them), traces (gen and held1-6), all (bar, traces,
# held7-11, sess, sess2). A trace run NAME is [s]TRACE REPLICAS x SPEED
# with TRACE mc (traces/mooncake_synthetic_trace.jsonl), conv
# (mooncake_conversation_head) or az (azure_llm_inference_2023_code.csv); a
# leading s replays the trace with session keys.
#
# Environment: OUT (work directory, default /tmp/llmlb-heldout), POLICIES (the
# policies run; default: rr, least-request, sticky, both prefix-tree
# parameterizations, llm-d, llmlb and cost, plus llmlb-warm for the bar set), POLICY
# (the one judged, default cost), EXCLUDE (policies not counted as others,
# comma-separated; default none), SEED (default 1; trace replays do not
# depend on it), VARIANT (a policy spec, e.g. cost:eviction_weight=100: each
# run keeps or makes its full JSON, runs the variant alone beside it, and
# judges the variant against the full run's policies other than cost; each
# policy runs on its own engines, so the other rows do not depend on which
# policies ran with them), JOBS (runs at once, default 1: each run is
# single-threaded with one policy, so JOBS=2 halves a VARIANT set's time on
# 2 cores; a full run already simulates its policies on every core, so JOBS
# gains nothing there).
set -euo pipefail
cd "$(dirname "$0")/.."

set_name=${1:-}
OUT=${OUT:-/tmp/llmlb-heldout}
POLICY=${POLICY:-cost}
SEED=${SEED:-1}
JOBS=${JOBS:-1}
BASE=rr,least-request,sticky,prefix-tree,prefix-tree:cache_threshold=0.5,balance_abs=32,balance_rel=1.0001,llm-d,llmlb

GEN="
  mc2x0.5 mc8x2 mc16x4 mc32x4 mc4x1.5 mc4x2 mc4x3 az8x3 az2x2 conv4x0.5 conv8x1
  conv16x1 conv8x2 conv16x0.5 conv32x2"
HELD1="
  mc3x0.7 mc4x0.8 mc5x1.3 mc6x1.1 mc7x0.6 mc10x2.5 mc12x1.7 conv3x0.7 conv5x1
  conv6x1.3 conv10x0.8 conv12x1.5 az3x1.5 az6x4"
HELD2="
  mc3x1.2 mc5x0.6 mc8x1.4 mc9x0.9 mc14x2.2 mc20x3 conv4x1.2 conv7x0.9 conv9x1.6
  conv14x1.1 conv20x2.5 conv2x0.4 az5x2 az10x5"
HELD3="
  mc24x9.38 mc5x0.89 mc24x9.13 mc4x0.85 mc20x5.0 mc11x3.38 conv16x2.18 az11x7.34
  conv11x2.44 conv8x2.42 az11x7.56 az7x4.64 mc14x4.56 conv20x2.8 conv2x0.38
  conv4x0.67 mc4x1.06 conv12x3.67 conv20x2.79 az4x3.52 conv12x2.26 conv20x3.02
  az11x4.23 conv24x4.85 mc5x1.06 az20x7.04 az7x4.55 conv3x0.52 conv11x1.38 mc6x1.61
  conv5x1.54 conv5x0.78 mc11x1.99 conv24x2.52 mc8x2.64 az3x2.62 conv14x2.44
  conv20x4.52 conv14x4.15 az24x10.16"

HELD4="
  mc5x1.6 mc8x2.11 mc7x0.78 mc3x0.37 mc5x1.5 mc6x1.4 conv7x1.51 conv10x1.41
  conv5x0.92 conv27x6.17 mc2x0.71 mc7x1.5 conv4x0.71 mc7x0.7 mc5x1.53 conv24x7.67
  mc2x0.39 conv2x0.76 conv10x1.74 conv5x1.71 az7x2.48 conv22x4.93 mc11x4.02
  conv8x1.08 mc4x0.64 mc2x0.46 mc4x1.35 mc7x1.36 mc23x2.35 conv11x3.51
  mc30x10.58 mc12x2.66 conv2x0.44 conv22x6.23 conv12x2.81 mc16x6.06"

HELD5="
  mc2x0.30 conv5x1.32 conv3x0.38 az7x2.44 mc16x3.07 az4x1.39 mc12x1.33 az7x4.18
  mc25x6.82 mc5x1.69 conv4x0.80 conv6x0.82 conv3x0.97 mc10x3.68 conv15x4.96
  conv11x1.24 az19x3.04 conv3x0.89 mc10x2.48 mc4x0.87 az26x15.19 conv32x5.19
  mc2x0.28 conv15x2.44 mc4x1.27 mc3x0.82 mc5x0.83 conv11x3.96 conv14x3.52 conv8x1.23"

HELD6="
  conv2x0.25 mc3x0.78 az4x0.92 conv23x4.86 mc24x9.39 mc24x9.15 az2x0.75 conv3x0.81
  conv18x4.50 az14x2.59 mc27x10.46 conv10x1.56 mc11x4.33 mc3x0.92 mc2x0.35
  conv12x3.41 mc26x2.61 mc19x2.93 az5x1.17 mc2x0.55 conv24x9.59 az26x5.50 mc7x2.50
  az12x4.94 mc2x0.69 mc6x1.04 mc2x0.27 conv5x0.93 az2x0.87 az6x2.86"

HELD7="
  mc15x4.30 mc12x2.62 az3x1.16 az12x2.21 az28x7.48 az2x0.69 conv5x0.84 mc2x0.31
  conv16x4.13 az3x1.34 az6x1.15 az16x8.45 az11x4.68 az7x1.27 conv8x0.94 mc3x0.98
  mc22x6.09 mc3x0.85 conv20x3.34 mc13x4.79 az7x1.36 az12x2.65 conv6x1.72 mc13x2.39
  conv4x0.44 az28x13.97 mc11x2.81 mc15x3.38 conv14x4.48 mc7x2.27"

HELD8="
  az20x11.94 conv12x2.34 conv6x1.04 conv12x2.31 conv8x1.57 az12x5.72 az18x9.47 az5x1.21
  mc2x0.36 conv13x2.68 mc8x0.86 az4x0.93 az4x1.53 az16x3.81 conv14x5.54 az13x2.37
  conv2x0.69 mc24x7.38 mc7x1.33 conv7x2.24 mc20x2.91 mc2x0.68 mc3x0.59 conv3x0.40
  mc27x10.25 mc13x4.84 mc10x1.03 conv11x4.25 mc6x2.07 az5x1.00"

HELD9="
  mc18x6.83 mc3x0.60 conv3x0.37 az19x11.19 mc9x3.27 mc2x0.32 conv3x0.48 conv22x6.44
  conv12x2.96 conv3x1.03 az30x12.89 az4x0.70 az3x1.52 mc10x1.30 mc5x1.50 az2x0.97
  az21x12.06 conv12x1.78 mc22x7.80 az14x7.05 az12x2.77 conv8x1.72 az3x1.70 mc10x2.75
  mc10x3.71 conv19x6.31 mc18x6.27 az2x1.17 conv18x2.49 conv3x0.34"

HELD10="
  az3x0.49 az5x1.01 conv4x1.02 az22x9.79 conv10x2.31 az27x8.81 mc15x1.91 az2x1.00
  az14x3.08 mc2x0.40 az3x0.70 mc27x7.96 conv5x1.96 mc6x1.94 mc11x3.49 conv4x1.41
  mc16x3.59 mc6x2.06 mc3x0.73 conv3x0.71 az8x2.84 conv10x1.87 mc8x2.38 az19x8.65
  mc28x4.66 mc20x4.31 mc2x0.37 conv3x0.69 mc3x0.43 conv8x1.91"

HELD11="
  conv17x5.29 conv30x7.88 conv13x1.40 mc21x3.31 mc4x0.70 conv25x8.01 conv14x1.58
  az10x3.47 conv6x2.26 conv19x2.76 az10x2.00 mc24x5.12 mc8x2.21 mc9x2.27 conv10x1.25
  az6x3.40 mc25x3.76 az8x3.47 az3x0.71 conv3x0.87 mc5x1.02 conv3x0.95 az9x2.16
  az28x9.99 az9x2.68 conv2x0.35 az22x5.67 mc7x1.12 conv2x0.43 mc2x0.33"

# The Mooncake and conversation runs of held11 with session keys (the
# traces rewritten by scripts/mooncake2bailian): every request carries its
# inferred conversation, as the Qwen-Bailian traces' chat_id gives one.
SESS="
  sconv17x5.29 sconv30x7.88 sconv13x1.40 smc21x3.31 smc4x0.70 sconv25x8.01
  sconv14x1.58 sconv6x2.26 sconv19x2.76 smc24x5.12 smc8x2.21 smc9x2.27 sconv10x1.25
  smc25x3.76 sconv3x0.87 smc5x1.02 sconv3x0.95 sconv2x0.35 smc7x1.12 sconv2x0.43
  smc2x0.33"

# 24 more runs with session keys, drawn 2026-12-04 (seed 20261210,
# Mooncake or conversation trace, 2-32 replicas log-uniform, 0.1-0.4x speed
# per replica) after the marginal-reuse change had run on sess and before any run on them.
SESS2="
  sconv8x1.40 smc6x1.11 sconv9x1.25 smc7x2.32 smc8x2.83 smc4x0.96 sconv6x2.22
  sconv10x1.97 sconv6x1.64 smc5x1.07 smc19x7.17 sconv4x0.82 sconv7x1.56 smc3x0.42
  smc8x1.04 smc18x2.08 smc5x0.70 sconv24x8.38 smc3x1.09 smc8x1.14 sconv13x4.93
  smc4x1.24 sconv4x0.84 sconv4x1.06"

if [[ ${VARIANT:-} == cost ]]; then
	echo "scripts/heldout.sh: VARIANT=cost names the full runs' own cost; give a spec (cost:rotation_start=0 runs the defaults again)" >&2
	exit 2
fi

case "$set_name" in
bar | slow | gen | held1 | held2 | held3 | held4 | held5 | held6 | held7 | held8 | held9 | held10 | held11 | sess | sess2 | traces | all) ;;
*)
	echo "usage: scripts/heldout.sh bar|slow|gen|held1|held2|held3|held4|held5|held6|held7|held8|held9|held10|held11|sess|sess2|traces|all" >&2
	exit 2
	;;
esac

mkdir -p "$OUT"
# A binary of its own, so that two invocations on one $OUT do not replace
# each other's while it runs.
bin=$(mktemp "$OUT/llmlb.XXXXXX")
trap 'rm -f "$bin"' EXIT
echo "building $bin" >&2
go build -o "$bin" ./cmd/llmlb

files=()
pids=()

# bench NAME POLICIES ARGS...: one run, every policy, unless its JSON is
# already there (and the variant's beside it); with JOBS > 1 in the
# background, at most JOBS at once.
bench() {
	local name=$1
	local file="$OUT/$name.json" vfile=""
	files+=("$file")
	if [[ -n ${VARIANT:-} ]]; then
		vfile="$OUT/$name.variant-$(printf '%s' "$VARIANT" | md5sum | cut -c1-12).json"
		files[${#files[@]} - 1]="$file+$vfile"
	fi
	if ((JOBS <= 1)); then
		bench_one "$vfile" "$@"
		return
	fi
	while (($(jobs -rp | wc -l) >= JOBS)); do
		wait -n || true # a failure is collected below, by its pid
	done
	bench_one "$vfile" "$@" &
	pids+=($!)
}

# bench_one VFILE NAME POLICIES ARGS...: bench's work for one run.
bench_one() {
	local vfile=$1 name=$2 policies=$3
	shift 3
	local file="$OUT/$name.json"
	if [[ -s $file ]]; then
		echo "$name: kept $file" >&2
	else
		echo "$name: llmlb bench $* --policies $policies" >&2
		"$bin" bench "$@" --seed "$SEED" --policies "$policies" --json --quiet >"$file.tmp"
		mv "$file.tmp" "$file"
	fi
	if [[ -n $vfile && ! -s $vfile ]]; then
		echo "$name: llmlb bench $* --policies $VARIANT" >&2
		"$bin" bench "$@" --seed "$SEED" --policies "$VARIANT" --json --quiet >"$vfile.tmp"
		mv "$vfile.tmp" "$vfile"
	fi
}

# trace_runs LIST: the trace runs named in LIST.
trace_runs() {
	local name trace replicas speed format
	for name in $1; do
		if [[ ! $name =~ ^(s?)(mc|conv|az)([0-9]+)x([0-9.]+)$ ]]; then
			echo "bad run name $name" >&2
			exit 2
		fi
		case ${BASH_REMATCH[2]} in
		mc) trace=traces/mooncake_synthetic_trace.jsonl ;;
		conv) trace=traces/mooncake_conversation_head.jsonl ;;
		az) trace=traces/azure_llm_inference_2023_code.csv ;;
		esac
		replicas=${BASH_REMATCH[3]} speed=${BASH_REMATCH[4]} format=""
		if [[ -n ${BASH_REMATCH[1]} ]]; then
			trace=$(sessioned "$trace")
			format=bailian
		fi
		bench "$name" "${POLICIES:-$BASE,cost}" --trace "$trace" ${format:+--trace-format "$format"} --replicas "$replicas" --trace-speed "$speed"
	done
}

# sessioned TRACE: the Mooncake trace rewritten with session keys
# (scripts/mooncake2bailian: a request's parent is the earlier one whose
# whole prompt it extends), made once in $OUT; prints its path.
sessioned() {
	local out
	out="$OUT/$(basename "$1" .jsonl).bailian.jsonl"
	if [[ ! -s $out ]]; then
		go run ./scripts/mooncake2bailian <"$1" >"$out.tmp"
		mv "$out.tmp" "$out"
	fi
	printf '%s\n' "$out"
}

bar_runs() {
	local p=${POLICIES:-$BASE,llmlb-warm,cost}
	bench agentic "$p" --workload agentic --replicas 4 --duration 30m
	bench agentic2x "$p" --workload agentic --replicas 4 --duration 30m --rate 0.1744
	bench chat "$p" --workload chat --replicas 4 --duration 30m
	bench chathalf "$p" --workload chat --replicas 4 --duration 30m --rate 0.11
	bench longshort "$p" --workload longshort --replicas 4 --duration 30m
	bench mixed "$p" --workload mixed --replicas 4 --duration 30m
	bench oneshot "$p" --workload oneshot --replicas 4 --duration 30m
	bench mooncake1 "$p" --trace traces/mooncake_synthetic_trace.jsonl --replicas 4
	bench mooncake05 "$p" --trace traces/mooncake_synthetic_trace.jsonl --replicas 4 --trace-speed 0.5
	bench azure "$p" --trace traces/azure_llm_inference_2023_code.csv --replicas 4
	bench agentic32 "$p" --workload agentic --replicas 32 --duration 30m
	bench longshort32 "$p" --workload longshort --replicas 32 --duration 30m
}

# slow_runs: the runs of docs/benchmarks/LAB-2026.md's "A slower replica": one replica of
# four twice as slow (--slow replica-4:2), the eight runs of seed 1 and the
# five synthetic workloads at seeds 2 and 3 (the seed is in the run's name).
slow_runs() {
	local p=${POLICIES:-$BASE,llmlb-warm,cost} wl s
	for s in 1 2 3; do
		for wl in agentic chat mixed oneshot longshort; do
			SEED=$s bench "slow-$wl-seed$s" "$p" --workload "$wl" --replicas 4 --duration 30m --slow replica-4:2
		done
	done
	bench slow-mooncake "$p" --trace traces/mooncake_synthetic_trace.jsonl --replicas 4 --slow replica-4:2
	bench slow-conv8 "$p" --trace traces/mooncake_conversation_head.jsonl --replicas 8 --slow replica-4:2
	bench slow-azure "$p" --trace traces/azure_llm_inference_2023_code.csv --replicas 4 --slow replica-4:2
}

case "$set_name" in
bar) bar_runs ;;
slow) slow_runs ;;
gen) trace_runs "$GEN" ;;
held1) trace_runs "$HELD1" ;;
held2) trace_runs "$HELD2" ;;
held3) trace_runs "$HELD3" ;;
held4) trace_runs "$HELD4" ;;
held5) trace_runs "$HELD5" ;;
held6) trace_runs "$HELD6" ;;
held7) trace_runs "$HELD7" ;;
held8) trace_runs "$HELD8" ;;
held9) trace_runs "$HELD9" ;;
held10) trace_runs "$HELD10" ;;
held11) trace_runs "$HELD11" ;;
sess) trace_runs "$SESS" ;;
sess2) trace_runs "$SESS2" ;;
traces) trace_runs "$GEN $HELD1 $HELD2 $HELD3 $HELD4 $HELD5 $HELD6" ;;
all)
	bar_runs
	trace_runs "$GEN $HELD1 $HELD2 $HELD3 $HELD4 $HELD5 $HELD6 $HELD7 $HELD8 $HELD9 $HELD10 $HELD11 $SESS $SESS2"
	;;
esac

failed=0
for pid in "${pids[@]}"; do
	wait "$pid" || failed=1
done
if ((failed)); then
	echo "scripts/heldout.sh: a run failed (its message is above)" >&2
	exit 1
fi

if [[ -n ${VARIANT:-} ]]; then
	# The variant is judged against the full runs' other policies, not
	# against the cost those runs hold.
	go run ./scripts/barcheck -policy "$VARIANT" -exclude cost "${files[@]}"
else
	go run ./scripts/barcheck -policy "$POLICY" -exclude "${EXCLUDE:-}" "${files[@]}"
fi
