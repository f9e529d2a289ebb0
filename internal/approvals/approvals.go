// Package approvals is the human gate: a single-use, expiring challenge that holds a
// proposed effect until a logged-in person with the right role decides. Only the token's
// SHA-256 is stored; consuming it, moving the run and queueing the effect happen in one
// transaction.
package approvals

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Decisions.
const (
	Approve = "approve"
	Reject  = "reject"
)

// Outcomes of a decision attempt. ErrNotFound is deliberately one error for unknown,
// expired and used tokens: the page must not tell them apart.
var (
	ErrNotFound           = errors.New("this approval link is not valid")
	ErrForbidden          = errors.New("you are not one of the approvers of this action")
	ErrSelfApproval       = errors.New("separation of duties: the requester cannot approve their own action")
	ErrDecisionNotAllowed = errors.New("that decision is not allowed for this approval")
)

// tokenBytes is 256 bits from crypto/rand.
const tokenBytes = 32

// NewToken returns a raw token and its stored hash.
func NewToken() (raw, hash string, err error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("generate approval token: %w", err)
	}
	raw = base64.RawURLEncoding.EncodeToString(b)
	return raw, HashToken(raw), nil
}

// HashToken is the stored form of a token.
func HashToken(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return hex.EncodeToString(sum[:])
}

// Person is whoever is logged in.
type Person struct {
	Subject string
	Roles   []string
}

// Service creates and decides approvals.
type Service struct {
	store     store.Store
	policy    *policy.Policy
	alerts    runs.Alerter
	publicURL string
	runs.Clock
}

func NewService(st store.Store, p *policy.Policy, alerts runs.Alerter, publicURL string, now func() time.Time) *Service {
	return &Service{store: st, policy: p, alerts: alerts, publicURL: strings.TrimRight(publicURL, "/"), Clock: runs.Clock{Now: now}}
}

// Proposed is the effect an approval holds until it is decided.
type Proposed struct {
	ActionType, Target, EffectID, Executor string
	Payload                                json.RawMessage
	PayloadHash                            string
}

// Requested is a new approval. Token is the raw token: shown once, never stored.
type Requested struct {
	Approval store.Approval
	Token    string
	URL      string
	Run      store.Run
}

// Request opens an approval inside the caller's transaction, in which run is held under
// its lease: the run moves to awaiting_human and nothing enters the outbox.
func (s *Service) Request(ctx context.Context, q store.Queries, run store.Run, a *policy.Action, p Proposed, requestedBy, actor string, meta *runs.Meta) (Requested, error) {
	raw, hash, err := NewToken()
	if err != nil {
		return Requested{}, err
	}
	now, err := s.Read(ctx, q)
	if err != nil {
		return Requested{}, err
	}
	ap := store.Approval{ID: uuid.NewString(), RunKey: run.Key, TokenHash: hash, Mode: a.Gate,
		AllowedDecisions: []string{Approve, Reject}, ExpiresAt: now.Add(a.ApprovalTTL.D()), RequestedBy: requestedBy,
		ApproverRoles: a.Approvers.Roles, ApproverSubjects: a.Approvers.Subjects, SeparationOfDuties: *a.Approvers.SeparationOfDuties,
		ActionType: p.ActionType, Target: p.Target, EffectID: p.EffectID, Executor: p.Executor, Payload: p.Payload,
		PayloadHash: p.PayloadHash, CreatedAt: s.AtOrZero()}
	moved, err := q.RunTransition(ctx, store.RunTransitionParams{Key: run.Key, Owner: run.LeaseOwner, Version: run.Version,
		From: store.StateProcessing, To: store.StateAwaitingHuman, ParkReason: "approval", Now: s.At()})
	if err != nil {
		return Requested{}, fmt.Errorf("park run for approval: %w", err)
	}
	if err := q.ApprovalInsert(ctx, ap); err != nil {
		return Requested{}, err
	}
	if err := runs.Event(ctx, q, s.At(), run.Key, "approval_requested", moved.Version, actor, meta, map[string]any{
		"approval_id": ap.ID, "mode": ap.Mode, "action_type": p.ActionType, "target": p.Target, "effect_id": p.EffectID,
		"payload_hash": p.PayloadHash, "requested_by": requestedBy, "expires_at": ap.ExpiresAt,
		"approver_roles": ap.ApproverRoles, "approver_subjects": ap.ApproverSubjects,
	}); err != nil {
		return Requested{}, err
	}
	return Requested{Approval: ap, Token: raw, URL: s.publicURL + "/approve/" + raw, Run: moved}, nil
}

// Lookup finds an open approval by its token's hash, with its run, for the confirmation
// page. Unknown, expired and used tokens are all ErrNotFound.
func (s *Service) Lookup(ctx context.Context, tokenHash string) (store.Approval, store.Run, error) {
	a, err := s.store.ApprovalByTokenHash(ctx, tokenHash)
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, store.Run{}, ErrNotFound
	}
	if err != nil {
		return store.Approval{}, store.Run{}, err
	}
	now, err := s.Read(ctx, s.store)
	if err != nil {
		return store.Approval{}, store.Run{}, err
	}
	if a.ConsumedAt != nil || !a.ExpiresAt.After(now) {
		return store.Approval{}, store.Run{}, ErrNotFound
	}
	run, err := s.store.RunGet(ctx, a.RunKey)
	return a, run, err
}

// May reports whether who may decide a: by role or subject, and never their own request
// under separation of duties.
func May(a store.Approval, who Person) error {
	allowed := slices.Contains(a.ApproverSubjects, who.Subject)
	for _, r := range who.Roles {
		allowed = allowed || slices.Contains(a.ApproverRoles, r)
	}
	if !allowed {
		return ErrForbidden
	}
	if a.SeparationOfDuties && who.Subject == a.RequestedBy {
		return ErrSelfApproval
	}
	return nil
}

// Decide consumes the approval and acts on it in one transaction: approve moves the run
// to approved and inserts the held effect into the outbox; reject moves it to rejected
// with the reason and queues nothing. Any failure rolls everything back.
func (s *Service) Decide(ctx context.Context, tokenHash, decision, reason string, who Person) (store.Approval, error) {
	if decision != Approve && decision != Reject {
		return store.Approval{}, ErrDecisionNotAllowed
	}
	var out store.Approval
	err := s.store.Transact(ctx, func(q store.Queries) error {
		a, err := q.ApprovalByTokenHash(ctx, tokenHash)
		if errors.Is(err, store.ErrNotFound) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if err := May(a, who); err != nil {
			return err
		}
		if !slices.Contains(a.AllowedDecisions, decision) {
			return ErrDecisionNotAllowed
		}
		out, err = q.ApprovalConsume(ctx, store.ApprovalConsumeParams{TokenHash: tokenHash, Decision: decision,
			Subject: who.Subject, Reason: reason, Now: s.At()})
		if errors.Is(err, store.ErrNoMatch) {
			return ErrNotFound // used or expired meanwhile
		}
		if err != nil {
			return err
		}
		to, result := store.StateApproved, json.RawMessage(nil)
		if decision == Reject {
			to = store.StateRejected
			if result, err = json.Marshal(map[string]string{"rejected_by": who.Subject, "reason": reason}); err != nil {
				return err
			}
		}
		run, err := q.RunSetState(ctx, store.RunSetStateParams{Key: a.RunKey, From: store.StateAwaitingHuman, To: to,
			Result: result, Now: s.At()})
		if errors.Is(err, store.ErrNoMatch) {
			return fmt.Errorf("%w: the run is no longer waiting for this decision", ErrNotFound)
		}
		if err != nil {
			return err
		}
		if err := runs.Event(ctx, q, s.At(), a.RunKey, "approval_decided", run.Version, who.Subject, nil, map[string]any{
			"approval_id": a.ID, "decision": decision, "approver": who.Subject, "reason": reason, "to": to,
		}); err != nil {
			return err
		}
		if decision == Reject {
			return nil
		}
		e, created, err := q.EffectInsert(ctx, store.Effect{ID: uuid.NewString(), RunKey: a.RunKey, EffectID: a.EffectID,
			ActionType: a.ActionType, Target: a.Target, Executor: a.Executor, Payload: a.Payload, PayloadHash: a.PayloadHash,
			State: store.EffectPending, NotBefore: s.AtOrZero(), CreatedAt: s.AtOrZero()})
		if err != nil {
			return err
		}
		if !created {
			return fmt.Errorf("approve: effect %s of run %s is already in the outbox", a.EffectID, a.RunKey)
		}
		return runs.Event(ctx, q, s.At(), a.RunKey, "effect_queued", run.Version, who.Subject, nil, map[string]any{
			"effect_id": e.EffectID, "action_type": e.ActionType, "target": e.Target, "executor": e.Executor,
			"payload_hash": e.PayloadHash, "approval_id": a.ID,
		})
	})
	if err != nil {
		return store.Approval{}, fmt.Errorf("decide approval: %w", err)
	}
	return out, nil
}

// ExpireDue expires approvals whose time has passed: the run becomes failed_terminal
// (reason approval_expired), with an event and an alert. Each approval changes in its own
// transaction; several instances may run it at once.
func (s *Service) ExpireDue(ctx context.Context) error {
	due, err := s.store.ApprovalsExpired(ctx, s.At(), 100)
	if err != nil {
		return fmt.Errorf("find expired approvals: %w", err)
	}
	for _, a := range due {
		err := s.store.Transact(ctx, func(q store.Queries) error {
			if _, err := q.ApprovalExpire(ctx, a.ID, s.At()); err != nil {
				return err
			}
			result, _ := json.Marshal(map[string]string{"reason": "approval_expired"})
			run, err := q.RunSetState(ctx, store.RunSetStateParams{Key: a.RunKey, From: store.StateAwaitingHuman,
				To: store.StateFailedTerminal, Result: result, Now: s.At()})
			if err != nil {
				return err
			}
			if err := runs.Event(ctx, q, s.At(), a.RunKey, "transition", run.Version, "airlock", nil, map[string]any{
				"from": store.StateAwaitingHuman, "to": store.StateFailedTerminal, "reason": "approval_expired", "approval_id": a.ID,
			}); err != nil {
				return err
			}
			return runs.Event(ctx, q, s.At(), a.RunKey, "alert", run.Version, "airlock", nil,
				map[string]any{"alert": "approval_expired", "approval_id": a.ID})
		})
		if errors.Is(err, store.ErrNoMatch) {
			continue // decided or expired by another instance meanwhile
		}
		if err != nil {
			return fmt.Errorf("expire approval %s: %w", a.ID, err)
		}
		s.alerts.Alert(ctx, "approval_expired", a.RunKey, slog.String("approval_id", a.ID))
	}
	return nil
}
