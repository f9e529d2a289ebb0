package audit_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestEventMAC is the audit key's conformance suite (0028_event_mac.sql, store/mac.go):
// every path that writes events seals them on both backends, and a row inserted or
// rewritten with SQL alone — even with every later link and the head recomputed, which
// needs no secret — fails verify by its MAC.
func TestEventMAC(t *testing.T) {
	key := newKey(t)
	storetest.EachKeyed(t, key, func(t *testing.T, b storetest.Backend) {
		t.Run("EveryPathSealed", func(t *testing.T) { testMACPaths(t, apptest.NewEffectsEnv(t, b, ""), key) })
		t.Run("Tampering", func(t *testing.T) { testMACTamper(t, b, key) })
		t.Run("UnkeyedAndRotated", func(t *testing.T) { testMACRotation(t, b, key) })
	})
}

func newKey(t *testing.T) *store.AuditKey {
	t.Helper()
	k, err := store.NewAuditKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func verifyKeyed(t *testing.T, st store.Store, key string, opt audit.VerifyOptions) audit.ChainCheck {
	t.Helper()
	var err error
	if opt.KeyedSince, err = st.ChainFirstKeyed(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := audit.New(st, nil).VerifyChainWith(ctx, key, opt)
	if err != nil {
		t.Fatalf("verify %q: %v", key, err)
	}
	return c
}

// testMACPaths writes events the ways airlock does (the claim, a refusal, an effect sent
// by the dispatcher — PostgreSQL's batched insert — a transition) and checks each one
// carries a MAC that holds.
func testMACPaths(t *testing.T, e *apptest.EffectsEnv, key *store.AuditKey) {
	r := e.ClaimRun(t, "p-1")
	_, _ = e.Runs.Claim(ctx, runs.ClaimRequest{Key: "p-1", PayloadHash: "other", Actor: "test"})
	e.Queue(t, "p-1", "note", "default", `{"note":"zwölf – 12 <b>","z":1e2,"a":[1.50,2,{"k":"v"}]}`)
	if _, err := e.Dispatcher.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: runs.LeaseRequest{Key: "p-1", Owner: r.LeaseOwner,
		Version: r.Version, Actor: "test"}, To: store.StateCompleted}); err != nil {
		t.Fatal(err)
	}
	evs := chainEvents(t, e.Store, "p-1")
	kinds := map[string]bool{}
	for _, ev := range evs {
		kinds[ev.Kind] = true
		if ev.MACKey == nil || *ev.MACKey != key.ID() || ev.MAC == nil {
			t.Fatalf("event %d (%s) is not sealed: %v %v", ev.ID, ev.Kind, ev.MACKey, ev.MAC)
		}
	}
	for _, k := range []string{"claimed", "payload_mismatch", "effect_queued", "effect_completed", "transition"} {
		if !kinds[k] {
			t.Fatalf("no %s event among %v", k, kinds)
		}
	}
	c := verifyKeyed(t, e.Store, "p-1", audit.VerifyOptions{Keys: store.NewKeyring(key), RequireMAC: true})
	if !c.OK || c.Keyed != len(evs) || c.Unkeyed != 0 {
		t.Fatalf("verify: %+v (events %d)", c, len(evs))
	}
}

// relink is the attacker's next step after a change: every link of the run from the
// first recomputed with the public hash, and the head set to the last, so the chain
// alone no longer shows the change (updates already allowed).
func relink(t *testing.T, st store.Store, key string) {
	t.Helper()
	prev := ""
	var seq int64
	for _, ev := range chainEvents(t, st, key) {
		h := store.ChainHash(prev, ev)
		storetest.ExecRaw(t, st, rawSQL(st, `UPDATE events SET chain_hash = $1 WHERE id = $2`), h, ev.ID)
		prev, seq = h, *ev.Seq
	}
	storetest.ExecRaw(t, st, rawSQL(st, `UPDATE event_chains SET head = $1, seq = $2 WHERE run_key = $3`), prev, seq, key)
}

// forge inserts an approval decision with SQL, as someone with the database's
// credentials (and SQLite's chain function, which anyone can register) would: the
// chain's trigger links it like any other event. mac and macKey are copied from a
// genuine row, or nil.
func forge(t *testing.T, st store.Store, macKey, mac *string) {
	t.Helper()
	at := "now()"
	if _, ok := st.(*postgres.Store); !ok {
		at = "(SELECT max(at) FROM events)"
	}
	storetest.ExecRaw(t, st, rawSQL(st, `INSERT INTO events (run_key, at, kind, version, actor, detail, mac_key, mac)
		VALUES ('t', `+at+`, 'approval_decided', 1, 'person:eve', '{"decision": "approved"}', $1, $2)`), macKey, mac)
}

func testMACTamper(t *testing.T, b storetest.Backend, key *store.AuditKey) {
	tests := []struct {
		name    string
		tamper  func(t *testing.T, st store.Store, evs []store.ChainEvent)
		problem string
	}{
		{"ForgedInsert", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			forge(t, st, nil, nil)
		}, "has no MAC although events are keyed since event"},
		{"ForgedInsertWithACopiedMAC", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			forge(t, st, evs[1].MACKey, evs[1].MAC)
		}, "does not match its MAC"},
		{"ForgedInsertWithAnInventedKey", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			id, mac := "0123456789abcdef", "00:00"
			forge(t, st, &id, &mac)
		}, "sealed with audit key 0123456789abcdef, which verify was not given"},
		{"CopyOfAGenuineRow", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			storetest.ExecRaw(t, st, `INSERT INTO events (run_key, at, kind, version, actor, meta, detail, mac_key, mac)
				SELECT run_key, at, kind, version, actor, meta, detail, mac_key, mac FROM events WHERE id = `+fmt.Sprint(evs[2].ID))
		}, "repeats the MAC of event"},
		{"RewriteDetailAndRelink", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			allowEventUpdates(t, st)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE events SET detail = '{"n": 2, "b": "ü", "a": {"y": 1, "x": [true, false]}}' WHERE id = $1`), evs[2].ID)
			relink(t, st, "t")
			if c := verifyOne(t, st, "t"); !c.OK {
				t.Fatalf("the chain alone caught the relinked change: %+v", c)
			}
		}, "does not match its MAC"},
		{"RewriteActorAndRelink", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			allowEventUpdates(t, st)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE events SET actor = 'person:eve' WHERE id = $1`), evs[0].ID)
			relink(t, st, "t")
			if c := verifyOne(t, st, "t"); !c.OK {
				t.Fatalf("the chain alone caught the relinked change: %+v", c)
			}
		}, "does not match its MAC"},
		{"EraseMACAndRelink", func(t *testing.T, st store.Store, evs []store.ChainEvent) {
			allowEventUpdates(t, st)
			storetest.ExecRaw(t, st, rawSQL(st, `UPDATE events SET mac = NULL, mac_key = NULL WHERE id = $1`), evs[4].ID)
		}, "has no MAC although events are keyed since event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := b.Open(t, nil)
			evs := seedChain(t, st, "t")
			seedChain(t, st, "untouched")
			opt := audit.VerifyOptions{Keys: store.NewKeyring(key)}
			if c := verifyKeyed(t, st, "t", opt); !c.OK || c.Keyed != 5 {
				t.Fatalf("before: %+v", c)
			}
			tt.tamper(t, st, evs)
			if tt.name != "CopyOfAGenuineRow" && strings.HasPrefix(tt.name, "Forged") {
				// The chain alone passes these: the trigger linked the forged row.
				if c := verifyOne(t, st, "t"); !c.OK {
					t.Fatalf("the chain alone caught %s: %+v", tt.name, c)
				}
			}
			c := verifyKeyed(t, st, "t", opt)
			if c.OK || !strings.Contains(c.Problem, tt.problem) || c.BadEventID == 0 {
				t.Fatalf("after %s: %+v, want a problem with %q", tt.name, c, tt.problem)
			}
			if u := verifyKeyed(t, st, "untouched", opt); !u.OK {
				t.Fatalf("the untouched run: %+v", u)
			}
		})
	}
}

// testMACRotation: events written before the key was set are counted as unkeyed (a
// failure only with RequireMAC); after a rotation, events under the old key verify when
// it is kept in the keyring, and are refused by name when it is not.
func testMACRotation(t *testing.T, b storetest.Backend, key *store.AuditKey) {
	st := b.Open(t, nil)
	unkeyed := storetest.ReopenKeyed(t, st, nil, nil)
	if _, err := unkeyed.EventInsert(ctx, store.EventInsertParams{RunKey: "old", Kind: "k", Actor: "a", Detail: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if c := verifyOne(t, st, "old"); !c.OK || c.Unkeyed != 1 {
		t.Fatalf("unkeyed without a key: %+v", c)
	}
	seedChain(t, st, "t") // under key
	next := newKey(t)
	rotated := storetest.ReopenKeyed(t, st, nil, next)
	if _, err := rotated.EventInsert(ctx, store.EventInsertParams{RunKey: "t", Kind: "after_rotation", Actor: "a"}); err != nil {
		t.Fatal(err)
	}
	both := audit.VerifyOptions{Keys: store.NewKeyring(next, key)}
	if c := verifyKeyed(t, st, "old", both); !c.OK || c.Unkeyed != 1 || c.Keyed != 0 {
		t.Fatalf("old with keys: %+v", c)
	}
	var buf strings.Builder
	c := verifyKeyed(t, st, "t", both)
	if err := audit.WriteChainCheck(&buf, c); err != nil || !c.OK || c.Keyed != 6 || !strings.Contains(buf.String(), "6 MACs checked") {
		t.Fatalf("t with both keys: %+v %q", c, buf.String())
	}
	if c := verifyKeyed(t, st, "old", audit.VerifyOptions{Keys: both.Keys, RequireMAC: true}); c.OK || !strings.Contains(c.Problem, "has no MAC (--require-mac)") {
		t.Fatalf("old with --require-mac: %+v", c)
	}
	if c := verifyKeyed(t, st, "t", audit.VerifyOptions{Keys: store.NewKeyring(next)}); c.OK || !strings.Contains(c.Problem, "sealed with audit key "+key.ID()) {
		t.Fatalf("t without the old key: %+v", c)
	}
	// Without any key the MACs are counted, not checked.
	if c := verifyOne(t, st, "t"); !c.OK || c.MACsUnchecked != 6 {
		t.Fatalf("t without keys: %+v", c)
	}
	// An instance without the key writing into the keyed trail is found.
	if _, err := unkeyed.EventInsert(ctx, store.EventInsertParams{RunKey: "t", Kind: "unkeyed_writer", Actor: "a"}); err != nil {
		t.Fatal(err)
	}
	if c := verifyKeyed(t, st, "t", both); c.OK || !strings.Contains(c.Problem, "or an instance ran without the audit key") {
		t.Fatalf("t after an unkeyed writer: %+v", c)
	}
}
