package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// crowd opens one keep-alive connection from each of n source addresses
// (127.0.0.2 upwards: every 127/8 address is local on Linux) to one of
// targets (client i to targets[i%len(targets)]: a crowd split over several
// instances) and sends GET / on each in a loop for d; then prints the run's
// length, requests/s, the status breakdown and latency percentiles as
// "key value" lines.
func crowd(targets []string, n int, d time.Duration, out io.Writer) error {
	if len(targets) == 0 {
		return errors.New("crowd: no target")
	}
	if err := raiseNoFile(n + 256); err != nil {
		return err
	}
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		a := uint32(127)<<24 | uint32(i+2) // from 127.0.0.2: .0 and .1 are not clients
		src := &net.TCPAddr{IP: net.IPv4(byte(a>>24), byte(a>>16), byte(a>>8), byte(a))}
		dl := net.Dialer{LocalAddr: src, Timeout: 5 * time.Second}
		c, err := dl.Dial("tcp", targets[i%len(targets)])
		if err != nil {
			return fmt.Errorf("connection %d of %d from %s: %w", i+1, n, src.IP, err)
		}
		conns = append(conns, c)
	}
	req := []byte("GET / HTTP/1.1\r\nHost: crowd\r\nUser-Agent: crowd\r\n\r\n")
	var total atomic.Int64
	var codes [6]atomic.Int64
	var unavailable atomic.Int64 // 503: a shed, or the upstream unreachable
	var mu sync.Mutex
	var lat []time.Duration
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	var dropped atomic.Int64 // clients whose connection ended before the end of the run
	var last atomic.Int64    // when the last answer came, since start (ns)
	start := time.Now()
	for _, c := range conns {
		wg.Go(func() {
			br := bufio.NewReaderSize(c, 4096)
			var resp fasthttp.Response
			var mine []time.Duration
			defer func() {
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				_, err := c.Write(req)
				if err == nil {
					err = resp.Read(br)
				}
				if err != nil {
					select {
					case <-stop: // the reply the deadline below cut short
					default:
						dropped.Add(1)
						if !errors.Is(err, io.EOF) {
							firstErr.CompareAndSwap(nil, &err)
						}
					}
					return
				}
				now := time.Now()
				if len(mine) < 1000 {
					mine = append(mine, now.Sub(t0))
				}
				for at := int64(now.Sub(start)); ; {
					if l := last.Load(); l >= at || last.CompareAndSwap(l, at) {
						break
					}
				}
				total.Add(1)
				if k := resp.StatusCode() / 100; k >= 1 && k <= 5 {
					codes[k].Add(1)
				}
				switch resp.StatusCode() {
				case 429:
					codes[0].Add(1)
				case 503:
					unavailable.Add(1)
				}
			}
		})
	}
	time.Sleep(d)
	close(stop)
	el := time.Since(start)
	// Unblock readers waiting on a reply that will not come in time.
	for _, c := range conns {
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	}
	wg.Wait()
	if p := firstErr.Load(); p != nil && total.Load() == 0 {
		return fmt.Errorf("crowd: %w", *p)
	}
	// span: from the first request sent to the last answer; every decision
	// of the run was made within it.
	fmt.Fprintf(out, "span %.3f\ndropped %d\n", time.Duration(last.Load()).Seconds(), dropped.Load())
	if p := firstErr.Load(); p != nil && dropped.Load() > 0 {
		fmt.Fprintf(out, "first_error %v\n", *p)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(q float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(q*float64(len(lat))))]
	}
	fmt.Fprintf(out, "clients %d\nseconds %.3f\nrequests %d\nrps %.0f\n2xx %d\n429 %d\n503 %d\nother %d\np50 %v\np99 %v\np50_ms %.3f\np99_ms %.3f\n",
		n, el.Seconds(), total.Load(), float64(total.Load())/el.Seconds(), codes[2].Load(), codes[0].Load(), unavailable.Load(),
		total.Load()-codes[2].Load()-codes[0].Load(), pct(0.5), pct(0.99),
		float64(pct(0.5))/1e6, float64(pct(0.99))/1e6)
	return nil
}

// raiseNoFile raises RLIMIT_NOFILE to at least want, or says why it cannot.
func raiseNoFile(want int) error {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return err
	}
	if r.Cur >= uint64(want) {
		return nil
	}
	if r.Max < uint64(want) {
		return fmt.Errorf("crowd of %d connections needs %d open files, the hard limit is %d: lower CROWD_CLIENTS or raise it (ulimit -Hn)", want-256, want, r.Max)
	}
	r.Cur = uint64(want)
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
}
