package servicetest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// EnvChromium names the Chromium binary tests use; unset, the first of
// chromium, chromium-browser and google-chrome on PATH.
const EnvChromium = "CHROMIUM"

// EnvArtifacts is where tests keep what a reader may want to look at
// afterwards (screenshots); unset, out/test-artifacts at the module root.
const EnvArtifacts = "SECKILL_TEST_ARTIFACTS"

// Chromium is a headless Chromium with a profile of the test's own (its
// cookies last across loads, as in one browser): the test is skipped when
// none is installed, or fails under CI (make bench-deps installs it).
type Chromium struct {
	bin, profile string
	t            testing.TB
}

// NewChromium finds Chromium for t.
func NewChromium(t testing.TB) *Chromium {
	t.Helper()
	bin := os.Getenv(EnvChromium)
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if bin != "" {
			break
		}
		bin, _ = exec.LookPath(name)
	}
	if bin == "" {
		unavailable(t, "chromium (apt-get install chromium, or make bench-deps)", nil)
	}
	return &Chromium{bin: bin, profile: filepath.Join(t.TempDir(), "profile"), t: t}
}

// Run runs Chromium headless, offline but for what args name, on the
// test's profile, and returns its standard output (e.g. --dump-dom URL,
// --screenshot=FILE URL).
func (c *Chromium) Run(args ...string) []byte {
	c.t.Helper()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--user-data-dir=" + c.profile}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := CommandContext(ctx, c.t, c.bin, append(base, args...)...).Output()
	if err != nil {
		c.t.Fatalf("chromium %v: %v", args, err)
	}
	return out
}

// ArtifactDir is a directory kept after the test for its name (cleared
// first): $SECKILL_TEST_ARTIFACTS/name, or out/test-artifacts/name at the
// module root.
func ArtifactDir(t testing.TB, name string) string {
	t.Helper()
	root := os.Getenv(EnvArtifacts)
	if root == "" {
		dir, err := os.Getwd()
		Must(t, err, "working directory")
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				break
			}
			up := filepath.Dir(dir)
			if up == dir {
				t.Fatal("no go.mod above the test's directory: set " + EnvArtifacts)
			}
			dir = up
		}
		root = filepath.Join(dir, "out", "test-artifacts")
	}
	dir := filepath.Join(root, name)
	Must(t, os.RemoveAll(dir), "clear artifacts")
	Must(t, os.MkdirAll(dir, 0o755), "artifacts")
	return dir
}
