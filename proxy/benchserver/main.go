// Command benchserver is the other half of `make bench-proxy`: a trivial
// upstream (-mode upstream), a bare fasthttp pass-through without limits
// (-mode passthrough), the baselines the proxy is measured against, and a
// crowd (-mode crowd): many clients, each its own source address on
// 127.0.0.0/8 with one keep-alive connection, which wrk cannot do, split
// over one or more targets (-target a,b: several proxy instances).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

func main() {
	mode := flag.String("mode", "upstream", "upstream, passthrough or crowd")
	listen := flag.String("listen", "127.0.0.1:0", "listen address")
	target := flag.String("target", "", "passthrough: host:port to send to; crowd: host:port[,host:port...] (client i to the i-th modulo their number)")
	clients := flag.Int("clients", 10000, "crowd: distinct source addresses, one connection each")
	duration := flag.Duration("duration", 5*time.Second, "crowd: how long to send")
	flag.Parse()
	if *mode == "crowd" {
		if err := crowd(strings.Split(*target, ","), *clients, *duration, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "benchserver:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*mode, *listen, *target); err != nil {
		fmt.Fprintln(os.Stderr, "benchserver:", err)
		os.Exit(1)
	}
}

func run(mode, listen, target string) error {
	var h fasthttp.RequestHandler
	switch mode {
	case "upstream":
		body := []byte(`{"ok":true}`)
		h = func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("application/json")
			ctx.SetBody(body)
		}
	case "passthrough":
		hc := &fasthttp.HostClient{Addr: target, MaxConns: 4096, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
		h = func(ctx *fasthttp.RequestCtx) {
			if err := hc.Do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Error("bad gateway", fasthttp.StatusBadGateway)
			}
		}
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	s := &fasthttp.Server{Handler: h, NoDefaultDate: true, NoDefaultServerHeader: true}
	return s.ListenAndServe(listen)
}
