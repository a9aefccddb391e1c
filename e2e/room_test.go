package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/servicetest"
)

// roomReply is one answer of the proxies to a client of the room.
type roomReply struct {
	status  int
	retry   int
	ticket  string
	code    string
	typ     string
	pos     int64
	orderID string
}

func roomBuy(t *testing.T, c *http.Client, base string, id int64, n int, ticket string) roomReply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/api/v1/activities/%d/purchase", base, id), nil)
	// The test client stands for a trusted front: its address and user.
	req.Header.Set("X-Forwarded-For", fmt.Sprintf("10.7.%d.%d", n>>8&255, n&255))
	req.Header.Set("X-User-ID", "room"+strconv.Itoa(n))
	if ticket != "" {
		req.Header.Set("Room-Ticket", ticket)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("client %d: %v", n, err)
		return roomReply{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body struct {
		Type     string `json:"type"`
		Code     string `json:"code"`
		Position int64  `json:"position"`
		OrderID  string `json:"order_id"`
	}
	_ = json.Unmarshal(b, &body)
	r := roomReply{status: resp.StatusCode, ticket: resp.Header.Get("Room-Ticket"), code: body.Code, typ: body.Type,
		pos: body.Position, orderID: body.OrderID}
	r.retry, _ = strconv.Atoi(resp.Header.Get("Retry-After"))
	return r
}

// The waiting room through two bin/proxy processes in front of the real
// backend and worker: a crowd three times the stock, each client polling
// as told with its ticket at alternating proxies, buys exactly the stock;
// everyone else is told sold_out (by the room, with its place, or by the
// backend for the last admitted). Then SIGHUP brings a new ticket key to
// both proxies: a ticket signed before is still good (key_grace).
func TestProxyWaitingRoom(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries")
	}
	t.Parallel()
	const stock, crowd = 30, 90
	s := stack.New(t, stack.Options{Backends: 1, Workers: 1})
	sale := s.CreateSale(t, 71, stock, 1)
	idle := s.CreateSale(t, 72, 5, 1) // a room whose line does not move
	key := filepath.Join(s.Dir, "room.key")
	servicetest.Must(t, os.WriteFile(key, []byte("e2e-room-key-0123456789abcdef0123456789"), 0o600), "key")
	cfg := fmt.Sprintf(`[proxy]
trusted_proxies = ["127.0.0.0/8"]

[[proxy.rules]]
name         = "idle"
path_prefix  = "/api/v1/activities/72/"
global       = { limit = 100000, window = "1s" }
waiting_room = { key_file = %q, activity_id = 72, admit_per_second = 0.01, poll_interval = "1s", place_ttl = "10s" }

[[proxy.rules]]
name         = "buy"
path_prefix  = "/api/v1/activities/"
global       = { limit = 100000, window = "1s" }
waiting_room = { key_file = %q, admit_per_second = 60, poll_interval = "1s", place_ttl = "10s" }
`, key, key)
	pxs := []*stack.Proc{s.StartProxy(t, "proxy-a", cfg), s.StartProxy(t, "proxy-b", cfg)}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

	ends := make([]roomReply, crowd)
	var wg sync.WaitGroup
	for i := range crowd {
		wg.Go(func() {
			ticket := ""
			for try := 0; try < 60; try++ {
				r := roomBuy(t, c, pxs[(i+try)%2].URL(), sale.ID, i, ticket)
				if r.ticket != "" {
					ticket = r.ticket
				}
				if r.status != http.StatusTooManyRequests && r.status != http.StatusServiceUnavailable {
					ends[i] = r
					return
				}
				time.Sleep(time.Duration(max(r.retry, 1)) * time.Second)
			}
			t.Errorf("client %d: still waiting after 60 polls", i)
		})
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	bought, roomSold, backendSold := 0, 0, 0
	for i, r := range ends {
		switch {
		case r.status == http.StatusAccepted && r.orderID != "":
			bought++
		case r.status == http.StatusConflict && r.typ == "urn:seckill:proxy:sold_out":
			roomSold++
			if r.pos <= 0 {
				t.Errorf("client %d told sold out without its place", i)
			}
		case r.status == http.StatusConflict && r.code == "sold_out":
			backendSold++
		default:
			t.Errorf("client %d ended %d %q %q", i, r.status, r.typ, r.code)
		}
	}
	t.Logf("%d clients, %d units: %d bought, %d told sold out by the room, %d by the backend", crowd, stock, bought, roomSold, backendSold)
	if bought != stock {
		t.Errorf("bought %d, want %d", bought, stock)
	}

	// Key rotation: a ticket from before SIGHUP keeps its place after it.
	first := roomBuy(t, c, pxs[0].URL(), idle.ID, 1000, "")
	if first.status != http.StatusTooManyRequests || first.pos != 1 || first.ticket == "" {
		t.Fatalf("idle room: %+v, want 429 at place 1 with a ticket", first)
	}
	servicetest.Must(t, os.WriteFile(key, []byte("e2e-room-key-rotated-0123456789abcdef0123"), 0o600), "new key")
	for _, px := range pxs {
		px.Signal(t, syscall.SIGHUP)
	}
	stack.WaitFor(t, "a ticket signed with the new key", 5*time.Second, func() bool {
		r := roomBuy(t, c, pxs[1].URL(), idle.ID, 1001, "")
		again := roomBuy(t, c, pxs[1].URL(), idle.ID, 1001, "")
		return r.ticket != "" && again.ticket != "" && r.ticket[:8] != first.ticket[:8]
	})
	for _, px := range pxs {
		if r := roomBuy(t, c, px.URL(), idle.ID, 1000, first.ticket); r.status != http.StatusTooManyRequests || r.pos != 1 {
			t.Errorf("%s: a ticket of the old key after SIGHUP: %+v, want 429 at place 1", px.Name, r)
		}
		if n := sample(t, "http://"+px.AdminAddr+"/metrics", `seckill_proxy_room_bad_tickets_total{reason="unknown_key",room="idle"}`); n != 0 {
			t.Errorf("%s: %d tickets of the old key refused within key_grace", px.Name, n)
		}
	}
}

// bin/bench fairness against two bin/proxy in front of the real backend:
// one sale behind a waiting room, one behind the usual windows, the same
// crowd of bots and polite clients at each. Every unit is sold in both;
// with the room on, every loser is told sold out and the bots win no
// larger share than the polite clients (a small crowd: the point estimate,
// not the bound); the figures of both are logged.
func TestBenchFairness(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries")
	}
	t.Parallel()
	s := stack.New(t, stack.Options{Backends: 1, Workers: 1})
	key := filepath.Join(s.Dir, "room.key")
	servicetest.Must(t, os.WriteFile(key, []byte("e2e-bench-room-key-0123456789abcdef0123"), 0o600), "key")
	cfg := fmt.Sprintf(`[proxy]
trusted_proxies = ["127.0.0.0/8"]

[[proxy.rules]]
name         = "room"
methods      = ["POST"]
path_prefix  = "/api/v1/activities/81/"
global       = { limit = 100000, window = "1s" }
waiting_room = { key_file = %q, activity_id = 81, admit_per_second = 40, poll_interval = "1s", place_ttl = "10s" }

[[proxy.rules]]
name        = "purchase"
methods     = ["POST"]
path_prefix = "/api/v1/activities/"
per_ip      = { limit = 5, window = "1s" }
global      = { limit = 40, window = "1s" }
`, key)
	pxs := []*stack.Proc{s.StartProxy(t, "proxy-a", cfg), s.StartProxy(t, "proxy-b", cfg)}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := servicetest.CommandContext(ctx, t, stack.Binary(t, "bench"), "fairness", "-config", s.ConfigPath,
		"-targets", pxs[0].URL()+","+pxs[1].URL(), "-admin-url", s.Backends[0].URL(), "-admin-token", stack.AdminToken,
		"-room-activity", "81", "-plain-activity", "82", "-stock", "20", "-polite", "150", "-bots", "15",
		"-spread", "500ms", "-timeout", "40s")
	cmd.Env = s.Env
	out, err := cmd.CombinedOutput()
	t.Logf("bench fairness:\n%s", out)
	if err != nil {
		t.Fatalf("bench fairness: %v", err)
	}
	var on, off struct{ polite, pn, bots, bn, never int }
	for _, line := range strings.Split(string(out), "\n") {
		var p, pn, b, bn, never int
		var pp, bp float64
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "units won    polite %d/%d (%f%%)  bots %d/%d (%f%%)", &p, &pn, &pp, &b, &bn, &bp); err == nil {
			if on.pn == 0 {
				on.polite, on.pn, on.bots, on.bn = p, pn, b, bn
			} else {
				off.polite, off.pn, off.bots, off.bn = p, pn, b, bn
			}
		}
		if i := strings.Index(line, "never told "); i >= 0 {
			never, _ = strconv.Atoi(strings.TrimSpace(line[i+len("never told "):]))
			if off.pn == 0 {
				on.never = never
			} else {
				off.never = never
			}
		}
	}
	if on.polite+on.bots != 20 || off.polite+off.bots != 20 {
		t.Errorf("units won: room on %d, room off %d; want 20 each", on.polite+on.bots, off.polite+off.bots)
	}
	if on.never != 0 {
		t.Errorf("room on: %d losers never told sold out", on.never)
	}
	if on.pn > 0 && on.bn > 0 && float64(on.bots)/float64(on.bn) > 1.5*float64(on.polite)/float64(on.pn)+1.0/float64(on.bn) {
		t.Errorf("room on: bots won %d/%d, polite %d/%d", on.bots, on.bn, on.polite, on.pn)
	}
}
