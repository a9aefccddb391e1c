#!/usr/bin/env bash
# A local 3-node RabbitMQ cluster from the installed rabbitmq-server (no
# download), beside the system node (5672, its cookie and data untouched):
#
#   scripts/rabbit-cluster.sh start        start (or find running) the cluster
#   scripts/rabbit-cluster.sh stop         stop every node, remove the state
#   scripts/rabbit-cluster.sh url          the URL list for [rabbitmq] url
#   scripts/rabbit-cluster.sh kill N       kill -9 node N (1..3)
#   scripts/rabbit-cluster.sh restart N    start node N again (it rejoins)
#   scripts/rabbit-cluster.sh ctl N ARGS   rabbitmqctl against node N
#   scripts/rabbit-cluster.sh leader QUEUE [VHOST]   the node number leading a quorum queue
#
# start is idempotent: a cluster already running in DIR is left alone. The
# last line printed is the URL list for [rabbitmq] url / SECKILL_AMQP_URL:
#   amqp://guest:guest@127.0.0.1:5781,127.0.0.1:5782,127.0.0.1:5783/
#
# Each node has its own name (seckill-rmq<port>@localhost), AMQP port, Erlang
# distribution port (AMQP port + 20000), data and log directory and an
# Erlang cookie of the cluster's own (the nodes are started with -setcookie
# and rabbitmqctl is called with --erlang-cookie, so the system node's
# cookie file is neither read nor written). Partition handling is
# pause_minority: a node cut off from the other two stops serving rather than
# accept work the majority does not see (quorum queues need a majority
# anyway; this also ends its client connections so they fail over).
#
# Environment:
#   RABBIT_DIR   state directory (default /var/tmp/seckill-rabbit-cluster)
#   RABBIT_PORT  first AMQP port tried (default 5781; keep it below 12768 so
#                that the distribution ports stay below Linux's ephemeral
#                range); the first free run of
#                3 AMQP ports (and their distribution ports) from there is taken
set -euo pipefail

action=${1:-}
dir=${RABBIT_DIR:-/var/tmp/seckill-rabbit-cluster}
base=${RABBIT_PORT:-5781}
host=127.0.0.1
n=3

command -v rabbitmq-server >/dev/null || { echo "rabbitmq-server not installed (make services installs it)" >&2; exit 1; }

port_free() { ! (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null; }

cookie() { cat "$dir/cookie"; }
node_port() { echo $(($(cat "$dir/port") + $1 - 1)); }
node_name() { echo "seckill-rmq$(node_port "$1")@localhost"; }

ctl() { # node number, args...
	local i=$1; shift
	timeout 120 rabbitmqctl --erlang-cookie "$(cookie)" -n "$(node_name "$i")" "$@"
}

# alive N: node N's Erlang VM runs.
alive() { [ -f "$dir/n$1/pid" ] && kill -0 "$(cat "$dir/n$1/pid")" 2>/dev/null; }

all_alive() {
	local i
	for ((i = 1; i <= n; i++)); do alive "$i" || return 1; done
}

# ports: the first AMQP port of a free run of n (with distribution ports).
first_port() {
	local p=$base i ok
	while [ "$p" -lt $((base + 300)) ]; do
		ok=1
		for ((i = 0; i < n; i++)); do
			if ! port_free $((p + i)) || ! port_free $((p + i + 20000)); then ok=0; break; fi
		done
		if [ "$ok" = 1 ]; then echo "$p"; return; fi
		p=$((p + n))
	done
	echo "no $n free ports (and distribution ports) from $base" >&2
	return 1
}

start_node() {
	local i=$1 port nd
	port=$(node_port "$i")
	nd="$dir/n$i"
	mkdir -p "$nd/mnesia" "$nd/log"
	cat >"$nd/rabbitmq.conf" <<EOF
listeners.tcp.local = $host:$port
loopback_users = none
cluster_partition_handling = pause_minority
EOF
	echo '[].' >"$nd/plugins"
	# The server drops to the rabbitmq user: its files must be writable by it.
	chmod -R a+rwX "$dir"
	rm -f "$nd/pid"
	RABBITMQ_NODENAME=$(node_name "$i") \
		RABBITMQ_CONFIG_FILE="$nd/rabbitmq.conf" \
		RABBITMQ_DIST_PORT=$((port + 20000)) \
		RABBITMQ_MNESIA_BASE="$nd/mnesia" \
		RABBITMQ_LOG_BASE="$nd/log" \
		RABBITMQ_ENABLED_PLUGINS_FILE="$nd/plugins" \
		RABBITMQ_PID_FILE="$nd/pid" \
		RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-setcookie $(cookie)" \
		setsid nohup rabbitmq-server >>"$nd/out.txt" 2>&1 </dev/null &
}

wait_node() {
	local i=$1 port
	port=$(node_port "$i")
	for _ in $(seq 600); do
		if ! port_free "$port" && [ -f "$dir/n$i/pid" ]; then return 0; fi
		sleep 0.2
	done
	echo "node $i ($(node_name "$i")) did not listen on $port within 2m (log: $dir/n$i/out.txt)" >&2
	tail -20 "$dir/n$i/out.txt" >&2 || true
	return 1
}

url() {
	local i addrs=()
	for ((i = 1; i <= n; i++)); do addrs+=("$host:$(node_port "$i")"); done
	local IFS=,
	echo "amqp://guest:guest@${addrs[*]}/"
}

stop() {
	local i pid pids=()
	[ -f "$dir/cookie" ] || { rm -rf "$dir"; return 0; }
	for ((i = 1; i <= n; i++)); do
		[ -f "$dir/n$i/pid" ] || continue
		pid=$(cat "$dir/n$i/pid")
		kill "$pid" 2>/dev/null || true
		pids+=("$pid")
	done
	for pid in "${pids[@]}"; do
		for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -9 "$pid" 2>/dev/null || true
	done
	rm -rf "$dir"
}

case "$action" in
start)
	mkdir -p "$dir"
	if [ -f "$dir/url" ] && all_alive; then
		echo "rabbitmq cluster already running in $dir"
		cat "$dir/url"
		exit 0
	fi
	stop
	mkdir -p "$dir"
	first_port >"$dir/port"
	head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/cookie"
	started=$(date +%s)
	for ((i = 1; i <= n; i++)); do start_node "$i"; done
	for ((i = 1; i <= n; i++)); do wait_node "$i"; done
	# Join nodes 2 and 3 to node 1 (each booted as a cluster of its own).
	for ((i = 2; i <= n; i++)); do
		ctl "$i" stop_app >/dev/null
		ctl "$i" join_cluster "$(node_name 1)" >/dev/null
		ctl "$i" start_app >/dev/null
	done
	running=$(ctl 1 cluster_status --formatter json | grep -o "seckill-rmq[0-9]*@localhost" | sort -u | wc -l)
	[ "$running" -ge "$n" ] || { echo "cluster formed with $running of $n nodes" >&2; exit 1; }
	url >"$dir/url"
	echo "rabbitmq cluster of $n nodes in $dir ($(($(date +%s) - started)) s)"
	cat "$dir/url"
	;;
stop)
	stop
	;;
url)
	[ -f "$dir/url" ] && all_alive || { echo "no rabbitmq cluster running in $dir" >&2; exit 1; }
	cat "$dir/url"
	;;
kill)
	i=${2:?node number}
	kill -9 "$(cat "$dir/n$i/pid")"
	;;
restart)
	i=${2:?node number}
	alive "$i" && { echo "node $i runs already" >&2; exit 0; }
	start_node "$i"
	wait_node "$i"
	ctl "$i" await_startup >/dev/null
	;;
ctl)
	i=${2:?node number}
	shift 2
	ctl "$i" "$@"
	;;
leader)
	q=${2:?queue}
	vhost=${3:-/}
	# Ask any live node.
	for ((i = 1; i <= n; i++)); do
		alive "$i" || continue
		l=$(ctl "$i" list_queues -q -p "$vhost" name leader 2>/dev/null | awk -v q="$q" '$1 == q {print $2}')
		[ -n "$l" ] || continue
		for ((j = 1; j <= n; j++)); do
			[ "$l" = "$(node_name "$j")" ] && { echo "$j"; exit 0; }
		done
	done
	echo "no leader known for $q" >&2
	exit 1
	;;
*)
	echo "usage: $0 start|stop|url|kill N|restart N|ctl N ARGS|leader QUEUE [VHOST]" >&2
	exit 2
	;;
esac
