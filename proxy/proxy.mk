# proxy targets; included from the top-level Makefile.
.PHONY: bench-proxy

# Side-by-side wrk comparison: upstream direct, bare fasthttp pass-through,
# this proxy (limits that never trigger), nginx + limit_req, and 429 answers.
bench-proxy:
	scripts/bench-proxy.sh
