#!/usr/bin/env bash
# bench.sh — `make bench`: one run, side by side, saved as out/bench/bench.json
# and out/bench/bench.md (and printed):
#   1. proxy forward path      scripts/bench-proxy.sh (wrk), when present
#   2. purchase, max rate      closed loop through a proxy, limits out of the
#                              way, workers running: accepted/s and confirmed
#                              orders/s end to end (load + drain)
#   3. purchase, half rate     open loop at half of (2): p50/p99 of accepted
#                              orders, CPU per order beside (2)'s
#   2r. max rate, read mix     (2) with the read mix of a real sale: sale-state
#                              polls through the warm-up and a long-poll of
#                              each accepted order until it settles
#   4. sold-out tail           answers/s once the stock is gone, with keyed
#                              purchases (the proxy answers a new key from the
#                              keys holding an order; 10% of them replay a key
#                              answered 202, which the backend answers with its
#                              order) and with unkeyed ones (the proxy answers
#                              from its sold-out flag)
#   5. drain from a deep queue workers paused (SIGSTOP) during the load, then
#                              resumed: orders/s written to MySQL
#   6. memory per order        Redis used_memory (own redis-server when
#                              installed) and the sale's keys per accepted order
#                              of run 2 while live, then after it is ended and
#                              archived
#   0. raw ceilings            before 2: `bin/bench ceilings` on the same
#                              services (confirm publisher, 100-order
#                              transaction, reserve.lua)
# Every run is verified (I1–I5); a FAIL verdict is reported in the table.
# Every run of 2–5 accounts CPU per process (bench -cpu: proxy, backend,
# workers, redis-server, mariadbd, beam.smp, the box) from the rush's start
# until drained, and sets its figures beside the ceilings (bench -ceilings).
# bench/report.py prints the tables: the figures, CPU µs per order by
# process, and the aims (ratios within the run, and to BASE) as met / not met.
#
# BASE=<git ref> (make bench BASE=<ref>): that ref's binaries are built in a
# git worktree of their own under a temp directory (removed afterwards); a
# second stack runs them beside this tree's, on the same services, with its
# own Redis key prefix, MySQL database and RabbitMQ names (bench/stack.sh),
# and every scenario (0, 2–6) runs for both builds, alternately (the order
# flips from one scenario to the next), each driven by its own bin/bench. A
# flag of the scenario that BASE's bench lacks (its -help does not list it)
# is left out of its run and said so (log, out/bench/base/<scenario>.dropped,
# the report). The report sets BASE's figures and new/base beside this
# build's. BASE's reports are in out/bench/base/. (1) runs for this tree only.
#
# Environment: BASE, QUICK=1 (2 s scenarios, 1 s ceilings, no 1: checks the
# mechanism, not the speed), BENCH_OUT (out/bench), BENCH_DURATION (10s),
# BENCH_CONNS (128), BENCH_CEILING_DURATION (3s, each ceiling),
# BENCH_SKIP_PROXY=1 (skip 1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin"

BASE=${BASE:-}
BENCH_OUT=${BENCH_OUT:-out/bench}
if [[ -n ${QUICK:-} ]]; then
	DURATION=${BENCH_DURATION:-2s}
	CEILING_DURATION=${BENCH_CEILING_DURATION:-1s}
	BENCH_SKIP_PROXY=1
else
	DURATION=${BENCH_DURATION:-10s}
	CEILING_DURATION=${BENCH_CEILING_DURATION:-3s}
fi
CONNS=${BENCH_CONNS:-128}
STACK_NAME=bench
STACK_OUT=$BENCH_OUT
# shellcheck source=stack.sh
source bench/stack.sh
# shellcheck source=compat.sh
source bench/compat.sh

rm -rf "$BENCH_OUT"
mkdir -p "$BENCH_OUT/logs"
for b in proxy backend worker bench; do
	[[ -x bin/$b ]] || { echo "bench: bin/$b is missing (make build)" >&2; exit 2; }
done

# Each build's stack is a context: bench/stack.sh's globals, the SECKILL_*
# variables it exports and this script's own per-build ones. ctx_save keeps
# the live one under a tag, ctx_use makes a saved one live.
CTX_VARS=(STACK_PIDS STACK_NAMES STACK_STOPPED STACK_ID STACK_DB STACK_CONFIG STACK_BIN STACK_OUT STACK_NAME
	SECKILL_REDIS_PREFIX SECKILL_AMQP_PREFIX SECKILL_MYSQL_DSN SECKILL_ADMIN_TOKEN
	BACKEND_URL PROXY_URLS PROXY_ADMIN_URLS WORKER_PIDS CPU_GROUPS BENCH_FLAGS BENCH_CEILINGS BUILD_LABEL)
# shellcheck disable=SC2034 # kept by ctx_save, used by bench/stack.sh
STACK_ID="" STACK_DB="" STACK_CONFIG="" STACK_BIN=bin BACKEND_URL="" PROXY_URLS="" PROXY_ADMIN_URLS=""
WORKER_PIDS=() CPU_GROUPS="" BENCH_FLAGS="" BENCH_CEILINGS=0 BUILD_LABEL=""
export SECKILL_REDIS_PREFIX=${SECKILL_REDIS_PREFIX:-} SECKILL_AMQP_PREFIX=${SECKILL_AMQP_PREFIX:-}
export SECKILL_MYSQL_DSN=${SECKILL_MYSQL_DSN:-} SECKILL_ADMIN_TOKEN=${SECKILL_ADMIN_TOKEN:-}
declare -A BENCH_CTX=()
CUR_TAG=""
ctx_save() {
	BENCH_CTX[$1]=$(declare -p "${CTX_VARS[@]}" | sed -E 's/^declare -- /declare -g /; s/^declare -([a-zA-Z]+) /declare -g\1 /')
}
ctx_use() {
	[[ $CUR_TAG == "$1" ]] && return 0
	[[ -n $CUR_TAG ]] && ctx_save "$CUR_TAG"
	eval "${BENCH_CTX[$1]}"
	CUR_TAG=$1
}

# bench_stop_all — stop every build's stack (each once).
bench_stop_all() {
	local tag
	stack_stop
	[[ -n $CUR_TAG ]] && ctx_save "$CUR_TAG"
	for tag in "${!BENCH_CTX[@]}"; do
		ctx_use "$tag"
		stack_stop
		ctx_save "$tag"
	done
}

BENCH_REDIS_PID="" BASE_TMP=""
bench_cleanup() {
	bench_stop_all
	if [[ -n $BENCH_REDIS_PID ]]; then
		kill "$BENCH_REDIS_PID" 2>/dev/null || true
		wait "$BENCH_REDIS_PID" 2>/dev/null || true
	fi
	if [[ -n $BASE_TMP ]]; then
		git worktree remove --force "$BASE_TMP/src" 2>/dev/null || true
		rm -rf "$BASE_TMP"
		git worktree prune 2>/dev/null || true
	fi
}
trap 'bench_cleanup' EXIT
trap 'echo "bench: interrupted" >&2; exit 130' INT TERM

NEW_LABEL="$(git describe --tags --always --dirty 2>/dev/null || echo unknown) (this tree)"
TAGS=(new)
if [[ -n $BASE ]]; then
	base_sha=$(git rev-parse --verify --quiet "$BASE^{commit}") || { echo "bench: BASE=$BASE names no commit of this repository" >&2; exit 2; }
	base_desc=$(git describe --tags --always "$base_sha")
	BASE_LABEL="$BASE = $base_desc"
	[[ $BASE == "$base_desc" ]] && BASE_LABEL=$BASE
	BASE_TMP=$(mktemp -d "${TMPDIR:-/tmp}/seckill-bench-base.XXXXXX")
	stack_log "BASE=$BASE ($base_sha): building its binaries in a worktree of their own, $BASE_TMP/src"
	git worktree add --detach "$BASE_TMP/src" "$base_sha" >"$BENCH_OUT/logs/base-build.log" 2>&1 ||
		{ cat "$BENCH_OUT/logs/base-build.log" >&2; stack_die "git worktree add for BASE=$BASE failed"; }
	mkdir -p "$BASE_TMP/bin"
	# -trimpath: the build cache's keys then do not name the worktree's
	# (random) directory, so the next run with the same BASE builds from it.
	built=$SECONDS
	(cd "$BASE_TMP/src" && go build -trimpath -ldflags "-X github.com/seckill/seckill/internal/version.Version=$base_desc" \
		-o "$BASE_TMP/bin/" ./proxy ./backend ./worker ./bench) >>"$BENCH_OUT/logs/base-build.log" 2>&1 ||
		{ cat "$BENCH_OUT/logs/base-build.log" >&2; stack_die "could not build BASE=$BASE's binaries"; }
	stack_log "BASE's binaries built in $((SECONDS - built)) s"
	TAGS=(new base)
fi

# 1. The proxy's forward path, from the edge-proxy work (this tree only).
if [[ -x scripts/bench-proxy.sh && -z ${BENCH_SKIP_PROXY:-} ]]; then
	stack_log "1/5 proxy forward path (scripts/bench-proxy.sh${BASE:+; this tree only, not BASE})"
	scripts/bench-proxy.sh >"$BENCH_OUT/proxy.txt" 2>"$BENCH_OUT/logs-proxy.txt" ||
		echo "bench-proxy.sh failed; see $BENCH_OUT/logs-proxy.txt" >>"$BENCH_OUT/proxy.txt"
fi

# The stacks get a Redis of their own (when redis-server is installed), so
# that INFO's used_memory is theirs alone: the memory figures below. Both
# builds use it, each with its own key prefix.
BENCH_REDIS=shared
if command -v redis-server >/dev/null 2>&1; then
	rport=$(stack_free_port) || stack_die "no free port"
	redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
		>"$BENCH_OUT/logs/redis.log" 2>&1 &
	BENCH_REDIS_PID=$!
	for _ in $(seq 1 100); do
		redis-cli -p "$rport" ping >/dev/null 2>&1 && break
		sleep 0.05
	done
	export SECKILL_REDIS_URL="redis://127.0.0.1:$rport/0"
	BENCH_REDIS=own
fi
rcli() { redis-cli -u "${SECKILL_REDIS_URL:-redis://127.0.0.1:6379/0}" "$@"; }

# listener_pid URL-or-PORT — the process listening on a loopback TCP port
# (ss), for the services' CPU; empty when it cannot be told.
listener_pid() {
	local port=${1##*:}
	port=${port%%/*}
	ss -ltnpH "sport = :$port" 2>/dev/null | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -n 1
}
# The services' servers, whose CPU every run accounts beside the stack's own
# processes (shared with whatever else runs on the box: the "box" row and the
# load average say how busy it was).
redis_url=${SECKILL_REDIS_URL:-redis://127.0.0.1:6379/0}
redis_hostport=${redis_url#redis://}
redis_hostport=${redis_hostport%%/*}
svc_groups=""
for svc in "redis-server=${BENCH_REDIS_PID:-$(listener_pid "$redis_hostport")}" \
	"mariadbd=$(listener_pid 3306)" "beam.smp=$(listener_pid 5672)"; do
	[[ -n ${svc#*=} ]] && svc_groups+=",$svc"
done

# bench_stack_up TAG BINDIR OUT NAME LABEL — start TAG's stack (2 workers, a
# backend, a proxy) from BINDIR's binaries, its reports and logs in OUT, and
# save it as TAG's context.
bench_stack_up() {
	local tag=$1
	[[ -n $CUR_TAG ]] && ctx_save "$CUR_TAG"
	CUR_TAG=$tag
	# shellcheck disable=SC2034 # bench/stack.sh's globals, a fresh stack
	STACK_PIDS=() STACK_NAMES=() STACK_STOPPED=0 STACK_ID="" WORKER_PIDS=()
	# shellcheck disable=SC2034
	STACK_BIN=$2 STACK_OUT=$3 STACK_NAME=$4 BUILD_LABEL=$5
	mkdir -p "$STACK_OUT/logs"
	stack_init
	# Limits far above what the box can send: this measures the purchase
	# path. The archiver looks every second, one second after a sale's end.
	# shellcheck disable=SC2034 # read by stack_write_config
	STACK_EXTRA_TOML='
[worker]
archive_interval = "1s"
archive_grace    = "1s"'
	stack_write_config "$STACK_OUT/seckill.toml" 10000000 10000000
	stack_up "$STACK_OUT/seckill.toml" 2 1
	CPU_GROUPS="proxy=$(stack_pid_of proxy1 | tail -n 1),backend=$(stack_pid_of backend | tail -n 1),worker=$(
		IFS=+
		echo "${WORKER_PIDS[*]}"
	)$svc_groups"
	stack_log "CPU accounted for: $CPU_GROUPS"
	BENCH_FLAGS=$(bench_flag_names "$STACK_BIN/bench")
	[[ -n $BENCH_FLAGS ]] || stack_die "$STACK_BIN/bench -help lists no flags"
	BENCH_CEILINGS=0
	local help
	help=$("$STACK_BIN/bench" ceilings -help 2>&1) || true
	[[ $help == *$'\n  -duration'* ]] && BENCH_CEILINGS=1
	ctx_save "$tag"
}

bench_stack_up new bin "$BENCH_OUT" bench "$NEW_LABEL"
if [[ -n $BASE ]]; then
	bench_stack_up base "$BASE_TMP/bin" "$BENCH_OUT/base" bench-base "$BASE_LABEL"
fi

# for_each_build FUNC — FUNC TAG for every build; with two, the order flips
# from one call to the next (new first, then base first, ...), so that a
# drift of the box's load does not favour one build.
ROUND=0
for_each_build() {
	local order=("${TAGS[@]}") tag
	if ((${#TAGS[@]} == 2 && ROUND % 2 == 1)); then
		order=("${TAGS[1]}" "${TAGS[0]}")
	fi
	ROUND=$((ROUND + 1))
	for tag in "${order[@]}"; do
		"$1" "$tag"
	done
}

# The raw ceilings, in this run, on the same services (names of their own).
sc_ceilings() {
	ctx_use "$1"
	if ((!BENCH_CEILINGS)); then
		stack_log "raw ceilings: the bench of $BUILD_LABEL has no ceilings subcommand: left out"
		return 0
	fi
	stack_log "raw ceilings ($1): $STACK_BIN/bench ceilings"
	"$STACK_BIN/bench" ceilings -config "$STACK_OUT/seckill.toml" -duration "$CEILING_DURATION" \
		-json "$STACK_OUT/ceilings.json" >"$STACK_OUT/ceilings.txt" 2>&1 ||
		{ cat "$STACK_OUT/ceilings.txt" >&2; stack_die "bench ceilings failed"; }
	cat "$STACK_OUT/ceilings.txt" >&2
}

used_memory() { rcli info memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p'; }
# used_dataset — used_memory less Redis's own overhead (clients, scripts, the
# key space's tables): MEMORY STATS dataset.bytes.
used_dataset() { rcli memory stats | awk 'p == "dataset.bytes" { print; exit } { p = $0 }'; }
# keys_bytes PATTERN — bytes held by the keys matching PATTERN (MEMORY
# USAGE, exact); sale_bytes ID — those of one sale.
keys_bytes() {
	local k total=0 n
	while read -r k; do
		[[ -n $k ]] || continue
		n=$(rcli memory usage "$k" samples 0)
		total=$((total + ${n:-0}))
	done < <(rcli --scan --pattern "$1")
	echo "$total"
}
sale_bytes() { keys_bytes "${SECKILL_REDIS_PREFIX}{act:$1}:*"; }

# Every flag as one word (-name=value): bench/compat.sh may leave one out.
common=(-activity=0 -limit=1 -source-ips=200 -hot-share=0 -warmup=1s -drain-timeout=120s -quiet
	# The purchase path alone; scenario 2r adds the read mix back.
	-order-wait=0s -state-poll-rate=0)

# run_bench TAG NAME ARG... — one scenario with TAG's build and stack.
run_bench() {
	local tag=$1 name=$2 rc=0
	shift 2
	ctx_use "$tag"
	local args=(-config="$STACK_OUT/seckill.toml" -targets="$PROXY_URLS" -admin-url="$BACKEND_URL"
		"${common[@]}" -cpu="$CPU_GROUPS" "$@")
	[[ -f $STACK_OUT/ceilings.json ]] && args+=(-ceilings="$STACK_OUT/ceilings.json")
	bench_filter_args "$BENCH_FLAGS" "${args[@]}"
	if ((${#DROPPED_FLAGS[@]})); then
		printf '%s\n' "${DROPPED_FLAGS[@]}" >"$STACK_OUT/$name.dropped"
		stack_log "$name: the bench of $BUILD_LABEL lacks ${DROPPED_FLAGS[*]}: left out"
	fi
	stack_log "$name ($tag): $STACK_BIN/bench ${KEPT_ARGS[*]}"
	printf '%q ' "$STACK_BIN/bench" "${KEPT_ARGS[@]}" >"$STACK_OUT/$name.cmd"
	# A run that could not be made (exit 2: e.g. a service that did not
	# answer in time on a loaded box) is made once more, with a fresh sale;
	# RUN_BEFORE (a command) runs before each try.
	local try
	for try in 1 2; do
		[[ -n ${RUN_BEFORE:-} ]] && eval "$RUN_BEFORE"
		rc=0
		"$STACK_BIN/bench" "${KEPT_ARGS[@]}" -json="$STACK_OUT/$name.json" -html="$STACK_OUT/$name.html" \
			>"$STACK_OUT/$name.txt" 2>"$STACK_OUT/$name.err" || rc=$?
		[[ $rc == 2 && $try == 1 ]] || break
		tail -n 1 "$STACK_OUT/$name.err" >"$STACK_OUT/$name.retried"
		stack_log "$name ($tag): bench could not run ($(cat "$STACK_OUT/$name.retried")); once more in 5 s"
		sleep 5
	done
	if [[ $rc == 2 ]]; then
		cat "$STACK_OUT/$name.err" >&2
		stack_die "$name ($tag): bench could not run"
	fi
	printf '%s (%s): %s\n' "$name" "$tag" "$(tail -n 1 "$STACK_OUT/$name.txt")" >&2
}

jsonget() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"d": d}))' "$@"; }

# 2 and 6: the max rate, then memory per order: Redis used_memory (and the
# sale's own keys) per accepted order while the sale is live (drained: every
# order settled), then after the admin ends it and the archiver archived it.
# Each build measures right after its own run (the other stack idles).
sc_max() {
	ctx_use "$1"
	local mem_before ds_before max_id max_accepted mem_live ds_live keys_live now start archived
	local mem_archived ds_archived all_archived keys_archived
	mem_before=$(used_memory)
	ds_before=$(used_dataset)
	run_bench "$1" max -stock=5000000 -users=20000000 -duration="$DURATION" -tail=0s -connections="$CONNS"
	max_id=$(jsonget "$STACK_OUT/max.json" 'd["run"]["activity_id"]')
	max_accepted=$(jsonget "$STACK_OUT/max.json" 'd["summary"]["accepted"]')
	mem_live=$(used_memory)
	ds_live=$(used_dataset)
	keys_live=$(sale_bytes "$max_id")
	now=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
	start=$(jsonget "$STACK_OUT/max.json" 'd["run"]["started_at"]')
	# A PUT of the same body is safe to repeat: a 503 (a service slow to
	# answer on a loaded box) is tried again.
	curl -fsS --retry 5 --retry-delay 1 --retry-max-time 60 -o /dev/null -X PUT -H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" -H 'Content-Type: application/json' \
		-d "{\"stock\":5000000,\"per_user_limit\":1,\"starts_at\":\"$start\",\"ends_at\":\"$now\"}" \
		"$BACKEND_URL/admin/v1/activities/$max_id" || stack_die "could not end sale $max_id"
	archived=0
	for _ in $(seq 1 300); do
		if [[ $(rcli sismember "${SECKILL_REDIS_PREFIX}seckill:activities" "$max_id") == 0 &&
			-n $(rcli hget "${SECKILL_REDIS_PREFIX}{act:$max_id}:meta" archived) ]]; then
			archived=1
			break
		fi
		sleep 0.2
	done
	((archived)) || stack_log "sale $max_id was not archived within 60 s"
	mem_archived=$(used_memory)
	ds_archived=$(used_dataset)
	all_archived=$(keys_bytes "${SECKILL_REDIS_PREFIX}*")
	keys_archived=$(sale_bytes "$max_id")
	python3 - "$STACK_OUT/memory.json" "$BENCH_REDIS" "$max_accepted" "$mem_before" "$mem_live" "$keys_live" \
		"$mem_archived" "$keys_archived" "$archived" "$ds_before" "$ds_live" "$ds_archived" "$all_archived" <<'PY'
import json, sys
out, redis, acc, before, live, klive, arch, karch, done, dsb, dsl, dsa, alla = sys.argv[1:]
acc, before, live, klive, arch, karch, dsb, dsl, dsa, alla = (int(x or 0) for x in (acc, before, live, klive, arch, karch, dsb, dsl, dsa, alla))
per = lambda b: round(b / acc, 1) if acc else 0
json.dump({"redis": redis, "accepted_orders": acc, "archived": done == "1",
           "used_memory_before": before, "used_memory_live": live, "used_memory_archived": arch,
           "sale_keys_bytes_live": klive, "sale_keys_bytes_archived": karch,
           "used_memory_per_order_live": per(live - before), "used_memory_per_order_archived": per(arch - before),
           "sale_keys_per_order_live": per(klive), "sale_keys_per_order_archived": per(karch),
           "dataset_per_order_live": per(dsl - dsb), "dataset_per_order_archived": per(dsa - dsb),
           "all_keys_bytes_archived": alla},
          open(out, "w"), indent=2)
PY
}

sc_readmix() {
	run_bench "$1" readmix -stock=5000000 -users=20000000 -duration="$DURATION" -tail=0s -connections="$CONNS" \
		-order-wait=3s -state-poll-rate=500
}

# 3: each build at half of its own max rate (2).
sc_half() {
	ctx_use "$1"
	local max_rps half
	max_rps=$(jsonget "$STACK_OUT/max.json" 'int(d["summary"]["requests_per_second"])')
	half=$((max_rps / 2))
	((half > 0)) || half=1
	stack_log "half ($1): open loop at half of its max ($half req/s)"
	run_bench "$1" half -stock=5000000 -users=20000000 -duration="$DURATION" -tail=0s -rate="$half" -max-in-flight=4096
}

sc_soldout() {
	run_bench "$1" soldout -stock=100 -users=1000000 -duration=1s -tail="$DURATION" -connections="$CONNS" -replay-share=0.1
}

sc_soldout_unkeyed() {
	run_bench "$1" soldout-unkeyed -stock=100 -users=1000000 -duration=1s -tail="$DURATION" -connections="$CONNS" -unkeyed-share=1
}

sc_drain() {
	ctx_use "$1"
	RUN_BEFORE="kill -STOP ${WORKER_PIDS[*]}" run_bench "$1" drain -stock=5000000 -users=20000000 -duration="$DURATION" -tail=0s -connections="$CONNS" \
		-before-drain="kill -CONT ${WORKER_PIDS[*]}"
	kill -CONT "${WORKER_PIDS[@]}" 2>/dev/null || true
}

# The steps' headings name no build (stack_log names the live one).
bench_log() { printf 'bench: %s\n' "$*" >&2; }
bench_log "0/5 raw ceilings"
for_each_build sc_ceilings
bench_log "2/5 purchase path at max rate (and memory per order)"
for_each_build sc_max
bench_log "2r/5 purchase path at max rate with the read mix"
for_each_build sc_readmix
bench_log "3/5 purchase path, open loop at half of max"
for_each_build sc_half
bench_log "4/5 sold-out tail"
for_each_build sc_soldout
for_each_build sc_soldout_unkeyed
bench_log "5/5 drain from a deep queue (workers paused during the load)"
for_each_build sc_drain

bench_stop_all

BENCH_NEW_LABEL=$NEW_LABEL BENCH_BASE_LABEL=${BASE_LABEL:-} python3 bench/report.py "$BENCH_OUT" ${BASE:+"$BENCH_OUT/base"}
