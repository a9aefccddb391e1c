// Package cli is the command line every seckill binary shares: -config,
// -check, -version, -healthcheck and -h, the exit status they map to, and the
// JSON logger built from [log].
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/seckill/seckill/conf"
	"github.com/seckill/seckill/internal/version"
)

// Flags are the shared flags of one binary.
type Flags struct {
	Config      string
	Check       bool
	Version     bool
	Healthcheck bool
	// Validate, when set, checks what the binary builds from a loaded
	// configuration beyond conf's own rules (the proxy: the Envoy service's
	// YAML rules), the same way the binary does at start, so that -check
	// refuses every file the binary would refuse to start with.
	Validate  func(conf.Config) error
	component string
}

// AddFlags registers the shared flags on fs. healthcheck is false for a
// binary that serves nothing (bench).
func AddFlags(fs *flag.FlagSet, component string, healthcheck bool) *Flags {
	f := &Flags{component: component}
	fs.StringVar(&f.Config, "config", conf.DefaultPath, "configuration file")
	fs.BoolVar(&f.Check, "check", false, "validate the configuration, print every problem with its key, exit 0 (valid) or 1")
	fs.BoolVar(&f.Version, "version", false, "print the version and exit")
	if healthcheck {
		fs.BoolVar(&f.Healthcheck, "healthcheck", false, "probe the running process's /healthz (address from -config) and exit 0 or 1; for container healthchecks")
	}
	return f
}

// ErrCheckFailed is returned by Early when -check found problems (printed).
var ErrCheckFailed = errors.New("configuration has problems")

// Early handles -version, -check and -healthcheck. done says the process
// should exit now, with err's status (ExitCode). health names the address
// whose /healthz -healthcheck probes.
func (f *Flags) Early(stdout io.Writer, env func(string) string, health func(conf.Config) string) (done bool, err error) {
	switch {
	case f.Version:
		fmt.Fprintf(stdout, "%s %s (%s)\n", f.component, version.Get(), version.GoVersion())
		return true, nil
	case f.Check:
		cfg, err := conf.Load(f.Config, env)
		if err == nil && f.Validate != nil {
			err = f.Validate(cfg)
		}
		if err != nil {
			fmt.Fprintln(stdout, err)
			return true, ErrCheckFailed
		}
		fmt.Fprintf(stdout, "%s: configuration ok\n", f.Config)
		return true, nil
	case f.Healthcheck:
		cfg, err := conf.Load(f.Config, env)
		if err != nil {
			return true, err
		}
		return true, Probe(context.Background(), health(cfg), 2*time.Second)
	}
	return false, nil
}

// Probe GETs http://addr/healthz (an unspecified host means this machine)
// and fails unless it answers 200.
func Probe(ctx context.Context, addr string, timeout time.Duration) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("healthcheck: address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := "http://" + net.JoinHostPort(host, port) + "/healthz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: GET %s: %s", u, resp.Status)
	}
	return nil
}

// ExitCode maps run's error to the exit status: 0 for none and for -h (the
// usage was printed, as asked), 1 otherwise.
func ExitCode(err error) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 1
}

// Report prints a fatal error once, unless it needs no words (-h, or -check,
// which printed its problems already).
func Report(w io.Writer, component string, err error) {
	if err == nil || errors.Is(err, flag.ErrHelp) || errors.Is(err, ErrCheckFailed) {
		return
	}
	fmt.Fprintf(w, "%s: %v\n", component, err)
}

// Logger is the JSON logger of a binary: level from [log], a component key
// on every line, durations written as strings ("250ms") rather than
// nanoseconds.
func Logger(w io.Writer, c conf.Log, component string) *slog.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: c.SlogLevel(), ReplaceAttr: durationsAsStrings})
	return slog.New(h).With("component", component)
}

func durationsAsStrings(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
