#!/usr/bin/env bash
# bench-proxy: one run, side by side, with wrk:
#   direct       the upstream itself
#   passthrough  a bare fasthttp pass-through (no limits)
#   proxy        seckill proxy, a per-IP and a global rule that never trigger
#   nginx        nginx + limit_req (burst large enough never to reject)
#   proxy-429    seckill proxy answering 429 (per-IP limit exhausted)
# then a crowd (benchserver -mode crowd): CROWD_CLIENTS distinct source
# addresses on 127.0.0.0/8, one keep-alive connection each, against
#   crowd-proxy  seckill proxy, per-IP 5/1s and a binding global limit
#   crowd-nginx  nginx + limit_req with the same limits (burst 4 nodelay)
# prints requests/s, p50/p99, ratios and Redis calls per request.
# Env: SKIP_WRK (set: the crowd only), DURATION (8s), CONNS (64), THREADS (2), REDIS_URL, CROWD_CLIENTS
# (10000), CROWD_DURATION (5s), CROWD_GLOBAL (3000 per second),
# CROWD_REDIS_TIMEOUT (2s).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8s} CONNS=${CONNS:-64} THREADS=${THREADS:-2}
CROWD_CLIENTS=${CROWD_CLIENTS:-10000} CROWD_DURATION=${CROWD_DURATION:-5s} CROWD_GLOBAL=${CROWD_GLOBAL:-3000}

need() { command -v "$1" >/dev/null 2>&1; }
if ! need wrk || ! need nginx; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk nginx-light >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

work=$(mktemp -d)
pids=()
cleanup() {
  if [ -n "${REDIS_CLI+x}" ]; then
    "${REDIS_CLI[@]}" --scan --pattern "${PREFIX}*" | xargs -r "${REDIS_CLI[@]}" del >/dev/null 2>&1 || true
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
PREFIX="benchproxy_$$_"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 not up" >&2; return 1; }

go build -o "$work/proxy" ./proxy
go build -o "$work/benchserver" ./proxy/benchserver

# Our own redis-server unless REDIS_URL is given: the Redis call counts
# (commandstats) are then this run's alone.
if [ -z "${REDIS_URL:-}" ] && need redis-server; then
  RP=$(port)
  redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --daemonize no >"$work/redis.log" 2>&1 & pids+=($!)
  REDIS_URL="redis://127.0.0.1:$RP/0"
  for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.05; done
fi
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
REDIS_CLI=(redis-cli -u "$REDIS_URL")

UP=$(port); PT=$(port); PX=$(port); PXA=$(port); P4=$(port); P4A=$(port); NG=$(port); PC=$(port); PCA=$(port); NC=$(port)
"$work/benchserver" -mode upstream -listen "127.0.0.1:$UP" & pids+=($!)
UP_PID=$!
wait_port "$UP"
"$work/benchserver" -mode passthrough -listen "127.0.0.1:$PT" -target "127.0.0.1:$UP" & pids+=($!)
PT_PID=$!

proxy_conf() { # file listen admin perip global
  cat >"$1" <<TOML
[redis]
url = "$REDIS_URL"
key_prefix = "$PREFIX"
[proxy]
listen = "127.0.0.1:$2"
admin_listen = "127.0.0.1:$3"
upstreams = ["http://127.0.0.1:$UP"]
[[proxy.rules]]
name = "bench"
path_prefix = "/"
per_ip = { limit = $4, window = "1s" }
global = { limit = $5, window = "1s" }
TOML
}
proxy_conf "$work/px.toml" "$PX" "$PXA" 10000000 10000000
proxy_conf "$work/p4.toml" "$P4" "$P4A" 1 10000000
sed -i 's/window = "1s" }$/window = "1h" }/' "$work/p4.toml"
proxy_conf "$work/pc.toml" "$PC" "$PCA" 5 "$CROWD_GLOBAL"
# A crowd of this size saturates a small machine (10,000 new clients arrive
# at once, each needing its first call, while the Redis server competes for
# the same cores): give Redis calls room (CROWD_REDIS_TIMEOUT; the default
# 20ms suits an unloaded host), and report below if any decision still fell
# back to on_redis_error.
sed -i "s/^upstreams = .*/&\nredis_timeout = \"${CROWD_REDIS_TIMEOUT:-2s}\"/" "$work/pc.toml"
# The crowd holds CROWD_CLIENTS connections open at each server.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" -lt $((CROWD_CLIENTS + 512)) ]; then
  echo "bench-proxy: open-file limit $(ulimit -n) is too low for a crowd of $CROWD_CLIENTS; set CROWD_CLIENTS lower" >&2
  exit 1
fi
"$work/proxy" -config "$work/pc.toml" 2>"$work/pc.log" & pids+=($!)
"$work/proxy" -config "$work/px.toml" 2>"$work/px.log" & pids+=($!)
PX_PID=$!
"$work/proxy" -config "$work/p4.toml" 2>"$work/p4.log" & pids+=($!)
P4_PID=$!

cat >"$work/nginx.conf" <<NGX
worker_processes 2;
worker_rlimit_nofile $((CROWD_CLIENTS * 2 + 1024));
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections $((CROWD_CLIENTS * 2 + 1024)); }
http {
  access_log off;
  limit_req_zone \$binary_remote_addr zone=perip:10m rate=10000000r/s;
  limit_req_zone \$binary_remote_addr zone=crowdip:32m rate=5r/s;
  limit_req_zone \$server_port zone=crowdg:1m rate=${CROWD_GLOBAL}r/s;
  upstream up { server 127.0.0.1:$UP; keepalive 128; }
  server {
    listen 127.0.0.1:$NG;
    location / {
      limit_req zone=perip burst=10000000 nodelay;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_pass http://up;
    }
  }
  server {
    listen 127.0.0.1:$NC backlog=4096;
    location / {
      limit_req zone=crowdip burst=4 nodelay;
      limit_req zone=crowdg burst=$((CROWD_GLOBAL - 1)) nodelay;
      limit_req_status 429;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_pass http://up;
    }
  }
}
NGX
"$NGINX" -c "$work/nginx.conf" -p "$work" -e "$work/nginx.err"
for p in "$PT" "$PX" "$P4" "$NG" "$PC" "$NC"; do wait_port "$p"; done
curl -s -o /dev/null "http://127.0.0.1:$P4/" || true # spend the one slot

calls() { "${REDIS_CLI[@]}" info commandstats | awk -F'[:=,]' '/^cmdstat_(evalsha|eval):/ {s+=$3} END {print s+0}'; }

# cpu_ticks PID... — user + system clock ticks of the processes so far
# (/proc/PID/stat fields 14 and 15; the names here hold no spaces).
cpu_ticks() { local p t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
HZ=$(getconf CLK_TCK)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
declare -A RPS P50 P99 REQS CPU
bench() { # name url pid... (the server under test, whose CPU per request is counted)
  local out c0 c1 name=$1 url=$2
  shift 2
  wrk -t"$THREADS" -c"$CONNS" -d1s "$url" >/dev/null 2>&1 || true # warm up
  c0=$(cpu_ticks "$@")
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$url")
  c1=$(cpu_ticks "$@")
  set -- "$name" "$url"
  RPS[$1]=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  P50[$1]=$(awk '$1=="50%" {print $2}' <<<"$out")
  P99[$1]=$(awk '$1=="99%" {print $2}' <<<"$out")
  REQS[$1]=$(awk '/requests in/ {print $1}' <<<"$out")
  if grep -q "Non-2xx" <<<"$out"; then NON2XX[$1]=$(awk '/Non-2xx/ {print $NF}' <<<"$out"); fi
  CPU[$1]=$(awk -v t="$((c1 - c0))" -v hz="$HZ" -v r="${REQS[$1]}" 'BEGIN { if (r > 0) printf "%.1f", t * 1e6 / hz / r; else print "n/a" }')
}
declare -A NON2XX
if [ -z "${SKIP_WRK:-}" ]; then
load0=$(cut -d' ' -f1-3 /proc/loadavg)
bench direct "http://127.0.0.1:$UP/" "$UP_PID"
bench passthrough "http://127.0.0.1:$PT/" "$PT_PID"
before=$(calls)
bench proxy "http://127.0.0.1:$PX/" "$PX_PID"
after=$(calls)
# nginx: its workers (children of the master).
bench nginx "http://127.0.0.1:$NG/" $(pgrep -P "$(cat "$work/nginx.pid")")
bench proxy-429 "http://127.0.0.1:$P4/" "$P4_PID"
load1=$(cut -d' ' -f1-3 /proc/loadavg)

printf '\n%-12s %12s %10s %10s %10s %12s  %s\n' target "req/s" p50 p99 non-2xx "cpu us/req" "ratio"
for n in direct passthrough proxy nginx proxy-429; do
  case $n in
    proxy) r="$(ratio "${RPS[proxy]}" "${RPS[nginx]}")x nginx, $(ratio "${RPS[proxy]}" "${RPS[passthrough]}")x passthrough" ;;
    proxy-429) r="$(ratio "${RPS[proxy-429]}" "${RPS[direct]}")x direct" ;;
    *) r="$(ratio "${RPS[$n]}" "${RPS[direct]}")x direct" ;;
  esac
  printf '%-12s %12s %10s %10s %10s %12s  %s\n' "$n" "${RPS[$n]}" "${P50[$n]}" "${P99[$n]}" "${NON2XX[$n]:-0}" "${CPU[$n]}" "$r"
done
echo "(cpu us/req: user + system time of the server under test per request (direct: the upstream; nginx: its workers), the upstream's not included;"
echo " $CONNS connections, $THREADS wrk threads, $DURATION each; load average $load0 before, $load1 after)"
echo
# Warm-up requests of the proxy run also called Redis; they are not counted
# in REQS, so the figure errs high.
echo "redis calls per forwarded request (proxy run): $(awk -v c="$((after - before))" -v r="${REQS[proxy]}" 'BEGIN { printf "%.5f (%d calls / %d requests)", c / r, c, r }')"
# On a loaded machine Redis calls may outlast redis_timeout: those decisions
# fell back to on_redis_error (their cost is not the lease path's).
pxdeg=$(curl -s "http://127.0.0.1:$PXA/metrics" | awk '/^seckill_proxy_decisions_total\{outcome="degraded"/ {d+=$2} /^seckill_proxy_decisions_total\{/ {t+=$2} END {printf "%d of %d", d, t}')
echo "proxy decisions that fell back to on_redis_error (proxy run, warm-up included): $pxdeg"
fi

# The crowd: one short run each, the proxy first (Redis calls counted).
declare -A CROWD
crowd() { # name port
  local out
  out=$("$work/benchserver" -mode crowd -target "127.0.0.1:$2" -clients "$CROWD_CLIENTS" -duration "$CROWD_DURATION")
  while read -r k v; do CROWD[$1.$k]=$v; done <<<"$out"
}
before=$(calls)
crowd crowd-proxy "$PC"
after=$(calls)
sleep 1
crowd crowd-nginx "$NC"
echo
printf '%-12s %8s %12s %10s %10s %10s %10s  %s\n' target clients "req/s" 2xx 429 p50 p99 ratio
for n in crowd-proxy crowd-nginx; do
  r=""
  [ $n = crowd-proxy ] && r="$(ratio "${CROWD[crowd-proxy.rps]}" "${CROWD[crowd-nginx.rps]}")x nginx"
  printf '%-12s %8s %12s %10s %10s %10s %10s  %s\n' "$n" "${CROWD[$n.clients]}" "${CROWD[$n.rps]}" "${CROWD[$n.2xx]}" "${CROWD[$n.429]}" "${CROWD[$n.p50]}" "${CROWD[$n.p99]}" "$r"
done
degraded=$(curl -s "http://127.0.0.1:$PCA/metrics" | awk '/^seckill_proxy_decisions_total\{outcome="degraded"/ {s+=$2} END {print s+0}')
echo "crowd-proxy decisions that fell back to on_redis_error: $degraded"
if [ "$degraded" != 0 ]; then grep -m1 'degraded' "$work/pc.log" || true; fi
echo "redis calls per request (crowd-proxy): $(awk -v c="$((after - before))" -v r="${CROWD[crowd-proxy.requests]}" -v n="$CROWD_CLIENTS" 'BEGIN { printf "%.5f (%d calls / %d requests; %.2f per client)", c / r, c, r, c / n }')"
