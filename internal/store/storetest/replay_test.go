package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// The replay records behind Idempotency-Key: written in the request's transaction (gone
// if it rolls back), one per scope, read until they expire, then replaced and purged.
// On PostgreSQL the scope's lock excludes a second transaction (instance) at once.
func testReplayRecords(t *testing.T, e *env) {
	now := e.Clock.Now()
	sc := store.ReplayScope{APIKeyID: "k", Route: "POST /v1/runs/claim", Key: "idem-1"}
	rec := store.Replay{ReplayScope: sc, RequestHash: "h1", Status: 201, Response: []byte{0, 1, 2}}
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	get := func(sc store.ReplayScope, d time.Duration) (store.Replay, error) {
		return e.Store.ReplayGet(ctx, sc, at(d))
	}

	// Rolled back with the request: nothing recorded.
	boom := errors.New("boom")
	wantErr(t, e.Store.Within(ctx, func(ctx context.Context) error {
		if err := e.Store.ReplayInsert(ctx, rec, 24*time.Hour, at(0)); err != nil {
			return err
		}
		return boom
	}), boom)
	_, err := get(sc, 0)
	wantErr(t, err, store.ErrNotFound)

	if err := e.Store.Within(ctx, func(ctx context.Context) error {
		ok, err := e.Store.ReplayLock(ctx, sc)
		if err != nil || !ok {
			t.Fatalf("lock: %v %v", ok, err)
		}
		if e.Store.Backend() == "postgres" {
			// Another transaction does not get the scope's lock, and does not wait for it;
			// another scope's it does.
			for _, c := range []struct {
				sc   store.ReplayScope
				want bool
			}{{sc, false}, {store.ReplayScope{APIKeyID: "k2", Route: sc.Route, Key: sc.Key}, true}} {
				if err := e.Store.Within(context.Background(), func(ctx context.Context) error {
					got, err := e.Store.ReplayLock(ctx, c.sc)
					equal(t, "lock held elsewhere for "+c.sc.APIKeyID, got, c.want)
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
		return e.Store.ReplayInsert(ctx, rec, 24*time.Hour, at(0))
	}); err != nil {
		t.Fatal(err)
	}
	r, err := get(sc, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "record", []any{r.RequestHash, r.Status, r.Response, r.ExpiresAt.Sub(r.CreatedAt)}, []any{"h1", 201, []byte{0, 1, 2}, 24 * time.Hour})
	wantErr(t, e.Store.ReplayInsert(ctx, store.Replay{ReplayScope: sc, RequestHash: "h2", Status: 200, Response: []byte{9}}, time.Hour, at(time.Hour)), store.ErrNoMatch)
	// Scopes are separate: another API key, route or key.
	for _, other := range []store.ReplayScope{
		{APIKeyID: "k2", Route: sc.Route, Key: sc.Key},
		{APIKeyID: "k", Route: "POST /v1/runs/{key}/transition", Key: sc.Key},
		{APIKeyID: "k", Route: sc.Route, Key: "idem-2"},
	} {
		_, err := get(other, 0)
		wantErr(t, err, store.ErrNotFound)
		if err := e.Store.ReplayInsert(ctx, store.Replay{ReplayScope: other, RequestHash: "h", Status: 200, Response: []byte{1}}, time.Hour, at(0)); err != nil {
			t.Fatal(err)
		}
	}
	// Expired: not read, replaced, and purged by retention.
	_, err = get(sc, 24*time.Hour)
	wantErr(t, err, store.ErrNotFound)
	if err := e.Store.ReplayInsert(ctx, store.Replay{ReplayScope: sc, RequestHash: "h3", Status: 200, Response: []byte{3}}, 24*time.Hour, at(25*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if r, err := get(sc, 25*time.Hour); err != nil || r.RequestHash != "h3" {
		t.Fatalf("replaced: %+v %v", r, err)
	}
	counts, err := e.Store.Purge(ctx, store.PurgeParams{PayloadsBefore: now, EventsBefore: now, Now: now.Add(2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "purged", counts["replays"], 3) // the three other scopes; idem-1 was renewed
}
