package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/audit"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/store"
)

// verifyChecks are the lines every verify run prints, in order.
var verifyChecks = []string{"concurrent-claims", "stale-cas", "lease-expiry-clock", "kill-switch", "listen-notify",
	"advisory-locks", "isolation-level", "pooler", "replication", "synchronous-commit", "clock-skew", "citus", "http-readiness",
	"http-claims", "cleanup"}

// verifyLines parses verify's output into check → status, failing on a line of another form.
func verifyLines(t *testing.T, out string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || (f[0] != "PASS" && f[0] != "FAIL" && f[0] != "WARN" && f[0] != "SKIP") {
			t.Fatalf("verify printed %q: not STATUS CHECK DETAIL", line)
		}
		got[f[1]] = f[0]
	}
	for _, c := range verifyChecks {
		if got[c] == "" {
			t.Errorf("verify printed no line for %s:\n%s", c, out)
		}
	}
	return got
}

var scratchPrefix = regexp.MustCompile(`\((airlock-verify-[0-9a-f]{12})\)`)

// airlock verify on a healthy SQLite file and PostgreSQL: every check passes or says why
// it does not apply, it exits 0, and its scratch namespace is gone afterwards.
func TestVerifyPasses(t *testing.T) {
	for backend, env := range databases(t) {
		t.Run(backend, func(t *testing.T) {
			if _, stderr, err := airlock(t, env, "migrate"); err != nil {
				t.Fatalf("migrate: %v\n%s", err, stderr)
			}
			out, stderr, err := airlock(t, env, "verify")
			if err != nil {
				t.Fatalf("verify: %v\n%s\n%s", err, out, stderr)
			}
			if !strings.Contains(stderr, fmt.Sprintf("writer level: database %d, this binary %d", store.WriterLevel, store.WriterLevel)) || !strings.Contains(stderr, "LAST SEEN") {
				t.Errorf("verify did not show the fleet on stderr:\n%s", stderr)
			}
			got := verifyLines(t, out)
			want := map[string]string{"concurrent-claims": "PASS", "stale-cas": "PASS", "lease-expiry-clock": "PASS",
				"kill-switch": "PASS", "clock-skew": "PASS", "cleanup": "PASS", "http-readiness": "SKIP", "http-claims": "SKIP",
				"citus": map[bool]string{false: "SKIP", true: "PASS"}[backend == "postgres" && os.Getenv("AIRLOCK_TEST_CITUS") == "1"]}
			for _, c := range []string{"listen-notify", "advisory-locks", "isolation-level", "pooler", "replication", "synchronous-commit"} {
				want[c] = map[string]string{"sqlite": "SKIP", "postgres": "PASS"}[backend]
			}
			for c, s := range want {
				if got[c] != s {
					t.Errorf("%s: %s, want %s\n%s", c, got[c], s, out)
				}
			}
			// A single server is no failure: the line says what durability rests on.
			if backend == "postgres" && !strings.Contains(out, "no standby streams from this server") {
				t.Errorf("replication line does not say there is no standby:\n%s", out)
			}
			m := scratchPrefix.FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no scratch namespace named in:\n%s", out)
			}
			assertScratchGone(t, env, m[1])
		})
	}
}

// assertScratchGone opens the database verify used and looks for its runs and kill switch row.
func assertScratchGone(t *testing.T, env []string, prefix string) {
	t.Helper()
	ctx := context.Background()
	cfg, err := config.Load(nil, func(k string) (string, bool) {
		for _, e := range env {
			if v, ok := strings.CutPrefix(e, k+"="); ok {
				return v, true
			}
		}
		return "", false
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := openStore(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := 1; i <= 4; i++ {
		if _, err := st.RunGet(ctx, prefix+"-"+string(rune('0'+i))); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("scratch run %s-%d left behind (err %v)", prefix, i, err)
		}
	}
	switches, err := st.KillSwitchList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range switches {
		if strings.Contains(k.Scope, prefix) {
			t.Errorf("kill switch row %s left behind", k.Scope)
		}
	}
	// What verify wrote and removed leaves every event chain whole (no head of a chain
	// whose events are gone): `airlock audit verify --all` still passes afterwards.
	if err := audit.New(st, nil).VerifyAll(ctx, func(c audit.ChainCheck) error {
		if !c.OK {
			t.Errorf("after verify, the chain of %q: %s", c.Key, c.Problem)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A broken guarantee fails verify: with this host's clock an hour off the database's
// (the test build's clock hook), the clock check fails with what to fix, and verify
// exits non-zero; the other checks still run and the scratch namespace is removed.
func TestVerifyFailsOnClockSkew(t *testing.T) {
	for backend, env := range databases(t) {
		t.Run(backend, func(t *testing.T) {
			if _, stderr, err := airlock(t, env, "migrate"); err != nil {
				t.Fatalf("migrate: %v\n%s", err, stderr)
			}
			out, stderr, err := airlock(t, append(env, "AIRLOCK_TEST_CLOCK_OFFSET=1h"), "verify")
			if err == nil {
				t.Fatalf("verify passed with a clock an hour off:\n%s", out)
			}
			if !strings.Contains(stderr, "1 of 15 checks failed") {
				t.Errorf("stderr %q, want the failed count", stderr)
			}
			got := verifyLines(t, out)
			if got["clock-skew"] != "FAIL" || !strings.Contains(out, "fix: synchronise") {
				t.Errorf("clock-skew %s, want FAIL with a fix:\n%s", got["clock-skew"], out)
			}
			if got["cleanup"] != "PASS" {
				t.Errorf("cleanup %s:\n%s", got["cleanup"], out)
			}
		})
	}
}

// verify checks a deployment as it is: no database file, no new one.
func TestVerifyNeverCreatesADatabase(t *testing.T) {
	path := t.TempDir() + "/none.db"
	_, stderr, err := airlock(t, []string{"AIRLOCK_DATABASE_URL=" + path}, "verify")
	if err == nil || !strings.Contains(stderr, "no database at") {
		t.Fatalf("err %v, stderr %q", err, stderr)
	}
	if _, _, err := airlock(t, []string{"AIRLOCK_DATABASE_URL=" + path}, "verify"); err == nil {
		t.Fatal("the second run found a database the first created")
	}
}

// The checks in process, so -race sees their goroutines (the tests above run the binary):
// on SQLite and PostgreSQL nothing fails, and a clock an hour ahead fails only clock-skew.
func TestRunVerifyInProcess(t *testing.T) {
	ctx := context.Background()
	for backend, env := range databases(t) {
		t.Run(backend, func(t *testing.T) {
			cfg, err := config.Load(nil, func(k string) (string, bool) {
				for _, e := range env {
					if v, ok := strings.CutPrefix(e, k+"="); ok {
						return v, true
					}
				}
				return "", false
			})
			if err != nil {
				t.Fatal(err)
			}
			st, err := openStore(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			for _, r := range runVerify(ctx, st, cfg, verifyOptions{}) {
				if r.Status == "FAIL" {
					t.Errorf("%s: %s", r.Name, r.Detail)
				}
			}
			ahead := func() time.Time { return time.Now().Add(time.Hour) }
			for _, r := range runVerify(ctx, st, cfg, verifyOptions{Now: ahead}) {
				if (r.Status == "FAIL") != (r.Name == "clock-skew") {
					t.Errorf("clock an hour ahead: %s %s: %s", r.Status, r.Name, r.Detail)
				}
			}
		})
	}
}
