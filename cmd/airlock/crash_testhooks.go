//go:build airlock_testhooks

package main

import (
	"os"
	"syscall"
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
