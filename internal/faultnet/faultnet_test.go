package faultnet_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/faultnet"
	"github.com/seckill/seckill/internal/servicetest"
)

// echo starts a line echo server.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	servicetest.Must(t, err, "listen")
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func proxy(t *testing.T, target string) *faultnet.Proxy {
	t.Helper()
	p, err := faultnet.Listen("127.0.0.1:0", target)
	servicetest.Must(t, err, "proxy")
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string) (string, error) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func TestForwardsFaithfully(t *testing.T) {
	t.Parallel()
	p := proxy(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	servicetest.Must(t, err, "dial")
	defer c.Close()
	r := bufio.NewReader(c)
	for _, line := range []string{"a", "bb", "ccc"} {
		got, err := roundTrip(t, c, r, line)
		if err != nil || got != line {
			t.Fatalf("echo %q: %q %v", line, got, err)
		}
	}
	if st := p.Stats(); st.Conns != 1 || st.Chunks < 6 || st.Cut+st.Delayed+st.Held != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestDelayEitherDirection(t *testing.T) {
	t.Parallel()
	for _, d := range []faultnet.Dir{faultnet.Up, faultnet.Down} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			p := proxy(t, echo(t))
			c, err := net.Dial("tcp", p.Addr())
			servicetest.Must(t, err, "dial")
			defer c.Close()
			r := bufio.NewReader(c)
			const delay = 150 * time.Millisecond
			fired := p.Once(faultnet.Rule{Dir: d, Match: faultnet.Contains("slow"), Delay: delay})
			start := time.Now()
			got, err := roundTrip(t, c, r, "slow")
			if err != nil || got != "slow" {
				t.Fatalf("echo: %q %v", got, err)
			}
			if el := time.Since(start); el < delay {
				t.Errorf("answered after %v, delay was %v", el, delay)
			}
			<-fired
			if st := p.Stats(); st.Delayed != 1 {
				t.Errorf("stats %+v", st)
			}
			// One shot: the next chunk passes at once (no lower bound to check;
			// it must simply arrive).
			if got, err := roundTrip(t, c, r, "slow"); err != nil || got != "slow" {
				t.Fatalf("second echo: %q %v", got, err)
			}
		})
	}
}

// TestDropReply: the server ran the command, the client never hears of it.
func TestDropReply(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.RedisNode(t)
	p := proxy(t, rdb.Options().Addr)
	via := redis.NewClient(&redis.Options{Addr: p.Addr(), DB: rdb.Options().DB, MaxRetries: -1})
	defer via.Close()
	ctx := context.Background()
	key := prefix + "n"
	servicetest.Must(t, via.Ping(ctx).Err(), "ping") // handshake done: the next reply is INCR's
	fired := p.Once(faultnet.Rule{Dir: faultnet.Down, Match: faultnet.Contains(":1\r\n"), Cut: true})
	if err := via.Incr(ctx, key).Err(); err == nil {
		t.Fatal("INCR answered although its reply was dropped")
	}
	<-fired
	if n, err := rdb.Get(ctx, key).Int(); err != nil || n != 1 {
		t.Fatalf("after the dropped reply the counter is %d (%v), want 1: the command ran", n, err)
	}
	// The client reconnects through the proxy and goes on.
	if n, err := via.Incr(ctx, key).Result(); err != nil || n != 2 {
		t.Fatalf("next INCR: %d %v", n, err)
	}
}

// TestCutRequest: the request never reaches the server.
func TestCutRequest(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.RedisNode(t)
	p := proxy(t, rdb.Options().Addr)
	via := redis.NewClient(&redis.Options{Addr: p.Addr(), DB: rdb.Options().DB, MaxRetries: -1})
	defer via.Close()
	ctx := context.Background()
	key := prefix + "n"
	servicetest.Must(t, via.Ping(ctx).Err(), "ping")
	p.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains(key), Cut: true})
	if err := via.Incr(ctx, key).Err(); err == nil {
		t.Fatal("INCR answered although it was cut")
	}
	if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("the cut INCR ran: exists=%d %v", n, err)
	}
}

// TestHoldReorders: a command held on one connection is overtaken by a
// later command on another, and runs once released.
func TestHoldReorders(t *testing.T) {
	t.Parallel()
	rdb, prefix := servicetest.RedisNode(t)
	p := proxy(t, rdb.Options().Addr)
	ctx := context.Background()
	list := prefix + "order"
	first := redis.NewClient(&redis.Options{Addr: p.Addr(), DB: rdb.Options().DB, MaxRetries: -1, PoolSize: 1})
	second := redis.NewClient(&redis.Options{Addr: p.Addr(), DB: rdb.Options().DB, MaxRetries: -1, PoolSize: 1})
	defer first.Close()
	defer second.Close()
	release := make(chan struct{})
	held := p.Once(faultnet.Rule{Dir: faultnet.Up, Match: faultnet.Contains("early"), Hold: release})
	done := make(chan error, 1)
	go func() { done <- first.RPush(ctx, list, "early").Err() }()
	<-held
	servicetest.Must(t, second.RPush(ctx, list, "late").Err(), "late push")
	select {
	case err := <-done:
		t.Fatalf("held command answered before its release: %v", err)
	default:
	}
	close(release)
	servicetest.Must(t, <-done, "early push")
	got, err := rdb.LRange(ctx, list, 0, -1).Result()
	servicetest.Must(t, err, "lrange")
	if len(got) != 2 || got[0] != "late" || got[1] != "early" {
		t.Fatalf("server saw %v, want [late early]", got)
	}
	if st := p.Stats(); st.Held != 1 || st.Conns != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestRandomRates(t *testing.T) {
	t.Parallel()
	p := proxy(t, echo(t))
	p.Set(faultnet.Faults{Down: faultnet.Flow{CutRate: 1}})
	for range 3 {
		c, err := net.Dial("tcp", p.Addr())
		servicetest.Must(t, err, "dial")
		_, err = roundTrip(t, c, bufio.NewReader(c), "x")
		_ = c.Close()
		if err == nil {
			t.Fatal("a reply passed at CutRate 1")
		}
	}
	p.Set(faultnet.Faults{Up: faultnet.Flow{DelayRate: 1, Delay: time.Millisecond}})
	c, err := net.Dial("tcp", p.Addr())
	servicetest.Must(t, err, "dial")
	defer c.Close()
	r := bufio.NewReader(c)
	for range 5 {
		if got, err := roundTrip(t, c, r, "y"); err != nil || got != "y" {
			t.Fatalf("delayed echo: %q %v", got, err)
		}
	}
	if st := p.Stats(); st.Cut != 3 || st.Delayed != 5 {
		t.Errorf("stats %+v, want 3 cut and 5 delayed", st)
	}
}

func TestCutAllAndClose(t *testing.T) {
	t.Parallel()
	p := proxy(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	servicetest.Must(t, err, "dial")
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := roundTrip(t, c, r, "a"); err != nil {
		t.Fatal(err)
	}
	p.CutAll()
	if _, err := roundTrip(t, c, r, "b"); err == nil {
		t.Fatal("connection survived CutAll")
	}
	c2, err := net.Dial("tcp", p.Addr())
	servicetest.Must(t, err, "dial after CutAll")
	defer c2.Close()
	if got, err := roundTrip(t, c2, bufio.NewReader(c2), "c"); err != nil || got != "c" {
		t.Fatalf("new connection after CutAll: %q %v", got, err)
	}
	servicetest.Must(t, p.Close(), "close")
	if c3, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		_ = c3.Close()
		t.Error("proxy accepts after Close")
	}
}
