# bench targets; included from the top-level Makefile.
#
#   make demo            the flash-sale demo (README "make demo"): build, services,
#                        2 workers + backend + 2 proxies, bench, verdict last
#   make demo QUICK=1    the short form (≤ 60 s) that .ci/run runs
#   make demo RABBIT=cluster  on the local 3-node RabbitMQ cluster (make rabbit-cluster)
#   make bench           side-by-side performance run -> out/bench/{bench.json,bench.md}
#   make bench BASE=<git ref>
#                        the same for this tree and for that ref's binaries (built in
#                        a git worktree of their own), alternately on the same
#                        services; the report sets the ratios new/base beside the
#                        figures; 8 minutes on a busy 2-core box with BASE's binaries
#                        in the build cache, ~16 with a cold build (BASE's reports:
#                        out/bench/base/)
#   make bench QUICK=1   the short form (2 s scenarios, no bench-proxy; 1.5 min without
#                        BASE): checks the mechanism, not the speed
#   make bench-table     the same run; its first table is issue 11's (figures, ratios
#                        to the raw ceilings of the run, CPU µs per order per process,
#                        load average) -> out/bench/bench.md; about 5 minutes
#   make bench-deps      install headless Chromium (the HTML report test needs it)
#   make bench-read      sale-state reads/s through the proxy: today's path, the
#                        caches, the sold-out edge answer -> out/bench-read/
.PHONY: demo bench bench-table bench-deps bench-read

QUICK ?=
REDIS ?=
RABBIT ?=
BASE  ?=

demo:
	QUICK=$(QUICK) REDIS=$(REDIS) RABBIT=$(RABBIT) scripts/demo.sh

bench: build services
	BASE=$(BASE) QUICK=$(QUICK) bench/bench.sh

# The issue-11 table: what the lead re-runs after a change of the purchase
# path, with the same commands (bench.md lists them).
bench-table: bench

bench-read: build services
	scripts/bench-read.sh

# The HTML report test renders the report in headless Chromium; under CI it
# fails without one, so `make test` installs it first (as root, when missing).
bench-deps:
	@if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "bench-deps: installing chromium (headless HTML report test)"; \
			apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium fonts-liberation >/dev/null; \
		else \
			echo "bench-deps: chromium missing and cannot install it (not root / no apt-get); the HTML render test will skip (or fail under CI)"; \
		fi; \
	fi

test: bench-deps
