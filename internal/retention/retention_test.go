package retention_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/store/storetest"
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

// TestPurgePeopleSeen: the people seen by single sign-on count as holding their roles for
// store.PeopleSeenHorizon (90 days) after their last sign-in; the purge removes exactly
// those it no longer counts, on the store's test clock, and keeps whoever signed in again.
// On both stores.
func TestPurgePeopleSeen(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		ctx := context.Background()
		clock := storetest.NewClock()
		st := b.Open(t, clock)
		pol, err := policy.Parse([]byte("actions: {}\n"), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		seen := func(subject string) {
			t.Helper()
			if err := st.PersonSeenPut(ctx, store.PersonSeen{Subject: subject, Roles: []string{"finance"}, SeenAt: clock.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		subjects := func() []string {
			t.Helper()
			all, err := st.PeopleSeen(ctx, time.Time{}) // every row, counted or not
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, p := range all {
				out = append(out, p.Subject)
			}
			return out
		}
		holders := func() []string {
			t.Helper()
			hs, err := approvals.Holders(ctx, st, clock.Now())
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, h := range hs {
				out = append(out, h.Subject)
			}
			return out
		}
		purge := func(dry bool) int64 {
			t.Helper()
			counts, err := retention.Purge(ctx, st, pol, clock.Now(), dry)
			if err != nil {
				t.Fatal(err)
			}
			n, ok := counts["people_seen"]
			if !ok {
				t.Fatalf("the purge does not count people_seen: %v", counts)
			}
			return n
		}

		seen("olga@example.com")
		seen("rene@example.com")
		clock.Advance(60 * 24 * time.Hour)
		seen("pia@example.com")
		seen("rene@example.com") // signs in again: counted anew
		clock.Advance(store.PeopleSeenHorizon - 60*24*time.Hour)
		// Exactly at the horizon olga still counts, and the purge keeps her.
		if got := holders(); !slices.Equal(got, []string{"olga@example.com", "pia@example.com", "rene@example.com"}) {
			t.Fatalf("holders at the horizon = %v", got)
		}
		if n := purge(false); n != 0 {
			t.Fatalf("purged %d people at the horizon, who still count", n)
		}
		clock.Advance(time.Microsecond)
		if got := holders(); !slices.Equal(got, []string{"pia@example.com", "rene@example.com"}) {
			t.Fatalf("holders past olga's horizon = %v", got)
		}
		if n := purge(true); n != 1 {
			t.Fatalf("dry run: %d people_seen would go, want 1 (olga)", n)
		}
		if got := subjects(); len(got) != 3 {
			t.Fatalf("a dry run removed rows: %v", got)
		}
		if n := purge(false); n != 1 {
			t.Fatalf("purged %d people_seen, want 1 (olga)", n)
		}
		if got := subjects(); !slices.Equal(got, []string{"pia@example.com", "rene@example.com"}) {
			t.Fatalf("left = %v", got)
		}
		if n := purge(false); n != 0 {
			t.Fatalf("a second purge removed %d more", n)
		}
		clock.Advance(60 * 24 * time.Hour)
		if n := purge(false); n != 2 {
			t.Fatalf("past everyone's horizon: purged %d, want 2", n)
		}
		if got := subjects(); len(got) != 0 {
			t.Fatalf("left = %v", got)
		}
	})
}
