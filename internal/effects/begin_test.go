package effects_test

import (
	"slices"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestBeginSendsConformance: the batch begin-mark (store.BeginSends) marks, on every
// backend, only what the kill switch allows, under its owner's live lease, on a run that
// is not failed_terminal, once; and it leaves updated_at as the lease set it.
func TestBeginSendsKillSwitchLeaseAndRun(t *testing.T) { apptest.EachEffects(t, testBeginSends) }
func TestBeginSendsNoGlobalRowIsDisabled(t *testing.T) {
	apptest.EachEffects(t, testBeginSendsNoGlobal)
}

func leaseAll(t *testing.T, e *apptest.EffectsEnv, owner string, lease time.Duration) []store.Effect {
	t.Helper()
	got, err := e.Store.LeaseEffects(ctx, store.EffectLeaseParams{Executor: store.ExecutorDispatcher,
		Caps: apptest.AllTypes(e.Policy), Owner: owner, Lease: lease, Limit: 100, Now: e.Effects.At()})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func ids(es []store.Effect) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.ID)
	}
	slices.Sort(out)
	return out
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

func testBeginSends(t *testing.T, e *apptest.EffectsEnv) {
	n1 := e.Queue(t, "b1", "note", "default", `{"n":1}`)
	n2 := e.Queue(t, "b1b", "note", "default", `{"n":2}`)
	inv := e.Queue(t, "b2", "invoice", "default", `{"n":3}`)
	crm := e.Queue(t, "b3", "crm", "default", `{"n":4}`)
	ended := e.Queue(t, "b4", "crm", "default", `{"n":5}`)
	e.Clock.Advance(time.Second)
	leased := leaseAll(t, e, "o1", time.Minute)
	apptest.Equal(t, "leased", ids(leased), sorted([]string{n1.ID, n2.ID, inv.ID, crm.ID, ended.ID}))
	before := map[string]store.Effect{}
	for _, l := range leased {
		before[l.ID] = l
	}
	if err := e.Effects.SetKillSwitch(ctx, effects.ActionScope("invoice"), false, "test", "ops"); err != nil {
		t.Fatal(err)
	}
	r := e.Current(t, "b4")
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateFailedTerminal}); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(time.Second)
	all := ids(leased)

	got, err := e.Store.BeginSends(ctx, "someone-else", all, e.Effects.At())
	apptest.Equal(t, "marked under another owner", len(got), 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err = e.Store.BeginSends(ctx, "o1", all, e.Effects.At())
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "marked", sorted(got), sorted([]string{n1.ID, n2.ID, crm.ID}))
	for _, id := range got {
		after, err := e.Effects.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		apptest.Equal(t, "updated_at after the mark", after.UpdatedAt.UnixMicro(), before[id].UpdatedAt.UnixMicro())
		apptest.Equal(t, "version after the mark", after.Version, before[id].Version+1)
		if after.SendStartedAt == nil || !after.SendStartedAt.Equal(*e.Effects.At()) {
			t.Fatalf("send_started_at = %v, want %v", after.SendStartedAt, *e.Effects.At())
		}
	}
	for _, id := range []string{inv.ID, ended.ID} {
		after, _ := e.Effects.Get(ctx, id)
		if after.SendStartedAt != nil || after.Version != before[id].Version {
			t.Fatalf("%s was marked: %+v", id, after)
		}
	}
	again, err := e.Store.BeginSends(ctx, "o1", all, e.Effects.At())
	apptest.Equal(t, "marked twice", len(again), 0)
	if err != nil {
		t.Fatal(err)
	}

	// Re-enabled: the held one is marked now. A lease that has ended marks nothing.
	if err := e.Effects.SetKillSwitch(ctx, effects.ActionScope("invoice"), true, "test", "ops"); err != nil {
		t.Fatal(err)
	}
	got, err = e.Store.BeginSends(ctx, "o1", all, e.Effects.At())
	apptest.Equal(t, "marked once re-enabled", sorted(got), []string{inv.ID})
	if err != nil {
		t.Fatal(err)
	}
	late := e.Queue(t, "b5", "note", "default", `{"n":6}`)
	e.Clock.Advance(time.Second)
	l := leaseAll(t, e, "o2", time.Minute)
	apptest.Equal(t, "leased", ids(l), []string{late.ID})
	e.Clock.Advance(time.Minute)
	got, err = e.Store.BeginSends(ctx, "o2", ids(l), e.Effects.At())
	apptest.Equal(t, "marked after the lease ended", len(got), 0)
	if err != nil {
		t.Fatal(err)
	}

	// Disabled globally: nothing.
	if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, false, "incident", "ops"); err != nil {
		t.Fatal(err)
	}
	l2 := e.Queue(t, "b6", "note", "default", `{"n":7}`)
	e.Clock.Advance(time.Second)
	l = leaseAll(t, e, "o3", time.Minute)
	apptest.Equal(t, "leased", ids(l), []string{l2.ID})
	got, err = e.Store.BeginSends(ctx, "o3", ids(l), e.Effects.At())
	apptest.Equal(t, "marked while disabled globally", len(got), 0)
	if err != nil {
		t.Fatal(err)
	}
}

// The kill switch is default-deny: without a global row nothing is marked.
func testBeginSendsNoGlobal(t *testing.T, e *apptest.EffectsEnv) {
	n := e.Queue(t, "g1", "note", "default", `{"n":1}`)
	e.Clock.Advance(time.Second)
	l := leaseAll(t, e, "o1", time.Minute)
	apptest.Equal(t, "leased", ids(l), []string{n.ID})
	storetest.ExecRaw(t, e.Store, `DELETE FROM kill_switch`)
	got, err := e.Store.BeginSends(ctx, "o1", ids(l), e.Effects.At())
	apptest.Equal(t, "marked without a global row", len(got), 0)
	if err != nil {
		t.Fatal(err)
	}
}

// TestLeaseBeginsTheListedTypes: a lease with Begin (the dispatcher's, for types whose
// provider honours the key) marks, on every backend, in its own statement, exactly what
// BeginSends would have marked of those types — what the kill switch allows, on a run that
// is not failed_terminal — and leaves the rest unmarked for BeginSends; a plain lease
// marks nothing.
func TestLeaseBeginsTheListedTypes(t *testing.T) { apptest.EachEffects(t, testLeaseBegins) }

func testLeaseBegins(t *testing.T, e *apptest.EffectsEnv) {
	lease := func(owner string, begin ...string) []store.Effect {
		t.Helper()
		got, err := e.Store.LeaseEffects(ctx, store.EffectLeaseParams{Executor: store.ExecutorDispatcher,
			Caps: apptest.AllTypes(e.Policy), Owner: owner, Lease: time.Minute, Limit: 100, Now: e.Effects.At(), Begin: begin})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	started := func(es []store.Effect) []string {
		var out []string
		for _, l := range es {
			stored, err := e.Effects.Get(ctx, l.ID)
			if err != nil {
				t.Fatal(err)
			}
			if (l.SendStartedAt == nil) != (stored.SendStartedAt == nil) || l.Version != stored.Version {
				t.Fatalf("the lease returned %+v, the store holds %+v", l, stored)
			}
			if l.SendStartedAt != nil {
				if !l.SendStartedAt.Equal(*e.Effects.At()) || !l.UpdatedAt.Equal(*e.Effects.At()) {
					t.Fatalf("%s: send_started_at %v, updated_at %v, want both %v", l.ID, l.SendStartedAt, l.UpdatedAt, *e.Effects.At())
				}
				out = append(out, l.ID)
			}
		}
		return sorted(out)
	}
	crm := e.Queue(t, "l1", "crm", "default", `{"n":1}`)
	note := e.Queue(t, "l2", "note", "default", `{"n":2}`)
	inv := e.Queue(t, "l3", "invoice", "default", `{"n":3}`)
	ended := e.Queue(t, "l4", "crm", "default", `{"n":4}`)
	if err := e.Effects.SetKillSwitch(ctx, effects.ActionScope("invoice"), false, "test", "ops"); err != nil {
		t.Fatal(err)
	}
	// A run that ended failed_terminal cancels its pending effects in the same transaction;
	// the lease's own check is for a run that ends between the two (set here by hand).
	storetest.ExecRaw(t, e.Store, `UPDATE workflow_runs SET state = 'failed_terminal' WHERE idempotency_key = 'l4'`)
	e.Clock.Advance(time.Second)
	leased := lease("o1", "crm", "invoice")
	apptest.Equal(t, "leased", ids(leased), sorted([]string{crm.ID, note.ID, inv.ID, ended.ID}))
	apptest.Equal(t, "begun by the lease", started(leased), []string{crm.ID})
	for _, l := range leased {
		apptest.Equal(t, "version after the lease", l.Version, int64(2))
	}
	// BeginSends takes the rest as before: not the held type, not the ended run's.
	got, err := e.Store.BeginSends(ctx, "o1", []string{note.ID, inv.ID, ended.ID}, e.Effects.At())
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "marked by BeginSends", sorted(got), []string{note.ID})

	// Disabled globally, or no global row: leased, none begun.
	if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, false, "incident", "ops"); err != nil {
		t.Fatal(err)
	}
	c2 := e.Queue(t, "l5", "crm", "default", `{"n":5}`)
	e.Clock.Advance(time.Second)
	l := lease("o2", "crm")
	apptest.Equal(t, "leased while disabled", ids(l), []string{c2.ID})
	apptest.Equal(t, "begun while disabled", len(started(l)), 0)
	if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, true, "over", "ops"); err != nil {
		t.Fatal(err)
	}
	storetest.ExecRaw(t, e.Store, `DELETE FROM kill_switch`)
	c3 := e.Queue(t, "l6", "crm", "default", `{"n":6}`)
	e.Clock.Advance(time.Second)
	l = lease("o3", "crm")
	apptest.Equal(t, "leased without a global row", ids(l), []string{c3.ID})
	apptest.Equal(t, "begun without a global row", len(started(l)), 0)

	// A lease without Begin marks nothing, whatever the type.
	if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, true, "back", "ops"); err != nil {
		t.Fatal(err)
	}
	c4 := e.Queue(t, "l7", "crm", "default", `{"n":7}`)
	e.Clock.Advance(time.Second)
	l = lease("o4")
	apptest.Equal(t, "leased plainly", ids(l), []string{c4.ID})
	apptest.Equal(t, "begun by a plain lease", len(started(l)), 0)
}
