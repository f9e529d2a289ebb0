package runs

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
)

// Base is what every domain service is built on (runs, failures, the outbox, approvals,
// the ledger, the alert relay, Slack): one store, one policy, one clock, the alert relay
// to wake, one log and one observer. app.New makes one and hands it to every
// constructor (NewX(base, cfg)), as River's services share a baseservice.Archetype; a
// service embeds it, so s.Store, s.Policy, s.Now, s.Log… read the same everywhere.
//
// Fill returns it with the defaults its fields' comments give; a constructor calls it
// and refuses a Base without a store.
type Base struct {
	Store  store.Store
	Policy *policy.Policy // nil: policy.Empty()
	Clock                 // Now nil: the backend's clock
	// Alerts is woken after a commit that wrote an alert event; nil: nothing is woken
	// (the relay's poll raises the alert).
	Alerts AlertWaker
	Log    *slog.Logger // nil: discarded
	// Observer counts what the services do (metrics.Metrics); nil: nothing is counted.
	Observer Observer
}

// Observer counts the services' outcomes; metrics.Metrics implements it.
type Observer interface {
	Claim(outcome string)
	Attempt(outcome string, d time.Duration) // one send by the dispatcher
	Decision(mode, decision string, wait time.Duration)
	Validation(result string)
	RetryCap()
}

// NopObserver counts nothing.
type NopObserver struct{}

func (NopObserver) Claim(string)                           {}
func (NopObserver) Attempt(string, time.Duration)          {}
func (NopObserver) Decision(string, string, time.Duration) {}
func (NopObserver) Validation(string)                      {}
func (NopObserver) RetryCap()                              {}
func (nopWaker) Wake()                                     {}

type nopWaker struct{}

// ErrNoStore: a service was built without Base.Store.
var ErrNoStore = errors.New("Base.Store is required")

// Fill checks b and gives its unset fields their defaults.
func (b Base) Fill() (Base, error) {
	if b.Store == nil {
		return b, ErrNoStore
	}
	if b.Policy == nil {
		b.Policy = policy.Empty()
	}
	if b.Alerts == nil {
		b.Alerts = nopWaker{}
	}
	if b.Log == nil {
		b.Log = slog.New(slog.DiscardHandler)
	}
	if b.Observer == nil {
		b.Observer = NopObserver{}
	}
	return b, nil
}

// Budget is a run's budget by its action type ("" for the global one), from the failure
// policy.
func (b Base) Budget(actionType string) Budget {
	p := b.Policy.BudgetsFor(actionType)
	return Budget{MaxModelCalls: p.MaxModelCalls, MaxTokens: p.MaxTokens, RunDeadline: p.RunDeadline.D()}
}

// OverBudget is the one budget check: inside the caller's transaction, with the run held
// under its lease, it ends a run that has spent its budget for actionType ("" or the
// run's own type: the run's) — failed_terminal with reason budget_exhausted and its alert
// event, at now (the caller's statements' time). exhausted names the budget spent ("":
// within it, the run unchanged). The caller wakes Alerts after the commit and refuses
// with ErrBudgetExhausted.
func (b Base) OverBudget(ctx context.Context, q store.Queries, now *time.Time, run store.Run, actionType string) (store.Run, string, error) {
	if run.ActionType != "" {
		actionType = run.ActionType
	}
	budget := b.Budget(actionType)
	if budget == (Budget{}) {
		return run, "", nil // unlimited: no need to read the clock
	}
	t, err := b.Read(ctx, q)
	if err != nil {
		return run, "", err
	}
	exhausted := BudgetExceeded(run, budget, t)
	if exhausted == "" {
		return run, "", nil
	}
	run, err = Terminate(ctx, q, now, run, Ending{Reason: "budget_exhausted", Alert: map[string]any{"budget": exhausted}, Detail: map[string]any{"budget": exhausted}})
	return run, exhausted, err
}
