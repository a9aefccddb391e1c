package edge

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/servicetest"
)

func killRedis(t *testing.T, addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	_ = rdb.Shutdown(context.Background()).Err()
}

func pauseRedis(t *testing.T, addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	servicetest.Must(t, rdb.Do(context.Background(), "CLIENT", "PAUSE", "30000", "ALL").Err(), "client pause")
	t.Cleanup(func() {
		r := redis.NewClient(&redis.Options{Addr: addr})
		_ = r.Do(context.Background(), "CLIENT", "UNPAUSE").Err()
		_ = r.Close()
	})
}

// slowProxy forwards TCP to addr, holding every chunk from the server for d.
func slowProxy(t *testing.T, addr string, d time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	servicetest.Must(t, err, "listen")
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						time.Sleep(d)
						if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}
