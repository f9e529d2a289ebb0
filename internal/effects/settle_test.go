package effects_test

// Evidence has an age: a provider still working after the connector gave up, a lookup
// that lags behind the records, an idempotent provider answering "409 in progress".
// Each test fails on a design that takes a lookup's first "none", or a refusal after an
// ambiguous attempt, as proof.

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/store"
)

func TestProviderStillWorkingIsNotResent(t *testing.T) {
	apptest.EachEffects(t, testProviderStillWorking)
}
func TestLaggingLookupIsNotResent(t *testing.T)     { apptest.EachEffects(t, testLaggingLookup) }
func TestInProgressIsRetriedNotFailed(t *testing.T) { apptest.EachEffects(t, testInProgressRetried) }
func TestRefusalAfterAmbiguousIsUnknown(t *testing.T) {
	apptest.EachEffects(t, testRefusalAfterAmbiguous)
}
func TestConfirmedNoneQueuesAgainOnce(t *testing.T) { apptest.EachEffects(t, testConfirmedNone) }
func TestResendIsRecheckedForASecondRecord(t *testing.T) {
	apptest.EachEffects(t, testRecheckAfterResend)
}

// The outside probe's case: the provider takes longer than the connector's timeout and
// stores its record only at the end; its lookup is honest and answers at once. A "none"
// while the first request is still being processed must not queue a second.
func testProviderStillWorking(t *testing.T, e *apptest.EffectsEnv) {
	done := make(chan struct{})
	finish := make(chan struct{})
	e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			<-finish // still processing after the client gave up (timeout 2s)
			e.Provider.Store(r.Header.Get("Idempotency-Key"), "rec-1")
			close(done)
		} else {
			e.Provider.Store(r.Header.Get("Idempotency-Key"), fmt.Sprintf("rec-%d", n))
		}
		w.WriteHeader(http.StatusOK)
	})
	defer func() {
		select {
		case <-finish:
		default:
			close(finish)
		}
	}()
	eff := e.Queue(t, "slow", "invoice", "default", `{"n":1}`)
	key := effects.ProviderKey(eff)
	e.Tick(t) // times out: unknown
	apptest.Equal(t, "after the timeout", e.EffectState(t, eff.ID), store.EffectUnknown)
	// Reconciliation right away, and a little later, while the provider works on.
	for _, step := range []time.Duration{0, 30 * time.Second, time.Minute} {
		e.Clock.Advance(step)
		reconcile(t, e.Effects)
		e.Tick(t)
	}
	apptest.Equal(t, "requests while the first is processed", e.Provider.Requests(key), 1)
	apptest.Equal(t, "still unknown", e.EffectState(t, eff.ID), store.EffectUnknown)
	close(finish)
	<-done
	e.Clock.Advance(e.Policy.Settle("invoice"))
	reconcile(t, e.Effects)
	got, err := e.Effects.Get(ctx, eff.ID)
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "state", got.State, store.EffectCompleted)
	apptest.Equal(t, "receipt", got.ProviderID, "rec-1")
	apptest.Equal(t, "records at the provider", e.Provider.Stored(key), 1)
	apptest.Equal(t, "requests", e.Provider.Requests(key), 1)
}

// The provider stored the record, but its lookup shows it only later (a search index
// behind its writes): one "none" past the settle window is asked again a settle window
// later, and by then the record shows.
func testLaggingLookup(t *testing.T, e *apptest.EffectsEnv) {
	var key string
	e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusBadGateway) // performed, but ambiguous; not yet visible
	})
	eff := e.Queue(t, "lag", "invoice", "default", `{"n":1}`)
	key = effects.ProviderKey(eff)
	e.Tick(t)
	apptest.Equal(t, "after the 502", e.EffectState(t, eff.ID), store.EffectUnknown)
	e.Clock.Advance(e.Policy.Settle("invoice") + time.Second)
	reconcile(t, e.Effects) // "none": the index lags
	e.Tick(t)
	apptest.Equal(t, "requests after one none", e.Provider.Requests(key), 1)
	got, _ := e.Effects.Get(ctx, eff.ID)
	apptest.Equal(t, "class after one none", got.LastErrorClass, effects.LookupNoneClass)
	e.Provider.Store(key, "rec-1") // the index caught up
	e.Clock.Advance(e.Policy.Settle("invoice"))
	reconcile(t, e.Effects)
	e.Tick(t)
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "requests", e.Provider.Requests(key), 1)
}

// An idempotent provider: the first attempt is performed but its answer is lost (502);
// the resend arrives while the first is still in progress and gets 409; the next gets the
// first's answer. The 409 is no refusal: nothing is recorded failed, no alert.
func testInProgressRetried(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, n int) {
		switch n {
		case 1:
			e.Provider.Store(r.Header.Get("Idempotency-Key"), "crm-1")
			w.WriteHeader(http.StatusBadGateway)
		case 2:
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"error":"a request with this idempotency key is in progress"}`)
		default:
			w.WriteHeader(http.StatusOK)
			fmt.Fprint(w, `{"id":"crm-1"}`)
		}
	})
	eff := e.Queue(t, "inprog", "crm", "default", `{"n":1}`)
	for range 3 {
		e.Tick(t)
		e.Clock.Advance(time.Hour)
	}
	got, _ := e.Effects.Get(ctx, eff.ID)
	apptest.Equal(t, "state", got.State, store.EffectCompleted)
	apptest.Equal(t, "receipt", got.ProviderID, "crm-1")
	apptest.Equal(t, "requests", e.Provider.Requests(effects.ProviderKey(eff)), 3)
	if k := strings.Join(e.Alerts.Kinds(), " "); strings.Contains(k, "effect_failed") {
		t.Errorf("alerts %q: a 409 in progress was taken for a refusal", k)
	}
}

// After an ambiguous attempt, a refusal of the resend says nothing of the first request:
// the effect is unknown (not failed), and reconciliation finds what the first did.
func testRefusalAfterAmbiguous(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			e.Provider.Store(r.Header.Get("Idempotency-Key"), "crm-1")
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusUnprocessableEntity)
	})
	eff := e.Queue(t, "refused", "crm", "default", `{"n":1}`)
	e.Tick(t)
	apptest.Equal(t, "after the 502", e.EffectState(t, eff.ID), store.EffectPending)
	e.Clock.Advance(time.Hour)
	e.Tick(t)
	apptest.Equal(t, "after the 422", e.EffectState(t, eff.ID), store.EffectUnknown)
	kinds := e.Kinds(t, "refused")
	if strings.Contains(strings.Join(kinds, " "), "effect_failed") {
		t.Fatalf("events %v: a refusal after an ambiguous attempt was recorded failed", kinds)
	}
	reconcile(t, e.Effects)
	got, _ := e.Effects.Get(ctx, eff.ID)
	apptest.Equal(t, "reconciled", got.State, store.EffectCompleted)
	apptest.Equal(t, "receipt", got.ProviderID, "crm-1")

	// Once a confirmed "none" (or an operator's "not sent") proved the ambiguous request
	// absent, a refusal is a failure again.
	e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadGateway) // not performed, as it turns out
			return
		}
		w.WriteHeader(http.StatusUnprocessableEntity)
	})
	second := e.Queue(t, "refused2", "invoice", "default", `{"n":2}`)
	e.Tick(t)
	apptest.Equal(t, "after the 502", e.EffectState(t, second.ID), store.EffectUnknown)
	e.Clock.Advance(e.Policy.Settle("invoice"))
	confirmNone(t, e, e.Effects)
	got, _ = e.Effects.Get(ctx, second.ID)
	apptest.Equal(t, "after the confirmed none", got.State, store.EffectPending)
	if got.AmbiguousAt != nil {
		t.Errorf("ambiguous_at = %v after a confirmed none, want none", got.AmbiguousAt)
	}
	e.Tick(t)
	apptest.Equal(t, "refused after proof", e.EffectState(t, second.ID), store.EffectFailed)
}

// Past the settle window, two "none" answers a settle window apart queue the effect
// again, once; the requeue's event names the window.
func testConfirmedNone(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, `{"id":"inv-%d"}`, n)
	})
	eff := e.Queue(t, "none2", "invoice", "default", `{"n":1}`)
	e.Tick(t)
	settle := e.Policy.Settle("invoice")
	e.Clock.Advance(settle - time.Second)
	reconcile(t, e.Effects) // inside the window: inconclusive
	apptest.Equal(t, "inside the window", e.EffectState(t, eff.ID), store.EffectUnknown)
	e.Clock.Advance(time.Second)
	reconcile(t, e.Effects) // first none that counts
	apptest.Equal(t, "after one none", e.EffectState(t, eff.ID), store.EffectUnknown)
	e.Clock.Advance(settle / 2)
	reconcile(t, e.Effects) // not due yet
	apptest.Equal(t, "lookups", e.Provider.Lookups(), 2)
	e.Clock.Advance(settle / 2)
	reconcile(t, e.Effects)
	apptest.Equal(t, "after the second none", e.EffectState(t, eff.ID), store.EffectPending)
	e.Tick(t)
	apptest.Equal(t, "sent again", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "requests", e.Provider.Requests(effects.ProviderKey(eff)), 2)
}

// The residual risk, made visible: the first request was held past the settle window
// (both "none" answers came before it was performed), so the resend made a second
// record. The completed resend is looked up once more a settle window later: two records
// raise reconcile_several on the run. Without a late record, the recheck ends quietly.
func testRecheckAfterResend(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadGateway) // held somewhere; performed much later
			return
		}
		id := fmt.Sprintf("rec-%d", n)
		e.Provider.Store(r.Header.Get("Idempotency-Key"), id)
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, `{"id":%q}`, id)
	})
	settle := e.Policy.Settle("invoice")
	late := e.Queue(t, "late", "invoice", "default", `{"n":1}`)
	quiet := e.Queue(t, "quiet", "invoice", "default", `{"n":2}`)
	e.Tick(t)
	e.Clock.Advance(settle)
	confirmNone(t, e, e.Effects)
	e.Tick(t)
	for _, eff := range []store.Effect{late, quiet} {
		got, _ := e.Effects.Get(ctx, eff.ID)
		apptest.Equal(t, "resent "+eff.RunKey, got.State, store.EffectCompleted)
		if got.NoneConfirmedAt == nil || got.NextCheckAt == nil {
			t.Fatalf("%s: none confirmed at %v, next check %v: want both set", eff.RunKey, got.NoneConfirmedAt, got.NextCheckAt)
		}
	}
	e.Provider.Store(effects.ProviderKey(late), "rec-held") // the held first request, performed
	e.Clock.Advance(settle / 2)
	reconcile(t, e.Effects) // not due yet
	lookups := e.Provider.Lookups()
	e.Clock.Advance(settle / 2)
	reconcile(t, e.Effects)
	apptest.Equal(t, "recheck lookups", e.Provider.Lookups()-lookups, 2)
	apptest.Equal(t, "alerts", strings.Count(strings.Join(e.Alerts.Kinds(), " "), "reconcile_several:"), 1)
	apptest.Equal(t, "alerted", strings.Count(strings.Join(e.Alerts.Kinds(), " "), "reconcile_several:late"), 1)
	for _, eff := range []store.Effect{late, quiet} {
		got, _ := e.Effects.Get(ctx, eff.ID)
		apptest.Equal(t, "still completed "+eff.RunKey, got.State, store.EffectCompleted)
		if got.NextCheckAt != nil {
			t.Errorf("%s: next check %v after the recheck, want none", eff.RunKey, got.NextCheckAt)
		}
	}
	e.Clock.Advance(time.Hour)
	reconcile(t, e.Effects)
	apptest.Equal(t, "lookups after the recheck", e.Provider.Lookups()-lookups, 2)
}
