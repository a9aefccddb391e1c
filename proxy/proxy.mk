# proxy targets; included from the top-level Makefile.
.PHONY: bench-proxy

# Side-by-side comparison (scripts/bench-proxy.sh; env knobs in its header
# and the README): the forward path with wrk (upstream direct, bare fasthttp
# pass-through, this proxy with limits that never trigger, nginx + limit_req,
# HAProxy stick tables, 429 answers), then the scaling table (crowds of
# 1,000-9,000 distinct clients, per-IP and global limits binding, two proxy
# instances sharing Redis vs nginx vs HAProxy).
bench-proxy:
	scripts/bench-proxy.sh
