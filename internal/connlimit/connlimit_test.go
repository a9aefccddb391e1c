package connlimit

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// A connection beyond the bound is answered and closed; closing a held one
// frees its slot, and a connection closed twice frees it once.
func TestListenBoundsAndFrees(t *testing.T) {
	t.Parallel()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listen(inner, Config{Max: 1, Busy: Answer{Status: 503, ContentType: "application/json", Body: []byte(`{"code":"unavailable"}`), RetryAfter: 2}})
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	held := dial()
	defer held.Close()
	first := <-accepted
	refused := dial()
	_ = refused.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(refused)
	refused.Close()
	want := "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 2\r\nContent-Length: 22\r\nConnection: close\r\n\r\n{\"code\":\"unavailable\"}"
	if string(b) != want {
		t.Fatalf("refused connection got %q, want %q", b, want)
	}
	_ = first.Close()
	_ = first.Close() // a second close frees nothing more
	next := dial()
	defer next.Close()
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the slot of a closed connection was not freed")
	}
	again := dial()
	defer again.Close()
	_ = again.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, _ := io.ReadAll(again); !strings.HasPrefix(string(b), "HTTP/1.1 503") {
		t.Fatalf("a third connection while one is held: %q (the double close freed two slots?)", b)
	}
}
