#!/usr/bin/env bash
# bench-proxy: the seckill proxy beside nginx + limit_req and HAProxy (stick
# tables), on one box, in one run. Two parts:
#
# 1. The forward path (wrk, CONNS connections from 127.0.0.1, DURATION each):
#      direct       the upstream itself
#      passthrough  a bare fasthttp pass-through (no limits)
#      proxy        seckill proxy, a per-IP and a global rule that never trigger
#      nginx        nginx + limit_req, the same two limits (never reject)
#      haproxy      HAProxy, stick tables with sc_http_req_rate, the same two
#      proxy-429    seckill proxy answering 429 (per-IP limit exhausted)
#    (and proxy(base), proxy(base)-429 with BASE_PROXY_BIN). Per row: req/s,
#    p50/p99, CPU per request of the server under test and, for the proxy,
#    of redis-server too (this run's own redis-server unless REDIS_URL is
#    given), and Redis commands per request (every command: the sum of all
#    cmdstat_* calls of INFO commandstats, not only EVAL/EVALSHA). Ratios:
#    proxy vs nginx, vs haproxy, vs passthrough (req/s and CPU per request);
#    proxy-429 vs direct.
#
# 2. The scaling table (benchserver -mode crowd: each client its own source
#    address on 127.0.0.0/8 with one keep-alive connection): for each crowd
#    size (CROWD_SIZES) x global window binding (CROWD_GLOBAL per second) or
#    not (CROWD_GLOBAL_OPEN per second) x target, with the per-IP limit
#    CROWD_PERIP/1s binding everywhere:
#      proxy x2      two proxy instances sharing one Redis, the crowd split
#                    over them (client i to instance i mod 2)
#      nginx         nginx + limit_req
#      haproxy       HAProxy, the usual recipe: sc_http_req_rate per source
#                    and on a constant key (counts refused requests too)
#      haproxy-adm   HAProxy counting admitted requests only (gpc0_rate,
#                    incremented after both checks passed): the meaning of
#                    the proxy's and nginx's limits
#    (and proxy(base) x2 with BASE_PROXY_BIN). Per cell: req/s, p50, p99,
#    admitted (2xx) vs what the limits allow (min(clients x per-IP limit,
#    global limit) per 1 s window, times the windows from the first request
#    sent to the last answer), 429s, 503s, other answers, decisions fallen
#    back to on_redis_error, the fallbacks by reason (timeout/error/
#    breaker_open), sheds, Redis commands per client per window, CPU per
#    request (proxy: both instances + redis-server), then the proxy's
#    req/s, p50 and p99 as ratios to each other target's. A size a target cannot hold within the
#    open-file hard limit (the load generator needs one descriptor per
#    client, nginx and HAProxy two) is skipped with a line saying so.
#
# How exact each peer is (the limits are the same, their meaning is not):
#   proxy    sliding windows in Redis shared by every instance (docs/limiter.md:
#            every interval of length W admits <= limit, all instances together)
#   nginx    limit_req is a leaky bucket per nginx instance: rate r with
#            burst b admits b+1 at once, then one every 1/r; any interval of
#            length W may admit up to b+1 + r*W (about twice the limit), the
#            long-run average is exact
#   haproxy  http_req_rate(1s) / gpc0_rate(1s) is a "sliding-ish" counter: the
#            current period's count plus the previous one's weighted by what
#            is left of the period; approximate at period edges, per process;
#            sc_http_req_rate counts every request tracked (a client that keeps
#            sending above its limit stays refused), the -adm form counts
#            admitted ones but checks and increments in two steps (threads
#            may both pass the check)
#
# Metrics read from each proxy's admin /metrics (deltas over each run; labels
# matched in any order; a series not there counts 0; "n/a" when the binary
# does not know the metric at all, i.e. its name is neither in /metrics nor
# in the binary):
#   seckill_proxy_decisions_total{rule,outcome}  outcome=degraded: fell back
#                                                to on_redis_error
#   seckill_proxy_limiter_fallbacks_total{reason} timeout|error|breaker_open
#   seckill_proxy_limiter_shed_total{reason}      sheds under load
#   seckill_proxy_local_cache_hits_total{kind}    printed when present
#
# Env:
#   PROXY_BIN          proxy binary to measure (default: go build ./proxy)
#   BASE_PROXY_BIN     a second proxy binary: adds proxy(base) rows and
#                      proxy(base) x2 cells (old vs new in one run)
#   SKIP_WRK           set: no forward path      SKIP_CROWD  set: no crowd
#   DURATION (8s) CONNS (64) THREADS (2)         the wrk runs
#   FWD_REDIS_TIMEOUT  the forward-path proxies' redis_timeout (default: the
#                      build's); a run whose decisions mostly fell back to
#                      on_redis_error is flagged with a WARNING line
#   REDIS_URL          use this Redis (default: start our own redis-server;
#                      its commands and CPU are then this run's alone)
#   CROWD_SIZES        ("1000 5000 9000"; CROWD_CLIENTS, the old knob, if set
#                      and CROWD_SIZES is not, is the one size)
#   CROWD_MODES        ("binding open") which global windows to run
#   CROWD_TARGETS      ("proxy nginx haproxy haproxy-adm"; proxy(base) is
#                      added when BASE_PROXY_BIN is set)
#   CROWD_DURATION (5s) CROWD_PERIP (5 per 1s) CROWD_GLOBAL (3000 per 1s)
#   CROWD_GLOBAL_OPEN (10000000 per 1s) CROWD_PAUSE (2s between cells: the
#                      1 s windows of the same addresses lapse)
#   CROWD_REDIS_TIMEOUT (2s) the crowd proxies' redis_timeout; empty: the
#                      build's default
# Wall time with the defaults: about 5-6 minutes (forward path ~1 min, the
# crowd ~24 cells of ~10 s).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8s} CONNS=${CONNS:-64} THREADS=${THREADS:-2}
CROWD_SIZES=${CROWD_SIZES:-${CROWD_CLIENTS:-1000 5000 9000}}
CROWD_MODES=${CROWD_MODES:-binding open}
CROWD_TARGETS=${CROWD_TARGETS:-proxy nginx haproxy haproxy-adm}
CROWD_DURATION=${CROWD_DURATION:-5s} CROWD_PERIP=${CROWD_PERIP:-5}
CROWD_GLOBAL=${CROWD_GLOBAL:-3000} CROWD_GLOBAL_OPEN=${CROWD_GLOBAL_OPEN:-10000000}
CROWD_PAUSE=${CROWD_PAUSE:-2}
CROWD_REDIS_TIMEOUT=${CROWD_REDIS_TIMEOUT-2s} FWD_REDIS_TIMEOUT=${FWD_REDIS_TIMEOUT:-}
[ -n "${BASE_PROXY_BIN:-}" ] && CROWD_TARGETS="${CROWD_TARGETS/proxy/proxy proxy(base)}"
T0=$(date +%s)

need() { command -v "$1" >/dev/null 2>&1; }
if ! need wrk || ! need nginx || ! need haproxy; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk nginx-light haproxy >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)

work=$(mktemp -d)
pids=()
cleanup() {
  if [ -n "${REDIS_CLI+x}" ] && [ -z "${OWN_REDIS:-}" ]; then
    "${REDIS_CLI[@]}" --scan --pattern "${PREFIX}*" | xargs -r "${REDIS_CLI[@]}" del >/dev/null 2>&1 || true
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -f "$work/nginx.pid" ]; then kill "$(cat "$work/nginx.pid")" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
PREFIX="benchproxy_$$_"

# port: a free port below the ephemeral range (an ephemeral one, free when
# chosen, may be taken by an outgoing connection, of the crowd's thousands
# say, before the server meant for it binds it), never one handed out before
# in this run ($work/ports).
port() {
  PORTS="$work/ports" python3 - <<'PY'
import os, random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
lo, hi = (10000, lo - 1) if lo > 12000 else (61000, 65535)
used = set(open(os.environ["PORTS"]).read().split()) if os.path.exists(os.environ["PORTS"]) else set()
for _ in range(1000):
    p = random.randint(lo, hi)
    if str(p) in used:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    open(os.environ["PORTS"], "a").write("%d\n" % p)
    print(p)
    break
PY
}
wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 not up" >&2; return 1; }

if [ -n "${PROXY_BIN:-}" ]; then
  PROXY=$(readlink -f "$PROXY_BIN")
else
  go build -o "$work/proxy" ./proxy
  PROXY=$work/proxy
fi
BASE=""
[ -n "${BASE_PROXY_BIN:-}" ] && BASE=$(readlink -f "$BASE_PROXY_BIN")
go build -o "$work/benchserver" ./proxy/benchserver

# The open-file hard limit bounds the crowd (it cannot be raised here).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
HARD=$(ulimit -Hn)
[ "$HARD" = unlimited ] && HARD=1048576

# Our own redis-server unless REDIS_URL is given: the Redis command counts
# (commandstats) and its CPU are then this run's alone.
REDIS_PID=""
if [ -z "${REDIS_URL:-}" ] && need redis-server; then
  RP=$(port)
  redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --daemonize no >"$work/redis.log" 2>&1 &
  pids+=($!)
  REDIS_PID=$! OWN_REDIS=1
  REDIS_URL="redis://127.0.0.1:$RP/0"
  for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.05; done
fi
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
REDIS_CLI=(redis-cli -u "$REDIS_URL")
REDIS_NOTE="this run's own redis-server"
if [ -z "$REDIS_PID" ]; then
  # A given Redis: its PID when it runs on this box (its CPU and commands
  # then include everyone else's).
  p=$("${REDIS_CLI[@]}" info server 2>/dev/null | awk -F: '/^process_id:/ {print $2}' | tr -d '\r')
  if [ -n "$p" ] && grep -q redis "/proc/$p/comm" 2>/dev/null; then REDIS_PID=$p; fi
  REDIS_NOTE="the shared Redis at $REDIS_URL (pid ${REDIS_PID:-unknown}): its CPU and commands include other clients'"
fi

UP=$(port); PT=$(port)
"$work/benchserver" -mode upstream -listen "127.0.0.1:$UP" &
pids+=($!)
UP_PID=$!
wait_port "$UP"
"$work/benchserver" -mode passthrough -listen "127.0.0.1:$PT" -target "127.0.0.1:$UP" &
pids+=($!)
PT_PID=$!

# ---------------------------------------------------------------- proxies
declare -A PPID_ ADM LISTEN BIN
proxy_conf() { # file listen admin prefix perip perip_window global [redis_timeout]
  local rt=""
  [ -n "${8:-}" ] && rt="redis_timeout = \"$8\""
  cat >"$1" <<TOML
[redis]
url = "$REDIS_URL"
key_prefix = "$4"
[proxy]
listen = "127.0.0.1:$2"
admin_listen = "127.0.0.1:$3"
upstreams = ["http://127.0.0.1:$UP"]
$rt
[[proxy.rules]]
name = "bench"
path_prefix = "/"
per_ip = { limit = $5, window = "$6" }
global = { limit = $7, window = "1s" }
TOML
}
# start_proxy NAME BINARY PREFIX PERIP PERIP_WINDOW GLOBAL [REDIS_TIMEOUT]
start_proxy() {
  local n=$1 l a
  l=$(port) a=$(port)
  proxy_conf "$work/$n.toml" "$l" "$a" "$3" "$4" "$5" "$6" "${7:-}"
  "$2" -config "$work/$n.toml" 2>"$work/$n.log" &
  pids+=($!)
  PPID_[$n]=$! ADM[$n]=$a LISTEN[$n]=$l BIN[$n]=$2
}
# ready NAME...: wait until each answers /readyz 200 (its stock-event
# subscription is confirmed), at most 5 s each.
ready() {
  local n
  for n in "$@"; do
    wait_port "${LISTEN[$n]}" || { echo "bench-proxy: $n does not listen: $(tail -n 3 "$work/$n.log" | tr '\n' ' ')" >&2; continue; }
    for _ in $(seq 100); do
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${ADM[$n]}/readyz")" = 200 ] && continue 2
      sleep 0.05
    done
    echo "bench-proxy: $n not ready after 5 s (see its log); measuring anyway" >&2
  done
}
stop_proxy() {
  local n
  for n in "$@"; do
    kill -0 "${PPID_[$n]}" 2>/dev/null || echo "bench-proxy: proxy $n (${BIN[$n]}) had exited before the end of its run: $(tail -n 3 "$work/$n.log" | tr '\n' ' ')" >&2
    kill -KILL "${PPID_[$n]}" 2>/dev/null || true
    wait "${PPID_[$n]}" 2>/dev/null || true
  done
}

# ---------------------------------------------------------------- metrics
# scrape FILE NAME...: the admin /metrics of the proxies NAME... into FILE.
scrape() {
  local f=$1 n
  shift
  : >"$f"
  for n in "$@"; do curl -s -m 5 "http://127.0.0.1:${ADM[$n]}/metrics" >>"$f" || true; done
}
# msum NAME [label=value...] < metrics: the sum of NAME's series whose
# labels include every label=value given (labels in any order); 0 when none.
msum() {
  local name=$1
  shift
  awk -v name="$name" -v want="$*" '
    BEGIN { nw = split(want, w, " ") }
    /^#/ || NF < 2 { next }
    {
      i = index($0, "{")
      if (i > 0) {
        n = substr($0, 1, i - 1)
        if (n != name) next
        rest = substr($0, i + 1); k = 0
        for (p = length(rest); p > 0; p--) if (substr(rest, p, 1) == "}") { k = p; break }
        if (k == 0) next
        labels = substr(rest, 1, k - 1); split(substr(rest, k + 1), f, " "); v = f[1]
      } else {
        if ($1 != name) next
        labels = ""; v = $2
      }
      split("", have); m = split(labels, l, ",")
      for (q = 1; q <= m; q++) {
        e = index(l[q], "="); if (!e) continue
        key = substr(l[q], 1, e - 1); gsub(/^[ \t]+|[ \t]+$/, "", key)
        val = substr(l[q], e + 1); gsub(/^[ \t]*"|"[ \t]*$/, "", val); have[key] = val
      }
      for (q = 1; q <= nw; q++) {
        e = index(w[q], "="); key = substr(w[q], 1, e - 1)
        if (!(key in have) || have[key] != substr(w[q], e + 1)) next
      }
      s += v
    }
    END { printf "%.0f\n", s }'
}
# mdelta NAME [label=value...]: msum over the after files minus the before files
# (globals MB, MA: arrays of metric files).
mdelta() { echo $(($(cat "${MA[@]}" | msum "$@") - $(cat "${MB[@]}" | msum "$@"))); }
# knows FAMILY BINARY: the build has this metric (seen in a scrape, or its
# name, or its name without the seckill_proxy_ namespace, is in the binary).
knows() { grep -q "^$1" "${MA[@]}" 2>/dev/null || grep -qa -e "$1" -e "${1#seckill_proxy_}" "$2"; }
# limiter_figures BINARY: "degraded fallbacks(t/e/b) sheds" of the run
# between MB and MA (n/a where the build cannot say).
limiter_figures() {
  local deg fb sh
  deg=$(mdelta seckill_proxy_decisions_total outcome=degraded)
  if knows seckill_proxy_limiter_fallbacks_total "$1"; then
    fb="$(mdelta seckill_proxy_limiter_fallbacks_total reason=timeout)/$(mdelta seckill_proxy_limiter_fallbacks_total reason=error)/$(mdelta seckill_proxy_limiter_fallbacks_total reason=breaker_open)"
  else fb=n/a; fi
  if knows seckill_proxy_limiter_shed_total "$1"; then sh=$(mdelta seckill_proxy_limiter_shed_total); else sh=n/a; fi
  echo "$deg $fb $sh"
}
# hits_line: the local-cache hits by kind and the limiter's own script
# calls by result (ok, error, breaker_open: skipped) of the run, when the
# build has them.
hits_line() {
  local kinds k s=""
  kinds=$(cat "${MA[@]}" | sed -n 's/^seckill_proxy_local_cache_hits_total{.*kind="\([^"]*\)".*/\1/p' | sort -u)
  for k in $kinds; do s+=" $k=$(mdelta seckill_proxy_local_cache_hits_total kind="$k")"; done
  kinds=$(cat "${MA[@]}" | sed -n 's/^seckill_proxy_redis_calls_total{.*result="\([^"]*\)".*/\1/p' | sort -u)
  for k in $kinds; do s+=" redis-calls-$k=$(mdelta seckill_proxy_redis_calls_total result="$k")"; done
  echo "${s# }"
}

# Redis commands so far: every cmdstat_* calls (each INFO read is itself one
# command, counted by the next read: callers subtract 1 per read between).
rcalls() { "${REDIS_CLI[@]}" info commandstats | awk -F'[:=,]' '/^cmdstat_/ {s+=$3} END {printf "%.0f\n", s}'; }
rcalls_by() { "${REDIS_CLI[@]}" info commandstats | awk -F'[:=,]' '/^cmdstat_/ {sub(/^cmdstat_/, "", $1); print $1, $3}' | LC_ALL=C sort; }
# cpu_ticks PID... — user + system clock ticks of the processes so far
# (/proc/PID/stat fields 14 and 15, all threads; the names hold no spaces).
cpu_ticks() { local p t=0; for p in "$@"; do [ -n "$p" ] && [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
HZ=$(getconf CLK_TCK)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0 && a != "") printf "%.2f", a / b; else print "n/a" }'; }
per() { awk -v t="$1" -v r="$2" -v k="${3:-1}" 'BEGIN { if (r > 0) printf "%.1f", t * k / r; else print "n/a" }'; }

# ---------------------------------------------------------------- nginx, HAProxy
NG=$(port) HF=$(port)
declare -A NGC HAC
for m in $CROWD_MODES; do NGC[$m]=$(port) HAC[$m.haproxy]=$(port) HAC[$m.haproxy-adm]=$(port); done
glimit() { if [ "$1" = binding ]; then echo "$CROWD_GLOBAL"; else echo "$CROWD_GLOBAL_OPEN"; fi; }
maxsize=0
for n in $CROWD_SIZES; do [ "$n" -gt "$maxsize" ] && maxsize=$n; done
# nginx: two descriptors per client (its upstream connections beyond the 128
# kept alive), in whichever worker takes them.
ngfd=$((2 * maxsize + 1024)) && [ "$ngfd" -gt "$HARD" ] && ngfd=$HARD
# HAProxy sizes its descriptors from maxconn (2 per connection + its own).
hamax=$(((HARD - 512) / 2)) && [ "$hamax" -gt $((maxsize + 1024)) ] && hamax=$((maxsize + 1024))
{
  cat <<NGX
worker_processes 2;
worker_rlimit_nofile $ngfd;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections $((ngfd - 32)); }
http {
  access_log off;
  limit_req_status 429;
  upstream up { server 127.0.0.1:$UP; keepalive 128; }
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
  # the forward path: the proxy's two limits, never reached
  limit_req_zone \$binary_remote_addr zone=fwdip:10m rate=10000000r/s;
  limit_req_zone \$server_port zone=fwdg:1m rate=10000000r/s;
  server {
    listen 127.0.0.1:$NG;
    location / {
      limit_req zone=fwdip burst=10000000 nodelay;
      limit_req zone=fwdg burst=10000000 nodelay;
      proxy_pass http://up;
    }
  }
NGX
  for m in $CROWD_MODES; do
    g=$(glimit "$m")
    cat <<NGX
  # crowd, global $m: per-IP $CROWD_PERIP/1s (burst $((CROWD_PERIP - 1)) nodelay: $CROWD_PERIP at once), global $g/1s
  limit_req_zone \$binary_remote_addr zone=ip_$m:32m rate=${CROWD_PERIP}r/s;
  limit_req_zone \$server_port zone=g_$m:1m rate=${g}r/s;
  server {
    listen 127.0.0.1:${NGC[$m]} backlog=4096;
    location / {
      limit_req zone=ip_$m burst=$((CROWD_PERIP - 1)) nodelay;
      limit_req zone=g_$m burst=$((g - 1)) nodelay;
      proxy_pass http://up;
    }
  }
NGX
  done
  echo "}"
} >"$work/nginx.conf"
"$NGINX" -c "$work/nginx.conf" -p "$work" -e "$work/nginx.err"

{
  cat <<HA
global
  maxconn $hamax
  nbthread 2
defaults
  mode http
  maxconn $hamax
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  timeout http-keep-alive 30s
  http-reuse always
backend up
  server up 127.0.0.1:$UP
# the forward path: the proxy's two limits, never reached
backend fwd_ip
  stick-table type ip size 100k expire 10s store http_req_rate(1s)
backend fwd_g
  stick-table type integer size 10 expire 10s store http_req_rate(1s)
frontend fwd
  bind 127.0.0.1:$HF
  http-request track-sc0 src table fwd_ip
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 10000000 }
  http-request track-sc1 int(1) table fwd_g
  http-request deny deny_status 429 if { sc_http_req_rate(1) gt 10000000 }
  default_backend up
HA
  for m in $CROWD_MODES; do
    g=$(glimit "$m")
    cat <<HA
# crowd, global $m, the usual recipe: sc_http_req_rate counts every tracked
# request, refused ones included (the global counter: those past the per-IP check)
backend ip_$m
  stick-table type ip size 200k expire 10s store http_req_rate(1s)
backend g_$m
  stick-table type integer size 10 expire 10s store http_req_rate(1s)
frontend crowd_$m
  bind 127.0.0.1:${HAC[$m.haproxy]} backlog 4096
  http-request track-sc0 src table ip_$m
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt $CROWD_PERIP }
  http-request track-sc1 int(1) table g_$m
  http-request deny deny_status 429 if { sc_http_req_rate(1) gt $g }
  default_backend up
# crowd, global $m, admitted requests only: gpc0 is incremented once both
# checks passed, gpc0_rate(1s) is the admitted rate
backend ipa_$m
  stick-table type ip size 200k expire 10s store gpc0,gpc0_rate(1s)
backend ga_$m
  stick-table type integer size 10 expire 10s store gpc0,gpc0_rate(1s)
frontend crowda_$m
  bind 127.0.0.1:${HAC[$m.haproxy-adm]} backlog 4096
  http-request track-sc0 src table ipa_$m
  http-request track-sc1 int(1) table ga_$m
  http-request deny deny_status 429 if { sc_gpc0_rate(0) ge $CROWD_PERIP }
  http-request deny deny_status 429 if { sc_gpc0_rate(1) ge $g }
  http-request sc-inc-gpc0(0)
  http-request sc-inc-gpc0(1)
  default_backend up
HA
  done
} >"$work/haproxy.cfg"
"$HAPROXY" -c -q -f "$work/haproxy.cfg"
"$HAPROXY" -db -f "$work/haproxy.cfg" 2>"$work/haproxy.log" &
pids+=($!)
HA_PID=$!
for p in "$PT" "$NG" "$HF"; do wait_port "$p"; done
ng_workers() { pgrep -P "$(cat "$work/nginx.pid")" | tr '\n' ' '; }

echo "bench-proxy: proxy $PROXY${BASE:+, base $BASE}; Redis: $REDIS_NOTE; open-file hard limit $HARD"

# ---------------------------------------------------------------- 1. forward path
declare -A RPS P50 P99 CPU RCPU RCMD RCNT NON2XX LIM HITS TOP
# bench NAME URL PROXYNAME|- PID...: PROXYNAME (a started proxy) adds
# redis-server's CPU, the Redis commands and the limiter's metrics.
bench() {
  local out c0 c1 r0 r1 k0 k1 name=$1 url=$2 px=$3 reqs
  shift 3
  wrk -t"$THREADS" -c"$CONNS" -d1s "$url" >/dev/null 2>&1 || true # warm up
  if [ "$px" != - ]; then
    MB=("$work/mb") MA=("$work/ma")
    scrape "$work/mb" "$px"
    rcalls_by >"$work/cb"
    r0=$(rcalls) k0=$(cpu_ticks "$REDIS_PID")
  fi
  c0=$(cpu_ticks "$@")
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$url") || echo "bench-proxy: wrk against $name failed: $out" >&2
  c1=$(cpu_ticks "$@")
  RPS[$name]=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  P50[$name]=$(awk '$1=="50%" {print $2}' <<<"$out")
  P99[$name]=$(awk '$1=="99%" {print $2}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  NON2XX[$name]=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
  CPU[$name]=$(per $((c1 - c0)) "$reqs" "$((1000000 / HZ))")
  if [ "$px" != - ]; then
    k1=$(cpu_ticks "$REDIS_PID") r1=$(rcalls)
    rcalls_by >"$work/ca"
    scrape "$work/ma" "$px"
    RCPU[$name]=$(if [ -n "$REDIS_PID" ]; then per $((k1 - k0)) "$reqs" "$((1000000 / HZ))"; else echo n/a; fi)
    RCMD[$name]=$(awk -v c="$((r1 - r0 - 1))" -v r="$reqs" 'BEGIN { if (r > 0) printf "%.4f", c / r; else print "n/a" }')
    # the commands of the run by name, most first (the INFO reads left out)
    RCNT[$name]=$((r1 - r0 - 1))
    TOP[$name]=$(LC_ALL=C join -a2 "$work/cb" "$work/ca" | awk 'NF==2 {$3=$2; $2=0} $1!="info" && $3-$2>0 {print $3-$2, $1}' | sort -rn | head -6 | awk '{printf "%s%s=%s", (NR>1 ? ", " : ""), $2, $1}')
    LIM[$name]="$(limiter_figures "${BIN[$px]}") $(mdelta seckill_proxy_decisions_total outcome=admitted) $(mdelta seckill_proxy_decisions_total outcome=limited) $(mdelta seckill_proxy_decisions_total outcome=shadow)"
    HITS[$name]=$(hits_line)
  fi
}
if [ -z "${SKIP_WRK:-}" ]; then
  # Each proxy runs alone, started for its row and stopped after it: the
  # Redis commands and redis-server's CPU are that row's alone.
  # fwd_proxy ROW BINARY PERIP PERIP_WINDOW: start, (429 rows: spend the one
  # slot), bench, stop.
  fwd_proxy() {
    local n=fp$((++fwdn))
    start_proxy "$n" "$2" "${PREFIX}${n}_" "$3" "$4" 10000000 "$FWD_REDIS_TIMEOUT"
    ready "$n"
    [ "$3" = 1 ] && { curl -s -o /dev/null "http://127.0.0.1:${LISTEN[$n]}/" || true; }
    bench "$1" "http://127.0.0.1:${LISTEN[$n]}/" "$n" "${PPID_[$n]}"
    stop_proxy "$n"
    rows+=("$1")
  }
  fwdn=0
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  rows=(direct passthrough)
  bench direct "http://127.0.0.1:$UP/" - "$UP_PID"
  bench passthrough "http://127.0.0.1:$PT/" - "$PT_PID"
  fwd_proxy proxy "$PROXY" 10000000 1s
  [ -n "$BASE" ] && fwd_proxy "proxy(base)" "$BASE" 10000000 1s
  # shellcheck disable=SC2046 # nginx: its workers (children of the master)
  bench nginx "http://127.0.0.1:$NG/" - $(ng_workers)
  bench haproxy "http://127.0.0.1:$HF/" - "$HA_PID"
  rows+=(nginx haproxy)
  fwd_proxy proxy-429 "$PROXY" 1 1h
  [ -n "$BASE" ] && fwd_proxy "proxy(base)-429" "$BASE" 1 1h
  load1=$(cut -d' ' -f1-3 /proc/loadavg)

  echo
  echo "forward path: $CONNS connections from 127.0.0.1, $THREADS wrk threads, $DURATION each"
  printf '%-16s %10s %9s %9s %8s %9s %9s %9s %9s  %s\n' target "req/s" p50 p99 non-2xx "cpu us" "redis us" "sum us" "cmds/req" ratio
  for n in "${rows[@]}"; do
    case $n in
      proxy | "proxy(base)") r="$(ratio "${RPS[$n]}" "${RPS[nginx]}")x nginx, $(ratio "${RPS[$n]}" "${RPS[haproxy]}")x haproxy, $(ratio "${RPS[$n]}" "${RPS[passthrough]}")x passthrough" ;;
      *) r="$(ratio "${RPS[$n]}" "${RPS[direct]}")x direct" ;;
    esac
    sum=${CPU[$n]}
    [ -n "${RCPU[$n]:-}" ] && sum=$(awk -v a="${CPU[$n]}" -v b="${RCPU[$n]}" 'BEGIN { if (b == "n/a") print "n/a"; else printf "%.1f", a + b }')
    printf '%-16s %10s %9s %9s %8s %9s %9s %9s %9s  %s\n' "$n" "${RPS[$n]}" "${P50[$n]}" "${P99[$n]}" "${NON2XX[$n]:-0}" "${CPU[$n]}" "${RCPU[$n]:--}" "$sum" "${RCMD[$n]:--}" "$r"
  done
  echo "(cpu us: user + system CPU per request of the server under test (direct: the upstream; nginx: its workers;"
  echo " haproxy: its process), the upstream's not included; redis us: redis-server's per request, $REDIS_NOTE;"
  echo " cmds/req: every Redis command per request (all cmdstat_* calls: the commands scripts run are counted too, the INFO"
  echo " reads are not); load average $load0 before, $load1 after)"
  for n in proxy "proxy(base)"; do
    [ -n "${RPS[$n]:-}" ] || continue
    s=$(awk -v a="${CPU[$n]}" -v b="${RCPU[$n]}" 'BEGIN { if (b == "n/a") print a; else print a + b }')
    echo "$n CPU per request, proxy + redis-server ($s us): $(ratio "$s" "${CPU[nginx]}")x nginx's, $(ratio "$s" "${CPU[haproxy]}")x haproxy's, $(ratio "$s" "${CPU[passthrough]}")x passthrough's"
  done
  for n in proxy "proxy(base)" proxy-429 "proxy(base)-429"; do
    [ -n "${RPS[$n]:-}" ] || continue
    read -r d fb sh da dl ds <<<"${LIM[$n]}"
    dt=$((da + dl + ds))
    echo "$n: Redis commands ${RCNT[$n]} (${TOP[$n]:-none}); decisions admitted/limited/shadow $da/$dl/$ds, degraded (fell back to on_redis_error) $d, fallbacks timeout/error/breaker_open $fb, sheds $sh${HITS[$n]:+; local hits: ${HITS[$n]}}"
    # A run whose decisions mostly fell back measured the fallback, not the
    # limiter's path (on a loaded box redis_timeout, 20ms by default, is
    # easily outlasted; FWD_REDIS_TIMEOUT gives it room).
    if awk -v d="$d" -v t="$dt" 'BEGIN { exit !(t > 0 && d > 0.01 * t) }'; then
      echo "WARNING: $n: $(awk -v d="$d" -v t="$dt" 'BEGIN { printf "%.0f%%", 100 * d / t }') of its decisions fell back to on_redis_error (redis_timeout ${FWD_REDIS_TIMEOUT:-(the build default)}): its CPU, Redis and req/s figures are in that part the fallback's, not the limiter's"
    fi
  done
fi

# ---------------------------------------------------------------- 2. scaling
# fits TARGET N: empty when a crowd of N fits the open-file hard limit at
# TARGET and at the load generator, else why not.
fits() {
  local need=$(($2 + 256)) who="the load generator (one per client)"
  if [ "$need" -gt "$HARD" ]; then echo "$who needs $need open files"; return; fi
  case $1 in
    nginx) need=$((2 * $2 + 1024)) who="nginx (two per client, in one worker at worst)" ;;
    haproxy*) need=$((2 * $2 + 640)) who="HAProxy (two per client; maxconn the crowd + 64)" ;;
    proxy*) need=$(($2 + 512)) who="each proxy instance (half the crowd, two per client)" ;;
  esac
  [ "$need" -gt "$HARD" ] && echo "$who needs $need open files"
  return 0
}
if [ -z "${SKIP_CROWD:-}" ]; then
  echo
  echo "scaling: crowds of distinct clients (127.0.0.0/8, one keep-alive connection each, sending in a loop for $CROWD_DURATION),"
  echo "per-IP $CROWD_PERIP/1s; global $CROWD_GLOBAL/1s (binding) or $CROWD_GLOBAL_OPEN/1s (open); crowd proxies' redis_timeout ${CROWD_REDIS_TIMEOUT:-(the build default)}"
  printf '%-7s %-7s %-15s %8s %8s %8s %8s %8s %6s %8s %6s %6s %8s %11s %6s %9s %7s\n' \
    clients global target "req/s" "p50 ms" "p99 ms" admitted allowed "adm%" 429 503 other degraded "fb t/e/b" sheds "cmds/c/w" "cpu us"
  declare -A C
  HITLINES=() celln=0
  declare -A CR CP50 CP99
  for m in $CROWD_MODES; do
    g=$(glimit "$m")
    for n in $CROWD_SIZES; do
      for t in $CROWD_TARGETS; do
        why=$(fits "$t" "$n")
        if [ -n "$why" ]; then
          printf '%-7s %-7s %-15s skipped: does not fit: %s; the open-file hard limit is %s and cannot be raised here\n' "$n" "$m" "$t" "$why" "$HARD"
          continue
        fi
        px=() cpids=()
        case $t in
          proxy | "proxy(base)")
            # a fresh pair for each cell, on a prefix of its own: no state
            # of an earlier cell (windows, client states, leases) is left
            b=$PROXY label="proxy x2"
            [ "$t" = proxy ] || b=$BASE label="proxy(base) x2"
            cell=c$((++celln))
            px=("${cell}a" "${cell}b")
            for q in "${px[@]}"; do start_proxy "$q" "$b" "${PREFIX}${cell}_" "$CROWD_PERIP" 1s "$g" "$CROWD_REDIS_TIMEOUT"; done
            ready "${px[@]}" ;;
          nginx) label=nginx target="127.0.0.1:${NGC[$m]}" ;;
          haproxy*) label=$t target="127.0.0.1:${HAC[$m.$t]}" cpids=("$HA_PID") ;;
          *) echo "bench-proxy: unknown crowd target $t" >&2; continue ;;
        esac
        if [ ${#px[@]} -gt 0 ]; then
          target="127.0.0.1:${LISTEN[${px[0]}]},127.0.0.1:${LISTEN[${px[1]}]}"
          cpids=("${PPID_[${px[0]}]}" "${PPID_[${px[1]}]}" ${REDIS_PID:+"$REDIS_PID"})
          MB=("$work/mb1" "$work/mb2") MA=("$work/ma1" "$work/ma2")
          scrape "$work/mb1" "${px[0]}"; scrape "$work/mb2" "${px[1]}"
          r0=$(rcalls)
        fi
        # shellcheck disable=SC2207 # nginx's workers: PIDs without spaces
        [ "$t" = nginx ] && cpids=($(ng_workers))
        c0=$(cpu_ticks "${cpids[@]}")
        if ! out=$("$work/benchserver" -mode crowd -target "$target" -clients "$n" -duration "$CROWD_DURATION" 2>"$work/crowd.err"); then
          printf '%-7s %-7s %-15s failed: %s\n' "$n" "$m" "$label" "$(tr '\n' ' ' <"$work/crowd.err")"
          [ ${#px[@]} -gt 0 ] && stop_proxy "${px[@]}"
          sleep "$CROWD_PAUSE"
          continue
        fi
        c1=$(cpu_ticks "${cpids[@]}")
        C=()
        while read -r k v; do C[$k]=$v; done <<<"$out"
        # every decision was made between the first request sent and the last
        # answer (the span): the limits allow their per-window figure in each
        # 1 s window of it
        windows=$(awk -v s="${C[span]:-${C[seconds]}}" 'BEGIN { w = int(s); if (w < s) w++; print w }')
        allowed=$(awk -v n="$n" -v p="$CROWD_PERIP" -v g="$g" -v w="$windows" 'BEGIN { a = n * p; if (g < a) a = g; printf "%.0f", a * w }')
        deg=n/a fb=n/a sh=n/a cmds=n/a
        if [ ${#px[@]} -gt 0 ]; then
          r1=$(rcalls)
          scrape "$work/ma1" "${px[0]}"; scrape "$work/ma2" "${px[1]}"
          read -r deg fb sh <<<"$(limiter_figures "${BIN[${px[0]}]}")"
          cmds=$(awk -v c="$((r1 - r0 - 1))" -v n="$n" -v w="$windows" 'BEGIN { printf "%.2f", c / n / w }')
          h=$(hits_line)
          [ -n "$h" ] && HITLINES+=("$n $m $label: $h")
          stop_proxy "${px[@]}"
        fi
        printf '%-7s %-7s %-15s %8s %8.1f %8.1f %8s %8s %6s %8s %6s %6s %8s %11s %6s %9s %7s\n' \
          "$n" "$m" "$label" "${C[rps]}" "${C[p50_ms]}" "${C[p99_ms]}" "${C[2xx]}" "$allowed" \
          "$(awk -v a="${C[2xx]}" -v b="$allowed" 'BEGIN { printf "%.0f%%", 100 * a / b }')" \
          "${C[429]}" "${C[503]}" "$((C[other] - C[503]))" "$deg" "$fb" "$sh" "$cmds" "$(per $((c1 - c0)) "${C[requests]}" "$((1000000 / HZ))")"
        if [ "${C[dropped]:-0}" -gt 0 ]; then
          echo "        ^ the connections of ${C[dropped]} clients ended before the end of the run${C[first_error]:+ (first error: ${C[first_error]})}"
        fi
        CR[$n.$m.$t]=${C[rps]} CP50[$n.$m.$t]=${C[p50_ms]} CP99[$n.$m.$t]=${C[p99_ms]}
        sleep "$CROWD_PAUSE"
      done
    done
  done
  echo "(admitted: 2xx answers; allowed: min(clients x $CROWD_PERIP, global) per 1 s window x the 1 s windows from the"
  echo " first request sent to the last answer (answers to requests sent before the end count, up to 2 s late); each"
  echo " client has one request in flight at a time: where req/s / clients is near or below $CROWD_PERIP the crowd's own"
  echo " demand, not the limits, bounds admitted; 503: sheds (or an upstream the target could not reach); other: neither"
  echo " 2xx, 429 nor 503; degraded: decisions fallen back to on_redis_error; fb t/e/b: fallbacks by reason timeout/error/"
  echo " breaker_open; sheds: seckill_proxy_limiter_shed_total (n/a: the build has no such metric); cmds/c/w: every Redis"
  echo " command (those run by scripts included) per client per 1 s window; cpu us: CPU per request of the target (proxy:"
  echo " both instances + redis-server). nginx's leaky bucket may admit more than allowed (a burst plus the rate in the"
  echo " same second); HAProxy's sc_http_req_rate keeps refusing a client that keeps sending above its limit)"
  for l in "${HITLINES[@]}"; do echo "local hits $l"; done
  # proxy x2 (and proxy(base) x2) against each other target of the same cell
  for m in $CROWD_MODES; do
    for n in $CROWD_SIZES; do
      for a in proxy "proxy(base)"; do
        [ -n "${CR[$n.$m.$a]:-}" ] || continue
        l=""
        for t in $CROWD_TARGETS; do
          if [ "$t" = "$a" ] || [ -z "${CR[$n.$m.$t]:-}" ]; then continue; fi
          case $t in proxy*) tn="$t x2" ;; *) tn=$t ;; esac
          l+="; vs $tn $(ratio "${CR[$n.$m.$a]}" "${CR[$n.$m.$t]}")x req/s, p50 $(ratio "${CP50[$n.$m.$a]}" "${CP50[$n.$m.$t]}")x, p99 $(ratio "${CP99[$n.$m.$a]}" "${CP99[$n.$m.$t]}")x"
        done
        [ -n "$l" ] && echo "ratios $n $m $a x2${l}"
      done
    done
  done
fi
echo
echo "bench-proxy: wall time $(($(date +%s) - T0)) s"
