package audit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestCheckpoints: the tamperings a database writer can do without the key and that the
// chain alone cannot see — the newest events deleted and the head set back, the first
// events deleted and the base moved, a run wiped whole — are found with the signed
// checkpoint (and a moved base also by the retention check), on both stores; retention's
// own base moves verify, also while purges race each other and verify.
func TestCheckpoints(t *testing.T) {
	key := newKey(t)
	storetest.EachKeyed(t, key, func(t *testing.T, b storetest.Backend) {
		t.Run("Tampering", func(t *testing.T) { testCheckpointTamper(t, b, key) })
		t.Run("RetentionBase", func(t *testing.T) { testCheckpointRetention(t, b, key) })
		t.Run("ConcurrentPurges", func(t *testing.T) { testConcurrentPurges(t, b, key) })
		t.Run("EveryCheckpoint", func(t *testing.T) { testEveryCheckpoint(t, b, key) })
	})
}

// timeArg is a time as the backend's raw SQL takes it.
func timeArg(st store.Store, at time.Time) any {
	if _, ok := st.(*postgres.Store); ok {
		return at
	}
	return at.UnixMicro()
}

// checkAll runs verify --all with opt and returns each run's check by key.
func checkAll(t *testing.T, st store.Store, opt audit.VerifyOptions) map[string]audit.ChainCheck {
	t.Helper()
	var err error
	if opt.KeyedSince, err = st.ChainFirstKeyed(ctx); err != nil {
		t.Fatal(err)
	}
	out := map[string]audit.ChainCheck{}
	if err := audit.New(st, nil).VerifyAllWith(ctx, opt, func(c audit.ChainCheck) error {
		out[c.Key] = c
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func takeCheckpoint(t *testing.T, st store.Store, key *store.AuditKey, keys store.Keyring) *audit.Checkpoint {
	t.Helper()
	dir := t.TempDir()
	c, err := audit.New(st, nil).TakeCheckpoint(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := audit.WriteCheckpoint(dir, c); err != nil {
		t.Fatal(err)
	}
	loaded, _, err := audit.LoadCheckpoint(dir, keys)
	if err != nil {
		t.Fatal(err)
	}
	return loaded
}

func testCheckpointTamper(t *testing.T, b storetest.Backend, key *store.AuditKey) {
	keys := store.NewKeyring(key)
	tests := []struct {
		name   string
		tamper func(t *testing.T, st store.Store, evs []store.ChainEvent)
		// chainAlone is what verify without the checkpoint finds ("" : nothing, the run
		// passes or is not listed).
		chainAlone, problem string
	}{
		{"TruncateAndSetTheHeadBack", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			storetest.ExecRaw(t, st, rawSQL(st, `DELETE FROM events WHERE id IN ($1, $2)`), evs[3].ID, evs[4].ID)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE event_chains SET seq = 3, head = $1 WHERE run_key = 't'`), *evs[2].Hash)
		}, "", "the newest events were deleted and the head set back"},
		{"DeleteFirstAndMoveTheBase", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			storetest.ExecRaw(t, st, rawSQL(st, `DELETE FROM events WHERE id IN ($1, $2)`), evs[0].ID, evs[1].ID)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE event_chains SET base_seq = 2, base_hash = $1 WHERE run_key = 't'`), *evs[1].Hash)
		}, "", "without a recorded time: not by airlock's retention"},
		{"DeleteFirstAndMoveTheBaseWithAnOldTime", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			storetest.ExecRaw(t, st, rawSQL(st, `DELETE FROM events WHERE id IN ($1, $2)`), evs[0].ID, evs[1].ID)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE event_chains SET base_seq = 2, base_hash = $1, base_at = $2 WHERE run_key = 't'`),
				*evs[1].Hash, timeArg(st, time.Now().Add(-1000*24*time.Hour)))
		}, "carries no MAC although the trail is keyed", "carries no MAC although the trail is keyed"},
		{"WipeTheRun", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			storetest.ExecRaw(t, st, `DELETE FROM events WHERE run_key = 't'`)
			storetest.ExecRaw(t, st, `DELETE FROM event_chains WHERE run_key = 't'`)
		}, "", "the run was wiped"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := b.Open(t, nil)
			evs := seedChain(t, st, "t")
			seedChain(t, st, "untouched")
			cp := takeCheckpoint(t, st, key, keys)
			if got := checkAll(t, st, audit.VerifyOptions{Keys: keys, Checkpoint: cp}); !got["t"].OK || got["t"].Checkpointed != 5 {
				t.Fatalf("before: %+v", got)
			}
			// Events after the checkpoint are not its business.
			if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: "untouched", Kind: "later", Actor: "a"}); err != nil {
				t.Fatal(err)
			}
			tt.tamper(t, st, evs)
			alone := checkAll(t, st, audit.VerifyOptions{Keys: keys})["t"]
			if tt.chainAlone == "" && alone.Problem != "" || tt.chainAlone != "" && !strings.Contains(alone.Problem, tt.chainAlone) {
				t.Fatalf("without the checkpoint: %+v, want %q", alone, tt.chainAlone)
			}
			got := checkAll(t, st, audit.VerifyOptions{Keys: keys, Checkpoint: cp})
			if c := got["t"]; c.OK || !strings.Contains(c.Problem, tt.problem) {
				t.Fatalf("with the checkpoint: %+v, want %q", c, tt.problem)
			}
			if u := got["untouched"]; !u.OK {
				t.Fatalf("untouched: %+v", u)
			}
		})
	}
	t.Run("MoveTheBaseWithARecentTime", func(t *testing.T) {
		// No key, no checkpoint: the retention check alone finds a base whose link
		// retention could not have reached.
		st := b.Open(t, nil)
		evs := seedChain(t, st, "t")
		storetest.ExecRaw(t, st, rawSQL(st, `DELETE FROM events WHERE id IN ($1, $2)`), evs[0].ID, evs[1].ID)
		storetest.ExecRaw(t, st, rawSQL(st, `UPDATE event_chains SET base_seq = 2, base_hash = $1, base_at = $2 WHERE run_key = 't'`),
			*evs[1].Hash, timeArg(st, time.Now().Add(-time.Hour)))
		if c := checkAll(t, st, audit.VerifyOptions{})["t"]; !c.OK {
			t.Fatalf("without the retention: %+v", c)
		}
		c := checkAll(t, st, audit.VerifyOptions{Retention: 400 * 24 * time.Hour})["t"]
		if c.OK || !strings.Contains(c.Problem, "within the retention period") {
			t.Fatalf("with the retention: %+v", c)
		}
	})
	t.Run("ChangedCheckpointFile", func(t *testing.T) {
		st := b.Open(t, nil)
		seedChain(t, st, "t")
		dir := t.TempDir()
		c, err := audit.New(st, nil).TakeCheckpoint(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		file, err := audit.WriteCheckpoint(dir, c)
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(file); err != nil || fi.Size() == 0 {
			t.Fatalf("checkpoint file: %v", err)
		}
		if left, _ := filepath.Glob(filepath.Join(dir, ".checkpoint-*")); len(left) > 0 {
			t.Fatalf("temporary files left: %v", left)
		}
		c.Runs[0].Seq = 3 // a writer who also reached the checkpoints, without the key
		b, _ := json.Marshal(c)
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := audit.LoadCheckpoint(dir, store.NewKeyring(key)); err == nil || !strings.Contains(err.Error(), "its signature does not hold") {
			t.Fatalf("a changed checkpoint loaded: %v", err)
		}
	})
}

// seedOld writes n events of key dated at.
func seedOld(t *testing.T, st store.Store, key string, n int, at time.Time) {
	t.Helper()
	for i := range n {
		if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: fmt.Sprintf("old%d", i), Actor: "a",
			Detail: json.RawMessage(`{"i": 1}`), Now: &at}); err != nil {
			t.Fatal(err)
		}
	}
}

func purge(t testing.TB, st store.Store, before time.Time, batch int) {
	t.Helper()
	now := time.Now()
	if _, err := st.Purge(ctx, store.PurgeParams{PayloadsBefore: now.Add(-24 * time.Hour), EventsBefore: before, Now: now, Batch: batch,
		Yield: func(context.Context, time.Duration) error { return nil }}); err != nil {
		t.Error(err)
	}
}

// testCheckpointRetention: a base retention moved after the checkpoint is sealed, dated
// past the retention, and verifies.
func testCheckpointRetention(t *testing.T, b storetest.Backend, key *store.AuditKey) {
	st := b.Open(t, nil)
	keys := store.NewKeyring(key)
	seedOld(t, st, "r", 3, time.Now().Add(-500*24*time.Hour))
	seedOld(t, st, "r", 5, time.Now())
	cp := takeCheckpoint(t, st, key, keys)
	purge(t, st, time.Now().Add(-400*24*time.Hour), 0)
	opt := audit.VerifyOptions{Keys: keys, Checkpoint: cp, Retention: 400 * 24 * time.Hour, RequireMAC: true}
	c := checkAll(t, st, opt)["r"]
	if !c.OK || c.Purged != 3 || c.Keyed != 5 {
		t.Fatalf("after retention: %+v", c)
	}
	head, err := st.ChainHeadGet(ctx, "r")
	if err != nil || head.BaseMAC == nil || head.BaseAt == nil || keys.CheckBase(head) != store.MACValid {
		t.Fatalf("the base is not sealed: %+v %v", head, err)
	}
	// With a shorter retention than the one that purged, the same base is refused.
	opt.Retention = 600 * 24 * time.Hour
	if c := checkAll(t, st, opt)["r"]; c.OK || !strings.Contains(c.Problem, "within the retention period") {
		t.Fatalf("with 600 days: %+v", c)
	}
}

// testConcurrentPurges: two purges (two instances) and verify run at once over runs whose
// old events go in small batches; verify never reports a break, and the chains verify
// after.
func testConcurrentPurges(t *testing.T, b storetest.Backend, key *store.AuditKey) {
	st := b.Open(t, nil)
	other := storetest.ReopenKeyed(t, st, nil, key)
	keys := store.NewKeyring(key)
	old := time.Now().Add(-500 * 24 * time.Hour)
	for i := range 8 {
		k := fmt.Sprintf("run-%d", i)
		seedOld(t, st, k, 25, old)
		seedOld(t, st, k, 2, time.Now())
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var bad []string
	var mu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for k, c := range checkAll(t, st, audit.VerifyOptions{Keys: keys, Retention: 400 * 24 * time.Hour}) {
				if !c.OK {
					mu.Lock()
					bad = append(bad, k+": "+c.Problem)
					mu.Unlock()
				}
			}
		}
	}()
	var purges sync.WaitGroup
	for _, s := range []store.Store{st, other} {
		purges.Add(1)
		go func() { defer purges.Done(); purge(t, s, time.Now().Add(-400*24*time.Hour), 7) }()
	}
	purges.Wait()
	close(stop)
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("verify reported breaks while purges ran: %v", bad[:min(len(bad), 5)])
	}
	for k, c := range checkAll(t, st, audit.VerifyOptions{Keys: keys, Retention: 400 * 24 * time.Hour, RequireMAC: true}) {
		if !c.OK || c.Purged != 25 || c.Chained != 2 {
			t.Fatalf("%s after the purges: %+v", k, c)
		}
	}
}

// TestCheckpointerWakes: serve's writer writes a checkpoint as soon as an approval
// decision wakes it, long before its interval.
func TestCheckpointerWakes(t *testing.T) {
	key := newKey(t)
	st := storetest.KeyedBackends(key)[0].Open(t, nil)
	seedChain(t, st, "decided")
	dir := t.TempDir()
	cp := audit.NewCheckpointer(st, key, dir, time.Hour)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	written := make(chan error, 4)
	go func() {
		defer close(done)
		cp.Run(runCtx, func(_ string, err error) { written <- err })
	}()
	cp.Wake()
	cp.Wake() // folded into the one being written, or the next
	select {
	case err := <-written:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no checkpoint within 30s of a wake")
	}
	cancel()
	<-done
	c, _, err := audit.LoadCheckpoint(dir, store.NewKeyring(key))
	if err != nil || len(c.Runs) != 1 || c.Runs[0].Key != "decided" || c.Runs[0].Seq != 5 {
		t.Fatalf("checkpoint: %+v %v", c, err)
	}
}

// testEveryCheckpoint: verify holds each run to every checkpoint of the directory, not
// only the newest. A rollback to a state between two checkpoints (links 6-7 deleted, the
// head set back to link 5, then new events written as links 6-8) agrees with the
// checkpoint written after it, and with the one before it, but not with the one in
// between; deleting the newest file does not hide it either.
func testEveryCheckpoint(t *testing.T, b storetest.Backend, key *store.AuditKey) {
	st := b.Open(t, nil)
	keys := store.NewKeyring(key)
	dir := t.TempDir()
	write := func() string {
		t.Helper()
		c, err := audit.New(st, nil).TakeCheckpoint(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		file, err := audit.WriteCheckpoint(dir, c)
		if err != nil {
			t.Fatal(err)
		}
		return file
	}
	insert := func(n int, kind string) {
		t.Helper()
		for i := range n {
			if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: "t", Kind: fmt.Sprintf("%s%d", kind, i), Actor: "user:ann"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	verify := func(set *audit.CheckpointSet, one *audit.Checkpoint) map[string]audit.ChainCheck {
		t.Helper()
		return checkAll(t, st, audit.VerifyOptions{Keys: keys, Checkpoints: set, Checkpoint: one})
	}
	evs := seedChain(t, st, "t")
	seedChain(t, st, "idle")
	write() // A: t at link 5
	insert(2, "approved")
	write() // B: t at link 7
	set, err := audit.LoadCheckpoints(dir, keys)
	if err != nil {
		t.Fatal(err)
	}
	// idle's head is the same in both files: kept once.
	if set.Files != 2 || set.States != 3 {
		t.Fatalf("set: %d files, %d states; want 2 and 3", set.Files, set.States)
	}
	if got := verify(set, nil); !got["t"].OK || got["t"].Checkpointed != 7 || !got["idle"].OK {
		t.Fatalf("before: %+v", got)
	}
	later := chainEvents(t, st, "t")[5:]
	storetest.ExecRaw(t, st, rawSQL(st, `DELETE FROM events WHERE id IN ($1, $2)`), later[0].ID, later[1].ID)
	storetest.ExecRaw(t, st, rawSQL(st, `UPDATE event_chains SET seq = 5, head = $1 WHERE run_key = 't'`), *evs[4].Hash)
	insert(3, "rewritten") // links 6-8 again, genuinely keyed, chained onto link 5
	newest := write()      // C: t at link 8, after the rollback
	set, err = audit.LoadCheckpoints(dir, keys)
	if err != nil {
		t.Fatal(err)
	}
	if c := verify(nil, set.Newest)["t"]; !c.OK {
		t.Fatalf("the newest checkpoint alone should not see it (else this test proves nothing): %+v", c)
	}
	const want = "link 7) differs from the checkpoint of"
	got := verify(set, nil)
	if c := got["t"]; c.OK || !strings.Contains(c.Problem, want) || c.BadEventID == 0 {
		t.Fatalf("with every checkpoint: %+v, want %q", c, want)
	}
	if !got["idle"].OK {
		t.Fatalf("idle: %+v", got["idle"])
	}
	// The newest file deleted: the older ones still find it.
	if err := os.Remove(newest); err != nil {
		t.Fatal(err)
	}
	set, err = audit.LoadCheckpoints(dir, keys)
	if err != nil {
		t.Fatal(err)
	}
	if c := verify(set, nil)["t"]; c.OK || !strings.Contains(c.Problem, want) {
		t.Fatalf("without the newest file: %+v, want %q", c, want)
	}
}
