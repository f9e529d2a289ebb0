package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestAuditVerifyCommand writes two runs' events, has `airlock audit verify` pass them,
// then changes one event row as someone with the database's credentials would: the
// command exits non-zero and names that event, on both stores.
func TestAuditVerifyCommand(t *testing.T) {
	ctx := context.Background()
	for name, env := range databases(t) {
		t.Run(name, func(t *testing.T) {
			url := strings.TrimPrefix(env[0], "AIRLOCK_DATABASE_URL=")
			var st store.Store
			var err error
			if name == "sqlite" {
				st, err = sqlite.Open(ctx, url, sqlite.Options{})
			} else {
				st, err = postgres.Open(ctx, url)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			var ids []int64
			for _, key := range []string{"k-1", "k-2"} {
				for i := range 3 {
					ev, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: fmt.Sprintf("step%d", i),
						Actor: "user:ann", Detail: []byte(`{"decision": "approve"}`)})
					if err != nil {
						t.Fatal(err)
					}
					ids = append(ids, ev.ID)
				}
			}
			out, stderr, err := airlock(t, env, "audit", "verify", "k-1")
			if err != nil || !strings.Contains(out, "k-1: ok, 3 events chained (head link 3") {
				t.Fatalf("verify k-1: %v\n%s%s", err, out, stderr)
			}
			out, stderr, err = airlock(t, env, "audit", "verify", "--all")
			if err != nil || !strings.Contains(out, "2 runs checked, 0 broken") {
				t.Fatalf("verify --all: %v\n%s%s", err, out, stderr)
			}
			if _, _, err := airlock(t, env, "audit", "verify"); err == nil {
				t.Fatal("verify with neither a key nor --all succeeded")
			}

			if name == "sqlite" {
				storetest.ExecRaw(t, st, `DROP TRIGGER events_no_update`)
				storetest.ExecRaw(t, st, `UPDATE events SET detail = '{"decision": "reject"}' WHERE id = ?`, ids[4])
			} else {
				storetest.ExecRaw(t, st, `ALTER TABLE events DISABLE TRIGGER events_no_update`)
				storetest.ExecRaw(t, st, `UPDATE events SET detail = '{"decision": "reject"}' WHERE id = $1`, ids[4])
			}
			out, stderr, err = airlock(t, env, "audit", "verify", "--all")
			want := fmt.Sprintf("k-2: BROKEN: event %d (step1, link 2) does not match its hash", ids[4])
			if err == nil || !strings.Contains(out, want) || !strings.Contains(out, fmt.Sprintf("[first bad event %d]", ids[4])) ||
				!strings.Contains(out, "k-1: ok") || !strings.Contains(out, "2 runs checked, 1 broken") {
				t.Fatalf("verify --all after tampering: %v, want %q\n%s%s", err, want, out, stderr)
			}
			if !strings.Contains(stderr, "the hash chain is broken") {
				t.Fatalf("stderr: %s", stderr)
			}
			out, _, err = airlock(t, env, "audit", "verify", "k-2", "--json")
			if err == nil || !strings.Contains(out, fmt.Sprintf(`"bad_event_id":%d`, ids[4])) {
				t.Fatalf("verify k-2 --json: %v\n%s", err, out)
			}
		})
	}
}
