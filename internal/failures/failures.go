// Package failures is airlock's failure handling: model output validated against a
// schema with bounded repair, the retry table that turns a failure class into a decision,
// per-run budgets, and the rerun protocol's replacements. The table lives here, enforced,
// instead of in someone's head.
package failures

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/validation"
)

// Domain outcomes; the HTTP layer maps each to one status and code.
var (
	ErrNoSchema           = errors.New("the action type has no schema to validate against")
	ErrUnknownActionType  = errors.New("action type is not configured")
	ErrInvalidReplacement = errors.New("the new key breaks the rerun protocol")
	ErrNotFinished        = errors.New("only a finished run with no open effects can be replaced")
	ErrAlreadyReplaced    = errors.New("the run has already been replaced")
	ErrKeyInUse           = errors.New("the new key is already in use")
	ErrNotParked          = errors.New("the run is not parked for unknown_commit or input_mismatch")
	ErrNotStalled         = errors.New("the run is not stalled: only a run still processing after its lease lapsed can be re-driven")
)

// InputError is a claim payload that its trigger source's schema refuses.
type InputError struct{ Errors []validation.Error }

func (e *InputError) Error() string { return "the payload does not match its trigger source's schema" }

// Service applies the policy's failure handling to runs.
type Service struct {
	runs.Base
}

// New builds failure handling over b: its policy's retry rules, budgets, validation and
// input schemas.
func New(b runs.Base) (*Service, error) {
	b, err := b.Fill()
	if err != nil {
		return nil, fmt.Errorf("failures: %w", err)
	}
	return &Service{Base: b}, nil
}

// lock reads the run under the caller's lease, or explains why it cannot.
func (s *Service) lock(ctx context.Context, q store.Queries, req runs.LeaseRequest) (store.Run, error) {
	run, err := q.RunLock(ctx, store.RunLockParams{Key: req.Key, Owner: req.Owner, Version: req.Version, Now: s.At()})
	if errors.Is(err, store.ErrNoMatch) {
		return store.Run{}, runs.Diagnose(ctx, q, s.Now, 0, req)
	}
	return run, err
}

// HasInputSchema reports whether claims from triggerSource are checked against a schema.
func (s *Service) HasInputSchema(triggerSource string) bool {
	ref := s.Policy.InputSchemas[triggerSource]
	return ref != nil && ref.Compiled != nil
}

// CheckInput validates a claim's payload against its trigger source's schema, if the
// policy has one (seed step 1): an *InputError lists the violations.
func (s *Service) CheckInput(triggerSource string, payload json.RawMessage) error {
	if !s.HasInputSchema(triggerSource) {
		return nil
	}
	v, err := validation.Decode(payload)
	if err != nil {
		return &InputError{Errors: []validation.Error{{Keyword: "json", Message: "the payload is not JSON"}}}
	}
	if errs := s.Policy.InputSchemas[triggerSource].Compiled.Validate(v); errs != nil {
		return &InputError{Errors: errs}
	}
	return nil
}

// ValidateRequest is one model output to check for an action type.
type ValidateRequest struct {
	runs.LeaseRequest
	ActionType string
	Output     json.RawMessage // a JSON value, or a JSON string holding the model's text
}

// ValidateResult is the check's outcome. Value is the validated value (valid only).
type ValidateResult struct {
	Valid    bool
	Repaired bool
	Errors   []validation.Error
	Value    json.RawMessage
	Run      store.Run
}

// Validate checks an output against the action type's schema, repairing it (extracting
// the JSON from prose or a code fence) within the run's repair bound. A result that
// needed fixing — extracted, or still invalid — uses one of the run's repairs; invalid
// with none left, the run fails for good. Only the validated value is stored; the raw
// output is kept as its SHA-256.
func (s *Service) Validate(ctx context.Context, req ValidateRequest) (ValidateResult, error) {
	a := s.Policy.Action(req.ActionType)
	if a == nil {
		return ValidateResult{}, fmt.Errorf("%w: %q", ErrUnknownActionType, req.ActionType)
	}
	if a.Schema == nil || a.Schema.Compiled == nil {
		return ValidateResult{}, fmt.Errorf("%w: %q", ErrNoSchema, req.ActionType)
	}
	maxRepairs := *s.Policy.Validation.MaxRepairs
	var res ValidateResult
	var exhausted string
	var terminated bool
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		res, exhausted, terminated = ValidateResult{}, "", false // Transact may run this again
		run, err := s.lock(ctx, q, req.LeaseRequest)
		if err != nil {
			return err
		}
		// The validation is a model call airlock has seen, whatever the client reports.
		if run, err = q.RunCount(ctx, store.RunCountParams{Key: run.Key, ActionType: req.ActionType, Validations: 1}); err != nil {
			return err
		}
		if ended, spent, err := s.OverBudget(ctx, q, s.At(), run, ""); spent != "" || err != nil {
			res.Run, exhausted = ended, spent
			return err
		}
		value, extracted, parsed := parseOutput(req.Output)
		needsFix := extracted || !parsed
		if needsFix && run.Repairs >= maxRepairs {
			// No repair left: the output counts as it came.
			extracted, parsed = false, !needsFix
		}
		var errs []validation.Error
		if parsed {
			errs = a.Schema.Compiled.Validate(value)
		} else {
			errs = []validation.Error{{Keyword: "json", Message: "the output holds no JSON value"}}
		}
		res.Valid, res.Repaired, res.Errors = errs == nil, extracted && parsed, errs
		used := 0
		if extracted || !res.Valid {
			used = 1
		}
		if used == 1 && run.Repairs < maxRepairs {
			if run, err = q.RunCount(ctx, store.RunCountParams{Key: run.Key, Repairs: 1}); err != nil {
				return err
			}
		}
		terminated = !res.Valid && run.Repairs >= maxRepairs
		v := store.Validation{RunKey: run.Key, ActionType: req.ActionType, Valid: res.Valid, Repaired: res.Repaired,
			OutputHash: hash(req.Output), CreatedAt: s.AtOrZero()}
		detail := map[string]any{"action_type": req.ActionType, "valid": res.Valid, "repaired": res.Repaired,
			"output_hash": v.OutputHash, "repairs": run.Repairs, "max_repairs": maxRepairs}
		if res.Valid {
			if v.Value, err = json.Marshal(value); err != nil {
				return err
			}
			res.Value = v.Value
		} else {
			if v.Errors, err = json.Marshal(errs); err != nil {
				return err
			}
			detail["errors"] = errs
		}
		if _, err := q.ValidationInsert(ctx, v); err != nil {
			return err
		}
		if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: run.Key, Kind: store.EventValidation, Version: run.Version, Actor: req.Actor, Meta: req.Meta,
			Detail: detail}); err != nil {
			return err
		}
		res.Run = run
		if terminated {
			res.Run, err = runs.Terminate(ctx, q, s.At(), run, runs.Ending{Reason: "validation_failed", Alert: map[string]any{"action_type": req.ActionType, "errors": len(errs)},
				Detail: map[string]any{"action_type": req.ActionType, "errors": errs}})
		}
		return err
	})
	if err != nil {
		return ValidateResult{}, fmt.Errorf("validate %q: %w", req.Key, err)
	}
	if exhausted != "" {
		s.Alerts.Wake()
		return res, fmt.Errorf("validate %q: %w (%s)", req.Key, runs.ErrBudgetExhausted, exhausted)
	}
	switch {
	case res.Repaired && res.Valid:
		s.Observer.Validation("repaired")
	case res.Valid:
		s.Observer.Validation("valid")
	default:
		s.Observer.Validation("invalid")
	}
	if terminated {
		s.Alerts.Wake()
	}
	return res, nil
}

// parseOutput turns an output into a value: a JSON value as it is; a JSON string is the
// model's text, parsed if it is JSON, else the JSON extracted from it (extracted=true).
func parseOutput(out json.RawMessage) (value any, extracted, parsed bool) {
	v, err := validation.Decode(out)
	if err != nil {
		return nil, false, false
	}
	text, isText := v.(string)
	if !isText {
		return v, false, true
	}
	if v, err := validation.Decode([]byte(text)); err == nil {
		if _, stillText := v.(string); !stillText {
			return v, false, true
		}
	}
	b, ok := validation.Repair(text)
	if !ok {
		return nil, true, false
	}
	v, err = validation.Decode(b)
	return v, true, err == nil
}

func hash(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Decisions a failure report gets.
const (
	DecisionRetry     = "retry"
	DecisionTerminal  = "terminal"
	DecisionReconcile = "reconcile"
)

// FailureRequest reports one failure of the run's work.
type FailureRequest struct {
	runs.LeaseRequest
	Class      string
	Detail     string
	RetryAfter time.Duration // the provider's Retry-After, if it gave one
}

// Decision tells the client what to do; it is airlock's, from the policy's table.
type Decision struct {
	Decision    string
	Level       string // transport, business or write, for retry
	RetryAfter  time.Duration
	Attempts    int
	MaxAttempts int
	Reason      string // why terminal: retry_cap, deadline, never
	Requeued    int    // partial_success: failed writes queued again
	Run         store.Run
}

// Failure applies the retry table to a failure the client reports under its lease.
func (s *Service) Failure(ctx context.Context, req FailureRequest) (Decision, error) {
	if !slices.Contains(policy.Classes, req.Class) {
		return Decision{}, &runs.FieldError{Field: "class", Msg: "must be one of " + strings.Join(policy.Classes, ", ")}
	}
	rule := s.Policy.Retry[req.Class]
	var d Decision
	var alert string
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		d, alert = Decision{}, "" // Transact may run this again
		run, err := s.lock(ctx, q, req.LeaseRequest)
		if err != nil {
			return err
		}
		now, err := s.Read(ctx, q)
		if err != nil {
			return err
		}
		if d.Attempts, err = q.FailureAttempt(ctx, run.Key, req.Class); err != nil {
			return err
		}
		d.MaxAttempts, d.Run = rule.MaxAttempts, run
		detail := map[string]any{"class": req.Class, "attempts": d.Attempts}
		if req.Detail != "" {
			detail["detail"] = truncate(req.Detail, 200)
		}
		wait := policy.Backoff(rule.Backoff, rule.MaxBackoff, d.Attempts, req.RetryAfter)
		deadline := s.Budget(run.ActionType).RunDeadline
		switch {
		case req.Class == policy.ClassUnknownCommit:
			// Never retried: parked where no delivery can reclaim it until it is reconciled.
			d.Decision, alert = DecisionReconcile, "unknown_commit"
			d.Run, err = q.RunTransition(ctx, store.RunTransitionParams{Key: run.Key, Owner: run.LeaseOwner, Version: run.Version,
				From: store.StateProcessing, To: store.StateAwaitingHuman, ParkReason: "unknown_commit", Now: s.At()})
			if err != nil {
				return err
			}
			if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: run.Key, Kind: store.EventTransition, Version: d.Run.Version, Actor: "airlock",
				Detail: map[string]any{"from": store.StateProcessing, "to": store.StateAwaitingHuman, "reason": "unknown_commit"}}); err != nil {
				return err
			}
			if err := runs.Alert(ctx, q, s.At(), runs.Raised{Key: run.Key, Version: d.Run.Version, Kind: "unknown_commit",
				Fields: map[string]any{"class": req.Class, "attempts": d.Attempts}}); err != nil {
				return err
			}
		case rule.Retry == policy.RetryNever:
			// Nothing will answer this run now: a person hears of it, as of a retry cap.
			d.Decision, d.Reason, alert = DecisionTerminal, "never", "failure_not_retried"
			d.Run, err = runs.Terminate(ctx, q, s.At(), run, runs.Ending{Reason: "failure_not_retried", Alert: map[string]any{"class": req.Class, "attempts": d.Attempts},
				Detail: map[string]any{"class": req.Class}})
		case d.Attempts >= rule.MaxAttempts:
			d.Decision, d.Reason, alert = DecisionTerminal, "retry_cap", "retry_cap"
			if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: run.Key, Kind: store.EventRetryCap, Version: run.Version, Actor: "airlock",
				Detail: map[string]any{"class": req.Class, "attempts": d.Attempts, "max_attempts": rule.MaxAttempts}}); err != nil {
				return err
			}
			d.Run, err = runs.Terminate(ctx, q, s.At(), run, runs.Ending{Reason: "retry_cap", Alert: map[string]any{"class": req.Class, "attempts": d.Attempts},
				Detail: map[string]any{"class": req.Class}})
		case deadline > 0 && now.Add(wait).After(run.CreatedAt.Add(deadline)):
			// A retry would end past the run's deadline: stop now rather than stack timeouts.
			d.Decision, d.Reason, alert = DecisionTerminal, "deadline", "deadline"
			d.Run, err = runs.Terminate(ctx, q, s.At(), run, runs.Ending{Reason: "deadline", Alert: map[string]any{"class": req.Class, "attempts": d.Attempts},
				Detail: map[string]any{"class": req.Class, "retry_in_ms": wait.Milliseconds()}})
		default:
			d.Decision, d.Level, d.RetryAfter = DecisionRetry, rule.Retry, wait
			detail["retry_after_ms"] = wait.Milliseconds()
			switch rule.Retry {
			case policy.RetryBusiness:
				d.Run, err = q.RunTransition(ctx, store.RunTransitionParams{Key: run.Key, Owner: run.LeaseOwner, Version: run.Version,
					From: store.StateProcessing, To: store.StateFailedRetryable, Now: s.At()})
				if err == nil {
					err = runs.Event(ctx, q, s.At(), runs.Entry{Key: run.Key, Kind: store.EventTransition, Version: d.Run.Version, Actor: "airlock",
						Detail: map[string]any{"from": store.StateProcessing, "to": store.StateFailedRetryable, "reason": req.Class}})
				}
			case policy.RetryWrite:
				// The model is not called again: only the failed writes go back to the outbox.
				var requeued []store.Effect
				requeued, err = q.EffectRequeueFailed(ctx, run.Key, s.At())
				d.Requeued = len(requeued)
				detail["requeued"] = d.Requeued
			}
		}
		if err != nil {
			return err
		}
		detail["decision"] = d.Decision
		if d.Level != "" {
			detail["level"] = d.Level
		}
		if d.Reason != "" {
			detail["reason"] = d.Reason
		}
		return runs.Event(ctx, q, s.At(), runs.Entry{Key: run.Key, Kind: store.EventFailure, Version: d.Run.Version, Actor: req.Actor, Meta: req.Meta, Detail: detail})
	})
	if err != nil {
		return Decision{}, fmt.Errorf("failure on %q: %w", req.Key, err)
	}
	if alert != "" {
		s.Alerts.Wake()
	}
	if d.Reason == "retry_cap" {
		s.Observer.RetryCap()
	}
	return d, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// The most one usage report may add: far above any real call, far below an overflow.
const (
	MaxReportedCalls  = 1_000_000
	MaxReportedTokens = 1_000_000_000_000
)

// Usage adds the model calls and tokens a client reports; past the budget the run fails
// for good and the call answers ErrBudgetExhausted.
func (s *Service) Usage(ctx context.Context, req runs.LeaseRequest, modelCalls int, tokens int64, actionType string) (store.Run, error) {
	if modelCalls < 0 || modelCalls > MaxReportedCalls {
		return store.Run{}, &runs.FieldError{Field: "model_calls", Msg: fmt.Sprintf("must be from 0 to %d", MaxReportedCalls)}
	}
	if tokens < 0 || tokens > MaxReportedTokens {
		return store.Run{}, &runs.FieldError{Field: "tokens", Msg: fmt.Sprintf("must be from 0 to %d", int64(MaxReportedTokens))}
	}
	if actionType != "" && s.Policy.Action(actionType) == nil {
		return store.Run{}, fmt.Errorf("%w: %q", ErrUnknownActionType, actionType)
	}
	var run store.Run
	var exhausted string
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		exhausted = "" // Transact may run this again
		held, err := s.lock(ctx, q, req)
		if err != nil {
			return err
		}
		if run, err = q.RunCount(ctx, store.RunCountParams{Key: held.Key, ActionType: actionType, ModelCalls: modelCalls, Tokens: tokens}); err != nil {
			return err
		}
		if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: run.Key, Kind: store.EventUsage, Version: run.Version, Actor: req.Actor, Meta: req.Meta,
			Detail: map[string]any{
				"model_calls": modelCalls, "tokens": tokens, "total_model_calls": run.ModelCalls, "total_tokens": run.Tokens,
			}}); err != nil {
			return err
		}
		run, exhausted, err = s.OverBudget(ctx, q, s.At(), run, "")
		return err
	})
	if err != nil {
		return store.Run{}, fmt.Errorf("usage on %q: %w", req.Key, err)
	}
	if exhausted != "" {
		s.Alerts.Wake()
		return run, fmt.Errorf("usage on %q: %w (%s)", req.Key, runs.ErrBudgetExhausted, exhausted)
	}
	return run, nil
}

// Replace records a replacement of a finished run by a new, upstream-issued key (the
// rerun protocol's step 3). The new key then goes through the normal claim; the old key
// keeps answering its own state.
func (s *Service) Replace(ctx context.Context, oldKey, newKey, reason, actor string) (store.Replacement, error) {
	switch {
	case strings.TrimSpace(reason) == "":
		return store.Replacement{}, &runs.FieldError{Field: "reason", Msg: "required: say why"}
	case newKey == oldKey:
		return store.Replacement{}, fmt.Errorf("%w: the new key is the old one", ErrInvalidReplacement)
	case adHocSuffix(oldKey, newKey):
		return store.Replacement{}, fmt.Errorf("%w: the old key plus a suffix is not an upstream-issued key", ErrInvalidReplacement)
	}
	var r store.Replacement
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		old, err := q.RunGet(ctx, oldKey)
		if errors.Is(err, store.ErrNotFound) {
			return runs.ErrNotFound
		}
		if err != nil {
			return err
		}
		if old.State != store.StateCompleted && old.State != store.StateFailedTerminal && old.State != store.StateRejected {
			return fmt.Errorf("%w: it is %s", ErrNotFinished, old.State)
		}
		if n, err := q.RunOpenEffects(ctx, oldKey); err != nil {
			return err
		} else if n > 0 {
			return fmt.Errorf("%w: %d effect(s) are open or failed; resolve them first", ErrNotFinished, n)
		}
		if _, err := q.ReplacementFind(ctx, oldKey, false); err == nil {
			return ErrAlreadyReplaced
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if _, err := q.RunGet(ctx, newKey); err == nil {
			return fmt.Errorf("%w: a run has it", ErrKeyInUse)
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if _, err := q.ReplacementFind(ctx, newKey, true); err == nil {
			return fmt.Errorf("%w: it already replaces another run", ErrKeyInUse)
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		effs, err := q.EffectList(ctx, store.EffectListParams{RunKey: oldKey, States: []store.EffectState{store.EffectCompleted}})
		if err != nil {
			return err
		}
		ids := []string{}
		for _, e := range effs {
			if e.ProviderID != "" {
				ids = append(ids, e.ProviderID)
			}
		}
		r = store.Replacement{OldKey: oldKey, NewKey: newKey, Reason: reason, Actor: actor, ProviderIDs: ids, CreatedAt: s.AtOrZero()}
		if err := q.ReplacementInsert(ctx, r); err != nil {
			return err
		}
		if err := q.RunSetReplacedBy(ctx, oldKey, newKey); err != nil {
			return err
		}
		return runs.Event(ctx, q, s.At(), runs.Entry{Key: oldKey, Kind: store.EventReplaced, Actor: actor,
			Detail: map[string]any{"new_key": newKey, "reason": reason, "provider_ids": ids}})
	})
	if err != nil {
		return store.Replacement{}, fmt.Errorf("replace %q: %w", oldKey, err)
	}
	return r, nil
}

// adHocSuffix reports whether newKey is oldKey with a separator and more appended
// ("T-1-retry", "T-1.v2"): the improvised rerun the protocol forbids. "T-10" after "T-1" is
// another upstream id and passes.
func adHocSuffix(oldKey, newKey string) bool {
	rest, ok := strings.CutPrefix(newKey, oldKey)
	return ok && rest != "" && strings.ContainsRune("._:@+=~-", rune(rest[0]))
}

// Replacements returns what replaced key and what key replaces, if anything.
func (s *Service) Replacements(ctx context.Context, key string) (replacedBy, replaces *store.Replacement, err error) {
	if r, err := s.Store.ReplacementFind(ctx, key, false); err == nil {
		replacedBy = &r
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, nil, err
	}
	if r, err := s.Store.ReplacementFind(ctx, key, true); err == nil {
		replaces = &r
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, nil, err
	}
	return replacedBy, replaces, nil
}

// Unpark is an operator's way out for a run parked in awaiting_human for unknown_commit
// or input_mismatch, which no delivery can reclaim: to failed_terminal (given up: its
// pending effects are cancelled, as for any run that fails for good) or to
// failed_retryable (the next delivery with the same payload reclaims it and continues).
// A reason is required; the event run_unparked records it with the actor. The API
// (POST /v1/runs/{key}/unpark), the CLI (airlock runs unpark) and the console all call
// this.
func (s *Service) Unpark(ctx context.Context, key string, to store.State, reason, actor string) (store.Run, error) {
	return s.moveByOperator(ctx, unpark, OperatorMove{Key: key, To: to, Reason: reason, Actor: actor})
}

// Redrive ends a stall: a run left processing after its lease lapsed, that nothing
// completed (its caller died mid-run and no delivery came back). to is failed_retryable
// — released for its redelivery: the lease is over, and the next delivery of the same key
// claims it at once, as after any retryable failure — or failed_terminal: given up, its
// pending effects withdrawn (a replacement run is then the way to do the work). The run
// is re-read under its lock, so a run that a delivery reclaimed meanwhile is refused
// (ErrNotStalled), never taken from its new holder. A run_redriven event records who,
// why and when the lapsed lease ended.
func (s *Service) Redrive(ctx context.Context, key string, to store.State, reason, actor string) (store.Run, error) {
	return s.moveByOperator(ctx, redrive, OperatorMove{Key: key, To: to, Reason: reason, Actor: actor})
}

// OperatorMove is an operator's request to move a run that nothing else will move.
type OperatorMove struct {
	Key    string
	To     store.State // failed_terminal or failed_retryable
	Reason string      // required: why
	Actor  string
}

// operatorMove is one kind of operator move: the state it moves runs out of, its event,
// and which runs in that state it applies to.
type operatorMove struct {
	name  string // the error's prefix
	from  store.State
	event store.EventKind
	// movable says, under the run's lock at now, why run is not this move's to make
	// (err), or the event's own fields and the result a failed_terminal run keeps.
	movable func(run store.Run, now time.Time, actor string) (fields map[string]any, result map[string]string, err error)
}

// unpark moves runs parked in awaiting_human for a reason no delivery can clear.
var unpark = operatorMove{name: "unpark", from: store.StateAwaitingHuman, event: store.EventRunUnparked,
	movable: func(run store.Run, _ time.Time, actor string) (map[string]any, map[string]string, error) {
		if run.State != store.StateAwaitingHuman || !slices.Contains(store.ParkReasons, run.ParkReason) {
			why := string(run.State)
			if run.ParkReason != "" {
				why += " (" + run.ParkReason + ")"
			}
			return nil, nil, fmt.Errorf("%w: it is %s", ErrNotParked, why)
		}
		return map[string]any{"parked_for": run.ParkReason},
			map[string]string{"reason": "unparked", "parked_for": run.ParkReason, "by": actor}, nil
	}}

// redrive moves runs left processing after their lease lapsed.
var redrive = operatorMove{name: "re-drive", from: store.StateProcessing, event: store.EventRunRedriven,
	movable: func(run store.Run, now time.Time, actor string) (map[string]any, map[string]string, error) {
		if run.State != store.StateProcessing || run.LeaseLive(now) {
			why := string(run.State)
			if run.LeaseLive(now) {
				why += ", its lease held until " + run.LeaseExpiresAt.UTC().Format(time.RFC3339)
			}
			return nil, nil, fmt.Errorf("%w: it is %s", ErrNotStalled, why)
		}
		fields := map[string]any{} // never the lease owner
		if run.LeaseExpiresAt != nil {
			fields["lease_expired_at"] = run.LeaseExpiresAt.UTC()
		}
		return fields, map[string]string{"reason": "stalled", "by": actor}, nil
	}}

// moveByOperator makes an operator's move m in one transaction: the run is re-read under
// its lock (a run that moved on meanwhile is refused, never taken from its new holder),
// moved to req.To, its event records who and why, and a run given up
// (failed_terminal) has its pending effects withdrawn.
func (s *Service) moveByOperator(ctx context.Context, m operatorMove, req OperatorMove) (store.Run, error) {
	if req.To != store.StateFailedTerminal && req.To != store.StateFailedRetryable {
		return store.Run{}, &runs.FieldError{Field: "to", Msg: "must be failed_terminal or failed_retryable"}
	}
	if strings.TrimSpace(req.Reason) == "" {
		return store.Run{}, &runs.FieldError{Field: "reason", Msg: "required: say why"}
	}
	if !runs.Allowed(m.from, req.To, runs.Operator) {
		return store.Run{}, runs.ErrInvalidTransition
	}
	key := req.Key
	var out store.Run
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		// The run's lock first: its state, park reason and lease are read and changed under it.
		locked, err := q.RunLockKeys(ctx, []string{key})
		if err != nil {
			return err
		}
		run, ok := locked[key]
		if !ok {
			return runs.ErrNotFound
		}
		now, err := s.Read(ctx, q)
		if err != nil {
			return err
		}
		fields, result, err := m.movable(run, now, req.Actor)
		if err != nil {
			return err
		}
		var stored json.RawMessage // failed_retryable keeps the stored result: the run is not finished
		if req.To == store.StateFailedTerminal {
			if stored, err = json.Marshal(result); err != nil {
				return err
			}
		}
		out, err = q.RunSetState(ctx, store.RunSetStateParams{Key: key, From: m.from, To: req.To, Result: stored, Now: s.At()})
		if err != nil {
			return err
		}
		fields["from"], fields["to"], fields["reason"] = m.from, req.To, req.Reason
		if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: key, Kind: m.event, Version: out.Version, Actor: req.Actor, Detail: fields}); err != nil {
			return err
		}
		if req.To == store.StateFailedTerminal {
			return runs.CancelPending(ctx, q, s.At(), key)
		}
		return nil
	})
	if err != nil {
		return store.Run{}, fmt.Errorf("%s %q: %w", m.name, key, err)
	}
	return out, nil
}
