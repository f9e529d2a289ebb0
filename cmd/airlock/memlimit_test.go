package main

import (
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/airlockhq/airlock/internal/config"
)

// AIRLOCK_MEMORY_LIMIT: auto takes 90% of the container's limit (none without one), a
// size is applied as given, off applies none, and GOMEMLIMIT wins over all of them.
func TestMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	dir := t.TempDir()
	withLimit, noLimit := filepath.Join(dir, "limited"), filepath.Join(dir, "unlimited")
	if err := os.WriteFile(withLimit, []byte("1073741824\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(noLimit, []byte("max\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	defer func(p string) { cgroupMemoryMax = p }(cgroupMemoryMax)
	log := slog.New(slog.DiscardHandler)
	load := func(v string) config.Config {
		c, err := config.Load(map[string]string{"memory-limit": v}, func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, c := range []struct {
		value, cgroup string
		want          int64
	}{
		{"auto", withLimit, 1073741824 / 10 * 9},
		{"auto", noLimit, 0},
		{"512MiB", noLimit, 512 << 20},
		{"off", withLimit, 0},
	} {
		debug.SetMemoryLimit(math.MaxInt64)
		cgroupMemoryMax = c.cgroup
		got, source := setMemoryLimit(load(c.value), log)
		if got != c.want {
			t.Errorf("%s with %s: limit %d (%s), want %d", c.value, filepath.Base(c.cgroup), got, source, c.want)
		}
		if applied := debug.SetMemoryLimit(-1); c.want > 0 && applied != c.want || c.want == 0 && applied != math.MaxInt64 {
			t.Errorf("%s: the runtime's limit is %d", c.value, applied)
		}
	}
	t.Setenv("GOMEMLIMIT", "300MiB")
	debug.SetMemoryLimit(300 << 20) // as the runtime did at start
	if got, source := setMemoryLimit(load("512MiB"), log); got != 300<<20 || source != "GOMEMLIMIT" {
		t.Errorf("with GOMEMLIMIT: %d from %s", got, source)
	}
	if _, err := config.Load(map[string]string{"memory-limit": "10MiB"}, func(string) (string, bool) { return "", false }); err == nil {
		t.Error("a 10MiB limit was accepted")
	}
}
