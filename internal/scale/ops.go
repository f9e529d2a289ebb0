package scale

import (
	"context"
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// OpenTraced opens a migrated PostgreSQL store on a fresh schema of the test server
// (storetest.NewPostgresSchema) whose connections report every statement to tracer;
// closed when t ends.
func OpenTraced(t testing.TB, tracer pgx.QueryTracer) *postgres.Store {
	t.Helper()
	cfg := storetest.NewPostgresSchema(t)
	cfg.ConnConfig.Tracer = tracer
	ctx := context.Background()
	st, err := postgres.OpenConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

// WithHistory generates history in st (storetest.GenerateScale: runsN runs and eventsN
// events, ending 8 days before the test clock's now) and returns the services over it.
func WithHistory(t testing.TB, st *postgres.Store, runsN, eventsN int) *apptest.EffectsEnv {
	t.Helper()
	e := apptest.NewEffectsEnv(t, storetest.Backend{Name: "postgres", Open: func(testing.TB, *storetest.Clock) store.Store { return st }}, "")
	end := e.Clock.Now().Add(-8 * 24 * time.Hour)
	if err := storetest.GenerateScale(context.Background(), st.Pool(), storetest.Scale{Runs: runsN, Events: eventsN, End: end}, t.Logf); err != nil {
		t.Fatal(err)
	}
	return e
}

// OpKey is the context key under which an operation's name travels to a statement
// tracer: context.WithValue(ctx, OpKey{}, name).
type OpKey struct{}

// OpName is the name of the operation ctx was made for ("" outside one).
func OpName(ctx context.Context) string { s, _ := ctx.Value(OpKey{}).(string); return s }

// DML matches a statement that reads or changes rows (what EXPLAIN can plan).
var DML = regexp.MustCompile(`(?is)^\s*(select|insert|update|delete|with)\b`)

// HotOperations runs every hot operation once through op (which names it and fails the
// test on an error): TestHotQueriesUseIndexes EXPLAINs the statements they send, and
// internal/app's TestCitusPlan and TestCitusRouting check each against the scale-out plan.
func HotOperations(e *apptest.EffectsEnv, st *postgres.Store, op func(name string, fn func(ctx context.Context) error)) {
	var claimed store.Run
	op("claim", func(ctx context.Context) error {
		res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "hot-1", PayloadHash: "h", Actor: "test"})
		claimed = res.Run
		return err
	})
	op("duplicate claim", func(ctx context.Context) error {
		_, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "hot-1", PayloadHash: "h", Actor: "test"})
		return err
	})
	op("heartbeat", func(ctx context.Context) error {
		_, err := e.Runs.Heartbeat(ctx, runs.LeaseRequest{Key: "hot-1", Owner: claimed.LeaseOwner, Version: claimed.Version, Actor: "test"}, time.Minute)
		return err
	})
	op("queue", func(ctx context.Context) error {
		for _, action := range []string{"note", "task"} {
			if _, _, _, err := e.Effects.Queue(ctx, effects.QueueRequest{Key: "hot-1", Owner: claimed.LeaseOwner, Version: claimed.Version,
				ActionType: action, Target: "default", Payload: json.RawMessage(`{"n":1}`), Actor: "test"}); err != nil {
				return err
			}
		}
		return nil
	})
	op("dispatch", func(ctx context.Context) error { _, err := e.Dispatcher.Tick(ctx); return err })
	op("worker claim", func(ctx context.Context) error {
		_, _, err := e.Effects.WorkerClaim(ctx, []string{"task"}, time.Minute, "worker")
		return err
	})
	op("get", func(ctx context.Context) error {
		if _, err := e.Runs.Get(ctx, "hot-1"); err != nil {
			return err
		}
		_, err := e.Effects.List(ctx, store.EffectListParams{RunKey: "hot-1", Limit: 100})
		return err
	})
	a := audit.New(st, e.Clock.Now)
	op("explain", func(ctx context.Context) error {
		for _, key := range []string{"hot-1", "gen-77"} {
			if _, err := a.Explain(ctx, key); err != nil {
				return err
			}
		}
		return nil
	})
	op("report", func(ctx context.Context) error { _, err := a.ReportLast(ctx, 7*24*time.Hour); return err })
	op("effect counts", func(ctx context.Context) error { _, err := st.EffectCountByState(ctx); return err })
	op("purge", func(ctx context.Context) error {
		for _, dry := range []bool{true, false} {
			if _, err := retention.Purge(ctx, st, e.Policy, e.Clock.Now(), dry); err != nil {
				return err
			}
		}
		return nil
	})
	op("runs list", func(ctx context.Context) error {
		old := e.Clock.Now().Add(-24 * time.Hour)
		for _, p := range []store.RunListParams{
			{}, {State: store.StateCompleted}, {KeyPrefix: "gen-1"}, {KeyPrefix: "gen-1999"}, {OlderThan: &old}, {ActionType: "note"},
			{After: store.Cursor{At: old, ID: "gen-5"}}, {StalledAt: &old},
			{State: store.StateAwaitingHuman, ActionType: "note", After: store.Cursor{At: old, ID: "gen-5"}},
			{KeyPrefix: "gen-1", OlderThan: &old, ActionType: "note", After: store.Cursor{At: old, ID: "gen-5"}},
		} {
			p.Limit = 50
			if _, err := st.RunList(ctx, p); err != nil {
				return err
			}
		}
		return nil
	})
	now := e.Clock.Now()
	for _, l := range ConsoleLists(&now) {
		op("console: "+l.Name, func(ctx context.Context) error { _, err := l.Run(ctx, st); return err })
	}
}

// ConsoleList is one of the console's lists, read as its first page.
type ConsoleList struct {
	Name string
	Run  func(ctx context.Context, st store.Store) (int, error)
}

// ConsoleLists are the console's three lists; pending approvals are those unexpired at now.
func ConsoleLists(now *time.Time) []ConsoleList {
	return []ConsoleList{
		{"parked runs", func(ctx context.Context, st store.Store) (int, error) {
			r, err := st.RunsParked(ctx, store.Cursor{}, 51)
			return len(r), err
		}},
		{"unknown effects", func(ctx context.Context, st store.Store) (int, error) {
			r, err := st.EffectsInState(ctx, store.EffectUnknown, store.Cursor{}, 51)
			return len(r), err
		}},
		{"pending approvals", func(ctx context.Context, st store.Store) (int, error) {
			r, err := st.ApprovalsPending(ctx, store.Cursor{}, now, 100)
			return len(r), err
		}},
	}
}

// RunLists are first pages of the runs list (GET /v1/runs and the console's runs page)
// with no state given, which read every state: the newest runs, those created at or
// before now, those with an effect or approval of type note, and the page after a
// cursor at now.
func RunLists(now *time.Time) []ConsoleList {
	page := func(p store.RunListParams) func(ctx context.Context, st store.Store) (int, error) {
		p.Limit = audit.RunListPage
		return func(ctx context.Context, st store.Store) (int, error) {
			r, err := st.RunList(ctx, p)
			return len(r), err
		}
	}
	return []ConsoleList{
		{"runs", page(store.RunListParams{})},
		{"runs older than", page(store.RunListParams{OlderThan: now})},
		{"runs by action type", page(store.RunListParams{ActionType: "note"})},
		{"runs after a cursor", page(store.RunListParams{After: store.Cursor{At: *now, ID: "~"}})},
	}
}
