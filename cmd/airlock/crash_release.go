//go:build !airlock_testhooks

package main

import (
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// crashHook: a release build has no crash points, whatever the environment says.
func crashHook() func(string) { return nil }

// testClock: a release build runs on the process clock, whatever the environment says.
func testClock() (func() time.Time, time.Duration, error) { return nil, 0, nil }

// writerLevel is the writer level this binary implements.
func writerLevel() int { return store.WriterLevel }
