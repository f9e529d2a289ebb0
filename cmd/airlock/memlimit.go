package main

import (
	"log/slog"
	"os"
	"runtime/debug"
	"strings"

	"github.com/airlockhq/airlock/internal/config"
)

// cgroupMemoryMax is where cgroup v2 shows the container's memory limit.
var cgroupMemoryMax = "/sys/fs/cgroup/memory.max"

// setMemoryLimit gives the Go runtime serve's soft memory limit (AIRLOCK_MEMORY_LIMIT),
// unless GOMEMLIMIT is set, which the runtime has already applied. Near the limit the
// garbage collector runs more often, so a burst of large requests is collected before
// the container's OOM killer sees it; a live heap over the limit is not refused.
// It returns the limit in force (0: none) and where it came from.
func setMemoryLimit(cfg config.Config, log *slog.Logger) (int64, string) {
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok && v != "" {
		limit := debug.SetMemoryLimit(-1)
		log.Info("memory limit", "bytes", limit, "source", "GOMEMLIMIT")
		return limit, "GOMEMLIMIT"
	}
	limit, source := cfg.MemoryLimit, "AIRLOCK_MEMORY_LIMIT"
	if limit == config.MemoryLimitAuto {
		limit, source = 0, "none (no container memory limit)"
		if b, err := os.ReadFile(cgroupMemoryMax); err == nil {
			if n, err := config.ParseSize(strings.TrimSpace(string(b))); err == nil && n > 0 {
				limit, source = n/10*9, "90% of "+cgroupMemoryMax
			}
		}
	}
	if limit <= 0 {
		log.Info("memory limit", "bytes", 0, "source", source)
		return 0, source
	}
	debug.SetMemoryLimit(limit)
	log.Info("memory limit", "bytes", limit, "source", source)
	return limit, source
}
