package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestClockOffsetSkewsOnlyTheProcessClock: AIRLOCK_TEST_CLOCK_OFFSET (test builds) shifts
// the process clock of one instance. On SQLite that clock decides (the lease it grants is
// an hour ahead); on PostgreSQL the database's clock decides, so the skewed instance grants
// the same lease as an unskewed one.
func TestClockOffsetSkewsOnlyTheProcessClock(t *testing.T) {
	for backend, env := range databases(t) {
		t.Run(backend, func(t *testing.T) {
			if _, stderr, err := airlock(t, env, "migrate"); err != nil {
				t.Fatalf("migrate: %v\n%s", err, stderr)
			}
			k, stderr, err := airlock(t, env, "apikey", "create", "--name", "skew", "--scope", "runs")
			if err != nil {
				t.Fatalf("apikey create: %v\n%s", err, stderr)
			}
			key := strings.TrimSpace(k)
			skewed := startServe(t, append(slices.Clone(env), "AIRLOCK_TEST_CLOCK_OFFSET=+1h"))
			if !strings.Contains(skewed.Logs(), "the process clock is skewed") {
				t.Fatalf("no skew warning:\n%s", skewed.Logs())
			}
			var c struct {
				Expires time.Time `json:"lease_expires_at"`
			}
			before := time.Now()
			if st, err := apiJSON("POST", skewed.URL+"/v1/runs/claim", key, `{"key":"k1","payload_hash":"h","lease_seconds":60}`, &c); st != 201 {
				t.Fatalf("claim: %d %v", st, err)
			}
			ahead := c.Expires.Sub(before.Add(60 * time.Second))
			switch backend {
			case "sqlite":
				if ahead < 59*time.Minute || ahead > 61*time.Minute {
					t.Fatalf("SQLite lease ends %s after an unskewed one, want the 1h offset", ahead)
				}
			default:
				if ahead < -5*time.Second || ahead > 5*time.Second {
					t.Fatalf("PostgreSQL lease ends %s after an unskewed one: the app clock decided", ahead)
				}
			}
		})
	}
}
