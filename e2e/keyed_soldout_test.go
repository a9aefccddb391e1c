package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// sample reads one series (a name with its labels, as exposed) of the
// /metrics text at url; 0 when absent.
func sample(t *testing.T, url, series string) int {
	t.Helper()
	for _, line := range strings.Split(get(t, url), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int(n)
		}
	}
	return 0
}

// The keyed sold-out tail at the edge, through two bin/proxy in front of
// one backend: after a sale sold out, the replay of every accepted order
// (pending, confirmed or failed) gets its order at either proxy and never
// 409; a new key gets the proxy's own 409 and never reaches the backend
// (counted by the backend's requests); a unit coming back reopens the sale
// at both proxies.
func TestProxyKeyedSoldOutAtTheEdge(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries")
	}
	t.Parallel()
	const stock = 10
	// Workers start late: the orders stay pending, so that one can fail
	// (its unit comes back) as a worker fails an order.
	s := stack.New(t, stack.Options{Backends: 1, Workers: 1, NoStartWorkers: true})
	sale := s.CreateSale(t, 51, stock, 1)
	// A long sold_out_ttl: every edge answer below comes from news, not
	// from a flag that expired. The test client stands for a trusted front
	// that sets X-User-ID.
	cfg := "[proxy]\ntrusted_proxies = [\"127.0.0.0/8\"]\nsold_out_ttl = \"10m\"\n"
	pxs := []*stack.Proc{s.StartProxy(t, "proxy-a", cfg), s.StartProxy(t, "proxy-b", cfg)}
	backendMetrics := s.Backends[0].URL() + "/metrics"
	// The backend's purchase requests, whatever their answer.
	purchases := func() int {
		n := 0
		for _, line := range strings.Split(get(t, backendMetrics), "\n") {
			if strings.HasPrefix(line, "seckill_backend_http_requests_total{") && strings.Contains(line, `route="purchase"`) {
				v, _ := strconv.Atoi(line[strings.LastIndexByte(line, ' ')+1:])
				n += v
			}
		}
		return n
	}
	keyReads := func(px *stack.Proc) int {
		return sample(t, "http://"+px.AdminAddr+"/metrics", `seckill_proxy_sold_out_key_reads_total{outcome="keys"}`)
	}
	edgeKeyed := func(px *stack.Proc) int {
		return sample(t, "http://"+px.AdminAddr+"/metrics", "seckill_proxy_sold_out_keyed_answers_total")
	}

	orders := map[string]string{} // "user key" -> order id
	for i := 0; i < stock; i++ {
		user, key := fmt.Sprint("u", i), fmt.Sprint("k", i)
		a := buyAt(t, s, pxs[i%2].URL(), sale.ID, user, key)
		if a.Status != http.StatusAccepted {
			t.Fatalf("purchase %d: %+v", i, a)
		}
		orders[user+" "+key] = a.OrderID
	}
	// A new key at each proxy: the backend answers sold out; each proxy
	// learns it and reads the sale's keys.
	fresh := 0
	newKey := func(px *stack.Proc) answer {
		fresh++
		return buyAt(t, s, px.URL(), sale.ID, fmt.Sprint("new", fresh), "n")
	}
	soldOut := func(round int) {
		t.Helper()
		for _, px := range pxs {
			if a := newKey(px); a.Status != http.StatusConflict || a.Code != "sold_out" {
				t.Fatalf("new key after sold out: %+v", a)
			}
		}
		for _, px := range pxs {
			stack.WaitFor(t, px.Name+" reads the sale's keys", 10*time.Second, func() bool { return keyReads(px) >= round })
		}
	}
	soldOut(1)

	// A unit comes back: u0's order fails, as a worker fails an order
	// (claimed, written failed in MySQL, settled failed in Redis: settle.lua
	// gives the unit back and publishes the news). Both proxies reopen the
	// sale; u0's key stays held by its failed order.
	fail(t, s, sale.ID, orders["u0 k0"])
	for i, px := range pxs {
		before := purchases()
		stack.WaitFor(t, px.Name+" forwards a new key after the release", 10*time.Second, func() bool {
			a := newKey(px)
			if a.Status == http.StatusAccepted {
				orders[fmt.Sprint("new", fresh)+" n"] = a.OrderID
			}
			return purchases() > before
		})
		if i == 0 && len(orders) != stock+1 {
			t.Fatalf("the unit that came back was not sold at %s", px.Name)
		}
	}
	soldOut(2)
	s.StartWorkers(t) // the other orders confirm

	// Every accepted order's replay, at either proxy: its order, never 409.
	before := purchases()
	for _, px := range pxs {
		for k, oid := range orders {
			user, key, _ := strings.Cut(k, " ")
			a := buyAt(t, s, px.URL(), sale.ID, user, key)
			if a.Status != http.StatusAccepted || a.OrderID != oid {
				t.Fatalf("replay of %s at %s: %+v, want 202 with order %s", k, px.Name, a, oid)
			}
			if k == "u0 k0" && a.State != "failed" {
				t.Errorf("replay of the failed order: status %q", a.State)
			}
		}
	}
	if got, want := purchases()-before, 2*len(orders); got != want {
		t.Fatalf("the backend saw %d replays, want %d", got, want)
	}
	// New keys: the proxy's own 409, the backend sees none of them.
	before = purchases()
	for _, px := range pxs {
		edge := edgeKeyed(px)
		for i := 0; i < 25; i++ {
			if a := newKey(px); a.Status != http.StatusConflict || a.Code != "sold_out" {
				t.Fatalf("new key at %s: %+v, want 409 sold_out", px.Name, a)
			}
		}
		if got := edgeKeyed(px) - edge; got != 25 {
			t.Errorf("%s answered %d of 25 new keys itself", px.Name, got)
		}
	}
	if got := purchases() - before; got != 0 {
		t.Fatalf("the backend saw %d purchases of new keys, want 0 (the edge answers them)", got)
	}
	s.Drain(t, sale, nil)
}

// fail decides a pending order failed as a worker does when its
// transaction refuses it: claim, the failed row in MySQL, then settle.
func fail(t *testing.T, s *stack.Stack, id int64, orderID string) {
	t.Helper()
	ctx := context.Background()
	states, err := s.Res.Claim(ctx, id, []string{orderID})
	servicetest.Must(t, err, "claim")
	if states[0] != reservation.Claimed {
		t.Fatalf("claim %s: %s", orderID, states[0])
	}
	rec, _, err := s.Res.Order(ctx, id, orderID)
	servicetest.Must(t, err, "order record")
	_, err = s.DB.ExecContext(ctx, `INSERT INTO orders (order_id, activity_id, user_id, quantity, status, reason) VALUES (?,?,?,?,'failed','test_failed')`,
		orderID, id, rec.UserID, rec.Quantity)
	servicetest.Must(t, err, "insert the failed order")
	_, err = s.Res.Settle(ctx, id, []reservation.Settlement{{OrderID: orderID, Reason: "test_failed", Quantity: rec.Quantity, UserID: rec.UserID}})
	servicetest.Must(t, err, "settle")
}
