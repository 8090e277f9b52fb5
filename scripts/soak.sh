#!/usr/bin/env bash
# Soak run (docs/GUARANTEES.md "Soak"): `llmlb loadgen` streams through
# `llmlb serve` to 4 `llmlb sim` replicas for DURATION while a fault is
# injected every INTERVAL, rotating modes across replicas (each fault is
# lifted after half an interval). Guarantee: zero lost requests, i.e. every
# request either completes or, if its stream was cut mid-way by the fault
# (refuse/break kill streams in flight), ends with an SSE error event; those
# cut streams are counted and reported, never silently dropped.
# Not part of CI:  scripts/soak.sh            # 30 minutes, a fault a minute
#                  DURATION=180 INTERVAL=30 scripts/soak.sh   # a 3-minute check
#
# Environment: DURATION seconds (1800), INTERVAL seconds (60), STREAMS (200),
# SIM_PORT (18101; control +1000), PROXY_PORT (18180), ADMIN_PORT (19190).
# Modes: refuse, break, slow, flap. Not hang: a hung replica's requests wait
# for proxy.first_byte_timeout and answer 504 (never retried: the replica may
# still be working), and not error: a replica's 5xx is passed to the client.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-1800}
INTERVAL=${INTERVAL:-60}
STREAMS=${STREAMS:-200}
SIM_PORT=${SIM_PORT:-18101}
PROXY_PORT=${PROXY_PORT:-18180}
ADMIN_PORT=${ADMIN_PORT:-19190}
REPLICAS=4
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

. scripts/fleet.sh
start_fleet info

"$work/llmlb" loadgen --target "http://127.0.0.1:$PROXY_PORT" --streams "$STREAMS" --burst-max 3 \
	--think 500ms --max-tokens 48 --duration "${DURATION}s" --every 30s --json >"$work/loadgen.json" 2>"$work/loadgen.log" &
lg_pid=$!
pids+=("$lg_pid")

modes=('{"mode":"refuse"}' '{"mode":"break","after_tokens":10}' '{"mode":"slow","factor":4}' '{"mode":"flap","period":"15s"}')
fault() { curl -sf -X POST "http://127.0.0.1:$((SIM_PORT + 1000 + $1))/sim/fault" -d "$2" >/dev/null; }
start=$(date +%s)
k=0
while kill -0 "$lg_pid" 2>/dev/null && [ $(( $(date +%s) - start )) -lt $(( DURATION - INTERVAL / 2 )) ]; do
	sleep $(( INTERVAL / 2 ))
	# the mode shifts by one every round, so each replica meets every mode
	r=$(( k % REPLICAS )); m=${modes[$(( (k + k / REPLICAS) % ${#modes[@]} ))]}
	echo "[$(( $(date +%s) - start ))s] sim-$((r + 1)) <- $m"
	fault "$r" "$m"
	sleep $(( INTERVAL / 2 ))
	fault "$r" '{"mode":"none"}'
	k=$(( k + 1 ))
done
wait "$lg_pid" || true
tail -2 "$work/loadgen.log"
cat "$work/loadgen.json"
curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | grep -E '^llmlb_(stream_errors|failovers|ejections)_total' || true

# Lost = failed requests that were not a stream cut mid-way with an error event.
python3 - "$work/loadgen.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
cut = sum(v for k, v in s["errors"].items() if k.startswith("traffic: stream error event"))
lost = s["failed"] - cut
print(f"== RESULT requests {s['requests']} ok {s['ok']} cut-with-error-event {cut} lost {lost}; by status {s['by_status']}")
if lost:
    print("FAIL: lost requests:", {k: v for k, v in s["errors"].items() if not k.startswith("traffic: stream error event")})
    sys.exit(1)
print("== ok")
PY
