package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/seckill/seckill/internal/servicetest"
)

// helperEnv makes the test binary act as bin/bench (TestMain): the flag
// detection of make bench BASE=<ref> then reads this tree's real -help.
const helperEnv = "SECKILL_BENCH_TEST_AS_BENCH"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(exitCode(os.Stderr, run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)))
	}
	os.Exit(m.Run())
}

// sh runs script in bash with bench/compat.sh sourced and returns its
// standard output.
func sh(t *testing.T, script string, env ...string) string {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	cmd := servicetest.Command(t, "bash", "-c", "set -euo pipefail; source ./compat.sh; "+script)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, stderr.String())
	}
	return string(out)
}

// asBench is an executable that runs this test binary as bin/bench.
func asBench(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "bench")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+helperEnv+"=1 exec '"+self+"' \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// The flag names come from the binary's own -help: every flag of this
// tree's bench, those without a value (-quiet) and those with one alike, and
// nothing that is no flag.
func TestBenchFlagNamesFromHelp(t *testing.T) {
	got := strings.Fields(sh(t, `bench_flag_names "$B"`, "B="+asBench(t)))
	have := map[string]bool{}
	for _, n := range got {
		have[n] = true
	}
	want := []string{"config", "quiet", "cpu", "ceilings", "json", "html", "before-drain", "unkeyed-share",
		"order-wait", "state-poll-rate", "max-in-flight", "drain-timeout", "activity"}
	for _, c := range configFlags {
		want = append(want, c.name)
	}
	for _, n := range want {
		if !have[n] {
			t.Errorf("-help's flag %q not found in %q", n, got)
		}
	}
	for _, n := range got {
		if strings.ContainsAny(n, " \t(") || n == "" {
			t.Errorf("odd flag name %q", n)
		}
	}
	if have["help"] || have["h"] {
		t.Errorf("-help itself is no flag bench.sh passes, found in %q", got)
	}
	// bench.sh tells the ceilings subcommand by its -duration.
	if h := sh(t, `"$B" ceilings -help 2>&1 || true`, "B="+asBench(t)); !strings.Contains(h, "\n  -duration") {
		t.Errorf("bench ceilings -help has no '  -duration' line:\n%s", h)
	}
}

// An old bench without a flag: that flag is left out (and said), its
// neighbours stay, values with spaces stay one word, nothing after "--" is
// looked at.
func TestBenchFilterArgs(t *testing.T) {
	out := sh(t, `
bench_filter_args "config cpu quiet before-drain duration" \
	-config=a.toml -unkeyed-share=1 -quiet --cpu=proxy=1,worker=2+3 \
	"-before-drain=kill -CONT 1 2" -state-poll-rate=0 -duration=2s -- -nope
printf 'kept:%s\n' "${KEPT_ARGS[@]}"
printf 'dropped:%s\n' "${DROPPED_FLAGS[@]}"`)
	want := `kept:-config=a.toml
kept:-quiet
kept:--cpu=proxy=1,worker=2+3
kept:-before-drain=kill -CONT 1 2
kept:-duration=2s
kept:--
kept:-nope
dropped:-unkeyed-share=1
dropped:-state-poll-rate=0
`
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	// A bench that lists every flag keeps them all.
	out = sh(t, `names=$(bench_flag_names "$B"); bench_filter_args "$names" -unkeyed-share=1 -cpu=x=1 -quiet
echo "${#KEPT_ARGS[@]} ${#DROPPED_FLAGS[@]}"`, "B="+asBench(t))
	if strings.TrimSpace(out) != "3 0" {
		t.Errorf("this tree's bench: kept, dropped = %q, want 3 0", out)
	}
}
