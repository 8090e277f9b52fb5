# Shared by load.sh and soak.sh (sourced, not run): builds llmlb into a
# temporary folder, starts `llmlb sim` replicas and `llmlb serve` in front of
# them, and stops everything on exit. Needs SIM_PORT, PROXY_PORT, ADMIN_PORT
# and REPLICAS; sets work, pids and serve_pid.

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/llmlb" ./cmd/llmlb

# start_fleet LOG_LEVEL [extra llmlb sim flags...]
start_fleet() {
	local level=$1
	shift
	"$work/llmlb" sim --listen "127.0.0.1:$SIM_PORT" --replicas "$REPLICAS" --log-level warn "$@" >"$work/sim.log" 2>&1 &
	pids+=($!)
	# Serve starts after the replicas answer: a failed first scrape would eject them.
	for i in $(seq 1 "$REPLICAS"); do
		for _ in $(seq 1 200); do
			curl -sf "http://127.0.0.1:$((SIM_PORT + i - 1))/health" >/dev/null 2>&1 && break
			sleep 0.1
		done
	done
	{
		echo "listen: 127.0.0.1:$PROXY_PORT"
		echo "admin_listen: 127.0.0.1:$ADMIN_PORT"
		echo "log:"
		echo "  level: $level"
		echo "replicas:"
		for i in $(seq 1 "$REPLICAS"); do
			echo "  - name: sim-$i"
			echo "    url: http://127.0.0.1:$((SIM_PORT + i - 1))"
			echo "    models: [sim-model]"
		done
	} >"$work/llmlb.yaml"
	"$work/llmlb" serve --config "$work/llmlb.yaml" >"$work/serve.log" 2>&1 &
	serve_pid=$!
	pids+=("$serve_pid")
	for _ in $(seq 1 200); do
		curl -sf "http://127.0.0.1:$ADMIN_PORT/readyz" >/dev/null 2>&1 && break
		sleep 0.1
	done
	curl -sf "http://127.0.0.1:$ADMIN_PORT/readyz" >/dev/null || { echo "llmlb serve not ready"; cat "$work/serve.log" "$work/sim.log"; exit 1; }
}
