package effects

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// QueueRequest asks to queue one effect of a run under its lease.
type QueueRequest struct {
	Key        string
	Owner      string
	Version    int64
	ActionType string
	Target     string
	EffectID   string // "" derives it from action type and target
	Payload    json.RawMessage
	Actor      string
	// OnBehalfOf is the person the API key acts for ("" for none): one of the requester's
	// identities, who can never approve the request.
	OnBehalfOf string
	Meta       *runs.Meta
	// Gate is a stricter gate the client asks for ("" for the policy's).
	Gate string
	// approve_by_exception's evidence is never part of the request: only what evaluator
	// keys recorded on the run (POST /v1/runs/{key}/evidence) counts.
}

// requester is who asks: the key, the person it acts for and the declared requested_by.
func (req QueueRequest) requester() approvals.Requester {
	declared := ""
	if req.Meta != nil {
		declared = req.Meta.RequestedBy
	}
	return approvals.NewRequester(req.Actor, req.OnBehalfOf, declared)
}

// DeriveEffectID is the effect id when a client gives none: one effect per run, action
// type and target, as a UNIQUE(key, effect_type, target) constraint would give.
func DeriveEffectID(actionType, target string) string {
	sum := sha256.Sum256([]byte(actionType + "\x00" + target))
	return actionType + "-" + hex.EncodeToString(sum[:8])
}

// Queue inserts the effect in the same transaction that checks the run's lease and
// version. The same effect id again returns the stored effect (created=false); with
// another payload it is ErrEffectMismatch.
func (s *Service) Queue(ctx context.Context, req QueueRequest) (e store.Effect, created bool, run store.Run, err error) {
	sub, err := s.submit(ctx, req, nil) // never a person: gated types are refused
	return sub.Effect, sub.Created, sub.Run, err
}

// Submitted is what an effect request became: a queued effect, or (gated types) an
// approval holding it.
type Submitted struct {
	Effect   store.Effect
	Created  bool
	Run      store.Run
	Approval *approvals.Requested
}

// Submit takes an effect request in three steps, the last two in one transaction under
// the run's lock: the claim check (the request's lease, the run's budget, the payload that
// will leave), the gate of its action type's mode (gates.go: queue now, ask a person
// first, queue with a cancel window, or auto-approve on evidence), and the outbox. For
// approve_before_act (and approve_by_exception in doubt) an approval holds the effect:
// the run waits in awaiting_human and nothing enters the outbox. A service built without
// Config.Approvals refuses gated types with ErrApprovalRequired.
func (s *Service) Submit(ctx context.Context, req QueueRequest) (Submitted, error) {
	return s.submit(ctx, req, s.approvals)
}

// submit is Submit with the approvals service the gated modes ask through (nil: none).
func (s *Service) submit(ctx context.Context, req QueueRequest, ap *approvals.Service) (Submitted, error) {
	a, g, err := s.gateOf(req, ap)
	if err != nil {
		return Submitted{}, err
	}
	hash, err := payloadHash(a, req.Payload)
	if err != nil {
		return Submitted{}, err
	}
	if req.EffectID == "" {
		req.EffectID = DeriveEffectID(req.ActionType, req.Target)
	}
	var t *submission
	err = s.Store.Transact(ctx, func(q store.Queries) error {
		t = &submission{s: s, q: q, req: req, a: a, hash: hash, now: s.At()} // Transact may run this again
		if ok, err := t.claimCheck(ctx, g); !ok || err != nil {
			return err
		}
		notBefore, held, err := g.admit(ctx, t)
		if held || err != nil {
			return err
		}
		e, created, err := t.queue(ctx, notBefore)
		if err != nil {
			return err
		}
		return g.queued(ctx, t, e, created)
	})
	if err == nil && t.exhausted != "" {
		s.Alerts.Wake()
		err = fmt.Errorf("%w (%s)", runs.ErrBudgetExhausted, t.exhausted)
	}
	if err != nil {
		return Submitted{}, fmt.Errorf("queue effect on %q: %w", req.Key, err)
	}
	for _, f := range t.committed {
		f()
	}
	sub := t.sub
	sub.Run = t.run
	if sub.Created {
		s.Wake()
	}
	return sub, nil
}

// gateOf is the request's action type, with the gate the client asked for, and that
// gate's mode; checked before any transaction.
func (s *Service) gateOf(req QueueRequest, ap *approvals.Service) (*policy.Action, gate, error) {
	a := s.Policy.Action(req.ActionType)
	if a == nil {
		return nil, nil, fmt.Errorf("%w: %q", ErrUnknownActionType, req.ActionType)
	}
	if !a.ValidTarget(req.Target) {
		return nil, nil, fmt.Errorf("%w: %q for %s", ErrInvalidTarget, req.Target, req.ActionType)
	}
	a, err := a.WithGate(req.Gate)
	if errors.Is(err, policy.ErrGateTooWeak) {
		return nil, nil, err
	}
	if err != nil {
		return nil, nil, &runs.FieldError{Field: "gate", Msg: err.Error()}
	}
	g, err := gateFor(a.Gate, ap)
	return a, g, err
}

// payloadHash is the hash of the payload a request sends when its type has no schema (it
// must give one). A type with a schema sends its run's validated value instead, hashed
// under the run's lock: "" here.
func payloadHash(a *policy.Action, payload json.RawMessage) (string, error) {
	if a.Schema != nil {
		return "", nil
	}
	if len(payload) == 0 {
		return "", &runs.FieldError{Field: "payload", Msg: "is required", Missing: true}
	}
	hash, err := runs.HashPayload(payload)
	if err != nil {
		return "", &runs.FieldError{Field: "payload", Msg: err.Error()}
	}
	return hash, nil
}

// submission is one attempt of Submit's transaction: the request, what its checks found,
// and what it became.
type submission struct {
	s    *Service
	q    store.Queries
	req  QueueRequest   // its Payload, once checked, is the value that leaves
	a    *policy.Action // with the gate the request asked for
	hash string         // of that payload
	now  *time.Time     // the transaction's start: its run lock and Submit's own events
	run  store.Run      // as of the lock, then as the request left it
	sub  Submitted
	// exhausted is the budget the run ran out of: the run was terminated, and Submit
	// alerts and refuses after the commit.
	exhausted string
	// committed runs after the commit (an auto-approval's metric).
	committed []func()
}

// ask is who asks a person about this request, under its action type's policy.
func (t *submission) ask() approvals.Ask {
	return approvals.Ask{Action: t.a, By: t.req.requester(), Actor: t.req.Actor, Meta: t.req.Meta}
}

// claimCheck holds the run under the request's lease, its budget and the payload that
// will leave. ok is false when the request ends here without an error: the same request
// again, answered with the approval that holds it, or a run ended by its budget.
func (t *submission) claimCheck(ctx context.Context, g gate) (ok bool, err error) {
	if ok, err := t.lockRun(ctx, g); !ok || err != nil {
		return false, err
	}
	if ok, err := t.withinBudget(ctx); !ok || err != nil {
		return false, err
	}
	return true, t.checkPayload(ctx)
}

// lockRun locks the run under the request's lease and version. Refused, the request may
// be the same one again after its 202 was lost (g answers it with the pending approval);
// otherwise the lease's diagnosis is the error.
func (t *submission) lockRun(ctx context.Context, g gate) (bool, error) {
	var err error
	t.run, err = t.q.RunLock(ctx, store.RunLockParams{Key: t.req.Key, Owner: t.req.Owner, Version: t.req.Version, Now: t.now})
	if !errors.Is(err, store.ErrNoMatch) {
		return err == nil, err
	}
	r, err := g.resent(ctx, t)
	if r != nil {
		t.sub.Approval, t.run = r, r.Run
	}
	if err != nil || r != nil {
		return false, err
	}
	return false, runs.Diagnose(ctx, t.q, t.s.Now, 0, runs.LeaseRequest{Key: t.req.Key, Owner: t.req.Owner, Version: t.req.Version})
}

// withinBudget terminates a run that has used up its budget for the action type (false).
func (t *submission) withinBudget(ctx context.Context) (bool, error) {
	var err error
	t.run, t.exhausted, err = t.s.OverBudget(ctx, t.q, t.now, t.run, t.req.ActionType)
	return t.exhausted == "" && err == nil, err
}

// checkPayload settles the payload that will leave and refuses now, not approved and then
// failed at send time, one its connector cannot send.
func (t *submission) checkPayload(ctx context.Context) error {
	if t.a.Schema != nil {
		// Only the value that passed validation on this run leaves, never the raw output.
		v, hash, err := validatedValue(ctx, t.q, t.req)
		if errors.Is(err, store.ErrNotFound) {
			return ErrNotValidated
		}
		if err != nil {
			return err
		}
		if !samePayload(t.req.Payload, hash) {
			return fmt.Errorf("%w: the payload differs from the validated value (omit it to queue that)", ErrNotValidated)
		}
		t.req.Payload, t.hash = v, hash
	}
	if err := t.a.CheckSendable(t.req.Payload); err != nil {
		return fmt.Errorf("%w: %v", ErrUnsendablePayload, err)
	}
	if err := t.a.CheckRecipients(t.req.Target, t.req.Payload); err != nil {
		field := "payload"
		if fe := (*connector.PayloadFieldError)(nil); errors.As(err, &fe) {
			field += "." + fe.Field
		}
		return &runs.FieldError{Field: field, Msg: err.Error()}
	}
	return nil
}

// validatedValue is the value that last passed validation on the request's run for its
// action type, and its hash; store.ErrNotFound when none has.
func validatedValue(ctx context.Context, q store.Queries, req QueueRequest) (json.RawMessage, string, error) {
	v, err := q.ValidationLatestValid(ctx, req.Key, req.ActionType)
	if err != nil {
		return nil, "", err
	}
	hash, err := runs.HashPayload(v.Value)
	return v.Value, hash, err
}

// samePayload: a request to queue the validated value may omit it, or give that value.
func samePayload(payload json.RawMessage, hash string) bool {
	if len(payload) == 0 {
		return true
	}
	h, err := runs.HashPayload(payload)
	return err == nil && h == hash
}

// queue enters the effect into the outbox (Outbox.Enter), to leave at notBefore, and
// counts it on its run. The same request again finds it there (created false); another
// payload under its effect id is ErrEffectMismatch.
func (t *submission) queue(ctx context.Context, notBefore time.Time) (e store.Effect, created bool, err error) {
	req := t.req
	e, created, err = t.s.Enter(ctx, t.q, Entry{Effect: store.Effect{RunKey: req.Key, EffectID: req.EffectID,
		ActionType: req.ActionType, Target: req.Target, Executor: t.a.Executor(), Payload: req.Payload,
		PayloadHash: t.hash, NotBefore: notBefore}, Version: t.run.Version, Actor: req.Actor, Meta: req.Meta})
	t.sub.Effect, t.sub.Created = e, created
	if err != nil {
		return e, created, err
	}
	if !created {
		if e.PayloadHash != t.hash || e.ActionType != req.ActionType || e.Target != req.Target {
			return e, false, fmt.Errorf("%w: %s", ErrEffectMismatch, req.EffectID)
		}
		return e, false, nil
	}
	_, err = t.q.RunCount(ctx, store.RunCountParams{Key: req.Key, ActionType: req.ActionType})
	return e, true, err
}
