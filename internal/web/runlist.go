package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// ---- Runs: the list behind the Run page ----

type runsPage struct {
	consoleFrame
	Runs []store.Run
	// The filters as given (the form shows them again).
	State, ActionType, OlderThan, KeyPrefix string
	States, ActionTypes                     []string
	// Stalled keeps only the stalled runs (processing, lease lapsed).
	Stalled  bool
	Filtered bool
	// Next and First are the links to the next page and back to the first, filters kept.
	Next, First string
}

// consoleRuns is the runs list: GET /v1/runs's filters, read by the same function
// (audit.RunFilter) and listed by the same store query (RunList), in keyset pages. A bad
// filter is the 400 page saying which and why; nothing is looked up.
func (w *Web) consoleRuns(rw http.ResponseWriter, r *http.Request, v viewer) error {
	q := r.URL.Query()
	p := runsPage{consoleFrame: w.frame(r, v, "Runs", "runs"), State: q.Get("state"), ActionType: q.Get("action_type"),
		OlderThan: q.Get("older_than"), KeyPrefix: q.Get("key_prefix"), Stalled: q.Get("stalled") == "true", ActionTypes: w.console.Policy.ActionTypes()}
	for _, s := range store.States {
		p.States = append(p.States, string(s))
	}
	if p.ActionType != "" && !slices.Contains(p.ActionTypes, p.ActionType) {
		p.ActionTypes = append(p.ActionTypes, p.ActionType) // a type no longer in the policy still has runs
	}
	params, err := audit.RunFilter(q, func() (time.Time, error) { return p.Now, nil })
	var fe *runs.FieldError
	if errors.As(err, &fe) {
		return w.consoleRefusal(r, v, http.StatusBadRequest, "Not shown",
			fmt.Sprintf("The %s filter %s. Nothing was looked up.", fe.Field, fe.Msg), "/console/runs")
	}
	if err != nil {
		return fmt.Errorf("runs: %w", err)
	}
	p.Filtered = p.State != "" || p.ActionType != "" || p.OlderThan != "" || p.KeyPrefix != "" || p.Stalled
	if p.Runs, err = w.store.RunList(r.Context(), params); err != nil {
		return fmt.Errorf("runs: %w", err)
	}
	keep := url.Values{}
	for _, k := range []string{"state", "action_type", "older_than", "key_prefix", "stalled", "limit"} {
		if s := q.Get(k); s != "" {
			keep.Set(k, s)
		}
	}
	if !params.After.IsZero() {
		p.First = "/console/runs?" + keep.Encode()
	}
	if len(p.Runs) == params.Limit {
		keep.Set("after", audit.RunCursor(p.Runs[len(p.Runs)-1]))
		p.Next = "/console/runs?" + keep.Encode()
	}
	return w.renderConsole(rw, http.StatusOK, "console_runs.html", p)
}

// ---- Pending approvals: every one, for operators ----

type approvalsPage struct {
	consoleFrame
	Approvals []pendingApproval
	Next      string
}

// pendingApproval is a pending approval as an operator sees it: who may decide it and
// until when, never its payload (the card is for those who may decide it).
type pendingApproval struct {
	store.Approval
	Approvers string
	Mine      bool   // the viewer may decide it: the card is linked
	Notes     string // the expiry warning sent, the escalation (rowNotes)
}

// consoleApprovals lists every pending approval, newest first, in keyset pages of
// ApprovalsPending (the list Waiting for me filters by the person): an operator reaches
// each stuck approval and its run without being its approver.
func (w *Web) consoleApprovals(rw http.ResponseWriter, r *http.Request, v viewer) error {
	p := approvalsPage{consoleFrame: w.frame(r, v, "Pending approvals", "approvals")}
	now := p.Now
	list, next, err := w.pendingApprovals(r.Context(), parseCursor(r.URL.Query().Get("after")), now, consolePageSize)
	if err != nil {
		return fmt.Errorf("pending approvals: %w", err)
	}
	p.Next = next
	for _, a := range list {
		p.Approvals = append(p.Approvals, pendingApproval{Approval: a, Approvers: approverNames(a), Mine: approvals.May(a, *v.Person) == nil,
			Notes: rowNotes(a, now)})
	}
	return w.renderConsole(rw, http.StatusOK, "console_approvals.html", p)
}

// pendingApprovals reads up to limit pending approvals after the cursor, other than the
// cancel links of act_with_window effects (listed on their runs); next is the cursor of
// the page after, "" at the end. It reads at most ten batches.
func (w *Web) pendingApprovals(ctx context.Context, after store.Cursor, now time.Time, limit int) ([]store.Approval, string, error) {
	var out []store.Approval
	batch := min(2*limit, 500)
	for range 10 {
		as, err := w.store.ApprovalsPending(ctx, after, &now, batch)
		if err != nil {
			return nil, "", err
		}
		for _, a := range as {
			after = store.Cursor{At: a.CreatedAt, ID: a.ID}
			if slices.Equal(a.AllowedDecisions, []string{approvals.Cancel}) {
				continue
			}
			if out = append(out, a); len(out) == limit {
				return out, formatCursor(after.At, after.ID), nil
			}
		}
		if len(as) < batch {
			return out, "", nil
		}
	}
	return out, formatCursor(after.At, after.ID), nil
}

func approverNames(a store.Approval) string {
	var who []string
	for _, role := range a.ApproverRoles {
		who = append(who, "role "+role)
	}
	who = append(who, a.ApproverSubjects...)
	if a.EscalatedAt != nil { // May admits them from then on
		for _, role := range a.EscalationRoles {
			who = append(who, "role "+role+" (escalated)")
		}
	}
	if len(who) == 0 {
		return "–"
	}
	return strings.Join(who, ", ")
}

// ---- Outstanding now, on This week ----

// outstandingCap bounds what This week counts of pending approvals and parked runs (no
// counter keeps them): past it the tile says "1000+" and the list pages have them all.
const outstandingCap = 1000

// count is a tile's number: N, or Cap+ when there are more.
type count struct {
	N    int
	More bool
}

func (c count) String() string {
	if c.More {
		return fmt.Sprintf("%d+", c.N)
	}
	return fmt.Sprint(c.N)
}

// outstanding counts the pending approvals (as the Pending approvals page lists them)
// and the parked runs (as the Parked runs page does), each up to outstandingCap.
func (w *Web) outstanding(ctx context.Context, now time.Time) (pending, parked count, err error) {
	as, next, err := w.pendingApprovals(ctx, store.Cursor{}, now, outstandingCap)
	if err != nil {
		return pending, parked, fmt.Errorf("pending approvals: %w", err)
	}
	pending = count{N: len(as), More: next != ""}
	var after store.Cursor
	for parked.N < outstandingCap {
		rs, err := w.store.RunsParked(ctx, after, 500)
		if err != nil {
			return pending, parked, fmt.Errorf("parked runs: %w", err)
		}
		parked.N += len(rs)
		if len(rs) < 500 {
			return pending, parked, nil
		}
		last := rs[len(rs)-1]
		after = store.Cursor{At: last.UpdatedAt, ID: last.Key}
	}
	parked.N, parked.More = outstandingCap, true
	return pending, parked, nil
}

// UnsentAfter is how long an approved or queued effect of a dispatcher or a worker may
// wait, due, before This week counts it as waiting to be sent (no sender is taking it).
const UnsentAfter = 10 * time.Minute

// trouble is the rest of Outstanding now: work that ended, or waits, without its effect.
type trouble struct {
	// Stalled: processing with the lease lapsed (/console/runs?stalled=true).
	Stalled count
	// Released: failed_retryable, waiting for the next delivery of the key.
	Released count
	// FailedNoEffect: failed_terminal runs created since the report's start, not
	// replaced, none of whose effects was sent. RejectedOpen: rejected runs created since
	// then that still hold an effect that is pending or planned.
	FailedNoEffect, RejectedOpen count
	// Unsent: effects of a dispatcher or a worker due for UnsentAfter or longer.
	Unsent count
}

// runsCount counts the runs RunList gives for p, up to outstandingCap.
func (w *Web) runsCount(ctx context.Context, p store.RunListParams) (count, error) {
	p.Limit = outstandingCap + 1
	rs, err := w.store.RunList(ctx, p)
	if err != nil {
		return count{}, err
	}
	if len(rs) > outstandingCap {
		return count{N: outstandingCap, More: true}, nil
	}
	return count{N: len(rs)}, nil
}

// endedWithout counts the runs in state created since, newest first, that keep is true
// of (up to outstandingCap looked at).
func (w *Web) endedWithout(ctx context.Context, state store.State, since time.Time, keep func([]store.Effect) bool) (count, error) {
	var c count
	p := store.RunListParams{State: state, Limit: 200}
	looked := 0
	for {
		rs, err := w.store.RunList(ctx, p)
		if err != nil {
			return c, err
		}
		for _, r := range rs {
			if r.CreatedAt.Before(since) {
				return c, nil
			}
			if looked++; looked > outstandingCap {
				c.More = true
				return c, nil
			}
			if r.ReplacedBy != "" {
				continue
			}
			effs, err := w.store.EffectList(ctx, store.EffectListParams{RunKey: r.Key})
			if err != nil {
				return c, err
			}
			if keep(effs) {
				c.N++
			}
		}
		if len(rs) < p.Limit {
			return c, nil
		}
		p.After = store.Cursor{At: rs[len(rs)-1].CreatedAt, ID: rs[len(rs)-1].Key}
	}
}

// troubleNow counts the trouble at now, for the week since since.
func (w *Web) troubleNow(ctx context.Context, now, since time.Time) (trouble, error) {
	var t trouble
	var err error
	if t.Stalled, err = w.runsCount(ctx, store.RunListParams{StalledAt: &now}); err != nil {
		return t, fmt.Errorf("stalled runs: %w", err)
	}
	if t.Released, err = w.runsCount(ctx, store.RunListParams{State: store.StateFailedRetryable}); err != nil {
		return t, fmt.Errorf("runs to redeliver: %w", err)
	}
	noneSent := func(effs []store.Effect) bool {
		return !slices.ContainsFunc(effs, func(e store.Effect) bool { return e.State == store.EffectCompleted })
	}
	if t.FailedNoEffect, err = w.endedWithout(ctx, store.StateFailedTerminal, since, noneSent); err != nil {
		return t, fmt.Errorf("failed runs: %w", err)
	}
	open := func(effs []store.Effect) bool {
		return slices.ContainsFunc(effs, func(e store.Effect) bool {
			return e.State == store.EffectPending || e.State == store.EffectPlanned
		})
	}
	if t.RejectedOpen, err = w.endedWithout(ctx, store.StateRejected, since, open); err != nil {
		return t, fmt.Errorf("rejected runs: %w", err)
	}
	effs, err := w.store.EffectsWaiting(ctx, now.Add(-UnsentAfter), outstandingCap+1)
	if err != nil {
		return t, fmt.Errorf("effects waiting: %w", err)
	}
	t.Unsent = count{N: min(len(effs), outstandingCap), More: len(effs) > outstandingCap}
	return t, nil
}
