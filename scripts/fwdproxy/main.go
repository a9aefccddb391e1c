// Command fwdproxy is the small HTTP forward proxy that scripts/fresh-check.sh
// runs on the host side of its veth pair: the throwaway Debian in its own
// network namespace has no route out, and reaches the package mirrors and the
// Go module proxy only through this process. It forwards plain HTTP requests
// in absolute form (apt) and tunnels CONNECT (HTTPS: go, curl), to the allowed
// hosts only; everything else is refused with 403.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fwdproxy:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("fwdproxy", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:3128", "host:port to listen on")
	allow := fs.String("allow", "deb.debian.org,security.debian.org,proxy.golang.org,sum.golang.org",
		"comma-separated host names that may be reached (exact, or a suffix when it starts with '.')")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	p := newProxy(strings.Split(*allow, ","), log)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	log.Info("listening", "addr", ln.Addr().String(), "allow", *allow)
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type proxy struct {
	allow     []string
	log       *slog.Logger
	transport *http.Transport
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
}

func newProxy(allow []string, log *slog.Logger) *proxy {
	d := &net.Dialer{Timeout: 30 * time.Second}
	return &proxy{
		allow: allow,
		log:   log,
		// No Proxy field: this process is the last hop.
		transport: &http.Transport{DialContext: d.DialContext, ResponseHeaderTimeout: 2 * time.Minute},
		dial:      d.DialContext,
	}
}

// allowed reports whether host (no port) may be reached.
func (p *proxy) allowed(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, a := range p.allow {
		a = strings.ToLower(strings.TrimSpace(a))
		switch {
		case a == "":
		case strings.HasPrefix(a, "."):
			if strings.HasSuffix(host, a) {
				return true
			}
		case host == a:
			return true
		}
	}
	return false
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		p.tunnel(w, r)
		return
	}
	if !r.URL.IsAbs() || r.URL.Scheme != "http" {
		http.Error(w, "fwdproxy: only absolute http:// requests and CONNECT are forwarded", http.StatusBadRequest)
		return
	}
	if !p.allowed(r.URL.Hostname()) {
		p.log.Warn("refused", "host", r.URL.Hostname())
		http.Error(w, "fwdproxy: host not allowed: "+r.URL.Hostname(), http.StatusForbidden)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	for _, h := range []string{"Proxy-Connection", "Proxy-Authorization", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade"} {
		out.Header.Del(h)
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		http.Error(w, "fwdproxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func (p *proxy) tunnel(w http.ResponseWriter, r *http.Request) {
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil || port != "443" {
		http.Error(w, "fwdproxy: CONNECT only to host:443", http.StatusBadRequest)
		return
	}
	if !p.allowed(host) {
		p.log.Warn("refused", "host", host)
		http.Error(w, "fwdproxy: host not allowed: "+host, http.StatusForbidden)
		return
	}
	up, err := p.dial(r.Context(), "tcp", r.Host)
	if err != nil {
		http.Error(w, "fwdproxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = up.Close()
		http.Error(w, "fwdproxy: cannot hijack", http.StatusInternalServerError)
		return
	}
	down, buf, err := hj.Hijack()
	if err != nil {
		_ = up.Close()
		return
	}
	if _, err := down.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		_ = up.Close()
		_ = down.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		// Bytes the client sent after the CONNECT line are already buffered.
		_, _ = io.Copy(up, buf)
		closeWrite(up)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(down, up)
		closeWrite(down)
		done <- struct{}{}
	}()
	<-done
	<-done
	_ = up.Close()
	_ = down.Close()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}
