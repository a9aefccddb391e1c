#!/usr/bin/env bash
# Local Redis engines from the installed redis-server (no download):
#
#   scripts/redis-engines.sh cluster start    3 masters + 3 replicas (Redis Cluster)
#   scripts/redis-engines.sh sentinel start   1 master + 1 replica + 3 Sentinels
#   scripts/redis-engines.sh cluster|sentinel stop
#   scripts/redis-engines.sh cluster|sentinel url
#
# start is idempotent: an engine already running in DIR is left alone. The
# last line printed is its URL for [redis] url / SECKILL_REDIS_URL, e.g.
#   redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002
#   redis-sentinel://127.0.0.1:26390,127.0.0.1:26391,127.0.0.1:26392/seckill/0
#
# Environment:
#   ENGINE_DIR   state directory (pid, log, config files; default
#                /var/tmp/seckill-redis-<engine>); one engine per directory
#   ENGINE_PORT  first port tried (default 7000 for the cluster, 6390 for
#                Sentinel); the first free run of ports from there is taken
#                (a cluster node's bus port is its port + 100, not Redis's
#                default + 10000, which lands in Linux's ephemeral range for
#                ports above 22767 and then collides with client sockets)
#   NODE_TIMEOUT cluster-node-timeout / Sentinel down-after-milliseconds in ms
#                (default 2000 / 1000: a failover within seconds, for tests)
# Servers keep no data on disk (no RDB, no AOF): they are for tests and demos.
set -euo pipefail

engine=${1:-}
action=${2:-}
case "$engine" in
cluster) default_port=7000 ;;
sentinel) default_port=6390 ;;
*) echo "usage: $0 cluster|sentinel start|stop|url" >&2; exit 2 ;;
esac
dir=${ENGINE_DIR:-/var/tmp/seckill-redis-$engine}
base=${ENGINE_PORT:-$default_port}
host=127.0.0.1

command -v redis-server >/dev/null || { echo "redis-server not installed (make services installs it)" >&2; exit 1; }
command -v redis-cli >/dev/null || { echo "redis-cli not installed" >&2; exit 1; }

port_free() { ! (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null; }

# rcli: redis-cli bounded (it has no timeout of its own: a port held by
# something that accepts and never answers would hold the script, and a test
# waiting on it, forever).
rcli() { timeout 5 redis-cli "$@"; }

# alive: every pid in the directory's pid files runs.
alive() {
	local f n=0
	for f in "$dir"/*.pid; do
		[ -e "$f" ] || return 1
		kill -0 "$(cat "$f")" 2>/dev/null || return 1
		n=$((n + 1))
	done
	[ "$n" -gt 0 ]
}

stop() {
	local f pid pids=()
	# All at once: a master told to stop alone waits for its replica to
	# catch up (shutdown-timeout) first.
	for f in "$dir"/*.pid; do
		[ -e "$f" ] || continue
		pid=$(cat "$f")
		kill "$pid" 2>/dev/null || true
		pids+=("$pid")
	done
	for pid in "${pids[@]}"; do
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
	done
	rm -f "$dir"/*.pid
	rm -f "$dir/url" "$dir"/nodes-*.conf "$dir"/sentinel-*.conf
}

# ports N: the first N consecutive free ports from base (and their bus ports
# for a cluster).
ports() {
	local n=$1 p=$base ok i
	while [ "$p" -lt $((base + 1000)) ]; do
		ok=1
		for ((i = 0; i < n; i++)); do
			if ! port_free $((p + i)) || { [ "$engine" = cluster ] && ! port_free $((p + i + 100)); }; then
				ok=0; p=$((p + i + 1)); break
			fi
		done
		if [ "$ok" = 1 ]; then seq "$p" $((p + n - 1)); return; fi
	done
	echo "no $n free ports from $base" >&2
	return 1
}

wait_ping() {
	for _ in $(seq 100); do
		rcli -h $host -p "$1" ping 2>/dev/null | grep -q PONG && return 0
		sleep 0.05
	done
	echo "redis-server on $1 did not answer (log: $dir/$1.log)" >&2
	return 1
}

# wait_synced PORT...: every replica among them has its link to the master up.
wait_synced() {
	local p
	for p in "$@"; do
		for _ in $(seq 300); do
			rcli -h $host -p "$p" info replication | grep -q '^role:master' && break
			rcli -h $host -p "$p" info replication | grep -q '^master_link_status:up' && break
			sleep 0.1
		done
		rcli -h $host -p "$p" info replication | grep -qE '^(role:master|master_link_status:up)' ||
			{ echo "replica $p did not sync with its master" >&2; return 1; }
	done
}

server() { # port, extra args...
	local p=$1; shift
	# repl-diskless-sync-delay 0: a replica's first sync starts at once
	# instead of after 5 s; a replica that never synced cannot take over.
	redis-server --port "$p" --bind $host --protected-mode no --save "" --appendonly no --shutdown-timeout 0 \
		--repl-diskless-sync-delay 0 \
		--daemonize yes --dir "$dir" --pidfile "$dir/$p.pid" --logfile "$dir/$p.log" "$@"
	wait_ping "$p"
}

start_cluster() {
	local ps addrs=() p timeout=${NODE_TIMEOUT:-2000}
	mapfile -t ps < <(ports 6)
	for p in "${ps[@]}"; do
		server "$p" --cluster-enabled yes --cluster-port $((p + 100)) --cluster-config-file "$dir/nodes-$p.conf" \
			--cluster-node-timeout "$timeout" --cluster-require-full-coverage yes
		addrs+=("$host:$p")
	done
	# Bounded: --cluster create waits forever for nodes that never meet.
	timeout 60 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 ||
		{ cat "$dir/create.log" >&2; echo "redis-cli --cluster create ${addrs[*]}: failed or not done within 60s" >&2; return 1; }
	# Every node agrees on the slots before anyone uses the URL.
	for _ in $(seq 200); do
		local ok=1
		for p in "${ps[@]}"; do
			rcli -h $host -p "$p" cluster info | grep -q 'cluster_state:ok' || ok=0
		done
		[ "$ok" = 1 ] && break
		sleep 0.1
	done
	[ "$ok" = 1 ] || { echo "cluster did not reach cluster_state:ok" >&2; return 1; }
	# Replicas attached, in every node's view (gossip spreads it): a
	# failover test needs one behind each master.
	for _ in $(seq 300); do
		ok=1
		for p in "${ps[@]}"; do
			[ "$(rcli -h $host -p "$p" cluster nodes | grep -cE '[ ,]slave [0-9a-f]')" = 3 ] || { ok=0; break; }
		done
		[ "$ok" = 1 ] && break
		sleep 0.1
	done
	[ "$ok" = 1 ] || { echo "cluster: not every master has a replica:" >&2; rcli -h $host -p "${ps[0]}" cluster nodes >&2; return 1; }
	wait_synced "${ps[@]}"
	local IFS=,
	echo "redis-cluster://${addrs[*]:0:3}" >"$dir/url"
}

start_sentinel() {
	local ps p i s=() down=${NODE_TIMEOUT:-1000}
	mapfile -t ps < <(ports 5)
	server "${ps[0]}"
	server "${ps[1]}" --replicaof $host "${ps[0]}"
	wait_synced "${ps[1]}"
	for i in 2 3 4; do
		p=${ps[$i]}
		cat >"$dir/sentinel-$p.conf" <<EOF
port $p
bind $host
protected-mode no
daemonize yes
dir $dir
pidfile $dir/$p.pid
logfile $dir/$p.log
sentinel monitor seckill $host ${ps[0]} 2
sentinel down-after-milliseconds seckill $down
sentinel failover-timeout seckill 5000
sentinel parallel-syncs seckill 1
EOF
		redis-server "$dir/sentinel-$p.conf" --sentinel
		wait_ping "$p"
		s+=("$host:$p")
	done
	# The Sentinels know the replica and each other before the URL is used.
	for _ in $(seq 200); do
		rcli -h $host -p "${ps[2]}" sentinel replicas seckill 2>/dev/null | grep -q "${ps[1]}" &&
			[ "$(rcli -h $host -p "${ps[2]}" sentinel master seckill | sed -n '/^num-other-sentinels$/{n;p}')" = 2 ] && break
		sleep 0.1
	done
	local IFS=,
	echo "redis-sentinel://${s[*]}/seckill/0" >"$dir/url"
}

case "$action" in
start)
	mkdir -p "$dir"
	if [ -f "$dir/url" ] && alive; then
		echo "$engine already running in $dir"
		cat "$dir/url"
		exit 0
	fi
	stop # the remains of a half-started or killed engine
	if ! "start_$engine"; then
		stop
		echo "$engine did not start (logs in $dir)" >&2
		exit 1
	fi
	echo "$engine started in $dir"
	cat "$dir/url"
	;;
stop)
	stop
	echo "$engine stopped ($dir)"
	;;
url)
	[ -f "$dir/url" ] && alive || { echo "$engine not running in $dir" >&2; exit 1; }
	cat "$dir/url"
	;;
*) echo "usage: $0 cluster|sentinel start|stop|url" >&2; exit 2 ;;
esac
