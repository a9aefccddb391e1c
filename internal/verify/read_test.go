package verify

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/servicetest"
)

const actID = 42

// fixture is a finished sale written straight into a real MariaDB database
// and a real Redis key space, as the workers would have left it.
type fixture struct {
	db     *sql.DB
	rdb    redis.UniversalClient
	prefix string
	keys   reservation.Keys
	input  Input
}

func openDB(t *testing.T) *sql.DB {
	t.Helper()
	dsn := servicetest.MySQLDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	servicetest.Must(t, err, "parse dsn")
	cfg.ParseTime = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	servicetest.Must(t, err, "open mysql")
	t.Cleanup(func() { _ = db.Close() })
	servicetest.Must(t, schema.Ensure(context.Background(), db), "schema")
	return db
}

// fixtureBuckets is the bucket count of the fixture's sale (lua/record.lua):
// several, so that the checker walks more than one hash of each kind.
const fixtureBuckets = 4

// newFixture builds a healthy sale: 10 units, limit 2; users u1..u5 bought
// one unit each, u6 two, u7's order failed (released); nothing pending.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	rdb, prefix := servicetest.Redis(t)
	f := &fixture{db: openDB(t), rdb: rdb, prefix: prefix, keys: reservation.KeysFor(prefix, actID)}
	now := time.Now().UTC()
	f.exec(t, "INSERT INTO activities (id, total_stock, stock, sold, per_user_limit, starts_at, ends_at) VALUES (?, 10, 10, 0, 2, ?, ?)",
		actID, now.Add(-time.Minute), now.Add(time.Hour))
	f.rdb.HSet(context.Background(), f.keys.Meta, "total", 10, "sold", 0, "pending", 0, "limit", 2,
		"start", now.Add(-time.Minute).UnixMilli(), "end", now.Add(time.Hour).UnixMilli(), "buckets", fixtureBuckets)
	f.input = Input{ActivityID: actID, Stock: 10, Limit: 2}
	for i := 1; i <= 5; i++ {
		f.order(t, fmt.Sprintf("o%d", i), fmt.Sprintf("u%d", i), fmt.Sprintf("k%d", i), 1, "confirmed", "")
	}
	f.order(t, "o6", "u6", "k6", 2, "confirmed", "")
	f.order(t, "o7", "u7", "k7", 1, "failed", "released")
	// A retry of u1's purchase answered with the same order (a replay).
	f.input.Accepted = append(f.input.Accepted, Accepted{OrderID: "o1", UserID: "u1", Key: "k1"})
	return f
}

func (f *fixture) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	_, err := f.db.Exec(q, args...)
	servicetest.Must(t, err, "exec %s", q)
}

// order writes an accepted order as a worker settles it: MySQL row, stock,
// per-user total, Redis record and counters.
func (f *fixture) order(t *testing.T, id, user, key string, qty int, status, reason string) {
	t.Helper()
	ctx := context.Background()
	var r any
	if reason != "" {
		r = reason
	}
	f.exec(t, "INSERT INTO orders (order_id, activity_id, user_id, quantity, status, reason, idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?)",
		id, actID, user, qty, status, r, key)
	state := "F"
	if status == "confirmed" {
		state = "K"
		f.exec(t, "UPDATE activities SET stock = stock - ?, sold = sold + ? WHERE id = ?", qty, qty, actID)
		f.exec(t, "INSERT INTO purchases (activity_id, user_id, quantity) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE quantity = quantity + VALUES(quantity)",
			actID, user, qty)
		f.rdb.HIncrBy(ctx, f.keys.Meta, "sold", int64(qty))
		f.rdb.HIncrBy(ctx, f.keys.User(fixtureBuckets, user), user, int64(qty))
	}
	rec := fmt.Sprintf("K%d|%s", qty, user) // lua/record.lua's encodings
	if state == "F" {
		rec = fmt.Sprintf("F%d|%s|%s", qty, user, reason)
	}
	f.rdb.HSet(ctx, f.keys.Order(fixtureBuckets, id), id, rec)
	f.input.Accepted = append(f.input.Accepted, Accepted{OrderID: id, UserID: user, Key: key})
}

func (f *fixture) check(t *testing.T) Verdict {
	t.Helper()
	c := &Checker{DB: f.db, Redis: f.rdb, Prefix: f.prefix}
	v, err := c.Check(context.Background(), f.input)
	servicetest.Must(t, err, "check")
	return v
}

// TestCheck runs the reading half against real services: each broken state
// is written into MariaDB and Redis as a faulty stack would leave it.
func TestCheck(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		break_ func(t *testing.T, f *fixture)
		want   Verdict // counters only
		// reasons: substrings, one per expected reason, in any order.
		reasons []string
	}{{
		name:   "healthy",
		break_: func(*testing.T, *fixture) {},
		want:   Verdict{OK: true, Sold: 7, Stock: 10},
	}, {
		name: "oversold",
		break_: func(t *testing.T, f *fixture) {
			// Four more confirmed units written past the guard: 11 of 10.
			for i := 8; i <= 11; i++ {
				f.order(t, fmt.Sprintf("o%d", i), fmt.Sprintf("u%d", i), fmt.Sprintf("k%d", i), 1, "confirmed", "")
			}
		},
		want:    Verdict{Sold: 11, Stock: 10, Oversold: 1},
		reasons: []string{"oversold: 11 units confirmed (activities.sold 11) for a stock of 10", "stock -1 + sold 11"},
	}, {
		name: "duplicate key produced two orders",
		break_: func(t *testing.T, f *fixture) {
			// u2 retried with k2 and got a second order: 2 units, within the
			// limit. (The orders_user_key index refuses that since; the
			// verifier still catches it in a database without the index.)
			f.exec(t, "ALTER TABLE orders DROP INDEX orders_user_key")
			f.order(t, "o2bis", "u2", "k2", 1, "confirmed", "")
		},
		want:    Verdict{Sold: 8, Stock: 10, Duplicates: 2},
		reasons: []string{"idempotency keys that produced two or more orders in MySQL: u2:k2 -> o2,o2bis", "a retried Idempotency-Key got a different order id: u2:k2"},
	}, {
		name: "a key reused after a released (503) order is no duplicate",
		break_: func(t *testing.T, f *fixture) {
			// u2's first attempt with k2 was released after a failed publish and
			// answered 503; its message still reached a worker, which recorded it
			// failed, without the key it gave back. The retry with the same key
			// is a new attempt.
			f.order(t, "o2rel", "u2", "", 1, "failed", "released")
			f.input.Accepted = f.input.Accepted[:len(f.input.Accepted)-1] // answered 503, not 202
		},
		want: Verdict{OK: true, Sold: 7, Stock: 10},
	}, {
		name: "lost accepted order",
		break_: func(t *testing.T, f *fixture) {
			f.input.Accepted = append(f.input.Accepted, Accepted{OrderID: "ghost", UserID: "u9", Key: "k9"})
		},
		want:    Verdict{Sold: 7, Stock: 10, Lost: 1},
		reasons: []string{"accepted (202) orders missing in MySQL: ghost"},
	}, {
		name: "user over the limit",
		break_: func(t *testing.T, f *fixture) {
			f.order(t, "o1b", "u1", "k1b", 2, "confirmed", "")
		},
		want:    Verdict{Sold: 9, Stock: 10, OverLimit: 1},
		reasons: []string{"over the per-user limit of 2: u1 holds 3"},
	}, {
		name: "pending left",
		break_: func(t *testing.T, f *fixture) {
			f.rdb.HIncrBy(ctx, f.keys.Meta, "pending", 1)
			f.rdb.HIncrBy(ctx, f.keys.User(fixtureBuckets, "u8"), "u8", 1)
			f.rdb.HSet(ctx, f.keys.Order(fixtureBuckets, "o8"), "o8", "P1|u8|1|")
			f.rdb.ZAdd(ctx, f.keys.Deadlines, redis.Z{Score: 1, Member: "o8"})
		},
		want:    Verdict{Sold: 7, Stock: 10, Pending: 1},
		reasons: []string{"reservations still pending after the drain: meta pending 1, 1 records P/C (o8=P), 1 deadlines"},
	}, {
		name: "Redis and MySQL disagree",
		break_: func(t *testing.T, f *fixture) {
			f.rdb.HIncrBy(ctx, f.keys.Meta, "sold", -1)
			f.rdb.HSet(ctx, f.keys.Order(fixtureBuckets, "o3"), "o3", "F1|u3|released")
			f.rdb.HDel(ctx, f.keys.User(fixtureBuckets, "u3"), "u3")
		},
		want: Verdict{Sold: 7, Stock: 10},
		reasons: []string{"Redis total 10 sold 6 limit 2, MySQL total_stock 10 sold 7", "o3 confirmed in MySQL, failed in Redis",
			"per-user units disagree between Redis and MySQL for 1 users (Redis/MySQL): u3 0/1"},
	}, {
		name: "one order id for two purchases",
		break_: func(t *testing.T, f *fixture) {
			f.input.Accepted = append(f.input.Accepted, Accepted{OrderID: "o4", UserID: "u9", Key: "k9"})
		},
		want:    Verdict{Sold: 7, Stock: 10, Duplicates: 1, Lost: 0},
		reasons: []string{"one order id was given to different purchases: o4 <- u4:k4 and u9:k9"},
	}, {
		name: "failed order recorded for another user",
		break_: func(t *testing.T, f *fixture) {
			f.exec(t, "UPDATE orders SET user_id = 'u99' WHERE order_id = 'o7'")
		},
		want:    Verdict{Sold: 7, Stock: 10, Lost: 1},
		reasons: []string{"o7 (user u99, accepted for u7)"},
	}, {
		name: "API says sold out with units left",
		break_: func(t *testing.T, f *fixture) {
			f.input.API = &APIState{State: "sold_out", Sold: 7, Stock: 10, Available: 3}
		},
		want:    Verdict{Sold: 7, Stock: 10},
		reasons: []string{"the API says sold_out while 3 units are left"},
	}, {
		name: "activity missing",
		break_: func(t *testing.T, f *fixture) {
			f.input.ActivityID = 43
			f.input.Accepted = nil
		},
		want:    Verdict{Sold: 0, Stock: 10},
		reasons: []string{"activity 43 is not in MySQL", "the sale is missing in Redis"},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			if c.name == "oversold" {
				// The CHECK constraint forbids a negative stock: drop it, as a
				// broken schema or a manual edit might.
				f.exec(t, "ALTER TABLE activities DROP CONSTRAINT activities_stock_nonneg")
			}
			c.break_(t, f)
			v := f.check(t)
			t.Logf("%s", v.Line())
			for _, r := range v.Reasons {
				t.Logf("  reason: %s", r)
			}
			got := Verdict{OK: v.OK, Sold: v.Sold, Stock: v.Stock, Oversold: v.Oversold, OverLimit: v.OverLimit,
				Duplicates: v.Duplicates, Lost: v.Lost, Pending: v.Pending}
			want := c.want
			want.OK = len(c.reasons) == 0
			if got.OK != want.OK || got.Sold != want.Sold || got.Stock != want.Stock || got.Oversold != want.Oversold ||
				got.OverLimit != want.OverLimit || got.Duplicates != want.Duplicates || got.Lost != want.Lost || got.Pending != want.Pending {
				t.Errorf("verdict %+v, want %+v", got, want)
			}
			if len(v.Reasons) != len(c.reasons) {
				t.Errorf("%d reasons, want %d: %q", len(v.Reasons), len(c.reasons), v.Reasons)
			}
			for _, r := range c.reasons {
				if !containsReason(v.Reasons, r) {
					t.Errorf("no reason contains %q; reasons: %q", r, v.Reasons)
				}
			}
			line := v.Line()
			if want.OK != strings.HasPrefix(line, "verdict: ok ") {
				t.Errorf("line %q for ok=%v", line, want.OK)
			}
		})
	}
}

func containsReason(reasons []string, sub string) bool {
	for _, r := range reasons {
		if strings.Contains(r, sub) {
			return true
		}
	}
	return false
}

func TestParseUnacked(t *testing.T) {
	out := "other.orders\t3\nt_x.orders\t17\nt_x.orders.dead\t0\n"
	n, ok, err := parseUnacked(out, "t_x.orders")
	if err != nil || !ok || n != 17 {
		t.Errorf("got %d %v %v", n, ok, err)
	}
	if _, ok, err := parseUnacked(out, "missing.orders"); ok || err == nil {
		t.Errorf("a missing queue must be an error, got ok=%v err=%v", ok, err)
	}
	if _, _, err := parseUnacked("t_x.orders\tlots\n", "t_x.orders"); err == nil {
		t.Error("a bad count must be an error")
	}
}
