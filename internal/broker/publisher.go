package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/backoff"
	"github.com/seckill/seckill/internal/metrics"
	"github.com/seckill/seckill/internal/ordermsg"
)

// Errors of Publish. Each means the broker did not take responsibility for the
// message; none of them means it certainly did not arrive (a timeout or a lost
// connection may hide an ack), so callers must settle the order through a path
// that tolerates both (release.lua versus claim.lua).
var (
	ErrNacked         = errors.New("broker nacked the message")
	ErrReturned       = errors.New("broker returned the message as unroutable")
	ErrConfirmTimeout = errors.New("no confirm before the deadline")
	ErrConnectionLost = errors.New("connection lost before the confirm")
	ErrNotConnected   = errors.New("not connected to the broker")
	ErrBlocked        = errors.New("broker blocks publishing (resource alarm)")
	ErrClosed         = errors.New("publisher closed")
	ErrDuplicate      = errors.New("message id already in flight")
)

// MayHaveArrived reports whether a failed publish may still put its message
// in the queue: the frame may have been written (a confirm timeout — the
// write itself may finish after the caller gave up —, a connection lost
// after the write, an unknown error, or a copy of the same id in flight).
// False only where the broker certainly holds no copy from this call: a nack
// or return (the broker refused it), or nothing was written (not connected,
// blocked, closed). The caller of a publish that may have arrived must make
// its refusal durable (MySQL) before it answers "nothing kept".
func MayHaveArrived(err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrNacked), errors.Is(err, ErrReturned), errors.Is(err, ErrNotConnected),
		errors.Is(err, ErrBlocked), errors.Is(err, ErrClosed):
		return false
	}
	return true
}

// returnsBuffer is the capacity of each channel's basic.return buffer. amqp091
// hands a return to its listener with a blocking send bounded by 5 s on the
// connection's reader goroutine; returns are drained by every waiter that
// receives its confirm, so the buffer only holds the returns of messages whose
// confirm is still being processed, plus late returns of timed-out publishes.
const returnsBuffer = 4096

// staleDrainInterval bounds how long a late return (its publisher gave up
// waiting) may sit in a buffer when no other confirm arrives to drain it.
const staleDrainInterval = 100 * time.Millisecond

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// URLs are the broker nodes, one URL each (conf.RabbitMQ.AMQPURLs): the
	// publisher connects to the first that serves and, after a connection
	// loss or a nack storm, to the next (Nodes).
	URLs     []string
	Topology Topology
	// Channels is the number of confirm-mode channels publishes are spread over.
	Channels int
	// ConfirmTimeout bounds one publish (the caller's context may be shorter).
	ConfirmTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the exponential back-off between
	// connection attempts.
	ReconnectMin, ReconnectMax time.Duration
	// NackLimit is the number of consecutive nacks on one channel after
	// which the channel is reopened; a channel reopened so that reaches it
	// again before its first ack makes the publisher reconnect, to the next
	// node (0: DefaultNackLimit). See Publisher.
	NackLimit int
	// Name shows in the broker's connection list.
	Name string
	// Dial replaces the TCP dialer (tests use it to cut connections); nil: default.
	Dial func(network, addr string) (net.Conn, error)
}

// PublisherConfigFrom derives a PublisherConfig from the [rabbitmq] section.
func PublisherConfigFrom(c conf.RabbitMQ, name string) PublisherConfig {
	return PublisherConfig{
		URLs:           c.AMQPURLs(),
		Topology:       TopologyFor(c),
		Channels:       c.PublishChannels,
		ConfirmTimeout: c.ConfirmTimeout.Duration,
		ReconnectMin:   c.ReconnectMin.Duration,
		ReconnectMax:   c.ReconnectMax.Duration,
		NackLimit:      c.NackLimit,
		Name:           name,
	}
}

// PublisherMetrics counts publish outcomes. A nil *PublisherMetrics records nothing.
type PublisherMetrics struct {
	outcomes   *prometheus.CounterVec
	latency    prometheus.Histogram
	reconnects prometheus.Counter
	connected  prometheus.Gauge
	confirmed  prometheus.Counter
	nacked     prometheus.Counter
	returned   prometheus.Counter
	timedOut   prometheus.Counter
	lost       prometheus.Counter
	notConn    prometheus.Counter
	node       *prometheus.GaugeVec
	recoveries *prometheus.CounterVec
	retry      *backoff.Metrics // the reconnect waits (site publisher_reconnect)
}

// NewPublisherMetrics registers the publisher's metrics on reg under namespace.
func NewPublisherMetrics(reg prometheus.Registerer, namespace string) *PublisherMetrics {
	m := &PublisherMetrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "publish", Name: "total",
			Help: "Order publishes by outcome: confirmed, nacked, returned, timeout, connection_lost, unavailable (not connected, blocked, closed).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "publish", Name: "confirm_seconds",
			Help: "Time from publish to the broker's confirm (confirmed publishes only).", Buckets: metrics.LatencyBuckets,
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "publish", Name: "connects_total",
			Help: "Successful (re)connections of the publisher to the broker.",
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "publish", Name: "connected",
			Help: "1 while the publisher holds a live connection.",
		}),
	}
	m.confirmed = m.outcomes.WithLabelValues("confirmed")
	m.nacked = m.outcomes.WithLabelValues("nacked")
	m.returned = m.outcomes.WithLabelValues("returned")
	m.timedOut = m.outcomes.WithLabelValues("timeout")
	m.lost = m.outcomes.WithLabelValues("connection_lost")
	m.notConn = m.outcomes.WithLabelValues("unavailable")
	m.node = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: "publish", Name: "node",
		Help: "1 for the broker node (host:port of [rabbitmq] url) the publisher is connected to, 0 for the ones it left.",
	}, []string{"node"})
	m.recoveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "publish", Name: "nack_recoveries_total",
		Help: "Recoveries from consecutive nacks: channel (a channel reopened), connection (reconnected to the next node).",
	}, []string{"action"})
	reg.MustRegister(m.outcomes, m.latency, m.reconnects, m.connected, m.node, m.recoveries)
	m.retry = backoff.NewMetrics(reg)
	return m
}

func (m *PublisherMetrics) recovered(action string) {
	if m != nil {
		m.recoveries.WithLabelValues(action).Inc()
	}
}

func (m *PublisherMetrics) outcome(err error, d time.Duration) {
	if m == nil {
		return
	}
	switch {
	case err == nil:
		m.confirmed.Inc()
		m.latency.Observe(d.Seconds())
	case errors.Is(err, ErrReturned):
		m.returned.Inc()
	case errors.Is(err, ErrNacked):
		m.nacked.Inc()
	case errors.Is(err, ErrConfirmTimeout):
		m.timedOut.Inc()
	case errors.Is(err, ErrConnectionLost):
		m.lost.Inc()
	default:
		m.notConn.Inc()
	}
}

// Publisher publishes orders with publisher confirms over a small pool of
// confirm-mode channels on its own connection, with many publishes in flight.
//
// Recovery: this is our own loop, not amqp091-go's Config.Recovery. Reasons:
//   - Outstanding publishes at a connection loss must fail. Both ways do that
//     (a closing channel nacks every pending DeferredConfirmation, and the
//     library's recovery resets the sequencer the same way), but with our loop
//     the dead *amqp.Channel stays dead, IsClosed() stays true, and a waiter can
//     tell "connection lost" from a broker nack without racing a channel that
//     the library is reopening under the same pointer with delivery tags
//     restarting at 1.
//   - The topology carries arguments (quorum type, delivery limit, dead-letter
//     exchange) that Topology.Declare owns; redeclaring it explicitly after each
//     connect is one code path with the first start, instead of the library's
//     recorded-entity replay, which is experimental in v1.16.0.
//   - basic.return listeners are closed with the channel; a fresh channel gets
//     a fresh buffer and pending map, so returns of the old one cannot be
//     matched against publishes of the new one.
//
// Nodes and nack storms: the publisher connects to the first of
// cfg.URLs that serves (dial, declare, channels: Nodes.Connect) and, after
// a lost connection, to the next one first. A node may also keep its
// connection and refuse every publish (a quorum queue without a leader,
// a connection a load balancer moved to a node before the election: the
// broker nacks; nothing reopens a channel it does not close). After
// NackLimit consecutive nacks on a channel the publisher opens a new
// channel in its place (new publishes go there) and closes the old one;
// when the new channel reaches NackLimit before its first ack, the
// connection is the trouble and the publisher reconnects, to the next node.
// The contract is untouched: each nacked publish failed with ErrNacked (the
// broker holds no copy: the caller releases and answers 503); a publish
// still waiting on a channel closed this way fails with ErrConnectionLost,
// which MayHaveArrived (the caller records its refusal first); 202 is still
// only answered for an ack.
type Publisher struct {
	cfg     PublisherConfig
	nodes   *Nodes
	log     *slog.Logger
	metrics *PublisherMetrics

	sess atomic.Pointer[session]
	rr   atomic.Uint64

	// Counted for Status (the metrics may be nil).
	connects, nacks, recoveries atomic.Int64

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	writes chan struct{} // one per publish in its socket write (bounded)

	socketsMu sync.Mutex
	sockets   map[net.Conn]struct{} // every socket dialled and not yet closed, for Close
}

// maxStalledWrites bounds the publishes whose socket write may be in
// progress at once; beyond it Publish fails at once (ErrBlocked) instead of
// piling up goroutines behind a stalled connection.
const maxStalledWrites = 4096

// session is one connection and its channels.
type session struct {
	conn  *amqp.Connection
	addr  string // the node's host:port
	chans []atomic.Pointer[pubChannel]
	// retire receives a channel that reached NackLimit consecutive nacks
	// (once per channel); the supervisor replaces it.
	retire chan *pubChannel
	// blocked is set while the broker blocks publishing (a memory or disk
	// alarm): a publish would then hang in the socket write, beyond any
	// timeout, so Publish refuses at once instead.
	blocked atomic.Bool
}

// pubChannel is one confirm-mode channel of the publisher, with its nack
// bookkeeping.
type pubChannel struct {
	*ConfirmChannel

	// nacks counts consecutive nacks (an ack resets it); acked is set at
	// the first ack. forNacks marks a channel opened in place of one
	// retired for nacks.
	nacks    atomic.Int32
	acked    atomic.Bool
	forNacks bool
}

// NewPublisher connects (declaring the topology) and keeps the connection up
// until Close. It fails when the first connection cannot be made.
func NewPublisher(ctx context.Context, cfg PublisherConfig, log *slog.Logger, m *PublisherMetrics) (*Publisher, error) {
	if cfg.Channels < 1 {
		cfg.Channels = 1
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 5 * time.Second
	}
	if cfg.ReconnectMin <= 0 {
		cfg.ReconnectMin = 100 * time.Millisecond
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		cfg.ReconnectMax = cfg.ReconnectMin
	}
	if cfg.NackLimit <= 0 {
		cfg.NackLimit = DefaultNackLimit
	}
	nodes, err := NewNodes(cfg.URLs)
	if err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg, nodes: nodes, log: log, metrics: m, done: make(chan struct{}), writes: make(chan struct{}, maxStalledWrites),
		sockets: map[net.Conn]struct{}{}}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The supervisor outlives the caller's context: Close stops it.
	p.ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	s, err := p.connect()
	if err != nil {
		p.cancel()
		return nil, err
	}
	p.sess.Store(s)
	p.connects.Add(1)
	m.connectedNow(s)
	log.Info("amqp publisher connected", "node", s.addr)
	go p.supervise(s)
	return p, nil
}

// DefaultNackLimit is PublisherConfig.NackLimit's default.
const DefaultNackLimit = 5

// connectedNow records s as the live session (nil: none).
func (m *PublisherMetrics) connectedNow(s *session) {
	if m == nil {
		return
	}
	if s == nil {
		m.connected.Set(0)
		return
	}
	m.reconnects.Inc()
	m.connected.Set(1)
	m.node.Reset()
	m.node.WithLabelValues(s.addr).Set(1)
}

func (p *Publisher) connect() (*session, error) {
	acfg := amqp.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Properties: amqp.NewConnectionProperties(),
		Dial:       p.cfg.Dial,
	}
	if acfg.Dial == nil {
		acfg.Dial = amqp.DefaultDial(5 * time.Second)
	}
	acfg.Dial = p.tracked(acfg.Dial)
	if p.cfg.Name != "" {
		acfg.Properties.SetClientConnectionName(p.cfg.Name)
	}
	var s *session
	// A node that accepts the connection but refuses the declares or the
	// channels cannot serve: Connect closes it and tries the next.
	_, addr, err := p.nodes.Connect(acfg, func(conn *amqp.Connection) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("amqp channel: %w", err)
		}
		if err := p.cfg.Topology.Declare(ch); err != nil {
			return err
		}
		_ = ch.Close()
		s = &session{conn: conn, chans: make([]atomic.Pointer[pubChannel], p.cfg.Channels),
			retire: make(chan *pubChannel, 4*p.cfg.Channels)}
		for i := range s.chans {
			pc, err := openChannel(conn)
			if err != nil {
				return err
			}
			s.chans[i].Store(pc)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("amqp connect: %w", err)
	}
	s.addr = addr
	return s, nil
}

func openChannel(conn *amqp.Connection) (*pubChannel, error) {
	cc, err := OpenConfirmChannel(conn, returnsBuffer)
	if err != nil {
		return nil, err
	}
	return &pubChannel{ConfirmChannel: cc}, nil
}

// supervise watches the live session: it reopens a channel the broker closed,
// and reconnects with back-off when the connection is lost.
func (p *Publisher) supervise(s *session) {
	defer close(p.done)
	tick := time.NewTicker(staleDrainInterval)
	defer tick.Stop()
	for {
		connClosed := s.conn.NotifyClose(make(chan *amqp.Error, 1))
		// Blocked notifications are read on their own goroutine: amqp091 drops
		// one whose listener is busy for 5 s (as watch may be, reopening a
		// channel while the broker blocks), and a lost "unblocked" would
		// refuse every publish until the next reconnect.
		blocked := s.conn.NotifyBlocked(make(chan amqp.Blocking, 16))
		go p.watchBlocked(s, blocked)
		if !p.watch(s, connClosed, tick.C) {
			return
		}
		p.sess.Store(nil)
		p.metrics.connectedNow(nil)
		_ = s.conn.Close()
		s = p.reconnect()
		if s == nil {
			return
		}
		if p.ctx.Err() != nil { // Close began while it connected
			_ = s.conn.Close()
			return
		}
		p.sess.Store(s)
		p.connects.Add(1)
		p.metrics.connectedNow(s)
		p.log.Info("amqp publisher reconnected", "node", s.addr)
	}
}

// watchBlocked follows the broker's flow control of s until its connection
// closes (amqp091 then closes the channel).
func (p *Publisher) watchBlocked(s *session, blocked <-chan amqp.Blocking) {
	for b := range blocked {
		s.blocked.Store(b.Active)
		if b.Active {
			p.log.Warn("amqp broker blocks publishing", "reason", b.Reason)
		} else {
			p.log.Info("amqp broker unblocked publishing")
		}
	}
}

// watch returns false when the publisher is closing, true when s is lost.
func (p *Publisher) watch(s *session, connClosed <-chan *amqp.Error, tick <-chan time.Time) bool {
	for {
		select {
		case <-p.ctx.Done():
			return false
		case err := <-connClosed:
			if err != nil {
				p.log.Warn("amqp publisher connection lost", "node", s.addr, "err", err)
			} else {
				p.log.Warn("amqp publisher connection closed", "node", s.addr)
			}
			return true
		case pc := <-s.retire:
			if !p.replace(s, pc) {
				return true
			}
		case <-tick:
			for i := range s.chans {
				pc := s.chans[i].Load()
				pc.Strays() // late returns of publishes given up: nobody waits for them
				if !pc.IsClosed() {
					continue
				}
				if s.conn.IsClosed() {
					return true
				}
				npc, err := openChannel(s.conn)
				if err != nil {
					p.log.Warn("amqp publisher cannot reopen a channel; reconnecting", "err", err)
					return true
				}
				p.log.Warn("amqp publisher reopened a channel the broker closed")
				s.chans[i].Store(npc)
			}
		}
	}
}

// replace opens a channel in place of pc, which reached NackLimit
// consecutive nacks, and closes pc. It returns false when the connection
// should go instead: pc itself replaced one retired for nacks and was never
// acked, or no channel can be opened.
func (p *Publisher) replace(s *session, pc *pubChannel) bool {
	i := 0
	for i < len(s.chans) && s.chans[i].Load() != pc {
		i++
	}
	if i == len(s.chans) {
		return true // replaced already (the broker closed it)
	}
	if pc.forNacks && !pc.acked.Load() {
		p.log.Warn("amqp publisher: a reopened channel is refused too; reconnecting to the next node",
			"node", s.addr, "nacks", pc.nacks.Load())
		p.recovered("connection")
		return false
	}
	npc, err := openChannel(s.conn)
	if err != nil {
		p.log.Warn("amqp publisher cannot reopen a nacking channel; reconnecting", "node", s.addr, "err", err)
		p.recovered("connection")
		return false
	}
	npc.forNacks = true
	s.chans[i].Store(npc)
	p.recovered("channel")
	p.log.Warn("amqp publisher reopened a channel the broker kept nacking", "node", s.addr, "nacks", pc.nacks.Load())
	// Close waits for the broker's close-ok: not on the supervisor. The
	// publishes still waiting on pc fail as ErrConnectionLost.
	go func() { _ = pc.Close() }()
	return true
}

func (p *Publisher) recovered(action string) {
	p.recoveries.Add(1)
	p.metrics.recovered(action)
}

func (p *Publisher) reconnect() *session {
	// Jittered, and a wait before the first try too, so that every backend
	// does not reconnect in lockstep after a broker restart; until the
	// publisher closes.
	var s *session
	var retry *backoff.Metrics
	if p.metrics != nil {
		retry = p.metrics.retry
	}
	err := backoff.Retry(p.ctx, backoff.Policy{Site: "publisher_reconnect", Min: p.cfg.ReconnectMin, Max: p.cfg.ReconnectMax,
		WaitFirst: true, Metrics: retry,
		OnRetry: func(err error, wait time.Duration) {
			p.log.Warn("amqp publisher reconnect failed", "err", err, "retry_in", wait)
		}}, func(context.Context) (err error) {
		s, err = p.connect()
		return err
	})
	if err != nil {
		return nil
	}
	return s
}

// Node is the host:port of the broker node the publisher is connected to
// ("" while it is not).
func (p *Publisher) Node() string {
	if s := p.sess.Load(); s != nil {
		return s.addr
	}
	return ""
}

// Status names the node in use and counts what recovery did since the
// start, for /readyz: "node 127.0.0.1:5672, connects 1, nacks 0, nack
// recoveries 0".
func (p *Publisher) Status() string {
	node := p.Node()
	if node == "" {
		node = "none"
	}
	return fmt.Sprintf("node %s, connects %d, nacks %d, nack recoveries %d",
		node, p.connects.Load(), p.nacks.Load(), p.recoveries.Load())
}

// Ready reports whether a live connection is held.
func (p *Publisher) Ready() error {
	s := p.sess.Load()
	if s == nil || s.conn.IsClosed() {
		return ErrNotConnected
	}
	if s.blocked.Load() {
		return ErrBlocked
	}
	return nil
}

// trackedConn is a socket of the publisher that leaves Publisher.sockets
// when it is closed.
type trackedConn struct {
	net.Conn
	p    *Publisher
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.p.socketsMu.Lock()
		delete(c.p.sockets, c)
		c.p.socketsMu.Unlock()
	})
	return c.Conn.Close()
}

// tracked wraps dial so that Close can cut every socket the publisher holds.
func (p *Publisher) tracked(dial func(network, addr string) (net.Conn, error)) func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		c, err := dial(network, addr)
		if err != nil {
			return nil, err
		}
		t := &trackedConn{Conn: c, p: p}
		p.socketsMu.Lock()
		p.sockets[t] = struct{}{}
		p.socketsMu.Unlock()
		if p.ctx.Err() != nil { // Close began while this dial ran
			_ = t.Close()
			return nil, ErrClosed
		}
		return t, nil
	}
}

// cutSockets closes every socket the publisher holds: blocked reads and
// writes on them fail at once.
func (p *Publisher) cutSockets() {
	p.socketsMu.Lock()
	socks := make([]net.Conn, 0, len(p.sockets))
	for c := range p.sockets {
		socks = append(socks, c)
	}
	p.socketsMu.Unlock()
	for _, c := range socks {
		_ = c.Close()
	}
}

// Close stops reconnecting and closes the connection; publishes still waiting
// fail with ErrConnectionLost. It returns within about ConfirmTimeout even on
// a stalled socket: amqp091's Close writes connection.close and waits for
// the broker's reply, which a broker that stopped reading never sends (it
// would wait for the heartbeat to fail), and the supervisor may be blocked
// reopening a channel on that socket. Past the bound the sockets are cut.
func (p *Publisher) Close() error {
	p.cancel()
	closed := make(chan error, 1)
	go func() {
		var err error
		// The supervisor stores a session it reconnected only while ctx
		// lives; after cancel the one here is the last.
		if s := p.sess.Swap(nil); s != nil {
			p.metrics.connectedNow(nil)
			if cerr := s.conn.Close(); cerr != nil && !errors.Is(cerr, amqp.ErrClosed) {
				err = fmt.Errorf("close amqp connection: %w", cerr)
			}
		}
		<-p.done
		closed <- err
	}()
	t := time.NewTimer(p.cfg.ConfirmTimeout)
	defer t.Stop()
	select {
	case err := <-closed:
		p.cutSockets() // a session the supervisor was still opening
		return err
	case <-t.C:
	}
	p.cutSockets()
	// Every socket operation now fails at once; the supervisor's back-off
	// ends with ctx, a dial in progress closes what it gets.
	<-closed
	return fmt.Errorf("close amqp connection: no reply within %s; sockets cut", p.cfg.ConfirmTimeout)
}

// Publish sends o (persistent, mandatory, MessageId = order id) and returns nil
// only once the broker acked it without returning it. It returns an error on a
// nack, a return, ctx's deadline or the publisher's confirm timeout, a lost
// connection, or when no connection is up (it does not wait for a reconnect).
func (p *Publisher) Publish(ctx context.Context, o ordermsg.Order) error {
	body, err := o.Encode()
	if err != nil {
		return fmt.Errorf("publish %s: encode: %w", o.OrderID, err)
	}
	start := time.Now()
	err = p.publish(ctx, o.OrderID, "", body)
	p.metrics.outcome(err, time.Since(start))
	if err != nil {
		return fmt.Errorf("publish %s: %w", o.OrderID, err)
	}
	return nil
}

// PublishBatch sends orders (of one activity) as one message, an
// ordermsg.Batch, and returns nil only once the broker acked it without
// returning it: every order it carries is then queued; any error is the
// error of each of them (as Publish's for one order). Its MessageId is
// BatchMessageID: not an order's id, so that a keyed replay publishing one
// of its orders alone meanwhile (a harmless copy) does not fail the batch
// with ErrDuplicate.
func (p *Publisher) PublishBatch(ctx context.Context, orders []ordermsg.Order) error {
	if len(orders) == 0 {
		return nil
	}
	body, err := ordermsg.Batch{Orders: orders}.Encode()
	if err != nil {
		return fmt.Errorf("publish a batch of %d orders: encode: %w", len(orders), err)
	}
	start := time.Now()
	err = p.publish(ctx, BatchMessageID(orders), "", body)
	p.metrics.outcome(err, time.Since(start))
	if err != nil {
		return fmt.Errorf("publish a batch of %d orders (%s...): %w", len(orders), orders[0].OrderID, err)
	}
	return nil
}

// BatchMessageID is the MessageId of the batch message carrying orders:
// "batch-" and its first order's id.
func BatchMessageID(orders []ordermsg.Order) string { return "batch-" + orders[0].OrderID }

// PublishMarker sends the drain marker m to every partition of the order
// queue, one copy each (type ordermsg.MarkerType, Partition and Partitions
// set), like an order, and returns nil once the broker confirmed every copy:
// the orders queued before the loss may be in any partition, and each
// partition's consumers must pass its copy (see ordermsg.Marker). A copy
// sent twice is harmless.
func (p *Publisher) PublishMarker(ctx context.Context, m ordermsg.Marker) error {
	t := p.cfg.Topology
	m.Partitions, m.Round, m.Copy = max(1, t.Partitions), "", ""
	for i := range m.Partitions {
		m.Partition = i
		body, err := m.Encode()
		if err != nil {
			return fmt.Errorf("publish marker: encode: %w", err)
		}
		if err := p.publishTo(ctx, m.MessageID(), ordermsg.MarkerType, t.PartitionKey(i), body); err != nil {
			return fmt.Errorf("publish marker %s: %w", m.MessageID(), err)
		}
	}
	return nil
}

func (p *Publisher) publish(ctx context.Context, id, typ string, body []byte) error {
	return p.publishTo(ctx, id, typ, p.cfg.Topology.PartitionKey(p.cfg.Topology.Partition(id)), body)
}

// publishTo publishes to the partition bound by routing key key.
func (p *Publisher) publishTo(ctx context.Context, id, typ, key string, body []byte) error {
	if p.ctx.Err() != nil {
		return ErrClosed
	}
	s := p.sess.Load()
	if s == nil {
		return ErrNotConnected
	}
	if s.blocked.Load() {
		return ErrBlocked
	}
	pc := p.pick(s)
	if pc == nil {
		return ErrNotConnected
	}
	if !pc.Track(id) {
		return ErrDuplicate
	}

	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
	defer cancel()
	// amqp091 looks at ctx only before the frame is written, and the
	// channel's publishes share one lock: under flow control (the broker
	// stops reading the socket) or on a stalled connection the write blocks
	// and every publish queues behind it, far beyond any timeout. The write
	// runs on its own goroutine so that the wait is bounded by ctx; at most
	// maxStalledWrites of them may be stuck at once.
	select {
	case p.writes <- struct{}{}:
	default:
		pc.Forget(id)
		return fmt.Errorf("%w: %d publishes stuck in the socket write", ErrBlocked, cap(p.writes))
	}
	type written struct {
		dc  *amqp.DeferredConfirmation
		err error
	}
	wrote := make(chan written, 1)
	go func() {
		dc, err := pc.Publish(ctx, p.cfg.Topology.Exchange, key,
			amqp.Publishing{
				ContentType:  ordermsg.ContentType,
				DeliveryMode: amqp.Persistent,
				MessageId:    id,
				Type:         typ,
				Timestamp:    time.Now(),
				Body:         body,
			})
		<-p.writes
		wrote <- written{dc, err}
	}()
	var dc *amqp.DeferredConfirmation
	var err error
	select {
	case w := <-wrote:
		dc, err = w.dc, w.err
	case <-ctx.Done():
		// The frame may still be written later: a message whose publisher
		// gave up (MayHaveArrived: the caller records its refusal in MySQL).
		pc.Forget(id)
		return ErrConfirmTimeout
	}
	if err != nil {
		pc.Forget(id)
		if ctx.Err() != nil {
			return ErrConfirmTimeout
		}
		// The frame could not be written: the channel or connection is gone.
		return fmt.Errorf("%w: %v", ErrConnectionLost, err)
	}
	if dc == nil {
		// Only a channel not in confirm mode gives no confirmation.
		pc.Forget(id)
		// The frame was written: not ErrNotConnected (MayHaveArrived).
		return errors.New("channel not in confirm mode")
	}
	select {
	case <-dc.Done():
	case <-ctx.Done():
		pc.Forget(id)
		return ErrConfirmTimeout
	}
	acked := dc.Acked()
	// RabbitMQ sends basic.return before the basic.ack of the same message, and
	// amqp091 dispatches both on one goroutine, so the return is in the buffer
	// by now; drain under mu, then look at our entry.
	_, returned := pc.Done(id)
	switch {
	case returned:
		// The broker serves; the message could not be routed.
		return ErrReturned
	case acked:
		pc.nacks.Store(0)
		pc.acked.Store(true)
		return nil
	case pc.IsClosed():
		// A closing channel nacks every outstanding confirmation.
		return ErrConnectionLost
	}
	p.nacks.Add(1)
	if pc.nacks.Add(1) == int32(p.cfg.NackLimit) {
		select {
		case s.retire <- pc:
		default: // the supervisor is behind by 4×Channels: it is reconnecting
		}
	}
	return ErrNacked
}

// outstanding counts the publishes waiting for their confirm.
func (p *Publisher) outstanding() int {
	s := p.sess.Load()
	if s == nil {
		return 0
	}
	n := 0
	for i := range s.chans {
		pc := s.chans[i].Load()
		n += pc.Pending()
	}
	return n
}

// pick returns an open channel of s, round robin. A channel that reached
// NackLimit is skipped: it is being replaced, and a publish sent there would
// only be nacked (when no other is left, the publish fails unwritten).
func (p *Publisher) pick(s *session) *pubChannel {
	n := uint64(len(s.chans))
	start := p.rr.Add(1)
	for i := uint64(0); i < n; i++ {
		pc := s.chans[(start+i)%n].Load()
		if !pc.IsClosed() && pc.nacks.Load() < int32(p.cfg.NackLimit) {
			return pc
		}
	}
	return nil
}
