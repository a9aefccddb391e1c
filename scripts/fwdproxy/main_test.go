package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

func TestAllowed(t *testing.T) {
	p := newProxy([]string{"deb.debian.org", ".golang.org", " "}, slog.New(slog.DiscardHandler))
	for host, want := range map[string]bool{
		"deb.debian.org":      true,
		"DEB.debian.org.":     true,
		"proxy.golang.org":    true,
		"golang.org":          false,
		"evil-debian.org":     false,
		"deb.debian.org.evil": false,
		"":                    false,
	} {
		if got := p.allowed(host); got != want {
			t.Errorf("allowed(%q) = %v, want %v", host, got, want)
		}
	}
}

// Plain http:// requests in absolute form are forwarded to an allowed host
// and refused (403, nothing sent) for any other.
func TestForwardsOnlyAllowedHosts(t *testing.T) {
	hits := 0
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		_, _ = io.WriteString(w, "pkg:"+r.URL.Path)
	}))
	defer up.Close()
	upURL, _ := url.Parse(up.URL)
	_, port, _ := net.SplitHostPort(upURL.Host)

	p := newProxy([]string{"mirror.test"}, slog.New(slog.DiscardHandler))
	// Resolve the allowed name to the test upstream; anything else fails.
	p.transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr != "mirror.test:"+port {
			t.Errorf("dialed %s", addr)
		}
		return (&net.Dialer{}).DialContext(ctx, network, upURL.Host)
	}
	front := httptest.NewServer(p)
	defer front.Close()
	frontURL, _ := url.Parse(front.URL)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(frontURL)}}

	resp, err := c.Get("http://mirror.test:" + port + "/debian/dists")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "pkg:/debian/dists" {
		t.Fatalf("allowed host: %d %q", resp.StatusCode, body)
	}
	resp, err = c.Get("http://other.test/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("other host: %d, want 403", resp.StatusCode)
	}
	if hits != 1 {
		t.Fatalf("upstream saw %d requests, want 1", hits)
	}
}

// CONNECT tunnels bytes both ways to an allowed host:443 and is refused for
// another host or port.
func TestConnectTunnel(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p := newProxy([]string{"proxy.golang.org"}, slog.New(slog.DiscardHandler))
	p.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr != "proxy.golang.org:443" {
			t.Errorf("dialed %s", addr)
		}
		return (&net.Dialer{}).DialContext(ctx, network, echo.Addr().String())
	}
	front := httptest.NewServer(p)
	defer front.Close()
	addr := strings.TrimPrefix(front.URL, "http://")

	connect := func(target string) (net.Conn, *bufio.Reader, int) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		return c, br, resp.StatusCode
	}
	c, br, code := connect("proxy.golang.org:443")
	if code != 200 {
		t.Fatalf("CONNECT allowed: %d", code)
	}
	_, _ = io.WriteString(c, "hello")
	got := make([]byte, 5)
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "hello" {
		t.Fatalf("tunnel echo: %q %v", got, err)
	}
	c.Close()
	for _, target := range []string{"example.org:443", "proxy.golang.org:22"} {
		c, _, code := connect(target)
		c.Close()
		if code == 200 {
			t.Errorf("CONNECT %s was allowed", target)
		}
	}
}
