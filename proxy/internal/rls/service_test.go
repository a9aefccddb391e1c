package rls

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlc "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/proxy/internal/limiter"
)

// rig is a Service behind a real gRPC server on a loopback port, and a
// client built from go-control-plane's types (what Envoy sends).
type rig struct {
	svc    *Service
	client pb.RateLimitServiceClient
	conn   *grpc.ClientConn
	reg    *prometheus.Registry
	srv    *Server

	mu    sync.Mutex
	trace map[string][]int64 // window key → admission moments (µs)
}

// serve starts svc's gRPC server and a client of it.
func serve(t testing.TB, svc *Service) (*Server, *grpc.ClientConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(svc, ServerOptions{MaxStreams: 1024, MaxMessageBytes: 64 << 10})
	go func() { _ = srv.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Stop(ctx)
	})
	return srv, conn
}

// newRig serves cfg with windows in store (nil: the test's Redis, through
// a limiter as the proxy builds it).
func newRig(t testing.TB, cfg *Config, store limiter.Store, prefix string, opt func(*Options)) *rig {
	t.Helper()
	if store == nil {
		var rdb redis.UniversalClient
		rdb, prefix = servicetest.Redis(t)
		store = limiter.NewRedis(rdb, "t-"+servicetest.Name(t), 2*time.Second, limiter.NewMetrics(prometheus.NewRegistry()), nil)
	}
	r := &rig{reg: prometheus.NewRegistry(), trace: map[string][]int64{}}
	o := Options{Store: store, KeyPrefix: prefix, Metrics: NewMetrics(r.reg), MaxCached: 1000,
		Trace: func(key string, weight int, at int64) {
			r.mu.Lock()
			for range weight {
				r.trace[key] = append(r.trace[key], at)
			}
			r.mu.Unlock()
		}}
	if opt != nil {
		opt(&o)
	}
	r.svc = New(cfg, o)
	r.srv, r.conn = serve(t, r.svc)
	r.client = pb.NewRateLimitServiceClient(r.conn)
	return r
}

func mustParse(t testing.TB, doc string) *Config {
	t.Helper()
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (r *rig) call(t testing.TB, req *pb.RateLimitRequest) *pb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.client.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func req(domain string, ds ...*rlc.RateLimitDescriptor) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: domain, Descriptors: ds}
}

const over = pb.RateLimitResponse_OVER_LIMIT

// Exactness under concurrency: 50 rounds of 3×L concurrent calls on one
// descriptor (a fresh value per round: a fresh window) admit exactly L,
// and every status says the limit and what remains.
func TestConcurrentCallsAdmitExactlyTheLimit(t *testing.T) {
	t.Parallel()
	const L = 10
	r := newRig(t, mustParse(t, `
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`), nil, "", nil)
	for round := range 50 {
		var admitted atomic.Int32
		var wg sync.WaitGroup
		for range 3 * L {
			wg.Go(func() {
				resp := r.call(t, req("shop", d("user", fmt.Sprint("u", round))))
				st := resp.Statuses[0]
				if st.CurrentLimit.GetRequestsPerUnit() != L || st.CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE {
					t.Errorf("current_limit %v", st.CurrentLimit)
				}
				if resp.OverallCode == pb.RateLimitResponse_OK {
					admitted.Add(1)
				} else if st.LimitRemaining != 0 || st.DurationUntilReset.AsDuration() <= 0 {
					t.Errorf("refused with remaining %d, reset %v", st.LimitRemaining, st.DurationUntilReset.AsDuration())
				}
			})
		}
		wg.Wait()
		if n := admitted.Load(); n != L {
			t.Fatalf("round %d: %d admitted of %d calls, want exactly %d", round, n, 3*L, L)
		}
	}
}

// worst is the most admission moments in any interval of length w (µs).
func worst(at []int64, w int64) int {
	slices.Sort(at)
	n := 0
	for i, j := 0, 0; i < len(at); i++ {
		for at[i]-at[j] >= w {
			j++
		}
		n = max(n, i-j+1)
	}
	return n
}

// Two service instances (each its own limiter store and instance id, as
// two proxies) share a global descriptor's window through Redis: in every
// sliding interval of its length, the moments Redis admitted number at
// most the limit.
func TestTwoInstancesShareTheSlidingWindow(t *testing.T) {
	t.Parallel()
	const L, W = 20, 300 * time.Millisecond
	rdb, prefix := servicetest.Redis(t)
	cfg := mustParse(t, `
domain: shop
descriptors:
  - key: generic_key
    value: checkout
    rate_limit: {unit: 300ms, requests_per_unit: 20}
`)
	var rigs [2]*rig
	for i := range rigs {
		store := limiter.NewRedis(rdb, fmt.Sprintf("inst%d", i), 2*time.Second, limiter.NewMetrics(prometheus.NewRegistry()), nil)
		rigs[i] = newRig(t, cfg, store, prefix, nil)
	}
	end := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			r := rigs[g%2]
			for time.Now().Before(end) {
				r.call(t, req("shop", d("generic_key", "checkout")))
			}
		})
	}
	wg.Wait()
	var at []int64
	per := [2]int{}
	for i, r := range rigs {
		for _, a := range r.trace {
			at = append(at, a...)
			per[i] += len(a)
		}
	}
	w := worst(at, W.Microseconds())
	t.Logf("admitted %d (%d + %d), worst %v interval %d (limit %d)", len(at), per[0], per[1], W, w, L)
	if w > L || len(at) < 2*L || per[0] == 0 || per[1] == 0 {
		t.Fatalf("worst interval %d > %d, or admitted %v", w, L, per)
	}
}

// The README's examples behave as documented there (sliding windows aside).
func TestReadmeExamplesBehave(t *testing.T) {
	t.Parallel()
	c, err := Load(writeExamples(t))
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, c, nil, "", nil)
	calls := func(n int, rq *pb.RateLimitRequest) (ok int, last *pb.RateLimitResponse) {
		for range n {
			last = r.call(t, rq)
			if last.OverallCode == pb.RateLimitResponse_OK {
				ok++
			}
		}
		return ok, last
	}
	t.Run("nested: 5 marketing messages a day per number, 100 per number", func(t *testing.T) {
		ok, _ := calls(8, req("messaging", d("message_type", "marketing", "to_number", "2061111111"), d("to_number", "2061111111")))
		if ok != 5 {
			t.Fatalf("%d admitted, want 5", ok)
		}
		// The marketing refusals did not count on the per-number window
		// (all or nothing): 100 - 5 left there.
		_, last := calls(1, req("messaging", d("to_number", "2061111111")))
		if got := last.Statuses[0].LimitRemaining; got != 94 {
			t.Fatalf("per-number remaining %d, want 94", got)
		}
	})
	t.Run("black-listed address: requests_per_unit 0 always over", func(t *testing.T) {
		if ok, last := calls(3, req("edge_proxy_per_ip", d("remote_address", "50.0.0.5"))); ok != 0 || last.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 0 {
			t.Fatalf("%d admitted (%v)", ok, last)
		}
		if ok, _ := calls(12, req("edge_proxy_per_ip", d("remote_address", "50.0.0.1"))); ok != 10 {
			t.Fatalf("%d admitted, want 10", ok)
		}
	})
	t.Run("depth must match: no limit", func(t *testing.T) {
		_, last := calls(1, req("example4", d("key", "value")))
		if last.Statuses[0].CurrentLimit != nil || last.OverallCode != pb.RateLimitResponse_OK {
			t.Fatalf("%v", last)
		}
	})
	t.Run("unlimited", func(t *testing.T) {
		ok, last := calls(5, req("internal", d("ldap", "x")))
		if ok != 5 || last.Statuses[0].LimitRemaining != math.MaxUint32 || last.Statuses[0].CurrentLimit != nil {
			t.Fatalf("%d admitted, %v", ok, last)
		}
	})
	t.Run("shadow_mode: user-a never limited, user-b at 20", func(t *testing.T) {
		ok, last := calls(15, req("example6", d("service", "auth-service", "user", "user-a")))
		if ok != 15 || last.Statuses[0].Code != pb.RateLimitResponse_OK {
			t.Fatalf("%d admitted, %v", ok, last)
		}
		if ok, _ := calls(22, req("example6", d("service", "auth-service", "user", "user-b"))); ok != 20 {
			t.Fatalf("user-b: %d admitted, want 20", ok)
		}
		if n := value(r.svc.m.descriptors.WithLabelValues("example6", "example6.service.user_user-a", "shadow_over")); n != 5 {
			t.Fatalf("shadow_over = %v, want 5", n)
		}
	})
	t.Run("replaces: 10/s for both, the 5/s limit untouched", func(t *testing.T) {
		both := req("example7", d("key_1", "value_1", "user", "bkthomps"), d("key_2", "value_2", "user", "bkthomps"))
		ok, last := calls(12, both)
		if ok != 10 || last.Statuses[0].CurrentLimit != nil {
			t.Fatalf("%d admitted, want 10; %v", ok, last)
		}
		if ok, _ := calls(7, req("example7", d("key_1", "value_1", "user", "bkthomps"))); ok != 5 {
			t.Fatalf("replaced limit: %d admitted, want 5 (untouched)", ok)
		}
	})
	t.Run("share_threshold: files/* share 10 an hour", func(t *testing.T) {
		a, _ := calls(5, req("example11", d("files", "files/a.pdf")))
		b, _ := calls(5, req("example11", d("files", "files/b.csv")))
		c, _ := calls(1, req("example11", d("files", "files/c.txt")))
		iso, _ := calls(10, req("example11", d("files_no_share", "files_no_share/a.pdf")))
		other, _ := calls(1, req("example11", d("files_no_share", "files_no_share/b.csv")))
		if a != 5 || b != 5 || c != 0 || iso != 10 || other != 1 {
			t.Fatalf("admitted a=%d b=%d c=%d iso=%d other=%d", a, b, c, iso, other)
		}
	})
	t.Run("unknown domain and descriptor: OK, counted", func(t *testing.T) {
		_, last := calls(1, req("nope", d("a", "b")))
		calls(1, req("mongo_cps", d("database", "other")))
		if last.OverallCode != pb.RateLimitResponse_OK || len(last.Statuses) != 1 {
			t.Fatalf("%v", last)
		}
		if n := value(r.svc.m.unmatchedDomain); n != 1 {
			t.Fatalf("unmatched domains %v", n)
		}
		if n := value(r.svc.m.unmatchedDescriptor); n < 1 {
			t.Fatalf("unmatched descriptors %v", n)
		}
	})
}

// hits_addend: the request's, and a descriptor's own, count that many hits.
func TestHitsAddend(t *testing.T) {
	t.Parallel()
	r := newRig(t, mustParse(t, `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 10}
`), nil, "", nil)
	rq := req("d", d("a", "1"))
	rq.HitsAddend = 4
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, over} {
		resp := r.call(t, rq)
		if resp.OverallCode != want {
			t.Fatalf("call %d: %v, want %v", i, resp.OverallCode, want)
		}
		if i == 1 && resp.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("remaining %d, want 2", resp.Statuses[0].LimitRemaining)
		}
	}
	// Per descriptor: b takes 7, a takes 1, in one call.
	rq = req("d", d("a", "2"), d("b", "2"))
	rq.Descriptors[1].HitsAddend = wrapperspb.UInt64(7)
	resp := r.call(t, rq)
	if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 9 || resp.Statuses[1].LimitRemaining != 3 {
		t.Fatalf("%v", resp)
	}
	// Over the limit at once: refused, nothing counted.
	rq = req("d", d("a", "3"))
	rq.HitsAddend = 11
	if resp := r.call(t, rq); resp.OverallCode != over {
		t.Fatalf("11 hits on 10: %v", resp.OverallCode)
	}
	if resp := r.call(t, req("d", d("a", "3"))); resp.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("after a refused weight: %v", resp)
	}
	// A huge hits_addend is refused, not overflowed.
	rq = req("d", d("a", "4"))
	rq.Descriptors[0].HitsAddend = wrapperspb.UInt64(math.MaxUint64)
	if resp := r.call(t, rq); resp.OverallCode != over {
		t.Fatalf("MaxUint64 hits: %v", resp.OverallCode)
	}
}

// Near the limit: admitted hits past rls_near_limit_ratio of a limit are
// counted as the reference server's near_limit counts them (the 9th and
// 10th of 10 at 0.8; with hits_addend, only the hits past the share);
// refused calls count none; a reload of the settings changes the ratio.
func TestNearLimitHits(t *testing.T) {
	t.Parallel()
	r := newRig(t, mustParse(t, `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
`), limiter.NewMemory(), "p:", func(o *Options) { o.NearLimit = 0.8 })
	near := func() float64 { return value(r.svc.m.nearLimit.WithLabelValues("d", "d.a")) }
	for range 12 {
		r.call(t, req("d", d("a", "x")))
	}
	if n := near(); n != 2 {
		t.Fatalf("12 calls on 10 at 0.8: %v near-limit hits, want 2", n)
	}
	r.svc.SetSettings(Settings{NearLimit: 0.5})
	rq := req("d", d("a", "y"))
	rq.HitsAddend = 3
	for range 4 { // used 3, 6 (1 past 5), 9 (3 past), then refused
		r.call(t, rq)
	}
	if n := near(); n != 2+4 {
		t.Fatalf("hits_addend 3 on 10 at 0.5: %v near-limit hits in all, want 6", n)
	}
}

// Envoy's per-route limit override replaces the file's limit; the IETF
// headers name each enforced window.
func TestOverrideAndHeaders(t *testing.T) {
	t.Parallel()
	r := newRig(t, mustParse(t, `
domain: d
descriptors:
  - key: a
    rate_limit: {name: per_a, unit: minute, requests_per_unit: 10}
`), nil, "", func(o *Options) { o.Headers = true })
	rq := req("d", d("a", "1"))
	rq.Descriptors[0].Limit = &rlc.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_SECOND}
	var last *pb.RateLimitResponse
	ok := 0
	for range 3 {
		if last = r.call(t, rq); last.OverallCode == pb.RateLimitResponse_OK {
			ok++
		}
	}
	if ok != 2 || last.Statuses[0].CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_SECOND {
		t.Fatalf("override: %d admitted, %v", ok, last)
	}
	resp := r.call(t, req("d", d("a", "2")))
	var pol, rl string
	for _, h := range resp.ResponseHeadersToAdd {
		switch h.Key {
		case "RateLimit-Policy":
			pol = h.Value
		case "RateLimit":
			rl = h.Value
		}
	}
	if pol != `"per_a";q=10;w=60` || rl != `"per_a";r=9;t=60` {
		t.Fatalf("headers %q, %q", pol, rl)
	}
}

// Malformed requests are InvalidArgument, never a panic.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	r := newRig(t, mustParse(t, "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1}}]"), limiter.NewMemory(), "p:", nil)
	long := strings.Repeat("x", maxValue+1)
	many := req("d")
	for range maxDescriptors + 1 {
		many.Descriptors = append(many.Descriptors, d("a", "b"))
	}
	deep := &rlc.RateLimitDescriptor{}
	for range maxDepth + 1 {
		deep.Entries = append(deep.Entries, &rlc.RateLimitDescriptor_Entry{Key: "a", Value: "b"})
	}
	bad := []*pb.RateLimitRequest{
		{},
		req("", d("a", "b")),
		req("d"),
		req("d", &rlc.RateLimitDescriptor{}),
		req("d", d("", "b")),
		req("d", d("a", long)),
		req(long, d("a", "b")),
		many,
		req("d", deep),
		{Domain: "d", Descriptors: []*rlc.RateLimitDescriptor{{Entries: d("a", "b").Entries, Limit: &rlc.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}}},
		{Domain: "d", Descriptors: []*rlc.RateLimitDescriptor{{Entries: d("a", "b").Entries, Limit: &rlc.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: MaxLimit + 1, Unit: typev3.RateLimitUnit_SECOND}}}},
	}
	for i, rq := range bad {
		_, err := r.client.ShouldRateLimit(context.Background(), rq)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("request %d: %v, want InvalidArgument", i, err)
		}
	}
	// Over the message bound: refused by gRPC itself.
	huge := req("d")
	for range 40 {
		huge.Descriptors = append(huge.Descriptors, d("a", strings.Repeat("y", maxValue)))
	}
	if _, err := r.client.ShouldRateLimit(context.Background(), huge); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("oversized message: %v, want ResourceExhausted", err)
	}
	if n := value(r.svc.m.requests.WithLabelValues("invalid")); n != float64(len(bad)) {
		t.Errorf("invalid = %v, want %d", n, len(bad))
	}
}

// Redis down: each rls_on_redis_error mode answers as documented.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	// Nothing listens on a port just closed: every call fails at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	doc := "domain: d\ndescriptors: [{key: a, rate_limit: {unit: minute, requests_per_unit: 4}}]"
	for _, tc := range []struct {
		mode Mode
		ok   int // admitted of 6
		err  codes.Code
	}{{ModeLocal, 2, codes.OK}, {ModeOpen, 6, codes.OK}, {ModeClosed, 0, codes.OK}, {ModeEnvoy, 0, codes.Unavailable}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
			defer rdb.Close()
			store := limiter.NewRedis(rdb, "down", 200*time.Millisecond, limiter.NewMetrics(prometheus.NewRegistry()), nil)
			// Two live instances: local mode keeps limit / 2.
			r := newRig(t, mustParse(t, doc), store, "p:", func(o *Options) { o.Mode, o.Live = tc.mode, func() int { return 2 } })
			ok := 0
			for range 6 {
				resp, err := r.client.ShouldRateLimit(context.Background(), req("d", d("a", "x")))
				if status.Code(err) != tc.err {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				if err == nil && resp.OverallCode == pb.RateLimitResponse_OK {
					ok++
				}
			}
			if ok != tc.ok {
				t.Fatalf("%d admitted of 6, want %d", ok, tc.ok)
			}
			if n := value(r.svc.m.fallbacks.WithLabelValues(tc.mode.String())); n != 6 {
				t.Fatalf("fallbacks %v, want 6", n)
			}
			if tc.mode != ModeEnvoy {
				if n := value(r.svc.m.descriptors.WithLabelValues("d", "d.a", "degraded")); n != 6 {
					t.Fatalf("degraded descriptors %v, want 6", n)
				}
			}
		})
	}
}

// The negative cache answers a window known full without the store, for
// exactly as long as the store said.
func TestNegativeCache(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.Redis(t)
	m := limiter.NewMetrics(prometheus.NewRegistry())
	store := limiter.NewRedis(rdb, "neg", 2*time.Second, m, nil)
	r := newRig(t, mustParse(t, "domain: d\ndescriptors: [{key: a, rate_limit: {unit: 1s, requests_per_unit: 2}}]"), store, prefix, nil)
	for range 2 {
		if resp := r.call(t, req("d", d("a", "x"))); resp.OverallCode != pb.RateLimitResponse_OK {
			t.Fatal("refused under the limit")
		}
	}
	calls := m.Calls()
	for range 5 {
		if resp := r.call(t, req("d", d("a", "x"))); resp.OverallCode != over {
			t.Fatal("admitted over the limit")
		}
	}
	if m.Calls() != calls || value(r.svc.m.cached) != 5 {
		t.Fatalf("store calls %d → %d, cached %v: want none, 5", calls, m.Calls(), value(r.svc.m.cached))
	}
	time.Sleep(1100 * time.Millisecond)
	if resp := r.call(t, req("d", d("a", "x"))); resp.OverallCode != pb.RateLimitResponse_OK {
		t.Fatal("still refused after the window slid")
	}
}

// Reload: a changed file is picked up by the watcher; an invalid one keeps
// the running rules; the health service says SERVING until Stop.
func TestReloadAndHealth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	write := func(doc string) {
		// Written beside and renamed over, as editors and ConfigMaps do.
		tmp := filepath.Join(dir, ".tmp")
		if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("domain: d\ndescriptors: [{key: a, rate_limit: {unit: minute, requests_per_unit: 1}}]")
	c, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, c, limiter.NewMemory(), "p:", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, err := Watch(ctx, r.svc, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	limitNow := func() uint32 {
		return r.call(t, req("d", d("a", fmt.Sprint(time.Now().UnixNano())))).Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	write("domain: d\ndescriptors: [{key: a, rate_limit: {unit: minute, requests_per_unit: 7}}]")
	waitFor(t, func() bool { return limitNow() == 7 }, "the changed file")
	write("domain: d\ndescriptors: [{key: a, rate_limit: {unit: fortnight, requests_per_unit: 9}}]")
	waitFor(t, func() bool { return value(r.svc.m.reloads.WithLabelValues("error")) >= 1 }, "the invalid file refused")
	if n := limitNow(); n != 7 {
		t.Fatalf("limit %d after an invalid file, want 7 kept", n)
	}
	// SIGHUP's path: Reload directly.
	write("domain: d\ndescriptors: [{key: a, rate_limit: {unit: minute, requests_per_unit: 3}}]")
	if err := r.svc.Reload(file); err != nil || limitNow() != 3 {
		t.Fatalf("Reload: %v", err)
	}

	hc := healthpb.NewHealthClient(r.conn)
	hr, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: ServiceName})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", hr, err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	r.srv.Stop(sctx)
	if _, err := r.client.ShouldRateLimit(context.Background(), req("d", d("a", "x"))); status.Code(err) != codes.Unavailable {
		t.Fatalf("after Stop: %v, want Unavailable", err)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The gRPC server bounds concurrent streams per connection, and a graceful
// stop lets a call in flight finish.
func TestGracefulStopFinishesCallsInFlight(t *testing.T) {
	t.Parallel()
	slow := &slowStore{release: make(chan struct{}), entered: make(chan struct{}, 1)}
	r := newRig(t, mustParse(t, "domain: d\ndescriptors: [{key: a, rate_limit: {unit: minute, requests_per_unit: 5}}]"), slow, "p:", nil)
	done := make(chan error, 1)
	go func() {
		_, err := r.client.ShouldRateLimit(context.Background(), req("d", d("a", "x")))
		done <- err
	}()
	<-slow.entered
	stopped := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.srv.Stop(ctx)
		close(stopped)
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case <-stopped:
		t.Fatal("Stop returned with a call in flight")
	default:
	}
	close(slow.release)
	if err := <-done; err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	<-stopped
}

// slowStore holds every Take until released.
type slowStore struct {
	release chan struct{}
	entered chan struct{}
}

func (s *slowStore) Take(ws []limiter.Want, weight int, out []limiter.Got) (bool, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.release
	return limiter.NewMemory().Take(ws, weight, out)
}

// BenchmarkShouldRateLimit: calls/s through gRPC with 64 concurrent
// streams on one connection against the test's Redis, each call one
// per-user descriptor and one global one (the shape of an edge's call);
// reports Redis script calls per decision and the share shed.
func BenchmarkShouldRateLimit(b *testing.B) {
	rdb, prefix := servicetest.Redis(b)
	m := limiter.NewMetrics(prometheus.NewRegistry())
	// The bound of a call: generous, so that a loaded machine measures
	// throughput rather than sheds (which are counted, not failures).
	store := limiter.NewRedis(rdb, "bench", 250*time.Millisecond, m, nil)
	r := newRig(b, mustParse(b, `
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: generic_key
    value: all
    rate_limit: {unit: second, requests_per_unit: 10000000}
`), store, prefix, func(o *Options) { o.Trace = nil })
	var n, shed atomic.Uint64
	b.ReportAllocs()
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb_ *testing.PB) {
		id := n.Add(1)
		rq := req("bench", d("user", fmt.Sprint("u", id%1000)), d("generic_key", "all"))
		for pb_.Next() {
			if _, err := r.client.ShouldRateLimit(context.Background(), rq); status.Code(err) == codes.Unavailable {
				shed.Add(1)
			} else if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	b.ReportMetric(float64(m.Calls())/float64(b.N), "redis-calls/decision")
	b.ReportMetric(float64(shed.Load())/float64(b.N), "shed/op")
}

// value is a counter's or gauge's value.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if c := d.GetCounter(); c != nil {
		return c.GetValue()
	}
	return d.GetGauge().GetValue()
}

// Reflection is served only when asked for (it describes the server to
// anyone who reaches the port).
func TestReflectionOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	cfg := mustParse(t, "domain: d\ndescriptors: []")
	for _, on := range []bool{false, true} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := NewServer(New(cfg, Options{Store: limiter.NewMemory()}), ServerOptions{MaxStreams: 8, MaxMessageBytes: 4096, Reflection: on})
		go func() { _ = srv.Serve(ln) }()
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
		if err == nil {
			err = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
		}
		var resp *reflectionpb.ServerReflectionResponse
		// Send reports a stream the server already ended as io.EOF; its
		// status (Unimplemented) is Recv's to tell.
		if err == nil || errors.Is(err, io.EOF) {
			resp, err = stream.Recv()
		}
		switch {
		case !on && status.Code(err) != codes.Unimplemented:
			t.Errorf("reflection off: %v, %v; want Unimplemented", resp, err)
		case on && (err != nil || !slices.ContainsFunc(resp.GetListServicesResponse().GetService(),
			func(s *reflectionpb.ServiceResponse) bool { return s.Name == ServiceName })):
			t.Errorf("reflection on: %v, %v; want %s listed", resp, err, ServiceName)
		}
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		srv.Stop(ctx)
		cancel()
	}
}
