#!/usr/bin/env bash
# Load run (docs/GUARANTEES.md "Load"): `llmlb sim` replicas with enough
# slots, `llmlb serve` in front, and `llmlb loadgen` holding STREAMS
# concurrent streaming chat completions through the balancer for DURATION.
# Reports the balancer's RSS idle vs under load (memory per in-flight stream)
# and its CPU (utime+stime from /proc/PID/stat) over the run. Exits non-zero
# if any request failed.
#
#   scripts/load.sh                          # 5000 streams, 60 s
#   STREAMS=1000 DURATION=20s scripts/load.sh
#
# Environment: STREAMS (5000), DURATION (60s), REPLICAS (4), MAX_TOKENS (64),
# SIM_PORT (18001; control ports +1000), PROXY_PORT (18080), ADMIN_PORT (19090).
set -euo pipefail
cd "$(dirname "$0")/.."

STREAMS=${STREAMS:-5000}
DURATION=${DURATION:-60s}
REPLICAS=${REPLICAS:-4}
MAX_TOKENS=${MAX_TOKENS:-64}
SIM_PORT=${SIM_PORT:-18001}
PROXY_PORT=${PROXY_PORT:-18080}
ADMIN_PORT=${ADMIN_PORT:-19090}
# Every stream gets a running slot: no queueing inside the simulator.
SLOTS=$(( (STREAMS + REPLICAS - 1) / REPLICAS + 64 ))
KV_TOKENS=$(( SLOTS * 4096 ))

# Each stream is one client socket and one upstream socket in llmlb.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
echo "== ulimit -n $(ulimit -n), $STREAMS streams for $DURATION on $REPLICAS replicas ($SLOTS slots, $KV_TOKENS KV tokens each)"

. scripts/fleet.sh
start_fleet warn --profile h100 --max-num-seqs "$SLOTS" --kv-tokens "$KV_TOKENS"
sleep 1 # let every replica's first scrape land

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
in_flight() { curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '/^llmlb_replica_in_flight\{/ {s += $2} END {print s + 0}'; }
# The GC's heap goal (2x the heap live after the last collection, GOGC=100).
heap_goal_mb() { curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '/^go_memstats_next_gc_bytes / {printf "%.0f", $2 / 1048576}'; }
hz=$(getconf CLK_TCK)

idle_rss=$(rss_kb "$serve_pid")
cpu0=$(cpu_ticks "$serve_pid")
t0=$(date +%s.%N)

"$work/llmlb" loadgen --target "http://127.0.0.1:$PROXY_PORT" --streams "$STREAMS" --duration "$DURATION" \
	--max-tokens "$MAX_TOKENS" --every 10s --json >"$work/loadgen.json" 2>"$work/loadgen.log" &
lg_pid=$!
pids+=("$lg_pid")

peak_rss=$idle_rss
peak_inflight=0
rss_at_peak=$idle_rss
while kill -0 "$lg_pid" 2>/dev/null; do
	sleep 2
	r=$(rss_kb "$serve_pid" || echo 0)
	f=$(in_flight || echo 0)
	[ "$r" -gt "$peak_rss" ] && peak_rss=$r
	if [ "$f" -gt "$peak_inflight" ]; then peak_inflight=$f; rss_at_peak=$r; fi
	echo "   in-flight $f  rss ${r} kB  heap goal $(heap_goal_mb || echo ?) MiB"
done
wait "$lg_pid" || true
t1=$(date +%s.%N)
cpu1=$(cpu_ticks "$serve_pid")

cat "$work/loadgen.log" | tail -3
cat "$work/loadgen.json"
failed=$(grep -o '"failed": *[0-9]*' "$work/loadgen.json" | grep -o '[0-9]*$')
requests=$(grep -o '"requests": *[0-9]*' "$work/loadgen.json" | grep -o '[0-9]*$')

awk -v idle="$idle_rss" -v peak="$peak_rss" -v atpeak="$rss_at_peak" -v inflight="$peak_inflight" \
	-v c0="$cpu0" -v c1="$cpu1" -v hz="$hz" -v t0="$t0" -v t1="$t1" -v streams="$STREAMS" \
	-v req="$requests" -v failed="$failed" 'BEGIN {
	wall = t1 - t0; cpu = (c1 - c0) / hz
	printf "== RESULT streams %d, peak in-flight %d, requests %d, failed %d\n", streams, inflight, req, failed
	printf "== RSS idle %.1f MiB, at peak in-flight %.1f MiB, max %.1f MiB -> %.1f KiB per in-flight stream\n", idle/1024, atpeak/1024, peak/1024, (atpeak-idle)/(inflight>0?inflight:1)
	printf "== CPU (llmlb serve) %.1f s over %.1f s wall = %.2f cores; %.0f us per request\n", cpu, wall, cpu/wall, (req>0? cpu*1e6/req : 0)
}'
[ "${failed:-1}" -eq 0 ] || { echo "FAIL: $failed requests failed"; tail -20 "$work/serve.log"; exit 1; }
echo "== ok"
