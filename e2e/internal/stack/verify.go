package stack

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// Drain waits until the order queue is empty, nothing is pending in Redis
// and every accepted order is decided (a row in MySQL, or failed in Redis).
func (s *Stack) Drain(t testing.TB, sale Sale, accepted []*Attempt) {
	t.Helper()
	ctx := context.Background()
	var last string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		last = s.undrained(ctx, sale, accepted)
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained after 2m: %s", last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *Stack) undrained(ctx context.Context, sale Sale, accepted []*Attempt) string {
	n, err := s.QueueDepth(s.t)
	if err != nil {
		return fmt.Sprintf("queue: %v", err)
	}
	if n > 0 {
		return fmt.Sprintf("%d messages ready", n)
	}
	rs, found, err := s.Res.Sale(ctx, sale.ID)
	if err != nil {
		return fmt.Sprintf("redis: %v", err)
	}
	if !found {
		return "sale missing in Redis"
	}
	if rs.Pending > 0 {
		return fmt.Sprintf("%d units pending in Redis", rs.Pending)
	}
	for _, a := range accepted {
		var status string
		err := s.DB.QueryRowContext(ctx, "SELECT status FROM orders WHERE order_id = ?", a.OrderID).Scan(&status)
		if err == nil {
			continue
		}
		rec, found, rerr := s.Res.Order(ctx, sale.ID, a.OrderID)
		if rerr == nil && found && rec.State == reservation.Failed {
			continue
		}
		return fmt.Sprintf("accepted order %s undecided", a.OrderID)
	}
	return ""
}

// MopUp sells what is left so that the sale ends sold out ("sold out" only
// once nothing is left), draining in between. It returns the extra attempts.
func (s *Stack) MopUp(t testing.TB, sale Sale, crowd *Crowd) {
	t.Helper()
	ctx := context.Background()
	for round := 0; ; round++ {
		var left int64
		servicetest.Must(t, s.DB.QueryRowContext(ctx, "SELECT stock FROM activities WHERE id = ?", sale.ID).Scan(&left), "stock")
		if left == 0 {
			return
		}
		if round == 8 {
			t.Fatalf("%d units still unsold in MySQL after %d mop-up rounds (Redis: %s)", left, round, s.redisView(sale.ID))
		}
		var more []*Attempt
		for i := range left + 5 {
			u := fmt.Sprintf("mopup-%d-%03d", round, i)
			more = append(more, &Attempt{User: u, Key: u, Qty: 1})
		}
		mc := &Crowd{Sale: sale, Retries: crowd.Retries, Workers: 16}
		mc.run(s.HTTP, s.liveBackends(), more)
		crowd.Attempts = append(crowd.Attempts, more...)
		s.Drain(t, sale, crowd.Accepted())
	}
}

func (s *Stack) liveBackends() []*Proc {
	var out []*Proc
	for _, b := range s.Backends {
		if b.Running() {
			out = append(out, b)
		}
	}
	return out
}

func (s *Stack) redisView(id int64) string {
	rs, found, err := s.Res.Sale(context.Background(), id)
	return fmt.Sprintf("%+v found=%v err=%v", rs, found, err)
}

// Verdict is the outcome of a fault case, one row of `make chaos`.
type Verdict struct {
	Fault                          string
	Attempts, Accepted             int
	Confirmed, Failed              int
	Oversold, OverLimit, Duplicate int
	Lost, Pending                  int
	Reasons                        []string
}

// OK is true when every invariant held.
func (v Verdict) OK() bool { return len(v.Reasons) == 0 }

func (v *Verdict) fail(format string, args ...any) {
	v.Reasons = append(v.Reasons, fmt.Sprintf(format, args...))
}

// Check asserts I1–I5 for the sale in MySQL and Redis. Convergence (I5) is
// given up to 20s: the reconciler repairs drift a fault left behind (the
// fault configs run it every second). The verdict is returned and, under
// SECKILL_CHAOS_REPORT, appended to the report file as a table row.
func (s *Stack) Check(t testing.TB, fault string, sale Sale, crowd *Crowd) Verdict {
	t.Helper()
	var v Verdict
	deadline := time.Now().Add(20 * time.Second)
	for {
		v = s.check(t, sale, crowd)
		v.Fault = fault
		if v.OK() || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	// I5: sold out is answered now that nothing is left.
	probe := &Attempt{User: "after-the-sale", Key: "after", Qty: 1}
	(&Crowd{Sale: sale, Retries: 3, Workers: 1}).run(s.HTTP, s.liveBackends(), []*Attempt{probe})
	if probe.Status != http.StatusConflict || probe.Code != "sold_out" {
		v.fail("I5: a purchase after the sale got %v, want 409 sold_out", probe.Answers)
	}
	Report(v)
	for _, r := range v.Reasons {
		t.Error(r)
	}
	t.Logf("%s: attempts %d accepted %d confirmed %d failed %d; answers: %s",
		fault, v.Attempts, v.Accepted, v.Confirmed, v.Failed, crowd.Summary())
	return v
}

type orderRow struct {
	user, status, reason, key string
	qty                       int64
}

func (s *Stack) check(t testing.TB, sale Sale, crowd *Crowd) Verdict {
	ctx := context.Background()
	var v Verdict
	v.Attempts = len(crowd.Attempts)
	accepted := map[string]*Attempt{}
	for _, a := range crowd.Accepted() {
		accepted[a.OrderID] = a
	}
	v.Accepted = len(accepted)

	rows := map[string]orderRow{}
	q, err := s.DB.QueryContext(ctx, "SELECT order_id, user_id, status, COALESCE(reason, ''), COALESCE(idempotency_key, ''), quantity FROM orders WHERE activity_id = ?", sale.ID)
	servicetest.Must(t, err, "orders")
	for q.Next() {
		var id string
		var r orderRow
		servicetest.Must(t, q.Scan(&id, &r.user, &r.status, &r.reason, &r.key, &r.qty), "scan")
		if _, dup := rows[id]; dup {
			v.Duplicate++
			v.fail("I3: order %s written twice", id)
		}
		rows[id] = r
	}
	servicetest.Must(t, q.Err(), "orders")
	_ = q.Close()

	// I1: no oversell, and the guard row balances.
	var confirmed int64
	perUser := map[string]int64{}
	for id, r := range rows {
		switch r.status {
		case "confirmed":
			v.Confirmed++
			confirmed += r.qty
			perUser[r.user] += r.qty
		default:
			v.Failed++
			if r.reason == "" {
				v.fail("I4: failed order %s without a reason", id)
			}
		}
	}
	var left, sold, total int64
	servicetest.Must(t, s.DB.QueryRowContext(ctx, "SELECT stock, sold, total_stock FROM activities WHERE id = ?", sale.ID).Scan(&left, &sold, &total), "sale")
	if confirmed > sale.Stock {
		v.Oversold = int(confirmed - sale.Stock)
		v.fail("I1: %d units confirmed of %d", confirmed, sale.Stock)
	}
	if total != sale.Stock || sold != confirmed || left != total-sold || left < 0 {
		v.fail("I1: MySQL row stock %d sold %d total %d, confirmed orders hold %d", left, sold, total, confirmed)
	}

	// I2: per-user limit; purchases agrees with the orders.
	bought := map[string]int64{}
	p, err := s.DB.QueryContext(ctx, "SELECT user_id, quantity FROM purchases WHERE activity_id = ?", sale.ID)
	servicetest.Must(t, err, "purchases")
	for p.Next() {
		var u string
		var n int64
		servicetest.Must(t, p.Scan(&u, &n), "scan")
		if n > 0 {
			bought[u] = n
		}
	}
	_ = p.Close()
	for u, n := range perUser {
		if n > sale.Limit {
			v.OverLimit++
			v.fail("I2: user %s holds %d > %d", u, n, sale.Limit)
		}
		if bought[u] != n {
			v.fail("I2: user %s: purchases %d, confirmed orders %d", u, bought[u], n)
		}
	}
	for u, n := range bought {
		if perUser[u] != n {
			v.fail("I2: purchases has %s at %d, confirmed orders %d", u, n, perUser[u])
		}
	}

	// I3: one order per (user, key), and every 202 of a key named it.
	perKey := map[string]string{}
	for id, r := range rows {
		// A reservation released after a failed publish (503, "nothing
		// kept") whose message reached the broker anyway is recorded as
		// failed/released, never confirmed; its key was forgotten, so the
		// client's retry with it is a new order (docs/purchase-path.md).
		if r.key == "" || (r.status == "failed" && r.reason == "released") {
			continue
		}
		k := r.user + "\x00" + r.key
		if prev, ok := perKey[k]; ok {
			v.Duplicate++
			v.fail("I3: key %q of %s produced orders %s and %s", r.key, r.user, prev, id)
		}
		perKey[k] = id
	}
	answered := map[string]string{}
	for _, a := range crowd.Attempts {
		if a.Status != http.StatusAccepted || a.Key == "" {
			continue
		}
		k := a.User + "\x00" + a.Key
		if prev, ok := answered[k]; ok && prev != a.OrderID {
			v.Duplicate++
			v.fail("I3: %s key %q answered orders %s and %s", a.User, a.Key, prev, a.OrderID)
		}
		answered[k] = a.OrderID
		if id, ok := perKey[k]; ok && id != a.OrderID {
			v.Duplicate++
			v.fail("I3: %s key %q answered %s, MySQL holds %s", a.User, a.Key, a.OrderID, id)
		}
	}

	// I4: every 202 decided — in MySQL, or failed with a reason in Redis (a
	// replay of an order released after a failed publish).
	redisFailed := 0
	for id := range accepted {
		r, ok := rows[id]
		if ok && (r.status == "confirmed" || r.status == "failed") {
			continue
		}
		rec, found, err := s.Res.Order(ctx, sale.ID, id)
		servicetest.Must(t, err, "record")
		if !ok && found && rec.State == reservation.Failed && rec.Reason != "" {
			redisFailed++
			continue
		}
		v.Lost++
		v.fail("I4: accepted order %s: MySQL %+v (found %v), Redis %+v (found %v)", id, r, ok, rec, found)
	}
	v.Failed += redisFailed

	// The client's ledger: units sold = units of the confirmed orders some
	// attempt was finally answered 202 for. A unit sold beyond that was sold
	// on behalf of an attempt answered 503 (or never answered).
	var ledger int64
	named := map[string]bool{}
	for _, a := range crowd.Attempts {
		if a.Status != http.StatusAccepted || named[a.OrderID] {
			continue
		}
		named[a.OrderID] = true
		if r, ok := rows[a.OrderID]; ok && r.status == "confirmed" {
			ledger += r.qty
		}
	}
	if sold != ledger {
		v.fail("ledger: MySQL sold %d units, the confirmed orders answered 202 hold %d", sold, ledger)
		var extra []string
		for id, r := range rows {
			if r.status == "confirmed" && !named[id] {
				extra = append(extra, fmt.Sprintf("%s of %s (key %q)", id, r.user, r.key))
			}
		}
		sort.Strings(extra)
		v.fail("ledger: %d confirmed orders never answered 202, e.g. %v", len(extra), first(extra, 5))
	}
	overdue, err := s.Res.Overdue(ctx, sale.ID, time.Now().Add(24*time.Hour), 100)
	servicetest.Must(t, err, "deadlines")
	if len(overdue) > 0 {
		v.Pending += len(overdue)
		v.fail("I4: %d reservations still tracked, e.g. %v", len(overdue), first(overdue, 3))
	}

	// I5: Redis agrees with MySQL.
	rs, found, err := s.Res.Sale(ctx, sale.ID)
	servicetest.Must(t, err, "Redis sale")
	if !found || rs.Total != total || rs.Sold != sold || rs.Pending != 0 || rs.Available() != left {
		v.Pending += int(rs.Pending)
		v.fail("I5: Redis %+v (found %v), MySQL total %d sold %d left %d", rs, found, total, sold, left)
	}
	var mismatched []string
	for id, r := range rows {
		rec, found, err := s.Res.Order(ctx, sale.ID, id)
		servicetest.Must(t, err, "record")
		if !found && s.RedisLost {
			continue
		}
		if !found || rec.State.Public() != r.status {
			mismatched = append(mismatched, fmt.Sprintf("%s Redis %q MySQL %s", id, rec.State, r.status))
		}
	}
	if len(mismatched) > 0 {
		sort.Strings(mismatched)
		v.fail("I5: %d order records disagree, e.g. %v", len(mismatched), first(mismatched, 3))
	}
	users, err := s.Redis.HGetAll(ctx, s.Res.Keys(sale.ID).Users).Result()
	servicetest.Must(t, err, "Redis users")
	var userDiff []string
	for u, n := range users {
		if n != fmt.Sprint(bought[u]) {
			userDiff = append(userDiff, fmt.Sprintf("%s Redis %s MySQL %d", u, n, bought[u]))
		}
	}
	for u, n := range bought {
		if _, ok := users[u]; !ok {
			userDiff = append(userDiff, fmt.Sprintf("%s Redis - MySQL %d", u, n))
		}
	}
	if len(userDiff) > 0 {
		sort.Strings(userDiff)
		v.fail("I5: %d per-user totals disagree, e.g. %v", len(userDiff), first(userDiff, 3))
	}
	return v
}

func first(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// EnvReport names the file `make chaos` collects verdict rows in.
const EnvReport = "SECKILL_CHAOS_REPORT"

// Report appends v as a tab-separated row (fault, attempts, accepted,
// confirmed, failed, oversold, duplicates, lost, verdict) to the file named
// by SECKILL_CHAOS_REPORT; without it, it does nothing.
func Report(v Verdict) {
	path := os.Getenv(EnvReport)
	if path == "" {
		return
	}
	verdict := "ok"
	if !v.OK() {
		verdict = "FAIL"
	}
	line := strings.Join([]string{v.Fault, fmt.Sprint(v.Attempts), fmt.Sprint(v.Accepted), fmt.Sprint(v.Confirmed),
		fmt.Sprint(v.Failed), fmt.Sprint(v.Oversold), fmt.Sprint(v.Duplicate), fmt.Sprint(v.Lost), verdict}, "\t") + "\n"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	_, _ = f.WriteString(line)
	_ = f.Close()
}
