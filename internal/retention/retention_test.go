package retention_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// TestPurgeOnTheDatabaseClock: rows are stamped by the database's clock, so their age is
// measured on it. Here this instance's clock runs 40 days ahead of the database's (the
// SQLite store's clock is the one its rows get): a payload a minute old by the
// database's clock is kept, one 31 days old goes.
func TestPurgeOnTheDatabaseClock(t *testing.T) {
	ctx := context.Background()
	dbNow := func() time.Time { return time.Now().Add(-40 * 24 * time.Hour) }
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"), sqlite.Options{Now: dbNow})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse([]byte("actions: {}\n"), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.RunClaim(ctx, store.RunClaimParams{Key: "k", PayloadHash: "h", Owner: "o", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for id, age := range map[string]time.Duration{"fresh": time.Minute, "old": 31 * 24 * time.Hour} {
		if _, _, err := st.EffectInsert(ctx, store.Effect{ID: id, RunKey: "k", EffectID: id, ActionType: "note", Target: "default",
			Executor: store.ExecutorDispatcher, Payload: json.RawMessage(`{"to":"ana@example.com"}`), PayloadHash: "p",
			State: store.EffectCompleted, CreatedAt: dbNow().Add(-age)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := retention.Job(st, pol, slog.New(slog.DiscardHandler))(ctx); err != nil {
		t.Fatal(err)
	}
	for id, kept := range map[string]bool{"fresh": true, "old": false} {
		e, err := st.EffectGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if (e.Payload != nil) != kept {
			t.Errorf("%s effect: payload kept = %v, want %v", id, e.Payload != nil, kept)
		}
	}
}
