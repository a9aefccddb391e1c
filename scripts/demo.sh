#!/usr/bin/env bash
# demo.sh — the main job (README "make demo"): build, make sure Redis, MariaDB and
# RabbitMQ run, start a worker fleet (2), one backend and two proxies as an
# isolated stack on free ports, run a flash sale through both proxies with
# bin/bench, wait for the drain, verify I1–I5 against MySQL and Redis, print
# the report and stop everything started — also when interrupted. The last
# line printed is the verdict; the exit status is bench's (0 ok, 1 FAIL, 2 the
# run could not be made).
#
#   make demo            1,000 units, 24,000 users, 10 s rush at 4,000 req/s
#   make demo QUICK=1    200 units, 4,000 users, 5 s rush (≤ 60 s in all; CI)
#   make demo REDIS=cluster   the same on the local Redis Cluster (make cluster),
#                        REDIS=sentinel on the local Sentinel set, both with
#                        2 order-queue partitions and the sale's stock in 4
#                        shards (SECKILL_STOCK_SHARDS)
#   make demo RABBIT=cluster  the same on the local 3-node RabbitMQ cluster
#                        (make rabbit-cluster), every process given all three
#                        addresses; combines with REDIS=
#
# Environment: QUICK=1, DEMO_OUT (default out/demo), STACK_KEEP=1 (keep the
# database, keys and queues), DEMO_NO_BUILD=1 (skip make build / services),
# DEMO_RATE, DEMO_USERS, DEMO_STOCK, DEMO_DURATION to change the sale.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin"

STACK_NAME=demo
STACK_OUT=${DEMO_OUT:-out/demo}
# shellcheck source=../bench/stack.sh
source bench/stack.sh

if [[ -n ${QUICK:-} && ${QUICK:-} != 0 ]]; then
	STOCK=${DEMO_STOCK:-200} USERS=${DEMO_USERS:-4000} RATE=${DEMO_RATE:-2000}
	DURATION=${DEMO_DURATION:-5s} WARMUP=1s TAIL=1s DRAIN=25s
	PER_IP=10 GLOBAL=150 SOURCE_IPS=500
else
	STOCK=${DEMO_STOCK:-1000} USERS=${DEMO_USERS:-24000} RATE=${DEMO_RATE:-4000}
	DURATION=${DEMO_DURATION:-10s} WARMUP=2s TAIL=3s DRAIN=60s
	PER_IP=10 GLOBAL=500 SOURCE_IPS=2000
fi

rm -rf "$STACK_OUT"
mkdir -p "$STACK_OUT"
started=$SECONDS

if [[ -z ${DEMO_NO_BUILD:-} ]]; then
	make --no-print-directory build >&2
	make --no-print-directory services >&2
fi
for b in proxy backend worker bench; do
	[[ -x bin/$b ]] || { echo "demo: bin/$b is missing (make build)" >&2; exit 2; }
done

status=2
finish() {
	local rc=$?
	trap - EXIT INT TERM
	stack_stop
	if [[ $status != 0 ]]; then
		stack_show_logs
		echo "demo: logs in $STACK_OUT/logs" >&2
	fi
	# The report last, so that its verdict is the last line printed.
	if [[ -s $STACK_OUT/report.txt ]]; then
		cat "$STACK_OUT/report.txt"
	fi
	if [[ $status == 2 && $rc != 0 ]]; then
		exit "$rc"
	fi
	exit "$status"
}
trap finish EXIT
trap 'echo "demo: interrupted" >&2; exit 130' INT TERM

case ${REDIS:-} in
"") ;;
cluster | sentinel)
	SECKILL_REDIS_URL=$(scripts/redis-engines.sh "$REDIS" start | tail -1) || { echo "demo: the local Redis $REDIS did not start" >&2; exit 2; }
	export SECKILL_REDIS_URL
	export SECKILL_AMQP_PARTITIONS=${SECKILL_AMQP_PARTITIONS:-2}
	export SECKILL_STOCK_SHARDS=${SECKILL_STOCK_SHARDS:-4}
	stack_log "Redis: $SECKILL_REDIS_URL; order queues: $SECKILL_AMQP_PARTITIONS partitions; stock shards: $SECKILL_STOCK_SHARDS"
	;;
*) echo "demo: REDIS must be cluster or sentinel, got \"$REDIS\"" >&2; exit 2 ;;
esac
case ${RABBIT:-} in
"") ;;
cluster)
	SECKILL_AMQP_URL=$(scripts/rabbit-cluster.sh start | tail -1) || { echo "demo: the local RabbitMQ cluster did not start" >&2; exit 2; }
	export SECKILL_AMQP_URL
	stack_log "RabbitMQ: $SECKILL_AMQP_URL (3 nodes, quorum queues)"
	;;
*) echo "demo: RABBIT must be cluster, got \"$RABBIT\"" >&2; exit 2 ;;
esac

stack_init
stack_write_config "$STACK_OUT/seckill.toml" "$PER_IP" "$GLOBAL"
stack_up "$STACK_OUT/seckill.toml" 2 2

stack_log "flash sale: $STOCK units, $USERS users, rush $DURATION at $RATE req/s through $PROXY_URLS (limits: $PER_IP/s per IP, $GLOBAL/s global)"
set +e
bin/bench -config "$STACK_OUT/seckill.toml" \
	-targets "$PROXY_URLS" -admin-url "$BACKEND_URL" \
	-activity 0 -stock "$STOCK" -limit 1 -users "$USERS" \
	-warmup "$WARMUP" -duration "$DURATION" -tail "$TAIL" -rate "$RATE" \
	-source-ips "$SOURCE_IPS" -drain-timeout "$DRAIN" \
	-json "$STACK_OUT/report.json" -html "$STACK_OUT/report.html" \
	>"$STACK_OUT/report.txt"
status=$?
set -e
case $status in
0) stack_log "report: $STACK_OUT/report.html ($((SECONDS - started)) s)" ;;
1) stack_log "verdict FAIL; report: $STACK_OUT/report.html, logs: $STACK_OUT/logs" ;;
*) stack_log "bench could not complete the run (exit $status)" ;;
esac
