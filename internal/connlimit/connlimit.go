// Package connlimit bounds the connections a server holds, in all and per
// client address, in front of fasthttp. fasthttp's own Server.Concurrency
// and MaxConnsPerIP refuse with a fixed text/plain answer and no
// Retry-After, and v1.78 has no hook to change it; the listener here
// refuses first, with the server's own error body and Retry-After, so that
// a client told to back off is told so like everywhere else in the API.
package connlimit

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// Answer is the HTTP answer a refused connection gets before it is closed.
type Answer struct {
	Status      int
	ContentType string
	Body        []byte
	RetryAfter  int // seconds
}

// Config bounds a listener.
type Config struct {
	// Max bounds the connections held at once (≥ 1).
	Max int
	// PerIP bounds the connections of one client address (0: no bound).
	PerIP int
	// Busy answers a connection beyond Max, PerIPExceeded one beyond PerIP.
	Busy, PerIPExceeded Answer
	// Refused, when set, is called with "busy" or "per_ip" for each refusal.
	Refused func(reason string)
}

// maxRefusing bounds the refused connections being answered at once; beyond
// it a refused connection is closed without an answer (a flood).
const maxRefusing = 256

// refuseTimeout bounds the answer to a refused connection and the wait for
// the client to finish sending (closing with unread bytes would reset the
// connection, and the client could lose the answer).
const refuseTimeout = time.Second

// Listen wraps ln.
func Listen(ln net.Listener, cfg Config) net.Listener {
	if cfg.Max < 1 {
		cfg.Max = 1
	}
	return &listener{Listener: ln, cfg: cfg, byIP: map[string]int{},
		busy: render(cfg.Busy), perIP: render(cfg.PerIPExceeded), refusing: make(chan struct{}, maxRefusing)}
}

func render(a Answer) []byte {
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nRetry-After: %d\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		a.Status, statusText(a.Status), a.ContentType, max(a.RetryAfter, 1), len(a.Body), a.Body)
}

func statusText(code int) string {
	switch code {
	case 429:
		return "Too Many Requests"
	case 503:
		return "Service Unavailable"
	}
	return strconv.Itoa(code)
}

type listener struct {
	net.Listener
	cfg         Config
	busy, perIP []byte
	refusing    chan struct{}

	mu   sync.Mutex
	open int
	byIP map[string]int
}

// Accept returns the next connection within the bounds; the others are
// answered and closed on the side.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := hostOf(c.RemoteAddr())
		l.mu.Lock()
		switch {
		case l.open >= l.cfg.Max:
			l.mu.Unlock()
			l.refuse(c, l.busy, "busy")
			continue
		case l.cfg.PerIP > 0 && l.byIP[ip] >= l.cfg.PerIP:
			l.mu.Unlock()
			l.refuse(c, l.perIP, "per_ip")
			continue
		}
		l.open++
		if l.cfg.PerIP > 0 {
			l.byIP[ip]++
		}
		l.mu.Unlock()
		return &conn{Conn: c, l: l, ip: ip}, nil
	}
}

func (l *listener) release(ip string) {
	l.mu.Lock()
	l.open--
	if l.cfg.PerIP > 0 {
		if l.byIP[ip]--; l.byIP[ip] <= 0 {
			delete(l.byIP, ip)
		}
	}
	l.mu.Unlock()
}

func (l *listener) refuse(c net.Conn, answer []byte, reason string) {
	if l.cfg.Refused != nil {
		l.cfg.Refused(reason)
	}
	select {
	case l.refusing <- struct{}{}:
	default:
		_ = c.Close()
		return
	}
	go func() {
		defer func() { <-l.refusing }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(refuseTimeout))
		if _, err := c.Write(answer); err != nil {
			return
		}
		// Half-close, then read what the client still sends until it
		// closes: the answer is delivered before the connection goes.
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		buf := make([]byte, 4096)
		for range 16 {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	}()
}

func hostOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// conn gives its slot back once, when closed.
type conn struct {
	net.Conn
	l    *listener
	ip   string
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() { c.l.release(c.ip) })
	return c.Conn.Close()
}
