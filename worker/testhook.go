package main

import (
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// envArchiveHold arms a test hook for the lifecycle tests (e2e): with
// SECKILL_TEST_ARCHIVE_HOLD=DIR the archiver, once it holds an activity's row
// lock and before its archive script, creates DIR/locked-ID and waits (at most
// a minute) until DIR/go-ID exists — so a test can race an admin change or a
// purchase against that exact moment. Unset (the default) the hook is inert.
const envArchiveHold = "SECKILL_TEST_ARCHIVE_HOLD"

func archiveHold() func(int64) {
	dir := os.Getenv(envArchiveHold)
	if dir == "" {
		return nil
	}
	return func(id int64) {
		name := strconv.FormatInt(id, 10)
		_ = os.WriteFile(filepath.Join(dir, "locked-"+name), nil, 0o644)
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(dir, "go-"+name)); err == nil {
				return
			}
		}
	}
}
