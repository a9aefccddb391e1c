package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
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
