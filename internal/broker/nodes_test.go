package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/servicetest"
)

// otherName is the shared broker's URL under another host name (127.0.0.1
// and localhost): a second address of the same node, so that a test can
// tell which one a client uses and fault one only.
func otherName(t *testing.T) (string, string) {
	t.Helper()
	u, err := url.Parse(servicetest.AMQPURL())
	servicetest.Must(t, err, "parse AMQP URL")
	first := u.String()
	switch u.Hostname() {
	case "127.0.0.1":
		u.Host = strings.Replace(u.Host, "127.0.0.1", "localhost", 1)
	case "localhost":
		u.Host = strings.Replace(u.Host, "localhost", "127.0.0.1", 1)
	default:
		t.Skipf("the broker's host %q has no second name here", u.Hostname())
	}
	return first, u.String()
}

// deadURL is an AMQP URL where nothing listens.
func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	servicetest.Must(t, err, "listen")
	addr := l.Addr().String()
	_ = l.Close()
	return "amqp://guest:guest@" + addr + "/"
}

func TestNodesConnectMovesOn(t *testing.T) {
	good, other := otherName(t)
	dead := deadURL(t)
	n, err := NewNodes([]string{dead, good, other})
	servicetest.Must(t, err, "nodes")
	cfg := amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)}

	// A node that refuses the connection: the next one.
	conn, addr, err := n.Connect(cfg, nil)
	servicetest.Must(t, err, "connect past a dead node")
	_ = conn.Close()
	if addr != Addr(good) {
		t.Fatalf("connected to %s, want %s (the first live node)", addr, Addr(good))
	}
	// The next connection begins after the node of the previous one.
	conn, addr, err = n.Connect(cfg, nil)
	servicetest.Must(t, err, "connect again")
	_ = conn.Close()
	if addr != Addr(other) {
		t.Fatalf("reconnected to %s, want %s (the node after the last one used)", addr, Addr(other))
	}
	// A node that accepts but cannot serve (setup fails): the next one,
	// past the dead one.
	var tried []string
	conn, addr, err = n.Connect(cfg, func(c *amqp.Connection) error {
		a := c.RemoteAddr().String()
		tried = append(tried, a)
		if len(tried) == 1 {
			return errors.New("declare refused")
		}
		return nil
	})
	servicetest.Must(t, err, "connect past a node that cannot serve")
	_ = conn.Close()
	if len(tried) != 2 || addr != Addr(other) {
		t.Fatalf("tried %v, ended on %s; want a refused node, then %s", tried, addr, Addr(other))
	}
	// Every node failing: one error naming each.
	_, _, err = n.Connect(cfg, func(*amqp.Connection) error { return errors.New("declare refused") })
	if err == nil || !strings.Contains(err.Error(), Addr(dead)) || !strings.Contains(err.Error(), Addr(good)) {
		t.Fatalf("all nodes failing: %v, want an error naming each node", err)
	}
}

func TestNewNodesNeedsAnAddress(t *testing.T) {
	if _, err := NewNodes(nil); err == nil {
		t.Fatal("no address accepted")
	}
	if _, err := ParseNodes("amqp://h:1/,"); err == nil || !strings.Contains(err.Error(), "rabbitmq url") {
		t.Fatalf("bad list: %v", err)
	}
}

// nackKey replaces the routing key "order" (the key of partition 0) in the
// basic.publish frames of poisoned channels: bound to a queue that rejects
// every publish (x-max-length 0, reject-publish), it makes the broker nack
// those publishes, and nothing of them is kept anywhere. Same length, so
// the frame's size is unchanged.
const nackKey = "nackd"

// nackConn rewrites the basic.publish frames the client writes on
// channels poison picks: a channel refused by the broker until it is
// reopened (a new channel number), or a connection refused on every
// channel.
type nackConn struct {
	net.Conn
	poison func(channel uint16) bool
	seen   *atomic.Uint32 // the highest channel number that published

	mu  sync.Mutex
	buf []byte
}

func (c *nackConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, b...)
	n := 0
	for {
		rest := c.buf[n:]
		if len(rest) >= 8 && string(rest[:4]) == "AMQP" { // the protocol header
			n += 8
			continue
		}
		if len(rest) < 7 {
			break
		}
		size := int(binary.BigEndian.Uint32(rest[3:7]))
		if len(rest) < 7+size+1 {
			break // the rest comes with the next write of the same flush
		}
		payload := rest[7 : 7+size]
		channel := binary.BigEndian.Uint16(rest[1:3])
		if rest[0] == 1 && size >= 4 && binary.BigEndian.Uint16(payload[0:2]) == 60 && binary.BigEndian.Uint16(payload[2:4]) == 40 {
			// basic.publish: reserved short, exchange shortstr, routing-key shortstr.
			for {
				old := c.seen.Load()
				if uint32(channel) <= old || c.seen.CompareAndSwap(old, uint32(channel)) {
					break
				}
			}
			ex := int(payload[6])
			at := 7 + ex
			if c.poison(channel) && at < len(payload) && int(payload[at]) == 5 && string(payload[at+1:at+6]) == "order" {
				copy(payload[at+1:at+6], nackKey)
			}
		}
		n += 7 + size + 1
	}
	if n > 0 {
		if _, err := c.Conn.Write(c.buf[:n]); err != nil {
			return 0, err
		}
		c.buf = append(c.buf[:0], c.buf[n:]...)
	}
	return len(b), nil
}

type stormFixture struct {
	pub   *Publisher
	met   *PublisherMetrics
	cfg   PublisherConfig
	ch    *amqp.Channel
	dials atomic.Int32
	seen  atomic.Uint32
	// below: channels numbered up to it are poisoned on connections to
	// poisonAddr (all of them when below is 65535).
	below      atomic.Uint32
	poisonAddr string
}

func newStormFixture(t *testing.T, urls []string, poisonAddr string) *stormFixture {
	t.Helper()
	f := &stormFixture{poisonAddr: poisonAddr}
	prefix := servicetest.AMQPPrefix(t, testQueues, testExchanges)
	rc := conf.Default().RabbitMQ
	rc.URL = strings.Join(urls, ",")
	rc.Prefix = prefix
	rc.PublishChannels = 1
	rc.NackLimit = 3
	rc.ReconnectMin = conf.D(20 * time.Millisecond)
	rc.ReconnectMax = conf.D(200 * time.Millisecond)
	f.cfg = PublisherConfigFrom(rc, "test-"+prefix)
	f.cfg.Dial = func(network, addr string) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, 5*time.Second)
		if err != nil {
			return nil, err
		}
		f.dials.Add(1)
		return &nackConn{Conn: c, seen: &f.seen, poison: func(ch uint16) bool {
			return addr == f.poisonAddr && uint32(ch) <= f.below.Load()
		}}, nil
	}
	f.met = NewPublisherMetrics(prometheus.NewRegistry(), "test")
	pub, err := NewPublisher(context.Background(), f.cfg, slog.New(slog.DiscardHandler), f.met)
	servicetest.Must(t, err, "new publisher")
	t.Cleanup(func() { _ = pub.Close() })
	f.pub = pub

	conn, err := amqp.Dial(servicetest.AMQPURL())
	servicetest.Must(t, err, "dial side connection")
	t.Cleanup(func() { _ = conn.Close() })
	f.ch, err = conn.Channel()
	servicetest.Must(t, err, "side channel")
	reject := prefix + ".reject"
	_, err = f.ch.QueueDeclare(reject, false, false, false, false, amqp.Table{"x-max-length": 0, "x-overflow": "reject-publish"})
	servicetest.Must(t, err, "declare rejecting queue")
	servicetest.Must(t, f.ch.QueueBind(reject, nackKey, f.cfg.Topology.Exchange, false, nil), "bind rejecting queue")
	return f
}

// publishUntilAccepted publishes until one is confirmed, counting the
// nacks on the way; any other error fails the test.
func (f *stormFixture) publishUntilAccepted(t *testing.T) (nacks, lost int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f.pub.Publish(context.Background(), order(27))
		switch {
		case err == nil:
			return nacks, lost
		case errors.Is(err, ErrNacked):
			nacks++
		case errors.Is(err, ErrConnectionLost), errors.Is(err, ErrNotConnected):
			// While a channel or the connection is replaced (nothing
			// written: the channel at its limit takes no publish).
			lost++
			time.Sleep(5 * time.Millisecond)
		default:
			t.Fatalf("publish: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no publish accepted within 20s (%d nacks, %d lost)", nacks, lost)
		}
	}
}

func (f *stormFixture) depth(t *testing.T) int {
	t.Helper()
	q, err := f.ch.QueueDeclarePassive(f.cfg.Topology.Queue, true, false, false, false, nil)
	servicetest.Must(t, err, "inspect queue")
	return q.Messages
}

// TestNackStormReopensTheChannel: a channel the broker nacks until it is
// reopened. After NackLimit consecutive nacks the publisher reopens it, on
// the same connection, and sales resume; the nacked publishes kept nothing.
// Without the recovery the loop never gets an ack (every publish nacked).
func TestNackStormReopensTheChannel(t *testing.T) {
	t.Parallel()
	first, _ := otherName(t)
	f := newStormFixture(t, []string{first}, Addr(first))
	if err := f.pub.Publish(context.Background(), order(27)); err != nil {
		t.Fatalf("publish before the storm: %v", err)
	}
	f.below.Store(f.seen.Load()) // the live channel is refused from now on
	nacks, lost := f.publishUntilAccepted(t)
	if nacks != f.cfg.NackLimit {
		t.Errorf("%d nacks before an ack, want NackLimit %d (a channel at the limit takes no more publishes)", nacks, f.cfg.NackLimit)
	}
	if got := counter(f.met.recoveries.WithLabelValues("channel")); got != 1 {
		t.Errorf("channel recoveries = %v, want 1", got)
	}
	if got := counter(f.met.recoveries.WithLabelValues("connection")); got != 0 {
		t.Errorf("connection recoveries = %v, want 0 (the channel was enough)", got)
	}
	if d := f.dials.Load(); d != 1 {
		t.Errorf("%d connections dialled, want 1", d)
	}
	if d := f.depth(t); d != 2 {
		t.Errorf("queue holds %d messages, want the 2 acked (a nacked publish keeps nothing); %d lost", d, lost)
	}
	t.Logf("storm: %d nacks, %d publishes lost in the reopen, then accepted; %s", nacks, lost, f.pub.Status())
}

// TestNackStormMovesToTheNextNode: every channel of the connection to the
// first address is nacked (a node that cannot serve). The publisher
// reopens the channel, is refused again, and reconnects to the next
// address, where sales resume.
func TestNackStormMovesToTheNextNode(t *testing.T) {
	t.Parallel()
	first, second := otherName(t)
	f := newStormFixture(t, []string{first, second}, Addr(first))
	if n := f.pub.Node(); n != Addr(first) {
		t.Fatalf("publisher on %s, want the first address %s", n, Addr(first))
	}
	if err := f.pub.Publish(context.Background(), order(27)); err != nil {
		t.Fatalf("publish before the storm: %v", err)
	}
	f.below.Store(65535) // every channel of the first address
	nacks, lost := f.publishUntilAccepted(t)
	if nacks != 2*f.cfg.NackLimit {
		t.Errorf("%d nacks before an ack, want 2×NackLimit (the channel, then its replacement)", nacks)
	}
	if got := counter(f.met.recoveries.WithLabelValues("connection")); got != 1 {
		t.Errorf("connection recoveries = %v, want 1", got)
	}
	if n := f.pub.Node(); n != Addr(second) {
		t.Errorf("publisher on %s after the storm, want %s", n, Addr(second))
	}
	if d := f.depth(t); d != 2 {
		t.Errorf("queue holds %d messages, want the 2 acked; %d lost", d, lost)
	}
	if s := f.pub.Status(); !strings.Contains(s, "node "+Addr(second)) || !strings.Contains(s, "connects 2") {
		t.Errorf("status %q, want the second node and 2 connects", s)
	}
	t.Logf("storm: %d nacks, %d publishes refused during the reconnect, then accepted on %s", nacks, lost, f.pub.Node())
}
