//go:build !unix

package httpapi_test

import (
	"testing"
	"time"
)

// processCPU is not read outside Unix: the benchmark's cpu-µs/op is then 0.
func processCPU(*testing.B) time.Duration { return 0 }
