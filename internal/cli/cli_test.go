package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/seckill/seckill/conf"
)

func TestLoggerLevelComponentDurations(t *testing.T) {
	var buf bytes.Buffer
	log := Logger(&buf, conf.Log{Level: "warn"}, "worker")
	log.Info("hidden")
	log.Warn("shown", "grace", 1500*time.Millisecond, "cfg", conf.D(2*time.Second))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want only the warning, got %q", lines)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	if m["component"] != "worker" || m["grace"] != "1.5s" || m["cfg"] != "2s" {
		t.Errorf("got %v", m)
	}
}

func TestExitCode(t *testing.T) {
	for err, want := range map[error]int{nil: 0, flag.ErrHelp: 0, ErrCheckFailed: 1, errors.New("x"): 1} {
		if got := ExitCode(err); got != want {
			t.Errorf("ExitCode(%v) = %d, want %d", err, got, want)
		}
	}
	var buf bytes.Buffer
	Report(&buf, "proxy", flag.ErrHelp)
	Report(&buf, "proxy", ErrCheckFailed)
	if buf.Len() != 0 {
		t.Errorf("-h and -check print no error line, got %q", buf.String())
	}
	Report(&buf, "proxy", errors.New("listen: taken"))
	if buf.String() != "proxy: listen: taken\n" {
		t.Errorf("got %q", buf.String())
	}
}

// -check runs the binary's own Validate after conf's rules: its error is
// printed and fails the check; it is not run for a file conf refuses.
func TestCheckRunsValidate(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/good.toml"
	if err := os.WriteFile(good, []byte("[log]\nlevel = \"info\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := dir + "/bad.toml"
	if err := os.WriteFile(bad, []byte("[log]\nlevl = \"info\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noEnv := func(string) string { return "" }
	calls := 0
	check := func(path string, verr error) (string, error) {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		f := AddFlags(fs, "x", false)
		if err := fs.Parse([]string{"-check", "-config", path}); err != nil {
			t.Fatal(err)
		}
		f.Validate = func(conf.Config) error { calls++; return verr }
		var out bytes.Buffer
		done, err := f.Early(&out, noEnv, nil)
		if !done {
			t.Fatal("-check did not end the run")
		}
		return out.String(), err
	}
	if out, err := check(good, errors.New("proxy.rls_config: rls config r.yaml: domain \"d\": descriptor d.a: bad")); !errors.Is(err, ErrCheckFailed) ||
		!strings.Contains(out, "descriptor d.a: bad") {
		t.Errorf("Validate's error: %v, printed %q", err, out)
	}
	if out, err := check(good, nil); err != nil || !strings.Contains(out, "configuration ok") {
		t.Errorf("valid: %v, printed %q", err, out)
	}
	calls = 0
	if _, err := check(bad, nil); !errors.Is(err, ErrCheckFailed) || calls != 0 {
		t.Errorf("conf's refusal: %v, Validate ran %d times", err, calls)
	}
}
