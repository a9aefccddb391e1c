// Package faultnet is a TCP fault proxy for tests: it forwards connections to
// a target and, on the way, delays chunks in either direction, drops a reply
// (the request reached the server, the answer never comes back), cuts
// connections, or holds one connection's traffic while the others pass (so a
// later call overtakes an earlier one). Faults are random at given rates
// (load tests) or one-shot rules matched on the bytes (tests that force one
// interleaving).
//
// A "chunk" is what one read from a socket returned: for Redis, one command or
// one reply (or a pipeline of them) in practice.
package faultnet

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Dir is a direction of traffic.
type Dir int

// Directions: Up is client → server (requests), Down is server → client
// (replies).
const (
	Up Dir = iota
	Down
)

func (d Dir) String() string {
	if d == Up {
		return "up"
	}
	return "down"
}

// Flow is the random faults of one direction. Rates are per chunk, in 0..1.
type Flow struct {
	// DelayRate of the chunks are held for Delay before they are forwarded
	// (later chunks of the same connection wait behind them, as on a slow
	// link; other connections pass).
	DelayRate float64
	Delay     time.Duration
	// CutRate of the chunks are discarded and their connection closed. Up:
	// the request never reaches the server. Down: the server ran the request
	// and its reply is lost.
	CutRate float64
}

// Faults are the random faults of both directions.
type Faults struct {
	Up, Down Flow
}

// Rule is a one-shot fault: it fires on the first chunk of its direction that
// Match accepts (nil: any chunk), once.
type Rule struct {
	Dir   Dir
	Match func(chunk []byte) bool
	// Exactly one of:
	Cut   bool            // discard the chunk and close its connection
	Hold  <-chan struct{} // forward the chunk once Hold is closed; other connections pass meanwhile
	Delay time.Duration   // forward the chunk after Delay
}

// Contains is a Match for chunks that contain s.
func Contains(s string) func([]byte) bool {
	b := []byte(s)
	return func(chunk []byte) bool { return bytes.Contains(chunk, b) }
}

// Stats counts what the proxy did.
type Stats struct {
	Conns, Chunks, Delayed, Cut, Held int64
}

// Proxy forwards TCP connections to one target with faults.
type Proxy struct {
	ln net.Listener

	mu     sync.Mutex
	target string
	faults Faults
	rules  []*rule
	conns  map[*link]struct{}
	closed bool

	accepted, chunks, delayed, cut, held atomic.Int64
	wg                                   sync.WaitGroup
}

type rule struct {
	Rule
	fired chan struct{}
}

// Listen starts a proxy on addr ("127.0.0.1:0" for any free port) to target.
func Listen(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetTarget sends the connections accepted from now on to target (those
// open stay where they are), as a TCP load balancer that moved on from a
// failed server.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Set replaces the random faults; the zero Faults forwards faithfully.
func (p *Proxy) Set(f Faults) {
	p.mu.Lock()
	p.faults = f
	p.mu.Unlock()
}

// Once adds a one-shot rule; the returned channel is closed when it fired
// (for a Hold: when the chunk is being held).
func (p *Proxy) Once(r Rule) <-chan struct{} {
	x := &rule{Rule: r, fired: make(chan struct{})}
	p.mu.Lock()
	p.rules = append(p.rules, x)
	p.mu.Unlock()
	return x.fired
}

// CutAll closes every open connection (the server stays up; new connections
// are accepted).
func (p *Proxy) CutAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	return Stats{Conns: p.accepted.Load(), Chunks: p.chunks.Load(), Delayed: p.delayed.Load(),
		Cut: p.cut.Load(), Held: p.held.Load()}
}

// Close stops accepting, closes every connection and waits for the pumps.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		s, err := net.DialTimeout("tcp", target, 5*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &link{client: c, server: s, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close()
			return
		}
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.accepted.Add(1)
		p.wg.Add(2)
		go p.pump(l, Up, c, s)
		go p.pump(l, Down, s, c)
	}
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{}
	halves         atomic.Int32 // directions ended by EOF
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

// action is what happens to one chunk.
type action struct {
	cut   bool
	delay time.Duration
	hold  <-chan struct{}
	fired chan struct{}
}

func (p *Proxy) decide(d Dir, chunk []byte) action {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range p.rules {
		if r.Dir != d || (r.Match != nil && !r.Match(chunk)) {
			continue
		}
		p.rules = append(p.rules[:i:i], p.rules[i+1:]...)
		return action{cut: r.Cut, delay: r.Delay, hold: r.Hold, fired: r.fired}
	}
	f := p.faults.Up
	if d == Down {
		f = p.faults.Down
	}
	var a action
	if f.CutRate > 0 && rand.Float64() < f.CutRate {
		a.cut = true
	} else if f.DelayRate > 0 && rand.Float64() < f.DelayRate {
		a.delay = f.Delay
	}
	return a
}

func (p *Proxy) pump(l *link, d Dir, from, to net.Conn) {
	defer p.wg.Done()
	halfClosed := false
	defer func() {
		if !halfClosed || l.halves.Add(1) == 2 {
			l.close()
			p.mu.Lock()
			delete(p.conns, l)
			p.mu.Unlock()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			p.chunks.Add(1)
			a := p.decide(d, buf[:n])
			switch {
			case a.cut:
				p.cut.Add(1)
				if a.fired != nil {
					close(a.fired)
				}
				return
			case a.hold != nil:
				p.held.Add(1)
				close(a.fired)
				select {
				case <-a.hold:
				case <-l.done:
					return
				}
			case a.delay > 0:
				p.delayed.Add(1)
				if a.fired != nil {
					close(a.fired)
				}
				t := time.NewTimer(a.delay)
				select {
				case <-t.C:
				case <-l.done:
					t.Stop()
					return
				}
			default:
				if a.fired != nil {
					close(a.fired)
				}
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			// Half-close: pass the EOF on, let the other direction finish.
			if tc, ok := to.(*net.TCPConn); ok && tc.CloseWrite() == nil {
				halfClosed = true
			}
			return
		}
	}
}
