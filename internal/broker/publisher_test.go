package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/servicetest"
)

var (
	testQueues    = []string{".orders", ".orders.dead", ".reject"}
	testExchanges = []string{".orders", ".orders.dlx"}
)

// gatedConn is a TCP connection whose reads a test can hold (so that no
// confirm reaches the client) and which it can cut like a network failure.
type gatedConn struct {
	net.Conn
	mu       sync.Mutex
	open     chan struct{} // closed while reads flow
	writable chan struct{} // closed while writes flow
	cut      chan struct{}
	once     sync.Once
}

// Write blocks while the test stalls writes, as a socket does when the
// broker stops reading it (flow control) and the buffers are full.
func (c *gatedConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	w := c.writable
	c.mu.Unlock()
	if w != nil {
		select {
		case <-w:
		case <-c.cut:
			return 0, io.ErrClosedPipe
		}
	}
	return c.Conn.Write(b)
}

func (c *gatedConn) stallWrites() {
	c.mu.Lock()
	c.writable = make(chan struct{})
	c.mu.Unlock()
}

func (c *gatedConn) resumeWrites() {
	c.mu.Lock()
	if c.writable != nil {
		close(c.writable)
		c.writable = nil
	}
	c.mu.Unlock()
}

// Read holds what it read until the gate is open: bytes that arrive while
// the test holds the connection reach the client only after release.
func (c *gatedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	open := c.open
	c.mu.Unlock()
	select {
	case <-open:
	case <-c.cut:
		return 0, io.ErrUnexpectedEOF
	}
	return n, err
}

func (c *gatedConn) hold() {
	c.mu.Lock()
	c.open = make(chan struct{})
	c.mu.Unlock()
}

func (c *gatedConn) release() {
	c.mu.Lock()
	select {
	case <-c.open:
	default:
		close(c.open)
	}
	c.mu.Unlock()
}

// Close unblocks a stalled Write, as closing a real socket does.
func (c *gatedConn) Close() error {
	c.once.Do(func() { close(c.cut) })
	return c.Conn.Close()
}

func (c *gatedConn) sever() {
	c.once.Do(func() { close(c.cut) })
	_ = c.Conn.Close()
}

// dialer records every connection the publisher makes.
type dialer struct {
	mu    sync.Mutex
	conns []*gatedConn
}

func (d *dialer) dial(network, addr string) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	g := &gatedConn{Conn: c, open: make(chan struct{}), cut: make(chan struct{})}
	close(g.open)
	d.mu.Lock()
	d.conns = append(d.conns, g)
	d.mu.Unlock()
	return g, nil
}

func (d *dialer) last() *gatedConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.conns[len(d.conns)-1]
}

func (d *dialer) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.conns)
}

type fixture struct {
	pub  *Publisher
	cfg  PublisherConfig
	met  *PublisherMetrics
	dial *dialer
	ch   *amqp.Channel // a side channel for inspecting the broker
}

func newFixture(t testing.TB, channels int) *fixture {
	t.Helper()
	prefix := servicetest.AMQPPrefix(t, testQueues, testExchanges)
	rc := conf.Default().RabbitMQ
	rc.URL = servicetest.AMQPURL()
	rc.Prefix = prefix
	rc.PublishChannels = channels
	rc.ReconnectMin = conf.D(20 * time.Millisecond)
	rc.ReconnectMax = conf.D(200 * time.Millisecond)
	cfg := PublisherConfigFrom(rc, "test-"+prefix)
	d := &dialer{}
	cfg.Dial = d.dial
	met := NewPublisherMetrics(prometheus.NewRegistry(), "test")
	pub, err := NewPublisher(context.Background(), cfg, slog.New(slog.DiscardHandler), met)
	servicetest.Must(t, err, "new publisher")
	t.Cleanup(func() { _ = pub.Close() })

	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial side connection")
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	servicetest.Must(t, err, "side channel")
	return &fixture{pub: pub, cfg: cfg, met: met, dial: d, ch: ch}
}

func (f *fixture) depth(t testing.TB) int {
	t.Helper()
	q, err := f.ch.QueueDeclarePassive(f.cfg.Topology.Queue, true, false, false, false, nil)
	servicetest.Must(t, err, "inspect queue")
	return q.Messages
}

func order(activity int64) ordermsg.Order {
	return ordermsg.Order{
		OrderID: ordermsg.NewOrderID(activity), ActivityID: activity, UserID: "u-1", Quantity: 1,
		ReservedAt: time.Now().UnixMilli(), Deadline: time.Now().Add(time.Minute).UnixMilli(),
	}
}

// waitReconnected polls until the publisher has dialled more than dials
// connections and holds a live one.
func waitReconnected(t *testing.T, f *fixture, dials int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for f.dial.count() <= dials || f.pub.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("publisher did not reconnect: %v", f.pub.Ready())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPublishConfirmedMessageProperties(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	o := order(7)
	o.IdempotencyKey = "key-1"
	if err := f.pub.Publish(context.Background(), o); err != nil {
		t.Fatalf("publish: %v", err)
	}
	d, ok, err := f.ch.Get(f.cfg.Topology.Queue, true)
	servicetest.Must(t, err, "get")
	if !ok {
		t.Fatal("confirmed message is not in the queue")
	}
	if d.MessageId != o.OrderID || d.DeliveryMode != amqp.Persistent || d.ContentType != ordermsg.ContentType {
		t.Errorf("properties: message id %q mode %d type %q", d.MessageId, d.DeliveryMode, d.ContentType)
	}
	got, err := ordermsg.Decode(d.Body)
	servicetest.Must(t, err, "decode body")
	o.V = ordermsg.Version
	if got != o {
		t.Errorf("body = %+v, want %+v", got, o)
	}
	if v := counter(f.met.confirmed); v != 1 {
		t.Errorf("confirmed counter = %v, want 1", v)
	}
}

func TestPublishManyInFlight(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	const n = 300
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.pub.Publish(context.Background(), order(1)); err != nil {
				failed.Add(1)
				t.Errorf("publish: %v", err)
			}
		}()
	}
	wg.Wait()
	if failed.Load() == 0 {
		if got := f.depth(t); got != n {
			t.Errorf("queue holds %d messages, want %d", got, n)
		}
	}
}

func TestPublishReturnedWhenUnroutable(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	topo := f.cfg.Topology
	servicetest.Must(t, f.ch.QueueUnbind(topo.Queue, topo.RoutingKey, topo.Exchange, nil), "unbind")
	for i := 0; i < 3; i++ {
		err := f.pub.Publish(context.Background(), order(3))
		if !errors.Is(err, ErrReturned) {
			t.Fatalf("publish to an unbound key: err = %v, want ErrReturned", err)
		}
	}
	if v := counter(f.met.returned); v != 3 {
		t.Errorf("returned counter = %v, want 3", v)
	}
	// A return leaves the channel usable: bound again, publishes confirm.
	servicetest.Must(t, f.ch.QueueBind(topo.Queue, topo.RoutingKey, topo.Exchange, false, nil), "bind")
	if err := f.pub.Publish(context.Background(), order(3)); err != nil {
		t.Fatalf("publish after rebinding: %v", err)
	}
	if got := f.depth(t); got != 1 {
		t.Errorf("queue holds %d, want only the confirmed message", got)
	}
}

func TestPublishNacked(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	topo := f.cfg.Topology
	// A second queue on the same key that rejects every publish makes the
	// broker nack the message (it could not be enqueued everywhere).
	reject := f.cfg.Topology.Exchange[:len(f.cfg.Topology.Exchange)-len(".orders")] + ".reject"
	_, err := f.ch.QueueDeclare(reject, false, false, false, false, amqp.Table{
		"x-max-length": 0, "x-overflow": "reject-publish",
	})
	servicetest.Must(t, err, "declare rejecting queue")
	servicetest.Must(t, f.ch.QueueBind(reject, topo.RoutingKey, topo.Exchange, false, nil), "bind rejecting queue")
	err = f.pub.Publish(context.Background(), order(4))
	if !errors.Is(err, ErrNacked) {
		t.Fatalf("err = %v, want ErrNacked", err)
	}
	servicetest.Must(t, f.ch.QueueUnbind(reject, topo.RoutingKey, topo.Exchange, nil), "unbind rejecting queue")
	if err := f.pub.Publish(context.Background(), order(4)); err != nil {
		t.Fatalf("publish after removing the rejecting queue: %v", err)
	}
}

func TestPublishTimeout(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	c := f.dial.last()
	c.hold() // the broker's ack never reaches us
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	err := f.pub.Publish(ctx, order(5))
	cancel()
	if !errors.Is(err, ErrConfirmTimeout) {
		t.Fatalf("err = %v, want ErrConfirmTimeout", err)
	}
	c.release()
	if err := f.pub.Publish(context.Background(), order(5)); err != nil {
		t.Fatalf("publish after the stall: %v", err)
	}
	if v := counter(f.met.timedOut); v != 1 {
		t.Errorf("timeout counter = %v, want 1", v)
	}
}

// TestPublishBoundedWhenTheSocketStalls: the broker stops reading (flow
// control, a stalled link) without a connection.blocked notice, so the first
// publish blocks inside its socket write holding the channel's lock. Every
// publish still returns within its own deadline — while the socket is still
// stalled — and the publisher works again once it drains.
func TestPublishBoundedWhenTheSocketStalls(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	c := f.dial.last()
	c.stallWrites()
	defer c.resumeWrites()
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			errs <- f.pub.Publish(ctx, order(5))
		}()
	}
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrConfirmTimeout) {
				t.Errorf("err = %v, want ErrConfirmTimeout", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a publish is stuck behind the stalled socket")
		}
	}
	c.resumeWrites()
	if err := f.pub.Publish(context.Background(), order(5)); err != nil {
		t.Fatalf("publish after the stall: %v", err)
	}
}

// Publishes outstanding when the connection dies fail (never a false nil),
// the publisher reconnects with the topology declared, and publishes again.
func TestPublishConnectionLostThenRecovers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	c := f.dial.last()
	c.hold()
	const n = 20
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() { errs <- f.pub.Publish(context.Background(), order(6)) }()
	}
	// Wait until every publish is registered (so it is in flight or about to be).
	deadline := time.Now().Add(10 * time.Second)
	for f.pub.outstanding() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d publishes in flight", f.pub.outstanding())
		}
		time.Sleep(time.Millisecond)
	}
	c.sever()
	for i := 0; i < n; i++ {
		err := <-errs
		if err == nil {
			t.Fatal("a publish outstanding at the connection loss reported success")
		}
		if !errors.Is(err, ErrConnectionLost) && !errors.Is(err, ErrNotConnected) {
			t.Errorf("err = %v, want ErrConnectionLost", err)
		}
	}
	waitReconnected(t, f, 1)
	// Delete the topology behind the publisher's back: the next reconnect must
	// declare it again.
	topo := f.cfg.Topology
	_, err := f.ch.QueueDelete(topo.Queue, false, false, false)
	servicetest.Must(t, err, "delete queue")
	dials := f.dial.count()
	f.dial.last().sever()
	waitReconnected(t, f, dials)
	if err := f.pub.Publish(context.Background(), order(6)); err != nil {
		t.Fatalf("publish after recovery: %v", err)
	}
	if got := f.depth(t); got != 1 {
		t.Errorf("queue holds %d, want 1 (only the publish after recovery)", got)
	}
}

func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	servicetest.Must(t, f.pub.Close(), "close")
	if err := f.pub.Publish(context.Background(), order(8)); !errors.Is(err, ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
	if f.pub.Ready() == nil {
		t.Fatal("closed publisher reports ready")
	}
}

// BenchmarkPublishConfirmed measures confirmed publishes per second through
// Publisher with N publishes in flight.
func BenchmarkPublishConfirmed(b *testing.B) {
	for _, inflight := range []int{1, 64, 256} {
		b.Run("inflight="+strconv.Itoa(inflight), func(b *testing.B) {
			f := newFixture(b, conf.Default().RabbitMQ.PublishChannels)
			msgs := make([]ordermsg.Order, inflight)
			for i := range msgs {
				msgs[i] = order(9)
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for w := 0; w < inflight; w++ {
				wg.Add(1)
				go func(o ordermsg.Order) {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						if err := f.pub.Publish(context.Background(), o); err != nil {
							b.Error(err)
							return
						}
					}
				}(msgs[w])
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
		})
	}
}

// BenchmarkRawAsyncConfirm is the ceiling: bare amqp091 on one confirm channel
// to one queue, up to N unconfirmed at a time, confirms read from NotifyPublish.
func BenchmarkRawAsyncConfirm(b *testing.B) {
	for _, inflight := range []int{1, 64, 256} {
		b.Run("inflight="+strconv.Itoa(inflight), func(b *testing.B) {
			f := newFixture(b, 1)
			conn, err := amqp.Dial(servicetest.AMQPURL())
			servicetest.Must(b, err, "dial")
			defer conn.Close()
			ch, err := conn.Channel()
			servicetest.Must(b, err, "channel")
			servicetest.Must(b, ch.Confirm(false), "confirm")
			confirms := ch.NotifyPublish(make(chan amqp.Confirmation, inflight))
			body, _ := order(9).Encode()
			window := make(chan struct{}, inflight)
			done := make(chan int)
			go func() {
				nacks := 0
				for i := 0; i < b.N; i++ {
					c := <-confirms
					if !c.Ack {
						nacks++
					}
					<-window
				}
				done <- nacks
			}()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				window <- struct{}{}
				if err := ch.PublishWithContext(context.Background(), f.cfg.Topology.Exchange, f.cfg.Topology.RoutingKey,
					true, false, amqp.Publishing{ContentType: ordermsg.ContentType, DeliveryMode: amqp.Persistent, Body: body}); err != nil {
					b.Fatal(err)
				}
			}
			if nacks := <-done; nacks > 0 {
				b.Errorf("%d nacks", nacks)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
		})
	}
}

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// TestTimedOutPublishArrivalsAreMarkedMayHaveArrived: a publish that timed
// out while its socket write was stalled still reaches the queue once the
// socket drains (the write finishes after its caller gave up). Every such
// arrival must belong to a publish whose error says so (MayHaveArrived), so
// that its caller records the refusal durably before it answers 503; no
// message may arrive for a publish reported as certainly not written.
func TestTimedOutPublishArrivalsAreMarkedMayHaveArrived(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	c := f.dial.last()
	c.stallWrites()
	errOf := map[string]error{}
	for range 3 {
		o := order(5)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := f.pub.Publish(ctx, o)
		cancel()
		if err == nil {
			t.Fatal("a publish succeeded on a stalled socket")
		}
		errOf[o.OrderID] = err
	}
	c.resumeWrites()
	last := order(5)
	if err := f.pub.Publish(context.Background(), last); err != nil {
		t.Fatalf("publish after the stall: %v", err)
	}
	errOf[last.OrderID] = nil
	late := 0
	for {
		d, ok, err := f.ch.Get(f.cfg.Topology.Queue, true)
		servicetest.Must(t, err, "get")
		if !ok {
			break
		}
		err, known := errOf[d.MessageId]
		switch {
		case !known:
			t.Errorf("message %s of no publish", d.MessageId)
		case err != nil && !MayHaveArrived(err):
			t.Errorf("message %s arrived although its publish answered %v (MayHaveArrived false)", d.MessageId, err)
		case err != nil:
			late++
		}
	}
	t.Logf("%d of 3 timed-out publishes arrived later", late)
}

func TestMayHaveArrived(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{ErrConfirmTimeout, true},
		{ErrConnectionLost, true},
		{ErrDuplicate, true},
		{errors.New("something else"), true},
		{fmt.Errorf("publish x: %w", ErrConfirmTimeout), true},
		{ErrNacked, false},
		{ErrReturned, false},
		{ErrNotConnected, false},
		{fmt.Errorf("publish x: %w", ErrBlocked), false},
		{ErrClosed, false},
	} {
		if got := MayHaveArrived(tc.err); got != tc.want {
			t.Errorf("MayHaveArrived(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// Close writes connection.close and waits for the broker's reply; on a
// socket the broker stopped reading it would wait for the heartbeat. It
// returns within the confirm timeout (plus a margin) instead, with a
// publish and the supervisor stuck on that socket.
func TestCloseBoundedWhenTheSocketStalls(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	c := f.dial.last()
	c.stallWrites()
	defer c.resumeWrites()
	go func() { _ = f.pub.Publish(context.Background(), order(5)) }() // stuck in its write
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- f.pub.Close() }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Close on a stalled socket reported a clean close")
		}
	case <-time.After(f.cfg.ConfirmTimeout + 3*time.Second):
		t.Fatalf("Close still waits after %s on a stalled socket", time.Since(start))
	}
	if d := time.Since(start); d < f.cfg.ConfirmTimeout/2 {
		t.Errorf("Close returned after %s, before the graceful close could be tried", d)
	}
	if f.pub.Ready() == nil {
		t.Fatal("closed publisher reports ready")
	}
}

// A batch is one message (batch-<first order id>, persistent) whose v2 body
// carries every order as published alone; unroutable, it is returned like
// one order, and counted once.
func TestPublishBatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	orders := []ordermsg.Order{order(9), order(9), order(9)}
	orders[1].IdempotencyKey = "k"
	servicetest.Must(t, f.pub.PublishBatch(context.Background(), orders), "publish batch")
	d, ok, err := f.ch.Get(f.cfg.Topology.Queue, true)
	servicetest.Must(t, err, "get")
	if !ok {
		t.Fatal("confirmed batch is not in the queue")
	}
	if d.MessageId != "batch-"+orders[0].OrderID || d.MessageId != BatchMessageID(orders) || d.DeliveryMode != amqp.Persistent {
		t.Errorf("properties: message id %q mode %d", d.MessageId, d.DeliveryMode)
	}
	var b ordermsg.Batch
	servicetest.Must(t, json.Unmarshal(d.Body, &b), "body")
	if b.V != ordermsg.BatchVersion || len(b.Orders) != 3 {
		t.Fatalf("body %s", d.Body)
	}
	for i, o := range b.Orders {
		want := orders[i]
		want.V = ordermsg.Version
		if o != want {
			t.Errorf("order %d = %+v, want %+v", i, o, want)
		}
	}
	if f.depth(t) != 0 {
		t.Error("more than one message for the batch")
	}
	topo := f.cfg.Topology
	servicetest.Must(t, f.ch.QueueUnbind(topo.Queue, topo.RoutingKey, topo.Exchange, nil), "unbind")
	if err := f.pub.PublishBatch(context.Background(), orders); !errors.Is(err, ErrReturned) {
		t.Errorf("unroutable batch: %v, want ErrReturned", err)
	}
	if c, r := counter(f.met.confirmed), counter(f.met.returned); c != 1 || r != 1 {
		t.Errorf("confirmed %v returned %v, want 1 and 1", c, r)
	}
	if err := f.pub.PublishBatch(context.Background(), make([]ordermsg.Order, ordermsg.MaxBatch+1)); err == nil {
		t.Error("a batch over ordermsg.MaxBatch was published")
	}
}
