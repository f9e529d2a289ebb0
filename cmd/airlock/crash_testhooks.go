//go:build airlock_testhooks

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// crashHook returns the test-only crash point from AIRLOCK_TEST_CRASH_AT: the process
// kills itself with SIGKILL there, as a power cut would. It exists only in binaries
// built with -tags airlock_testhooks (the process tests' TestMain builds one).
func crashHook() func(string) {
	at := os.Getenv("AIRLOCK_TEST_CRASH_AT")
	if at == "" {
		return nil
	}
	return func(point string) {
		if point == at {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}

// testClock returns the process clock shifted by AIRLOCK_TEST_CLOCK_OFFSET (a signed Go
// duration, e.g. -3s or +1h30m) and the offset: the harness gives its instances skewed
// clocks with it. nil when unset. Test builds only, like the crash hook.
func testClock() (func() time.Time, time.Duration, error) {
	v := os.Getenv("AIRLOCK_TEST_CLOCK_OFFSET")
	if v == "" {
		return nil, 0, nil
	}
	d, err := time.ParseDuration(strings.TrimPrefix(v, "+"))
	if err != nil {
		return nil, 0, fmt.Errorf("AIRLOCK_TEST_CLOCK_OFFSET: %w", err)
	}
	return func() time.Time { return time.Now().Add(d) }, d, nil
}

// writerLevel is the writer level this binary implements: store.WriterLevel, or in a test
// build AIRLOCK_TEST_WRITER_LEVEL (the drill and the process tests play an older binary
// with it).
func writerLevel() int {
	if v := os.Getenv("AIRLOCK_TEST_WRITER_LEVEL"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			return n
		}
	}
	return store.WriterLevel
}
