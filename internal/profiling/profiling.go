// Package profiling serves net/http/pprof on an opt-in loopback listener.
package profiling

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"
)

// EnvListen names the opt-in profiling listener (host:port) of the
// process; unset, nothing listens. It serves net/http/pprof under
// /debug/pprof/ and is meant for loopback only: profiles reveal internals.
const EnvListen = "SECKILL_PPROF_LISTEN"

// Start serves net/http/pprof on $SECKILL_PPROF_LISTEN when set. The
// returned stop closes the listener; it is a no-op when nothing listens.
func Start(log *slog.Logger) (stop func(), err error) {
	addr := os.Getenv(EnvListen)
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvListen, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("pprof listening", "addr", ln.Addr().String(), "env", EnvListen)
	return func() { _ = srv.Close() }, nil
}
