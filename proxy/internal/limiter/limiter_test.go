package limiter

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

func TestMatch(t *testing.T) {
	rs, err := Compile([]conf.Rule{
		{Name: "buy", Methods: []string{"POST"}, PathPrefix: "/api/v1/activities/", PerIP: &conf.Window{Limit: 1, Window: conf.D(time.Second)}},
		{Name: "api", PathPrefix: "/api/", Global: &conf.Window{Limit: 1, Window: conf.D(time.Second)}},
	}, "p:", nil)
	servicetest.Must(t, err, "compile")
	for _, tc := range []struct {
		method, path string
		want         int
	}{{"POST", "/api/v1/activities/1/purchase", 2}, {"GET", "/api/v1/activities/1", 1}, {"GET", "/other", 0}} {
		if got := len(rs.Match(nil, []byte(tc.method), []byte(tc.path))); got != tc.want {
			t.Errorf("%s %s: %d rules, want %d", tc.method, tc.path, got, tc.want)
		}
	}
	if _, err := Compile([]conf.Rule{{Name: "x", PathPrefix: "/"}}, "", nil); err == nil {
		t.Error("rule without windows compiled")
	}
}

// BenchmarkCheckLeased: the hot path once leases are warm (one client, limits
// that never trigger): no Redis round trip for most requests.
func BenchmarkCheckLeased(b *testing.B) {
	rdb, prefix := servicetest.Redis(b)
	m := NewMetrics(prometheus.NewRegistry())
	rs, err := Compile([]conf.Rule{{Name: "b", PathPrefix: "/",
		PerIP:  &conf.Window{Limit: 10_000_000, Window: conf.D(time.Second)},
		Global: &conf.Window{Limit: 10_000_000, Window: conf.D(time.Second)}}}, prefix, m)
	servicetest.Must(b, err, "compile")
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: 50 * time.Millisecond, Instance: "bench", Metrics: m})
	req := Request{Method: []byte("GET"), Path: []byte("/x"), Addr: []byte("127.0.0.1")}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var d Decision
		for pb.Next() {
			d.Reset()
			l.Check(rs, req, &d)
			if d.Outcome != Admit {
				b.Fatal("limited")
			}
		}
	})
	b.ReportMetric(float64(m.Calls())/float64(b.N), "redis-calls/op")
}

// fakeHeader serves one header and one cookie.
type fakeHeader struct{ name, value, cookie, cvalue []byte }

func (h *fakeHeader) PeekBytes(n []byte) []byte {
	if string(n) == string(h.name) {
		return h.value
	}
	return nil
}

func (h *fakeHeader) CookieBytes(n []byte) []byte {
	if string(n) == string(h.cookie) {
		return h.cvalue
	}
	return nil
}

// The hot path allocates nothing: a decision from a warm lease (address,
// header and cookie keyed windows plus a global one, metrics counted) and a
// refusal from the negative cache.
func TestHotPathAllocs(t *testing.T) {
	rdb, prefix := servicetest.Redis(t)
	m := NewMetrics(prometheus.NewRegistry())
	big := &conf.Window{Limit: 10_000_000, Window: conf.D(10 * time.Second)}
	rs, err := Compile([]conf.Rule{
		{Name: "addr", PathPrefix: "/", PerIP: big, Global: big},
		{Name: "hdr", PathPrefix: "/", PerIP: &conf.Window{Limit: 10_000_000, Window: conf.D(10 * time.Second), Key: "header:X-User-ID"}},
		{Name: "ck", PathPrefix: "/", PerIP: &conf.Window{Limit: 10_000_000, Window: conf.D(10 * time.Second), Key: "cookie:session"}},
		{Name: "spent", PathPrefix: "/spent", PerIP: &conf.Window{Limit: 1, Window: conf.D(time.Hour)}},
	}, prefix, m)
	servicetest.Must(t, err, "compile")
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: time.Second, Instance: "allocs", Metrics: m})
	h := &fakeHeader{name: []byte("X-User-ID"), value: []byte("user-1"), cookie: []byte("session"), cvalue: []byte("s-1")}
	req := Request{Method: []byte("GET"), Path: []byte("/x"), Addr: []byte("127.0.0.1"), Header: h, Trusted: true}
	var d Decision
	check := func(r Request) Outcome {
		d.Reset()
		l.Check(rs, r, &d)
		return d.Outcome
	}
	// Warm up until every window holds a lease large enough for the runs.
	for i := 0; i < 4000; i++ {
		if check(req) != Admit {
			t.Fatal("limited while warming up")
		}
	}
	// Measure runs that needed no refill (a refill's Redis call allocates;
	// AllocsPerRun's integer average could hide it).
	for try := 0; ; try++ {
		calls := m.Calls()
		a := testing.AllocsPerRun(100, func() { check(req) })
		if m.Calls() != calls {
			if try == 20 {
				t.Fatal("every measurement straddled a refill")
			}
			continue
		}
		if a != 0 {
			t.Errorf("leased decision: %v allocs, want 0", a)
		}
		break
	}
	spent := Request{Method: []byte("GET"), Path: []byte("/spent"), Addr: []byte("127.0.0.2")}
	check(spent)
	if check(spent) != Limited {
		t.Fatal("second request in an hour-long window of 1 admitted")
	}
	if a := testing.AllocsPerRun(200, func() { check(spent) }); a != 0 {
		t.Errorf("negative-cache refusal: %v allocs, want 0", a)
	}
}

// FuzzClientKey: any header or cookie value yields a bounded key of the
// expected form, a missing or empty one falls back to the address, and so
// does one nobody vouches for; two different values never share a key.
func FuzzClientKey(f *testing.F) {
	f.Add([]byte("u1"), []byte("u2"), false)
	f.Add([]byte("1.2.3.4"), []byte(""), true)
	f.Add([]byte("{rl:a:1.2.3.4}"), []byte("a:1.2.3.4"), false)
	f.Add(make([]byte, 5000), []byte("\x00"), true)
	w := &Window{Kind: PerIP, Source: FromHeader, Name: []byte("X-User-ID")}
	wc := &Window{Kind: PerIP, Source: FromCookie, Name: []byte("session")}
	f.Fuzz(func(t *testing.T, v1, v2 []byte, cookie bool) {
		win := w
		if cookie {
			win = wc
		}
		key := func(v []byte) string {
			h := &fakeHeader{name: w.Name, value: v, cookie: wc.Name, cvalue: v}
			return string(appendClientKey(nil, win, Request{Addr: []byte("203.0.113.9"), Header: h, Trusted: true}))
		}
		k1, k2 := key(v1), key(v2)
		h := &fakeHeader{name: w.Name, value: v1, cookie: wc.Name, cvalue: v1}
		if k := string(appendClientKey(nil, win, Request{Addr: []byte("203.0.113.9"), Header: h})); k != "a:203.0.113.9" {
			t.Fatalf("value %q from an untrusted peer, nothing verified: key %q, want the address", v1, k)
		}
		for _, tc := range []struct {
			v []byte
			k string
		}{{v1, k1}, {v2, k2}} {
			if len(tc.v) == 0 {
				if tc.k != "a:203.0.113.9" {
					t.Fatalf("empty value: key %q, want the address", tc.k)
				}
				continue
			}
			if len(tc.k) != 34 || (tc.k[:2] != "h:" && tc.k[:2] != "c:") || strings.ContainsAny(tc.k, "{} ") {
				t.Fatalf("value %q: key %q", tc.v, tc.k)
			}
		}
		same := string(v1) == string(v2) || (len(v1) > maxKeyInput && len(v2) > maxKeyInput && string(v1[:maxKeyInput]) == string(v2[:maxKeyInput]))
		if !same && k1 == k2 {
			t.Fatalf("values %q and %q share key %q", v1, v2, k1)
		}
	})
}

func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	j := strings.IndexByte(key[i+1:], '}')
	return key[i+1 : i+1+j]
}

// Cluster readiness: every script call touches keys of one hash tag, per
// client windows of different clients land under different tags, and the
// per-client windows of several rules for one client key share one call.
func TestCallsShareHashTag(t *testing.T) {
	w := func(key string) *conf.Window { return &conf.Window{Limit: 5, Window: conf.D(time.Second), Key: key} }
	rs, err := Compile([]conf.Rule{
		{Name: "a", PathPrefix: "/", PerIP: w(""), Global: w("")},
		{Name: "b", PathPrefix: "/", PerIP: w(""), Global: w("")},
		{Name: "c", PathPrefix: "/", PerIP: w("header:X-User-ID")},
	}, "p:", nil)
	servicetest.Must(t, err, "compile")
	l := New(Config{Instance: "t", Timeout: time.Second})
	tags := map[string]bool{}
	for _, addr := range []string{"192.0.2.1", "192.0.2.2"} {
		var d Decision
		req := Request{Method: []byte("GET"), Path: []byte("/x"), Addr: []byte(addr), Trusted: true,
			Header: &fakeHeader{name: []byte("X-User-ID"), value: []byte("u-" + addr)}}
		d.matched = rs.Match(nil, req.Method, req.Path)
		l.collect(req, &d, &d.entries, false, time.Now())
		for i := range d.entries {
			d.entries[i].own = nil
		}
		calls := l.prepare(rs, d.entries)
		// a-ip + b-ip (one client key), a-global, b-global, c-key.
		if len(calls) != 4 {
			t.Fatalf("%d calls, want 4", len(calls))
		}
		for _, c := range calls {
			tag := hashTag(c.keys[0])
			for _, k := range c.keys {
				if hashTag(k) != tag {
					t.Fatalf("call mixes tags: %v", c.keys)
				}
			}
			if strings.HasPrefix(tag, "rl:a:") || strings.HasPrefix(tag, "rl:h:") {
				if tags[tag] {
					t.Fatalf("two clients share tag %q", tag)
				}
				tags[tag] = true
			}
		}
	}
	if len(tags) != 4 {
		t.Fatalf("per-client tags %v, want 2 clients x (address, header)", tags)
	}
}

// Leased slots not spent are given back: by the sweeper once their time is
// up, and at once when a reload replaces the rules. The log then holds
// exactly the admitted requests.
func TestLeaseGiveBack(t *testing.T) {
	rdb, prefix := servicetest.Redis(t)
	ctx := context.Background()
	cr := []conf.Rule{{Name: "g", PathPrefix: "/", Global: &conf.Window{Limit: 1000, Window: conf.D(time.Minute)}}}
	rs, err := Compile(cr, prefix, nil)
	servicetest.Must(t, err, "compile")
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: time.Second, Instance: "gb"})
	l.SetRules(rs)
	req := Request{Method: []byte("GET"), Path: []byte("/"), Addr: []byte("192.0.2.9")}
	admitted := 0
	for i := 0; i < 20; i++ {
		var d Decision
		l.Check(rs, req, &d)
		if d.Outcome == Admit {
			admitted++
		}
	}
	key := rs.Key(rs.list[0].Windows[0], nil)
	if out := l.Outstanding(); out == 0 || rdb.ZCard(ctx, key).Val() != int64(admitted)+out {
		t.Fatalf("outstanding %d, log %d, admitted %d", out, rdb.ZCard(ctx, key).Val(), admitted)
	}
	l.Sweep(time.Now().Add(2 * time.Second)) // every lease has expired by then
	if out, n := l.Outstanding(), rdb.ZCard(ctx, key).Val(); out != 0 || n != int64(admitted) {
		t.Fatalf("after the sweep: outstanding %d, log %d, want 0 and %d", out, n, admitted)
	}
	for i := 0; i < 20; i++ {
		var d Decision
		l.Check(rs, req, &d)
		admitted++
	}
	rs2, err := Compile(cr, prefix, nil)
	servicetest.Must(t, err, "compile")
	l.SetRules(rs2)
	if out, n := l.Outstanding(), rdb.ZCard(ctx, key).Val(); out != 0 || n != int64(admitted) {
		t.Fatalf("after a reload: outstanding %d, log %d, want 0 and %d", out, n, admitted)
	}
}

// A flood of distinct client keys keeps the per-client table within
// MaxClientStates (plus the requests in flight); evicted clients' leased
// slots are given back by the sweeper, and an evicted client's window stays
// exact (Redis holds its log).
func TestClientStatesBounded(t *testing.T) {
	rdb, prefix := servicetest.Redis(t)
	const L, W, max, flood = 5, 10 * time.Second, 640, 5000
	m := NewMetrics(prometheus.NewRegistry())
	rs, err := Compile([]conf.Rule{{Name: "r", PathPrefix: "/", OnRedisError: "closed",
		PerIP: &conf.Window{Limit: L, Window: conf.D(W)}}}, prefix, m)
	servicetest.Must(t, err, "compile")
	l := New(Config{Redis: rdb, KeyPrefix: prefix, Timeout: 2 * time.Second, Instance: "A", Metrics: m, MaxClientStates: max})
	l.SetRules(rs)
	tab := rs.list[0].clients
	const workers = 8
	var peak atomic.Int64
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for i := g; i < flood; i += workers {
				var d Decision
				l.Check(rs, Request{Method: []byte("GET"), Path: []byte("/x"), Addr: []byte(fmt.Sprint("c", i))}, &d)
				if d.Outcome != Admit {
					t.Errorf("client c%d: first request %v", i, d.Outcome)
					return
				}
				if n := tab.n.Load(); n > peak.Load() {
					peak.Store(n)
				}
			}
		})
	}
	wg.Wait()
	var pm dto.Metric
	servicetest.Must(t, m.evicted.c.Write(&pm), "read counter")
	evicted := pm.GetCounter().GetValue()
	t.Logf("%d clients: %d states held (peak %d, bound %d), %v evicted, %d leased slots outstanding",
		flood, l.ClientStates(), peak.Load(), max, evicted, l.Outstanding())
	if p := peak.Load(); p > max+workers {
		t.Fatalf("the table grew to %d states, bound %d (+%d in flight)", p, max, workers)
	}
	if n := l.ClientStates(); n > max {
		t.Fatalf("%d states after the flood, bound %d", n, max)
	}
	if evicted < flood-max-workers {
		t.Fatalf("%v evicted, want at least %d", evicted, flood-max-workers)
	}
	// Outstanding slots are exactly those the table's states still lease.
	held := 0
	tab.each(func(_ string, st *state) { st.mu.Lock(); held += slotsOf(st); st.mu.Unlock() })
	if int64(held) != l.Outstanding() {
		t.Fatalf("%d leased slots outstanding, the table's states hold %d (evicted leases not given up)", l.Outstanding(), held)
	}
	// The sweeper gives the evicted clients' leased slots back: each
	// evicted client's log holds just its one request.
	l.Sweep(time.Now())
	ctx := context.Background()
	checked := 0
	for i := 0; i < flood && checked < 50; i++ {
		c := fmt.Sprint("c", i)
		if tab.lookup([]byte("a:"+c)) != nil {
			continue
		}
		checked++
		if n := rdb.ZCard(ctx, rs.Key(rs.list[0].Windows[0], []byte("a:"+c))).Val(); n != 1 {
			t.Fatalf("evicted client %s: its log holds %d members after the sweep, want 1 (its request; the lease given back)", c, n)
		}
	}
	if checked == 0 {
		t.Fatal("no evicted client found")
	}
	// An evicted client's window is still exact: L-1 more of 3L.
	var c string
	for i := 0; ; i++ {
		if c = fmt.Sprint("c", i); tab.lookup([]byte("a:"+c)) == nil {
			break
		}
	}
	admitted := 0
	for range 3 * L {
		var d Decision
		l.Check(rs, Request{Method: []byte("GET"), Path: []byte("/x"), Addr: []byte(c)}, &d)
		if d.Outcome == Admit {
			admitted++
		}
	}
	if admitted != L-1 {
		t.Fatalf("evicted client %s: %d more admitted, want %d (limit %d, one spent before eviction)", c, admitted, L-1, L)
	}
}

// A keyed window counts by its header or cookie only when a trusted peer
// sent the request or the proxy verified that very header or cookie (the
// X-User-ID it set from a JWT, or the token's own header or cookie);
// otherwise by the address.
func TestKeyNeedsVouching(t *testing.T) {
	hdr := &Window{Kind: PerIP, Source: FromHeader, Name: []byte("X-User-ID")}
	auth := &Window{Kind: PerIP, Source: FromHeader, Name: []byte("Authorization")}
	apiKey := &Window{Kind: PerIP, Source: FromHeader, Name: []byte("X-Api-Key")}
	sess := &Window{Kind: PerIP, Source: FromCookie, Name: []byte("session")}
	other := &Window{Kind: PerIP, Source: FromCookie, Name: []byte("Session")} // cookie names are case-sensitive
	viaHeader := &Verified{Headers: [][]byte{[]byte("X-User-Id"), []byte("authorization")}}
	viaCookie := &Verified{Headers: [][]byte{[]byte("X-User-Id")}, Cookies: [][]byte{[]byte("session")}}
	all := &multiHeader{values: map[string]string{"x-user-id": "v", "authorization": "v", "x-api-key": "v"}, cookies: map[string]string{"session": "v", "Session": "v"}}
	for _, tc := range []struct {
		name     string
		w        *Window
		trusted  bool
		verified *Verified
		keyed    bool
	}{
		{"untrusted, unverified header", hdr, false, nil, false},
		{"untrusted, unverified cookie", sess, false, nil, false},
		{"trusted peer: any header", apiKey, true, nil, true},
		{"trusted peer: any cookie", other, true, nil, true},
		{"verified X-User-ID", hdr, false, viaHeader, true},
		{"verified token header", auth, false, viaHeader, true},
		{"another header of a verified request", apiKey, false, viaHeader, false},
		{"a cookie of a header-verified request", sess, false, viaHeader, false},
		{"verified token cookie", sess, false, viaCookie, true},
		{"a cookie named in another case", other, false, viaCookie, false},
	} {
		k := string(appendClientKey(nil, tc.w, Request{Addr: []byte("198.51.100.7"), Header: all, Trusted: tc.trusted, Verified: tc.verified}))
		if keyed := k != "a:198.51.100.7"; keyed != tc.keyed {
			t.Errorf("%s: key %q, want keyed by the value %v", tc.name, k, tc.keyed)
		}
	}
}

// multiHeader serves several headers (any case) and cookies.
type multiHeader struct{ values, cookies map[string]string }

func (h *multiHeader) PeekBytes(n []byte) []byte {
	if v, ok := h.values[strings.ToLower(string(n))]; ok {
		return []byte(v)
	}
	return nil
}

func (h *multiHeader) CookieBytes(n []byte) []byte {
	if v, ok := h.cookies[string(n)]; ok {
		return []byte(v)
	}
	return nil
}
