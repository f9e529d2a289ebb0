package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
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

// TestAuditKeyCommands: keygen writes a 0600 key and never overwrites one; with the key
// configured the events are sealed and verify checks them; a checkpoint written by the
// command finds a truncation the chain alone passes, and a forged insert fails by its
// MAC — on both stores, the key's secret appearing in no output.
func TestAuditKeyCommands(t *testing.T) {
	ctx := context.Background()
	for name, env := range databases(t) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			keyFile, cpDir := filepath.Join(dir, "audit.key"), filepath.Join(dir, "checkpoints")
			if err := os.Mkdir(cpDir, 0o700); err != nil {
				t.Fatal(err)
			}
			out, stderr, err := airlock(t, env, "audit", "keygen", "--out", keyFile)
			if err != nil || !strings.Contains(out, "wrote audit key ") {
				t.Fatalf("keygen: %v\n%s%s", err, out, stderr)
			}
			fi, err := os.Stat(keyFile)
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("key file: %v %v", fi, err)
			}
			raw, _ := os.ReadFile(keyFile)
			secret := strings.TrimPrefix(strings.TrimSpace(string(raw)), "airlock-audit-key-v1:")
			if _, stderr, err := airlock(t, env, "audit", "keygen", "--out", keyFile); err == nil || !strings.Contains(stderr, "exists") {
				t.Fatalf("a second keygen over the file: %v %s", err, stderr)
			}
			if again, _ := os.ReadFile(keyFile); string(again) != string(raw) {
				t.Fatal("keygen overwrote the key")
			}
			key, err := store.ReadAuditKey(keyFile)
			if err != nil {
				t.Fatal(err)
			}
			url := strings.TrimPrefix(env[0], "AIRLOCK_DATABASE_URL=")
			var st store.Store
			if name == "sqlite" {
				st, err = sqlite.Open(ctx, url, sqlite.Options{AuditKey: key})
			} else {
				st, err = postgres.OpenWith(ctx, url, postgres.Options{AuditKey: key})
			}
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			var ids []int64
			for _, k := range []string{"k-1", "k-2"} {
				for i := range 3 {
					ev, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: k, Kind: fmt.Sprintf("step%d", i),
						Actor: "user:ann", Detail: []byte(`{"decision": "approve"}`)})
					if err != nil {
						t.Fatal(err)
					}
					ids = append(ids, ev.ID)
				}
			}
			keyed := append(env[:len(env):len(env)], "AIRLOCK_AUDIT_KEY_FILE="+keyFile)
			var all strings.Builder
			run := func(env []string, args ...string) (string, string, error) {
				out, stderr, err := airlock(t, env, args...)
				all.WriteString(out + stderr)
				return out, stderr, err
			}
			if out, stderr, err := run(env, "audit", "verify", "--all"); err != nil || !strings.Contains(out, "3 MACs not checked (no audit key given") {
				t.Fatalf("verify without the key: %v\n%s%s", err, out, stderr)
			}
			if _, stderr, err := run(env, "audit", "verify", "--all", "--require-mac"); err == nil || !strings.Contains(stderr, "--require-mac needs the audit key") {
				t.Fatalf("--require-mac without a key: %v %s", err, stderr)
			}
			if out, stderr, err := run(keyed, "audit", "verify", "--all", "--require-mac"); err != nil || !strings.Contains(out, "k-1: ok, 3 events chained") ||
				!strings.Contains(out, "3 MACs checked") {
				t.Fatalf("verify with the key: %v\n%s%s", err, out, stderr)
			}
			if out, stderr, err := run(keyed, "audit", "checkpoint", "--dir", cpDir); err != nil || !strings.Contains(out, ": 2 runs") {
				t.Fatalf("checkpoint: %v\n%s%s", err, out, stderr)
			}
			// The newest event of k-2 deleted and the head set back: the chain alone passes.
			evs, err := st.ChainEvents(ctx, "k-2", 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			storetest.ExecRaw(t, st, fmt.Sprintf(`DELETE FROM events WHERE id = %d`, ids[5]))
			storetest.ExecRaw(t, st, fmt.Sprintf(`UPDATE event_chains SET seq = 2, head = '%s' WHERE run_key = 'k-2'`, *evs[1].Hash))
			if out, stderr, err := run(keyed, "audit", "verify", "--all"); err != nil || !strings.Contains(out, "2 runs checked, 0 broken") {
				t.Fatalf("the chain alone: %v\n%s%s", err, out, stderr)
			}
			out, stderr, err = run(keyed, "audit", "verify", "--all", "--checkpoints", cpDir)
			if err == nil || !strings.Contains(out, "k-2: BROKEN: the chain's head is link 2 but the checkpoint of") || !strings.Contains(out, "k-1: ok") {
				t.Fatalf("verify --checkpoints: %v\n%s%s", err, out, stderr)
			}
			// A forged decision inserted with SQL: its MAC is missing.
			at := "now()"
			if name == "sqlite" {
				at = "(SELECT max(at) FROM events)"
			}
			storetest.ExecRaw(t, st, `INSERT INTO events (run_key, at, kind, version, actor, detail)
				VALUES ('k-1', `+at+`, 'approval_decided', 1, 'person:eve', '{"decision": "approved"}')`)
			out, stderr, err = run(keyed, "audit", "verify", "k-1")
			if err == nil || !strings.Contains(out, "has no MAC although events are keyed since event") {
				t.Fatalf("verify after a forged insert: %v\n%s%s", err, out, stderr)
			}
			if strings.Contains(all.String(), secret) || strings.Contains(all.String(), secret[:16]) {
				t.Fatal("the key's secret appears in a command's output")
			}
		})
	}
}

// TestServeWritesCheckpoints: serve with the audit key and a checkpoint directory seals
// the claims it records and writes signed checkpoints that name the run; verify holds the
// trail to them with every MAC required.
func TestServeWritesCheckpoints(t *testing.T) {
	for name, env := range databases(t) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			keyFile, cpDir := filepath.Join(dir, "audit.key"), filepath.Join(dir, "checkpoints")
			if err := os.Mkdir(cpDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if _, stderr, err := airlock(t, env, "audit", "keygen", "--out", keyFile); err != nil {
				t.Fatalf("keygen: %v %s", err, stderr)
			}
			if _, stderr, err := airlock(t, env, "migrate"); err != nil {
				t.Fatalf("migrate: %v %s", err, stderr)
			}
			apiKey, stderr, err := airlock(t, env, "apikey", "create", "--name", "cp", "--scope", "runs")
			if err != nil {
				t.Fatalf("apikey: %v %s", err, stderr)
			}
			apiKey = strings.TrimSpace(apiKey)
			keyed := append(env[:len(env):len(env)], "AIRLOCK_AUDIT_KEY_FILE="+keyFile,
				"AIRLOCK_AUDIT_CHECKPOINT_DIR="+cpDir, "AIRLOCK_AUDIT_CHECKPOINT_INTERVAL=10s")
			base, stop := serveProcessStop(t, keyed)
			if r, err := postClaim(base, apiKey, "cp-1"); err != nil || r.status != 201 && r.status != 200 {
				t.Fatalf("claim: %+v %v", r, err)
			}
			key, err := store.ReadAuditKey(keyFile)
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(40 * time.Second)
			for {
				c, _, err := audit.LoadCheckpoint(cpDir, store.NewKeyring(key))
				if err == nil && len(c.Runs) == 1 && c.Runs[0].Key == "cp-1" && c.Runs[0].Seq >= 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no checkpoint naming cp-1 within 40s: %+v %v", c, err)
				}
				time.Sleep(500 * time.Millisecond)
			}
			stop()
			out, stderr, err := airlock(t, keyed, "audit", "verify", "--all", "--require-mac", "--checkpoints", cpDir)
			if err != nil || !strings.Contains(out, "cp-1: ok") || !strings.Contains(out, "holds to the checkpoint's link") {
				t.Fatalf("verify: %v\n%s%s", err, out, stderr)
			}
		})
	}
}
