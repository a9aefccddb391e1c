#!/usr/bin/env bash
# bench.sh — `make bench`: one run, side by side, saved as out/bench/bench.json
# and out/bench/bench.md (and printed):
#   1. proxy forward path      scripts/bench-proxy.sh (wrk), when present
#   2. purchase, max rate      closed loop through a proxy, limits out of the
#                              way, workers running: accepted/s and confirmed
#                              orders/s end to end (load + drain)
#   3. purchase, half rate     open loop at half of (2): p99 of accepted orders
#   2r. max rate, read mix     (2) with the read mix of a real sale: sale-state
#                              polls through the warm-up and a long-poll of
#                              each accepted order until it settles
#   4. sold-out tail           sold-out answers/s once the stock is gone, with
#                              keyed purchases (the backend answers: a key may
#                              name an order) and with unkeyed ones (the
#                              proxy answers from its sold-out flag)
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
# The first table printed is issue 11's (also at the top of bench.md, with
# the exact command of each scenario).
#
# Environment: BENCH_OUT (out/bench), BENCH_DURATION (10s), BENCH_CONNS (128),
# BENCH_CEILING_DURATION (3s, each ceiling), BENCH_SKIP_PROXY=1 (skip 1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin"

STACK_NAME=bench
STACK_OUT=${BENCH_OUT:-out/bench}
DURATION=${BENCH_DURATION:-10s}
CONNS=${BENCH_CONNS:-128}
# shellcheck source=stack.sh
source bench/stack.sh

rm -rf "$STACK_OUT"
mkdir -p "$STACK_OUT"
for b in proxy backend worker bench; do
	[[ -x bin/$b ]] || { echo "bench: bin/$b is missing (make build)" >&2; exit 2; }
done

BENCH_REDIS_PID=""
bench_cleanup() {
	stack_stop
	if [[ -n $BENCH_REDIS_PID ]]; then
		kill "$BENCH_REDIS_PID" 2>/dev/null || true
		wait "$BENCH_REDIS_PID" 2>/dev/null || true
	fi
}
trap 'bench_cleanup' EXIT
trap 'echo "bench: interrupted" >&2; exit 130' INT TERM

# 1. The proxy's forward path, from the edge-proxy work.
if [[ -x scripts/bench-proxy.sh && -z ${BENCH_SKIP_PROXY:-} ]]; then
	stack_log "1/5 proxy forward path (scripts/bench-proxy.sh)"
	scripts/bench-proxy.sh >"$STACK_OUT/proxy.txt" 2>"$STACK_OUT/logs-proxy.txt" ||
		echo "bench-proxy.sh failed; see $STACK_OUT/logs-proxy.txt" >>"$STACK_OUT/proxy.txt"
fi

stack_init
# The stack gets a Redis of its own (when redis-server is installed), so that
# INFO's used_memory is this stack's alone: the memory figures below.
BENCH_REDIS=shared
if command -v redis-server >/dev/null 2>&1; then
	rport=$(stack_free_port) || stack_die "no free port"
	redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
		>"$STACK_OUT/logs/redis.log" 2>&1 &
	BENCH_REDIS_PID=$!
	for _ in $(seq 1 100); do
		redis-cli -p "$rport" ping >/dev/null 2>&1 && break
		sleep 0.05
	done
	export SECKILL_REDIS_URL="redis://127.0.0.1:$rport/0"
	BENCH_REDIS=own
fi
rcli() { redis-cli -u "${SECKILL_REDIS_URL:-redis://127.0.0.1:6379/0}" "$@"; }
# Limits far above what the box can send: this measures the purchase path.
# The archiver looks every second, one second after a sale's end.
STACK_EXTRA_TOML='
[worker]
archive_interval = "1s"
archive_grace    = "1s"'
stack_write_config "$STACK_OUT/seckill.toml" 10000000 10000000
stack_up "$STACK_OUT/seckill.toml" 2 1

# listener_pid URL-or-PORT — the process listening on a loopback TCP port
# (ss), for the services' CPU; empty when it cannot be told.
listener_pid() {
	local port=${1##*:}
	port=${port%%/*}
	ss -ltnpH "sport = :$port" 2>/dev/null | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -n 1
}
# The processes whose CPU every run accounts (bench -cpu): the stack's own,
# and the services' servers (shared with whatever else runs on the box: the
# "box" row and the load average say how busy it was).
cpu_groups="proxy=$(stack_pid_of proxy1 | tail -n 1),backend=$(stack_pid_of backend | tail -n 1),worker=$(
	IFS=+
	echo "${WORKER_PIDS[*]}"
)"
redis_url=${SECKILL_REDIS_URL:-redis://127.0.0.1:6379/0}
redis_hostport=${redis_url#redis://}
redis_hostport=${redis_hostport%%/*}
for svc in "redis-server=${BENCH_REDIS_PID:-$(listener_pid "$redis_hostport")}" \
	"mariadbd=$(listener_pid 3306)" "beam.smp=$(listener_pid 5672)"; do
	[[ -n ${svc#*=} ]] && cpu_groups+=",$svc"
done
stack_log "CPU accounted for: $cpu_groups"

# The raw ceilings, in this run, on the same services (names of their own).
stack_log "0/5 raw ceilings (bin/bench ceilings)"
bin/bench ceilings -config "$STACK_OUT/seckill.toml" -duration "${BENCH_CEILING_DURATION:-3s}" \
	-json "$STACK_OUT/ceilings.json" >"$STACK_OUT/ceilings.txt" 2>&1 ||
	{ cat "$STACK_OUT/ceilings.txt" >&2; stack_die "bench ceilings failed"; }
cat "$STACK_OUT/ceilings.txt" >&2

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

common=(-config "$STACK_OUT/seckill.toml" -targets "$PROXY_URLS" -admin-url "$BACKEND_URL"
	-activity 0 -limit 1 -source-ips 200 -hot-share 0 -warmup 1s -drain-timeout 120s -quiet
	-cpu "$cpu_groups" -ceilings "$STACK_OUT/ceilings.json"
	# The purchase path alone; scenario 2r adds the read mix back.
	-order-wait 0s -state-poll-rate 0)

run_bench() { # name args...
	local name=$1 rc=0
	shift
	stack_log "$name: bin/bench $*"
	printf '%q ' bin/bench "${common[@]}" "$@" >"$STACK_OUT/$name.cmd"
	bin/bench "${common[@]}" "$@" -json "$STACK_OUT/$name.json" -html "$STACK_OUT/$name.html" \
		>"$STACK_OUT/$name.txt" 2>"$STACK_OUT/$name.err" || rc=$?
	if [[ $rc == 2 ]]; then
		cat "$STACK_OUT/$name.err" >&2
		stack_die "$name: bench could not run"
	fi
	tail -n 1 "$STACK_OUT/$name.txt" >&2
}

jsonget() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"d": d}))' "$@"; }

stack_log "2/5 purchase path at max rate"
mem_before=$(used_memory)
ds_before=$(used_dataset)
run_bench max -stock 5000000 -users 20000000 -duration "$DURATION" -tail 0s -connections "$CONNS"
max_rps=$(jsonget "$STACK_OUT/max.json" 'int(d["summary"]["requests_per_second"])')

# Memory per order: Redis used_memory (and the sale's own keys) per accepted
# order while the sale is live (drained: every order settled), then after the
# admin ends it and the archiver archived it.
max_id=$(jsonget "$STACK_OUT/max.json" 'd["run"]["activity_id"]')
max_accepted=$(jsonget "$STACK_OUT/max.json" 'd["summary"]["accepted"]')
mem_live=$(used_memory)
ds_live=$(used_dataset)
keys_live=$(sale_bytes "$max_id")
now=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
start=$(jsonget "$STACK_OUT/max.json" 'd["run"]["started_at"]')
curl -fsS -o /dev/null -X PUT -H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" -H 'Content-Type: application/json' \
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
all_archived=$(keys_bytes '*')
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

stack_log "2r/5 purchase path at max rate with the read mix"
run_bench readmix -stock 5000000 -users 20000000 -duration "$DURATION" -tail 0s -connections "$CONNS" \
	-order-wait 3s -state-poll-rate 500

half=$((max_rps / 2))
((half > 0)) || half=1
stack_log "3/5 purchase path, open loop at half of max ($half req/s)"
run_bench half -stock 5000000 -users 20000000 -duration "$DURATION" -tail 0s -rate "$half" -max-in-flight 4096

stack_log "4/5 sold-out tail"
run_bench soldout -stock 100 -users 1000000 -duration 1s -tail "$DURATION" -connections "$CONNS"
run_bench soldout-unkeyed -stock 100 -users 1000000 -duration 1s -tail "$DURATION" -connections "$CONNS" -unkeyed-share 1

stack_log "5/5 drain from a deep queue (workers paused during the load)"
kill -STOP "${WORKER_PIDS[@]}"
run_bench drain -stock 5000000 -users 20000000 -duration "$DURATION" -tail 0s -connections "$CONNS" \
	-before-drain "kill -CONT ${WORKER_PIDS[*]}"
kill -CONT "${WORKER_PIDS[@]}" 2>/dev/null || true

stack_stop

python3 - "$STACK_OUT" <<'PY'
import json, os, re, sys
out = sys.argv[1]
def load(n):
    with open(os.path.join(out, n + ".json")) as f:
        return json.load(f)
def lat(d, cls):
    for l in d["latency"]:
        if l["outcome"] == cls:
            return l
    return {"p50_ms": 0, "p99_ms": 0, "p99_9_ms": 0, "count": 0}
mx, half, so, dr, mem = load("max"), load("half"), load("soldout"), load("drain"), load("memory")
rm, sou = load("readmix"), load("soldout-unkeyed")
ceil = {c["name"]: c for c in json.load(open(os.path.join(out, "ceilings.json")))}
rows = [
    ("purchase, max rate (closed loop)", "accepted orders/s",
     mx["summary"]["accepted"] / max(mx["summary"]["seconds"], 1e-9), "≥ 8000 confirmed/s",
     "%d req/s; p99 %.1f ms; %.0f confirmed/s incl. drain" % (mx["summary"]["requests_per_second"], lat(mx, "202")["p99_ms"], mx["summary"]["confirmed_per_second_end_to_end"]), mx["verdict_line"]),
    ("purchase, half rate (open loop %d/s)" % half["run"]["rate"], "p99 of 202 (ms)",
     lat(half, "202")["p99_ms"], "≤ 10 ms",
     "p50 %.2f ms, p99.9 %.1f ms, %d accepted" % (lat(half, "202")["p50_ms"], lat(half, "202")["p99_9_ms"], lat(half, "202")["count"]), half["verdict_line"]),
    ("sold-out tail (closed loop)", "sold-out answers/s",
     so["summary"]["sold_out_per_second_tail"], "≥ 30000/s",
     "p99 %.2f ms" % lat(so, "409 sold_out")["p99_ms"], so["verdict_line"]),
    ("drain from a deep queue", "orders/s",
     dr["drain"]["orders_per_second"], "≥ 20000/s",
     "%d orders in %.2f s" % (dr["drain"]["orders"], dr["drain"]["seconds"]), dr["verdict_line"]),
    ("Redis memory, live sale (max-rate run, drained)", "used_memory B/order",
     mem["used_memory_per_order_live"], "≤ 200 B/order",
     "sale's keys %.1f B/order (MEMORY USAGE), dataset %.1f B/order; %d accepted orders; %s Redis" % (mem["sale_keys_per_order_live"], mem["dataset_per_order_live"], mem["accepted_orders"], mem["redis"]), mx["verdict_line"]),
    ("Redis memory, same sale archived", "used_memory B/order",
     mem["used_memory_per_order_archived"], "0 B/order",
     "sale's keys %d B in all (summary), dataset %.1f B/order%s" % (mem["sale_keys_bytes_archived"], mem["dataset_per_order_archived"], "" if mem["archived"] else "; NOT ARCHIVED"), mx["verdict_line"]),
]
proxy = ""
p = os.path.join(out, "proxy.txt")
if os.path.exists(p):
    proxy = open(p).read().rstrip()
# The forward path from scripts/bench-proxy.sh: the proxy's req/s over the
# bare pass-through's, and each one's CPU per request (the proxy's row:
# target req/s p50 p99 non-2xx cpu redis-cpu sum cmds/req ratios).
fwd = None
m = re.search(r"^passthrough\s+([\d.]+)\s+\S+\s+\S+\s+\S+\s+([\d.]+)\s.*\s[\d.]+x direct$", proxy, re.M)
n = re.search(r"^proxy\s+([\d.]+)\s+\S+\s+\S+\s+\S+\s+([\d.]+)\s+(\S+)\s.*\s([\d.]+)x passthrough$", proxy, re.M)
if m and n:
    fwd = {"passthrough_rps": float(m.group(1)), "passthrough_us": float(m.group(2)),
           "proxy_rps": float(n.group(1)), "proxy_us": float(n.group(2)), "ratio": float(n.group(4)),
           "redis_us": float(n.group(3)) if re.fullmatch(r"[\d.]+", n.group(3)) else None}
load_line = ""
lm = re.search(r"load average ([\d. ]+) before, ([\d. ]+) after", proxy)
if lm:
    load_line = "%s → %s" % (lm.group(1).split()[0], lm.group(2).split()[0])

# CPU µs per accepted order (per answer for the sold-out tail) by process.
PROCS = ["proxy", "backend", "worker", "redis-server", "mariadbd", "beam.smp", "box"]
def cpu(d, per):
    c = d.get("cpu") or {}
    by = {x["name"]: x for x in c.get("processes", [])}
    vals = {}
    for name in PROCS:
        x = by.get(name)
        vals[name] = None if x is None or x.get("error") else x[per]
    load = "%.2f → %.2f" % (c["load_average_start"][0], c["load_average_end"][0]) if c else ""
    return vals, load
def ratio(d, name, figure):
    for c in d.get("ceilings") or []:
        if c["name"] == name and c["figure"] == figure:
            return c["ratio"]
    return None
def cmd(n):
    return open(os.path.join(out, n + ".cmd")).read().strip()

acc_s = mx["summary"]["accepted_per_second_rush"]
conf_s = mx["summary"]["confirmed_per_second_end_to_end"]
h202 = lat(half, "202")
issue = [
    {"scenario": "purchase, max rate (closed loop through a proxy)",
     "figure": "%.0f accepted/s; %.0f confirmed/s incl. drain" % (acc_s, conf_s), "aim": "≥ 10,000 accepted/s, ≥ 8,000 confirmed/s",
     "ceilings": "%.3f× reserve, %.3f× publish; confirmed %.3f× transaction" % tuple(x or 0 for x in (ratio(mx, "reserve", "accepted/s (rush)"), ratio(mx, "publish", "accepted/s (rush)"), ratio(mx, "transaction", "confirmed/s (end to end)"))),
     "cpu": cpu(mx, "us_per_accepted_order"), "per": "accepted order", "command": cmd("max"), "verdict": mx["verdict_line"]},
    {"scenario": "purchase, max rate, with the read mix (a long-poll per 202)",
     "figure": "%.0f accepted/s; %.0f confirmed/s incl. drain" % (rm["summary"]["accepted_per_second_rush"], rm["summary"]["confirmed_per_second_end_to_end"]), "aim": "(not in the issue)",
     "ceilings": "%.3f× reserve, %.3f× publish" % tuple(x or 0 for x in (ratio(rm, "reserve", "accepted/s (rush)"), ratio(rm, "publish", "accepted/s (rush)"))),
     "cpu": cpu(rm, "us_per_accepted_order"), "per": "accepted order", "command": cmd("readmix"), "verdict": rm["verdict_line"]},
    {"scenario": "purchase, open loop at half of max (%d/s)" % half["run"]["rate"],
     "figure": "p99 of 202 %.1f ms (p50 %.2f)" % (h202["p99_ms"], h202["p50_ms"]), "aim": "p99 ≤ 10 ms at half of the new max",
     "ceilings": "", "cpu": cpu(half, "us_per_accepted_order"), "per": "accepted order", "command": cmd("half"), "verdict": half["verdict_line"]},
    {"scenario": "drain of a deep queue",
     "figure": "%.0f orders/s" % dr["drain"]["orders_per_second"], "aim": "≥ 25,000 orders/s",
     "ceilings": "%.3f× transaction" % (ratio(dr, "transaction", "drain orders/s") or 0),
     "cpu": cpu(dr, "us_per_accepted_order"), "per": "accepted order", "command": cmd("drain"), "verdict": dr["verdict_line"]},
    {"scenario": "sold-out tail, keyed purchases (answered by the backend)",
     "figure": "%.0f answers/s" % so["summary"]["sold_out_per_second_tail"], "aim": "keep ≥ 50,000",
     "ceilings": "", "cpu": cpu(so, "us_per_answer"), "per": "answer", "command": cmd("soldout"), "verdict": so["verdict_line"]},
    {"scenario": "sold-out tail, unkeyed purchases (answered by the proxy)",
     "figure": "%.0f answers/s" % sou["summary"]["sold_out_per_second_tail"], "aim": "keep ≥ 50,000",
     "ceilings": "", "cpu": cpu(sou, "us_per_answer"), "per": "answer", "command": cmd("soldout-unkeyed"), "verdict": sou["verdict_line"]},
]
if fwd:
    issue.append({"scenario": "forward path vs bare fasthttp pass-through",
                  "figure": "%.2f× (%.0f vs %.0f req/s)" % (fwd["ratio"], fwd["proxy_rps"], fwd["passthrough_rps"]), "aim": "≥ 0.9×",
                  "ceilings": "CPU per request %.1f µs vs %.1f µs (%.2f×)" % (fwd["proxy_us"], fwd["passthrough_us"], fwd["passthrough_us"] / fwd["proxy_us"] if fwd["proxy_us"] else 0),
                  "cpu": ({"proxy": fwd["proxy_us"], "redis-server": fwd["redis_us"]}, load_line), "per": "request", "command": "scripts/bench-proxy.sh (make bench-proxy)", "verdict": ""})

summary = {"scenarios": [{"name": r[0], "metric": r[1], "value": round(r[2], 2), "aim": r[3], "detail": r[4], "verdict": r[5]} for r in rows],
           "issue_table": [{k: v for k, v in x.items() if k != "cpu"} | {"cpu_us": x["cpu"][0], "cpu_per": x["per"], "load_average": x["cpu"][1]} for x in issue],
           "ceilings": list(ceil.values()),
           "proxy_forward_path": proxy}
with open(os.path.join(out, "bench.json"), "w") as f:
    json.dump(summary, f, indent=2)

def fmt(v):
    return "–" if v is None else "%.0f" % v if v >= 100 else "%.1f" % v
md = ["# seckill bench", "",
      "| scenario | figure | aim | ratio to the raw ceilings of this run | " + " | ".join("CPU µs " + p for p in PROCS) + " | per | load (1 min) |",
      "|---|---|---|---|" + "---:|" * len(PROCS) + "---|---|"]
for x in issue:
    vals, load = x["cpu"]
    md.append("| %s | %s | %s | %s | %s | %s | %s |" % (x["scenario"], x["figure"], x["aim"], x["ceilings"],
              " | ".join(fmt(vals.get(p)) for p in PROCS), x["per"], load))
md += ["", "Raw ceilings (bin/bench ceilings, same run, same services): " +
       "; ".join("%s %.0f %s (%s)" % (c["name"], c["per_second"], c["unit"], c["detail"]) for c in ceil.values()) + ".",
       "", "Commands (inside `make bench`, after `bench/stack.sh` started 2 workers, a backend and a proxy):", ""]
md += ["* %s: `%s`" % (x["scenario"], x["command"]) for x in issue]
md += ["", "| scenario | metric | value | aim | detail | verdict |", "|---|---|---:|---|---|---|"]
for r in rows:
    md.append("| %s | %s | %.1f | %s | %s | `%s` |" % (r[0], r[1], r[2], r[3], r[4], r[5]))
if proxy:
    md += ["", "## Proxy forward path (scripts/bench-proxy.sh)", "", "```", proxy, "```"]
md += ["", "CPU: user + system time per process from /proc, from the rush's start until the queue was drained; box is the whole machine (other processes on it included). The services' CPU includes whatever else used them meanwhile.",
       "", "Per-scenario reports: max.html, half.html, soldout.html, drain.html (and .json, .txt, .cmd) beside this file."]
with open(os.path.join(out, "bench.md"), "w") as f:
    f.write("\n".join(md) + "\n")

w = max(len(x["scenario"]) for x in issue)
print("%-*s  %-44s %s" % (w, "scenario", "figure", "ratio to the raw ceilings"))
for x in issue:
    print("%-*s  %-44s %s" % (w, x["scenario"], x["figure"], x["ceilings"]))
print("\n%-*s  %s  %-15s %s" % (w, "CPU µs per order", "".join("%13s" % p for p in PROCS), "per", "load (1 min)"))
for x in issue:
    vals, load = x["cpu"]
    print("%-*s  %s  %-15s %s" % (w, x["scenario"], "".join("%13s" % fmt(vals.get(p)) for p in PROCS), x["per"], load))
print("\nraw ceilings: " + "; ".join("%s %.0f %s" % (c["name"], c["per_second"], c["unit"]) for c in ceil.values()))
print()
w = max(len(r[0]) for r in rows)
print("%-*s  %-20s %10s  %-20s %s" % (w, "scenario", "metric", "value", "aim", "detail"))
for r in rows:
    print("%-*s  %-20s %10.1f  %-20s %s" % (w, r[0], r[1], r[2], r[3], r[4]))
for r in rows:
    if not r[5].startswith("verdict: ok"):
        print("%s: %s" % (r[0], r[5]))
if proxy:
    print("\nproxy forward path (scripts/bench-proxy.sh):\n" + proxy)
print("\nsaved: %s/bench.json, %s/bench.md" % (out, out))
PY
