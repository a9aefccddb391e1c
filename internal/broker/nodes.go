package broker

import (
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seckill/seckill/conf"
)

// Nodes is the list of broker addresses one client (a publisher, a
// consumer, a probe) connects to. Connect tries them in turn, beginning
// with the address after the one of its previous connection: a client
// connects again only because its connection failed or its node could not
// serve, so the next attempt goes to another node first (a node killed
// mid-sale is not dialled again until the others were tried). With one
// address it is the plain dial of before. Safe for concurrent use.
type Nodes struct {
	urls []string

	mu   sync.Mutex
	next int // index Connect tries first
}

// NewNodes returns the nodes of urls (one URL per address, as
// conf.ParseAMQPURLs gives them).
func NewNodes(urls []string) (*Nodes, error) {
	if len(urls) == 0 {
		return nil, errors.New("no broker address")
	}
	return &Nodes{urls: append([]string(nil), urls...)}, nil
}

// ParseNodes parses raw as [rabbitmq] url (one URL, or several: see
// conf.ParseAMQPURLs).
func ParseNodes(raw string) (*Nodes, error) {
	urls, err := conf.ParseAMQPURLs(raw)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq url: %w", err)
	}
	return NewNodes(urls)
}

// NodesFor returns the nodes of a validated [rabbitmq] section.
func NodesFor(c conf.RabbitMQ) (*Nodes, error) { return NewNodes(c.AMQPURLs()) }

// Len is the number of addresses.
func (n *Nodes) Len() int { return len(n.urls) }

// Addr is the host:port of url (what logs, metrics and /readyz name a
// node by: RabbitMQ does not tell a client the name of the node it
// reached).
func Addr(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "?"
	}
	return u.Host
}

// Connect dials the addresses in turn and runs setup (declares, channels)
// on each connection; it returns the first connection whose dial and setup
// both succeed, with its node's address (host:port). A node that refuses the
// connection, or accepts it but fails setup (a refused declare: a node that
// cannot serve), is closed and the next one tried, each once per call; the
// caller backs off between calls. setup may be nil.
func (n *Nodes) Connect(cfg amqp.Config, setup func(*amqp.Connection) error) (*amqp.Connection, string, error) {
	n.mu.Lock()
	start := n.next
	n.mu.Unlock()
	var errs []error
	for i := range n.urls {
		idx := (start + i) % len(n.urls)
		u := n.urls[idx]
		addr := Addr(u)
		conn, err := amqp.DialConfig(u, cfg)
		if err == nil && setup != nil {
			if err = setup(conn); err != nil {
				_ = conn.Close()
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		n.mu.Lock()
		n.next = (idx + 1) % len(n.urls)
		n.mu.Unlock()
		return conn, addr, nil
	}
	// Next time begin after the first one tried: a round that found no
	// node must not start on the same dead one again.
	n.mu.Lock()
	n.next = (start + 1) % len(n.urls)
	n.mu.Unlock()
	if len(errs) == 1 {
		return nil, "", errs[0]
	}
	return nil, "", fmt.Errorf("no broker node could be used: %w", errors.Join(errs...))
}

// Dial connects to the first address that accepts a connection (Connect
// without setup, with the library's defaults and a 5 s dial timeout).
func (n *Nodes) Dial() (*amqp.Connection, error) {
	conn, _, err := n.Connect(amqp.Config{
		Heartbeat: 10 * time.Second,
		Locale:    "en_US",
		Dial:      amqp.DefaultDial(5 * time.Second),
	}, nil)
	return conn, err
}
