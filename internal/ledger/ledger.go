// Package ledger is the work ledger: a long-running agent's resumable state,
// saved by compare-and-set on its checkpoint version, and its own external effects
// recorded as planned before and confirmed after, so that on restart airlock can tell it
// what it may safely do next — and never to repeat a confirmed effect or start over.
package ledger

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gowebpki/jcs"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/validation"
)

//go:embed ledger.schema.json
var SchemaJSON []byte

var schema = func() *validation.Schema {
	s, err := validation.Compile("ledger.schema.json", SchemaJSON)
	if err != nil {
		panic(err)
	}
	return s
}()

// Domain outcomes; the HTTP layer maps each to one status and code.
var (
	ErrNotFound          = errors.New("the run has no ledger")
	ErrInvariantsChanged = errors.New("invariants cannot change once saved")
	ErrReconcileFirst    = errors.New("this effect was planned but not confirmed (or its outcome is unknown): search the external system and reconcile it first")
	ErrInputMismatch     = errors.New("the effect id was planned with another input: the run stops for a person")
	ErrNotPlanned        = errors.New("the effect is not planned")
	// ErrEffectRejected: a person rejected this very effect (run, effect id, input) and
	// its action type lets the run go on without it (approval.on_reject: skip_effect).
	// The message names who rejected it and why.
	ErrEffectRejected = errors.New("a person rejected this effect: it is not performed")
	// ErrNotSettled: a search found nothing, but the planned effect's settle window has
	// not passed since it was planned: the earlier holder's call may still be in
	// progress at the provider. Ask again after NotSettledError.RetryAfter.
	ErrNotSettled = errors.New("the effect's settle window has not passed: a call made under the earlier plan may still be in progress")
)

// RejectedError is [ErrEffectRejected] with its particulars: which effect, which
// approval, who rejected it and why. The API answers them as the error's details, so a
// client reads them without parsing the message.
type RejectedError struct {
	EffectID, ApprovalID, RejectedBy, Reason string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("%v (rejected by %s: %s)", ErrEffectRejected, e.RejectedBy, rejectReason(e.Reason))
}

func (e *RejectedError) Unwrap() error { return ErrEffectRejected }

// InvalidError is a ledger that fails the published schema or the rules around it.
type InvalidError struct{ Errors []validation.Error }

func (e *InvalidError) Error() string { return "the ledger is not valid" }

// Document is the ledger as agents write it.
type Document struct {
	RunID             string          `json:"run_id"`
	Goal              string          `json:"goal"`
	Invariants        []string        `json:"invariants"`
	Completed         []CompletedStep `json:"completed"`
	Pending           []string        `json:"pending"`
	NextAllowedAction string          `json:"next_allowed_action"`
	CheckpointVersion int             `json:"checkpoint_version"`
}

// CompletedStep is a step done, with evidence the business can check.
type CompletedStep struct {
	Step     string `json:"step"`
	Evidence string `json:"evidence"`
}

// EffectView is the derived, read-only entry of an effect in the ledger.
type EffectView struct {
	EffectID  string `json:"effect_id"`
	Action    string `json:"action"`
	Target    string `json:"target"`
	InputHash string `json:"input_hash"`
	Status    string `json:"status"` // planned, confirmed, unknown, cleared
	Receipt   string `json:"receipt,omitempty"`
}

// Status is the ledger's name for an agent effect's state.
func Status(s store.EffectState) string {
	switch s {
	case store.EffectCompleted:
		return "confirmed"
	case store.EffectPending:
		return "cleared" // reconciled as not done: it may run again under the same id
	}
	return string(s)
}

// Service keeps ledgers and agent effects.
type Service struct {
	runs.Base
	effects   *effects.Service
	approvals *approvals.Service
}

// Config is what the ledger needs beside its Base.
type Config struct {
	// Effects guards every plan with the kill switch (required).
	Effects *effects.Service
	// Approvals asks a person before a gated agent effect (required).
	Approvals *approvals.Service
}

// New builds the ledger over b.
func New(b runs.Base, cfg Config) (*Service, error) {
	b, err := b.Fill()
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	switch {
	case cfg.Effects == nil:
		return nil, errors.New("ledger: Config.Effects is required")
	case cfg.Approvals == nil:
		return nil, errors.New("ledger: Config.Approvals is required")
	}
	return &Service{Base: b, effects: cfg.Effects, approvals: cfg.Approvals}, nil
}

// holder locks the run the caller holds a live lease on (the ledger's calls carry no
// version: the lease alone proves ownership).
func (s *Service) holder(ctx context.Context, q store.Queries, key, owner string) (store.Run, error) {
	run, err := q.RunGet(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return store.Run{}, runs.ErrNotFound
	}
	if err != nil {
		return store.Run{}, err
	}
	held, err := q.RunLock(ctx, store.RunLockParams{Key: key, Owner: owner, Version: run.Version, Now: s.At()})
	if errors.Is(err, store.ErrNoMatch) {
		return store.Run{}, runs.Diagnose(ctx, q, s.Now, 0, runs.LeaseRequest{Key: key, Owner: owner, Version: run.Version})
	}
	return held, err
}

// Save stores the next checkpoint: schema-valid, run_id = key, checkpoint_version = the
// stored one + 1 (the first is 1), invariants unchanged, no effects (they are derived).
func (s *Service) Save(ctx context.Context, key, owner string, raw json.RawMessage, actor string) (int, store.Run, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(raw, &probe); err != nil {
		return 0, store.Run{}, &InvalidError{Errors: []validation.Error{{Keyword: "type", Message: "the ledger must be a JSON object"}}}
	}
	if _, ok := probe["effects"]; ok {
		return 0, store.Run{}, &InvalidError{Errors: []validation.Error{{Pointer: "/effects", Keyword: "readOnly",
			Message: "effects are derived from plan, confirm and reconcile; they cannot be written"}}}
	}
	v, err := validation.Decode(raw)
	if err != nil {
		return 0, store.Run{}, &InvalidError{Errors: []validation.Error{{Keyword: "type", Message: "the ledger is not JSON"}}}
	}
	if errs := schema.Validate(v); errs != nil {
		return 0, store.Run{}, &InvalidError{Errors: errs}
	}
	var doc Document
	if err := json.Unmarshal(raw, &doc); err != nil {
		return 0, store.Run{}, &InvalidError{Errors: []validation.Error{{Keyword: "type", Message: err.Error()}}}
	}
	if doc.RunID != key {
		return 0, store.Run{}, &InvalidError{Errors: []validation.Error{{Pointer: "/run_id", Keyword: "const", Message: "must be the run's key"}}}
	}
	canonical, err := json.Marshal(doc)
	if err != nil {
		return 0, store.Run{}, err
	}
	var run store.Run
	err = s.Store.Transact(ctx, func(q store.Queries) error {
		run, err = s.holder(ctx, q, key, owner)
		if err != nil {
			return err
		}
		stored, prev, err := q.LedgerLatest(ctx, key)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if doc.CheckpointVersion != stored+1 {
			return fmt.Errorf("%w: the ledger is at checkpoint %d; save %d", runs.ErrVersionConflict, stored, stored+1)
		}
		if prev != nil {
			var old Document
			if err := json.Unmarshal(prev, &old); err != nil {
				return err
			}
			if !slices.Equal(old.Invariants, doc.Invariants) {
				return ErrInvariantsChanged
			}
		}
		if err := q.LedgerInsert(ctx, key, doc.CheckpointVersion, canonical, s.At()); errors.Is(err, store.ErrNoMatch) {
			return fmt.Errorf("%w: checkpoint %d was saved meanwhile", runs.ErrVersionConflict, doc.CheckpointVersion)
		} else if err != nil {
			return err
		}
		return runs.Event(ctx, q, s.At(), runs.Entry{Key: key, Kind: store.EventLedgerSaved, Version: run.Version, Actor: actor, Detail: map[string]any{
			"checkpoint_version": doc.CheckpointVersion, "next_allowed_action": doc.NextAllowedAction,
			"completed": len(doc.Completed), "pending": len(doc.Pending),
		}})
	})
	if err != nil {
		return 0, store.Run{}, fmt.Errorf("save ledger of %q: %w", key, err)
	}
	return doc.CheckpointVersion, run, nil
}

// Ledger is the stored document with its derived effects.
type Ledger struct {
	Document
	Effects []EffectView `json:"effects"`
}

// Get returns the latest checkpoint and the run's agent effects.
func (s *Service) Get(ctx context.Context, key string) (Ledger, error) {
	_, raw, err := s.Store.LedgerLatest(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		if _, err := s.Store.RunGet(ctx, key); errors.Is(err, store.ErrNotFound) {
			return Ledger{}, runs.ErrNotFound
		}
		return Ledger{}, ErrNotFound
	}
	if err != nil {
		return Ledger{}, err
	}
	var l Ledger
	if err := json.Unmarshal(raw, &l.Document); err != nil {
		return Ledger{}, err
	}
	l.Effects, err = s.agentEffects(ctx, s.Store, key)
	return l, err
}

func (s *Service) agentEffects(ctx context.Context, q store.Queries, key string) ([]EffectView, error) {
	list, err := q.EffectList(ctx, store.EffectListParams{RunKey: key}) // all: a verdict needs every one
	if err != nil {
		return nil, err
	}
	out := []EffectView{}
	for _, e := range list {
		if e.Executor != store.ExecutorAgent {
			continue
		}
		out = append(out, EffectView{EffectID: e.EffectID, Action: e.ActionType, Target: e.Target,
			InputHash: e.PayloadHash, Status: Status(e.State), Receipt: e.ProviderID})
	}
	return out, nil
}

// PlanRequest records the intent to perform one external effect.
type PlanRequest struct {
	Key, EffectID, Owner string
	Action, Target       string
	InputHash            string
	Actor                string
	OnBehalfOf           string // the person the API key acts for
	Meta                 *runs.Meta
	// Input, when given, is what the effect will do (an MCP call's tool and arguments):
	// InputHash must be its hash (see [InputHash]). A gated effect's approval holds it as
	// an effect's payload, so the person sees what the decision is bound to; the planned
	// effect keeps it as its payload until its result replaces it, so an effect whose
	// outcome becomes unknown shows the person who resolves it what the call was.
	Input json.RawMessage
}

// InputHash is the hash an input is bound to: the hex SHA-256 of its canonical JSON
// (RFC 8785), as the client's HashInput computes it.
func InputHash(raw json.RawMessage) (string, error) {
	c, err := jcs.Transform(raw)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}

// PlanResult says whether to execute: Execute, or not (Receipt of the confirmed one), or
// wait for a person (Approval).
type PlanResult struct {
	Execute bool
	// Confirmed: performed before, and not to be performed again. Receipt is empty when
	// a person resolved it as sent without the provider's id.
	Confirmed bool
	Receipt   string
	Result    json.RawMessage // the result recorded with the confirmation, while retained
	Approval  *approvals.Requested
}

// Plan passes the same checks as every other effect — a configured action type, an
// enabled kill switch, a passed gate — then records the intent as planned.
func (s *Service) Plan(ctx context.Context, req PlanRequest) (PlanResult, error) {
	a := s.Policy.Action(req.Action)
	if a == nil {
		return PlanResult{}, fmt.Errorf("%w: %q", effects.ErrUnknownActionType, req.Action)
	}
	if !a.ValidTarget(req.Target) {
		return PlanResult{}, fmt.Errorf("%w: %q for %s", effects.ErrInvalidTarget, req.Target, req.Action)
	}
	if req.Input != nil {
		// The approval shows the input and is bound to the hash: they must be one.
		if h, err := InputHash(req.Input); err != nil || h != req.InputHash {
			return PlanResult{}, &runs.FieldError{Field: "input", Msg: "input_hash must be the hex SHA-256 of the input's canonical JSON (RFC 8785)"}
		}
	}
	var res PlanResult
	var mismatch bool
	var exhausted string
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		res, mismatch, exhausted = PlanResult{}, false, "" // Transact may run this again
		run, err := s.holder(ctx, q, req.Key, req.Owner)
		if err != nil {
			return err
		}
		// Read in the transaction, under the switch's guard: a disable that committed
		// first always wins.
		if ok, why, err := s.effects.EnabledIn(ctx, q, req.Action); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("%w: %s", effects.ErrActionsDisabled, why)
		}
		if _, exhausted, err = s.OverBudget(ctx, q, s.At(), run, ""); exhausted != "" || err != nil {
			return err
		}
		e, err := q.EffectByRunEffectID(ctx, req.Key, req.EffectID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return s.planNew(ctx, q, run, a, req, &res)
		case err != nil:
			return err
		case e.PayloadHash != req.InputHash || e.ActionType != req.Action || e.Target != req.Target:
			// The same id with another input: stop, and park the run where no delivery restarts it.
			mismatch = true
			moved, err := q.RunTransition(ctx, store.RunTransitionParams{Key: run.Key, Owner: run.LeaseOwner, Version: run.Version,
				From: store.StateProcessing, To: store.StateAwaitingHuman, ParkReason: "input_mismatch", Now: s.At()})
			if err != nil {
				return err
			}
			if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: run.Key, Kind: store.EventInputMismatch, Version: moved.Version, Actor: req.Actor, Meta: req.Meta,
				Detail: map[string]any{
					"effect_id": req.EffectID, "planned_input_hash": e.PayloadHash, "input_hash": req.InputHash}}); err != nil {
				return err
			}
			return runs.Alert(ctx, q, s.At(), runs.Raised{Key: run.Key, Version: moved.Version, Kind: "input_mismatch",
				Fields: map[string]any{"effect_id": req.EffectID}})
		case e.State == store.EffectCompleted:
			res = PlanResult{Confirmed: true, Receipt: e.ProviderID, Result: resultOf(e)}
			return nil
		case e.State == store.EffectPending:
			// Reconciled as not done: it may run again, under the same id.
			if _, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectPending},
				Version: e.Version, To: store.EffectPlanned, Now: s.At()}); err != nil {
				return err
			}
			res.Execute = true
			return runs.Event(ctx, q, s.At(), runs.Entry{Key: run.Key, Kind: store.EventEffectPlanned, Version: run.Version, Actor: req.Actor, Meta: req.Meta,
				Detail: map[string]any{"effect_id": req.EffectID, "action_type": req.Action, "target": req.Target, "input_hash": req.InputHash, "again": true}})
		default:
			return ErrReconcileFirst
		}
	})
	switch {
	case err == nil && mismatch:
		s.Alerts.Wake()
		return PlanResult{}, fmt.Errorf("plan %s on %q: %w", req.EffectID, req.Key, ErrInputMismatch)
	case err == nil && exhausted != "":
		s.Alerts.Wake()
		return PlanResult{}, fmt.Errorf("plan on %q: %w (%s)", req.Key, runs.ErrBudgetExhausted, exhausted)
	case err != nil:
		return PlanResult{}, fmt.Errorf("plan %s on %q: %w", req.EffectID, req.Key, err)
	}
	return res, nil
}

// planNew records a first intent; a gated action asks a person first, unless one already
// approved this very effect. An approval authorises exactly what it showed the person —
// this run, effect id, action type, target and input hash, performed by the agent —
// and anything else opens a new approval.
func (s *Service) planNew(ctx context.Context, q store.Queries, run store.Run, a *policy.Action, req PlanRequest, res *PlanResult) error {
	if a.Gate != policy.GateNone {
		aps, err := q.ApprovalsByRun(ctx, run.Key)
		if err != nil {
			return err
		}
		this := func(ap store.Approval) bool {
			return ap.RunKey == run.Key && ap.EffectID == req.EffectID && ap.ActionType == req.Action &&
				ap.Target == req.Target && ap.PayloadHash == req.InputHash && ap.Executor == store.ExecutorAgent
		}
		if i := slices.IndexFunc(aps, func(ap store.Approval) bool { return ap.Decision == approvals.Reject && this(ap) }); i >= 0 {
			return &RejectedError{EffectID: req.EffectID, ApprovalID: aps[i].ID, RejectedBy: aps[i].ApproverSubject, Reason: aps[i].Reason}
		}
		approved := slices.ContainsFunc(aps, func(ap store.Approval) bool { return ap.Decision == approvals.Approve && this(ap) })
		if !approved {
			declared := ""
			if req.Meta != nil {
				declared = req.Meta.RequestedBy
			}
			r, err := s.approvals.Request(ctx, q, run, approvals.Proposed{ActionType: req.Action, Target: req.Target,
				EffectID: req.EffectID, Executor: store.ExecutorAgent, Payload: req.Input, PayloadHash: req.InputHash},
				approvals.Ask{Action: a, By: approvals.NewRequester(req.Actor, req.OnBehalfOf, declared), Actor: req.Actor, Meta: req.Meta})
			res.Approval = &r
			return err
		}
	}
	if _, created, err := q.EffectInsert(ctx, store.Effect{ID: uuid.NewString(), RunKey: run.Key, EffectID: req.EffectID,
		ActionType: req.Action, Target: req.Target, Executor: store.ExecutorAgent, Payload: req.Input, PayloadHash: req.InputHash,
		State: store.EffectPlanned, NotBefore: s.AtOrZero(), CreatedAt: s.AtOrZero()}); err != nil {
		return err
	} else if !created {
		return ErrReconcileFirst
	}
	res.Execute = true
	return runs.Event(ctx, q, s.At(), runs.Entry{Key: run.Key, Kind: store.EventEffectPlanned, Version: run.Version, Actor: req.Actor, Meta: req.Meta,
		Detail: map[string]any{"effect_id": req.EffectID, "action_type": req.Action, "target": req.Target, "input_hash": req.InputHash}})
}

// resultOf is the result recorded with an agent effect's confirmation, nil when none was.
// Until then the effect's payload is its input (the plan's, when given: an unknown effect
// keeps what it was, for the person who resolves it; retention purges it as any payload),
// and a confirmation without a result, a lookup or a person's resolve leaves it there:
// the input is told from a result by its hash, which the effect is bound to.
func resultOf(e store.Effect) json.RawMessage {
	if e.Payload == nil {
		return nil
	}
	if h, err := InputHash(e.Payload); err == nil && h == e.PayloadHash {
		return nil
	}
	return e.Payload
}

// unknownCheck tells the person who resolves an unknown agent effect what to look for.
func unknownCheck(e store.Effect) string {
	what := "the effect's payload is what the agent said it would do (for an MCP call: the tool and its arguments)"
	if e.Payload == nil {
		what = "the agent gave no input with its plan: only its hash is known, so ask the agent's operator what the call was"
	}
	return fmt.Sprintf("%s; look at %s (the target) for what it would have made or changed, "+
		"then resolve the effect: sent (with the id found there) or not_sent (the agent's next identical call performs it once)", what, e.Target)
}

// rejectReason is a reject's reason as the agent reads it.
func rejectReason(r string) string {
	if strings.TrimSpace(r) == "" {
		return "no reason given"
	}
	return strconv.Quote(r)
}

// ConfirmRequest is the receipt of an effect the agent performed on run Key under its
// lease (Owner), and optionally its result.
type ConfirmRequest struct {
	Key, EffectID, Owner string
	Receipt              string
	Result               json.RawMessage
	Actor                string
}

// Confirm records the receipt of an effect the agent performed, and optionally its
// result (kept as the effect's payload, so retention purges it with every payload; a
// later plan of the same effect answers it instead of executing again).
//
// A confirmation airlock refuses — the caller's lease is lost, or the effect is already
// confirmed with another receipt — changes nothing, but when the record shows that
// someone else performed the effect, or was told to (see secondPerformance), the refused
// receipt is the evidence of a second performance: an alert event on the run, in the same
// transaction, raised after the commit. The caller is still refused (lease_lost,
// not_planned).
func (s *Service) Confirm(ctx context.Context, req ConfirmRequest) error {
	key, effectID, owner, receipt, result, actor := req.Key, req.EffectID, req.Owner, req.Receipt, req.Result, req.Actor
	var refused error
	var twice *effects.SecondPerformance
	var written bool
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		refused, twice, written = nil, nil, false // Transact may run this again
		run, err := s.holder(ctx, q, key, owner)
		if errors.Is(err, runs.ErrLeaseLost) {
			refused = err
			twice, err = s.secondPerformance(ctx, q, key, effectID, owner, receipt)
			if err == nil && twice != nil {
				written, err = effects.RecordPerformedTwice(ctx, q, s.At(), *twice)
			}
			return err
		}
		if err != nil {
			return err
		}
		e, err := q.EffectByRunEffectID(ctx, key, effectID)
		if errors.Is(err, store.ErrNotFound) {
			return ErrNotPlanned
		}
		if err != nil {
			return err
		}
		if e.State == store.EffectCompleted && e.ProviderID == receipt {
			return nil // the same confirmation again
		}
		if e.State == store.EffectCompleted && e.Executor == store.ExecutorAgent {
			// The holder confirms another receipt for a confirmed effect: it performed it again.
			refused = fmt.Errorf("%w: it is %s", ErrNotPlanned, Status(e.State))
			twice = &effects.SecondPerformance{RunKey: key, EffectID: effectID, State: e.State, Receipt: e.ProviderID,
				LateReceipt: receipt, Source: effects.SourceConfirm}
			written, err = effects.RecordPerformedTwice(ctx, q, s.At(), *twice)
			return err
		}
		if _, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectPlanned},
			To: store.EffectCompleted, ProviderID: &receipt, Payload: result, Now: s.At()}); errors.Is(err, store.ErrNoMatch) {
			return fmt.Errorf("%w: it is %s", ErrNotPlanned, Status(e.State))
		} else if err != nil {
			return err
		}
		return runs.Event(ctx, q, s.At(), runs.Entry{Key: key, Kind: store.EventEffectConfirmed, Version: run.Version, Actor: actor,
			Detail: map[string]any{"effect_id": effectID, "receipt": receipt, "result_recorded": result != nil}})
	})
	if err != nil {
		return fmt.Errorf("confirm %s on %q: %w", effectID, key, err)
	}
	if written {
		effects.RaisePerformedTwice(s.Alerts)
	}
	if refused != nil {
		if twice != nil {
			refused = fmt.Errorf("%w; this receipt was recorded as a second performance of the effect (alert %s): "+
				"the external system may now hold it twice", refused, effects.PerformedTwiceAlert)
		}
		return fmt.Errorf("confirm %s on %q: %w", effectID, key, refused)
	}
	return nil
}

// secondPerformance decides whether a confirmation refused for a lost lease is evidence
// of a second performance, reading the record in q's transaction. It is when the record
// holds another receipt (someone confirmed it, or found it, with another id), or when
// another holder has since been told to perform it: the effect was cleared to run again
// (reconciled as not done), or planned under the lease that displaced the caller's. While
// the effect is still the caller's own plan — its lease lapsed and nobody took the run, or
// the new holder has not reached it yet — nothing else happened: the next holder
// reconciles and finds the caller's receipt in the external system.
func (s *Service) secondPerformance(ctx context.Context, q store.Queries, key, effectID, owner, receipt string) (*effects.SecondPerformance, error) {
	e, err := q.EffectByRunEffectID(ctx, key, effectID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil || e.Executor != store.ExecutorAgent {
		return nil, err
	}
	twice := &effects.SecondPerformance{RunKey: key, EffectID: effectID, State: e.State, LateReceipt: receipt,
		Source: effects.SourceConfirm}
	switch e.State {
	case store.EffectCompleted:
		if e.ProviderID == receipt {
			return nil, nil // confirmed with this very receipt (or found by the next holder)
		}
		twice.Receipt = e.ProviderID
		return twice, nil
	case store.EffectPending, store.EffectPlanned:
	default:
		return nil, nil
	}
	run, err := q.RunGet(ctx, key)
	if err != nil {
		return nil, err
	}
	if run.LeaseOwner == owner {
		return nil, nil // the caller's lease lapsed, and nobody took the run since
	}
	if e.State == store.EffectPending {
		return twice, nil
	}
	planned, claimed, err := planAndClaimVersions(ctx, q, key, effectID)
	if err != nil || planned < claimed {
		return nil, err // planned before the current holder took the run: the caller's plan
	}
	return twice, nil
}

// planAndClaimVersions reads the run's version at the effect's latest effect_planned event
// and at the run's latest claim (claimed or lease_reclaimed).
func planAndClaimVersions(ctx context.Context, q store.Queries, key, effectID string) (planned, claimed int64, err error) {
	var after int64
	for {
		evs, err := q.EventList(ctx, key, after, 1000)
		if err != nil {
			return 0, 0, err
		}
		for _, ev := range evs {
			switch store.EventKind(ev.Kind) {
			case store.EventClaimed, store.EventLeaseReclaimed:
				claimed = ev.Version
			case store.EventEffectPlanned:
				var d struct {
					EffectID string `json:"effect_id"`
				}
				if json.Unmarshal(ev.Detail, &d) == nil && d.EffectID == effectID {
					planned = ev.Version
				}
			}
		}
		if len(evs) < 1000 {
			return planned, claimed, nil
		}
		after = evs[len(evs)-1].ID
	}
}

// ReconcileRequest is what the agent holding run Key's lease (Owner) found when it
// searched for a planned effect: the ids Found, or Undetermined.
type ReconcileRequest struct {
	Key, EffectID, Owner string
	Found                []string
	Undetermined         bool
	Actor                string
}

// Reconcile records what the agent found when it searched the external system for a
// planned effect: none → cleared to run again under the same id; one → confirmed with
// it; several, or a search that could not decide → unknown. An unknown effect is a
// person's (operator resolve), never the agent's to clear and redo.
func (s *Service) Reconcile(ctx context.Context, req ReconcileRequest) (string, error) {
	key, effectID, owner, found, undetermined, actor := req.Key, req.EffectID, req.Owner, req.Found, req.Undetermined, req.Actor
	var status string
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		run, err := s.holder(ctx, q, key, owner)
		if err != nil {
			return err
		}
		e, err := q.EffectByRunEffectID(ctx, key, effectID)
		if errors.Is(err, store.ErrNotFound) || (err == nil && e.Executor != store.ExecutorAgent) {
			return ErrNotPlanned
		}
		if err != nil {
			return err
		}
		if e.State == store.EffectUnknown {
			return fmt.Errorf("%w: its outcome is unknown; a person resolves it (airlock effects resolve, or POST /v1/effects/{id}/resolve with an operator key)", ErrNotPlanned)
		}
		p := store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectPlanned}, Version: e.Version, Now: s.At()}
		switch {
		case undetermined || len(found) > 1:
			p.To = store.EffectUnknown
		case len(found) == 1:
			p.To, p.ProviderID = store.EffectCompleted, &found[0]
		default:
			// "None" clears the effect only once a call made under the plan can no longer
			// arrive: the type's settle window (actions.T.settle_window) from the plan.
			if w := s.Policy.Settle(e.ActionType); w > 0 {
				now, err := s.Read(ctx, q)
				if err != nil {
					return err
				}
				if wait := e.UpdatedAt.Add(w).Sub(now); wait > 0 {
					return &NotSettledError{RetryAfter: wait}
				}
			}
			p.To = store.EffectPending
		}
		if _, err := q.EffectUpdate(ctx, p); errors.Is(err, store.ErrNoMatch) {
			return fmt.Errorf("%w: it is %s", ErrNotPlanned, Status(e.State))
		} else if err != nil {
			return err
		}
		status = Status(p.To)
		detail := map[string]any{"effect_id": effectID, "found": len(found), "undetermined": undetermined, "status": status}
		if len(found) > 0 {
			detail["receipts"] = found
		}
		if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: key, Kind: store.EventEffectReconciled, Version: run.Version, Actor: actor,
			Detail: detail}); err != nil {
			return err
		}
		if p.To == store.EffectUnknown {
			return runs.Event(ctx, q, s.At(), runs.Entry{Key: key, Kind: store.EventAlert, Version: run.Version, Actor: "airlock",
				Detail: map[string]any{"alert": "agent_effect_unknown", "effect_id": effectID, "check": unknownCheck(e)}})
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("reconcile %s on %q: %w", effectID, key, err)
	}
	if status == "unknown" {
		s.Alerts.Wake()
	}
	return status, nil
}

// Verdicts of Resume.
const (
	Continue  = "continue"
	Reconcile = "reconcile"
	Wait      = "wait"
	Stop      = "stop"
)

// ReconcileItem is what the agent must look for before anything else.
type ReconcileItem struct {
	EffectID  string `json:"effect_id"`
	Action    string `json:"action"`
	Target    string `json:"target"`
	InputHash string `json:"input_hash"`
	RunID     string `json:"run_id"`
}

// Verdict answers "what may I do now?".
type Verdict struct {
	Verdict           string          `json:"verdict"`
	NextAllowedAction string          `json:"next_allowed_action,omitempty"`
	CheckpointVersion int             `json:"checkpoint_version,omitempty"`
	Reconcile         []ReconcileItem `json:"reconcile,omitempty"`
	Reasons           []string        `json:"reasons"`
}

// Resume reads the run, its ledger and its agent effects and gives the verdict.
func (s *Service) Resume(ctx context.Context, key string) (Verdict, error) {
	run, err := s.Store.RunGet(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return Verdict{}, runs.ErrNotFound
	}
	if err != nil {
		return Verdict{}, err
	}
	v := Verdict{Reasons: []string{}}
	stop := func(reason string) (Verdict, error) {
		v.Verdict, v.Reasons = Stop, append(v.Reasons, reason)
		return v, nil
	}
	switch run.State {
	case store.StateAwaitingHuman:
		if run.ParkReason == "approval" {
			v.Verdict, v.Reasons = Wait, []string{"a person's approval is pending"}
			return v, nil
		}
		return stop("the run is parked for a person: " + run.ParkReason)
	case store.StateCompleted, store.StateFailedTerminal, store.StateRejected:
		return stop("the run is " + string(run.State) + ": nothing more to do")
	}
	stored, raw, err := s.Store.LedgerLatest(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		// Any event but claims and heartbeats, however many of those came first.
		started, err := s.Store.EventExistsExcept(ctx, key, []string{"claimed", "lease_reclaimed", "duplicate", "heartbeat"})
		if err != nil {
			return Verdict{}, err
		}
		if started {
			return stop("the run has started but has no ledger: never restart from scratch")
		}
		v.Verdict, v.Reasons = Continue, []string{"a new run: save the first ledger (checkpoint_version 1)"}
		return v, nil
	}
	if err != nil {
		return Verdict{}, err
	}
	var doc Document
	if err := json.Unmarshal(raw, &doc); err != nil || doc.RunID == "" || doc.NextAllowedAction == "" {
		return stop("the ledger is missing run_id, checkpoint_version or next_allowed_action")
	}
	v.CheckpointVersion = stored
	list, err := s.agentEffects(ctx, s.Store, key)
	if err != nil {
		return Verdict{}, err
	}
	for _, e := range list {
		switch e.Status {
		case "unknown":
			v.Reasons = append(v.Reasons, "effect "+e.EffectID+" has an unknown outcome (several candidates or an undecided search): a person decides")
		case "planned":
			v.Reconcile = append(v.Reconcile, ReconcileItem{EffectID: e.EffectID, Action: e.Action, Target: e.Target, InputHash: e.InputHash, RunID: key})
		}
	}
	if len(v.Reasons) > 0 {
		v.Verdict, v.Reconcile = Stop, nil
		return v, nil
	}
	if len(v.Reconcile) > 0 {
		v.Verdict = Reconcile
		v.Reasons = append(v.Reasons, "planned effects were never confirmed: search for them by effect id and run id, then reconcile")
		return v, nil
	}
	v.Verdict, v.NextAllowedAction = Continue, doc.NextAllowedAction
	return v, nil
}

// Call is one tool call an MCP gateway handled for an agent: what was called and what was
// decided. It never carries the arguments or the result, only their hash.
type Call struct {
	Tool      string `json:"tool"`
	Upstream  string `json:"upstream,omitempty"`
	Class     string `json:"class"` // read, effect or unclassified
	EffectID  string `json:"effect_id,omitempty"`
	InputHash string `json:"input_hash,omitempty"`
	Decision  string `json:"decision"`
	Action    string `json:"action_type,omitempty"`
}

// RecordCall writes the call as a tool_call event on the run. It needs no lease: a read
// passes through while the run waits for an approval or is held by another process, and
// is still recorded.
func (s *Service) RecordCall(ctx context.Context, key string, c Call, actor string) error {
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		run, err := q.RunGet(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			return runs.ErrNotFound
		}
		if err != nil {
			return err
		}
		detail := map[string]any{"tool": c.Tool, "class": c.Class, "decision": c.Decision}
		for k, v := range map[string]string{"upstream": c.Upstream, "effect_id": c.EffectID, "input_hash": c.InputHash, "action_type": c.Action} {
			if v != "" {
				detail[k] = v
			}
		}
		return runs.Event(ctx, q, s.At(), runs.Entry{Key: key, Kind: store.EventToolCall, Version: run.Version, Actor: actor, Detail: detail})
	})
	if err != nil {
		return fmt.Errorf("record tool call on %q: %w", key, err)
	}
	return nil
}

// NotSettledError is ErrNotSettled with how long to wait before asking again.
type NotSettledError struct{ RetryAfter time.Duration }

func (e *NotSettledError) Error() string {
	return fmt.Sprintf("%v; search again in %s", ErrNotSettled, e.RetryAfter.Round(time.Second))
}

func (e *NotSettledError) Unwrap() error { return ErrNotSettled }
