package servicetest

import (
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// silent is a listener that accepts connections and never answers: a
// service "up" on its port but not answering.
func silent(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Must(t, err, "listen")
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// A service that accepts and does not answer is a failed precondition
// within seconds (skipped here, failed under CI), named in the message: the
// test's own -timeout must never be what reports it.
func TestUnansweredServiceFailsInSeconds(t *testing.T) {
	const bound = 15 * time.Second
	for _, s := range []struct {
		name, env, url string
		use            func(t testing.TB)
	}{
		{"redis", EnvRedisURL, "redis://%s/0", func(t testing.TB) { Redis(t) }},
		{"mysql", EnvMySQLDSN, "root@tcp(%s)/", func(t testing.TB) { MySQLDSN(t) }},
		{"rabbitmq", EnvAMQPURL, "amqp://guest:guest@%s/", func(t testing.TB) { AMQPPrefix(t, nil, nil) }},
	} {
		t.Run(s.name, func(t *testing.T) {
			addr := silent(t)
			t.Setenv(s.env, fmt.Sprintf(s.url, addr))
			t.Setenv("CI", "")
			t0 := time.Now()
			var skipped bool
			var msg string
			done := make(chan struct{})
			// A goroutine of its own, so that Skip ends only it.
			go func() {
				defer close(done)
				inner := &recorder{TB: t}
				defer func() { skipped, msg = inner.skipped, inner.msg }()
				s.use(inner)
			}()
			select {
			case <-done:
			case <-time.After(bound + 30*time.Second):
				t.Fatalf("%s: no answer after %v", s.name, bound+30*time.Second)
			}
			took := time.Since(t0)
			t.Logf("%s: %v after %v", s.name, msg, took)
			if !skipped || !strings.Contains(msg, s.name+" at "+addr+" unavailable") {
				t.Errorf("%s: skipped %v, message %q; want the service and its address named", s.name, skipped, msg)
			}
			if took > bound {
				t.Errorf("%s: %v to give up, want within %v", s.name, took, bound)
			}
		})
	}
}

// recorder is t for a goroutine of the test's: a skip or a fatal error ends
// that goroutine only, noting the message.
type recorder struct {
	testing.TB
	skipped bool
	msg     string
}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = "fatal: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}
