package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/worker/internal/store"
	"github.com/seckill/seckill/worker/internal/workermetrics"
)

// openDB returns a fresh database with the schema.
func openDB(t testing.TB) *sql.DB {
	t.Helper()
	c := conf.Default().MySQL
	c.DSN = servicetest.MySQLDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := schema.Open(ctx, c, schema.ReadCommitted)
	servicetest.Must(t, err, "open schema")
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func newStore(t testing.TB, db *sql.DB) *store.Store {
	return store.New(db, workermetrics.New(prometheus.NewRegistry()), 10*time.Second)
}

func createSale(t testing.TB, db *sql.DB, id, stock, limit int64) {
	t.Helper()
	_, err := db.Exec(`INSERT INTO activities (id, total_stock, stock, sold, per_user_limit, starts_at, ends_at)
		VALUES (?, ?, ?, 0, ?, ?, ?)`, id, stock, stock, limit, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	servicetest.Must(t, err, "create sale %d", id)
}

func order(activity int64, user string, qty int64) ordermsg.Order {
	return ordermsg.Order{V: ordermsg.Version, OrderID: ordermsg.NewOrderID(activity), ActivityID: activity,
		UserID: user, Quantity: qty, ReservedAt: time.Now().UnixMilli(), Deadline: time.Now().Add(time.Minute).UnixMilli()}
}

type row struct {
	status, reason string
	qty            int64
}

func orderRows(t testing.TB, db *sql.DB) map[string]row {
	t.Helper()
	rows, err := db.Query("SELECT order_id, status, COALESCE(reason, ''), quantity FROM orders")
	servicetest.Must(t, err, "select orders")
	defer rows.Close()
	out := map[string]row{}
	for rows.Next() {
		var id string
		var r row
		servicetest.Must(t, rows.Scan(&id, &r.status, &r.reason, &r.qty), "scan")
		out[id] = r
	}
	servicetest.Must(t, rows.Err(), "rows")
	return out
}

func stockSold(t testing.TB, db *sql.DB, id int64) (stock, sold int64) {
	t.Helper()
	servicetest.Must(t, db.QueryRow("SELECT stock, sold FROM activities WHERE id = ?", id).Scan(&stock, &sold), "read sale")
	return stock, sold
}

func purchases(t testing.TB, db *sql.DB, id int64) map[string]int64 {
	t.Helper()
	rows, err := db.Query("SELECT user_id, quantity FROM purchases WHERE activity_id = ?", id)
	servicetest.Must(t, err, "select purchases")
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var u string
		var q int64
		servicetest.Must(t, rows.Scan(&u, &q), "scan")
		out[u] = q
	}
	return out
}

// step is one order of a table case: its user, quantity, claim state, and
// the outcome wanted ("confirmed", a failure reason, or "=N": a redelivery of
// the case's N-th order, reporting that order's outcome).
type step struct {
	user  string
	qty   int64
	claim reservation.State
	want  string
}

func TestWrite(t *testing.T) {
	t.Parallel()
	const act = 7
	K, C, F, U := reservation.Confirmed, reservation.Claimed, reservation.Failed, reservation.Unknown
	cases := []struct {
		name         string
		stock, limit int64
		noSale       bool
		batches      [][]step
		wantStock    int64
		wantBuyers   map[string]int64
	}{
		{
			name: "confirm", stock: 10, limit: 3,
			batches: [][]step{{
				{"alice", 1, C, "confirmed"}, {"bob", 2, C, "confirmed"}, {"carol", 3, U, "confirmed"},
			}},
			wantStock: 4, wantBuyers: map[string]int64{"alice": 1, "bob": 2, "carol": 3},
		},
		{
			name: "sold out splits the batch until each order is decided", stock: 5, limit: 5,
			batches: [][]step{{
				{"u1", 1, C, "confirmed"}, {"u2", 1, C, "confirmed"}, {"u3", 1, C, "confirmed"}, {"u4", 1, C, "confirmed"},
				{"u5", 1, C, "confirmed"}, {"u6", 1, C, "sold_out"}, {"u7", 1, C, "sold_out"}, {"u8", 1, C, "sold_out"},
			}},
			wantStock: 0, wantBuyers: map[string]int64{"u1": 1, "u2": 1, "u3": 1, "u4": 1, "u5": 1},
		},
		{
			name: "sold out with quantities leaves what no order fits", stock: 5, limit: 2,
			batches: [][]step{{
				{"u1", 2, C, "confirmed"}, {"u2", 2, C, "confirmed"}, {"u3", 2, C, "sold_out"},
			}, {
				{"u4", 2, C, "sold_out"}, {"u5", 1, C, "confirmed"}, {"u6", 1, C, "sold_out"},
			}},
			wantStock: 0, wantBuyers: map[string]int64{"u1": 2, "u2": 2, "u5": 1},
		},
		{
			name: "per-user limit across batches and within one", stock: 100, limit: 2,
			batches: [][]step{
				{{"ann", 1, C, "confirmed"}},
				{{"ann", 1, C, "confirmed"}, {"ann", 1, C, "limit_exceeded"}, {"ben", 2, C, "confirmed"}},
				{{"ann", 2, C, "limit_exceeded"}, {"ben", 1, U, "limit_exceeded"}, {"cat", 3, C, "limit_exceeded"}},
			},
			wantStock: 96, wantBuyers: map[string]int64{"ann": 2, "ben": 2},
		},
		{
			name: "released order is failed and takes no stock", stock: 3, limit: 2,
			batches: [][]step{{
				{"ann", 2, F, "released"}, {"ann", 2, C, "confirmed"}, {"ben", 1, F, "released"},
			}},
			wantStock: 1, wantBuyers: map[string]int64{"ann": 2},
		},
		{
			name: "unknown activity", noSale: true,
			batches:    [][]step{{{"ann", 1, C, "activity_not_found"}, {"ben", 1, F, "released"}}},
			wantBuyers: map[string]int64{},
		},
		{
			name: "redelivery: the same message three times is one order, stock taken once", stock: 10, limit: 2,
			batches: [][]step{
				{{"ann", 2, C, "confirmed"}, {"ben", 1, C, "confirmed"}},
				{{"", 0, C, "=0"}},
				{{"", 0, K, "=0"}, {"", 0, K, "=1"}, {"cat", 1, C, "confirmed"}},
			},
			wantStock: 6, wantBuyers: map[string]int64{"ann": 2, "ben": 1, "cat": 1},
		},
		{
			name: "redelivery of a failed order reports its reason", stock: 1, limit: 2,
			batches: [][]step{
				{{"ann", 2, C, "sold_out"}, {"ben", 1, F, "released"}},
				{{"", 0, C, "=0"}, {"", 0, C, "=1"}},
			},
			wantStock: 1, wantBuyers: map[string]int64{},
		},
		{
			name: "an order twice in one batch is written once", stock: 10, limit: 2,
			batches:   [][]step{{{"ann", 1, C, "confirmed"}, {"", 0, C, "=0"}}},
			wantStock: 9, wantBuyers: map[string]int64{"ann": 1},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := openDB(t)
			s := newStore(t, db)
			if !tc.noSale {
				createSale(t, db, act, tc.stock, tc.limit)
			}
			var msgs []ordermsg.Order // every distinct order of the case, in order
			var wantFinal []string    // the outcome each distinct order ends with
			ctx := context.Background()
			for bi, batch := range tc.batches {
				in := make([]store.Order, len(batch))
				want := make([]string, len(batch))
				redelivery := make([]bool, len(batch))
				for i, st := range batch {
					var n int
					if _, err := fmt.Sscanf(st.want, "=%d", &n); err == nil {
						in[i] = store.Order{Order: msgs[n], Claim: st.claim}
						want[i], redelivery[i] = wantFinal[n], true
						continue
					}
					o := order(act, st.user, st.qty)
					msgs = append(msgs, o)
					wantFinal = append(wantFinal, st.want)
					in[i] = store.Order{Order: o, Claim: st.claim}
					want[i] = st.want
				}
				out, err := s.Write(ctx, act, in)
				servicetest.Must(t, err, "batch %d", bi)
				if len(out) != len(in) {
					t.Fatalf("batch %d: %d outcomes for %d orders", bi, len(out), len(in))
				}
				for i, o := range out {
					got := "confirmed"
					if !o.Confirmed {
						got = o.Reason
					}
					if o.OrderID != in[i].OrderID || got != want[i] || o.Redelivered != redelivery[i] ||
						o.UserID != in[i].UserID || o.Quantity != in[i].Quantity {
						t.Errorf("batch %d order %d: got %+v, want %s (redelivered %v)", bi, i, o, want[i], redelivery[i])
					}
				}
			}
			rows := orderRows(t, db)
			if len(rows) != len(msgs) {
				t.Errorf("%d order rows, want %d", len(rows), len(msgs))
			}
			var confirmed int64
			for i, m := range msgs {
				r, ok := rows[m.OrderID]
				got := r.status
				if r.status == "failed" {
					got = r.reason
				}
				if !ok || got != wantFinal[i] || r.qty != m.Quantity {
					t.Errorf("order %d row %+v (found %v), want %s", i, r, ok, wantFinal[i])
				}
				if r.status == "confirmed" {
					confirmed += r.qty
				}
			}
			if !tc.noSale {
				stock, sold := stockSold(t, db, act)
				if stock != tc.wantStock || sold != tc.stock-tc.wantStock || sold != confirmed {
					t.Errorf("stock %d sold %d (confirmed %d), want stock %d sold %d", stock, sold, confirmed, tc.wantStock, tc.stock-tc.wantStock)
				}
			}
			if got := purchases(t, db, act); fmt.Sprint(got) != fmt.Sprint(tc.wantBuyers) {
				t.Errorf("purchases %v, want %v", got, tc.wantBuyers)
			}
		})
	}
}

// TestWriteConcurrent runs overlapping batches of one sale from many
// goroutines, as a fleet does: MySQL's guards alone keep I1 and I2 and decide
// every order exactly once.
func TestWriteConcurrent(t *testing.T) {
	t.Parallel()
	const (
		act        = 9
		stock      = 60
		limit      = 2
		writers    = 6
		batches    = 5
		batchSize  = 20
		population = 40
	)
	db := openDB(t)
	s := newStore(t, db)
	createSale(t, db, act, stock, limit)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		all = map[string]store.Outcome{}
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				in := make([]store.Order, batchSize)
				for i := range in {
					u := fmt.Sprintf("user%02d", (w*7+b*3+i)%population)
					in[i] = store.Order{Order: order(act, u, int64(1+i%2)), Claim: reservation.Claimed}
				}
				out, err := s.Write(context.Background(), act, in)
				if err != nil {
					t.Errorf("writer %d batch %d: %v", w, b, err)
					return
				}
				mu.Lock()
				for _, o := range out {
					all[o.OrderID] = o
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	rows := orderRows(t, db)
	if len(rows) != writers*batches*batchSize || len(all) != len(rows) {
		t.Fatalf("%d rows, %d outcomes, want %d", len(rows), len(all), writers*batches*batchSize)
	}
	var confirmed int64
	perUser := map[string]int64{}
	for id, o := range all {
		r := rows[id]
		if (r.status == "confirmed") != o.Confirmed || (!o.Confirmed && r.reason != o.Reason) {
			t.Errorf("order %s: row %+v, outcome %+v", id, r, o)
		}
		if o.Confirmed {
			confirmed += o.Quantity
			perUser[o.UserID] += o.Quantity
		} else if o.Reason != store.ReasonSoldOut && o.Reason != store.ReasonLimitExceeded {
			t.Errorf("order %s failed with %q", id, o.Reason)
		}
	}
	left, sold := stockSold(t, db, act)
	if confirmed != sold || left+sold != stock || left < 0 {
		t.Errorf("confirmed %d, sold %d, stock left %d of %d", confirmed, sold, left, stock)
	}
	// 40 users × limit 2 = 80 > 60 units, and every user has at least two
	// orders of one unit (checked by hand for this layout): it must sell out.
	if left != 0 {
		t.Errorf("stock left %d, want the sale sold out", left)
	}
	bought := purchases(t, db, act)
	for u, q := range perUser {
		if q > limit || bought[u] != q {
			t.Errorf("user %s: confirmed %d, purchases %d, limit %d", u, q, bought[u], limit)
		}
	}
	if len(bought) != len(perUser) {
		t.Errorf("purchases has %d users, confirmed orders %d", len(bought), len(perUser))
	}
}

// TestWriteArchivedSale: once a sale is archived, an order whose Redis record
// is gone can only have been released (every other order was in MySQL before
// the archive), so it fails as released and takes no stock; a redelivery of
// a stored order still reports what MySQL holds.
func TestWriteArchivedSale(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	st := newStore(t, db)
	createSale(t, db, 9, 5, 2)
	stored := order(9, "alice", 1)
	out, err := st.Write(context.Background(), 9, []store.Order{{Order: stored, Claim: reservation.Claimed}})
	servicetest.Must(t, err, "write")
	if !out[0].Confirmed {
		t.Fatalf("alice: %+v", out[0])
	}
	_, err = db.Exec(`UPDATE activities SET archived_at = UTC_TIMESTAMP(3) WHERE id = 9`)
	servicetest.Must(t, err, "archive")
	late := order(9, "bob", 1)
	out, err = st.Write(context.Background(), 9, []store.Order{{Order: late, Claim: reservation.Unknown}, {Order: stored, Claim: reservation.Unknown}})
	servicetest.Must(t, err, "write after archive")
	if out[0].Confirmed || out[0].Reason != store.ReasonReleased || !out[1].Confirmed {
		t.Errorf("after the archive: %+v", out)
	}
	if stock, sold := stockSold(t, db, 9); stock != 4 || sold != 1 {
		t.Errorf("stock %d sold %d, want 4 and 1", stock, sold)
	}
}

// TestWriteDuplicateKey: MySQL holds one order per (sale, user, key)
// (index orders_user_key). A second order of a key — Redis forgot the key,
// or two arrive in one batch — fails as duplicate_key without taking stock,
// and is stored without the key; so is a released order, whose key was
// given back with its 503. Nothing loops on the duplicate.
func TestWriteDuplicateKey(t *testing.T) {
	t.Parallel()
	const act = 11
	db := openDB(t)
	s := newStore(t, db)
	createSale(t, db, act, 10, 3)
	keyed := func(user, key string, claim reservation.State) store.Order {
		o := order(act, user, 1)
		o.IdempotencyKey = key
		return store.Order{Order: o, Claim: claim}
	}
	ctx := context.Background()
	first := keyed("ann", "k1", reservation.Claimed)
	out, err := s.Write(ctx, act, []store.Order{first})
	servicetest.Must(t, err, "first")
	if !out[0].Confirmed {
		t.Fatalf("first order: %+v", out[0])
	}
	batch := []store.Order{
		keyed("ann", "k1", reservation.Claimed), // Redis lost the key: a second order
		keyed("ann", "k1", reservation.Failed),  // released: its key was given back
		keyed("ben", "k1", reservation.Claimed), // another user's key of the same name
		keyed("ben", "k1", reservation.Unknown), // the same key twice in one batch
		keyed("ann", "k2", reservation.Claimed),
	}
	want := []string{"duplicate_key", "released", "confirmed", "duplicate_key", "confirmed"}
	out, err = s.Write(ctx, act, batch)
	servicetest.Must(t, err, "batch")
	for i, o := range out {
		got := "confirmed"
		if !o.Confirmed {
			got = o.Reason
		}
		if got != want[i] || o.Redelivered {
			t.Errorf("order %d: %+v, want %s", i, o, want[i])
		}
	}
	keys := map[string]string{}
	rows, err := db.Query("SELECT order_id, COALESCE(idempotency_key, '-') FROM orders")
	servicetest.Must(t, err, "keys")
	for rows.Next() {
		var id, k string
		servicetest.Must(t, rows.Scan(&id, &k), "scan")
		keys[id] = k
	}
	_ = rows.Close()
	wantKeys := []string{"k1", "-", "-", "k1", "-", "k2"}
	for i, o := range append([]store.Order{first}, batch...) {
		if keys[o.OrderID] != wantKeys[i] {
			t.Errorf("order %d stored with key %q, want %q", i, keys[o.OrderID], wantKeys[i])
		}
	}
	if stock, sold := stockSold(t, db, act); stock != 7 || sold != 3 {
		t.Errorf("stock %d sold %d, want 7 and 3", stock, sold)
	}
	// A redelivery of the duplicate reports its stored outcome.
	out, err = s.Write(ctx, act, batch[:1])
	servicetest.Must(t, err, "redelivery")
	if !out[0].Redelivered || out[0].Reason != "duplicate_key" {
		t.Errorf("redelivered duplicate: %+v", out[0])
	}
}
