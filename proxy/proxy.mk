# proxy targets; included from the top-level Makefile.
.PHONY: bench-proxy fuzz-proxy

# Side-by-side wrk comparison: upstream direct, bare fasthttp pass-through,
# this proxy (limits that never trigger), nginx + limit_req, and 429 answers.
bench-proxy:
	scripts/bench-proxy.sh

FUZZTIME ?= 30s
# Fuzz the client-identity parser (X-Forwarded-For / Forwarded).
fuzz-proxy:
	go test -run '^$$' -fuzz '^FuzzClient$$' -fuzztime $(FUZZTIME) ./proxy/internal/identity/
