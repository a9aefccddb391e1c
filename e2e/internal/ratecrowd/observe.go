package ratecrowd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckill/seckill/internal/servicetest"
)

// Metrics is one scrape of a Prometheus text page: the value of every
// series, keyed by its line's name and labels as printed.
type Metrics map[string]float64

// Scrape reads http://admin/metrics.
func Scrape(t testing.TB, admin string) Metrics {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + admin + "/metrics")
	servicetest.Must(t, err, "scrape %s", admin)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s", admin, resp.Status)
	}
	m := Metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	servicetest.Must(t, sc.Err(), "read %s/metrics", admin)
	return m
}

// Sum adds the series of metric name (with or without labels) whose labels
// contain every one of labels (`outcome="degraded"`). A metric the page
// does not have sums to 0.
func (m Metrics) Sum(name string, labels ...string) float64 {
	var s float64
	for k, v := range m {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(k, l)
		}
		if ok {
			s += v
		}
	}
	return s
}

// By sums name's series by the value of label (e.g. outcome), as
// "value=sum" pairs in a stable order, for the report.
func (m Metrics) By(name, label string) string {
	sums := map[string]float64{}
	for k, v := range m {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		i := strings.Index(k, label+`="`)
		if i < 0 {
			continue
		}
		rest := k[i+len(label)+2:]
		sums[rest[:strings.IndexByte(rest, '"')]] += v
	}
	keys := make([]string, 0, len(sums))
	for k := range sums {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%.0f", k, sums[k])
	}
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}

// Add sums scrapes series by series.
func Add(ms ...Metrics) Metrics {
	out := Metrics{}
	for _, m := range ms {
		for k, v := range m {
			out[k] += v
		}
	}
	return out
}

// Pinger measures Redis's own health beside the crowd: a PING on an idle
// connection of its own every 50 ms (docs: Redis is healthy while those
// answer in under 5 ms).
//
// The goroutine shares the test process's scheduler with the crowd, so
// its figures include the test's own delays; when redis-cli is on the PATH
// a `redis-cli --latency` process (PING every 10 ms, whole milliseconds)
// runs beside it as an outside view.
type Pinger struct {
	stop chan struct{}
	done chan struct{}
	cli  *servicetest.Cmd
	out  bytes.Buffer
	mu   sync.Mutex
	res  PingStats
}

// PingStats summarizes the pings.
type PingStats struct {
	N, Over5ms, Failed int
	Max                time.Duration
	// CLI is redis-cli --latency's "min max avg samples" (ms), "" without it.
	CLI string
}

// Healthy reports whether every PING answered in under 5 ms, by both
// views.
func (s PingStats) Healthy() bool {
	if s.Over5ms > 0 || s.Failed > 0 {
		return false
	}
	var lo, hi, n int
	var avg float64
	if _, err := fmt.Sscan(s.CLI, &lo, &hi, &avg, &n); err == nil && hi >= 5 {
		return false
	}
	return true
}

func (s PingStats) String() string {
	cli := "redis-cli --latency not run"
	if s.CLI != "" {
		cli = "redis-cli --latency min/max/avg ms, samples: " + s.CLI
	}
	return fmt.Sprintf("Redis PING on an idle connection every 50 ms: %d pings, max %v, %d over 5 ms, %d failed; %s",
		s.N, s.Max.Round(10*time.Microsecond), s.Over5ms, s.Failed, cli)
}

// StartPinger pings Redis at addr (host:port) until Stop.
func StartPinger(t testing.TB, addr string) *Pinger {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MinIdleConns: 1,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	servicetest.Must(t, rdb.Ping(ctx).Err(), "ping redis at %s", addr)
	p := &Pinger{stop: make(chan struct{}), done: make(chan struct{})}
	if bin, err := exec.LookPath("redis-cli"); err == nil {
		if host, port, err := net.SplitHostPort(addr); err == nil {
			p.cli = servicetest.Command(t, bin, "-h", host, "-p", port, "--latency", "--raw")
			p.cli.Stdout = &p.out
			if p.cli.Start() != nil {
				p.cli = nil
			}
		}
	}
	go func() {
		defer close(p.done)
		defer rdb.Close()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			t0 := time.Now()
			err := rdb.Ping(context.Background()).Err()
			d := time.Since(t0)
			p.mu.Lock()
			p.res.N++
			if err != nil {
				p.res.Failed++
			}
			if d > 5*time.Millisecond {
				p.res.Over5ms++
			}
			p.res.Max = max(p.res.Max, d)
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() { p.Stop() })
	return p
}

// Stop ends the pings (once) and returns their summary.
func (p *Pinger) Stop() PingStats {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cli != nil {
		// redis-cli prints its summary on SIGINT.
		_ = p.cli.Process.Signal(os.Interrupt)
		_ = p.cli.Wait()
		p.res.CLI = strings.TrimSpace(p.out.String())
		p.cli = nil
	}
	return p.res
}
