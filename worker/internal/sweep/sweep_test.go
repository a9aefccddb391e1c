package sweep

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/lua"
)

type rig struct {
	rdb   *redis.Client
	store *reservation.Store
	db    *sql.DB
	pub   *broker.Publisher
	top   broker.Topology
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ctx := context.Background()
	rdb, prefix := servicetest.Redis(t)
	servicetest.Must(t, lua.Preload(ctx, rdb), "preload")
	mc := conf.Default().MySQL
	mc.DSN = servicetest.MySQLDSN(t)
	db, err := schema.Open(ctx, mc)
	servicetest.Must(t, err, "open mysql")
	t.Cleanup(func() { _ = db.Close() })
	rc := conf.Default().RabbitMQ
	rc.URL = servicetest.AMQPURL()
	rc.Prefix = servicetest.AMQPPrefix(t, []string{".orders", ".orders.dead"}, []string{".orders", ".orders.dlx"})
	pub, err := broker.NewPublisher(ctx, broker.PublisherConfigFrom(rc, "sweep-test"), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	servicetest.Must(t, err, "publisher")
	t.Cleanup(func() { _ = pub.Close() })
	return &rig{rdb: rdb, store: reservation.New(rdb, prefix), db: db, pub: pub, top: broker.TopologyFor(rc)}
}

func (r *rig) sweeper(republishAfter time.Duration) *Sweeper {
	return New(Config{Interval: 50 * time.Millisecond, RepublishAfter: republishAfter, QueryTimeout: 5 * time.Second, Instance: "t"},
		r.rdb, r.store, r.db, r.pub, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func (r *rig) reserve(t *testing.T, act int64, user string, qty int64) string {
	t.Helper()
	return r.reserveKey(t, act, user, "", qty)
}

func (r *rig) reserveKey(t *testing.T, act int64, user, key string, qty int64) string {
	t.Helper()
	res, err := r.store.Reserve(context.Background(), reservation.Request{
		ActivityID: act, UserID: user, IdempotencyKey: key, Quantity: qty, OrderID: ordermsg.NewOrderID(act), TTL: time.Millisecond,
	})
	servicetest.Must(t, err, "reserve")
	if res.Outcome != reservation.Reserved {
		t.Fatalf("reserve: %v", res.Outcome)
	}
	return res.OrderID
}

func (r *rig) queued(t *testing.T) []amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(r.top.Queue, true)
		servicetest.Must(t, err, "get")
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func TestSweepResolvesOverdueReservations(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	const act = 7
	now := time.Now()
	_, err := r.db.Exec(`INSERT INTO activities (id, total_stock, stock, sold, per_user_limit, starts_at, ends_at)
		VALUES (?, 10, 9, 1, 5, ?, ?)`, act, now.Add(-time.Hour), now.Add(time.Hour))
	servicetest.Must(t, err, "insert activity")
	out, _, err := r.store.Warm(ctx, act, reservation.WarmArgs{Total: 10, Limit: 5, Start: now.Add(-time.Hour), End: now.Add(time.Hour), Users: map[string]int64{}})
	servicetest.Must(t, err, "warm")
	if out != reservation.WarmCreated {
		t.Fatalf("warm: %v", out)
	}
	committed := r.reserve(t, act, "alice", 1)        // the worker committed, then died before settling
	lost := r.reserveKey(t, act, "bob", "bob-key", 2) // the backend died before its publish
	claimed := r.reserve(t, act, "carol", 1)          // a worker claimed it, then died before its commit
	_, err = r.store.Claim(ctx, act, []string{claimed})
	servicetest.Must(t, err, "claim")
	_, err = r.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES (?, ?, 'alice', 1, 'confirmed')`, committed, act)
	servicetest.Must(t, err, "insert order")
	time.Sleep(5 * time.Millisecond) // past the 1 ms deadlines

	// Within the re-publish window: settle what MySQL has, re-publish the rest.
	st, err := r.sweeper(time.Hour).Sweep(ctx)
	servicetest.Must(t, err, "sweep 1")
	if st != (Stats{Settled: 1, Republished: 2}) {
		t.Fatalf("sweep 1 stats = %+v", st)
	}
	rec, _, _ := r.store.Order(ctx, act, committed)
	if rec.State != reservation.Confirmed {
		t.Errorf("committed order state %v, want confirmed", rec.State)
	}
	msgs := r.queued(t)
	got := map[string]bool{}
	for _, m := range msgs {
		o, err := ordermsg.Decode(m.Body)
		servicetest.Must(t, err, "decode republished")
		if o.OrderID != m.MessageId {
			t.Errorf("message id %q carries order %q", m.MessageId, o.OrderID)
		}
		got[o.OrderID] = true
		if o.OrderID == lost && o.IdempotencyKey != "bob-key" {
			t.Errorf("re-published order %s carries key %q, want bob-key", lost, o.IdempotencyKey)
		}
	}
	if len(msgs) != 2 || !got[lost] || !got[claimed] {
		t.Fatalf("republished %v, want %s and %s", got, lost, claimed)
	}
	// Postponed: an immediate second sweep does not publish again.
	st, err = r.sweeper(time.Hour).Sweep(ctx)
	servicetest.Must(t, err, "sweep 2")
	if st != (Stats{}) {
		t.Errorf("sweep 2 stats = %+v, want nothing done", st)
	}

	// Past the re-publish window: MySQL records both as failed and Redis gives
	// their units back.
	for _, oid := range []string{lost, claimed} {
		r.rdb.ZAdd(ctx, r.store.Keys(act).Deadlines, redis.Z{Score: 0, Member: oid})
	}
	st, err = r.sweeper(time.Millisecond).Sweep(ctx)
	servicetest.Must(t, err, "sweep 3")
	if st != (Stats{Expired: 2}) {
		t.Fatalf("sweep 3 stats = %+v", st)
	}
	for _, oid := range []string{lost, claimed} {
		var status, reason string
		servicetest.Must(t, r.db.QueryRow(`SELECT status, reason FROM orders WHERE order_id = ?`, oid).Scan(&status, &reason), "read %s", oid)
		if status != "failed" || reason != "expired" {
			t.Errorf("order %s: %s/%s, want failed/expired", oid, status, reason)
		}
		rec, _, _ := r.store.Order(ctx, act, oid)
		if rec.State != reservation.Failed || rec.Reason != "expired" {
			t.Errorf("order %s in Redis: %+v", oid, rec)
		}
	}
	sale, _, err := r.store.Sale(ctx, act)
	servicetest.Must(t, err, "sale")
	if sale.Pending != 0 || sale.Sold != 1 {
		t.Errorf("sale after sweeps: %+v, want pending 0 sold 1", sale)
	}
	if n, _ := r.rdb.ZCard(ctx, r.store.Keys(act).Deadlines).Result(); n != 0 {
		t.Errorf("%d orders still indexed", n)
	}
	if held, _ := r.rdb.HGet(ctx, r.store.Keys(act).Users, "bob").Result(); held != "" {
		t.Errorf("bob still holds %q units", held)
	}
}

func TestSweepDefersToACommitThatWon(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	const act = 8
	now := time.Now()
	_, _, err := r.store.Warm(ctx, act, reservation.WarmArgs{Total: 5, Limit: 1, Start: now.Add(-time.Hour), End: now.Add(time.Hour), Users: map[string]int64{}})
	servicetest.Must(t, err, "warm")
	oid := r.reserve(t, act, "dave", 1)
	time.Sleep(5 * time.Millisecond)
	// The worker's commit lands between the sweeper's look-up and its insert:
	// INSERT IGNORE keeps the worker's row, and Redis follows it.
	_, err = r.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status) VALUES (?, ?, 'dave', 1, 'confirmed')`, oid, act)
	servicetest.Must(t, err, "insert")
	s := r.sweeper(time.Millisecond)
	var st Stats
	servicetest.Must(t, s.resolveExpired(ctx, act, oid, &st), "expire")
	rec, _, _ := r.store.Order(ctx, act, oid)
	if rec.State != reservation.Confirmed {
		t.Errorf("state %v, want confirmed (MySQL's row wins)", rec.State)
	}
}

func TestLeaseIsHeldByOne(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	a, b := r.sweeper(time.Hour), r.sweeper(time.Hour)
	a.cfg.Instance, b.cfg.Instance = "a", "b"
	okA, err := a.acquire(ctx)
	servicetest.Must(t, err, "acquire a")
	okB, err := b.acquire(ctx)
	servicetest.Must(t, err, "acquire b")
	if !okA || okB {
		t.Fatalf("a=%v b=%v, want only a", okA, okB)
	}
	if ok, _ := a.acquire(ctx); !ok {
		t.Error("a lost its own lease on renewal")
	}
	a.releaseLease()
	if ok, _ := b.acquire(ctx); !ok {
		t.Error("b could not take the released lease")
	}
	if b.lease.Token() <= 1 {
		t.Errorf("fencing token %d did not grow", b.lease.Token())
	}
}
