# deploy targets; included from the top-level Makefile.
#
#   make deploy-deps   install Prometheus and promtool (Debian's prometheus
#                      package) when missing: the rule, dashboard and
#                      real-Prometheus tests need them, so `make test` runs it
#   make deploy-check  promtool check/test rules, check config
.PHONY: deploy-deps deploy-check

deploy-deps:
	@if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "deploy-deps: installing prometheus (promtool and the server for the deploy/ tests)"; \
			apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null; \
		else \
			echo "deploy-deps: prometheus missing and cannot install it (not root / no apt-get); the deploy tests will skip (or fail under CI)"; \
		fi; \
	fi

deploy-check: deploy-deps
	cd deploy/prometheus && promtool check rules alerts.yml && promtool test rules alerts_test.yml && promtool check config prometheus.yml

test: deploy-deps
