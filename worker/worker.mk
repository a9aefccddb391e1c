# Fault injection and fuzzing; included from the top-level Makefile.
#
#   make chaos              the fault-injection suite of issue 5 (e2e/chaos) with
#                           the faults that disturb the shared services enabled
#                           (SECKILL_CHAOS=1: RabbitMQ close_all_connections and
#                           stop_app/start_app, Redis FLUSHDB/CLIENT PAUSE, a
#                           MariaDB restart), run alone, then the proxy's Redis
#                           faults (proxy/internal/edge TestRedisFaults); the
#                           edge limiter's crowd tests run their 5,000-client
#                           form (e2e/chaos TestProxyCrowd*); prints
#                           fault | attempts | accepted | confirmed | failed |
#                           oversold | duplicates | lost | verdict
#                           The suite includes the Redis Cluster master and
#                           Sentinel failovers (e2e/chaos/engines_test.go),
#                           a RabbitMQ cluster node killed mid-sale (its own
#                           3 nodes, e2e/chaos/rabbitcluster_test.go),
#                           then the full form of the engine tests: the
#                           reservation, limiter, backend, worker, proxy and e2e
#                           packages on the local cluster (make cluster)
#   make fuzz               every fuzz target for FUZZTIME each (default 20s)
.PHONY: chaos fuzz

FUZZTIME   ?= 20s
CHAOSFLAGS ?=
CHAOS_OUT  ?= out/chaos

# pkg:Target, one per fuzz target (grep -rn "^func Fuzz" lists them).
FUZZ_TARGETS := \
	./backend/internal/api:FuzzParseQuantity \
	./backend/internal/api:FuzzPurchaseHeaders \
	./backend/internal/api:FuzzParseSpec \
	./proxy/internal/identity:FuzzClient \
	./proxy/internal/limiter:FuzzClientKey \
	./proxy/internal/rls:FuzzParse \
	./proxy/internal/rls:FuzzDescriptorKey \
	./proxy/internal/edge:FuzzPlainPath \
	./conf:FuzzParse \
	./conf:FuzzParseRedisURL \
	./conf:FuzzParseAMQPURLs \
	./conf:FuzzParseKey \
	./internal/ordermsg:FuzzDecode \
	./internal/ordermsg:FuzzDecodeMessage \
	./proxy/internal/token:FuzzExtract \
	./proxy/internal/token:FuzzVerify \
	./proxy/internal/access:FuzzDenied \
	./internal/soldout:FuzzParseEvent \
	./proxy/internal/room:FuzzTicketParse

chaos: services
	@mkdir -p $(CHAOS_OUT)
	@rm -f $(CHAOS_OUT)/rows.tsv
	@status=0; \
	SECKILL_CHAOS=1 SECKILL_CHAOS_REPORT=$(CURDIR)/$(CHAOS_OUT)/rows.tsv \
		$(GO) test -race -count=1 -p 1 -timeout 30m -v $(CHAOSFLAGS) ./e2e/chaos \
		> $(CHAOS_OUT)/chaos.log 2>&1 || status=1; \
	grep -E '^(--- |FAIL|ok|PASS)' $(CHAOS_OUT)/chaos.log || true; \
	if $(GO) test -race -count=1 -run 'TestRedisFaults' ./proxy/internal/edge > $(CHAOS_OUT)/proxy.log 2>&1; then \
		printf 'proxy: redis down/paused/slow × on_redis_error local/open/closed (edge.TestRedisFaults)\t-\t-\t-\t-\t-\t-\t-\tok\n' >> $(CHAOS_OUT)/rows.tsv; \
	else \
		status=1; cat $(CHAOS_OUT)/proxy.log; \
		printf 'proxy: redis down/paused/slow × on_redis_error local/open/closed (edge.TestRedisFaults)\t-\t-\t-\t-\t-\t-\t-\tFAIL\n' >> $(CHAOS_OUT)/rows.tsv; \
	fi; \
	if SECKILL_CHAOS=1 $(GO) test -race -count=1 -timeout 20m -run 'TestShardsHotBurst|TestShardedSaleNoFalseSoldOut' \
			./internal/reservation ./e2e > $(CHAOS_OUT)/shards.log 2>&1; then \
		printf 'stock shards: 1,000 units in 8 shards, 20,000 buyers all on one shard and spread (no false sold out)\t-\t-\t-\t-\t-\t-\t-\tok\n' >> $(CHAOS_OUT)/rows.tsv; \
	else \
		status=1; grep -E '^(--- FAIL|FAIL|panic)|shards_test' $(CHAOS_OUT)/shards.log || true; \
		printf 'stock shards: the full forms (log: $(CHAOS_OUT)/shards.log)\t-\t-\t-\t-\t-\t-\t-\tFAIL\n' >> $(CHAOS_OUT)/rows.tsv; \
	fi; \
	was=; scripts/redis-engines.sh cluster url >/dev/null 2>&1 && was=1; \
	if url=$$(scripts/redis-engines.sh cluster start | tail -1) && \
		SECKILL_TEST_REDIS_URL=$$url SECKILL_TEST_REDIS_CLUSTER_URL=$$url $(GO) test -race -count=1 -timeout 20m \
			$(ENGINE_TESTS) ./internal/verify ./backend/... ./worker/... ./proxy/... ./e2e > $(CHAOS_OUT)/cluster.log 2>&1; then \
		printf 'redis cluster: reservation, limiter, backend, worker, proxy and e2e tests on %s\t-\t-\t-\t-\t-\t-\t-\tok\n' "$$url" >> $(CHAOS_OUT)/rows.tsv; \
	else \
		status=1; grep -E '^(--- FAIL|FAIL|panic)' $(CHAOS_OUT)/cluster.log || true; \
		printf 'redis cluster: the tests on the local cluster (log: $(CHAOS_OUT)/cluster.log)\t-\t-\t-\t-\t-\t-\t-\tFAIL\n' >> $(CHAOS_OUT)/rows.tsv; \
	fi; \
	[ -n "$$was" ] || scripts/redis-engines.sh cluster stop >/dev/null; \
	echo; \
	{ printf 'fault\tattempts\taccepted\tconfirmed\tfailed\toversold\tduplicates\tlost\tverdict\n'; cat $(CHAOS_OUT)/rows.tsv; } \
		| column -t -s "$$(printf '\t')" -o ' | '; \
	if [ $$status -ne 0 ]; then echo "chaos: FAIL (log: $(CHAOS_OUT)/chaos.log)"; exit 1; fi; \
	echo "chaos: ok (log: $(CHAOS_OUT)/chaos.log)"

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "$(GO) test -run '^$$' -fuzz '^$$name\$$' -fuzztime $(FUZZTIME) $$pkg"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done
