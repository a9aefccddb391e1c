# proxy targets; included from the top-level Makefile.
.PHONY: bench-proxy fuzz-proxy

# Side-by-side wrk comparison: upstream direct, bare fasthttp pass-through,
# this proxy (limits that never trigger), nginx + limit_req, and 429 answers.
bench-proxy:
	scripts/bench-proxy.sh

FUZZTIME ?= 30s
# Fuzz the client-identity parser (X-Forwarded-For / Forwarded), the window
# key extraction (header/cookie) and the window key setting.
fuzz-proxy:
	go test -run '^$$' -fuzz '^FuzzClient$$' -fuzztime $(FUZZTIME) ./proxy/internal/identity/
	go test -run '^$$' -fuzz '^FuzzClientKey$$' -fuzztime $(FUZZTIME) ./proxy/internal/limiter/
	go test -run '^$$' -fuzz '^FuzzParseKey$$' -fuzztime $(FUZZTIME) ./conf/
