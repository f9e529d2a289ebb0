package audit_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestChain* are the event hash chain's conformance suite, each on every backend (0015_chain.sql): the
// backend's SQL links every event as store.ChainHash says, two writers of one run never
// fork the chain, and `airlock audit verify`'s check finds each way of tampering with
// the rows.
func TestChainEveryPathLinked(t *testing.T) { apptest.EachEffects(t, testChainPaths) }
func TestChainTampering(t *testing.T)       { storetest.Each(t, testChainTamper) }
func TestChainBeforeTheChain(t *testing.T)  { apptest.EachEnv(t, testChainBefore) }
func TestChainAfterRetention(t *testing.T)  { apptest.EachEnv(t, testChainRetention) }
func TestChainRacingWriters(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) { testChainRace(t, apptest.NewEnv(t, b, true)) })
}
func TestChainRacingFirstEvents(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) { testChainFirstRace(t, apptest.NewEnv(t, b, true)) })
}

// rawSQL adapts a PostgreSQL statement ($n parameters) to the backend: SQLite numbers
// them ?n.
func rawSQL(st store.Store, pg string) string {
	if _, ok := st.(*postgres.Store); ok {
		return pg
	}
	return strings.ReplaceAll(pg, "$", "?")
}

// allowEventUpdates is the first step of an attacker with the database's credentials:
// the append-only trigger out of the way.
func allowEventUpdates(t *testing.T, st store.Store) {
	if _, ok := st.(*postgres.Store); ok {
		storetest.ExecRaw(t, st, `ALTER TABLE events DISABLE TRIGGER events_no_update`)
		return
	}
	storetest.ExecRaw(t, st, `DROP TRIGGER events_no_update`)
}

func chainEvents(t *testing.T, st store.Store, key string) []store.ChainEvent {
	t.Helper()
	evs, err := st.ChainEvents(ctx, key, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func verifyOne(t *testing.T, st store.Store, key string) audit.ChainCheck {
	t.Helper()
	c, err := audit.New(st, nil).VerifyChain(ctx, key)
	if err != nil {
		t.Fatalf("verify %q: %v", key, err)
	}
	return c
}

// testChainPaths writes events the ways airlock does — the claim's one statement (with
// a refusal), an effect queued, sent by the dispatcher and recorded, a completion — and
// checks that every one of them is linked and that Go's hash agrees with the SQL's.
func testChainPaths(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "p-1")
	if _, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "p-1", PayloadHash: "h-p-1", Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	// A payload mismatch is refused with an error, and recorded.
	_, _ = e.Runs.Claim(ctx, runs.ClaimRequest{Key: "p-1", PayloadHash: "other", Actor: "test"})
	e.Queue(t, "p-1", "note", "default", `{"note":"zwölf – 12","z":1,"a":[1,2,{"k":"v"}]}`)
	if _, err := e.Dispatcher.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: runs.LeaseRequest{Key: "p-1", Owner: r.LeaseOwner,
		Version: r.Version, Actor: "test"}, To: store.StateCompleted}); err != nil {
		t.Fatal(err)
	}
	evs := chainEvents(t, e.Store, "p-1")
	if len(evs) < 6 {
		t.Fatalf("only %d events", len(evs))
	}
	for i, ev := range evs {
		if ev.Seq == nil || *ev.Seq != int64(i+1) || ev.Hash == nil {
			t.Fatalf("event %d (%s) is not link %d: seq %v", ev.ID, ev.Kind, i+1, ev.Seq)
		}
	}
	c := verifyOne(t, e.Store, "p-1")
	if !c.OK || c.Chained != len(evs) || c.Seq != int64(len(evs)) || c.Head != *evs[len(evs)-1].Hash {
		t.Fatalf("verify: %+v (events %d)", c, len(evs))
	}
	if n := apptest.VerifyChains(t, e.Store); n < 1 {
		t.Fatalf("verify all saw %d runs", n)
	}
}

// seedChain writes five events of key with meta and detail the tampering changes.
func seedChain(t *testing.T, st store.Store, key string) []store.ChainEvent {
	t.Helper()
	for i := range 5 {
		detail := json.RawMessage(fmt.Sprintf(`{"n": %d, "b": "ü", "a": {"y": 1, "x": [true, null]}}`, i))
		if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: fmt.Sprintf("k%d", i), Version: int64(i),
			Actor: "user:ann", Meta: json.RawMessage(`{"trace_id":"t"}`), Detail: detail}); err != nil {
			t.Fatal(err)
		}
	}
	evs := chainEvents(t, st, key)
	if c := verifyOne(t, st, key); !c.OK || c.Chained != 5 {
		t.Fatalf("before tampering: %+v", c)
	}
	return evs
}

func testChainTamper(t *testing.T, b storetest.Backend) {
	tests := []struct {
		name    string
		tamper  func(t *testing.T, st store.Store, evs []store.ChainEvent)
		bad     int    // index of the first bad event in evs; -1: none named; 5: a new one
		problem string // in the problem
	}{
		{"UpdateDetail", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			allowEventUpdates(t, st)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE events SET detail = '{"n": 2, "b": "ü", "a": {"y": 1, "x": [true, false]}}' WHERE id = $1`), evs[2].ID)
		}, 2, "does not match its hash"},
		{"UpdateActor", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			allowEventUpdates(t, st)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE events SET actor = 'user:bob' WHERE id = $1`), evs[0].ID)
		}, 0, "does not match its hash"},
		{"UpdateAndRehash", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			// A careful attacker recomputes the changed event's own hash: the next link,
			// which hashed the old one, gives it away.
			allowEventUpdates(t, st)
			ev := evs[1]
			ev.Actor = "user:mallory"
			prev := *evs[0].Hash
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE events SET actor = $1, chain_hash = $2 WHERE id = $3`), ev.Actor, store.ChainHash(prev, ev), ev.ID)
		}, 2, "does not match its hash"},
		{"DeleteMiddle", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			storetest.ExecRaw(t, st, rawSQL(st, `DELETE FROM events WHERE id = $1`), evs[2].ID)
		}, 3, "link 3 is missing"},
		{"DeleteFirst", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			storetest.ExecRaw(t, st, rawSQL(st, `DELETE FROM events WHERE id = $1`), evs[0].ID)
		}, 1, "link 1 is missing"},
		{"DeleteLast", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			storetest.ExecRaw(t, st, rawSQL(st, `DELETE FROM events WHERE id = $1`), evs[4].ID)
		}, -1, "the events after it were deleted"},
		{"ReorderLinks", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			allowEventUpdates(t, st)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE events SET chain_seq = CASE WHEN id = $1 THEN 3 ELSE 2 END WHERE id IN ($1, $2)`), evs[1].ID, evs[2].ID)
		}, 2, "does not match its hash"},
		{"ReorderTimes", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			allowEventUpdates(t, st)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE events SET at = (SELECT max(at) FROM events) WHERE id = $1`), evs[3].ID)
		}, 3, "does not match its hash"},
		{"SwapContent", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			allowEventUpdates(t, st)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE events SET kind = CASE WHEN id = $1 THEN 'k4' ELSE 'k3' END WHERE id IN ($1, $2)`), evs[3].ID, evs[4].ID)
		}, 3, "does not match its hash"},
		{"InsertAroundTheChain", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			if _, ok := st.(*postgres.Store); ok {
				storetest.ExecRaw(t, st, `ALTER TABLE events DISABLE TRIGGER events_chain`)
				storetest.ExecRaw(t, st, `INSERT INTO events (run_key, at, kind) VALUES ('t', now(), 'forged')`)
				return
			}
			storetest.ExecRaw(t, st, `DROP TRIGGER events_chain`)
			storetest.ExecRaw(t, st, `INSERT INTO events (run_key, at, kind) VALUES ('t', 1, 'forged')`)
		}, 5, "has no link"},
		{"EraseLink", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			allowEventUpdates(t, st)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE events SET chain_seq = NULL, chain_hash = NULL WHERE id = $1`), evs[3].ID)
		}, 3, "has no link"},
		{"DeleteHead", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			storetest.ExecRaw(t, st, `DELETE FROM event_chains WHERE run_key = 't'`)
		}, 0, "head is missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := b.Open(t, nil)
			evs := seedChain(t, st, "t")
			seedChain(t, st, "untouched")
			tt.tamper(t, st, evs)
			c := verifyOne(t, st, "t")
			if c.OK || !strings.Contains(c.Problem, tt.problem) {
				t.Fatalf("after %s: %+v, want a problem with %q", tt.name, c, tt.problem)
			}
			switch {
			case tt.bad == -1 && c.BadEventID != 0, tt.bad >= 0 && tt.bad < len(evs) && c.BadEventID != evs[tt.bad].ID,
				tt.bad == len(evs) && c.BadEventID <= evs[len(evs)-1].ID:
				t.Fatalf("after %s: first bad event %d, want the one at %d (%d..%d)", tt.name, c.BadEventID, tt.bad, evs[0].ID, evs[4].ID)
			}
			if u := verifyOne(t, st, "untouched"); !u.OK {
				t.Fatalf("the other run: %+v", u)
			}
		})
	}
}

// testChainBefore strips the links of a run's first events, as the rows written before
// 0015 have none: the chain starts at the first event after, and verify says so.
func testChainBefore(t *testing.T, e *apptest.Env) {
	for i := range 2 {
		if _, err := e.Store.EventInsert(ctx, store.EventInsertParams{RunKey: "old", Kind: fmt.Sprintf("old%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	allowEventUpdates(t, e.Store)
	storetest.ExecRaw(t, e.Store, `UPDATE events SET chain_seq = NULL, chain_hash = NULL WHERE run_key = 'old'`)
	storetest.ExecRaw(t, e.Store, `DELETE FROM event_chains WHERE run_key = 'old'`)
	c := verifyOne(t, e.Store, "old")
	if !c.OK || c.Unchained != 2 || c.Chained != 0 {
		t.Fatalf("before the chain: %+v", c)
	}
	ev, err := e.Store.EventInsert(ctx, store.EventInsertParams{RunKey: "old", Kind: "new"})
	if err != nil {
		t.Fatal(err)
	}
	c = verifyOne(t, e.Store, "old")
	if !c.OK || c.Unchained != 2 || c.Chained != 1 || c.UnchainedBefore != ev.ID {
		t.Fatalf("after the chain began: %+v (new event %d)", c, ev.ID)
	}
}

// testChainRace has writers race on one run: events in their own transactions, claims
// refused as duplicates (no lease: the claim statement's own events), events written in
// transactions that also read the run. One chain results, every link in it.
func testChainRace(t *testing.T, e *apptest.Env) {
	e.Claim(t, "race", "h")
	const writers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				var err error
				switch i % 3 {
				case 0:
					_, err = e.Runs.Claim(ctx, runs.ClaimRequest{Key: "race", PayloadHash: "h", Actor: fmt.Sprintf("w%d", w)})
				case 1:
					_, err = e.Store.EventInsert(ctx, store.EventInsertParams{RunKey: "race", Kind: "note", Actor: fmt.Sprintf("w%d", w)})
				default:
					err = e.Store.Transact(ctx, func(q store.Queries) error {
						if _, err := q.RunGet(ctx, "race"); err != nil {
							return err
						}
						for j := range 2 {
							if _, err := q.EventInsert(ctx, store.EventInsertParams{RunKey: "race", Kind: "pair", Version: int64(j)}); err != nil {
								return err
							}
						}
						return nil
					})
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	evs := chainEvents(t, e.Store, "race")
	c := verifyOne(t, e.Store, "race")
	if !c.OK || c.Chained != len(evs) || c.Seq != int64(len(evs)) {
		t.Fatalf("after the race: %+v with %d events", c, len(evs))
	}
	seen := map[int64]bool{}
	for _, ev := range evs {
		if seen[*ev.Seq] {
			t.Fatalf("link %d twice: the chain forked", *ev.Seq)
		}
		seen[*ev.Seq] = true
	}
}

// testChainFirstRace has eight writers start the chains of runs that have none yet, at
// the same moment: on PostgreSQL each finds no head row, and all but one then meet the
// head's primary key (0034's trigger inserts the first head plainly and, on that
// conflict, updates the winner's). Every run's chain must hold each event once, in order.
func testChainFirstRace(t *testing.T, e *apptest.Env) {
	const writers, runs = 8, 12
	for r := range 2 * runs {
		key := fmt.Sprintf("first-%d", r)
		if r >= runs {
			// A run's key, its run taken without an event (the plain claim statement): on
			// PostgreSQL its head goes into the run's row, which the racing first events
			// take in turns (0035).
			key = fmt.Sprintf("run-first-%d", r)
			if _, err := e.Store.RunClaim(ctx, store.RunClaimParams{Key: key, PayloadHash: "h", Owner: "o", Lease: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Go(func() {
				<-start
				if _, err := e.Store.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: "note", Actor: fmt.Sprintf("w%d", w)}); err != nil {
					errs <- err
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		evs := chainEvents(t, e.Store, key)
		c := verifyOne(t, e.Store, key)
		if len(evs) != writers || !c.OK || c.Chained != writers || c.Seq != writers {
			t.Fatalf("%s after the race: %+v with %d events", key, c, len(evs))
		}
	}
}

// testChainRetention purges a run's older events: the kept chain verifies from the last
// link retention deleted, and an event deleted otherwise is still found.
func testChainRetention(t *testing.T, e *apptest.Env) {
	// "r" has no run (its head is a row of event_chains); "run-r" is a claimed run (on
	// PostgreSQL its head is in the run's row, 0035), its claim the first event.
	for _, key := range []string{"r", "run-r"} {
		old, recent := e.Clock.Now().Add(-500*24*time.Hour), e.Clock.Now()
		var kept []store.Event
		for i := range 7 {
			at := old
			if i >= 4 {
				at = recent
			}
			if i == 0 && key == "run-r" {
				if _, err := e.Store.Claim(ctx, store.ClaimParams{RunClaimParams: store.RunClaimParams{Key: key, PayloadHash: "h",
					Owner: "o", Lease: time.Minute, Now: &at}, Actor: "test", AlertAfter: 100}); err != nil {
					t.Fatal(err)
				}
				continue
			}
			ev, err := e.Store.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: fmt.Sprintf("k%d", i), Now: &at})
			if err != nil {
				t.Fatal(err)
			}
			if i >= 4 {
				kept = append(kept, ev)
			}
		}
		if _, err := e.Store.Purge(ctx, store.PurgeParams{PayloadsBefore: recent.Add(-time.Hour), EventsBefore: recent.Add(-time.Hour), Now: recent}); err != nil {
			t.Fatal(err)
		}
		c := verifyOne(t, e.Store, key)
		if !c.OK || c.Purged != 4 || c.Chained != 3 || c.Events != 3 {
			t.Fatalf("%s after the purge: %+v", key, c)
		}
		storetest.ExecRaw(t, e.Store, rawSQL(e.Store, `DELETE FROM events WHERE id = $1`), kept[0].ID)
		c = verifyOne(t, e.Store, key)
		if c.OK || c.BadEventID != kept[1].ID || !strings.Contains(c.Problem, "link 5 is missing") {
			t.Fatalf("%s: a kept event deleted after the purge: %+v", key, c)
		}
		// The cleanup's check would find the deletion too: it is this test's point.
		storetest.ExecRaw(t, e.Store, rawSQL(e.Store, `DELETE FROM events WHERE run_key = $1`), key)
		storetest.ExecRaw(t, e.Store, rawSQL(e.Store, `DELETE FROM event_chains WHERE run_key = $1`), key)
		storetest.ExecRaw(t, e.Store, rawSQL(e.Store, `DELETE FROM workflow_runs WHERE idempotency_key = $1`), key)
	}
}
