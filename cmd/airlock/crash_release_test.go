//go:build !airlock_testhooks

package main

import "testing"

// TestCrashHookNotInReleaseBuilds: a binary built without the airlock_testhooks tag
// ignores AIRLOCK_TEST_CRASH_AT, so no environment can make a production process kill
// itself mid-send. (TestMain builds the binary the process tests run with the tag.)
func TestCrashHookNotInReleaseBuilds(t *testing.T) {
	t.Setenv("AIRLOCK_TEST_CRASH_AT", "after_reply")
	if crashHook() != nil {
		t.Fatal("AIRLOCK_TEST_CRASH_AT is live in a release build")
	}
}

// TestClockOffsetNotInReleaseBuilds: AIRLOCK_TEST_CLOCK_OFFSET skews nothing in a release
// build.
func TestClockOffsetNotInReleaseBuilds(t *testing.T) {
	t.Setenv("AIRLOCK_TEST_CLOCK_OFFSET", "1h")
	if now, d, err := testClock(); now != nil || d != 0 || err != nil {
		t.Fatal("AIRLOCK_TEST_CLOCK_OFFSET is live in a release build")
	}
}
