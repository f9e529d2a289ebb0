// Package approvals is the human gate: a single-use, expiring challenge that holds a
// proposed effect until a logged-in person with the right role decides. Only the token's
// SHA-256 is stored; consuming it, moving the run and queueing the effect happen in one
// transaction.
package approvals

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"

	"github.com/airlockhq/airlock/internal/input"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Decisions.
const (
	Approve = "approve"
	Reject  = "reject"
	Cancel  = "cancel"  // act_with_window: withdraw the queued effect before it is sent
	Confirm = "confirm" // review of an auto-approval: it was right
	Flag    = "flag"    // review of an auto-approval: it was wrong (alerts)
)

// ModeReview marks a sampled auto-approval waiting for its post-hoc review.
const ModeReview = "review"

// reviewTTL is how long a sampled auto-approval stays on the review list.
const reviewTTL = 7 * 24 * time.Hour

// Outcomes of a decision attempt. ErrNotFound is deliberately one error for unknown,
// expired and used tokens: the page must not tell them apart.
var (
	ErrNotFound           = errors.New("this approval link is not valid")
	ErrForbidden          = errors.New("you are not one of the approvers of this action")
	ErrSelfApproval       = errors.New("separation of duties: the requester cannot approve their own action")
	ErrDecisionNotAllowed = errors.New("that decision is not allowed for this approval")
	ErrTooLate            = errors.New("too late: the effect is already being sent or was sent")
	ErrNotPending         = errors.New("the approval is no longer pending: it was decided, withdrawn or expired")
	ErrNoLink             = errors.New("a review has no link: decide it with POST /v1/reviews/{id}")
	// ErrUnknownApproval is a reissue's unknown id: an operator names approvals by id, so,
	// unlike a link, it may say that none has it.
	ErrUnknownApproval = errors.New("no approval has this id")
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
	runs.Base
	publicURL string
	outbox    Outbox
	decided   func()
	// WebhookBackoff is the first wait before a chat webhook is posted again (default
	// 1s, doubled each time); WebhookClient posts them (default http.DefaultClient).
	WebhookBackoff time.Duration
	WebhookClient  *http.Client
	webhooks       sync.WaitGroup
	// Hook, when set, is called at named points between statements (approval_consumed,
	// approval_steps_listed, undecidable_listed):
	// tests force interleavings with it. Never set in production.
	Hook func(point string)
}

// Outbox is where a decision puts or withdraws the effect its approval holds, inside the
// decision's transaction (effects.Outbox: the one way into the outbox; this package
// cannot import it).
type Outbox interface {
	// Approved puts the effect a held into the outbox; run is as the decision left it.
	Approved(ctx context.Context, q store.Queries, a store.Approval, run store.Run, actor string) error
	// Withdraw is a cancel link's decision d: the act_with_window effect a names is
	// cancelled if no sender has taken it (ErrTooLate otherwise), and its run settled.
	Withdraw(ctx context.Context, q store.Queries, a store.Approval, d Decision) error
	// Wake tells this instance's dispatcher, after the commit, that an effect is due.
	Wake()
}

// Config is what the approvals service needs beside its Base.
type Config struct {
	// Outbox queues an approved effect in the decision's transaction (required).
	Outbox Outbox
	// PublicURL is where approval links point ("https://airlock.example.com").
	PublicURL string
	// Decided, when set, is told after a decision committed (serve writes an audit
	// checkpoint, so the decision is covered by one at once).
	Decided func()
}

// New builds the approvals service over b.
func New(b runs.Base, cfg Config) (*Service, error) {
	b, err := b.Fill()
	if err != nil {
		return nil, fmt.Errorf("approvals: %w", err)
	}
	if cfg.Outbox == nil {
		return nil, errors.New("approvals: Config.Outbox is required: an approved effect enters the outbox through it")
	}
	decided := cfg.Decided
	if decided == nil {
		decided = func() {}
	}
	return &Service{Base: b, publicURL: strings.TrimRight(cfg.PublicURL, "/"), outbox: cfg.Outbox, decided: decided}, nil
}

func (s *Service) hook(point string) {
	if s.Hook != nil {
		s.Hook(point)
	}
}

// Proposed is the effect an approval holds until it is decided.
type Proposed struct {
	ActionType, Target, EffectID, Executor string
	Payload                                json.RawMessage
	PayloadHash                            string
}

// Identity is the form in which two names of one person compare equal: NFKC, trimmed,
// case-folded (so "ANA", " ana " and the fullwidth "ａｎａ" are all ana).
func Identity(s string) string {
	return norm.NFKC.String(cases.Fold().String(strings.TrimSpace(norm.NFKC.String(s))))
}

// Requester is who asks for an effect: Display is what the card and events show; IDs are
// every identity behind the request — the API key, the person it acts for, the declared
// requested_by — of which none may decide it under separation of duties.
type Requester struct {
	Display string
	IDs     []string
}

// NewRequester builds the requester of a request made with an API key (actor is
// "apikey:<name>"), optionally acting for onBehalfOf, that declared requestedBy.
func NewRequester(actor, onBehalfOf, requestedBy string) Requester {
	r := Requester{Display: actor}
	switch {
	case strings.TrimSpace(requestedBy) != "":
		r.Display = strings.TrimSpace(requestedBy)
	case onBehalfOf != "":
		r.Display = onBehalfOf
	}
	for _, id := range []string{actor, onBehalfOf, requestedBy} {
		if n := Identity(id); n != "" && !slices.Contains(r.IDs, n) {
			r.IDs = append(r.IDs, n)
		}
	}
	return r
}

// Requested is a new approval. Token is the raw token: shown once, never stored.
type Requested struct {
	Approval store.Approval
	Token    string
	URL      string
	Run      store.Run
	// Reissued is true when this is a fresh link for an approval that already existed.
	Reissued bool
}

// Ask is who asks for a person's decision, and under which action type's policy: the
// action type (with the gate the request asked for), the requester, the actor its events
// name and the request's meta.
type Ask struct {
	Action *policy.Action
	By     Requester
	Actor  string
	Meta   *runs.Meta
}

// Request opens an approval of p inside the caller's transaction, in which run is held
// under its lease: the run moves to awaiting_human and nothing enters the outbox.
func (s *Service) Request(ctx context.Context, q store.Queries, run store.Run, p Proposed, ask Ask) (Requested, error) {
	a, by, actor, meta := ask.Action, ask.By, ask.Actor, ask.Meta
	raw, hash, err := NewToken()
	if err != nil {
		return Requested{}, err
	}
	now, err := s.Read(ctx, q)
	if err != nil {
		return Requested{}, err
	}
	ap := store.Approval{ID: uuid.NewString(), RunKey: run.Key, TokenHash: hash, Mode: a.Gate,
		AllowedDecisions: []string{Approve, Reject}, ExpiresAt: now.Add(a.ApprovalTTL.D()), RequestedBy: by.Display, Requesters: by.IDs,
		ApproverRoles: a.Approvers.Roles, ApproverSubjects: a.Approvers.Subjects, SeparationOfDuties: *a.Approvers.SeparationOfDuties,
		ActionType: p.ActionType, Target: p.Target, EffectID: p.EffectID, Executor: p.Executor, Payload: p.Payload,
		PayloadHash: p.PayloadHash, CreatedAt: s.AtOrZero()}
	steps(&ap, a, now)
	moved, err := q.RunTransition(ctx, store.RunTransitionParams{Key: run.Key, Owner: run.LeaseOwner, Version: run.Version,
		From: store.StateProcessing, To: store.StateAwaitingHuman, ParkReason: "approval", Now: s.At()})
	if err != nil {
		return Requested{}, fmt.Errorf("park run for approval: %w", err)
	}
	if err := s.undecidableAtRequest(ctx, q, &ap, now); err != nil {
		return Requested{}, err
	}
	if err := q.ApprovalInsert(ctx, ap); err != nil {
		return Requested{}, err
	}
	if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: run.Key, Kind: store.EventApprovalRequested, Version: moved.Version, Actor: actor, Meta: meta,
		Detail: map[string]any{
			"approval_id": ap.ID, "mode": ap.Mode, "action_type": p.ActionType, "target": p.Target, "effect_id": p.EffectID,
			"payload_hash": p.PayloadHash, "payload_fields": a.Redact(p.Payload), "requested_by": by.Display, "requesters": by.IDs, "expires_at": ap.ExpiresAt,
			"approver_roles": ap.ApproverRoles, "approver_subjects": ap.ApproverSubjects,
		}}); err != nil {
		return Requested{}, err
	}
	if ap.UndecidableSince != nil {
		if err := s.undecidableEvents(ctx, q, ap, moved.Version); err != nil {
			return Requested{}, err
		}
	}
	return Requested{Approval: ap, Token: raw, URL: s.publicURL + "/approve/" + raw, Run: moved}, nil
}

// Recipients are the envelope recipients of a mail approval (nil for other connectors):
// the card shows exactly where the mail will go.
func (s *Service) Recipients(a store.Approval) []string {
	if act := s.Policy.Action(a.ActionType); act != nil {
		return act.Recipients(a.Target)
	}
	return nil
}

// Lookup finds an open approval by its token's hash, with its run, for the confirmation
// page. Unknown, expired and used tokens are all ErrNotFound.
func (s *Service) Lookup(ctx context.Context, tokenHash string) (store.Approval, store.Run, error) {
	a, err := s.Store.ApprovalByTokenHash(ctx, tokenHash)
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, store.Run{}, ErrNotFound
	}
	if err != nil {
		return store.Approval{}, store.Run{}, err
	}
	now, err := s.Read(ctx, s.Store)
	if err != nil {
		return store.Approval{}, store.Run{}, err
	}
	if a.ConsumedAt != nil || !a.ExpiresAt.After(now) {
		return store.Approval{}, store.Run{}, ErrNotFound
	}
	run, err := s.Store.RunGet(ctx, a.RunKey)
	return a, run, err
}

// Window opens the cancel link of an act_with_window effect, queued in the same
// transaction: approvers may withdraw it until the dispatcher takes it (ask's Meta is not
// recorded).
func (s *Service) Window(ctx context.Context, q store.Queries, run store.Run, e store.Effect, ask Ask) (Requested, error) {
	a, by, actor := ask.Action, ask.By, ask.Actor
	raw, hash, err := NewToken()
	if err != nil {
		return Requested{}, err
	}
	ap := store.Approval{ID: uuid.NewString(), RunKey: run.Key, TokenHash: hash, Mode: a.Gate,
		AllowedDecisions: []string{Cancel}, ExpiresAt: e.NotBefore, RequestedBy: by.Display, Requesters: by.IDs,
		ApproverRoles: a.Approvers.Roles, ApproverSubjects: a.Approvers.Subjects, SeparationOfDuties: false,
		ActionType: e.ActionType, Target: e.Target, EffectID: e.EffectID, Executor: e.Executor, Payload: e.Payload,
		PayloadHash: e.PayloadHash, CreatedAt: s.AtOrZero()}
	if err := q.ApprovalInsert(ctx, ap); err != nil {
		return Requested{}, err
	}
	if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: run.Key, Kind: store.EventCancelWindowOpened, Version: run.Version, Actor: actor,
		Detail: map[string]any{
			"approval_id": ap.ID, "effect_id": e.EffectID, "not_before": e.NotBefore,
		}}); err != nil {
		return Requested{}, err
	}
	return Requested{Approval: ap, Token: raw, URL: s.publicURL + "/approve/" + raw, Run: run}, nil
}

// Reissue gives a pending approval (or an open cancel window) a fresh link, in its own
// transaction: see ReissueIn.
func (s *Service) Reissue(ctx context.Context, id, actor string) (Requested, error) {
	var out Requested
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		var err error
		out, err = s.ReissueIn(ctx, q, id, actor)
		return err
	})
	if err != nil {
		return Requested{}, fmt.Errorf("reissue approval %s: %w", id, err)
	}
	return out, nil
}

// ReissueIn gives a pending approval a fresh link inside q's transaction: a new raw token
// (returned once, only its hash stored) replaces the old one in one statement, so the old
// link stops working at once and of two concurrent reissues only the later link lives.
// The event approval_link_reissued names the actor, never the token. ErrUnknownApproval
// for an unknown id, ErrNoLink for a review, ErrNotPending once decided, withdrawn or expired.
func (s *Service) ReissueIn(ctx context.Context, q store.Queries, id, actor string) (Requested, error) {
	cur, err := q.ApprovalByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return Requested{}, ErrUnknownApproval
	}
	if err != nil {
		return Requested{}, err
	}
	if cur.Mode == ModeReview {
		return Requested{}, ErrNoLink
	}
	raw, hash, err := NewToken()
	if err != nil {
		return Requested{}, err
	}
	a, err := q.ApprovalRekey(ctx, id, hash, s.At())
	if errors.Is(err, store.ErrNoMatch) {
		return Requested{}, ErrNotPending
	}
	if err != nil {
		return Requested{}, err
	}
	run, err := q.RunGet(ctx, a.RunKey)
	if err != nil {
		return Requested{}, err
	}
	if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: a.RunKey, Kind: store.EventApprovalLinkReissued, Version: run.Version, Actor: actor,
		Detail: map[string]any{
			"approval_id": a.ID, "mode": a.Mode, "effect_id": a.EffectID, "expires_at": a.ExpiresAt,
		}}); err != nil {
		return Requested{}, err
	}
	return Requested{Approval: a, Token: raw, URL: s.publicURL + "/approve/" + raw, Run: run, Reissued: true}, nil
}

// May reports whether who may decide a: by role or subject (or by an escalation role
// once the approval was escalated), and never their own request
// under separation of duties — compared by skeletons (input.SameIdentity: case, width,
// blanks, combining marks, invisible characters and look-alike letters of any script do
// not tell two names apart), against every
// identity of the requester (the API key, the person it acts for, the declared
// requested_by).
func May(a store.Approval, who Person) error {
	allowed := slices.Contains(a.ApproverSubjects, who.Subject)
	for _, r := range who.Roles {
		allowed = allowed || slices.Contains(a.ApproverRoles, r) || (a.EscalatedAt != nil && slices.Contains(a.EscalationRoles, r))
	}
	if !allowed {
		return ErrForbidden
	}
	if a.SeparationOfDuties && !slices.Equal(a.AllowedDecisions, []string{Cancel}) {
		// By skeletons (input.SameIdentity: UTS #39 around case folding, blanks and
		// combining marks dropped): "аna" with a Cyrillic а, "ΑΝΑ", "ᴀɴᴀ" or "an\u200ba" is
		// ana. The stored requesters are Identity forms, whose skeletons are their names'.
		// A person without a subject is nobody's match, and may not decide.
		if input.Skeleton(who.Subject) == "" || input.SameIdentity(who.Subject, a.RequestedBy) ||
			slices.ContainsFunc(a.Requesters, func(r string) bool { return input.SameIdentity(who.Subject, r) }) {
			return ErrSelfApproval
		}
	}
	return nil
}

// Decision is one decision attempt, wherever the person makes it: the page (the link,
// the console) or a chat message's button. Every place goes through DecideBy.
type Decision struct {
	TokenHash        string // the approval's, as stored (the page hashes its link's token)
	Decision, Reason string
	Who              Person
	// Via names where the person decided when it is not the page ("slack:TEAM/USER"):
	// the events' actor is then "person:NAME via VIA".
	Via string
	// PayloadHash, when set, must equal the approval's: what the person was shown is
	// what is decided (ErrPayloadChanged otherwise).
	PayloadHash string
	// Place, when not the page, must be one of the action type's approval.decide_in
	// (ErrNotDecidedHere otherwise): a type that forbids chat is not decided there,
	// whatever button was clicked.
	Place string
}

// ErrPayloadChanged: the decision names a payload hash that is not the approval's.
var ErrPayloadChanged = errors.New("the payload shown is not the one this approval holds: nothing was decided")

// ErrNotDecidedHere: the approval's action type is not decided where the decision came
// from (approval.decide_in).
var ErrNotDecidedHere = errors.New("this action type's approvals are decided on the page only: nothing was decided")

// Actor is how the decision's events name who decided.
func (d Decision) Actor() string {
	if d.Via == "" {
		return d.Who.Subject
	}
	return "person:" + d.Who.Subject + " via " + d.Via
}

// Decide is DecideBy for the page: the person signed in, no payload hash to compare.
func (s *Service) Decide(ctx context.Context, tokenHash, decision, reason string, who Person) (store.Approval, error) {
	return s.DecideBy(ctx, Decision{TokenHash: tokenHash, Decision: decision, Reason: reason, Who: who})
}

// DecideBy consumes the approval and acts on it in one transaction: approve moves the run
// to approved and inserts the held effect into the outbox; reject moves it to rejected
// with the reason and queues nothing. Any failure rolls everything back. Like every
// transaction that locks a run and an approval of it, it locks the run first.
func (s *Service) DecideBy(ctx context.Context, d Decision) (store.Approval, error) {
	tokenHash, decision, reason, who, actor := d.TokenHash, d.Decision, d.Reason, d.Who, d.Actor()
	if decision != Approve && decision != Reject && decision != Cancel {
		return store.Approval{}, ErrDecisionNotAllowed
	}
	var out store.Approval
	var queued bool
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		queued = false
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
		if d.Place != "" && d.Place != policy.DecideInPage {
			if act := s.Policy.Action(a.ActionType); act == nil || !act.DecidesIn(d.Place) {
				return ErrNotDecidedHere
			}
		}
		if d.PayloadHash != "" && d.PayloadHash != a.PayloadHash {
			return ErrPayloadChanged
		}
		if !slices.Contains(a.AllowedDecisions, decision) {
			return ErrDecisionNotAllowed
		}
		// The run's lock before the approval's, as everywhere (runs first, in key order):
		// the operator's cancel (effects.Cancel) locks the run, then consumes this approval.
		if _, err := q.RunLockKeys(ctx, []string{a.RunKey}); err != nil {
			return err
		}
		out, err = q.ApprovalConsume(ctx, store.ApprovalConsumeParams{TokenHash: tokenHash, Decision: decision,
			Subject: who.Subject, Reason: reason, Now: s.At()})
		if errors.Is(err, store.ErrNoMatch) {
			return ErrNotFound // used or expired meanwhile
		}
		if err != nil {
			return err
		}
		s.hook("approval_consumed")
		if decision == Cancel {
			return s.outbox.Withdraw(ctx, q, a, d)
		}
		to, result := store.StateApproved, json.RawMessage(nil)
		if a.Executor == store.ExecutorAgent {
			// The agent performs it itself: back to processing with no live lease, so its
			// next claim takes the run and its next plan of this effect may execute.
			to = store.StateProcessing
		}
		if decision == Reject {
			to = store.StateRejected
			if act := s.Policy.Action(a.ActionType); a.Executor == store.ExecutorAgent && act != nil && act.Approval.OnReject == policy.OnRejectSkipEffect {
				// Only this effect is refused (its next plan answers effect_rejected with
				// who and why); the agent goes on with the rest of its task.
				to = store.StateProcessing
			}
		}
		if to == store.StateRejected {
			// Who, why and which: the next claim answers it, and a client tells the user.
			if result, err = json.Marshal(map[string]string{"rejected_by": who.Subject, "reason": reason,
				"effect_id": a.EffectID, "approval_id": a.ID}); err != nil {
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
		if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: a.RunKey, Kind: store.EventApprovalDecided, Version: run.Version, Actor: actor,
			Detail: map[string]any{
				"approval_id": a.ID, "decision": decision, "approver": who.Subject, "reason": reason, "to": to,
				"payload_hash": a.PayloadHash,
			}}); err != nil {
			return err
		}
		if decision == Reject || a.Executor == store.ExecutorAgent {
			return nil
		}
		queued = true
		return s.outbox.Approved(ctx, q, a, run, actor) // effects owns "approved → queued"
	})
	if err != nil {
		return store.Approval{}, fmt.Errorf("decide approval: %w", err)
	}
	if queued {
		s.outbox.Wake()
	}
	if out.ConsumedAt != nil {
		s.Observer.Decision(out.Mode, decision, out.ConsumedAt.Sub(out.CreatedAt))
	}
	s.decided()
	return out, nil
}

// ExpireDue expires approvals whose time has passed: the run becomes failed_terminal
// (reason approval_expired), with an event and an alert. Each approval changes in its own
// transaction; several instances may run it at once.
func (s *Service) ExpireDue(ctx context.Context) error {
	due, err := s.Store.ApprovalsExpired(ctx, s.At(), 100)
	if err != nil {
		return fmt.Errorf("find expired approvals: %w", err)
	}
	for _, a := range due {
		if a.Mode == policy.GateActWithWindow || a.Mode == ModeReview {
			// A closed window lets the effect go ahead; an unreviewed sample just closes.
			// Either is a change, with its event.
			kind, detail := store.EventCancelWindowClosed, map[string]any{"approval_id": a.ID, "effect_id": a.EffectID}
			if a.Mode == ModeReview {
				kind, detail = store.EventAutoApprovalReviewExpired, map[string]any{"review_id": a.ID, "effect_id": a.EffectID}
			}
			err := s.Store.Transact(ctx, func(q store.Queries) error {
				if _, err := q.RunLockKeys(ctx, []string{a.RunKey}); err != nil { // runs first
					return err
				}
				if _, err := q.ApprovalExpire(ctx, a.ID, s.At()); err != nil {
					return err
				}
				return runs.Event(ctx, q, s.At(), runs.Entry{Key: a.RunKey, Kind: kind, Actor: "airlock", Detail: detail})
			})
			if err != nil && !errors.Is(err, store.ErrNoMatch) {
				return fmt.Errorf("close %s %s: %w", a.Mode, a.ID, err)
			}
			continue
		}
		err := s.Store.Transact(ctx, func(q store.Queries) error {
			if _, err := q.RunLockKeys(ctx, []string{a.RunKey}); err != nil { // runs first
				return err
			}
			if _, err := q.ApprovalExpire(ctx, a.ID, s.At()); err != nil {
				return err
			}
			result, _ := json.Marshal(map[string]string{"reason": "approval_expired"})
			run, err := q.RunSetState(ctx, store.RunSetStateParams{Key: a.RunKey, From: store.StateAwaitingHuman,
				To: store.StateFailedTerminal, Result: result, Now: s.At()})
			if err != nil {
				return err
			}
			if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: a.RunKey, Kind: store.EventTransition, Version: run.Version, Actor: "airlock",
				Detail: map[string]any{
					"from": store.StateAwaitingHuman, "to": store.StateFailedTerminal, "reason": "approval_expired", "approval_id": a.ID,
				}}); err != nil {
				return err
			}
			return runs.Event(ctx, q, s.At(), runs.Entry{Key: a.RunKey, Kind: store.EventAlert, Version: run.Version, Actor: "airlock",
				Detail: map[string]any{"alert": "approval_expired", "approval_id": a.ID}})
		})
		if errors.Is(err, store.ErrNoMatch) {
			continue // decided or expired by another instance meanwhile
		}
		if err != nil {
			return fmt.Errorf("expire approval %s: %w", a.ID, err)
		}
		s.Alerts.Wake()
		s.Observer.Decision(a.Mode, "expired", 0)
	}
	return nil
}

// Evidence is one evaluator's finding, from outside the model.
type Evidence struct {
	Source string `json:"source"`
	Name   string `json:"name"`
	Value  any    `json:"value"`
}

// RecordedEvidence is the evidence evaluators recorded on the run, oldest first (a later
// finding of the same source and name replaces an earlier one).
func RecordedEvidence(ctx context.Context, q store.Queries, key string) ([]Evidence, error) {
	rows, err := q.EvidenceByRun(ctx, key)
	if err != nil {
		return nil, err
	}
	out := make([]Evidence, 0, len(rows))
	for _, r := range rows {
		var v any
		if err := json.Unmarshal(r.Value, &v); err != nil {
			return nil, fmt.Errorf("stored evidence %d: %w", r.ID, err)
		}
		out = append(out, Evidence{Source: r.Source, Name: r.Name, Value: v})
	}
	return out, nil
}

// RecordEvidence stores an evaluator's finding on a run: source is the evaluator key's
// name, never a value the workflow chose.
func (s *Service) RecordEvidence(ctx context.Context, key, source, name string, value json.RawMessage, actor string) (store.Evidence, error) {
	var out store.Evidence
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		run, err := q.RunGet(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			return runs.ErrNotFound
		}
		if err != nil {
			return err
		}
		out, err = q.EvidenceInsert(ctx, store.Evidence{RunKey: key, Source: source, Name: name, Value: value,
			RecordedBy: actor, CreatedAt: s.AtOrZero()})
		if err != nil {
			return err
		}
		detail := map[string]any{"source": source, "name": name}
		var v any
		switch _ = json.Unmarshal(value, &v); v.(type) {
		case float64, bool:
			detail["value"] = v // a score or a verdict
		default:
			sum := sha256.Sum256(value) // anything else may carry content: only its hash
			detail["value_sha256"] = hex.EncodeToString(sum[:])
		}
		return runs.Event(ctx, q, s.At(), runs.Entry{Key: key, Kind: store.EventEvidenceRecorded, Version: run.Version, Actor: actor, Detail: detail})
	})
	if err != nil {
		return store.Evidence{}, fmt.Errorf("record evidence on %q: %w", key, err)
	}
	return out, nil
}

// ByException decides approve_by_exception for an effect of run (held under its lease)
// with its validated output: over the evidence evaluators recorded on the run, with the
// run's trigger source and workflow version as the rule's input (see Exception).
func ByException(ctx context.Context, q store.Queries, run store.Run, a *policy.Action, output json.RawMessage) (auto bool, reason string, err error) {
	evidence, err := RecordedEvidence(ctx, q, run.Key)
	if err != nil {
		return false, "", err
	}
	auto, reason = Exception(a, output, evidence,
		map[string]any{"trigger_source": run.TriggerSource, "workflow_version": run.WorkflowVersion})
	return auto, reason, nil
}

// Exception decides approve_by_exception: it auto-approves only when every configured
// evaluator source gave evidence and the rule holds over the validated output. Anything
// else — missing evidence, a false rule, a rule error — is a reason to ask a person.
func Exception(a *policy.Action, output json.RawMessage, evidence []Evidence, input map[string]any) (auto bool, reason string) {
	byName := map[string]map[string]any{}
	for _, e := range evidence {
		if byName[e.Source] == nil {
			byName[e.Source] = map[string]any{}
		}
		byName[e.Source][e.Name] = e.Value
	}
	for _, src := range a.EvidenceSources {
		if byName[src] == nil {
			return false, "missing_evidence:" + src
		}
	}
	var out any
	if err := json.Unmarshal(output, &out); err != nil {
		return false, "rule_error"
	}
	ok, err := a.Rule.Eval(map[string]any{
		"action":     map[string]any{"type": a.Name},
		"output":     out,
		"validation": map[string]any{"ok": true},
		"evidence":   byName,
		"input":      input,
	})
	switch {
	case err != nil:
		return false, "rule_error"
	case !ok:
		return false, "rule_false"
	}
	return true, ""
}

// Sample puts an auto-approved effect on the post-hoc review list.
func (s *Service) Sample(ctx context.Context, q store.Queries, run store.Run, a *policy.Action, e store.Effect) (store.Approval, error) {
	_, hash, err := NewToken() // reviews are decided through the API: the token is never handed out
	if err != nil {
		return store.Approval{}, err
	}
	now, err := s.Read(ctx, q)
	if err != nil {
		return store.Approval{}, err
	}
	ap := store.Approval{ID: uuid.NewString(), RunKey: run.Key, TokenHash: hash, Mode: ModeReview,
		AllowedDecisions: []string{Confirm, Flag}, ExpiresAt: now.Add(reviewTTL), RequestedBy: "airlock",
		ApproverRoles: a.Approvers.Roles, ApproverSubjects: a.Approvers.Subjects, ActionType: e.ActionType,
		Target: e.Target, EffectID: e.EffectID, Executor: e.Executor, Payload: e.Payload, PayloadHash: e.PayloadHash,
		CreatedAt: s.AtOrZero()}
	return ap, q.ApprovalInsert(ctx, ap)
}

// Reviews lists the sampled auto-approvals waiting for review.
func (s *Service) Reviews(ctx context.Context) ([]store.Approval, error) {
	return s.Store.ApprovalsOpen(ctx, ModeReview, 500)
}

// Review records a person's verdict on a sampled auto-approval; a flag alerts.
func (s *Service) Review(ctx context.Context, id, decision, note string, who Person) (store.Approval, error) {
	a, err := s.Store.ApprovalByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && a.Mode != ModeReview) {
		return store.Approval{}, ErrNotFound
	}
	if err != nil {
		return store.Approval{}, err
	}
	if decision != Confirm && decision != Flag {
		return store.Approval{}, ErrDecisionNotAllowed
	}
	var out store.Approval
	err = s.Store.Transact(ctx, func(q store.Queries) error {
		if _, err := q.RunLockKeys(ctx, []string{a.RunKey}); err != nil { // runs first
			return err
		}
		var err error
		out, err = q.ApprovalConsume(ctx, store.ApprovalConsumeParams{TokenHash: a.TokenHash, Decision: decision,
			Subject: who.Subject, Reason: note, Now: s.At()})
		if errors.Is(err, store.ErrNoMatch) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: a.RunKey, Kind: store.EventAutoApprovalReviewed, Actor: who.Subject,
			Detail: map[string]any{"review_id": a.ID, "effect_id": a.EffectID, "decision": decision, "note": note}}); err != nil {
			return err
		}
		if decision != Flag {
			return nil
		}
		return runs.Alert(ctx, q, s.At(), runs.Raised{Key: a.RunKey, Kind: "auto_approval_flagged", Fields: map[string]any{"review_id": a.ID}})
	})
	if err != nil {
		return store.Approval{}, fmt.Errorf("review %s: %w", id, err)
	}
	if decision == Flag {
		s.Alerts.Wake()
	}
	return out, nil
}

// Notify posts the approval's card to the policy's webhook: the key, the action, the
// payload's log_fields only (never the full model output), the source record's link
// when the workflow gave one, and the link. It runs after the commit; a failure is
// logged (without the URL) and changes nothing.
func (s *Service) Notify(ctx context.Context, r Requested, log *slog.Logger) {
	hook := s.Policy.Notify.WebhookURL
	a := s.Policy.Action(r.Approval.ActionType)
	if r.Approval.UndecidableSince != nil && !r.Reissued {
		// Marked, with its event, in the transaction that opened it.
		s.Alerts.Wake()
	}
	if a == nil || (hook == "" && len(a.Notify) == 0) {
		return
	}
	c := s.card(ctx, r, a, log)
	s.notifyWebhooks(ctx, c, r.Approval, a, log)
	if hook == "" {
		return
	}
	var fields []string
	for _, f := range c.Fields {
		fields = append(fields, f[0]+": "+f[1])
	}
	text := fmt.Sprintf("Approval needed: %s for %s (expires %s)", r.Approval.ActionType, r.Approval.RunKey,
		r.Approval.ExpiresAt.UTC().Format(time.RFC3339))
	if len(c.Recipients) > 0 {
		text += "\nrecipients: " + strings.Join(c.Recipients, ", ")
	}
	if len(fields) > 0 {
		text += "\n" + strings.Join(fields, "\n")
	}
	if c.SourceURL != "" {
		text += "\nsource record: " + c.SourceURL
	}
	text += "\n" + r.URL
	body, _ := json.Marshal(map[string]string{"text": text})
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hook, bytes.NewReader(body))
	if err != nil {
		log.Warn("approval notification not sent", "key", r.Approval.RunKey, "reason", "bad webhook URL")
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Warn("approval notification not sent", "key", r.Approval.RunKey, "reason", "transport error")
		return
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		log.Warn("approval notification refused", "key", r.Approval.RunKey, "status", resp.StatusCode)
	}
}
