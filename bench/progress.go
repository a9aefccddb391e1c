package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/seckill/seckill/bench/internal/load"
	"github.com/seckill/seckill/internal/verify"
)

// progress shows the run while it goes: a bar redrawn in place on a
// terminal, a plain line every few seconds otherwise (CI logs, pipes).
type progress struct {
	w     io.Writer
	quiet bool
	tty   bool
	rec   *load.Recorder
	tl    load.Timeline

	mu       sync.Mutex
	lastLine time.Time
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	drawn    bool
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newProgress(w io.Writer, quiet bool, rec *load.Recorder, tl load.Timeline) *progress {
	return &progress{w: w, quiet: quiet, tty: isTerminal(w), rec: rec, tl: tl}
}

func (p *progress) interval() time.Duration {
	if p.tty {
		return 200 * time.Millisecond
	}
	return 2 * time.Second
}

// start draws the load's progress until stop.
func (p *progress) start(ctx context.Context) {
	if p.quiet {
		return
	}
	ctx, p.cancel = context.WithCancel(ctx)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(p.interval())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p.drawLoad()
			}
		}
	}()
}

func (p *progress) stop() {
	if p.quiet || p.cancel == nil {
		return
	}
	p.cancel()
	p.wg.Wait()
	p.drawLoad()
	p.done()
}

func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

func (p *progress) drawLoad() {
	now := time.Now()
	total := p.tl.End.Sub(p.tl.Start)
	elapsed := min(now.Sub(p.tl.Start), total)
	phase := "warm-up"
	switch {
	case !now.Before(p.tl.End):
		phase = "finishing"
	case !now.Before(p.tl.TailStart):
		phase = "tail"
	case !now.Before(p.tl.RushStart):
		phase = "rush"
	}
	l := p.rec.Live()
	var counts []string
	for _, c := range load.Classes {
		counts = append(counts, fmt.Sprintf("%s:%d", c, l.Classes[c]))
	}
	status := fmt.Sprintf("%-9s %5.1f/%.0fs  %d done, %d in flight  %s",
		phase, elapsed.Seconds(), total.Seconds(), l.Done, l.InFlight, strings.Join(counts, " "))
	p.line(status, float64(elapsed)/float64(max(total, 1)))
}

func (p *progress) drainTick(st verify.DrainStatus, elapsed time.Duration) {
	if p.quiet {
		return
	}
	p.line(fmt.Sprintf("draining  %5.1fs  queue %d ready, %d dead; Redis pending %d; MySQL orders %d",
		elapsed.Seconds(), st.Ready, st.Dead, st.Pending, st.MySQLOrders), -1)
}

// line prints a status: in place with a bar on a terminal, else at most one
// line per interval.
func (p *progress) line(s string, frac float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		bar := ""
		if frac >= 0 {
			const width = 24
			n := int(frac*width + 0.5)
			bar = "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "] "
		}
		fmt.Fprintf(p.w, "\r\033[K%s%s", bar, s)
		p.drawn = true
		return
	}
	if now := time.Now(); now.Sub(p.lastLine) >= p.interval() {
		p.lastLine = now
		fmt.Fprintf(p.w, "bench: %s\n", s)
	}
}
