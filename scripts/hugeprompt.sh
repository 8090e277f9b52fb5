#!/usr/bin/env bash
# Huge-prompt attack (docs/SECURITY.md, "Huge prompts"): other clients'
# throughput through llmlb while ATTACKERS clients each send one 30 MB
# /v1/completions body of 15M token ids after another. Runs `llmlb loadgen`
# (STREAMS streaming clients, short answers) for DURATION alone, then again
# under the attack, and prints the ratio. The replicas refuse the prompt
# (too long for their context), so the attack costs the replicas nothing:
# what is measured is llmlb's own cost of reading and profiling the bodies.
#
#   scripts/hugeprompt.sh                       # 3 attackers, 32 streams, 20 s
#
# Environment: ATTACKERS (3), STREAMS (32), DURATION (20s), REPLICAS (2),
# SIM_PORT (18001), PROXY_PORT (18080), ADMIN_PORT (19090).
set -euo pipefail
cd "$(dirname "$0")/.."

ATTACKERS=${ATTACKERS:-3}
STREAMS=${STREAMS:-32}
DURATION=${DURATION:-20s}
REPLICAS=${REPLICAS:-2}
SIM_PORT=${SIM_PORT:-18001}
PROXY_PORT=${PROXY_PORT:-18080}
ADMIN_PORT=${ADMIN_PORT:-19090}

. scripts/fleet.sh
start_fleet warn --profile h100
sleep 1

# 15,000,000 token ids, ~30 MB.
awk 'BEGIN { printf "{\"model\":\"sim-model\",\"max_tokens\":1,\"prompt\":["; for (i = 0; i < 15000000; i++) { if (i) printf ","; printf "%d", i % 10 } printf "]}" }' >"$work/huge.json"
echo "== attack body: $(du -h "$work/huge.json" | cut -f1), 15M token ids"

secs=${DURATION%s}
rate() { # completed requests per second of loadgen's run
	"$work/llmlb" loadgen --target "http://127.0.0.1:$PROXY_PORT" --streams "$STREAMS" --max-tokens 4 \
		--duration "$DURATION" --every 1h --json 2>/dev/null |
		awk -v s="$secs" '/"ok":/ { gsub(/[^0-9]/, "", $2); printf "%.1f", $2 / s; exit }'
}

alone=$(rate)
echo "== alone: $alone requests/s"
attack_pids=()
for _ in $(seq 1 "$ATTACKERS"); do
	(while :; do curl -s -o /dev/null -H 'Content-Type: application/json' --data-binary @"$work/huge.json" \
		"http://127.0.0.1:$PROXY_PORT/v1/completions" || true; done) &
	attack_pids+=($!)
done
sleep 2
attacked=$(rate)
for p in "${attack_pids[@]}"; do kill "$p" 2>/dev/null || true; done
echo "== under $ATTACKERS huge-prompt clients: $attacked requests/s"
awk -v a="$alone" -v b="$attacked" 'BEGIN { printf "== other clients keep %.2f of their throughput (%.2fx slower; the bar is within 2x)\n", b / a, a / b }'
