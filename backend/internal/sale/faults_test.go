package sale_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"maps"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/backend/internal/sale"
	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/brokertest"
	"github.com/seckill/seckill/internal/faultnet"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/schema"
	"github.com/seckill/seckill/internal/servicetest"
	"github.com/seckill/seckill/lua"
)

// rig is a Service whose Redis is reached through a fault proxy; direct is
// the same Redis without faults, for setting up and looking.
type rig struct {
	svc    *sale.Service
	fp     *faultnet.Proxy
	direct *reservation.Store
	rdb    *redis.Client
	db     *sql.DB
	topo   broker.Topology
	// publish, when set, runs instead of the real publish.
	publish atomic.Pointer[func(ctx context.Context, o ordermsg.Order) error]
	// publishBatch, when set, runs instead of the real batch publish.
	publishBatch atomic.Pointer[func(ctx context.Context, orders []ordermsg.Order) error]
	real         *broker.Publisher
}

func (r *rig) PublishBatch(ctx context.Context, orders []ordermsg.Order) error {
	if f := r.publishBatch.Load(); f != nil {
		return (*f)(ctx, orders)
	}
	return r.real.PublishBatch(ctx, orders)
}

func (r *rig) Publish(ctx context.Context, o ordermsg.Order) error {
	if f := r.publish.Load(); f != nil {
		return (*f)(ctx, o)
	}
	return r.real.Publish(ctx, o)
}

func (r *rig) PublishMarker(ctx context.Context, m ordermsg.Marker) error {
	return r.real.PublishMarker(ctx, m)
}

const act = 5

func newRig(t *testing.T) *rig { t.Helper(); return newRigWith(t, nil) }

// newRigWith is newRig with the service's configuration changed by tune.
func newRigWith(t *testing.T, tune func(*sale.Config)) *rig {
	t.Helper()
	rdb, prefix := servicetest.RedisNode(t)
	ctx := context.Background()
	servicetest.Must(t, lua.Preload(ctx, rdb), "preload")
	fp, err := faultnet.Listen("127.0.0.1:0", rdb.Options().Addr)
	servicetest.Must(t, err, "fault proxy")
	t.Cleanup(func() { _ = fp.Close() })
	rc := conf.Default().Redis
	rc.URL = "redis://" + fp.Addr() + "/" + itoa(rdb.Options().DB)
	via := rc.NewClient()
	t.Cleanup(func() { _ = via.Close() })

	cfg := conf.Default()
	cfg.MySQL.DSN = servicetest.MySQLDSN(t)
	cfg.RabbitMQ.URL = servicetest.AMQPURL()
	cfg.RabbitMQ.Prefix = brokertest.Prefix(t)
	db, err := schema.Open(ctx, cfg.MySQL)
	servicetest.Must(t, err, "schema")
	t.Cleanup(func() { _ = db.Close() })
	log := slog.New(slog.DiscardHandler)
	real, err := broker.NewPublisher(ctx, broker.PublisherConfigFrom(cfg.RabbitMQ, "sale-faults"), log, nil)
	servicetest.Must(t, err, "publisher")
	t.Cleanup(func() { _ = real.Close() })
	r := &rig{fp: fp, direct: reservation.New(rdb, prefix), rdb: rdb, db: db, topo: broker.TopologyFor(cfg.RabbitMQ), real: real}
	scfg := sale.Config{
		ReservationTTL: 30 * time.Second, RedisTimeout: time.Second, PublishTimeout: 2 * time.Second,
		QueryTimeout: 5 * time.Second, SoldOutTTL: time.Second, RecoveryMax: time.Hour,
		GroupMax: conf.Default().Backend.GroupMax, GroupLinger: conf.Default().Backend.GroupLinger.Duration,
	}
	if tune != nil {
		tune(&scfg)
	}
	r.svc = sale.New(reservation.New(via, prefix), db, r, scfg, log, nil)
	t.Cleanup(r.svc.Close)
	_, _, err = r.svc.PutActivity(ctx, act, sale.Spec{Stock: 10, PerUserLimit: 2,
		StartsAt: time.Now().Add(-time.Hour), EndsAt: time.Now().Add(time.Hour)})
	servicetest.Must(t, err, "create sale")
	return r
}

func itoa(n int) string { return strconv.Itoa(n) }

func (r *rig) purchase(user, key string) (sale.PurchaseResult, error) {
	return r.svc.Purchase(context.Background(), sale.PurchaseRequest{ActivityID: act, UserID: user, IdempotencyKey: key, Quantity: 1})
}

// records returns the user's records in Redis.
func (r *rig) records(t *testing.T, user string) []reservation.Record {
	t.Helper()
	all := map[string]string{}
	n, err := r.direct.Buckets(context.Background(), act)
	servicetest.Must(t, err, "buckets")
	for _, h := range r.direct.Keys(act).Hashes(reservation.OrderBuckets, n) {
		m, err := r.rdb.HGetAll(context.Background(), h).Result()
		servicetest.Must(t, err, "orders")
		maps.Copy(all, m)
	}
	var out []reservation.Record
	for id, raw := range all {
		rec, err := reservation.ParseRecord(id, raw)
		servicetest.Must(t, err, "parse")
		if rec.UserID == user {
			out = append(out, rec)
		}
	}
	return out
}

func (r *rig) sale(t *testing.T) reservation.Sale {
	t.Helper()
	s, _, err := r.direct.Sale(context.Background(), act)
	servicetest.Must(t, err, "sale")
	return s
}

// eventually polls cond (a condition, not a sleep) for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *rig) queued(t *testing.T) []string {
	t.Helper()
	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	var ids []string
	for {
		d, ok, err := ch.Get(r.topo.Queue, true)
		servicetest.Must(t, err, "get")
		if !ok {
			return ids
		}
		ids = append(ids, d.MessageId)
	}
}

func mustUnavailable(t *testing.T, res sale.PurchaseResult, err error) {
	t.Helper()
	if !errors.Is(err, sale.ErrUnavailable) {
		t.Fatalf("purchase = %+v, %v; want 503 (ErrUnavailable)", res, err)
	}
}

// Item 1: the reserve is delayed on the network past its timeout; the undo
// overtakes it and leaves a tombstone; the late reserve then runs and is
// refused. The 503 keeps nothing: no unit pending, the key free.
func TestUndoOvertakesDelayedReserve(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	release := make(chan struct{})
	held := r.fp.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains("slow-user"), Hold: release})
	res, err := r.purchase("slow-user", "k1")
	mustUnavailable(t, res, err)
	<-held
	// The undo (on another connection) has left its tombstone.
	eventually(t, "the tombstone", func() bool {
		recs := r.records(t, "slow-user")
		return len(recs) == 1 && recs[0].State == reservation.Failed && recs[0].Quantity == 0
	})
	// The late reserve's reply ("undone") proves Redis ran it after the undo.
	refused := r.fp.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains("undone"), Delay: time.Nanosecond})
	close(release) // the late reserve reaches Redis now
	select {
	case <-refused:
	case <-time.After(10 * time.Second):
		t.Fatal("the late reserve never ran")
	}
	if s := r.sale(t); s.Pending != 0 || len(r.records(t, "slow-user")) != 1 {
		t.Fatalf("after the late reserve: %+v, records %+v; want nothing pending, only the tombstone", s, r.records(t, "slow-user"))
	}
	// The key is free: the client's retry buys.
	res, err = r.purchase("slow-user", "k1")
	if err != nil || res.Outcome != sale.Accepted || res.Replay {
		t.Fatalf("retry = %+v %v, want a fresh 202", res, err)
	}
}

// The reserve ran and its reply was lost (EOF, not a timeout): the backend
// runs the same call once more on a fresh connection; it finds its own
// record (the order id was chosen before) and the purchase is accepted with
// one reservation.
func TestLostReplyRetriedOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	fired := r.fp.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains("$2\r\nok\r\n"), Cut: true})
	res, err := r.purchase("eof-once", "k1")
	if err != nil || res.Outcome != sale.Accepted {
		t.Fatalf("purchase = %+v %v, want 202", res, err)
	}
	<-fired
	if recs := r.records(t, "eof-once"); len(recs) != 1 || recs[0].OrderID != res.OrderID {
		t.Fatalf("records %+v, want the one order %s", recs, res.OrderID)
	}
	if s := r.sale(t); s.Pending != 1 {
		t.Fatalf("sale %+v, want 1 pending", s)
	}
}

// Item 1: the reserve ran and both replies were lost. The error is treated
// as "may have run": the undo releases the reservation.
func TestLostReplyIsUndone(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	// The reply of reserve.lua starts with "*3\r\n$2\r\nok".
	r.fp.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains("$2\r\nok\r\n"), Cut: true})
	fired := r.fp.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains("$2\r\nok\r\n"), Cut: true})
	res, err := r.purchase("eof-user", "k1")
	mustUnavailable(t, res, err)
	<-fired
	eventually(t, "the undo", func() bool {
		recs := r.records(t, "eof-user")
		return len(recs) == 1 && recs[0].State == reservation.Failed && recs[0].Reason == "reserve_failed"
	})
	if s := r.sale(t); s.Pending != 0 || s.Sold != 0 {
		t.Fatalf("sale %+v, want nothing kept", s)
	}
	if q := r.queued(t); len(q) != 0 {
		t.Fatalf("messages %v published for a 503", q)
	}
	if res, err := r.purchase("eof-user", "k1"); err != nil || res.Outcome != sale.Accepted || res.Replay {
		t.Fatalf("retry with the key = %+v %v, want a fresh 202", res, err)
	}
}

// Item 1: the undo cannot reach Redis at first; it is retried in the
// background until it gets an answer.
func TestUndoRetriedUntilDefinite(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.fp.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains("$2\r\nok\r\n"), Cut: true})
	fired := r.fp.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains("$2\r\nok\r\n"), Cut: true})
	// The first undos are cut too.
	r.fp.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains("reserve_failed"), Cut: true})
	r.fp.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains("reserve_failed"), Cut: true})
	cut3 := r.fp.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains("reserve_failed"), Cut: true})
	res, err := r.purchase("stubborn", "")
	mustUnavailable(t, res, err)
	<-fired
	<-cut3
	eventually(t, "the fourth undo", func() bool {
		recs := r.records(t, "stubborn")
		return len(recs) == 1 && recs[0].State == reservation.Failed
	})
	if s := r.sale(t); s.Pending != 0 {
		t.Fatalf("sale %+v, want nothing pending", s)
	}
}

// Item 2: a resend of reserve.lua after a lost reply (what go-redis's
// default MaxRetries did, and what its cluster client does inside its
// redirect loop) finds its own record, since the order id is chosen before
// the call: one reservation, answered ok (with a key: not "replay", which made
// the backend answer 202 without a publish). The scripts now tell go-redis
// never to resend them (package lua), so even a client built with retries
// returns the lost reply; the test then resends the same call itself.
func TestClientRetryOfReserveReservesOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	retrying := redis.NewClient(&redis.Options{Addr: r.fp.Addr(), DB: r.rdb.Options().DB, MaxRetries: 3})
	defer retrying.Close()
	st := reservation.New(retrying, r.direct.Prefix())
	for i, key := range []string{"", "k"} {
		user := "retry" + itoa(i)
		fired := r.fp.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains("$2\r\nok\r\n"), Cut: true})
		req := reservation.Request{ActivityID: act, UserID: user, IdempotencyKey: key,
			Quantity: 1, OrderID: ordermsg.NewOrderID(act), TTL: time.Minute}
		if _, err := st.Reserve(context.Background(), req); err == nil {
			t.Fatalf("key %q: the reply was cut, yet go-redis answered: it resent the script", key)
		}
		<-fired
		res, err := st.Reserve(context.Background(), req)
		servicetest.Must(t, err, "reserve resent")
		if res.Outcome != reservation.Reserved {
			t.Errorf("key %q: resent reserve = %+v, want ok", key, res)
		}
		if recs := r.records(t, user); len(recs) != 1 {
			t.Errorf("key %q: %d reservations for one request", key, len(recs))
		}
	}
	if s := r.sale(t); s.Pending != 2 {
		t.Errorf("pending %d, want 2", s.Pending)
	}
	// The service's own client never retries (conf sets MaxRetries -1,
	// which go-redis normalises to 0 retries; left unset it would be 3).
	own := conf.Default().Redis.NewClient().(*redis.Client)
	defer own.Close()
	if o := own.Options(); o.MaxRetries != 0 {
		t.Errorf("conf Redis client MaxRetries = %d, want 0 (none)", o.MaxRetries)
	}
}

// A keyed retry finds a reservation whose message the broker never
// confirmed (its backend died after the reserve): it publishes it, so its 202
// is backed by a queued message, and marks it queued.
func TestReplayOfUnconfirmedOrderPublishesIt(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	orphan, err := r.direct.Reserve(context.Background(), reservation.Request{ActivityID: act, UserID: "orphan",
		IdempotencyKey: "k", Quantity: 1, OrderID: ordermsg.NewOrderID(act), TTL: time.Minute})
	servicetest.Must(t, err, "reserve")
	res, err := r.purchase("orphan", "k")
	if err != nil || res.Outcome != sale.Accepted || !res.Replay || res.OrderID != orphan.OrderID {
		t.Fatalf("replay = %+v %v", res, err)
	}
	if q := r.queued(t); len(q) != 1 || q[0] != orphan.OrderID {
		t.Fatalf("queued %v, want the orphan's message", q)
	}
	rec, _, err := r.direct.Order(context.Background(), act, orphan.OrderID)
	servicetest.Must(t, err, "order")
	if !rec.Queued {
		t.Errorf("record %+v not marked queued", rec)
	}
	// Once queued, a replay answers without publishing again.
	if res, err := r.purchase("orphan", "k"); err != nil || !res.Replay {
		t.Fatalf("second replay = %+v %v", res, err)
	}
	if q := r.queued(t); len(q) != 0 {
		t.Fatalf("queued %v again", q)
	}
}

// The publish fails and the undo cannot reach Redis either: MySQL
// arbitrates. The backend inserts the order as failed first, so no worker can
// ever confirm it (its insert finds the row): 503.
func TestPublishAndUndoFailMySQLDecides(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var oid atomic.Value
	fail := func(ctx context.Context, o ordermsg.Order) error {
		oid.Store(o.OrderID)
		// Redis goes away with the broker.
		r.fp.Set(faultnet.Faults{Up: faultnet.Flow{CutRate: 1}})
		r.fp.CutAll()
		return broker.ErrConfirmTimeout
	}
	r.publish.Store(&fail)
	res, err := r.purchase("doomed", "k")
	mustUnavailable(t, res, err)
	r.fp.Set(faultnet.Faults{})
	var status, reason string
	servicetest.Must(t, r.db.QueryRow(`SELECT status, reason FROM orders WHERE order_id = ?`, oid.Load()).Scan(&status, &reason), "row")
	if status != "failed" || reason != "publish_failed" {
		t.Fatalf("MySQL row %s/%s, want failed/publish_failed", status, reason)
	}
	// Once Redis answers again the background undo gives the unit back (the
	// refusal in MySQL already decided the order; nothing can confirm it).
	eventually(t, "the background undo", func() bool {
		rec, found, err := r.direct.Order(context.Background(), act, oid.Load().(string))
		return err == nil && found && rec.State == reservation.Failed && rec.Reason == "publish_failed"
	})
	if s := r.sale(t); s.Pending != 0 {
		t.Errorf("pending = %d after the undo, want 0", s.Pending)
	}
}

// Items 3 and 4: Redis loses the sale while a keyed order is still in the
// queue. The rebuild restores what MySQL decided and marks the sale
// recovering: a retry of the queued order's key gets 503 (never a second
// order id), a decided key gets its order back, nothing new is reserved
// (the queued order's unit is not counted in Redis); once the worker wrote
// the queued order, its key gets that order.
func TestRedisLossKeepsKeyedRetriesOnOneOrder(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	queued, err := r.purchase("lossy", "k")
	if err != nil || queued.Outcome != sale.Accepted {
		t.Fatalf("first purchase: %+v %v", queued, err)
	}
	decided, err := r.purchase("done", "k")
	servicetest.Must(t, err, "second purchase")
	// A worker wrote the second order; the first is still in the queue.
	_, err = r.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status, idempotency_key) VALUES (?, ?, 'done', 1, 'confirmed', 'k')`, decided.OrderID, act)
	servicetest.Must(t, err, "insert")
	_, err = r.db.Exec(`UPDATE activities SET stock = stock - 1, sold = sold + 1 WHERE id = ?`, act)
	servicetest.Must(t, err, "sell")
	_, err = r.db.Exec(`INSERT INTO purchases (activity_id, user_id, quantity) VALUES (?, 'done', 1)`, act)
	servicetest.Must(t, err, "purchases")

	keys, err := r.direct.SaleKeys(ctx, act)
	servicetest.Must(t, err, "sale keys")
	servicetest.Must(t, r.rdb.Del(ctx, keys...).Err(), "lose the sale")

	res, err := r.purchase("lossy", "k")
	mustUnavailable(t, res, err)
	if ttl, _ := r.rdb.PTTL(ctx, r.direct.Keys(act).Recovering).Result(); ttl <= 0 || ttl > time.Hour {
		t.Errorf("recovering mark TTL %v", ttl)
	}
	if s := r.sale(t); s.Pending != 0 || s.Sold != 1 {
		t.Errorf("rebuilt sale %+v: the unknown key reserved something", s)
	}
	res, err = r.purchase("done", "k")
	if err != nil || !res.Replay || res.OrderID != decided.OrderID || res.Status != "confirmed" {
		t.Errorf("decided key after the loss: %+v %v", res, err)
	}
	res, err = r.purchase("fresh", "")
	mustUnavailable(t, res, err)
	// The worker writes the queued order: its key now finds it in MySQL.
	_, err = r.db.Exec(`INSERT INTO orders (order_id, activity_id, user_id, quantity, status, idempotency_key) VALUES (?, ?, 'lossy', 1, 'confirmed', 'k')`, queued.OrderID, act)
	servicetest.Must(t, err, "insert")
	res, err = r.purchase("lossy", "k")
	if err != nil || !res.Replay || res.OrderID != queued.OrderID {
		t.Errorf("queued key once written: %+v %v, want order %s", res, err, queued.OrderID)
	}
	if res, err := r.purchase("lossy", "k"); err != nil || res.OrderID != queued.OrderID {
		t.Errorf("queued key again (now restored in Redis): %+v %v", res, err)
	}
}

// A replay whose publish of the adopted order fails never undoes it in
// Redis (another request may have answered 202 for it, and its key must keep
// naming it): MySQL records it failed first, and the answer is 503.
func TestAdoptedPublishFailureKeepsTheKey(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	orphan, err := r.direct.Reserve(ctx, reservation.Request{ActivityID: act, UserID: "adopter",
		IdempotencyKey: "k", Quantity: 1, OrderID: ordermsg.NewOrderID(act), TTL: time.Minute})
	servicetest.Must(t, err, "reserve")
	fail := func(context.Context, ordermsg.Order) error { return broker.ErrConfirmTimeout }
	r.publish.Store(&fail)
	res, err := r.purchase("adopter", "k")
	mustUnavailable(t, res, err)
	var status, reason string
	servicetest.Must(t, r.db.QueryRow(`SELECT status, reason FROM orders WHERE order_id = ?`, orphan.OrderID).Scan(&status, &reason), "row")
	if status != "failed" || reason != "publish_failed" {
		t.Errorf("MySQL row %s/%s, want failed/publish_failed", status, reason)
	}
	if u, _ := r.direct.User(ctx, act, "adopter"); u.Keys["k"] != orphan.OrderID {
		got := u.Keys["k"]
		t.Errorf("key now names %q, want %s", got, orphan.OrderID)
	}
	r.publish.Store(nil)
	if res, err := r.purchase("adopter", "k"); err != nil || res.OrderID != orphan.OrderID {
		t.Errorf("next retry = %+v %v, want the same order", res, err)
	}
}
