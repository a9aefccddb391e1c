#!/usr/bin/env bash
# bench-read.sh — sale-state reads/s through the proxy, side by side in one
# run (wrk, GET /api/v1/activities/{id} of one open sale):
#   today        proxy and backend built from TODAY_REF (default dff384c, the
#                last commit before the read path): every read is a Redis HMGET
#   flight       this build, backend state_cache_ttl = 0s: no cache, but
#                concurrent reads of one activity share one Redis read
#   backend      proxy without read cache → backend with its 100ms state cache
#   proxy-cache  proxy with read_cache_ttl 100ms → backend with its cache
#   sold-out     the proxy's sold-out edge answer (POST purchase of a sold-out
#                sale, unkeyed): the cheapest answer the proxy gave before
# and the Redis reads of sale state per GET (INFO commandstats hmget delta over
# the run; the shared Redis is counted, so other users add noise).
# Env: DURATION (5s), CONNS (64), THREADS (2), TODAY_REF. Needs bin/ (make
# build), wrk, git.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DURATION=${DURATION:-5s} CONNS=${CONNS:-64} THREADS=${THREADS:-2}
STACK_NAME=benchread
STACK_OUT=${BENCH_OUT:-out/bench-read}
# shellcheck source=../bench/stack.sh
source bench/stack.sh
command -v wrk >/dev/null || { echo "bench-read: wrk is not installed" >&2; exit 2; }
for b in proxy backend worker; do
	[[ -x bin/$b ]] || { echo "bench-read: bin/$b is missing (make build)" >&2; exit 2; }
done
rm -rf "$STACK_OUT"
mkdir -p "$STACK_OUT/today-src" "$STACK_OUT/today-bin"
# The baseline, built from the repository's history (read-only: git archive).
git archive "${TODAY_REF:-dff384c}" | tar -x -C "$STACK_OUT/today-src"
(cd "$STACK_OUT/today-src" && go build -o ../today-bin/ ./proxy ./backend)
trap 'stack_stop' EXIT
trap 'echo "bench-read: interrupted" >&2; exit 130' INT TERM

# config FILE STATE_TTL READ_CACHE_TTL
config() {
	cat >"$1" <<TOML
[backend]
state_cache_ttl = "$2"
[[proxy.rules]]
name        = "api"
path_prefix = "/api/"
per_ip      = { limit = 10000000, window = "1s" }
global      = { limit = 10000000, window = "1s" }
read_cache_ttl = "$3"
TOML
}
stack_init
config "$STACK_OUT/cached.toml" 100ms 100ms
config "$STACK_OUT/backend.toml" 100ms 0s
config "$STACK_OUT/flight.toml" 0s 0s
# The baseline knows no read-path keys.
sed '/state_cache_ttl\|read_cache_ttl/d' "$STACK_OUT/flight.toml" >"$STACK_OUT/today.toml"
stack_up "$STACK_OUT/cached.toml" 1 1
CACHED_PROXY=$PROXY_URLS CACHED_BACKEND=$BACKEND_URL
stack_launch proxy-backend /readyz "SECKILL_PROXY_LISTEN=127.0.0.1:PORT" "SECKILL_PROXY_ADMIN_LISTEN=127.0.0.1:APORT" \
	"SECKILL_PROXY_UPSTREAMS=$CACHED_BACKEND" -- bin/proxy -config "$STACK_OUT/backend.toml"
BACKEND_PROXY="http://127.0.0.1:$LAUNCH_PORT"
stack_launch backend-flight /readyz "SECKILL_BACKEND_LISTEN=127.0.0.1:PORT" -- bin/backend -config "$STACK_OUT/flight.toml"
FLIGHT_BACKEND="http://127.0.0.1:$LAUNCH_PORT"
stack_launch proxy-flight /readyz "SECKILL_PROXY_LISTEN=127.0.0.1:PORT" "SECKILL_PROXY_ADMIN_LISTEN=127.0.0.1:APORT" \
	"SECKILL_PROXY_UPSTREAMS=$FLIGHT_BACKEND" -- bin/proxy -config "$STACK_OUT/flight.toml"
FLIGHT_PROXY="http://127.0.0.1:$LAUNCH_PORT"
T=$STACK_OUT/today-bin
stack_launch backend-today /readyz "SECKILL_BACKEND_LISTEN=127.0.0.1:PORT" -- "$T/backend" -config "$STACK_OUT/today.toml"
TODAY_BACKEND="http://127.0.0.1:$LAUNCH_PORT"
stack_launch proxy-today /readyz "SECKILL_PROXY_LISTEN=127.0.0.1:PORT" "SECKILL_PROXY_ADMIN_LISTEN=127.0.0.1:APORT" \
	"SECKILL_PROXY_UPSTREAMS=$TODAY_BACKEND" -- "$T/proxy" -config "$STACK_OUT/today.toml"
TODAY_PROXY="http://127.0.0.1:$LAUNCH_PORT"

sale() { # id stock
	curl -fsS -o /dev/null -X PUT "$CACHED_BACKEND/admin/v1/activities/$1" -H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" \
		-d "{\"stock\":$2,\"per_user_limit\":1,\"starts_at\":\"2020-01-01T00:00:00Z\",\"ends_at\":\"2099-01-01T00:00:00Z\"}"
}
sale 1 1000000
sale 2 1
curl -fsS -o /dev/null -X POST "$CACHED_BACKEND/api/v1/activities/2/purchase" -H "X-User-ID: first"
# The proxy learns the sold-out answer from the backend on the first refusal.
curl -sS -o /dev/null -X POST "$CACHED_PROXY/api/v1/activities/2/purchase" -H "X-User-ID: second"
cat >"$STACK_OUT/soldout.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["X-User-ID"] = "tail"
LUA

hmget() { redis-cli info commandstats | sed -n 's/^cmdstat_hmget:calls=\([0-9]*\),.*/\1/p'; }
declare -A RPS READS
run() { # name url [wrk args...]
	local name=$1 url=$2 before after out n
	shift 2
	before=$(hmget)
	out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" "$@" "$url")
	after=$(hmget)
	echo "$out" >"$STACK_OUT/$name.txt"
	RPS[$name]=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' <<<"$out")
	n=$(awk '/requests in/ {print $1}' <<<"$out")
	READS[$name]=$(awk -v d=$((after - before)) -v n="$n" 'BEGIN { if (n > 0) printf "%.5f", d / n; else print "-" }')
	stack_log "$name: ${RPS[$name]} req/s, Redis reads of sale state per request ${READS[$name]}"
}
run today "$TODAY_PROXY/api/v1/activities/1"
run flight "$FLIGHT_PROXY/api/v1/activities/1"
run backend "$BACKEND_PROXY/api/v1/activities/1"
run proxy-cache "$CACHED_PROXY/api/v1/activities/1"
run sold-out "$CACHED_PROXY/api/v1/activities/2/purchase" -s "$STACK_OUT/soldout.lua"

{
	echo "| path | req/s | vs today | Redis reads of sale state per request |"
	echo "|---|---|---|---|"
	for n in today flight backend proxy-cache sold-out; do
		printf '| %s | %s | %s | %s |\n' "$n" "${RPS[$n]}" \
			"$(awk -v a="${RPS[$n]}" -v b="${RPS[today]}" 'BEGIN { printf "%.2f×", a / b }')" "${READS[$n]}"
	done
	echo
	echo "wrk -t$THREADS -c$CONNS -d$DURATION, one run, $(nproc) cores shared with the whole stack; today = ${TODAY_REF:-dff384c}"
} | tee "$STACK_OUT/bench-read.md"
