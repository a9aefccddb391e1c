package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/seckill/seckill/e2e/internal/stack"
)

// After a sale sold out, a keyed retry of an accepted purchase goes through
// bin/proxy to the backend and gets the same order; an unkeyed new purchase
// is answered 409 sold_out by the proxy itself.
func TestProxyKeyedReplayAfterSoldOut(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries")
	}
	t.Parallel()
	s := stack.New(t, stack.Options{Backends: 1, Workers: 1})
	sale := s.CreateSale(t, 43, 1, 1)
	// The test client stands for a trusted front that sets X-User-ID (without
	// it the proxy drops a client's own X-User-ID).
	px := s.StartProxy(t, "proxy", "[proxy]\ntrusted_proxies = [\"127.0.0.0/8\"]\n")
	buy := func(user, key string) (int, string, string) {
		t.Helper()
		a := buyAt(t, s, px.URL(), sale.ID, user, key)
		return a.Status, a.OrderID, a.Code
	}
	status, order, _ := buy("alice", "k-alice")
	if status != http.StatusAccepted || order == "" {
		t.Fatalf("first purchase: %d %q", status, order)
	}
	if status, _, code := buy("bob", ""); status != http.StatusConflict || code != "sold_out" {
		t.Fatalf("second buyer: %d %s, want 409 sold_out", status, code)
	}
	edge0 := soldOutAnswers(t, px)
	if status, _, code := buy("carol", ""); status != http.StatusConflict || code != "sold_out" || soldOutAnswers(t, px) != edge0+1 {
		t.Fatalf("unkeyed purchase after sold out: %d %s, edge answers %d -> %d; want the proxy's own 409",
			status, code, edge0, soldOutAnswers(t, px))
	}
	for i := 0; i < 2; i++ {
		status, again, _ := buy("alice", "k-alice")
		if status != http.StatusAccepted || again != order {
			t.Fatalf("keyed replay %d after sold out: %d %q, want 202 with order %q", i, status, again, order)
		}
	}
	if n := soldOutAnswers(t, px); n != edge0+1 {
		t.Fatalf("the proxy answered keyed replays itself (%d edge answers)", n)
	}
}

func soldOutAnswers(t *testing.T, px *stack.Proc) int {
	t.Helper()
	for _, line := range strings.Split(get(t, "http://"+px.AdminAddr+"/metrics"), "\n") {
		if v, ok := strings.CutPrefix(line, "seckill_proxy_sold_out_answers_total "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int(n)
		}
	}
	t.Fatal("no seckill_proxy_sold_out_answers_total in /metrics")
	return 0
}
