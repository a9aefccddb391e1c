package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/e2e/internal/stack"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/internal/teardown"
)

// lifecycleConfig archives fast: 300ms after a sale's end, looked at every
// 200ms.
var lifecycleConfig = stack.Fast(`archive_interval    = "200ms"
archive_grace       = "300ms"
archive_summary_ttl = "1h"`)

// putSale creates or changes a sale through the admin API and returns the
// status.
func putSale(t *testing.T, s *stack.Stack, id, stock, limit int64, start, end time.Time) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"stock": stock, "per_user_limit": limit,
		"starts_at": start.UTC().Format(time.RFC3339Nano), "ends_at": end.UTC().Format(time.RFC3339Nano)})
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/admin/v1/activities/%d", s.Backends[0].URL(), id), bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+stack.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.HTTP.Do(req)
	servicetest.Must(t, err, "put sale %d", id)
	msg, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		t.Fatalf("put sale %d: %d %s", id, resp.StatusCode, msg)
	}
	return resp.StatusCode
}

// putStatus is putSale for a goroutine: the status, or 0 on a transport error.
func putStatus(s *stack.Stack, id, stock, limit int64, start, end time.Time) int {
	body, _ := json.Marshal(map[string]any{"stock": stock, "per_user_limit": limit,
		"starts_at": start.UTC().Format(time.RFC3339Nano), "ends_at": end.UTC().Format(time.RFC3339Nano)})
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/admin/v1/activities/%d", s.Backends[0].URL(), id), bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+stack.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 90 * time.Second}).Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

type answer struct {
	Status  int
	OrderID string `json:"order_id"`
	State   string `json:"status"`
	Code    string `json:"code"`
}

// buy sends one purchase of one unit to the first backend ("" key: none).
func buy(t *testing.T, s *stack.Stack, id int64, user, key string) answer {
	t.Helper()
	return buyAt(t, s, s.Backends[0].URL(), id, user, key)
}

// buyAt sends one purchase of one unit to base, a backend's or a proxy's URL.
func buyAt(t *testing.T, s *stack.Stack, base string, id int64, user, key string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/api/v1/activities/%d/purchase", base, id), strings.NewReader(`{"quantity":1}`))
	req.Header.Set("X-User-ID", user)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := s.HTTP.Do(req)
	servicetest.Must(t, err, "purchase")
	defer resp.Body.Close()
	a := answer{Status: resp.StatusCode}
	servicetest.Must(t, json.NewDecoder(resp.Body).Decode(&a), "purchase answer")
	return a
}

// getJSON reads a GET endpoint of the backend into v and returns the status.
func getJSON(t *testing.T, s *stack.Stack, path string, v any) int {
	t.Helper()
	resp, err := s.HTTP.Get(s.Backends[0].URL() + path)
	servicetest.Must(t, err, "GET %s", path)
	defer resp.Body.Close()
	servicetest.Must(t, json.NewDecoder(resp.Body).Decode(v), "GET %s", path)
	return resp.StatusCode
}

type activityView struct {
	Stock, Available, Pending, Sold int64
	State                           string
}

type orderView struct {
	OrderID string `json:"order_id"`
	Status  string
	Reason  string
}

func archived(t *testing.T, s *stack.Stack, id int64) bool {
	t.Helper()
	var a bool
	servicetest.Must(t, s.DB.QueryRow(`SELECT archived_at IS NOT NULL FROM activities WHERE id = ?`, id).Scan(&a), "archived_at")
	if !a {
		return false
	}
	member, err := s.Redis.SIsMember(context.Background(), s.Prefix+"seckill:activities", id).Result()
	servicetest.Must(t, err, "activity set")
	return !member
}

// saleKeys groups the Redis keys under the stack's prefix by activity id
// (0: keys of no sale).
func saleKeys(t *testing.T, s *stack.Stack) map[int64][]string {
	t.Helper()
	keys, err := teardown.RedisKeys(context.Background(), s.Redis, s.Prefix)
	servicetest.Must(t, err, "scan")
	out := map[int64][]string{}
	for _, k := range keys {
		k = strings.TrimPrefix(k, s.Prefix)
		var id int64
		var rest string
		if n, _ := fmt.Sscanf(k, "{act:%d}:%s", &id, &rest); n == 2 {
			out[id] = append(out[id], rest)
			continue
		}
		out[0] = append(out[0], k)
	}
	return out
}

// sellOut runs a crowd against a sale until nothing is left and checks
// I1–I5 while the sale is live.
func sellOut(t *testing.T, s *stack.Stack, sale stack.Sale, tag string, users int) *stack.Crowd {
	t.Helper()
	c := stack.NewCrowd(sale, users, 2, tag)
	c.Run(s, s.Backends)
	s.Drain(t, sale, c.Accepted())
	s.MopUp(t, sale, c)
	s.Check(t, "lifecycle "+tag, sale, c)
	return c
}

// TestSaleLifecycle: three sales run to completion beside a live one; once
// archived, Redis holds only the live sale's keys (and a summary of each
// archived one), the endpoints answer from MySQL, keyed replays of archived
// orders get their order, and a reopened sale sells correctly with I1–I5.
func TestSaleLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries")
	}
	t.Parallel()
	s := stack.New(t, stack.Options{Backends: 1, Workers: 2, Config: lifecycleConfig})
	now := time.Now()
	start := now.Add(-time.Minute)
	live := stack.Sale{ID: 104, Stock: 30, Limit: 2}
	putSale(t, s, live.ID, live.Stock, live.Limit, start, now.Add(time.Hour))
	var sales []stack.Sale
	for id := int64(101); id <= 103; id++ {
		putSale(t, s, id, 20, 2, start, now.Add(time.Hour))
		sales = append(sales, stack.Sale{ID: id, Stock: 20, Limit: 2})
	}
	crowds := map[int64]*stack.Crowd{}
	for _, sale := range sales {
		crowds[sale.ID] = sellOut(t, s, sale, fmt.Sprintf("s%d", sale.ID), 30)
		// Sold out: the admin ends the sale now (a new generation).
		putSale(t, s, sale.ID, sale.Stock, sale.Limit, start, time.Now().Add(500*time.Millisecond))
	}
	// The live sale sells a few units and stays open.
	liveCrowd := stack.NewCrowd(live, 5, 1, "live")
	liveCrowd.Run(s, s.Backends)
	s.Drain(t, live, liveCrowd.Accepted())

	for _, sale := range sales {
		stack.WaitFor(t, fmt.Sprintf("sale %d archived", sale.ID), time.Minute, func() bool { return archived(t, s, sale.ID) })
	}
	keys := saleKeys(t, s)
	for _, sale := range sales {
		if got := keys[sale.ID]; len(got) != 1 || got[0] != "meta" {
			t.Errorf("archived sale %d keeps %v in Redis, want only its summary", sale.ID, got)
		}
		ttl := s.Redis.PTTL(context.Background(), s.Res.Keys(sale.ID).Meta).Val()
		mem := s.Redis.MemoryUsage(context.Background(), s.Res.Keys(sale.ID).Meta).Val()
		if ttl <= 0 {
			t.Errorf("summary of sale %d has no TTL (%v)", sale.ID, ttl)
		}
		t.Logf("archived sale %d: summary %d bytes, TTL %v", sale.ID, mem, ttl.Round(time.Second))
	}
	if len(keys[live.ID]) < 3 {
		t.Errorf("the live sale's keys are missing: %v", keys[live.ID])
	}
	for _, k := range keys[0] {
		// The registry of live consumers (one hash per queue, expiring) is
		// the workers', no sale's.
		if k != "seckill:activities" && !strings.HasPrefix(k, "seckill:sweeper") && !strings.HasPrefix(k, "seckill:archiver") &&
			!strings.HasPrefix(k, "{seckill:drain}:consumers:") {
			t.Errorf("unexpected key %q", k)
		}
	}
	ids, err := s.Res.Activities(context.Background())
	servicetest.Must(t, err, "activities")
	if len(ids) != 1 || ids[0] != live.ID {
		t.Errorf("activity set %v, want only the live sale %d", ids, live.ID)
	}

	// Answers after archiving, first from the summary, then (summary gone,
	// as after its TTL) from MySQL alone.
	checkArchived := func(sale stack.Sale, when string) {
		t.Helper()
		var av activityView
		if st := getJSON(t, s, fmt.Sprintf("/api/v1/activities/%d", sale.ID), &av); st != http.StatusOK ||
			av.State != "ended" || av.Sold != sale.Stock || av.Available != 0 || av.Pending != 0 || av.Stock != sale.Stock {
			t.Errorf("%s: activity %d: %d %+v", when, sale.ID, st, av)
		}
		replays := 0
		for _, a := range crowds[sale.ID].Accepted() {
			var ov orderView
			var status string
			servicetest.Must(t, s.DB.QueryRow(`SELECT status FROM orders WHERE order_id = ?`, a.OrderID).Scan(&status), "order row")
			if st := getJSON(t, s, "/api/v1/orders/"+a.OrderID, &ov); st != http.StatusOK || ov.Status != status || ov.OrderID != a.OrderID {
				t.Errorf("%s: order %s: %d %+v, MySQL %s", when, a.OrderID, st, ov, status)
			}
			if a.Key == "" || replays >= 10 {
				continue
			}
			replays++
			if got := buy(t, s, sale.ID, a.User, a.Key); got.Status != http.StatusAccepted || got.OrderID != a.OrderID || got.State != status {
				t.Errorf("%s: keyed replay of %s (%s %s): %+v, MySQL %s", when, a.OrderID, a.User, a.Key, got, status)
			}
		}
		if replays == 0 {
			t.Errorf("%s: no keyed order to replay", when)
		}
		if got := buy(t, s, sale.ID, "late-buyer", ""); got.Status != http.StatusConflict || got.Code != "ended" {
			t.Errorf("%s: purchase of archived sale %d: %+v", when, sale.ID, got)
		}
		if got := buy(t, s, sale.ID, "late-buyer", "late-key"); got.Status != http.StatusConflict || got.Code != "ended" {
			t.Errorf("%s: keyed purchase of archived sale %d: %+v", when, sale.ID, got)
		}
	}
	checkArchived(sales[1], "summary in Redis")
	servicetest.Must(t, s.Redis.Del(context.Background(), s.Res.Keys(sales[1].ID).Meta).Err(), "drop summary")
	checkArchived(sales[1], "summary gone")
	// Nobody rebuilds an archived sale: not the backend just now, not the
	// reconcilers (every second) while we look.
	stack.WaitFor(t, "two reconcile passes", 30*time.Second, func() bool { return reconcilePasses(t, s) >= 2 })
	base := reconcilePasses(t, s)
	stack.WaitFor(t, "two more reconcile passes", 30*time.Second, func() bool { return reconcilePasses(t, s) >= base+2 })
	if got := saleKeys(t, s)[sales[1].ID]; len(got) != 0 {
		t.Errorf("the archived sale came back into Redis: %v", got)
	}
	checkArchived(sales[2], "summary in Redis")

	// Reopened with more stock: rebuilt whole from MySQL, it sells the new
	// units to new buyers only up to each one's limit, and keyed replays of
	// its archived orders still get their order.
	reopened := stack.Sale{ID: sales[0].ID, Stock: 30, Limit: 2}
	putSale(t, s, reopened.ID, reopened.Stock, reopened.Limit, start, time.Now().Add(time.Hour))
	if archived(t, s, reopened.ID) {
		t.Fatal("the reopened sale is still archived")
	}
	old := crowds[reopened.ID]
	more := stack.NewCrowd(reopened, 30, 2, fmt.Sprintf("s%d", reopened.ID)) // the same users and keys
	again := stack.NewCrowd(reopened, 20, 2, "reopened")
	more.Attempts = append(more.Attempts, again.Attempts...)
	more.Run(s, s.Backends)
	oldIDs := map[string]string{}
	for _, a := range old.Accepted() {
		if a.Key != "" {
			oldIDs[a.User+"\x00"+a.Key] = a.OrderID
		}
	}
	for _, a := range more.Accepted() {
		if id, ok := oldIDs[a.User+"\x00"+a.Key]; ok && id != a.OrderID {
			t.Errorf("after reopening, %s's key %s got order %s, before %s", a.User, a.Key, a.OrderID, id)
		}
	}
	old.Attempts = append(old.Attempts, more.Attempts...)
	s.Drain(t, reopened, old.Accepted())
	s.MopUp(t, reopened, old)
	s.Check(t, "lifecycle reopened", reopened, old)
}

// reconcilePasses is the smallest reconcile pass count of the stack's workers.
func reconcilePasses(t *testing.T, s *stack.Stack) int {
	t.Helper()
	least := -1
	for _, w := range s.Workers {
		resp, err := s.HTTP.Get(w.URL() + "/metrics")
		servicetest.Must(t, err, "metrics")
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "seckill_reconcile_passes_total ") {
				_, _ = fmt.Sscanf(strings.TrimPrefix(line, "seckill_reconcile_passes_total "), "%d", &n)
			}
		}
		if least < 0 || n < least {
			least = n
		}
	}
	return least
}

// startHeld starts the stack's workers with the archiver's hold hook armed
// on dir (worker/testhook.go).
func startHeld(t *testing.T, s *stack.Stack, dir string) {
	t.Helper()
	for _, w := range s.Workers {
		w.Start(t, "SECKILL_TEST_ARCHIVE_HOLD="+dir)
	}
	for _, w := range s.Workers {
		w.WaitReady(t, "/readyz")
	}
}

// lockWaits counts sessions of the stack's database waiting for a row lock:
// in a lock wait by InnoDB's account, or still in a locking read after 200 ms
// (InnoDB's transaction table is a cache and may not list the waiter yet).
// The archiver, held in its hook, is idle in its transaction meanwhile.
func lockWaits(t *testing.T, s *stack.Stack, db string) int {
	t.Helper()
	var n int
	servicetest.Must(t, s.DB.QueryRow(`SELECT COUNT(*) FROM information_schema.PROCESSLIST p
		LEFT JOIN information_schema.INNODB_TRX x ON x.trx_mysql_thread_id = p.ID
		WHERE p.DB = ? AND (x.trx_state = 'LOCK WAIT' OR (p.COMMAND = 'Query' AND p.INFO LIKE '%FOR UPDATE%' AND p.TIME_MS > 200))`, db).Scan(&n), "lock waits")
	return n
}

// archiveChecks reads the worker's count of archive checks with outcome.
func archiveChecks(t *testing.T, s *stack.Stack, outcome string) int {
	t.Helper()
	n := 0
	for _, w := range s.Workers {
		resp, err := s.HTTP.Get(w.URL() + "/metrics")
		servicetest.Must(t, err, "metrics")
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		prefix := `seckill_archive_checks_total{outcome="` + outcome + `"} `
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, prefix) {
				var k int
				_, _ = fmt.Sscanf(strings.TrimPrefix(line, prefix), "%d", &k)
				n += k
			}
		}
	}
	return n
}

// sessions describes the server's sessions on database db (diagnostics).
func sessions(t *testing.T, s *stack.Stack, db string) []string {
	rows, err := s.DB.Query(`SELECT p.ID, COALESCE(p.STATE, ''), COALESCE(LEFT(p.INFO, 80), ''), COALESCE(x.trx_state, '-')
		FROM information_schema.PROCESSLIST p LEFT JOIN information_schema.INNODB_TRX x ON x.trx_mysql_thread_id = p.ID
		WHERE p.DB = ?`, db)
	if err != nil {
		return []string{err.Error()}
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id int64
		var state, info, trx string
		if rows.Scan(&id, &state, &info, &trx) == nil {
			out = append(out, fmt.Sprintf("%d %q %q trx=%s", id, state, info, trx))
		}
	}
	return out
}

// TestArchiveRacesAdminAndPurchase forces the two interleavings that matter,
// with the archiver held at the moment it holds the activity's row lock and
// has not yet run its script:
//   - an admin PUT that reopens the sale arrives then: it waits for the lock,
//     the archive completes, and the PUT wins — the sale is live again, whole,
//     and sells correctly;
//   - a purchase reserved at the very end of the window whose message was
//     lost (its backend died before publishing): the sale is not archived
//     while it is pending — the sweeper re-publishes it after its deadline and
//     a worker confirms it first — and a purchase during the held archive
//     reserves nothing.
//
// After each: nothing lost, nothing sold twice, no archived sale with
// pending orders.
func TestArchiveRacesAdminAndPurchase(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries")
	}
	t.Parallel()
	// A held archive keeps its transaction (and so the row lock) open for as
	// long as the test needs; database/sql rolls a transaction back when its
	// context ends, which the query timeout bounds.
	held := lifecycleConfig + "[mysql]\nquery_timeout = \"60s\"\n"
	s := stack.New(t, stack.Options{Backends: 1, Workers: 1, Config: held, NoStartWorkers: true})
	hold := t.TempDir()
	db := dbName(t, s.DSN)
	startHeld(t, s, hold)
	release := func(id int64) {
		servicetest.Must(t, os.WriteFile(filepath.Join(hold, fmt.Sprintf("go-%d", id)), nil, 0o644), "release hold")
	}
	lockedAt := func(id int64) bool {
		_, err := os.Stat(filepath.Join(hold, fmt.Sprintf("locked-%d", id)))
		return err == nil
	}

	now := time.Now()
	start := now.Add(-time.Minute)
	adm := stack.Sale{ID: 201, Stock: 10, Limit: 2}
	pur := stack.Sale{ID: 202, Stock: 10, Limit: 2}
	putSale(t, s, adm.ID, adm.Stock, adm.Limit, start, now.Add(time.Hour))
	putSale(t, s, pur.ID, pur.Stock, pur.Limit, start, now.Add(time.Hour))
	admCrowd := stack.NewCrowd(adm, 3, 2, "adm")
	admCrowd.Run(s, s.Backends)
	purCrowd := stack.NewCrowd(pur, 3, 2, "pur")
	purCrowd.Run(s, s.Backends)
	if len(admCrowd.Accepted()) == 0 || len(purCrowd.Accepted()) == 0 {
		t.Fatalf("no purchase accepted: %s / %s", admCrowd.Summary(), purCrowd.Summary())
	}
	s.Drain(t, adm, admCrowd.Accepted())
	s.Drain(t, pur, purCrowd.Accepted())
	// The last purchase of sale 202, reserved just before its end; its
	// message never reaches the broker, so its client was never answered 202
	// (the backend answers only after the confirm). Its deadline is 3s past
	// the end: it holds the archive until the sweeper expires it.
	end := time.Now().Add(time.Second)
	edge, err := s.Res.Reserve(context.Background(), reservation.Request{ActivityID: pur.ID, UserID: "edge", IdempotencyKey: "edge-key",
		Quantity: 1, OrderID: ordermsg.NewOrderID(pur.ID), TTL: 4 * time.Second})
	servicetest.Must(t, err, "reserve at the end")
	if edge.Outcome != reservation.Reserved {
		t.Fatalf("reserve at the end: %s", edge.Outcome)
	}
	// Sale 201 ends after 202's order is settled, so that the archiver looks
	// at 202 while it is pending rather than waiting in the hold of 201.
	putSale(t, s, adm.ID, adm.Stock, adm.Limit, start, end.Add(6*time.Second))
	putSale(t, s, pur.ID, pur.Stock, pur.Limit, start, end)

	checkPurchaseRace := func() {
		// Held with the row locked: whatever was pending is settled, every
		// accepted order is in MySQL, and the archiver said "pending" first.
		rs, _, err := s.Res.Sale(context.Background(), pur.ID)
		servicetest.Must(t, err, "sale")
		open, err := s.Res.Overdue(context.Background(), pur.ID, time.Now().Add(time.Hour), 10)
		servicetest.Must(t, err, "open orders")
		if rs.Pending != 0 || len(open) != 0 {
			t.Errorf("the archiver reached sale %d with %d units pending, %d open orders", pur.ID, rs.Pending, len(open))
		}
		if n := archiveChecks(t, s, "pending"); n == 0 {
			resp, _ := s.HTTP.Get(s.Workers[0].URL() + "/metrics")
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			var lines []string
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, "archive") {
					lines = append(lines, l)
				}
			}
			t.Errorf("the archiver never found the end-of-window order pending: %v", lines)
		}
		// Never confirmed by the broker, never re-published: the sweeper
		// expired it (stored without its key), and it took no unit.
		var edgeStatus, edgeReason string
		if err := s.DB.QueryRow(`SELECT status, COALESCE(reason, '') FROM orders WHERE order_id = ?`, edge.OrderID).Scan(&edgeStatus, &edgeReason); err != nil ||
			edgeStatus != "failed" || edgeReason != "expired" {
			t.Errorf("end-of-window order %s never published: %q %q %v, want failed expired", edge.OrderID, edgeStatus, edgeReason, err)
		}
		accepted := purCrowd.Accepted()
		for _, a := range accepted {
			var status string
			if err := s.DB.QueryRow(`SELECT status FROM orders WHERE order_id = ?`, a.OrderID).Scan(&status); err != nil || status != "confirmed" {
				t.Errorf("accepted order %s when the archiver is about to archive: %q %v", a.OrderID, status, err)
			}
		}
		if got := buy(t, s, pur.ID, "during", "during-key"); got.Status != http.StatusConflict || got.Code != "ended" {
			t.Errorf("purchase during the archive: %+v", got)
		}
		release(pur.ID)
		stack.WaitFor(t, fmt.Sprintf("sale %d archived", pur.ID), time.Minute, func() bool { return archived(t, s, pur.ID) })
		var sold, total, stock, confirmed int64
		servicetest.Must(t, s.DB.QueryRow(`SELECT sold, total_stock, stock FROM activities WHERE id = ?`, pur.ID).Scan(&sold, &total, &stock), "row")
		servicetest.Must(t, s.DB.QueryRow(`SELECT COALESCE(SUM(quantity), 0) FROM orders WHERE activity_id = ? AND status = 'confirmed'`, pur.ID).Scan(&confirmed), "orders")
		if sold != confirmed || sold+stock != total || sold > total {
			t.Errorf("sale %d: sold %d, confirmed orders %d, stock %d of %d", pur.ID, sold, confirmed, stock, total)
		}
		for _, a := range accepted {
			if a.Key == "" {
				continue
			}
			if got := buy(t, s, pur.ID, a.User, a.Key); got.Status != http.StatusAccepted || got.OrderID != a.OrderID {
				t.Errorf("keyed replay of %s after the archive: %+v", a.OrderID, got)
			}
		}
		// The expired order's key was never answered with it: after the
		// archive it is a new purchase of an ended sale.
		if got := buy(t, s, pur.ID, "edge", "edge-key"); got.Status != http.StatusConflict || got.Code != "ended" {
			t.Errorf("the expired order's key after the archive: %+v, want 409 ended", got)
		}
	}

	checkAdminRace := func() {
		put := make(chan int, 1)
		go func() { put <- putStatus(s, adm.ID, 12, adm.Limit, start, time.Now().Add(time.Hour)) }()
		deadline := time.Now().Add(30 * time.Second)
		for lockWaits(t, s, db) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("the PUT is not waiting for the archiver's row lock; sessions of %s: %v", db, sessions(t, s, db))
			}
			time.Sleep(20 * time.Millisecond)
		}
		select {
		case st := <-put:
			t.Fatalf("the PUT finished (%d) while the archiver held the row", st)
		default:
		}
		release(adm.ID)
		if st := <-put; st != http.StatusOK {
			t.Fatalf("PUT: %d", st)
		}
		if archived(t, s, adm.ID) {
			t.Fatal("the PUT lost: the sale is archived")
		}
		rs, found, err := s.Res.Sale(context.Background(), adm.ID)
		servicetest.Must(t, err, "sale")
		if !found || rs.Archived || rs.Total != 12 {
			t.Fatalf("after the PUT Redis holds %+v (found %v), want the live sale of 12", rs, found)
		}
	}

	// The archiver takes the sales in its own order; each is held in turn.
	for done := map[int64]bool{}; len(done) < 2; {
		stack.WaitFor(t, "the archiver holding a sale", time.Minute, func() bool {
			return (!done[adm.ID] && lockedAt(adm.ID)) || (!done[pur.ID] && lockedAt(pur.ID))
		})
		if !done[pur.ID] && lockedAt(pur.ID) {
			checkPurchaseRace()
			done[pur.ID] = true
		} else {
			checkAdminRace()
			done[adm.ID] = true
		}
	}

	// The reopened sale sells correctly: the same users and keys get their
	// orders back, limits hold, new buyers take the new units.
	reopened := stack.Sale{ID: adm.ID, Stock: 12, Limit: adm.Limit}
	more := stack.NewCrowd(reopened, 3, 2, "adm") // the same users and keys
	more.Attempts = append(more.Attempts, stack.NewCrowd(reopened, 10, 2, "after").Attempts...)
	more.Run(s, s.Backends)
	for _, a := range admCrowd.Accepted() {
		for _, b := range more.Accepted() {
			if a.Key != "" && a.User == b.User && a.Key == b.Key && a.OrderID != b.OrderID {
				t.Errorf("%s's key %s: order %s before the archive, %s after", a.User, a.Key, a.OrderID, b.OrderID)
			}
		}
	}
	admCrowd.Attempts = append(admCrowd.Attempts, more.Attempts...)
	s.Drain(t, reopened, admCrowd.Accepted())
	s.MopUp(t, reopened, admCrowd)
	s.Check(t, "archive vs admin PUT", reopened, admCrowd)
	// It stays live: it is not archived again while it runs.
	base := reconcilePasses(t, s)
	stack.WaitFor(t, "two reconcile passes", 30*time.Second, func() bool { return reconcilePasses(t, s) >= base+2 })
	if archived(t, s, adm.ID) {
		t.Error("the reopened sale was archived while open")
	}
}
