package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Within: every statement made with its ctx joins its transaction — the one-statement
// claim, Store methods, and Transact as a savepoint — and nothing is seen outside before
// it commits.
func testWithin(t *testing.T, e *Env) {
	boom := errors.New("boom")
	key := store.APIKey{ID: "key-w", Name: "w", Hash: "hash-w", Scopes: []string{"runs"}, CreatedAt: e.Clock.Now()}
	err := e.Store.Within(ctx, func(ctx context.Context) error {
		if _, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "w1", PayloadHash: "h", Actor: "test"}); err != nil {
			return err
		}
		if err := e.Store.APIKeyInsert(ctx, key); err != nil {
			return err
		}
		// A failing Transact inside rolls back its own writes only.
		err := e.Store.Transact(ctx, func(q store.Queries) error {
			if _, err := q.EventInsert(ctx, store.EventInsertParams{RunKey: "w1", Kind: "lost", Actor: "t"}); err != nil {
				return err
			}
			return boom
		})
		wantErr(t, err, boom)
		if err := e.Store.Transact(ctx, func(q store.Queries) error {
			_, err := q.EventInsert(ctx, store.EventInsertParams{RunKey: "w1", Kind: "kept", Actor: "t"})
			return err
		}); err != nil {
			return err
		}
		// Inside, the writes are visible; outside (another ctx) they are not yet.
		if _, err := e.Store.RunGet(ctx, "w1"); err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() {
			_, err := e.Store.RunGet(context.Background(), "w1")
			done <- err
		}()
		select {
		case err := <-done:
			wantErr(t, err, store.ErrNotFound)
		case <-time.After(5 * time.Second):
			t.Error("a read outside waited for the transaction")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "events", kinds(t, e, "w1"), []string{"claimed", "kept"})
	if _, err := e.Store.APIKeyByHash(ctx, "hash-w"); err != nil {
		t.Fatal(err)
	}

	// An error from fn rolls every joined write back, the one-statement claim's included.
	err = e.Store.Within(ctx, func(ctx context.Context) error {
		if _, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "w2", PayloadHash: "h", Actor: "test"}); err != nil {
			return err
		}
		if _, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "w1", PayloadHash: "h", Actor: "test"}); err != nil {
			return err // a duplicate: counted, then rolled back
		}
		return boom
	})
	wantErr(t, err, boom)
	_, err = e.Store.RunGet(ctx, "w2")
	wantErr(t, err, store.ErrNotFound)
	r, err := e.Store.RunGet(ctx, "w1")
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "duplicates after rollback", r.Duplicates, 0)
	equal(t, "events", kinds(t, e, "w1"), []string{"claimed", "kept"})
}

// The replay records behind Idempotency-Key: one attempt holds a record; others see it
// in flight or answered; a record in flight too long is taken over and its old attempt
// can no longer finish; expired records are reused and purged.
func testReplayRecords(t *testing.T, e *Env) {
	now := e.Clock.Now()
	sc := store.ReplayScope{APIKeyID: "k", Route: "POST /v1/runs/claim", Key: "idem-1"}
	begin := func(sc store.ReplayScope, hash, attempt string, at time.Time) store.Replay {
		t.Helper()
		r, err := e.Store.ReplayBegin(ctx, store.ReplayBeginParams{ReplayScope: sc, RequestHash: hash, Attempt: attempt,
			TTL: 24 * time.Hour, StaleAfter: time.Minute, Now: &at})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := begin(sc, "h1", "a", now)
	equal(t, "holder", r.Attempt, "a")
	equal(t, "done", r.Done, false)
	equal(t, "expires", r.ExpiresAt.Sub(r.CreatedAt), 24*time.Hour)
	r = begin(sc, "h1", "b", now.Add(time.Second))
	equal(t, "holder while in flight", r.Attempt, "a")
	wantErr(t, e.Store.ReplayFinish(ctx, sc, "b", 201, []byte("x")), store.ErrNoMatch)
	if err := e.Store.ReplayFinish(ctx, sc, "a", 201, []byte{0, 1, 2}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, e.Store.ReplayFinish(ctx, sc, "a", 500, nil), store.ErrNoMatch)
	if err := e.Store.ReplayAbandon(ctx, sc, "a"); err != nil { // answered: kept
		t.Fatal(err)
	}
	r = begin(sc, "h1", "c", now.Add(time.Hour))
	equal(t, "answered", []any{r.Attempt, r.Done, r.Status, r.Response, r.RequestHash}, []any{"a", true, 201, []byte{0, 1, 2}, "h1"})
	r = begin(sc, "h2", "c", now.Add(time.Hour))
	equal(t, "another body sees the record", []any{r.Attempt, r.RequestHash}, []any{"a", "h1"})

	// Scopes are separate: another API key, route or key.
	for _, other := range []store.ReplayScope{
		{APIKeyID: "k2", Route: sc.Route, Key: sc.Key},
		{APIKeyID: "k", Route: "POST /v1/runs/{key}/transition", Key: sc.Key},
		{APIKeyID: "k", Route: sc.Route, Key: "idem-2"},
	} {
		equal(t, "holder of "+other.APIKeyID+" "+other.Route+" "+other.Key, begin(other, "h1", "d", now).Attempt, "d")
	}

	// In flight too long: taken over by the same request, never by another body.
	s2 := store.ReplayScope{APIKeyID: "k", Route: sc.Route, Key: "idem-3"}
	equal(t, "first", begin(s2, "h1", "e", now).Attempt, "e")
	equal(t, "another body, stale", begin(s2, "h2", "f", now.Add(2*time.Minute)).Attempt, "e")
	equal(t, "before stale", begin(s2, "h1", "f", now.Add(59*time.Second)).Attempt, "e")
	equal(t, "stale", begin(s2, "h1", "f", now.Add(61*time.Second)).Attempt, "f")
	wantErr(t, e.Store.ReplayFinish(ctx, s2, "e", 200, nil), store.ErrNoMatch)
	if err := e.Store.ReplayAbandon(ctx, s2, "e"); err != nil {
		t.Fatal(err)
	}
	equal(t, "the old attempt cannot abandon it", begin(s2, "h1", "g", now.Add(62*time.Second)).Attempt, "f")
	if err := e.Store.ReplayAbandon(ctx, s2, "f"); err != nil {
		t.Fatal(err)
	}
	equal(t, "abandoned: free again", begin(s2, "h2", "g", now.Add(63*time.Second)).Attempt, "g")

	// Expired: reused, and purged by retention.
	equal(t, "expired", begin(sc, "h9", "h", now.Add(25*time.Hour)).Attempt, "h")
	counts, err := e.Store.Purge(ctx, store.PurgeParams{PayloadsBefore: now, EventsBefore: now, Now: now.Add(24*time.Hour + 2*time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "purged", counts["replays"], 4) // idem-3 and the three other scopes; idem-1 was renewed
}
