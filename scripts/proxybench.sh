#!/usr/bin/env bash
# Proxy efficiency vs NGINX (BENCHMARKS.md "Proxy efficiency vs
# NGINX"): a static upstream (scripts/proxybench, answers at once, so the
# proxy dominates), NGINX (Debian's nginx-light: 2 workers, keep-alive to the
# upstream, proxy_buffering off), goproxy (the floor of a Go proxy: a bare
# httputil.ReverseProxy over http.Transport, `proxybench goproxy`) and
# `llmlb serve` in front of it, and wrk. Each round measures direct, NGINX,
# goproxy and llmlb back to back (the order rotates per round) so background
# load hits all alike, with Caddy (Debian's caddy: reverse_proxy with
# flush_interval -1 and keep-alive to the upstream) and HAProxy (Debian's
# haproxy: 2 threads, keep-alive and connection reuse to the upstream) in the
# same rounds; the summary prints per-round ratios of each proxy to NGINX,
# of llmlb and Caddy to goproxy and of llmlb to Caddy, and their medians:
#   - added p50 at c=1 (proxied p50 - direct p50), JSON and SSE (whole stream)
#   - requests/s at c=64, JSON and SSE
#   - CPU per request at c=64 (utime+stime of the proxy's processes from
#     /proc/PID/stat over the run, divided by the requests)
#   - time to the first SSE chunk, added (scripts/proxybench ttfb)
#   - memory per in-flight stream (RSS delta with HOLD streams held open)
#
#   scripts/proxybench.sh                     # 4 rounds of 5 s runs
#   ROUNDS=6 DURATION=10 scripts/proxybench.sh
#
# Environment: ROUNDS (4), DURATION (seconds per wrk run, 5), CONNS (64),
# TTFB_N (2000), HOLD (1000), HOLD_PROMPT_BYTES (0: the held streams send the
# short chat; N: a user message of N bytes, an agent's prompt), BASE_PORT (18100: upstream, +1 NGINX, +2 llmlb
# proxy, +3 llmlb admin, +4 goproxy, +5 Caddy, +6 HAProxy, +7 and on: EXTRA),
# KEEP (1: keep the
# work directory), PROFILE (1: also write a 10 s CPU profile of llmlb under
# JSON c=64 to the work dir), LLMLB_ENV (environment of llmlb, e.g.
# "GOGC=100"), EXTRA (more llmlb targets measured in the same rounds, each
# NAME:SETTINGS with SETTINGS comma-separated VAR=VALUE for its environment
# and BIN=PATH for another binary, e.g.
#   EXTRA="before:BIN=/tmp/llmlb-old gc400:GOGC=400"
# their ratios to NGINX are printed too), TLS (1: measure NGINX and llmlb
# terminating TLS instead of Caddy, HAProxy and goproxy: targets direct,
# nginx, llmlb, nginx_tls and llmlb_tls, wrk speaking HTTP/1.1 over TLS to
# the last two with a self-signed certificate made by openssl; the time to
# first chunk and memory are measured without TLS only).
# Installs nginx-light, wrk, caddy and haproxy with apt-get when they are
# missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-4}
DURATION=${DURATION:-5}
CONNS=${CONNS:-64}
TTFB_N=${TTFB_N:-2000}
HOLD=${HOLD:-1000}
BASE_PORT=${BASE_PORT:-18100}
UP_PORT=$BASE_PORT
NGINX_PORT=$((BASE_PORT + 1))
LB_PORT=$((BASE_PORT + 2))
ADMIN_PORT=$((BASE_PORT + 3))
GO_PORT=$((BASE_PORT + 4))
CADDY_PORT=$((BASE_PORT + 5))
HAPROXY_PORT=$((BASE_PORT + 6))
read -ra extras <<<"${EXTRA:-}"
read -ra llmlb_env <<<"${LLMLB_ENV:-}"
TOKEN=proxybench-token
NGINX_TLS_PORT=$((BASE_PORT + 30))
LB_TLS_PORT=$((BASE_PORT + 31))
LB_TLS_ADMIN_PORT=$((BASE_PORT + 32))

if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ] || ! command -v wrk >/dev/null; then
	echo "== installing nginx-light and wrk"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light wrk >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
if ! command -v caddy >/dev/null || { ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; }; then
	echo "== installing caddy and haproxy"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq caddy haproxy >/dev/null
fi
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ "${KEEP:-}" = 1 ]; then echo "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

echo "== building llmlb and scripts/proxybench"
go build -o "$work/llmlb" ./cmd/llmlb
go build -o "$work/proxybench" ./scripts/proxybench

wait_port() { # port
	for _ in $(seq 100); do
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
		sleep 0.1
	done
	echo "port $1 did not open" >&2
	return 1
}

"$work/proxybench" upstream -listen "127.0.0.1:$UP_PORT" &
up_pid=$!
pids+=("$up_pid")
wait_port "$UP_PORT"

# NGINX: 2 workers, keep-alive upstream connections, no response buffering
# (SSE chunks pass at once), no access log (llmlb's is off too). With TLS=1
# a second server terminates TLS (session cache on, as usually configured).
mkdir -p "$work/nginx"
nginx_tls=
if [ "${TLS:-}" = 1 ]; then
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
		-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
		-keyout "$work/tls.key" -out "$work/tls.crt" 2>/dev/null
	nginx_tls="server {
		listen 127.0.0.1:$NGINX_TLS_PORT ssl;
		ssl_certificate $work/tls.crt;
		ssl_certificate_key $work/tls.key;
		ssl_session_cache shared:SSL:10m;
		location / {
			proxy_pass http://up;
			proxy_http_version 1.1;
			proxy_set_header Connection \"\";
			proxy_buffering off;
			proxy_read_timeout 120s;
		}
	}"
fi
cat >"$work/nginx/nginx.conf" <<EOF
worker_processes 2;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
user root;
events { worker_connections 8192; }
http {
	access_log off;
	client_body_temp_path $work/nginx/body;
	proxy_temp_path $work/nginx/proxy;
	fastcgi_temp_path $work/nginx/fastcgi;
	uwsgi_temp_path $work/nginx/uwsgi;
	scgi_temp_path $work/nginx/scgi;
	keepalive_requests 1000000;
	upstream up {
		server 127.0.0.1:$UP_PORT;
		keepalive 128;
	}
	server {
		listen 127.0.0.1:$NGINX_PORT;
		location / {
			proxy_pass http://up;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_buffering off;
			proxy_read_timeout 120s;
		}
	}
	$nginx_tls
}
EOF
"$NGINX" -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" &
nginx_pid=$!
pids+=("$nginx_pid")
wait_port "$NGINX_PORT"

"$work/proxybench" goproxy -listen "127.0.0.1:$GO_PORT" -upstream "http://127.0.0.1:$UP_PORT" &
go_pid=$!
pids+=("$go_pid")
wait_port "$GO_PORT"

# Caddy: reverse_proxy with flush_interval -1 (every chunk at once),
# keep-alive upstream connections, no admin endpoint, no access log (the
# default), GOMAXPROCS = the machine's cores as for goproxy and llmlb.
mkdir -p "$work/caddy"
cat >"$work/caddy/Caddyfile" <<EOF
{
	admin off
	auto_https off
}
http://127.0.0.1:$CADDY_PORT {
	reverse_proxy 127.0.0.1:$UP_PORT {
		flush_interval -1
		transport http {
			keepalive 120s
			keepalive_idle_conns 128
		}
	}
}
EOF
XDG_DATA_HOME=$work/caddy XDG_CONFIG_HOME=$work/caddy caddy run --adapter caddyfile --config "$work/caddy/Caddyfile" 2>"$work/caddy/caddy.log" &
caddy_pid=$!
pids+=("$caddy_pid")
wait_port "$CADDY_PORT"

# HAProxy: one process with 2 threads, keep-alive on both sides and
# upstream connections reused across clients (http-reuse always), no log;
# it does not buffer responses, so SSE chunks pass at once.
cat >"$work/haproxy.cfg" <<EOF
global
	maxconn 8000
	nbthread 2
defaults
	mode http
	timeout connect 5s
	timeout client 120s
	timeout server 120s
	http-reuse always
frontend fe
	bind 127.0.0.1:$HAPROXY_PORT
	default_backend be
backend be
	server up 127.0.0.1:$UP_PORT
EOF
"$HAPROXY" -db -f "$work/haproxy.cfg" 2>"$work/haproxy.log" &
haproxy_pid=$!
pids+=("$haproxy_pid")
wait_port "$HAPROXY_PORT"

# start_llmlb NAME PORT ADMIN_PORT BINARY [VAR=VALUE...]: one llmlb serve
# in front of the upstream; sets lb_pid.
start_llmlb() {
	local name=$1 port=$2 admin=$3 bin=$4
	shift 4
	cat >"$work/$name.yaml" <<EOF
listen: "127.0.0.1:$port"
admin_listen: "127.0.0.1:$admin"
admin_token: $TOKEN
replicas:
  - name: up
    url: http://127.0.0.1:$UP_PORT
server:
  max_connections: 60000
${lb_server_extra:-}
log:
  level: warn
  access: false
EOF
	env "$@" "$bin" serve --config "$work/$name.yaml" --watch-config 0 2>"$work/$name.log" &
	lb_pid=$!
	pids+=("$lb_pid")
	wait_port "$port"
	for _ in $(seq 100); do # the replica turns LIVE after its first scrape
		curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null && break
		sleep 0.1
	done
}

declare -A pid_of port_of_t
targets=(direct nginx goproxy llmlb caddy haproxy)
if [ "${TLS:-}" = 1 ]; then
	targets=(direct nginx llmlb nginx_tls llmlb_tls)
	port_of_t[nginx_tls]=$NGINX_TLS_PORT
	wait_port "$NGINX_TLS_PORT"
	lb_server_extra=$(printf '  tls:\n    cert_file: %s\n    key_file: %s' "$work/tls.crt" "$work/tls.key")
	start_llmlb llmlb_tls "$LB_TLS_PORT" "$LB_TLS_ADMIN_PORT" "$work/llmlb" "${llmlb_env[@]}"
	lb_server_extra=
	pid_of[llmlb_tls]=$lb_pid
	port_of_t[llmlb_tls]=$LB_TLS_PORT
fi
pid_of[direct]=$up_pid
pid_of[caddy]=$caddy_pid
port_of_t[caddy]=$CADDY_PORT
pid_of[haproxy]=$haproxy_pid
port_of_t[haproxy]=$HAPROXY_PORT
port_of_t[direct]=$UP_PORT
port_of_t[nginx]=$NGINX_PORT
pid_of[goproxy]=$go_pid
port_of_t[goproxy]=$GO_PORT
start_llmlb llmlb "$LB_PORT" "$ADMIN_PORT" "$work/llmlb" "${llmlb_env[@]}"
pid_of[llmlb]=$lb_pid
port_of_t[llmlb]=$LB_PORT
i=0
for spec in "${extras[@]}"; do
	name=${spec%%:*}
	bin=$work/llmlb
	envs=()
	IFS=, read -ra settings <<<"${spec#*:}"
	for kv in "${settings[@]}"; do
		case $kv in
		BIN=*) bin=${kv#BIN=} ;;
		*=*) envs+=("$kv") ;;
		esac
	done
	start_llmlb "$name" $((BASE_PORT + 7 + 2 * i)) $((BASE_PORT + 8 + 2 * i)) "$bin" "${envs[@]}"
	pid_of[$name]=$lb_pid
	port_of_t[$name]=$((BASE_PORT + 7 + 2 * i))
	targets+=("$name")
	i=$((i + 1))
done

# The processes whose CPU and memory count for each target.
nginx_procs() { echo "$nginx_pid" $(cat /proc/"$nginx_pid"/task/*/children 2>/dev/null); }
procs() {
	case $1 in
	nginx | nginx_tls) nginx_procs ;;
	*) echo "${pid_of[$1]}" ;;
	esac
}
port_of() { echo "${port_of_t[$1]}"; }
scheme_of() { case $1 in *_tls) echo https ;; *) echo http ;; esac; }
cpu_ticks() { local s=0 p; for p in "$@"; do s=$((s + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$s"; }
rss_kb() { local s=0 p; for p in "$@"; do s=$((s + $(awk '/^VmRSS:/ {print $2}' "/proc/$p/status"))); done; echo "$s"; }
hz=$(getconf CLK_TCK)

body_json='{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello."}]}'
body_sse='{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello."}]}'
for kind in json sse; do
	b=body_$kind
	cat >"$work/$kind.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '${!b}'
function done(summary, latency, requests)
	io.write(string.format("RESULT requests=%d duration_us=%d p50_us=%d errors=%d\n",
		summary.requests, summary.duration, latency:percentile(50),
		summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout))
end
EOF
done

# run_wrk TARGET KIND CONNS: one wrk run; appends a line to results.
results="$work/results.txt"
run_wrk() {
	local target=$1 kind=$2 c=$3 threads=1 ps t0 t1 out
	[ "$c" -gt 1 ] && threads=2
	ps=$(procs "$target")
	t0=$(cpu_ticks $ps)
	out=$(wrk -t"$threads" -c"$c" -d"${DURATION}s" -s "$work/$kind.lua" "$(scheme_of "$target")://127.0.0.1:$(port_of "$target")/v1/chat/completions" | grep '^RESULT')
	t1=$(cpu_ticks $ps)
	# shellcheck disable=SC2086
	set -- $out
	local req=${2#requests=} dur=${3#duration_us=} p50=${4#p50_us=} errs=${5#errors=}
	if [ "$errs" != 0 ]; then echo "   $target $kind c=$c: $errs errors" >&2; fi
	awk -v r="$round" -v t="$target" -v k="$kind" -v c="$c" -v req="$req" -v dur="$dur" -v p50="$p50" \
		-v ticks=$((t1 - t0)) -v hz="$hz" 'BEGIN {
		printf "%s %s %s_c%s_p50_us %s\n", r, t, k, c, p50
		printf "%s %s %s_c%s_rps %.0f\n", r, t, k, c, req / (dur / 1e6)
		printf "%s %s %s_c%s_cpu_us_per_req %.2f\n", r, t, k, c, ticks / hz * 1e6 / req
	}' >>"$results"
}

run_ttfb() {
	local target=$1 out
	[ "$(scheme_of "$target")" = https ] && return 0
	out=$("$work/proxybench" ttfb -url "http://127.0.0.1:$(port_of "$target")/v1/chat/completions" -n "$TTFB_N")
	echo "$round $target ttfb_p50_us ${out#ttfb_p50_us=}" | awk '{print $1, $2, $3, $4}' >>"$results"
}

nt=${#targets[@]}
echo "== targets: ${targets[*]}"
echo "== $ROUNDS rounds, ${DURATION}s per wrk run, c=1 and c=$CONNS, JSON and SSE ($(nproc) cores; other load on the machine: $(cut -d' ' -f1-3 /proc/loadavg))"
for round in $(seq "$ROUNDS"); do
	# Rotate the order so that no target always runs first.
	order=("${targets[@]:$(((round - 1) % nt))}" "${targets[@]:0:$(((round - 1) % nt))}")
	echo "-- round $round: ${order[*]}"
	for kind in json sse; do
		for c in 1 "$CONNS"; do
			for t in "${order[@]}"; do run_wrk "$t" "$kind" "$c"; done
		done
	done
	for t in "${order[@]}"; do run_ttfb "$t"; done
done

if [ "${PROFILE:-}" = 1 ]; then
	echo "== CPU profile of llmlb under JSON c=$CONNS (10 s): $work/llmlb.cpu.pprof"
	curl -sf -H "Authorization: Bearer $TOKEN" -o "$work/llmlb.cpu.pprof" \
		"http://127.0.0.1:$ADMIN_PORT/debug/pprof/profile?seconds=10" &
	prof=$!
	wrk -t2 -c"$CONNS" -d11s -s "$work/json.lua" "http://127.0.0.1:$LB_PORT/v1/chat/completions" >/dev/null
	wait "$prof"
	KEEP=1
fi

# Memory per in-flight stream: RSS of the proxy's processes with HOLD
# streams held open (each has its first chunk) minus RSS before.
echo "== memory per in-flight stream ($HOLD streams held open, prompts of ${HOLD_PROMPT_BYTES:-0} extra bytes)"
for t in "${targets[@]:1}"; do
	[ "$(scheme_of "$t")" = https ] && continue
	ps=$(procs "$t")
	before=$(rss_kb $ps)
	"$work/proxybench" hold -url "http://127.0.0.1:$(port_of "$t")/v1/chat/completions?hold" -n "$HOLD" \
		-prompt-bytes "${HOLD_PROMPT_BYTES:-0}" >"$work/hold.out" &
	hp=$!
	for _ in $(seq 600); do grep -q held "$work/hold.out" && break; sleep 0.1; done
	sleep 1
	after=$(rss_kb $ps)
	kill "$hp"
	wait "$hp" 2>/dev/null || true
	echo "mem $t kib_per_stream $(awk -v a="$after" -v b="$before" -v n="$HOLD" 'BEGIN {printf "%.1f", (a - b) / n}')" >>"$results"
	sleep 2 # let the streams close
done

# Summary: per metric, each target's median over rounds, then the ratios
# of each proxy (EXTRA included) to NGINX, of llmlb and Caddy to goproxy and
# of llmlb to Caddy, per round and their medians. "added" metrics subtract
# the round's direct figure.
echo
echo "== results (median over $ROUNDS rounds; ratios with per-round values in brackets)"
awk -v R="$ROUNDS" -v T="${targets[*]}" '
function median(list,   a, n, i, j, t) {
	n = split(list, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
# val(r, t, m): the figure of target t in round r; "added" metrics minus direct
function val(r, t, m) { return (m ~ /p50_us$/ && t != "direct") ? v[r, t, m] - v[r, "direct", m] : v[r, t, m] }
$1 == "mem" { mem[$2] = $4; next }
{ v[$1, $2, $3] = $4 }
END {
	nt = split(T, tg, " ")
	for (i = 1; i <= nt; i++) has[tg[i]] = 1
	split("json_c1_p50_us sse_c1_p50_us ttfb_p50_us json_c'"$CONNS"'_rps sse_c'"$CONNS"'_rps json_c'"$CONNS"'_cpu_us_per_req sse_c'"$CONNS"'_cpu_us_per_req", order, " ")
	printf "%-30s", "metric"
	for (i = 1; i <= nt; i++) printf " %10s", tg[i]
	printf "\n"
	for (k = 1; k in order; k++) {
		m = order[k]
		printf "%-30s", (m ~ /p50_us$/) ? m " (added)" : m
		for (i = 1; i <= nt; i++) {
			# not measured (the first chunk and memory over TLS): "-"
			if (!((1, tg[i], m) in v)) { printf " %10s", "-"; continue }
			l = ""
			for (r = 1; r <= R; r++) l = l " " val(r, tg[i], m)
			printf " %10.1f", median(l)
		}
		printf "\n"
	}
	printf "%-30s %10s", "memory per stream (KiB)", ""
	for (i = 2; i <= nt; i++) if (tg[i] in mem) printf " %10.1f", mem[tg[i]]; else printf " %10s", "-"
	printf "\n\n"
	for (k = 1; k in order; k++) {
		m = order[k]
		np = 0
		for (i = 3; i <= nt; i++) { np++; pn[np] = tg[i]; pd[np] = "nginx" }
		split("llmlb/goproxy caddy/goproxy llmlb/caddy llmlb_tls/nginx_tls llmlb_tls/llmlb", pairs, " ")
		for (q = 1; q in pairs; q++) {
			split(pairs[q], ab, "/")
			if ((ab[1] in has) && (ab[2] in has)) { np++; pn[np] = ab[1]; pd[np] = ab[2] }
		}
		for (p = 1; p <= np; p++) {
			num = pn[p]; den = pd[p]
			if (!((1, num, m) in v) || !((1, den, m) in v)) continue
			rs = ""; shown = ""
			for (r = 1; r <= R; r++) {
				a = val(r, den, m); b = val(r, num, m)
				# an added latency can come out <= 0 in a noisy round: no ratio then
				if (a > 0) { rs = rs sprintf(" %.2f", b / a); shown = shown sprintf(" %.2f", b / a) }
				else shown = shown " -"
			}
			printf "%-30s %-18s %6.2f  [%s ]\n", m, num "/" den, median(rs), shown
		}
	}
	for (i = 3; i <= nt; i++) if (tg[i] in mem) printf "%-30s %-18s %6.2f\n", "memory per stream", tg[i] "/nginx", (mem["nginx"] > 0 ? mem[tg[i]] / mem["nginx"] : 0)
	if (mem["goproxy"] > 0) printf "%-30s %-18s %6.2f\n", "memory per stream", "llmlb/goproxy", mem["llmlb"] / mem["goproxy"]
	if (mem["caddy"] > 0) printf "%-30s %-18s %6.2f\n", "memory per stream", "llmlb/caddy", mem["llmlb"] / mem["caddy"]
}' "$results"
echo
echo "(added p50: proxied minus direct in the same round; CPU is the proxy's own processes (NGINX: master + workers), for direct the upstream's; goproxy: a bare httputil.ReverseProxy, the floor of a Go proxy)"
cp "$results" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true
