package servicetest

import (
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

// Serve runs srv on a free loopback port until the test ends (then shuts it
// down) and returns its address, host:port. wrap, when given, wraps the
// listener as the binary does (its connection bounds).
func Serve(t testing.TB, srv *fasthttp.Server, wrap ...func(net.Listener) net.Listener) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Must(t, err, "listen")
	served := ln
	for _, w := range wrap {
		served = w(served)
	}
	go func() { _ = srv.Serve(served) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}
