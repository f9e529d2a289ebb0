package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// verify's citus line on a real Citus cluster (scripts/with-citus.sh): it passes with both
// workers up, fails naming the worker once one is stopped, and passes again once it is
// back. It stops a worker of the shared cluster: run it alone (docs/testing.md).
func TestVerifyCitusWorkerDown(t *testing.T) {
	ctl := os.Getenv("AIRLOCK_TEST_CITUS_CTL")
	if os.Getenv("AIRLOCK_TEST_CITUS") != "1" || ctl == "" {
		t.Skip("needs a Citus cluster: run under scripts/with-citus.sh")
	}
	ports := strings.Fields(os.Getenv("AIRLOCK_TEST_CITUS_WORKERS"))
	if len(ports) != 2 {
		t.Fatalf("AIRLOCK_TEST_CITUS_WORKERS=%q: want two ports", os.Getenv("AIRLOCK_TEST_CITUS_WORKERS"))
	}
	ctx := context.Background()
	st, err := postgres.OpenConfig(ctx, storetest.NewPostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	v := &verifyRun{st: st}
	check := func(want string, contains ...string) {
		t.Helper()
		r := v.citus(ctx)
		if r.Status != want {
			t.Fatalf("citus: %s %s, want %s", r.Status, r.Detail, want)
		}
		for _, c := range contains {
			if !strings.Contains(r.Detail, c) {
				t.Errorf("citus: %q does not name %q", r.Detail, c)
			}
		}
	}
	worker := func(action string) {
		t.Helper()
		if out, err := exec.Command(ctl, action, "1").CombinedOutput(); err != nil {
			t.Fatalf("%s %s 1: %v\n%s", ctl, action, err, out)
		}
	}
	check("PASS", ":"+ports[0], ":"+ports[1])
	worker("stop")
	started := false
	t.Cleanup(func() {
		if !started {
			worker("start")
		}
	})
	check("FAIL", ":"+ports[0], "1 of 2 workers unreachable")
	worker("start")
	started = true
	check("PASS")
}
