package e2e

import (
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/seckill/seckill/e2e/internal/stack"
)

const drainDelay = 3 * time.Second

// On SIGTERM every server first fails /readyz for drain_delay while it still
// serves, and only then closes its listeners and exits cleanly.
func TestSIGTERMFailsReadinessBeforeListenersClose(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binaries")
	}
	t.Parallel()
	d := fmt.Sprintf("drain_delay = %q\n", drainDelay.String())
	s := stack.New(t, stack.Options{Backends: 1, Workers: 1, Config: "[backend]\n" + d + "[worker]\n" + d})
	backend, worker := s.Backends[0], s.Workers[0]
	proxy := s.StartProxy(t, "proxy", "[proxy]\n"+d)

	client := &http.Client{Timeout: 2 * time.Second}
	get := func(url string) int {
		r, err := client.Get(url)
		if err != nil {
			return 0
		}
		_ = r.Body.Close()
		return r.StatusCode
	}
	// The proxy first (it forwards to the backend), then the backend, then
	// the worker; "serving" is a request its main listener still answers.
	for _, c := range []struct {
		p       *stack.Proc
		ready   string
		serving string
	}{
		{proxy, "http://" + proxy.AdminAddr + "/readyz", proxy.URL() + "/api/v1/activities/1"}, // forwarded to the backend
		{backend, backend.URL() + "/readyz", backend.URL() + "/api/v1/activities/1"},
		{worker, worker.URL() + "/readyz", worker.URL() + "/healthz"},
	} {
		if code := get(c.ready); code != http.StatusOK {
			t.Fatalf("%s: /readyz %d before SIGTERM", c.p.Name, code)
		}
		start := time.Now()
		c.p.Signal(t, syscall.SIGTERM)
		stack.WaitFor(t, c.p.Name+" /readyz failing", drainDelay, func() bool { return get(c.ready) == http.StatusServiceUnavailable })
		if code := get(c.serving); code == 0 || code >= 500 {
			t.Errorf("%s: while draining, %s answered %d; want it still served", c.p.Name, c.serving, code)
		}
		select {
		case <-c.p.Exited():
			if elapsed := time.Since(start); elapsed < drainDelay {
				t.Errorf("%s exited %s after SIGTERM, before its drain delay of %s", c.p.Name, elapsed, drainDelay)
			}
			if code := c.p.ExitCode(); code != 0 {
				t.Errorf("%s exited with %d on SIGTERM", c.p.Name, code)
			}
		case <-time.After(drainDelay + 30*time.Second):
			t.Fatalf("%s did not exit after SIGTERM", c.p.Name)
		}
	}
}
