// Package consume takes orders off the RabbitMQ queue and hands them, in
// batches per activity, to the MySQL store: claim in Redis, commit in MySQL,
// ack, settle in Redis (docs/purchase-path.md, "Worker, one batch"). Nothing is
// acked before its commit; a message that can never be processed goes to the
// dead-letter queue once, with a reason; a lost connection is re-dialled with
// back-off, the topology re-declared and the queue re-subscribed.
package consume

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/backoff"
	"github.com/seckill/seckill/internal/broker"
	"github.com/seckill/seckill/internal/ordermsg"
	"github.com/seckill/seckill/internal/reservation"
	"github.com/seckill/seckill/worker/internal/store"
	"github.com/seckill/seckill/worker/internal/workermetrics"
)

// Config bounds the consumer.
type Config struct {
	// URLs are the broker nodes, one URL each: a session connects to the
	// first that serves (dial, declares) and the next session begins with
	// the node after it (broker.Nodes), so a worker whose node died or
	// cannot serve consumes from another.
	URLs     []string
	Topology broker.Topology
	// Partitions lists the order-queue partitions consumed; empty: every
	// partition of Topology and any retired partition queue that still
	// exists (looked for at the start of each AMQP session).
	Partitions []int
	// Consumers channels, each with Prefetch unacked messages at most.
	Consumers, Prefetch int
	// BatchSize and BatchWait bound what one channel collects before writing.
	BatchSize int
	BatchWait time.Duration
	// RetryMin and RetryMax bound the back-off while MySQL or Redis fail.
	RetryMin, RetryMax time.Duration
	// ReconnectMin and ReconnectMax bound the back-off between AMQP sessions.
	ReconnectMin, ReconnectMax time.Duration
	// ConfirmTimeout bounds the confirm of a dead-letter publish.
	ConfirmTimeout time.Duration
	// RedisTimeout bounds one claim or settle call.
	RedisTimeout time.Duration
	// ShutdownGrace bounds finishing the batches in hand after Run's context ends.
	ShutdownGrace time.Duration
	// Name labels the AMQP connection in the broker's tools.
	Name string
	// SerialClaims: claim a batch's orders in Redis only once the batch
	// before it is done, instead of while it commits (benchmarks compare).
	SerialClaims bool
	// DeadLetters: also consume the dead-letter queue, deciding each order
	// in it (see deadLoop). Every worker does; tests of the dead-letter
	// publish itself leave it off to look into the queue.
	DeadLetters bool
	// RegistryRefresh and RegistryTTL: each channel's entry in the registry
	// of live consumers that a drain marker must pass (lua/consumers.lua) is
	// refreshed every RegistryRefresh and expires RegistryTTL after the last
	// refresh (0: DefaultRegistryRefresh, DefaultRegistryTTL).
	RegistryRefresh, RegistryTTL time.Duration
	// MarkerPause is the wait before a channel sends round again a copy of
	// a drain marker it passed already (0: DefaultMarkerPause).
	MarkerPause time.Duration
}

// Defaults of the drain marker's consumer registry. The TTL outlasts the
// broker's detection of a dead connection (two missed heartbeats of 10 s),
// so that the deliveries of a consumer that died are back in the queue
// before its entry leaves the registry (see lua/pass.lua).
const (
	DefaultRegistryRefresh = time.Second
	DefaultRegistryTTL     = 30 * time.Second
	DefaultMarkerPause     = 200 * time.Millisecond
)

// passesTTL bounds how long the passes of a drain marker are kept.
const passesTTL = time.Hour

// ConfigFrom derives the consumer's settings from the configuration file.
func ConfigFrom(c conf.Config) Config {
	host, _ := os.Hostname()
	return Config{
		URLs:           c.RabbitMQ.AMQPURLs(),
		Topology:       broker.TopologyFor(c.RabbitMQ),
		Partitions:     c.Worker.Partitions,
		Consumers:      c.Worker.Consumers,
		Prefetch:       c.Worker.Prefetch,
		BatchSize:      c.Worker.BatchSize,
		BatchWait:      c.Worker.BatchWait.Duration,
		RetryMin:       c.Worker.RetryMin.Duration,
		RetryMax:       c.Worker.RetryMax.Duration,
		ReconnectMin:   c.RabbitMQ.ReconnectMin.Duration,
		ReconnectMax:   c.RabbitMQ.ReconnectMax.Duration,
		ConfirmTimeout: c.RabbitMQ.ConfirmTimeout.Duration,
		RedisTimeout:   c.Redis.ReadTimeout.Duration + c.Redis.WriteTimeout.Duration,
		ShutdownGrace:  c.Worker.ShutdownGrace.Duration,
		Name:           fmt.Sprintf("seckill-worker %s/%d", host, os.Getpid()),
		DeadLetters:    true,
	}
}

func (c Config) registryRefresh() time.Duration {
	if c.RegistryRefresh > 0 {
		return c.RegistryRefresh
	}
	return DefaultRegistryRefresh
}

func (c Config) registryTTL() time.Duration {
	if c.RegistryTTL > 0 {
		return c.RegistryTTL
	}
	return DefaultRegistryTTL
}

// registryComplete is the age at which a registry holds every consumer
// that may hold deliveries: a live consumer has refreshed its entry by then,
// and one that cannot has ended its session (see refresh), its deliveries
// back in the queue. A registry Redis lost is that young again.
func (c Config) registryComplete() time.Duration {
	return c.registryTTL()/2 + 2*c.registryRefresh()
}

func (c Config) markerPause() time.Duration {
	if c.MarkerPause > 0 {
		return c.MarkerPause
	}
	return DefaultMarkerPause
}

// Reservations is what the consumer needs of the Redis side
// (*reservation.Store).
type Reservations interface {
	Claim(ctx context.Context, activityID int64, orderIDs []string) ([]reservation.State, error)
	Settle(ctx context.Context, activityID int64, orders []reservation.Settlement) (int64, error)
	// RestoreKeys, Recovery, RegisterConsumers and PassMarker serve the
	// recovery after a Redis loss.
	RestoreKeys(ctx context.Context, activityID int64, orders []reservation.Decided) error
	Recovery(ctx context.Context, activityID int64) (string, error)
	RegisterConsumers(ctx context.Context, ttl time.Duration, consumers []reservation.Consumer) ([]string, error)
	PassMarker(ctx context.Context, p reservation.MarkerPass) (reservation.PassResult, error)
}

// EndRecovery ends a sale's recovery once its drain marker passed every
// live consumer, with Redis made exact from MySQL; the worker binds
// salesdb.EndRecovery to its MySQL and Redis.
type EndRecovery func(ctx context.Context, activityID int64, token string) (bool, error)

// Writer is what the consumer needs of MySQL (*store.Store).
type Writer interface {
	Write(ctx context.Context, activityID int64, orders []store.Order) ([]store.Outcome, error)
	// Fail records one order failed with reason (see store.Store.Fail).
	Fail(ctx context.Context, o ordermsg.Order, reason string) (store.Outcome, error)
}

// Consumer is one worker process's consuming side.
type Consumer struct {
	cfg Config
	res Reservations
	w   Writer
	end EndRecovery
	m   *workermetrics.Metrics
	log *slog.Logger

	mu   sync.Mutex
	conn *amqp.Connection // the consuming session's, nil between sessions
	node string           // its node's host:port
}

// New returns a consumer; Run starts it.
func New(cfg Config, res Reservations, w Writer, end EndRecovery, m *workermetrics.Metrics, log *slog.Logger) *Consumer {
	return &Consumer{cfg: cfg, res: res, w: w, end: end, m: m, log: log}
}

// ErrNotConsuming is Ready's answer between sessions.
var ErrNotConsuming = errors.New("not connected to RabbitMQ")

// Node is the host:port of the broker node consumed from ("" between
// sessions).
func (c *Consumer) Node() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return ""
	}
	return c.node
}

// Ready reports whether a session is consuming.
func (c *Consumer) Ready() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil || c.conn.IsClosed() {
		return ErrNotConsuming
	}
	return nil
}

func (c *Consumer) setConn(conn *amqp.Connection, node string) {
	c.mu.Lock()
	c.conn, c.node = conn, node
	c.mu.Unlock()
	c.m.Node.Reset()
	if node != "" {
		c.m.Node.WithLabelValues(node).Set(1)
	}
}

// Run consumes until ctx ends, then finishes the batches in hand (writes,
// acks, settles them within ShutdownGrace) and closes. It returns nil after a
// shutdown; connection failures are retried, never returned.
func (c *Consumer) Run(ctx context.Context) error {
	// work outlives ctx by the grace period, so that a batch in hand is
	// finished rather than abandoned.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopGrace := context.AfterFunc(ctx, func() {
		time.AfterFunc(c.cfg.ShutdownGrace, cancelWork)
	})
	defer stopGrace()

	nodes, err := broker.NewNodes(c.cfg.URLs)
	if err != nil {
		return err
	}
	// Sessions are never done: the loop ends with ctx (a shutdown), and a
	// session that got as far as consuming starts the waits afresh.
	sessions := 0
	_ = backoff.Retry(ctx, backoff.Policy{Site: "worker_amqp_session", Min: c.cfg.ReconnectMin, Max: c.cfg.ReconnectMax,
		Metrics: c.m.Retry,
		OnRetry: func(err error, d time.Duration) {
			c.log.Warn("amqp session lost; reconnecting", "err", err, "in", d)
		}}, func(context.Context) error {
		if sessions++; sessions > 1 {
			c.m.Reconnects.Inc()
		}
		consumed, err := c.session(ctx, work, nodes)
		if err == nil {
			err = errSessionEnded
		}
		if consumed {
			return backoff.Progressed(err)
		}
		return err
	})
	return nil
}

// errSessionEnded stands for a session that ended without an error of its
// own, so that the reconnect loop goes on.
var errSessionEnded = errors.New("amqp session ended")

// session runs one connection: declare, subscribe, consume until the
// connection fails or ctx ends. consumed reports that it got as far as
// consuming.
func (c *Consumer) session(ctx, work context.Context, nodes *broker.Nodes) (consumed bool, err error) {
	var dl *deadLetterer
	// The declares run on each node tried: one that refuses them cannot
	// serve, and the next is tried.
	conn, node, err := nodes.Connect(amqp.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Dial:       amqp.DefaultDial(5 * time.Second),
		Properties: amqp.Table{"connection_name": c.cfg.Name},
	}, func(conn *amqp.Connection) (err error) {
		dl, err = newDeadLetterer(conn, c.cfg.Topology, c.cfg.ConfirmTimeout)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	// Loops collect while sess lives. proc is the context of batch
	// processing: it survives ctx by the grace period (work) and ends as soon
	// as the session fails, since nothing in hand could be acked any more.
	sess, stopSess := context.WithCancel(ctx)
	proc, lost := context.WithCancel(work)
	graceful := false
	var wg sync.WaitGroup
	var members []member // in the registry of live consumers
	defer func() {
		stopSess()
		if !graceful {
			lost()
		}
		wg.Wait() // each loop finishes (or abandons) its batch in hand
		lost()
		c.setConn(nil, "")
		// Only now, every channel closed and its unacked deliveries back in
		// the queue, may the members leave the registry (lua/pass.lua).
		if len(members) > 0 {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.RedisTimeout)
			defer cancel()
			if err := c.register(dctx, members, 0); err != nil {
				c.log.Warn("consumers not dropped from the registry; their entries expire", "err", err)
			}
		}
	}()
	queues, parts, err := c.queues(conn)
	if err != nil {
		return false, err
	}
	// At least one channel per queue; channel i consumes queue i mod n.
	channels := max(c.cfg.Consumers, len(queues))
	ended := make(chan struct{}, channels+1)
	all := make([]member, channels)
	var rnd [6]byte
	_, _ = rand.Read(rnd[:]) // crypto/rand never fails on Linux
	for i := range all {
		q := queues[i%len(queues)]
		all[i] = member{Consumer: reservation.Consumer{Queue: q,
			ID: fmt.Sprintf("%s/%s/%d", c.cfg.Name, hex.EncodeToString(rnd[:]), i)}, partition: parts[i%len(queues)]}
	}
	// Each channel is in the registry of live consumers before it
	// subscribes, and leaves it once it is closed (its unacked deliveries
	// back in the queue); see lua/pass.lua.
	if err := c.register(ctx, all, c.cfg.registryTTL()); err != nil {
		return false, fmt.Errorf("register in the consumer registry: %w", err)
	}
	members = all
	lapsed := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.refresh(sess, members, lapsed)
	}()
	for i := range channels {
		q := members[i].Queue
		ch, err := conn.Channel()
		if err != nil {
			return false, fmt.Errorf("open channel %d: %w", i, err)
		}
		if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
			return false, fmt.Errorf("qos on channel %d: %w", i, err)
		}
		deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			return false, fmt.Errorf("consume %s on channel %d: %w", q, i, err)
		}
		wg.Add(1)
		me := members[i]
		go func() {
			defer wg.Done()
			c.loop(sess, proc, work, ch, deliveries, dl, me)
			ended <- struct{}{}
		}()
	}
	if c.cfg.DeadLetters {
		dch, err := conn.Channel()
		if err != nil {
			return false, fmt.Errorf("open dead-letter channel: %w", err)
		}
		if err := dch.Qos(deadPrefetch, 0, false); err != nil {
			return false, fmt.Errorf("qos on the dead-letter channel: %w", err)
		}
		dead, err := dch.Consume(c.cfg.Topology.DeadQueue, "", false, false, false, false, nil)
		if err != nil {
			return false, fmt.Errorf("consume %s: %w", c.cfg.Topology.DeadQueue, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.deadLoop(sess, proc, dch, dead)
			ended <- struct{}{}
		}()
	}
	c.setConn(conn, node)
	c.log.Info("consuming", "node", node, "queues", queues, "channels", channels, "prefetch", c.cfg.Prefetch,
		"dead_letters", c.cfg.DeadLetters)

	select {
	case <-ctx.Done():
		graceful = true
		return true, nil
	case e := <-closed:
		if e == nil {
			return true, errors.New("connection closed")
		}
		return true, e
	case <-lapsed:
		// Others may take this channel's entry as expired: give the
		// deliveries in hand back to the queue before they do.
		return true, errors.New("the consumer registry could not be refreshed")
	case <-ended:
		if ctx.Err() != nil { // a loop that stopped for the shutdown
			graceful = true
			return true, nil
		}
		// A channel failed (its deliveries ended); start over on a fresh
		// connection rather than consume with fewer channels.
		return true, errors.New("a consumer channel closed")
	}
}

// loop collects batches from one channel and handles them one at a time, so
// that when a batch is fully decided every earlier delivery of the channel is
// too, and a multiple ack is valid.
//
// Settling Redis after the ack is off the critical path: a settler goroutine
// per loop does it in batch order while the loop collects and writes the next
// batch. At most settleBacklog committed batches wait for it; the loop ends
// only once they are settled. Settling needs Redis, not the broker, so it runs
// under work, which outlives a lost session: only the end of the shutdown
// grace abandons a settle to the sweeper.
func (c *Consumer) loop(ctx, proc, work context.Context, ch *amqp.Channel, deliveries <-chan amqp.Delivery, dl *deadLetterer, me member) {
	defer ch.Close()
	settles := make(chan []*group, settleBacklog)
	var settler sync.WaitGroup
	settler.Add(1)
	go func() {
		defer settler.Done()
		for groups := range settles {
			for _, g := range groups {
				c.settle(work, g)
			}
		}
	}()
	defer func() {
		close(settles)
		settler.Wait()
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// While a batch is handled the next one is collected, decoded and, unless
	// the one in hand carries a drain marker (its recovery ends only once
	// the batch is decided), claimed in Redis: the claim's round trip then
	// overlaps the MySQL commit. Batches are still handled one after the
	// other, in order.
	type gathered struct {
		batch []inbound
		more  bool
	}
	gather := func(gctx context.Context, claim bool) gathered {
		g := gathered{batch: make([]inbound, 0, c.cfg.BatchSize)}
		g.more = c.collect(gctx, deliveries, timer, &g.batch)
		if claim && len(g.batch) > 0 && gctx.Err() == nil {
			c.claimAhead(proc, g.batch)
		}
		return g
	}
	cur := gather(ctx, false)
	for len(cur.batch) > 0 {
		var ahead chan gathered
		gctx, stop := context.WithCancel(ctx)
		if cur.more {
			ahead = make(chan gathered, 1)
			claim := !c.cfg.SerialClaims && !hasMarker(cur.batch)
			go func() { ahead <- gather(gctx, claim) }()
		}
		ok := c.handle(proc, ch, cur.batch, dl, settles, me)
		if !ok {
			// Some delivery undecided: stop before anything later is acked;
			// what the next batch took stays unacked and is redelivered.
			stop()
		}
		if ahead == nil {
			stop()
			return
		}
		cur = <-ahead
		stop()
		if !ok {
			return
		}
	}
}

// hasMarker reports whether batch holds a drain marker.
func hasMarker(batch []inbound) bool {
	for _, d := range batch {
		if d.Type == ordermsg.MarkerType {
			return true
		}
	}
	return false
}

// claimAhead claims the valid orders of batch in Redis, one call per
// activity, recording each state in its delivery. One try each: an activity
// whose claim fails is claimed again, with retries, when its group is
// written.
func (c *Consumer) claimAhead(ctx context.Context, batch []inbound) {
	type ref struct{ d, p int }
	var order []int64
	ids := map[int64][]string{}
	refs := map[int64][]ref{}
	for di, d := range batch {
		for pi, p := range d.parts {
			if p.Err != nil {
				continue
			}
			a := p.Order.ActivityID
			if _, ok := ids[a]; !ok {
				order = append(order, a)
			}
			ids[a] = append(ids[a], p.Order.OrderID)
			refs[a] = append(refs[a], ref{di, pi})
		}
	}
	for _, a := range order {
		cctx, cancel := context.WithTimeout(ctx, c.cfg.RedisTimeout)
		states, err := c.res.Claim(cctx, a, ids[a])
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				c.m.Retries.WithLabelValues(workermetrics.CauseRedis).Inc()
			}
			continue
		}
		for i, r := range refs[a] {
			d := &batch[r.d]
			if d.claims == nil {
				d.claims = make([]reservation.State, len(d.parts))
				d.claimed = make([]bool, len(d.parts))
			}
			d.claims[r.p], d.claimed[r.p] = states[i], true
		}
	}
}

// inbound is a delivery with its body decoded (orders only; a marker's is
// decoded by handle).
type inbound struct {
	amqp.Delivery
	parts []ordermsg.Part
	err   error // the message as a whole is invalid
	// claims[i] is what Redis answered for parts[i] when claimed[i] (see
	// claimAhead).
	claims  []reservation.State
	claimed []bool
}

// collect appends deliveries until they carry BatchSize orders (a message of
// several orders counts each), waiting at most BatchWait after the first.
// Each body is decoded as it arrives, while the batch fills. It reports false
// once the channel is closed or ctx ended.
func (c *Consumer) collect(ctx context.Context, deliveries <-chan amqp.Delivery, timer *time.Timer, batch *[]inbound) bool {
	if ctx.Err() != nil {
		return false
	}
	var wait <-chan time.Time
	defer timer.Stop()
	for orders := 0; orders < c.cfg.BatchSize; {
		select {
		case d, ok := <-deliveries:
			if !ok || ctx.Err() != nil {
				// Once the shutdown began nothing more is taken in hand: d
				// stays unacked and goes back to the queue when the channel
				// closes.
				return false
			}
			in := inbound{Delivery: d}
			if d.Type != ordermsg.MarkerType {
				in.parts, in.err = ordermsg.DecodeMessage(d.Body)
			}
			*batch = append(*batch, in)
			orders += max(1, len(in.parts))
			if wait == nil {
				timer.Reset(c.cfg.BatchWait)
				wait = timer.C
			}
		case <-wait:
			return true
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// group is the orders of one activity within a batch, at most BatchSize (a
// batch's orders of one activity beyond that start another group).
type group struct {
	activityID int64
	tags       []uint64 // of the delivery carrying each order
	orders     []store.Order
	claimed    bool // every order's Claim is Redis's answer already
	outcomes   []store.Outcome
	// rejected[i] is set when MySQL refused order i for good, even as a
	// failed row: it is dead-lettered, and settled failed in Redis.
	rejected map[int]error
}

// ReasonRejected is the failure reason of an order MySQL refused to write
// for good: stored as a failed row (the truth, which survives Redis); only
// when MySQL refuses even that is the message dead-lettered with MySQL's
// error, and the order failed in Redis alone.
const ReasonRejected = "rejected"

// permanentTries bounds the tries of a group whose write MySQL refuses with
// a permanent error before its orders are written one by one.
const permanentTries = 3

// errPermanent: MySQL refused the group permanentTries times for good.
var errPermanent = errors.New("rejected by MySQL for good")

// settleBacklog bounds the committed batches of one channel waiting to be
// settled in Redis.
const settleBacklog = 2

// handle decides every delivery of a batch: dead-letters the invalid ones,
// writes the rest per activity, acks what was decided, then hands the written
// groups to settles (Redis). A delivery of several orders is acked once every
// one of them is decided; an invalid or rejected one among them is
// dead-lettered alone. It reports whether every delivery was decided (and
// acked or rejected).
func (c *Consumer) handle(ctx context.Context, ch *amqp.Channel, batch []inbound, dl *deadLetterer, settles chan<- []*group, me member) bool {
	c.m.Deliveries.Add(float64(len(batch)))
	var groups []*group
	byID := map[int64]*group{}
	byTag := make(map[uint64]inbound, len(batch))
	var ackTags []uint64 // decided, to be acked
	var markers []marker
	all := true
	left := make(map[uint64]int, len(batch)) // undecided orders per delivery
	decided := func(tag uint64) {
		if left[tag]--; left[tag] == 0 {
			ackTags = append(ackTags, tag)
		}
	}
	// deadOne dead-letters one order of d alone: its body, under id.
	deadOne := func(d inbound, id string, body []byte, cause error) {
		if c.deadLetterOne(ctx, ch, d.Delivery, id, body, cause, dl, len(d.parts) == 1) {
			decided(d.DeliveryTag)
		} else if len(d.parts) > 1 {
			all = false // its neighbours must not be acked with it: redelivered
		}
	}
	for _, d := range batch {
		byTag[d.DeliveryTag] = d
		if d.Type == ordermsg.MarkerType {
			m, err := ordermsg.DecodeMarker(d.Body)
			if err != nil {
				if c.deadLetter(ctx, ch, d.Delivery, err, dl) {
					ackTags = append(ackTags, d.DeliveryTag)
				}
				continue
			}
			markers = append(markers, marker{tag: d.DeliveryTag, m: m})
			continue
		}
		if d.err != nil {
			if c.deadLetter(ctx, ch, d.Delivery, d.err, dl) {
				ackTags = append(ackTags, d.DeliveryTag)
			}
			continue
		}
		left[d.DeliveryTag] = len(d.parts)
		for i, p := range d.parts {
			if p.Err != nil {
				deadOne(d, partID(d.Delivery, i, len(d.parts)), p.Body, p.Err)
				continue
			}
			o := p.Order
			g := byID[o.ActivityID]
			if g == nil || len(g.orders) >= c.cfg.BatchSize {
				g = &group{activityID: o.ActivityID, claimed: true}
				byID[o.ActivityID] = g
				groups = append(groups, g)
			}
			so := store.Order{Order: o}
			if d.claimed != nil && d.claimed[i] {
				so.Claim = d.claims[i]
			} else {
				g.claimed = false
			}
			g.tags = append(g.tags, d.DeliveryTag)
			g.orders = append(g.orders, so)
		}
	}

	var done []*group
	for _, g := range groups {
		if ctx.Err() != nil {
			all = false
			break
		}
		err := c.write(ctx, g)
		var dead []int
		if errors.Is(err, errPermanent) {
			// MySQL rejects something in the group for good: write its
			// orders one by one, dead-letter the ones rejected.
			g, dead, err = c.isolate(ctx, g)
		}
		if err != nil {
			all = false
			break
		}
		if err := c.restoreKeys(ctx, g); err != nil {
			all = false
			break
		}
		done = append(done, g)
		for i, t := range g.tags {
			if g.rejected[i] == nil {
				decided(t)
			}
		}
		for _, i := range dead {
			o := g.orders[i].Order
			body, err := o.Encode()
			if err != nil { // a decoded order always encodes
				all = false
				continue
			}
			deadOne(byTag[g.tags[i]], o.OrderID, body, g.rejected[i])
		}
	}
	// Markers last: every order this channel received before them is
	// decided in MySQL now, and its key back in Redis.
	for _, mk := range markers {
		if !all || c.passMarker(ctx, me, mk.m, dl) != nil {
			all = false
			break
		}
		ackTags = append(ackTags, mk.tag)
	}
	acked := c.ack(ch, ackTags, all)
	if len(done) > 0 {
		settles <- done
	}
	return all && acked
}

// marker is a drain marker in a batch.
type marker struct {
	tag uint64
	m   ordermsg.Marker
}

// restoreKeys binds the idempotency keys of a written group's orders whose
// records Redis lost (claim "?": queued before a Redis loss) back to them,
// before they are acked: once the sale's recovery ends (its drain marker
// comes after them) a keyed retry finds its order in Redis, never buys
// again. Retried while Redis fails, until ctx ends (then nothing is acked:
// the redelivery is recognised in MySQL and restores again).
func (c *Consumer) restoreKeys(ctx context.Context, g *group) error {
	var lost []reservation.Decided
	for i, o := range g.orders {
		if o.Claim != reservation.Unknown || o.IdempotencyKey == "" || g.rejected[i] != nil ||
			g.outcomes[i].Reason == store.ReasonDuplicateKey {
			continue // another order of the key is the one MySQL keeps
		}
		lost = append(lost, reservation.Decided{OrderID: o.OrderID, UserID: o.UserID, IdempotencyKey: o.IdempotencyKey, Quantity: o.Quantity})
	}
	if len(lost) == 0 {
		return nil
	}
	return c.redis(ctx, "restore keys", func(rctx context.Context) error {
		return c.res.RestoreKeys(rctx, g.activityID, lost)
	})
}

// member is one consuming channel: its entry in the registry of its queue's
// live consumers, and its queue's partition.
type member struct {
	reservation.Consumer
	partition int
}

// register writes (ttl > 0) or drops (ttl 0) the members' registry entries.
func (c *Consumer) register(ctx context.Context, members []member, ttl time.Duration) error {
	list := make([]reservation.Consumer, len(members))
	for i, m := range members {
		list[i] = m.Consumer
	}
	rctx, cancel := context.WithTimeout(ctx, c.cfg.RedisTimeout)
	defer cancel()
	_, err := c.res.RegisterConsumers(rctx, ttl, list)
	return err
}

// refresh keeps the members' registry entries live until ctx ends. When no
// refresh succeeded for half the TTL it closes lapsed: the session must end
// (and give its deliveries back) before the entries expire.
func (c *Consumer) refresh(ctx context.Context, members []member, lapsed chan<- struct{}) {
	tick := time.NewTicker(c.cfg.registryRefresh())
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := c.register(ctx, members, c.cfg.registryTTL())
		switch {
		case err == nil:
			last = time.Now()
		case ctx.Err() != nil:
			return
		case time.Since(last) > c.cfg.registryTTL()/2:
			c.log.Error("consumer registry not refreshed; ending the session", "since", time.Since(last), "err", err)
			close(lapsed)
			return
		default:
			c.log.Warn("consumer registry refresh failed", "err", err)
		}
	}
}

// passMarker handles a copy of a sale's drain marker once every delivery
// this channel received before it is decided. While the sale recovers under
// the marker's token it records the pass (reservation.Store.PassMarker);
// when every live consumer of every partition has passed it ends the
// recovery (EndRecovery), else it sends the copy round again to its
// partition, confirmed, before the copy is acked. A copy of a recovery that
// ended (or of an earlier one) stops here. It returns ctx's error when ctx
// ended first (the copy is then not acked: redelivered).
func (c *Consumer) passMarker(ctx context.Context, me member, m ordermsg.Marker, dl *deadLetterer) error {
	var tok string
	if err := c.redis(ctx, "read recovery", func(rctx context.Context) (err error) {
		tok, err = c.res.Recovery(rctx, m.ActivityID)
		return err
	}); err != nil {
		return err
	}
	if tok != m.Token {
		return nil
	}
	parts := m.Partitions
	if parts == 0 { // a marker of a version before copies per partition
		parts = max(1, c.cfg.Topology.Partitions)
	}
	if me.partition >= parts {
		c.log.Warn("drain marker copy in a queue not among its partitions; dropped", "queue", me.Queue,
			"activity", m.ActivityID, "partitions", parts)
		return nil
	}
	queues := make([]string, parts)
	for i := range queues {
		queues[i] = c.cfg.Topology.PartitionQueue(i)
	}
	var r reservation.PassResult
	var id [8]byte
	_, _ = rand.Read(id[:]) // crypto/rand never fails on Linux
	if err := c.redis(ctx, "pass drain marker", func(rctx context.Context) (err error) {
		r, err = c.res.PassMarker(rctx, reservation.MarkerPass{ActivityID: m.ActivityID, Token: m.Token,
			Queues: queues, Partition: me.partition, Consumer: me.ID, Round: m.Round, Copy: m.Copy,
			NewCopy: hex.EncodeToString(id[:]), MinAge: c.cfg.registryComplete(), TTL: passesTTL,
			Takeover: c.cfg.registryTTL()})
		return err
	}); err != nil {
		return err
	}
	switch {
	case r.Outcome == reservation.PassDone:
		return c.endRecovery(ctx, m)
	case r.Outcome == reservation.PassDrop:
		return nil // another copy goes round
	case r.Outcome == reservation.PassUnregistered:
		// Redis lost the registry: the refresh writes the entry again.
		if !backoff.Sleep(ctx, c.cfg.registryRefresh()) {
			return ctx.Err()
		}
	case r.Again:
		// Passed already: the others have not taken a copy yet (busy, or
		// their prefetch full); do not spin the copy through the queue.
		if !backoff.Sleep(ctx, c.cfg.markerPause()) {
			return ctx.Err()
		}
	}
	if r.Round != "" {
		m.Round = r.Round
	}
	if r.Outcome == reservation.PassWaiting {
		m.Copy = r.Copy
	}
	m.Partition, m.Partitions = me.partition, parts
	return c.resend(ctx, me, m, dl)
}

// resend publishes a marker copy to the member's partition, confirmed,
// retrying while it fails until ctx ends.
func (c *Consumer) resend(ctx context.Context, me member, m ordermsg.Marker, dl *deadLetterer) error {
	body, err := m.Encode()
	if err != nil {
		return err
	}
	return backoff.Retry(ctx, c.retryPolicy("worker_marker_resend", func(err error, d time.Duration) {
		c.log.Warn("drain marker copy not sent round again; retrying", "activity", m.ActivityID, "in", d, "err", err)
	}), func(ctx context.Context) error {
		return dl.send(ctx, c.cfg.Topology.Exchange, c.cfg.Topology.PartitionKey(me.partition), amqp.Publishing{
			ContentType:  ordermsg.ContentType,
			DeliveryMode: amqp.Persistent,
			MessageId:    m.MessageID(),
			Type:         ordermsg.MarkerType,
			Timestamp:    time.Now(),
			Body:         body,
		})
	})
}

// retryPolicy is the policy of the worker's retries of Redis, MySQL and
// its own publishes: [worker] retry_min to retry_max, until ctx ends (the
// shutdown grace, or the session lost), each try bounded by the call itself.
func (c *Consumer) retryPolicy(site string, onRetry func(error, time.Duration)) backoff.Policy {
	return backoff.Policy{Site: site, Min: c.cfg.RetryMin, Max: c.cfg.RetryMax, Metrics: c.m.Retry, OnRetry: onRetry}
}

// endRecovery ends the recovery a drain marker names, from MySQL's truth;
// retried while MySQL or Redis fail, until ctx ends.
func (c *Consumer) endRecovery(ctx context.Context, m ordermsg.Marker) error {
	return backoff.Retry(ctx, c.retryPolicy("worker_end_recovery", func(err error, d time.Duration) {
		c.log.Warn("end of recovery failed; retrying", "activity", m.ActivityID, "in", d, "err", err)
	}), func(ctx context.Context) error {
		ended, err := c.end(ctx, m.ActivityID, m.Token)
		if err == nil && ended {
			c.log.Info("sale recovered from a Redis loss: its drain marker passed every live consumer of every partition",
				"activity", m.ActivityID, "token", m.Token)
		}
		return err
	})
}

// redis runs one Redis call with RedisTimeout, retrying with back-off while
// it fails, until ctx ends.
func (c *Consumer) redis(ctx context.Context, what string, call func(context.Context) error) error {
	p := c.retryPolicy("worker_redis", func(err error, d time.Duration) {
		c.m.Retries.WithLabelValues(workermetrics.CauseRedis).Inc()
		c.log.Warn(what+" failed; retrying", "in", d, "err", err)
	})
	p.TryTimeout = c.cfg.RedisTimeout
	return backoff.Retry(ctx, p, call)
}

// ack acks the decided tags: with one multiple ack of the highest when every
// delivery of the batch is decided (all earlier ones of this channel are,
// since batches are handled in order), one by one otherwise.
func (c *Consumer) ack(ch *amqp.Channel, tags []uint64, all bool) bool {
	if len(tags) == 0 {
		return true
	}
	if all {
		top := tags[0]
		for _, t := range tags {
			top = max(top, t)
		}
		if err := ch.Ack(top, true); err != nil {
			c.log.Warn("ack failed; the batch will be redelivered and recognised", "err", err)
			return false
		}
		return true
	}
	for _, t := range tags {
		if err := ch.Ack(t, false); err != nil {
			c.log.Warn("ack failed; the order will be redelivered and recognised", "err", err)
			return false
		}
	}
	return true
}

// write claims and commits one group, retrying with back-off while Redis or
// MySQL fail. It returns ctx's error when ctx ended first (shutdown grace
// over or connection lost; nothing is then acked), and errPermanent when
// MySQL refused the group for good permanentTries times in a row.
func (c *Consumer) write(ctx context.Context, g *group) error {
	ids := make([]string, len(g.orders))
	for i, o := range g.orders {
		ids[i] = o.OrderID
	}
	claimed := g.claimed
	permanent := 0
	try := 0
	return backoff.Retry(ctx, c.retryPolicy("worker_write", func(err error, d time.Duration) {
		c.log.Warn("batch not written; retrying", "activity", g.activityID, "orders", len(g.orders), "try", try, "in", d, "err", err)
	}), func(ctx context.Context) error {
		try++
		var err error
		if !claimed {
			var states []reservation.State
			cctx, cancel := context.WithTimeout(ctx, c.cfg.RedisTimeout)
			states, err = c.res.Claim(cctx, g.activityID, ids)
			cancel()
			if err == nil {
				for i := range g.orders {
					g.orders[i].Claim = states[i]
				}
				claimed = true
			} else if ctx.Err() == nil {
				c.m.Retries.WithLabelValues(workermetrics.CauseRedis).Inc()
			}
		}
		if claimed {
			g.outcomes, err = c.w.Write(ctx, g.activityID, g.orders)
			if err == nil {
				c.m.Batches.Inc()
				c.m.BatchSize.Observe(float64(len(g.orders)))
				for _, o := range g.outcomes {
					c.m.Orders.WithLabelValues(o.Label()).Inc()
				}
				return nil
			}
			if ctx.Err() == nil {
				c.m.Retries.WithLabelValues(workermetrics.CauseMySQL).Inc()
			}
			if store.Permanent(err) {
				permanent++
			} else {
				permanent = 0
			}
			if permanent >= permanentTries {
				return backoff.Stop(fmt.Errorf("%w: %v", errPermanent, err))
			}
		}
		return err
	})
}

// isolate writes the orders of a group MySQL refused one by one; each one
// refused for good is recorded failed ("rejected") in MySQL, or, when MySQL
// refuses that row too, marked rejected (dead-lettered, settled failed in
// Redis); the rest are written as usual. It returns the group with every
// outcome and the indexes of the orders to dead-letter.
func (c *Consumer) isolate(ctx context.Context, g *group) (*group, []int, error) {
	g.outcomes = make([]store.Outcome, len(g.orders))
	g.rejected = map[int]error{}
	var dead []int
	for i, o := range g.orders {
		one := &group{activityID: g.activityID, tags: g.tags[i : i+1], orders: []store.Order{o}, claimed: true}
		err := c.write(ctx, one)
		switch {
		case err == nil:
			g.outcomes[i] = one.outcomes[0]
		case errors.Is(err, errPermanent):
			out, ferr := c.fail(ctx, o.Order, ReasonRejected)
			if ferr == nil {
				g.outcomes[i] = out
				c.m.Orders.WithLabelValues(ReasonRejected).Inc()
				c.log.Error("order rejected by MySQL for good; recorded failed", "order_id", o.OrderID, "err", err)
				continue
			}
			if !errors.Is(ferr, errPermanent) {
				return g, nil, ferr
			}
			g.rejected[i] = fmt.Errorf("%w; the failed row too: %v", err, ferr)
			dead = append(dead, i)
			g.outcomes[i] = store.Outcome{OrderID: o.OrderID, UserID: o.UserID, Quantity: o.Quantity, Reason: ReasonRejected}
			c.m.Orders.WithLabelValues(ReasonRejected).Inc()
			c.log.Error("order rejected by MySQL for good, even as a failed row; dead-lettered", "order_id", o.OrderID, "err", g.rejected[i])
		default:
			return g, nil, err
		}
	}
	return g, dead, nil
}

// fail records o failed with reason in MySQL, retrying with back-off while
// MySQL fails transiently; errPermanent when MySQL refuses the row, ctx's
// error when ctx ended first.
func (c *Consumer) fail(ctx context.Context, o ordermsg.Order, reason string) (store.Outcome, error) {
	var out store.Outcome
	err := backoff.Retry(ctx, c.retryPolicy("worker_fail", func(error, time.Duration) {
		c.m.Retries.WithLabelValues(workermetrics.CauseMySQL).Inc()
	}), func(ctx context.Context) (err error) {
		out, err = c.w.Fail(ctx, o, reason)
		if store.Permanent(err) {
			return backoff.Stop(fmt.Errorf("%w: %v", errPermanent, err))
		}
		return err
	})
	if err != nil {
		return store.Outcome{}, err
	}
	return out, nil
}

// settle applies a committed group's outcomes to Redis, retrying while Redis
// fails until ctx ends; what is left then stays claimed, and the sweeper
// settles it from MySQL.
func (c *Consumer) settle(ctx context.Context, g *group) {
	s := make([]reservation.Settlement, len(g.outcomes))
	for i, o := range g.outcomes {
		s[i] = o.Settlement()
	}
	p := c.retryPolicy("worker_settle", func(err error, d time.Duration) {
		c.m.Retries.WithLabelValues(workermetrics.CauseSettle).Inc()
		c.log.Warn("settle failed; retrying", "activity", g.activityID, "orders", len(s), "in", d, "err", err)
	})
	p.TryTimeout = c.cfg.RedisTimeout
	var last error
	if err := backoff.Retry(ctx, p, func(ctx context.Context) error {
		_, last = c.res.Settle(ctx, g.activityID, s)
		return last
	}); err != nil {
		c.log.Error("settle abandoned; the orders stay claimed in Redis until swept", "activity", g.activityID, "orders", len(s), "err", last)
	}
}

// ReasonDeadLettered is the failure reason of an order whose message went to
// the dead-letter queue (the broker's delivery limit, or a worker that could
// not process it) before MySQL decided it.
const ReasonDeadLettered = "dead_lettered"

// deadPrefetch bounds the unacked messages of the dead-letter channel.
const deadPrefetch = 16

// deadLoop consumes the dead-letter queue: each order in it is decided, so
// that its unit is not held until queued_expire_after. MySQL arbitrates —
// the order is stored failed (dead_lettered) unless a row exists (a worker
// committed it before its message was dead-lettered: the row stands) — and
// Redis is then settled from MySQL's row. Idempotent on the order id, so a
// second copy of a message (a worker's dead-letter publish confirmed, its
// ack of the original lost, the original dead-lettered again) changes
// nothing. Messages that are no order (poison, a marker) are logged and
// acked: they hold no unit.
func (c *Consumer) deadLoop(ctx, proc context.Context, ch *amqp.Channel, deliveries <-chan amqp.Delivery) {
	defer ch.Close()
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-deliveries:
			if !ok {
				return
			}
		case <-ctx.Done():
			return
		}
		if !c.decideDead(proc, d) {
			return // not decided (shutdown, session lost): redelivered later
		}
		if err := ch.Ack(d.DeliveryTag, false); err != nil {
			c.log.Warn("ack of a dead-lettered message failed; it is decided again (idempotent)", "message_id", d.MessageId, "err", err)
			return
		}
	}
}

// decideDead decides one dead-lettered message; false when ctx ended first.
func (c *Consumer) decideDead(ctx context.Context, d amqp.Delivery) bool {
	reason, _ := d.Headers[broker.DeadReasonHeader].(string)
	if d.Type == ordermsg.MarkerType {
		// A backend sends the sale's marker again while it still recovers.
		c.log.Warn("drain marker dead-lettered; dropped", "message_id", d.MessageId, "reason", reason)
		return true
	}
	parts, err := ordermsg.Split(d.Body)
	if err != nil {
		c.log.Error("dead-lettered message is no order; dropped", "message_id", d.MessageId, "reason", reason,
			"err", err, "body", truncate(string(d.Body), 512))
		return true
	}
	// A message of several orders (the broker's delivery limit, or one the
	// worker refused whole) is decided order by order, settled per activity.
	var groups []*group
	byID := map[int64]*group{}
	for i, p := range parts {
		if p.Err != nil {
			c.log.Error("order of a dead-lettered message is invalid; dropped", "message_id", d.MessageId, "index", i,
				"reason", reason, "err", p.Err, "body", truncate(string(p.Body), 512))
			continue
		}
		o := p.Order
		out, err := c.fail(ctx, o, ReasonDeadLettered)
		switch {
		case errors.Is(err, errPermanent):
			// MySQL refuses even the failed row (the worker dead-lettered it
			// for that and failed it in Redis): Redis alone can release it.
			out = store.Outcome{OrderID: o.OrderID, UserID: o.UserID, Quantity: o.Quantity, Reason: ReasonRejected}
		case err != nil:
			return false
		}
		if !out.Redelivered {
			c.m.Orders.WithLabelValues(ReasonDeadLettered).Inc()
		}
		c.log.Warn("dead-lettered order decided", "order_id", o.OrderID, "confirmed", out.Confirmed, "reason", out.Reason,
			"dead_letter_reason", reason)
		g := byID[o.ActivityID]
		if g == nil {
			g = &group{activityID: o.ActivityID}
			byID[o.ActivityID] = g
			groups = append(groups, g)
		}
		g.outcomes = append(g.outcomes, out)
	}
	for _, g := range groups {
		c.settle(ctx, g)
	}
	return ctx.Err() == nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// deadLetter sends a delivery that can never be processed to the dead-letter
// queue with the reason. It reports true when the republish was confirmed
// (the caller acks the original); otherwise it rejected the original without
// requeue, so the queue's own dead-letter exchange takes it: it never loops.
func (c *Consumer) deadLetter(ctx context.Context, ch *amqp.Channel, d amqp.Delivery, cause error, dl *deadLetterer) bool {
	return c.deadLetterOne(ctx, ch, d, d.MessageId, d.Body, cause, dl, true)
}

// deadLetterOne sends body, one order of d (or all of it), to the dead-letter
// queue as message id with the reason, and reports true once the broker
// confirmed it. When the publish fails and d carries nothing else (alone), d
// is rejected without requeue as deadLetter does; otherwise d is left
// unacked, since it carries orders that are not dead: it is redelivered (and
// after the delivery limit, dead-lettered whole by the broker, where the
// dead-letter consumer decides each of its orders).
func (c *Consumer) deadLetterOne(ctx context.Context, ch *amqp.Channel, d amqp.Delivery, id string, body []byte, cause error, dl *deadLetterer, alone bool) bool {
	reason := cause.Error()
	if len(reason) > 255 {
		reason = reason[:255]
	}
	err := dl.publish(ctx, d, id, body, reason)
	if err == nil {
		c.m.DeadLettered.WithLabelValues(workermetrics.DeadPublished).Inc()
		c.log.Warn("message dead-lettered", "message_id", id, "reason", reason)
		return true
	}
	if !alone {
		c.log.Error("dead-letter of one order of a message failed; the message will be redelivered", "message_id", id, "err", err)
		return false
	}
	if nerr := ch.Nack(d.DeliveryTag, false, false); nerr != nil {
		c.log.Error("dead-letter failed and reject failed; it will be redelivered", "message_id", id, "err", err, "reject_err", nerr)
		return false
	}
	c.m.DeadLettered.WithLabelValues(workermetrics.DeadRejected).Inc()
	c.log.Warn("message rejected to the dead-letter exchange", "message_id", id, "reason", reason, "publish_err", err)
	return false
}

// partID is the message id of order i of d's n when dead-lettered alone: the
// message's own for a single order, else "<message id>#<i>".
func partID(d amqp.Delivery, i, n int) string {
	if n == 1 {
		return d.MessageId
	}
	return d.MessageId + "#" + strconv.Itoa(i)
}

// deadLetterer republishes invalid messages on a confirm-mode channel of the
// consuming connection; it also declares the topology.
type deadLetterer struct {
	mu      sync.Mutex // one publish at a time: two of one message id (a redelivery dead-lettered again) wait, not refuse
	ch      *broker.ConfirmChannel
	topo    broker.Topology
	timeout time.Duration
}

// queues lists what this session consumes, with each queue's partition:
// the assigned partitions, or all of them plus the retired ones that still
// exist.
func (c *Consumer) queues(conn *amqp.Connection) ([]string, []int, error) {
	t := c.cfg.Topology
	if len(c.cfg.Partitions) > 0 {
		out := make([]string, len(c.cfg.Partitions))
		for i, p := range c.cfg.Partitions {
			out[i] = t.PartitionQueue(p)
		}
		return out, c.cfg.Partitions, nil
	}
	retired, err := t.Retired(conn)
	if err != nil {
		return nil, nil, err
	}
	if len(retired) > 0 {
		c.log.Info("draining retired partition queues", "queues", retired)
	}
	all := append(t.OrderQueues(), retired...)
	parts := make([]int, len(all))
	for i := range parts {
		parts[i] = i // a retired queue's is at least Partitions: no marker is sent there
	}
	return all, parts, nil
}

func newDeadLetterer(conn *amqp.Connection, topo broker.Topology, timeout time.Duration) (*deadLetterer, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := topo.Declare(ch); err != nil {
		return nil, err
	}
	cc, err := broker.NewConfirmChannel(ch, 4)
	if err != nil {
		return nil, err
	}
	return &deadLetterer{ch: cc, topo: topo, timeout: timeout}, nil
}

// publish republishes body (d's, or one order of it) as message id to the
// dead-letter exchange (mandatory, persistent), with d's properties and the
// reason header, and waits for the broker's confirm.
func (dl *deadLetterer) publish(ctx context.Context, d amqp.Delivery, id string, body []byte, reason string) error {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	headers[broker.DeadReasonHeader] = reason
	return dl.send(ctx, dl.topo.DeadExchange, dl.topo.DeadRoutingKey, amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		CorrelationId:   d.CorrelationId,
		MessageId:       id,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            body,
	})
}

// send publishes msg (mandatory) on the confirm-mode channel and waits for
// the broker's confirm: a dead letter, or a drain marker's copy sent round
// again.
func (dl *deadLetterer) send(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, dl.timeout)
	defer cancel()
	return dl.ch.Send(ctx, exchange, key, msg)
}
