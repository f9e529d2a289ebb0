package alerts_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/airlockhq/airlock/internal/alerts"
	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

var ctx = context.Background()

// An alert is raised from its committed event (issue 32): a lost commit reply or a crash
// between the commit and the raise no longer silences it, and two relays on one database
// raise it once. Before: the code that wrote the event raised the alert after the commit,
// so (a) and (b) raised nothing, and there was no outbox for (c) to share.
func TestAlertRelay(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		// (a) The dispatcher records a refused send (effect_failed) in a statement whose
		// commit reply is lost: it retries the record, finds it applied and stops. The relay
		// (its poll: Drain) raises the alert once, counted, with the event's id.
		t.Run("LostCommitReplyStillRaises", func(t *testing.T) {
			e := apptest.NewEffectsEnv(t, b, "")
			logs := &apptest.LockedBuffer{}
			m := metrics.New()
			e.Alerts.Next = metrics.Alerter{Log: slog.New(slog.NewJSONHandler(logs, nil)), Metrics: m}
			e.Provider.Reply = func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusBadRequest) }
			eff := e.Queue(t, "lost", "invoice", "default", `{"n":1}`)

			f := &storetest.Faults{}
			svc := e.NewService(f.Wrap(e.Store), e.Clock.Now)
			var armed, fired atomic.Bool
			svc.Hook = apptest.HookOn("sent", func() { armed.Store(true) })
			// The first commit after the send is the outcome's: it commits, its reply is lost.
			f.Set(func(c storetest.Call) (storetest.When, error) {
				commits := c.Op == storetest.OpTransact || c.Op == storetest.OpWithin ||
					c.Op == storetest.OpEffectUpdate || c.Op == storetest.OpEffectUpdateMany || c.Op == storetest.OpEffectUpdateManyLocked
				if armed.Load() && !c.InTx && commits && fired.CompareAndSwap(false, true) {
					return storetest.After, nil
				}
				return storetest.Pass, nil
			})
			d := &effects.Dispatcher{Service: svc, BatchSize: 1, Lease: 2 * time.Minute}
			_, _ = d.Tick(ctx)
			if !fired.Load() {
				t.Fatal("no commit reply was lost: the test did not test what it says")
			}
			apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectFailed)

			n, err := e.Alerts.Relay.Drain(ctx) // the relay's poll
			if err != nil {
				t.Fatal(err)
			}
			apptest.Equal(t, "raised by the poll", n, 1)
			apptest.Equal(t, "alerts", e.Alerts.Kinds(), []string{"effect_failed:lost"})
			apptest.Equal(t, "airlock_alerts_total{kind=effect_failed}", counter(t, m, "effect_failed"), 1.0)
			ev := alertEvent(t, e.Store, "lost")
			apptest.Equal(t, "event ids raised", e.Alerts.EventIDs(), []int64{ev.ID})
			var line map[string]any
			if err := json.Unmarshal([]byte(strings.TrimSpace(logs.String())), &line); err != nil {
				t.Fatalf("one log line: %q: %v", logs.String(), err)
			}
			for k, want := range map[string]any{"msg": "alert", "level": "WARN", "alert": "effect_failed", "key": "lost",
				"effect_id": eff.EffectID, "error_class": "http_400", "event_id": float64(ev.ID)} {
				if line[k] != want {
					t.Errorf("log %s = %v, want %v (%s)", k, line[k], want, logs.String())
				}
			}
			if n, err := e.Alerts.Relay.Drain(ctx); err != nil || n != 0 {
				t.Fatalf("a second poll raised %d (%v): the row was not deleted", n, err)
			}
		})

		// (b) A process commits an alert and dies before its relay runs (its wake does
		// nothing); a new instance on the same database raises it from its poll.
		t.Run("CrashBetweenCommitAndRaise", func(t *testing.T) {
			e := apptest.NewEffectsEnv(t, b, "")
			r := e.ClaimRun(t, "crash")
			crashed, err := failures.New(runs.Base{Store: e.Store, Policy: e.Policy, Clock: runs.Clock{Now: e.Clock.Now}, Alerts: alerts.Polled{}})
			if err != nil {
				t.Fatal(err)
			}
			for range 3 { // max_attempts 3: the third reaches the cap, a retry_cap alert
				if _, err := crashed.Failure(ctx, failures.FailureRequest{LeaseRequest: apptest.Lease(r), Class: "transport_timeout"}); err != nil {
					t.Fatal(err)
				}
			}
			apptest.Equal(t, "nothing raised by the crashed process", len(e.Alerts.EventIDs()), 0)

			sink := &chanAlerter{c: make(chan string, 10)}
			next, err := app.New(app.Options{Store: storetest.Reopen(t, e.Store, e.Clock), Policy: e.Policy,
				Connectors: e.Conns, Now: e.Clock.Now, Alerts: sink})
			if err != nil {
				t.Fatal(err)
			}
			pollCtx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); next.Alerts.Run(pollCtx, 10*time.Millisecond) }()
			defer func() { stop(); <-done }()
			select {
			case got := <-sink.c:
				apptest.Equal(t, "raised by the new instance", got, fmt.Sprintf("retry_cap:crash:%d", alertEvent(t, e.Store, "crash").ID))
			case <-time.After(10 * time.Second): // a deadline for a failing test
				t.Fatal("the new instance never raised the alert the crashed one committed")
			}
		})

		// (c) Two instances' relays drain one outbox at once: every alert is raised, and
		// none twice (PostgreSQL: FOR UPDATE SKIP LOCKED; SQLite: one writer at a time).
		t.Run("TwoRelaysRaiseEachOnce", func(t *testing.T) {
			e := apptest.NewEffectsEnv(t, b, "")
			const n = 60
			for i := range n {
				key := fmt.Sprintf("two-%02d", i)
				if err := e.Store.Transact(ctx, func(q store.Queries) error {
					return runs.Alert(ctx, q, nil, runs.Raised{Key: key, Kind: "effect_unknown", Fields: map[string]any{"effect_id": "e"}})
				}); err != nil {
					t.Fatal(err)
				}
			}
			sinks := []*idAlerter{{}, {}}
			var relays []*alerts.Relay
			for i, st := range []store.Store{e.Store, storetest.Reopen(t, e.Store, e.Clock)} {
				r, err := alerts.New(runs.Base{Store: st}, alerts.Config{Alerter: sinks[i]})
				if err != nil {
					t.Fatal(err)
				}
				relays = append(relays, r)
			}
			var wg sync.WaitGroup
			for _, r := range relays {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 5 { // woken several times each, as by several commits
						r.Wake()
					}
					if err := r.Flush(ctx); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			all := append(sinks[0].got(), sinks[1].got()...)
			slices.Sort(all)
			apptest.Equal(t, "alerts raised", len(all), n)
			apptest.Equal(t, "each once", len(slices.Compact(all)), n)
		})
	})
}

// counter is airlock_alerts_total{kind} of m.
func counter(t *testing.T, m *metrics.Metrics, kind string) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Alerts.WithLabelValues(kind).Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetCounter().GetValue()
}

// alertEvent is the one alert event of key.
func alertEvent(t *testing.T, st store.Store, key string) store.Event {
	t.Helper()
	evs, err := st.EventList(ctx, key, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []store.Event
	for _, ev := range evs {
		if ev.Kind == string(store.EventAlert) {
			out = append(out, ev)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d alert events on %s, want 1", len(out), key)
	}
	return out[0]
}

// chanAlerter sends kind:key:event_id of each alert on c.
type chanAlerter struct{ c chan string }

func (a *chanAlerter) Alert(_ context.Context, kind, key string, attrs ...slog.Attr) {
	a.c <- fmt.Sprintf("%s:%s:%d", kind, key, eventID(attrs))
}

// idAlerter keeps the event ids of the alerts it was given.
type idAlerter struct {
	mu  sync.Mutex
	ids []int64
}

func (a *idAlerter) Alert(_ context.Context, _, _ string, attrs ...slog.Attr) {
	a.mu.Lock()
	a.ids = append(a.ids, eventID(attrs))
	a.mu.Unlock()
}

func (a *idAlerter) got() []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.ids)
}

func eventID(attrs []slog.Attr) int64 {
	for _, at := range attrs {
		if at.Key == "event_id" {
			return at.Value.Int64()
		}
	}
	return 0
}

// Decode gives the log fields the code that wrote the event used to log: whole numbers
// as integers, in name order.
func TestDecode(t *testing.T) {
	kind, attrs := alerts.Decode(json.RawMessage(`{"alert":"retry_cap","class":"transport_timeout","attempts":3,"ratio":0.5,"ok":true}`))
	apptest.Equal(t, "kind", kind, "retry_cap")
	apptest.Equal(t, "attrs", fmt.Sprint(attrs), "[attempts=3 class=transport_timeout ok=true ratio=0.5]")
	apptest.Equal(t, "attempts is an int", attrs[0].Value.Kind(), slog.KindInt64)
	kind, _ = alerts.Decode(json.RawMessage(`not json`))
	apptest.Equal(t, "undecodable", kind, "unknown")
}
