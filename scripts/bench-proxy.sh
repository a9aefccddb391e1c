#!/usr/bin/env bash
# bench-proxy: one run, side by side, with wrk:
#   direct       the upstream itself
#   passthrough  a bare fasthttp pass-through (no limits)
#   proxy        seckill proxy, a per-IP and a global rule that never trigger
#   nginx        nginx + limit_req (burst large enough never to reject)
#   proxy-429    seckill proxy answering 429 (per-IP limit exhausted)
# prints requests/s, p50/p99, ratios and Redis calls per forwarded request.
# Env: DURATION (8s), CONNS (64), THREADS (2), REDIS_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8s} CONNS=${CONNS:-64} THREADS=${THREADS:-2}
REDIS_CLI=(redis-cli -u "${REDIS_URL:-redis://127.0.0.1:6379/0}")

need() { command -v "$1" >/dev/null 2>&1; }
if ! need wrk || ! need nginx; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk nginx-light >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
  "${REDIS_CLI[@]}" --scan --pattern "${PREFIX}*" | xargs -r "${REDIS_CLI[@]}" del >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
PREFIX="benchproxy_$$_"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 not up" >&2; return 1; }

go build -o "$work/proxy" ./proxy
go build -o "$work/benchserver" ./proxy/benchserver

UP=$(port); PT=$(port); PX=$(port); PXA=$(port); P4=$(port); P4A=$(port); NG=$(port)
"$work/benchserver" -mode upstream -listen "127.0.0.1:$UP" & pids+=($!)
wait_port "$UP"
"$work/benchserver" -mode passthrough -listen "127.0.0.1:$PT" -target "127.0.0.1:$UP" & pids+=($!)

proxy_conf() { # file listen admin perip global
  cat >"$1" <<TOML
[redis]
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
"$work/proxy" -config "$work/px.toml" 2>"$work/px.log" & pids+=($!)
"$work/proxy" -config "$work/p4.toml" 2>"$work/p4.log" & pids+=($!)

cat >"$work/nginx.conf" <<NGX
worker_processes 2;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  limit_req_zone \$binary_remote_addr zone=perip:10m rate=10000000r/s;
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
}
NGX
"$NGINX" -c "$work/nginx.conf" -p "$work" -e "$work/nginx.err"
for p in "$PT" "$PX" "$P4" "$NG"; do wait_port "$p"; done
curl -s -o /dev/null "http://127.0.0.1:$P4/" || true # spend the one slot

calls() { "${REDIS_CLI[@]}" info commandstats | awk -F'[:=,]' '/^cmdstat_(evalsha|eval):/ {s+=$3} END {print s+0}'; }

declare -A RPS P50 P99 REQS
bench() { # name url
  local out
  wrk -t"$THREADS" -c"$CONNS" -d1s "$2" >/dev/null 2>&1 || true # warm up
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$2")
  RPS[$1]=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  P50[$1]=$(awk '$1=="50%" {print $2}' <<<"$out")
  P99[$1]=$(awk '$1=="99%" {print $2}' <<<"$out")
  REQS[$1]=$(awk '/requests in/ {print $1}' <<<"$out")
  if grep -q "Non-2xx" <<<"$out"; then NON2XX[$1]=$(awk '/Non-2xx/ {print $NF}' <<<"$out"); fi
}
declare -A NON2XX
bench direct "http://127.0.0.1:$UP/"
bench passthrough "http://127.0.0.1:$PT/"
before=$(calls)
bench proxy "http://127.0.0.1:$PX/"
after=$(calls)
bench nginx "http://127.0.0.1:$NG/"
bench proxy-429 "http://127.0.0.1:$P4/"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
printf '\n%-12s %12s %10s %10s %10s  %s\n' target "req/s" p50 p99 non-2xx "ratio"
for n in direct passthrough proxy nginx proxy-429; do
  case $n in
    proxy) r="$(ratio "${RPS[proxy]}" "${RPS[nginx]}")x nginx, $(ratio "${RPS[proxy]}" "${RPS[passthrough]}")x passthrough" ;;
    proxy-429) r="$(ratio "${RPS[proxy-429]}" "${RPS[direct]}")x direct" ;;
    *) r="$(ratio "${RPS[$n]}" "${RPS[direct]}")x direct" ;;
  esac
  printf '%-12s %12s %10s %10s %10s  %s\n' "$n" "${RPS[$n]}" "${P50[$n]}" "${P99[$n]}" "${NON2XX[$n]:-0}" "$r"
done
echo
# Warm-up requests of the proxy run also called Redis; they are not counted
# in REQS, so the figure errs high.
echo "redis calls per forwarded request (proxy run): $(awk -v c="$((after - before))" -v r="${REQS[proxy]}" 'BEGIN { printf "%.5f (%d calls / %d requests)", c / r, c, r }')"
