package servicetest

import (
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

// Serve runs srv on a free loopback port until the test ends (then shuts it
// down) and returns its address, host:port.
func Serve(t testing.TB, srv *fasthttp.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Must(t, err, "listen")
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}
