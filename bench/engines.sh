#!/usr/bin/env bash
# bench/engines.sh — one Redis node against the local Redis Cluster (3
# masters + 3 replicas), in one run, interleaved (node, cluster, cluster,
# node, ... so that a change of the machine's load hits both alike). Each
# round and engine runs two isolated stacks (2 workers, 1 backend, 2
# proxies, 2 order-queue partitions on both engines):
#   max      closed loop through the proxies, limits out of the way (the
#            limiter still leases from Redis): purchases/s, accepted/s,
#            confirmed/s end to end
#   limited  the demo's limits (10/s per IP, 500/s global) and crowd (2,000
#            source addresses, open loop): the limiter at work
# and prints, per run, the bench's per-master Redis calls over the load
# (INFO commandstats) and the proxies' limiter calls per decision and per
# request (their seckill_proxy_redis_calls_total and
# seckill_proxy_decisions_total), then the medians per engine and their
# ratio cluster/node. Every run is verified (I1–I5). The node and the
# cluster are this script's own (no other client counts).
#
# Environment: ROUNDS (2), DURATION (8s), CONNS (64), RATE (2000, the
# limited run), LIMITER_TIMEOUT ([proxy] redis_timeout, default the
# config's 20ms: on a loaded box calls time out and the breaker opens, and
# calls per request then count the breaker, not the engine), ENGINES_OUT
# (out/engines), ENGINE_PORT (first port of the own node and cluster,
# default 18000), STACK_PORTS_FROM (set: the stacks' ports from there up,
# instead of random ones).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin"

STACK_NAME=engines
OUT=${ENGINES_OUT:-out/engines}
ROUNDS=${ROUNDS:-2} DURATION=${DURATION:-8s} CONNS=${CONNS:-64} RATE=${RATE:-2000}
BASE=${ENGINE_PORT:-18000}
# shellcheck source=stack.sh
source bench/stack.sh
if [[ -n ${STACK_PORTS_FROM:-} ]]; then
	# Called in $(...): the next port is kept in a file, not a variable.
	port_file=$(mktemp)
	echo "$STACK_PORTS_FROM" >"$port_file"
	stack_free_port() {
		local p
		p=$(cat "$port_file")
		while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
		echo $((p + 1)) >"$port_file"
		echo "$p"
	}
fi

rm -rf "$OUT"
mkdir -p "$OUT/logs"
for b in proxy backend worker bench; do
	[[ -x bin/$b ]] || { echo "engines: bin/$b is missing (make build)" >&2; exit 2; }
done

node_pid=""
cluster_dir=$(mktemp -d)
cleanup() {
	stack_stop
	[[ -n $node_pid ]] && { kill "$node_pid" 2>/dev/null || true; wait "$node_pid" 2>/dev/null || true; }
	ENGINE_DIR=$cluster_dir scripts/redis-engines.sh cluster stop >/dev/null 2>&1 || true
	rm -rf "$cluster_dir" "${port_file:-}"
}
trap cleanup EXIT
trap 'echo "engines: interrupted" >&2; exit 130' INT TERM

node_port=$BASE
while (exec 3<>"/dev/tcp/127.0.0.1/$node_port") 2>/dev/null; do node_port=$((node_port + 1)); done
redis-server --port "$node_port" --bind 127.0.0.1 --save '' --appendonly no >"$OUT/logs/node.log" 2>&1 &
node_pid=$!
for _ in $(seq 100); do redis-cli -p "$node_port" ping >/dev/null 2>&1 && break; sleep 0.05; done
NODE_URL="redis://127.0.0.1:$node_port/0"
CLUSTER_URL=$(ENGINE_DIR=$cluster_dir ENGINE_PORT=$((node_port + 1)) scripts/redis-engines.sh cluster start | tail -1) ||
	stack_die "the Redis Cluster did not start"
stack_log "node $NODE_URL; cluster $CLUSTER_URL"
export SECKILL_AMQP_PARTITIONS=2

# metric_sum URLS NAME — the sum of a counter's series over the proxies.
metric_sum() {
	local u total=0 v
	for u in $1; do
		v=$(curl -fsS --max-time 5 "$u/metrics" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 || (index(n, "{") && index($1, substr(n, 1, length(n) - 1)) == 1) { s += $2 } END { printf "%d", s }')
		total=$((total + v))
	done
	echo "$total"
}

run() { # engine kind round
	local engine=$1 kind=$2 round=$3 name="$1-$2-$3" url rc=0 args
	url=$NODE_URL
	[[ $engine == cluster ]] && url=$CLUSTER_URL
	STACK_PIDS=() STACK_NAMES=() STACK_STOPPED=0
	STACK_OUT=$OUT/$name
	export SECKILL_REDIS_URL=$url
	stack_init
	if [[ $kind == max ]]; then
		stack_write_config "$STACK_OUT/seckill.toml" 10000000 10000000
		args=(-stock 5000000 -users 20000000 -source-ips 200 -hot-share 0 -duration "$DURATION" -tail 0s -connections "$CONNS")
	else
		stack_write_config "$STACK_OUT/seckill.toml" 10 500
		args=(-stock 1000 -users 24000 -source-ips 2000 -duration "$DURATION" -tail 2s -rate "$RATE")
	fi
	if [[ -n ${LIMITER_TIMEOUT:-} ]]; then
		sed -i "/^\[proxy\]\$/a redis_timeout = \"$LIMITER_TIMEOUT\"" "$STACK_OUT/seckill.toml"
	fi
	stack_up "$STACK_OUT/seckill.toml" 2 2
	stack_log "$name: load $(cut -d' ' -f1-3 /proc/loadavg)"
	bin/bench -config "$STACK_OUT/seckill.toml" -targets "$PROXY_URLS" -admin-url "$BACKEND_URL" \
		-activity 0 -limit 1 -warmup 1s -drain-timeout 120s -quiet "${args[@]}" \
		-json "$OUT/$name.json" >"$OUT/$name.txt" 2>"$OUT/$name.err" || rc=$?
	# Calls sent (ok or failed); breaker_open ones were decided without Redis.
	local ok failed skipped decisions
	ok=$(metric_sum "$PROXY_ADMIN_URLS" 'seckill_proxy_redis_calls_total{result="ok"}')
	failed=$(metric_sum "$PROXY_ADMIN_URLS" 'seckill_proxy_redis_calls_total{result="error"}')
	skipped=$(metric_sum "$PROXY_ADMIN_URLS" 'seckill_proxy_redis_calls_total{result="breaker_open"}')
	decisions=$(metric_sum "$PROXY_ADMIN_URLS" seckill_proxy_decisions_total)
	echo "{\"engine\": \"$engine\", \"kind\": \"$kind\", \"round\": $round, \"limiter_calls\": $((ok + failed)), \"limiter_failed\": $failed, \"limiter_skipped\": $skipped, \"decisions\": $decisions, \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" >"$OUT/$name.meta.json"
	stack_stop
	[[ $rc == 2 ]] && { cat "$OUT/$name.err" >&2; stack_die "$name: bench could not run"; }
	stack_log "$name: $(tail -n 1 "$OUT/$name.txt")"
}

for ((r = 1; r <= ROUNDS; r++)); do
	order=(node cluster)
	((r % 2 == 0)) && order=(cluster node)
	for kind in max limited; do
		for e in "${order[@]}"; do run "$e" "$kind" "$r"; done
	done
done

python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows = {}
keys = ("rps", "acc", "conf", "scripts", "cmds", "lim_req", "lim_dec")
print("%-8s %-8s %2s %7s %7s %7s %8s %7s %8s %8s %7s %7s %-18s %6s  %s" % ("engine", "run", "r", "req/s", "202/s", "conf/s",
      "scr/req", "cmd/req", "lim/req", "lim/dec", "limfail", "limskip", "script share", "hello", "load 1/5/15 | verdict"))
for meta in sorted(glob.glob(os.path.join(out, "*.meta.json"))):
    m = json.load(open(meta))
    d = json.load(open(meta.replace(".meta.json", ".json")))
    s = d["summary"]
    rd = d.get("reads") or {}
    reqs = sum(p["requests"] for p in d["phases"]) + sum(rd.get(k, {}).get("requests", 0) for k in ("state_polls", "order_waits"))
    nodes = d.get("redis_calls") or []
    scripts = sum(n["script_calls"] for n in nodes)
    share = " ".join("%.0f%%" % (100 * n["script_calls"] / scripts) for n in nodes) if scripts else "-"
    hello = sum(n["commands"].get("hello", 0) for n in nodes)
    r = dict(rps=s["requests_per_second"], acc=s["accepted_per_second_rush"], conf=s["confirmed_per_second_end_to_end"],
             scripts=scripts / reqs, cmds=sum(n["calls"] for n in nodes) / reqs, lim_req=m["limiter_calls"] / reqs,
             lim_dec=m["limiter_calls"] / m["decisions"] if m["decisions"] else 0)
    rows.setdefault((m["kind"], m["engine"]), []).append(r)
    print("%-8s %-8s %2d %7.0f %7.0f %7.0f %8.2f %7.2f %8.3f %8.3f %7d %7d %-18s %6d  %s | %s" % (m["engine"], m["kind"], m["round"], r["rps"],
          r["acc"], r["conf"], r["scripts"], r["cmds"], r["lim_req"], r["lim_dec"], m["limiter_failed"], m["limiter_skipped"], share, hello,
          m["load"], d["verdict_line"]))
print("""
scr/req: EVALSHA/EVAL calls on all masters per request sent (proxies' limiter, backend, workers); cmd/req: every
command Redis counted, those inside scripts too; lim/req, lim/dec: the proxies' limiter script calls per request
and per decision (seckill_proxy_redis_calls_total, ok or failed), limfail: of them failed, limskip: decided
without Redis while the breaker was open; script share: per master; hello:
connections opened during the load. Medians per engine, and cluster / node:""")
for kind in ("max", "limited"):
    med = {e: {k: statistics.median(x[k] for x in rows[(kind, e)]) for k in keys} for e in ("node", "cluster") if (kind, e) in rows}
    if len(med) < 2:
        continue
    print("  %-8s " % kind + "  ".join("%s %.3g/%.3g = %.2f" % (k, med["node"][k], med["cluster"][k],
          med["cluster"][k] / med["node"][k] if med["node"][k] else 0) for k in keys))
PY
