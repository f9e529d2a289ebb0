package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"
)

// Done is the ledger's next allowed action once every declared step is done.
const Done = "done"

const noReceipt = "resolved as sent by an operator, without the provider's id"

// RejectedError: a person rejected a gated effect: Reason is what the approver wrote,
// RejectedBy who, EffectID and ApprovalID which. Under approval.on_reject: end_run the
// run is over; under skip_effect only that step is (the step is recorded as settled
// without performing it, and the run goes on: the next Step works). Err is the server's
// effect_rejected answer when it told it ([IsCode] sees through).
type RejectedError struct {
	Reason, RejectedBy, EffectID, ApprovalID string
	Err                                      error
}

func (e *RejectedError) Unwrap() error { return e.Err }

// rejectedFrom reads a rejection's particulars: an error's details or a rejected run's
// result.
func rejectedFrom(raw json.RawMessage, err error) *RejectedError {
	var d struct {
		EffectID   string `json:"effect_id"`
		ApprovalID string `json:"approval_id"`
		RejectedBy string `json:"rejected_by"`
		Reason     string `json:"reason"`
	}
	_ = json.Unmarshal(raw, &d)
	return &RejectedError{Reason: d.Reason, RejectedBy: d.RejectedBy, EffectID: d.EffectID, ApprovalID: d.ApprovalID, Err: err}
}

func (e *RejectedError) Error() string {
	who, why := e.RejectedBy, e.Reason
	if who == "" {
		who = "a person"
	}
	if why == "" {
		why = "(no reason given)"
	}
	return fmt.Sprintf("airlock: rejected by %s: %s", who, why)
}

// NeedsPersonError: airlock cannot tell whether EffectID happened (a lookup found several
// records, could not decide, or the step has none), or the run is parked for a person.
// Do not act; a person resolves it and a later start goes on.
type NeedsPersonError struct {
	EffectID, Why string
}

func (e *NeedsPersonError) Error() string {
	id := e.EffectID
	if id == "" {
		id = "the run"
	}
	return fmt.Sprintf("airlock: %s needs a person: %s", id, e.Why)
}

// ApprovalPendingError: a gated step waits for a person beyond the wait the caller allowed.
// ApproveURL (set when this process asked for the approval) carries a single-use secret:
// hand it to approvers, never log it. ConsoleURL is the console's page of the approval.
type ApprovalPendingError struct {
	EffectID, ApprovalID, ApproveURL, ConsoleURL string
}

func (e *ApprovalPendingError) Error() string {
	return fmt.Sprintf("airlock: %s waits for approval %s (%s)", e.EffectID, e.ApprovalID, e.ConsoleURL)
}

// RunBusyError: another process holds the run's lease beyond the wait allowed.
type RunBusyError struct {
	Key            string
	LeaseExpiresAt *time.Time
}

func (e *RunBusyError) Error() string {
	return fmt.Sprintf("airlock: run %s is held by another process until %v", e.Key, e.LeaseExpiresAt)
}

// RunFinishedError: a step on a run that is already finished.
type RunFinishedError struct {
	Key, State string
	Result     json.RawMessage
}

func (e *RunFinishedError) Error() string {
	return fmt.Sprintf("airlock: run %s is %s", e.Key, e.State)
}

// ErrUndetermined is what a lookup returns when its search cannot tell whether the effect
// happened: the effect becomes unknown and the step a [NeedsPersonError].
var ErrUndetermined = errors.New("airlock: the lookup could not tell")

// RunOptions tune [Client.OpenRun]; the zero value works.
type RunOptions struct {
	Goal       string   // the ledger's goal on the first start; default "run <key>"
	Steps      []string // the step ids in order: the ledger's pending list follows them
	Invariants []string
	// LeaseSeconds is the lease, renewed every third of it; default 30.
	LeaseSeconds int
	// WaitLease is how long a live lease of another process is waited out; default the
	// lease + 5 s; negative: not at all.
	WaitLease time.Duration
	// WaitApproval is how long a gated step (or a run found waiting) waits for the
	// decision before [ApprovalPendingError]; default 0: not at all.
	WaitApproval time.Duration
	Poll         time.Duration // between approval status reads; default 1 s
	Meta         *Meta
	// Hook, for crash tests, is called at each step's boundaries: "before_perform",
	// "after_perform", "after_confirm".
	Hook func(point string, call StepCall)
}

// StepCall is what perform and lookup are called with.
type StepCall struct {
	Key, EffectID, Action, Target string
	Input                         any
	// IdempotencyKey is "<run key>/<effect id>": give it to the external system, so a
	// repeated call there is harmless too.
	IdempotencyKey string
}

// StepResult is a step's outcome. Receipt is empty when an operator resolved the effect
// as sent without the provider's id; Replayed: performed before, answered from airlock's
// record without calling perform. Confirmed is always true.
type StepResult struct {
	EffectID  string
	Receipt   string
	Replayed  bool
	Result    json.RawMessage
	Confirmed bool
}

// StepOption tunes one [AgentRun.Step].
type StepOption func(*stepOptions)

type stepOptions struct {
	lookup func(context.Context, StepCall) ([]string, error)
	wait   *time.Duration
}

// Lookup gives the step the search of the external system that runs when a previous
// attempt planned the effect and never confirmed it: the receipts of the matching records
// (none: perform; one: it happened; several: [NeedsPersonError]), or [ErrUndetermined].
func Lookup(f func(ctx context.Context, call StepCall) ([]string, error)) StepOption {
	return func(o *stepOptions) { o.lookup = f }
}

// WaitApproval overrides the run's [RunOptions].WaitApproval for one step.
func WaitApproval(d time.Duration) StepOption { return func(o *stepOptions) { o.wait = &d } }

// AgentRun is a claimed run, kept: heartbeats in the background, key, lease owner and
// version carried for every call. Get one from [Client.OpenRun]; Close it at the end.
type AgentRun struct {
	c          *Client
	key        string
	payload    any
	o          RunOptions
	LeaseOwner string
	Version    int64
	State      string
	Result     json.RawMessage // what a finished run ended with
	Finished   bool            // finished when opened, or completed
	Reclaimed  bool
	Ledger     Ledger

	mu     sync.Mutex
	lost   error
	cancel context.CancelCauseFunc
	leaseC context.Context
	stop   chan struct{}
	done   chan struct{}
}

// Key is the run's key.
func (r *AgentRun) Key() string { return r.key }

// OpenRun claims the run key and keeps it; see [AgentRun.Step]. A live lease of another
// process is waited out up to o.WaitLease, then [RunBusyError]; a run waiting for a person
// is waited on up to o.WaitApproval, then [ApprovalPendingError]; a rejected run is a
// [RejectedError] with the approver's reason; a finished run opens with Finished set.
func (c *Client) OpenRun(ctx context.Context, key string, payload any, o RunOptions) (*AgentRun, error) {
	if o.LeaseSeconds == 0 {
		o.LeaseSeconds = 30
	}
	if o.WaitLease == 0 {
		o.WaitLease = time.Duration(o.LeaseSeconds+5) * time.Second
	}
	if o.Poll == 0 {
		o.Poll = time.Second
	}
	if o.Goal == "" {
		o.Goal = "run " + key
	}
	r := &AgentRun{c: c, key: key, payload: payload, o: o}
	if err := r.open(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *AgentRun) open(ctx context.Context) error {
	deadline := time.Now().Add(r.o.WaitLease)
	for {
		cl, err := r.c.Claim(ctx, ClaimRequest{Key: r.key, Payload: r.payload, LeaseSeconds: r.o.LeaseSeconds, Meta: r.o.Meta})
		if err != nil {
			return err
		}
		r.State, r.Version = cl.State, cl.Version
		if cl.Claimed {
			r.LeaseOwner, r.Reclaimed = cl.LeaseOwner, cl.Reclaimed
			break
		}
		switch cl.State {
		case "processing":
			left := time.Until(deadline)
			if left <= 0 || cl.LeaseExpiresAt == nil {
				return &RunBusyError{Key: r.key, LeaseExpiresAt: cl.LeaseExpiresAt}
			}
			if err := sleep(ctx, max(min(time.Until(*cl.LeaseExpiresAt)+100*time.Millisecond, left), 50*time.Millisecond)); err != nil {
				return err
			}
			continue
		case "rejected":
			return rejectedFrom(cl.Result, nil)
		case "completed", "failed_terminal":
			r.Finished, r.Result = true, cl.Result
			return nil
		case "awaiting_human":
			all, err := r.c.ApprovalStatuses(ctx, r.key)
			if err != nil {
				return err
			}
			var pending *ApprovalStatus
			for i := range all {
				if all[i].Status == "pending" {
					pending = &all[i]
				}
			}
			if pending == nil {
				run, err := r.c.Run(ctx, r.key)
				if err != nil {
					return err
				}
				return &NeedsPersonError{Why: "the run is parked for a person (" + run.ParkReason + ")"}
			}
			if err := r.await(ctx, pending.EffectID, pending.ID, "", r.o.WaitApproval); err != nil {
				return err
			}
			continue
		default:
			return &NeedsPersonError{Why: "the run is " + cl.State}
		}
	}
	r.keep()
	l, err := r.c.Ledger(ctx, r.key)
	if IsCode(err, "ledger_not_found") {
		next := "start"
		if len(r.o.Steps) > 0 {
			next = r.o.Steps[0]
		}
		first := Ledger{Goal: r.o.Goal, Invariants: r.o.Invariants, Pending: slices.Clone(r.o.Steps), NextAllowedAction: next, CheckpointVersion: 1}
		if _, err := r.c.SaveLedger(ctx, r.key, r.LeaseOwner, first); err != nil {
			return err
		}
		l, err = r.c.Ledger(ctx, r.key)
	}
	if err != nil {
		return err
	}
	r.Ledger = l
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func lossCode(err error) bool {
	return IsCode(err, "lease_lost") || IsCode(err, "version_conflict") || IsCode(err, "lease_lifetime_exceeded")
}

// keep starts the heartbeats of the current lease (stopping the previous ones).
func (r *AgentRun) keep() {
	r.stopKeeping()
	ctx, cancel := context.WithCancelCause(context.Background())
	stop, done := make(chan struct{}), make(chan struct{})
	r.mu.Lock()
	r.leaseC, r.cancel, r.stop, r.done, r.lost = ctx, cancel, stop, done, nil
	r.mu.Unlock()
	key, owner, version, secs := r.key, r.LeaseOwner, r.Version, r.o.LeaseSeconds
	go func() {
		defer close(done)
		t := time.NewTicker(time.Duration(secs) * time.Second / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			hctx, hcancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second)
			_, err := r.c.Heartbeat(hctx, key, HeartbeatRequest{LeaseOwner: owner, Version: version, LeaseSeconds: secs})
			hcancel()
			if lossCode(err) {
				r.lose(err)
				return
			}
		}
	}()
}

func (r *AgentRun) lose(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lost == nil {
		r.lost = err
		r.cancel(err)
	}
}

func (r *AgentRun) stopKeeping() {
	r.mu.Lock()
	stop, done, cancel := r.stop, r.done, r.cancel
	r.stop, r.done = nil, nil
	r.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
		cancel(errors.New("airlock: lease no longer kept"))
	}
}

// Context is cancelled (with the loss as its cause) when the lease is lost, and when the
// run is closed: long work under the lease should watch it.
func (r *AgentRun) Context() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leaseC == nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}
	return r.leaseC
}

// check returns the lease's loss, if a heartbeat found it; with no lease held (after an
// approval), it claims the run again.
func (r *AgentRun) check(ctx context.Context) error {
	r.mu.Lock()
	held, lost := r.stop != nil, r.lost
	r.mu.Unlock()
	if lost != nil {
		return lost
	}
	if !held {
		return r.reclaim(ctx)
	}
	return nil
}

func (r *AgentRun) reclaim(ctx context.Context) error {
	if err := r.open(ctx); err != nil {
		return err
	}
	if r.Finished {
		return &RunFinishedError{Key: r.key, State: r.State, Result: r.Result}
	}
	return nil
}

// verify asks airlock now that this process holds the lease (a heartbeat).
func (r *AgentRun) verify(ctx context.Context) error {
	if err := r.check(ctx); err != nil {
		return err
	}
	_, err := r.c.Heartbeat(ctx, r.key, HeartbeatRequest{LeaseOwner: r.LeaseOwner, Version: r.Version, LeaseSeconds: r.o.LeaseSeconds})
	if lossCode(err) {
		r.lose(err)
	}
	return err
}

func (r *AgentRun) await(ctx context.Context, effectID, approvalID, approveURL string, wait time.Duration) error {
	r.stopKeeping() // the run waits for a person: this process holds no lease now
	consoleURL := r.c.BaseURL + "/console/approvals/" + url.PathEscape(approvalID)
	deadline := time.Now().Add(wait)
	for {
		st, err := r.c.ApprovalStatus(ctx, r.key, approvalID)
		if err != nil {
			return err
		}
		if st.EffectID != "" {
			effectID = st.EffectID
		}
		switch st.Status {
		case "approved", "rejected":
			// Decided: the next claim and plan tell which way (a rejection ends the run, or
			// answers this effect effect_rejected), with the approver's reason.
			return nil
		case "pending":
		default:
			return &NeedsPersonError{EffectID: effectID, Why: "its approval " + approvalID + " is " + st.Status}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return &ApprovalPendingError{EffectID: effectID, ApprovalID: approvalID, ApproveURL: approveURL, ConsoleURL: consoleURL}
		}
		if err := sleep(ctx, min(r.o.Poll, left)); err != nil {
			return err
		}
	}
}

func (r *AgentRun) hook(point string, call StepCall) {
	if r.o.Hook != nil {
		r.o.Hook(point, call)
	}
}

// Step performs one external effect at most once, whatever crashed before.
//
// It plans effectID with input (a gated action's approval card shows it), calls perform
// only when airlock answers execute — right after asking airlock that the lease is still
// held, with a context cancelled if it is lost — and confirms with the receipt perform
// returns (a non-empty string). A step performed before is answered from airlock's record
// without calling perform; one planned by a process that died before confirming runs the
// [Lookup] (none found: perform; one: it happened; several, [ErrUndetermined] or no
// lookup: [NeedsPersonError]). A gated step waits up to [RunOptions].WaitApproval for the
// decision, then [ApprovalPendingError]; a rejection is a [RejectedError] with the
// approver's reason. Then the ledger records the step (completed, pending, next allowed
// action; compare-and-set on the checkpoint), once even across restarts. Under
// approval.on_reject: skip_effect a rejected step is recorded too, as settled without
// performing (evidence "rejected://<approval id>"), and the run goes on with the next Step.
func (r *AgentRun) Step(ctx context.Context, effectID, action, target string, input any,
	perform func(ctx context.Context, call StepCall) (string, error), opts ...StepOption) (StepResult, error) {
	if r.Finished {
		return StepResult{}, &RunFinishedError{Key: r.key, State: r.State, Result: r.Result}
	}
	var so stepOptions
	for _, o := range opts {
		o(&so)
	}
	wait := r.o.WaitApproval
	if so.wait != nil {
		wait = *so.wait
	}
	raw, err := json.Marshal(input)
	if err != nil {
		return StepResult{}, fmt.Errorf("airlock: step %s: input: %w", effectID, err)
	}
	hash, err := HashInput(input)
	if err != nil {
		return StepResult{}, err
	}
	call := StepCall{Key: r.key, EffectID: effectID, Action: action, Target: target, Input: input, IdempotencyKey: r.key + "/" + effectID}
	for range 8 {
		if err := r.check(ctx); err != nil {
			return StepResult{}, err
		}
		p, err := r.c.Plan(ctx, r.key, effectID, PlanRequest{LeaseOwner: r.LeaseOwner, Action: action, Target: target,
			InputHash: hash, Input: raw, Meta: r.o.Meta})
		if IsCode(err, "effect_rejected") {
			// approval.on_reject: skip_effect: this step is settled without performing it,
			// and the run goes on.
			var ae *APIError
			errors.As(err, &ae)
			rej := rejectedFrom(ae.Details, err)
			if rej.EffectID == "" {
				rej.EffectID = effectID
			}
			evidence := "rejected"
			if rej.ApprovalID != "" {
				evidence = "rejected://" + rej.ApprovalID
			}
			if err := r.record(ctx, effectID, evidence); err != nil {
				return StepResult{}, err
			}
			return StepResult{}, rej
		}
		if IsCode(err, "reconcile_first") {
			if so.lookup == nil {
				return StepResult{}, &NeedsPersonError{EffectID: effectID,
					Why: "it was planned and never confirmed, and the step has no lookup to search the external system"}
			}
			found, err := so.lookup(ctx, call)
			if errors.Is(err, ErrUndetermined) {
				if _, err := r.c.Reconcile(ctx, r.key, effectID, r.LeaseOwner, nil, true); err != nil {
					return StepResult{}, err
				}
				return StepResult{}, &NeedsPersonError{EffectID: effectID, Why: "the lookup could not tell whether it happened"}
			}
			if err != nil {
				return StepResult{}, fmt.Errorf("airlock: step %s: lookup: %w", effectID, err)
			}
			status, err := r.c.Reconcile(ctx, r.key, effectID, r.LeaseOwner, nonNil(found), false)
			if err != nil {
				return StepResult{}, err
			}
			if status == EffectUnknown {
				return StepResult{}, &NeedsPersonError{EffectID: effectID, Why: fmt.Sprintf("the lookup found %d matching records", len(found))}
			}
			continue // cleared: plan again executes; confirmed: plan again answers the receipt
		}
		if err != nil {
			return StepResult{}, err
		}
		if p.Approval != nil {
			if err := r.await(ctx, effectID, p.Approval.ID, p.Approval.ApproveURL, wait); err != nil {
				return StepResult{}, err
			}
			if err := r.reclaim(ctx); err != nil {
				return StepResult{}, err
			}
			continue
		}
		if p.Confirmed {
			if err := r.record(ctx, effectID, p.Receipt); err != nil {
				return StepResult{}, err
			}
			return StepResult{EffectID: effectID, Receipt: p.Receipt, Replayed: true, Result: p.Result, Confirmed: true}, nil
		}
		if err := r.verify(ctx); err != nil {
			return StepResult{}, err
		}
		r.hook("before_perform", call)
		pctx, cancel := context.WithCancelCause(ctx)
		stopWatch := context.AfterFunc(r.Context(), func() { cancel(context.Cause(r.Context())) })
		receipt, err := perform(pctx, call)
		stopWatch()
		cancel(nil)
		if err != nil {
			return StepResult{}, err
		}
		if receipt == "" {
			return StepResult{}, fmt.Errorf("airlock: step %s: perform must return the effect's receipt", effectID)
		}
		r.hook("after_perform", call)
		if err := r.c.Confirm(ctx, r.key, effectID, r.LeaseOwner, receipt); err != nil {
			return StepResult{}, err
		}
		r.hook("after_confirm", call)
		if err := r.record(ctx, effectID, receipt); err != nil {
			return StepResult{}, err
		}
		return StepResult{EffectID: effectID, Receipt: receipt, Confirmed: true}, nil
	}
	return StepResult{}, &NeedsPersonError{EffectID: effectID, Why: "airlock's answers did not settle (planned again and again)"}
}

// record is the ledger's bookkeeping: once per step (one recorded before a crash is not
// appended again), compare-and-set on the checkpoint version.
func (r *AgentRun) record(ctx context.Context, effectID, receipt string) error {
	l := &r.Ledger
	if slices.ContainsFunc(l.Completed, func(s Step) bool { return s.Step == effectID }) {
		return nil
	}
	evidence := receipt
	if evidence == "" {
		evidence = noReceipt
	}
	l.Completed = append(l.Completed, Step{Step: effectID, Evidence: evidence})
	l.Pending = slices.DeleteFunc(l.Pending, func(p string) bool { return p == effectID })
	switch {
	case len(l.Pending) > 0:
		l.NextAllowedAction = l.Pending[0]
	case len(r.o.Steps) > 0:
		l.NextAllowedAction = Done
	default:
		l.NextAllowedAction = "continue"
	}
	l.CheckpointVersion++
	_, err := r.c.SaveLedger(ctx, r.key, r.LeaseOwner, *l)
	return err
}

// Complete records the ledger done and moves the run to completed with result.
func (r *AgentRun) Complete(ctx context.Context, result any) (Transition, error) {
	if r.Finished {
		return Transition{}, &RunFinishedError{Key: r.key, State: r.State, Result: r.Result}
	}
	if err := r.check(ctx); err != nil {
		return Transition{}, err
	}
	if l := &r.Ledger; l.NextAllowedAction != Done || len(l.Pending) > 0 {
		l.Pending, l.NextAllowedAction = []string{}, Done
		l.CheckpointVersion++
		if _, err := r.c.SaveLedger(ctx, r.key, r.LeaseOwner, *l); err != nil {
			return Transition{}, err
		}
	}
	t, err := r.c.Transition(ctx, r.key, TransitionRequest{LeaseOwner: r.LeaseOwner, Version: r.Version, To: "completed", Result: result})
	if err != nil {
		return Transition{}, err
	}
	r.Close()
	r.Finished, r.State = true, "completed"
	r.Result, _ = json.Marshal(result)
	return t, nil
}

// Close stops the heartbeats (the lease then lapses unless the run was completed).
func (r *AgentRun) Close() { r.stopKeeping() }

// ApprovalStatus is one approval of a run as its explanation tells it: Status is
// pending, approved, rejected, expired, cancelled or window_closed; Reason is the
// approver's.
type ApprovalStatus struct {
	ID          string     `json:"id"`
	Status      string     `json:"status"`
	Mode        string     `json:"mode"`
	ActionType  string     `json:"action_type"`
	Target      string     `json:"target"`
	EffectID    string     `json:"effect_id"`
	RequestedBy string     `json:"requested_by"`
	Approver    string     `json:"approver"`
	DecidedAt   *time.Time `json:"decided_at"`
	ExpiresAt   *time.Time `json:"expires_at"`
	Reason      string     `json:"reason"`
}

// ApprovalStatuses lists every approval of the run with its status (from the run's
// explanation; a runs key suffices).
func (c *Client) ApprovalStatuses(ctx context.Context, key string) ([]ApprovalStatus, error) {
	var out struct {
		Approved struct {
			Approvals []ApprovalStatus `json:"approvals"`
		} `json:"approved"`
	}
	if _, err := c.do(ctx, http.MethodGet, runPath(key, "explain"), nil, &out); err != nil {
		return nil, err
	}
	return out.Approved.Approvals, nil
}

// ApprovalStatus is one approval of the run; an id the run does not have is an error
// with code approval_not_found.
func (c *Client) ApprovalStatus(ctx context.Context, key, approvalID string) (ApprovalStatus, error) {
	all, err := c.ApprovalStatuses(ctx, key)
	if err != nil {
		return ApprovalStatus{}, err
	}
	for _, a := range all {
		if a.ID == approvalID {
			return a, nil
		}
	}
	return ApprovalStatus{}, &APIError{Status: http.StatusNotFound, Code: "approval_not_found", Message: "run " + key + " has no approval " + approvalID}
}
