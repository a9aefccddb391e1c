package api_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seckill/seckill/backend/internal/api"
)

// syncBuffer is a log sink several handler goroutines may write at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// clientFrom sends from a given loopback address, so that one test can be
// several sources.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: d.DialContext, MaxIdleConnsPerHost: 32}}
}

func (s *stack) adminPut(t *testing.T, c *http.Client, id int64, tok string) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"stock":5,"per_user_limit":1,"starts_at":%q,"ends_at":%q}`,
		time.Now().Add(-time.Hour).Format(time.RFC3339), time.Now().Add(time.Hour).Format(time.RFC3339))
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/admin/v1/activities/%d", s.url, id), strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("admin PUT: %v", err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

func (s *stack) adminFailures(t *testing.T) map[string]float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "seckill_backend_admin_auth_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	return out
}

// Guessing the admin token: 1,000 wrong tokens fired concurrently from one
// address get exactly limit 401s (the only tokens ever compared), the rest
// 429 with Retry-After, all counted; the right token then fails from that
// address too (its window is spent) but works from another one; no log
// line holds a token. (The window's end: TestFailWindowTurnsOver.)
func TestAdminFailureLimit(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	const limit, window = 10, time.Minute
	s := newStackWith(t, time.Second, slog.New(slog.NewJSONHandler(logs, nil)), func(c *api.Config) {
		c.AdminFailLimit, c.AdminFailWindow = limit, window
	})
	attacker, admin := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	if st, _ := s.adminPut(t, admin, 901, token); st != 201 {
		t.Fatalf("the right token before the attack: %d", st)
	}

	const n = 1000
	var unauthorized, limited, other atomic.Int64
	var wg sync.WaitGroup
	work := make(chan int)
	for range 32 {
		wg.Go(func() {
			for i := range work {
				tok := fmt.Sprintf("guess-%04d-%s", i, strings.Repeat("x", 24))
				if i%10 == 0 {
					tok = "" // no Authorization at all counts too
				}
				switch st, ra := s.adminPut(t, attacker, 902, tok); {
				case st == 401:
					unauthorized.Add(1)
				case st == 429 && ra != "":
					limited.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	start := time.Now()
	// One attempt of each kind first, so that both reasons are counted
	// whichever attempts of the burst win the race for the 10 compares.
	for _, tok := range []string{"", "guess-first-" + strings.Repeat("x", 24)} {
		if st, _ := s.adminPut(t, attacker, 902, tok); st != 401 {
			t.Fatalf("first attempt with token %q: %d, want 401", tok, st)
		}
		unauthorized.Add(1)
	}
	for i := range n - 2 {
		work <- i
	}
	close(work)
	wg.Wait()
	if elapsed := time.Since(start); elapsed >= window {
		t.Fatalf("the burst took %v, longer than the %v window: the count below would not be exact", elapsed, window)
	}
	if other.Load() != 0 {
		t.Fatalf("%d answers were neither 401 nor 429 with Retry-After", other.Load())
	}
	if u := unauthorized.Load(); u != limit {
		t.Fatalf("%d answers 401, want exactly %d", u, limit)
	}
	if limited.Load()+unauthorized.Load() != n {
		t.Fatalf("401 %d + 429 %d != %d", unauthorized.Load(), limited.Load(), n)
	}
	f := s.adminFailures(t)
	if got := f["missing"] + f["invalid"]; got != float64(unauthorized.Load()) || f["limited"] != float64(limited.Load()) {
		t.Fatalf("metrics %v; want missing+invalid=%d limited=%d", f, unauthorized.Load(), limited.Load())
	}
	if f["missing"] == 0 || f["invalid"] == 0 {
		t.Errorf("metrics by reason %v: want both missing and invalid", f)
	}

	// The right token: refused from the blocked address, fine from another.
	if st, ra := s.adminPut(t, attacker, 903, token); st != 429 || ra == "" {
		t.Errorf("right token from the blocked address: %d (Retry-After %q), want 429", st, ra)
	}
	if st, _ := s.adminPut(t, admin, 905, token); st != 201 {
		t.Errorf("right token from another address during the attack: %d, want 201", st)
	}
	// Logs: one line per compared failure at most, naming the source, and
	// never a token.
	text := logs.String()
	if c := strings.Count(text, "admin authentication failed"); int64(c) != unauthorized.Load() {
		t.Errorf("%d failure log lines, want %d", c, unauthorized.Load())
	}
	if !strings.Contains(text, `"source":"127.0.0.1"`) || !strings.Contains(text, `"blocked":true`) {
		t.Errorf("failure logs do not name the source or the block:\n%.600s", text)
	}
	if strings.Contains(text, "guess-") || strings.Contains(text, token) {
		t.Errorf("a token shows in the log:\n%.600s", text)
	}
}

// A reload replaces the admin token: the old one stops working.
func TestAdminTokenReplaced(t *testing.T) {
	t.Parallel()
	s := newStack(t, time.Second)
	c := clientFrom("127.0.0.3")
	const next = "the-next-admin-token-0123456789abcdef"
	s.api.SetAdminToken(next)
	if st, _ := s.adminPut(t, c, 911, token); st != 401 {
		t.Errorf("old token after SetAdminToken: %d, want 401", st)
	}
	if st, _ := s.adminPut(t, c, 911, next); st != 201 {
		t.Errorf("new token: %d, want 201", st)
	}
}
