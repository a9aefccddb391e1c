package sale_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/backend/internal/sale"
	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/faultnet"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/internal/servicetest"
)

// groupRig is a rig whose groups go as the test forms them (a linger far
// beyond the test) and whose group's orders are published as one message.
func groupRig(t *testing.T) *rig {
	t.Helper()
	return newRigWith(t, func(c *sale.Config) {
		c.GroupMax, c.GroupLinger, c.GroupBatch = 64, 5*time.Second, true
	})
}

type answer struct {
	res sale.PurchaseResult
	err error
}

// burst runs reqs as one group: a pilot purchase (a quantity the sale's
// limit refuses; keyed, so no local flag answers it) is held on its way to
// Redis until every request of reqs waits behind it, then released: reqs
// go in the next call, one group. Answers are in the order of reqs.
func (r *rig) burst(t *testing.T, pilot string, reqs []sale.PurchaseRequest) []answer {
	t.Helper()
	release := make(chan struct{})
	held := r.fp.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains(pilot), Hold: release})
	var wg sync.WaitGroup
	wg.Go(func() {
		res, err := r.svc.Purchase(context.Background(), sale.PurchaseRequest{ActivityID: act, UserID: pilot,
			IdempotencyKey: "pilot", Quantity: 99})
		if err != nil || res.Outcome != sale.BadQuantity {
			t.Errorf("pilot = %+v %v, want bad_quantity", res, err)
		}
	})
	<-held
	out := make([]answer, len(reqs))
	for i, q := range reqs {
		wg.Go(func() {
			out[i].res, out[i].err = r.svc.Purchase(context.Background(), q)
		})
	}
	eventually(t, "the group queued", func() bool { return sale.GroupQueued(r.svc, act) == len(reqs) })
	close(release)
	wg.Wait()
	return out
}

// batches records the group messages published (and publishes them, or
// fails them with fail's answer).
type batches struct {
	mu   sync.Mutex
	sent [][]ordermsg.Order
}

func (b *batches) hook(r *rig, fail func([]ordermsg.Order) error) {
	f := func(ctx context.Context, orders []ordermsg.Order) error {
		b.mu.Lock()
		b.sent = append(b.sent, orders)
		b.mu.Unlock()
		if fail != nil {
			if err := fail(orders); err != nil {
				return err
			}
		}
		return r.real.PublishBatch(ctx, orders)
	}
	r.publishBatch.Store(&f)
}

func (b *batches) all() [][]ordermsg.Order {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([][]ordermsg.Order(nil), b.sent...)
}

func req(user, key string) sale.PurchaseRequest {
	return sale.PurchaseRequest{ActivityID: act, UserID: user, IdempotencyKey: key, Quantity: 1}
}

// bodies takes every message of the rig's queue: the order ids each carries.
func (r *rig) bodies(t *testing.T) [][]string {
	t.Helper()
	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	var out [][]string
	for {
		d, ok, err := ch.Get(r.topo.Queue, true)
		servicetest.Must(t, err, "get")
		if !ok {
			return out
		}
		var b struct {
			V       int              `json:"v"`
			OrderID string           `json:"order_id"`
			Orders  []ordermsg.Order `json:"orders"`
		}
		servicetest.Must(t, json.Unmarshal(d.Body, &b), "body %s", d.Body)
		var ids []string
		switch b.V {
		case ordermsg.Version:
			ids = []string{b.OrderID}
		case ordermsg.BatchVersion:
			for _, o := range b.Orders {
				ids = append(ids, o.OrderID)
			}
		default:
			t.Fatalf("message of version %d: %s", b.V, d.Body)
		}
		sort.Strings(ids)
		out = append(out, ids)
	}
}

func ids(orders []ordermsg.Order) []string {
	out := make([]string, len(orders))
	for i, o := range orders {
		out[i] = o.OrderID
	}
	sort.Strings(out)
	return out
}

func TestGroupMaxIsTheBatchBound(t *testing.T) {
	if conf.MaxGroup != ordermsg.MaxBatch {
		t.Fatalf("conf.MaxGroup %d, ordermsg.MaxBatch %d: a group must fit one message", conf.MaxGroup, ordermsg.MaxBatch)
	}
}

// One group of mixed outcomes, reserved in one call: a user over the limit,
// a keyed replay, a quantity the limit refuses, and more fresh buyers than
// units — each answered its own outcome, as alone; the accepted ones are in
// one message, answered once the broker confirmed it, marked queued.
func TestGroupAnswersEachItsOwnOutcome(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{true, false} {
		t.Run(map[bool]string{true: "one message", false: "a message each"}[batch], func(t *testing.T) {
			t.Parallel()
			groupAnswersEach(t, batch)
		})
	}
}

func groupAnswersEach(t *testing.T, batch bool) {
	r := newRigWith(t, func(c *sale.Config) {
		c.GroupMax, c.GroupLinger, c.GroupBatch = 64, 5*time.Second, batch
	})
	for _, q := range []sale.PurchaseRequest{req("full", ""), req("full", ""), req("keyed", "rk")} {
		if res, err := r.svc.Purchase(context.Background(), q); err != nil || res.Outcome != sale.Accepted {
			t.Fatalf("before the group: %+v %v", res, err)
		}
	}
	keyed := r.records(t, "keyed")[0].OrderID
	r.bodies(t) // the messages of those three
	var b batches
	b.hook(r, nil)
	reqs := []sale.PurchaseRequest{req("full", ""), req("keyed", "rk"), {ActivityID: act, UserID: "greedy", Quantity: 3}}
	for _, u := range []string{"b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8"} {
		reqs = append(reqs, req(u, "k-"+u))
	}
	got := r.burst(t, "pilot-mixed", reqs)
	if a := got[0]; a.err != nil || a.res.Outcome != sale.LimitExceeded || a.res.Held != 2 {
		t.Errorf("over the limit: %+v %v", a.res, a.err)
	}
	if a := got[1]; a.err != nil || a.res.Outcome != sale.Accepted || !a.res.Replay || a.res.OrderID != keyed {
		t.Errorf("replay: %+v %v, want order %s", a.res, a.err, keyed)
	}
	if a := got[2]; a.err != nil || a.res.Outcome != sale.BadQuantity {
		t.Errorf("quantity 3: %+v %v", a.res, a.err)
	}
	var accepted []string
	soldOut := 0
	for i, a := range got[3:] {
		switch {
		case a.err == nil && a.res.Outcome == sale.Accepted && !a.res.Replay:
			accepted = append(accepted, a.res.OrderID)
			if recs := r.records(t, reqs[3+i].UserID); len(recs) != 1 || !recs[0].Queued {
				t.Errorf("accepted %s: records %+v, want one, queued", a.res.OrderID, recs)
			}
		case a.err == nil && a.res.Outcome == sale.SoldOut:
			soldOut++
		default:
			t.Errorf("buyer %s: %+v %v", reqs[3+i].UserID, a.res, a.err)
		}
	}
	sort.Strings(accepted)
	if len(accepted) != 7 || soldOut != 1 {
		t.Fatalf("%d accepted, %d sold out of 8 buyers for 7 units", len(accepted), soldOut)
	}
	sent, q := b.all(), r.bodies(t)
	if !batch {
		var got []string
		for _, m := range q {
			got = append(got, m...)
			if len(m) != 1 {
				t.Errorf("a message of %v, want one order each", m)
			}
		}
		sort.Strings(got)
		if len(sent) != 0 || !equal(got, accepted) {
			t.Errorf("group messages %v, queue %v: want a message for each of %v", sent, q, accepted)
		}
	} else {
		if len(sent) != 1 || !equal(ids(sent[0]), accepted) {
			t.Fatalf("group messages %v, want one carrying %v", sent, accepted)
		}
		if len(q) != 1 || !equal(q[0], accepted) {
			t.Errorf("queue holds %v, want one message of %v", q, accepted)
		}
	}
	if s := r.sale(t); s.Pending != 10 {
		t.Errorf("pending %d, want 10", s.Pending)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A group message the broker refuses (a nack — a queue bound beside the
// order queue rejects it —, a return — unroutable —, both for real, or a
// connection lost before its confirm, after which it may still arrive) fails each of its purchases with 503, and exactly its orders are
// given back: their units, their keys (a retry buys anew), and after the
// lost connection a failed row in MySQL each, so that no copy can confirm.
// The group before it, confirmed, is untouched.
func TestGroupPublishFailureReleasesExactlyItsOrders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		err   error // injected
		fault func(t *testing.T, r *rig) (heal func())
	}{
		{name: "nack", fault: rejectBeside},
		{name: "return", fault: unbind},
		{name: "connection lost", err: broker.ErrConnectionLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := groupRig(t)
			var b batches
			b.hook(r, func([]ordermsg.Order) error { return nil })
			first := r.burst(t, "pilot-a", []sale.PurchaseRequest{req("a1", "k"), req("a2", "k"), req("a3", "")})
			var kept []string
			for _, a := range first {
				if a.err != nil || a.res.Outcome != sale.Accepted {
					t.Fatalf("first group: %+v %v", a.res, a.err)
				}
				kept = append(kept, a.res.OrderID)
			}
			heal := func() {}
			if tc.err != nil {
				b.hook(r, func([]ordermsg.Order) error { return tc.err })
			} else {
				heal = tc.fault(t, r)
			}
			second := r.burst(t, "pilot-b", []sale.PurchaseRequest{req("b1", "k"), req("b2", "k"), req("b3", ""), req("b4", "k")})
			heal()
			for _, a := range second {
				mustUnavailable(t, a.res, a.err)
			}
			sent := b.all()
			if len(sent) != 2 || len(sent[0]) != 3 || len(sent[1]) != 4 {
				t.Fatalf("group messages %v, want one of 3 and one of 4", sent)
			}
			for _, u := range []string{"b1", "b2", "b3", "b4"} {
				recs := r.records(t, u)
				if len(recs) != 1 || recs[0].State != reservation.Failed || recs[0].Reason != "publish_failed" {
					t.Errorf("%s: records %+v, want one released (publish_failed)", u, recs)
				}
				if e, err := r.direct.User(context.Background(), act, u); err != nil || e.Held != 0 || len(e.Keys) != 0 {
					t.Errorf("%s: entry %+v %v, want nothing held, no key", u, e, err)
				}
			}
			for i, u := range []string{"a1", "a2", "a3"} {
				recs := r.records(t, u)
				if len(recs) != 1 || recs[0].OrderID != kept[i] || recs[0].State != reservation.Pending || !recs[0].Queued {
					t.Errorf("%s: records %+v, want its order pending and queued", u, recs)
				}
			}
			if s := r.sale(t); s.Pending != 3 {
				t.Errorf("pending %d, want the first group's 3", s.Pending)
			}
			var rows int
			servicetest.Must(t, r.db.QueryRow(`SELECT COUNT(*) FROM orders WHERE activity_id = ? AND user_id LIKE 'b%' AND status = 'failed' AND reason = 'publish_failed'`, act).Scan(&rows), "rows")
			var others int
			servicetest.Must(t, r.db.QueryRow(`SELECT COUNT(*) FROM orders WHERE activity_id = ? AND user_id LIKE 'a%'`, act).Scan(&others), "rows")
			if wantRows := map[bool]int{true: 4, false: 0}[errors.Is(tc.err, broker.ErrConnectionLost)]; rows != wantRows || others != 0 {
				t.Errorf("MySQL: %d failed rows of the second group (want %d), %d of the first (want 0)", rows, wantRows, others)
			}
			// The keys are free: each retry buys anew (the batch hook publishes now).
			b.hook(r, nil)
			for _, u := range []string{"b1", "b2", "b4"} {
				if res, err := r.purchase(u, "k"); err != nil || res.Outcome != sale.Accepted || res.Replay {
					t.Errorf("%s retries its key: %+v %v, want a fresh 202", u, res, err)
				}
			}
		})
	}
}

// sideChannel is a channel of a connection of the test's own, closed at
// its end.
func sideChannel(t *testing.T) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial")
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	servicetest.Must(t, err, "channel")
	return ch
}

// unbind takes the rig's queue off its exchange until heal: a mandatory
// publish meanwhile is returned unroutable by the broker.
func unbind(t *testing.T, r *rig) func() {
	ch := sideChannel(t)
	servicetest.Must(t, ch.QueueUnbind(r.topo.Queue, r.topo.RoutingKey, r.topo.Exchange, nil), "unbind")
	return func() {
		servicetest.Must(t, ch.QueueBind(r.topo.Queue, r.topo.RoutingKey, r.topo.Exchange, false, nil), "bind")
	}
}

// rejectBeside binds a queue that rejects every message beside the rig's
// order queue until heal: the broker nacks a publish, which it could not
// enqueue everywhere. The queue is exclusive: it goes with its connection.
func rejectBeside(t *testing.T, r *rig) func() {
	ch := sideChannel(t)
	q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{"x-max-length": 0, "x-overflow": "reject-publish"})
	servicetest.Must(t, err, "declare a rejecting queue")
	servicetest.Must(t, ch.QueueBind(q.Name, r.topo.RoutingKey, r.topo.Exchange, false, nil), "bind the rejecting queue")
	return func() {
		servicetest.Must(t, ch.QueueUnbind(q.Name, r.topo.RoutingKey, r.topo.Exchange, nil), "unbind the rejecting queue")
	}
}

// The backend stops between a group's reserve and its publish (the hook
// never returns, as a process that died there): every order of the group
// is pending, unmarked, and nothing is queued — the state the sweeper
// settles (e2e TestBackendCrashBetweenGroupReserveAndPublish runs it to
// the end with a real crash and the real sweeper). A keyed retry on
// another backend adopts its order and publishes it itself.
func TestGroupStoppedBeforeItsPublish(t *testing.T) {
	t.Parallel()
	r := groupRig(t)
	stopped := make(chan []ordermsg.Order, 1)
	never := make(chan struct{})
	t.Cleanup(func() { close(never) })
	sale.SetBeforeGroupPublish(r.svc, func(orders []ordermsg.Order) {
		stopped <- orders
		<-never
	})
	users := []string{"c1", "c2", "c3", "c4"}
	release := make(chan struct{})
	held := r.fp.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains("pilot-c"), Hold: release})
	go func() {
		_, _ = r.svc.Purchase(context.Background(), sale.PurchaseRequest{ActivityID: act, UserID: "pilot-c", IdempotencyKey: "p", Quantity: 99})
	}()
	<-held
	for _, u := range users {
		go func() { _, _ = r.svc.Purchase(context.Background(), req(u, "k")) }()
	}
	eventually(t, "the group queued", func() bool { return sale.GroupQueued(r.svc, act) == len(users) })
	close(release)
	var orders []ordermsg.Order
	select {
	case orders = <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the group never reached its publish")
	}
	if len(orders) != len(users) {
		t.Fatalf("the group carries %d orders, want %d", len(orders), len(users))
	}
	for _, o := range orders {
		rec, found, err := r.direct.Order(context.Background(), act, o.OrderID)
		if err != nil || !found || rec.State != reservation.Pending || rec.Queued {
			t.Errorf("order %s: %+v %v %v, want pending, not queued", o.OrderID, rec, found, err)
		}
	}
	if q := r.bodies(t); len(q) != 0 {
		t.Errorf("queued %v before the publish", q)
	}
	// Another backend (no groups) answers a keyed retry with the order and
	// publishes it itself.
	other := sale.New(reservation.New(r.rdb, r.direct.Prefix()), r.db, r.real, sale.Config{
		ReservationTTL: 30 * time.Second, RedisTimeout: time.Second, PublishTimeout: 2 * time.Second,
		QueryTimeout: 5 * time.Second, SoldOutTTL: time.Second, RecoveryMax: time.Hour}, slog.New(slog.DiscardHandler), nil)
	t.Cleanup(other.Close)
	res, err := other.Purchase(context.Background(), req(orders[0].UserID, "k"))
	if err != nil || !res.Replay || res.OrderID != orders[0].OrderID {
		t.Fatalf("keyed retry elsewhere = %+v %v, want order %s", res, err, orders[0].OrderID)
	}
	if q := r.bodies(t); len(q) != 1 || q[0][0] != orders[0].OrderID {
		t.Errorf("queued %v, want the adopted order alone", q)
	}
}

// A group whose run panics after its reserve call reserved (a bug, forced by
// a hook) answers each of its purchases 503 and keeps nothing: every one is
// undone (units and keys back, no message), the process goes on, and the
// shard's next purchase runs as usual.
func TestGroupPanicAnswers503AndKeepsNothing(t *testing.T) {
	t.Parallel()
	r := groupRig(t)
	var once sync.Once
	sale.SetAfterGroupReserve(r.svc, func(n int) {
		if n > 1 {
			once.Do(func() { panic("forced by the test") })
		}
	})
	var reqs []sale.PurchaseRequest
	for _, u := range []string{"p1", "p2", "p3", "p4"} {
		reqs = append(reqs, req(u, "k-"+u))
	}
	for i, a := range r.burst(t, "pilot-panic", reqs) {
		if !errors.Is(a.err, sale.ErrUnavailable) || !strings.Contains(a.err.Error(), "group run panicked: forced by the test") {
			t.Errorf("buyer %s: %+v %v, want 503 from the group's panic", reqs[i].UserID, a.res, a.err)
		}
	}
	eventually(t, "the group's reservations undone", func() bool {
		s := r.sale(t)
		return s.Pending == 0 && s.Sold == 0
	})
	if q := r.bodies(t); len(q) != 0 {
		t.Errorf("queue holds %v after the panicked group, want nothing", q)
	}
	// The key was given back: the same request buys anew, at once.
	res, err := r.svc.Purchase(context.Background(), reqs[0])
	if err != nil || res.Outcome != sale.Accepted || res.Replay {
		t.Fatalf("after the panic: %+v %v, want a new order", res, err)
	}
}
