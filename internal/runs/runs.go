// Package runs is the run lifecycle: atomic claims under an idempotency key, leases,
// and compare-and-set transitions through one table of allowed moves. It holds the
// rules; the store holds the SQL; HTTP lives elsewhere.
package runs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/gowebpki/jcs"

	"github.com/airlockhq/airlock/internal/store"
)

// Domain outcomes. The HTTP layer maps each to one status and one stable code.
var (
	ErrNotFound              = errors.New("run not found")
	ErrPayloadMismatch       = errors.New("the key was claimed with a different payload")
	ErrLeaseLost             = errors.New("the lease is not held: it expired, was taken over, or was released")
	ErrVersionConflict       = errors.New("the run has moved on: version does not match")
	ErrInvalidTransition     = errors.New("transition not allowed")
	ErrLeaseLifetimeExceeded = errors.New("the lease reached its maximum total lifetime")
	ErrEffectsOpen           = errors.New("the run has effects that are open or failed")
)

// Actor says who may make a transition.
type Actor int

const (
	// Client: an API client holding the run's lease.
	Client Actor = iota
	// System: airlock's own gate, reconciliation and failure machinery.
	System
	// Operator: a person (an operator key, the CLI, the console) deciding a parked run.
	Operator
)

// transition is one allowed move.
type transition struct {
	From, To store.State
	By       Actor
}

// transitions is the one table of allowed moves. The gate, failure and ledger issues
// drive the System rows; clients only ever move a run out of processing.
var transitions = []transition{
	{store.StateProcessing, store.StateCompleted, Client},
	{store.StateProcessing, store.StateFailedRetryable, Client},
	{store.StateProcessing, store.StateFailedTerminal, Client},
	{store.StateProcessing, store.StateAwaitingHuman, System},        // gate opened, unknown_commit parked
	{store.StateAwaitingHuman, store.StateApproved, System},          // approval consumed
	{store.StateAwaitingHuman, store.StateRejected, System},          // a person said no
	{store.StateAwaitingHuman, store.StateProcessing, System},        // agent-executed effect approved
	{store.StateApproved, store.StateCompleted, System},              // its effects completed
	{store.StateApproved, store.StateFailedTerminal, System},         // its effects failed for good
	{store.StateProcessing, store.StateFailedTerminal, System},       // retry cap, budget, validation
	{store.StateFailedRetryable, store.StateFailedTerminal, System},  // retry cap reached between claims
	{store.StateAwaitingHuman, store.StateFailedTerminal, Operator},  // a parked run given up (unpark)
	{store.StateAwaitingHuman, store.StateFailedRetryable, Operator}, // a parked run a delivery may take again (unpark)
	{store.StateProcessing, store.StateFailedRetryable, Operator},    // a stalled run released for its redelivery (re-drive)
	{store.StateProcessing, store.StateFailedTerminal, Operator},     // a stalled run given up (re-drive)
}

// Allowed reports whether by may move a run from → to.
func Allowed(from, to store.State, by Actor) bool {
	for _, t := range transitions {
		if t.From == from && t.To == to && t.By == by {
			return true
		}
	}
	return false
}

// terminal states can carry a result.
func terminal(s store.State) bool {
	return s == store.StateCompleted || s == store.StateFailedTerminal || s == store.StateRejected
}

// ValidState reports whether s names a run state.
func ValidState(s store.State) bool {
	for _, v := range store.States {
		if v == s {
			return true
		}
	}
	return false
}

// Meta is the optional context a client attaches to any mutating call; it is recorded in
// the run's events.
type Meta struct {
	WorkflowVersion  string `json:"workflow_version,omitempty"`
	TriggerSource    string `json:"trigger_source,omitempty"`
	Model            *Model `json:"model,omitempty"`
	ProviderCategory string `json:"provider_category,omitempty"`
	RequestedBy      string `json:"requested_by,omitempty"`
	// SourceURL links the source record (an http or https URL, checked at the API): the
	// approval card shows it as a link.
	SourceURL string `json:"source_url,omitempty"`
}

// Model identifies the model that produced an output.
type Model struct {
	Provider string `json:"provider,omitempty"`
	Name     string `json:"name,omitempty"`
	Revision string `json:"revision,omitempty"`
}

// HashPayload is the payload hash airlock computes: SHA-256, hex, of the payload in the
// JSON Canonicalization Scheme (RFC 8785), so key order and whitespace do not matter.
func HashPayload(payload json.RawMessage) (string, error) {
	canon, err := jcs.Transform(payload)
	if err != nil {
		return "", fmt.Errorf("canonicalise payload: %w", err)
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}

// Config holds the lease rules.
type Config struct {
	DefaultLease      time.Duration
	MaxLease          time.Duration
	MaxLeaseLifetime  time.Duration
	ReclaimAlertAfter int64 // more reclaims of one key than this raise an alert
}

// Alerter raises an alert: the log line and the counter (metrics.Alerter). Only the
// alert relay (internal/alerts) calls it, once per committed alert event or more (a lost
// commit raises it again), with the event's id as the attribute event_id.
type Alerter interface {
	Alert(ctx context.Context, kind, key string, attrs ...slog.Attr)
}

// AlertWaker is what the services tell after a transaction that wrote an alert event
// has committed (the alert relay, internal/alerts): it raises the alert at once rather
// than at its next poll. A service never raises an alert itself: the event is the
// source, so no lost reply or crash after the commit silences one.
type AlertWaker interface {
	Wake()
}

// Service runs the lifecycle over a store.
type Service struct {
	Base
	cfg Config
	// Hook, when set, is called at named points between statements (complete_counted):
	// tests force interleavings with it. Never set in production.
	Hook func(point string)
}

func (s *Service) hook(point string) {
	if s.Hook != nil {
		s.Hook(point)
	}
}

// New builds the run lifecycle over b with the lease bounds cfg; a zero bound takes its
// default (AIRLOCK_LEASE_*: 5m, 1h, 24h; reclaim alert after 3).
func New(b Base, cfg Config) (*Service, error) {
	b, err := b.Fill()
	if err != nil {
		return nil, fmt.Errorf("runs: %w", err)
	}
	if cfg.DefaultLease == 0 {
		cfg.DefaultLease = 5 * time.Minute
	}
	if cfg.MaxLease == 0 {
		cfg.MaxLease = time.Hour
	}
	if cfg.MaxLeaseLifetime == 0 {
		cfg.MaxLeaseLifetime = 24 * time.Hour
	}
	if cfg.ReclaimAlertAfter == 0 {
		cfg.ReclaimAlertAfter = 3
	}
	switch {
	case cfg.DefaultLease < 0 || cfg.MaxLease < 0 || cfg.MaxLeaseLifetime < 0 || cfg.ReclaimAlertAfter < 0:
		return nil, fmt.Errorf("runs: Config's lease bounds must not be negative: %+v", cfg)
	case cfg.DefaultLease > cfg.MaxLease:
		return nil, fmt.Errorf("runs: Config.DefaultLease %s is longer than Config.MaxLease %s", cfg.DefaultLease, cfg.MaxLease)
	case cfg.MaxLease > cfg.MaxLeaseLifetime:
		return nil, fmt.Errorf("runs: Config.MaxLease %s is longer than Config.MaxLeaseLifetime %s", cfg.MaxLease, cfg.MaxLeaseLifetime)
	}
	return &Service{Base: b, cfg: cfg}, nil
}

func (s *Service) count(outcome string) { s.Observer.Claim(outcome) }

// ClaimRequest asks for the lease on Key.
type ClaimRequest struct {
	Key             string
	PayloadHash     string
	TriggerSource   string
	WorkflowVersion string
	Lease           time.Duration // 0 means the configured default
	Actor           string
	Meta            *Meta
}

// ClaimResult: Claimed with a fresh LeaseOwner, or not claimed with the run as it is.
type ClaimResult struct {
	Claimed   bool
	Reclaimed bool
	Run       store.Run
}

// Claim takes the key with one atomic statement; a refused claim is counted as a
// duplicate (same payload) or refused as ErrPayloadMismatch (another payload). The
// store writes each change with its events (store.ClaimSequence lists them): on
// PostgreSQL a claim that takes the run is one statement, one round trip.
func (s *Service) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	lease, err := s.leaseLength(req.Lease)
	if err != nil {
		return ClaimResult{}, err
	}
	if req.TriggerSource == "" && req.Meta != nil {
		req.TriggerSource = req.Meta.TriggerSource
	}
	if req.WorkflowVersion == "" && req.Meta != nil {
		req.WorkflowVersion = req.Meta.WorkflowVersion
	}
	var meta json.RawMessage
	if req.Meta != nil {
		if meta, err = json.Marshal(req.Meta); err != nil {
			return ClaimResult{}, err
		}
	}
	out, err := s.Store.Claim(ctx, store.ClaimParams{
		RunClaimParams: store.RunClaimParams{
			Key: req.Key, PayloadHash: req.PayloadHash, Owner: uuid.NewString(), Lease: lease,
			TriggerSource: req.TriggerSource, WorkflowVersion: req.WorkflowVersion, Now: s.At(),
		},
		Actor: req.Actor, Meta: meta, AlertAfter: s.cfg.ReclaimAlertAfter,
		Refusing: func() { s.hook("claim_refusing") },
	})
	if err != nil {
		return ClaimResult{}, fmt.Errorf("claim %q: %w", req.Key, err)
	}
	res := ClaimResult{Claimed: out.Claimed, Reclaimed: out.Reclaimed(), Run: out.Run}
	switch {
	case out.Mismatch:
		// Recorded and committed; the run itself did not change. A person hears of it
		// (alert payload_mismatch): the source sent the business event edited, and no
		// delivery of this key will act on the new version; they decide (replace the run,
		// answer by hand, or nothing).
		s.count("payload_mismatch")
		err := s.Store.Transact(ctx, func(q store.Queries) error {
			return Alert(ctx, q, s.At(), Raised{Key: req.Key, Version: out.Run.Version, Kind: "payload_mismatch",
				Fields: map[string]any{"payload_hash": req.PayloadHash, "state": string(out.Run.State)}})
		})
		if err != nil {
			return ClaimResult{}, fmt.Errorf("claim %q: alert the payload mismatch: %w", req.Key, err)
		}
		s.Alerts.Wake()
		return res, fmt.Errorf("claim %q: %w", req.Key, ErrPayloadMismatch)
	case res.Reclaimed:
		s.count("reclaimed")
	case res.Claimed:
		s.count("claimed")
	default:
		s.count("duplicate")
	}
	if out.Alerted {
		s.Alerts.Wake()
	}
	return res, nil
}

// MaxLease is the longest lease a client may ask for (AIRLOCK_LEASE_MAX), a run's or an
// external worker's.
func (s *Service) MaxLease() time.Duration { return s.cfg.MaxLease }

func (s *Service) leaseLength(d time.Duration) (time.Duration, error) {
	if d == 0 {
		return s.cfg.DefaultLease, nil
	}
	if d < time.Second || d > s.cfg.MaxLease {
		return 0, &FieldError{Field: "lease_seconds", Msg: fmt.Sprintf("must be between 1 and %d seconds", int(s.cfg.MaxLease.Seconds()))}
	}
	return d, nil
}

// FieldError is a request that names a field with a bad value, or (Missing) none.
type FieldError struct {
	Field, Msg string
	Missing    bool
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// LeaseRequest identifies a lease holder's view of the run.
type LeaseRequest struct {
	Key     string
	Owner   string
	Version int64
	Actor   string
	Meta    *Meta
}

// Release ends the owner's live lease now, as a process that stops cleanly does: the run
// stays processing, and the next claim takes it at once instead of waiting for the lease
// to lapse. The version does not change; the event is a heartbeat with released: true.
func (s *Service) Release(ctx context.Context, req LeaseRequest) (store.Run, error) {
	var run store.Run
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		now := s.At()
		var err error
		run, err = q.RunHeartbeat(ctx, store.RunHeartbeatParams{Key: req.Key, Owner: req.Owner,
			Version: req.Version, Lease: 0, Lifetime: s.cfg.MaxLeaseLifetime, Now: now})
		if errors.Is(err, store.ErrNoMatch) {
			return Diagnose(ctx, q, s.Now, s.cfg.MaxLeaseLifetime, req)
		}
		if err != nil {
			return err
		}
		return Event(ctx, q, now, Entry{Key: run.Key, Kind: store.EventHeartbeat, Version: run.Version, Actor: req.Actor, Meta: req.Meta,
			Detail: map[string]any{"lease_expires_at": run.LeaseExpiresAt, "released": true}})
	})
	if err != nil {
		return store.Run{}, fmt.Errorf("release %q: %w", req.Key, err)
	}
	return run, nil
}

// Heartbeat moves the owner's live lease forward; the version does not change.
func (s *Service) Heartbeat(ctx context.Context, req LeaseRequest, lease time.Duration) (store.Run, error) {
	lease, err := s.leaseLength(lease)
	if err != nil {
		return store.Run{}, err
	}
	var run store.Run
	var exhausted string
	err = s.Store.Transact(ctx, func(q store.Queries) error {
		exhausted = "" // Transact may run this again
		now := s.At()
		held, err := q.RunLock(ctx, store.RunLockParams{Key: req.Key, Owner: req.Owner, Version: req.Version, Now: now})
		if errors.Is(err, store.ErrNoMatch) {
			return Diagnose(ctx, q, s.Now, s.cfg.MaxLeaseLifetime, req)
		}
		if err != nil {
			return err
		}
		if run, exhausted, err = s.OverBudget(ctx, q, now, held, ""); exhausted != "" || err != nil {
			return err
		}

		run, err = q.RunHeartbeat(ctx, store.RunHeartbeatParams{Key: req.Key, Owner: req.Owner,
			Version: req.Version, Lease: lease, Lifetime: s.cfg.MaxLeaseLifetime, Now: now})
		if errors.Is(err, store.ErrNoMatch) {
			return Diagnose(ctx, q, s.Now, s.cfg.MaxLeaseLifetime, req)
		}
		if err != nil {
			return err
		}
		return Event(ctx, q, now, Entry{Key: run.Key, Kind: store.EventHeartbeat, Version: run.Version, Actor: req.Actor, Meta: req.Meta,
			Detail: map[string]any{"lease_expires_at": run.LeaseExpiresAt}})
	})
	if err != nil {
		return store.Run{}, fmt.Errorf("heartbeat %q: %w", req.Key, err)
	}
	if exhausted != "" {
		s.Alerts.Wake()
		return run, fmt.Errorf("heartbeat %q: %w (%s)", req.Key, ErrBudgetExhausted, exhausted)
	}
	return run, nil
}

// TransitionRequest moves a run by compare-and-set.
type TransitionRequest struct {
	LeaseRequest
	To     store.State
	Result json.RawMessage
	// Alert, with To failed_terminal, raises an alert (kind workflow_gave_up) with this
	// reason: a client that gives up on a run says so to a person, not only in the run's
	// result.
	Alert string
}

// Transition is a client's move of a run it holds the lease on.
func (s *Service) Transition(ctx context.Context, req TransitionRequest) (store.Run, error) {
	if !ValidState(req.To) {
		return store.Run{}, fmt.Errorf("%w: %q is not a run state", ErrInvalidTransition, req.To)
	}
	if !Allowed(store.StateProcessing, req.To, Client) {
		return store.Run{}, fmt.Errorf("%w: clients may move a run only from processing to completed, failed_retryable or failed_terminal; %s is airlock's own", ErrInvalidTransition, req.To)
	}
	if req.Result != nil && !terminal(req.To) {
		return store.Run{}, &FieldError{Field: "result", Msg: "only a terminal state (completed, failed_terminal) stores a result"}
	}
	if req.Alert != "" && req.To != store.StateFailedTerminal {
		return store.Run{}, &FieldError{Field: "alert", Msg: "only a move to failed_terminal raises an alert"}
	}
	var run store.Run
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		// The run's lock first: an effect queued (or planned) under the same lease waits
		// for this decision instead of slipping in after the count.
		if _, err := q.RunLockKeys(ctx, []string{req.Key}); err != nil {
			return err
		}
		if req.To == store.StateCompleted {
			n, err := q.RunOpenEffects(ctx, req.Key)
			if err != nil {
				return err
			}
			s.hook("complete_counted")
			if n > 0 {
				return fmt.Errorf("%w: %d effect(s) not completed", ErrEffectsOpen, n)
			}
		}
		now := s.At()
		var err error
		run, err = q.RunTransition(ctx, store.RunTransitionParams{Key: req.Key, Owner: req.Owner,
			Version: req.Version, From: store.StateProcessing, To: req.To, Result: req.Result, Now: now})
		if errors.Is(err, store.ErrNoMatch) {
			return Diagnose(ctx, q, s.Now, s.cfg.MaxLeaseLifetime, req.LeaseRequest)
		}
		if err != nil {
			return err
		}
		detail := map[string]any{"from": store.StateProcessing, "to": req.To}
		if req.Result != nil {
			detail["result_hash"] = hashBytes(req.Result)
		}
		if err := Event(ctx, q, now, Entry{Key: run.Key, Kind: store.EventTransition, Version: run.Version, Actor: req.Actor, Meta: req.Meta,
			Detail: detail}); err != nil {
			return err
		}
		if req.To != store.StateFailedTerminal {
			return nil
		}
		if err := CancelPending(ctx, q, now, run.Key); err != nil {
			return err
		}
		if req.Alert == "" {
			return nil
		}
		return Alert(ctx, q, now, Raised{Key: run.Key, Version: run.Version, Kind: "workflow_gave_up", Fields: map[string]any{"reason": req.Alert}})
	})
	if err != nil {
		return store.Run{}, fmt.Errorf("transition %q: %w", req.Key, err)
	}
	if req.Alert != "" {
		s.Alerts.Wake()
	}
	return run, nil
}

// Diagnose explains why a compare-and-set on a processing run's lease matched nothing. It
// only reads: the decision was the statement's. now overrides the backend clock (tests);
// lifetime 0 skips the lifetime check.
func Diagnose(ctx context.Context, q store.Queries, now func() time.Time, lifetime time.Duration, req LeaseRequest) error {
	run, err := q.RunGet(ctx, req.Key)
	if errors.Is(err, store.ErrNotFound) {
		return ErrNotFound
	}
	if err != nil {
		return err
	}
	t, err := q.Clock(ctx)
	if err != nil {
		return err
	}
	if now != nil {
		t = now()
	}
	switch {
	case run.LeaseOwner != req.Owner:
		return ErrLeaseLost
	case run.Version != req.Version:
		return fmt.Errorf("%w: the run is at version %d", ErrVersionConflict, run.Version)
	case run.State != store.StateProcessing:
		return fmt.Errorf("%w: the run is %s", ErrLeaseLost, run.State)
	case !run.LeaseLive(t):
		return fmt.Errorf("%w: it expired at %s", ErrLeaseLost, run.LeaseExpiresAt.UTC().Format(time.RFC3339))
	case lifetime > 0 && run.LeaseStartedAt != nil && !run.LeaseExpiresAt.Before(run.LeaseStartedAt.Add(lifetime)):
		return fmt.Errorf("%w: held since %s, it cannot be renewed past %s; finish, or let it lapse and claim again",
			ErrLeaseLifetimeExceeded, run.LeaseStartedAt.UTC().Format(time.RFC3339), run.LeaseExpiresAt.UTC().Format(time.RFC3339))
	}
	return fmt.Errorf("compare-and-set on %q matched nothing in a state that should match", req.Key)
}

// Get returns the run.
func (s *Service) Get(ctx context.Context, key string) (store.Run, error) {
	run, err := s.Store.RunGet(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return store.Run{}, ErrNotFound
	}
	return run, err
}

// Events returns the run's timeline after an event id.
func (s *Service) Events(ctx context.Context, key string, after int64, limit int) ([]store.Event, error) {
	if _, err := s.Get(ctx, key); err != nil {
		return nil, err
	}
	return s.Store.EventList(ctx, key, after, limit)
}

// Entry is one event on run Key's timeline: its kind, the run's version it records (0:
// none), who acted, the request's meta and the kind's detail.
type Entry struct {
	Key     string
	Kind    store.EventKind
	Version int64
	Actor   string
	Meta    *Meta
	Detail  map[string]any
}

// Event writes one event on a run's timeline; call it inside the transaction that made
// the change it records.
func Event(ctx context.Context, q store.Queries, now *time.Time, e Entry) error {
	key, kind, version, actor, meta, detail := e.Key, e.Kind, e.Version, e.Actor, e.Meta, e.Detail
	var metaJSON, detailJSON json.RawMessage
	var err error
	if meta != nil {
		if metaJSON, err = json.Marshal(meta); err != nil {
			return err
		}
	}
	if detail != nil {
		if detailJSON, err = json.Marshal(detail); err != nil {
			return err
		}
	}
	_, err = q.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: string(kind), Version: version,
		Actor: actor, Meta: metaJSON, Detail: detailJSON, Now: now})
	return err
}

func hashBytes(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ErrBudgetExhausted: the run spent its model-call, token or time budget and has been
// moved to failed_terminal.
var ErrBudgetExhausted = errors.New("the run's budget is exhausted; it is now failed_terminal")

// Budget bounds one run; zero fields are unlimited.
type Budget struct {
	MaxModelCalls int
	MaxTokens     int64
	RunDeadline   time.Duration
}

// BudgetExceeded names what the run has spent past its budget at now, or "". Validations
// count as model calls airlock has seen, even when the client reports fewer.
func BudgetExceeded(run store.Run, b Budget, now time.Time) string {
	switch {
	case b.MaxModelCalls > 0 && max(run.ModelCalls, run.Validations) > b.MaxModelCalls:
		return "model_calls"
	case b.MaxTokens > 0 && run.Tokens > b.MaxTokens:
		return "tokens"
	case b.RunDeadline > 0 && !now.Before(run.CreatedAt.Add(b.RunDeadline)):
		return "deadline"
	}
	return ""
}

// Ending is why airlock ends a run: its Reason, the transition event's other Detail, and,
// when Alert is not nil, an alert of kind Reason with Alert as its fields (the alert's
// log fields).
type Ending struct {
	Reason string
	Alert  map[string]any
	Detail map[string]any
}

// Terminate moves a run its caller holds the lease on to failed_terminal as airlock's
// own decision (retry cap, budget, validation, a terminal failure class), with an event,
// and an alert event when end.Alert is not nil. Call it inside the transaction; wake the
// alert relay after the commit.
func Terminate(ctx context.Context, q store.Queries, now *time.Time, run store.Run, end Ending) (store.Run, error) {
	reason, alert, detail := end.Reason, end.Alert, end.Detail
	out, err := q.RunTransition(ctx, store.RunTransitionParams{Key: run.Key, Owner: run.LeaseOwner, Version: run.Version,
		From: store.StateProcessing, To: store.StateFailedTerminal, Now: now})
	if err != nil {
		return store.Run{}, fmt.Errorf("terminate run: %w", err)
	}
	if detail == nil {
		detail = map[string]any{}
	}
	detail["from"], detail["to"], detail["reason"] = store.StateProcessing, store.StateFailedTerminal, reason
	if err := Event(ctx, q, now, Entry{Key: run.Key, Kind: store.EventTransition, Version: out.Version, Actor: "airlock", Detail: detail}); err != nil {
		return store.Run{}, err
	}
	if err := CancelPending(ctx, q, now, run.Key); err != nil {
		return store.Run{}, err
	}
	if alert == nil {
		return out, nil
	}
	return out, Alert(ctx, q, now, Raised{Key: run.Key, Version: out.Version, Kind: reason, Fields: alert})
}

// Raised is one alert: its Kind on run Key (at Version, 0: none) and Fields, which
// become the alert's log fields when the relay raises it.
type Raised struct {
	Key     string
	Version int64
	Kind    string
	Fields  map[string]any
}

// Alert writes an alert event on a.Key: detail {"alert": Kind} and Fields. Call it inside the transaction
// of the change that raised it; wake the alert relay after the commit.
func Alert(ctx context.Context, q store.Queries, now *time.Time, a Raised) error {
	key, version, kind, fields := a.Key, a.Version, a.Kind, a.Fields
	detail := make(map[string]any, len(fields)+1)
	for k, v := range fields {
		detail[k] = v
	}
	detail["alert"] = kind
	return Event(ctx, q, now, Entry{Key: key, Kind: store.EventAlert, Version: version, Actor: "airlock", Detail: detail})
}

// CancelPending withdraws the pending effects of a run that ended failed_terminal, each
// with an event: nothing leaves without someone standing behind it, and nobody stands
// behind a failed run. Effects already being sent are past recall: the begin-mark
// refuses those not yet begun (they are cancelled there). A replacement run is the way
// to send them after all.
func CancelPending(ctx context.Context, q store.Queries, now *time.Time, key string) error {
	cancelled, err := q.EffectCancelPending(ctx, key, "run_failed_terminal", now)
	if err != nil {
		return fmt.Errorf("cancel pending effects: %w", err)
	}
	for _, e := range cancelled {
		if err := Event(ctx, q, now, Entry{Key: key, Kind: store.EventEffectCancelled, Actor: "airlock",
			Detail: map[string]any{"effect_id": e.EffectID, "reason": "run_failed_terminal"}}); err != nil {
			return err
		}
	}
	return nil
}

// RerunProtocol is how a run is ever run again, shown wherever a person may be tempted to
// improvise one (the approval page, the replace command).
const RerunProtocol = `Rerun protocol:
1. Recovery retries reclaim only failed_retryable runs or processing runs whose lease expired, under the same key.
2. Terminal, parked or completed keys (failed_terminal, rejected, awaiting_human, approved, completed) only report their state; they are never started again.
3. A correction is a replacement: a new key issued upstream, linked to the original and its external results, with the operator and reason recorded, through the normal approval and outbox path. No ad-hoc key suffixes, no in-place rewrite.`

// stallBatch bounds the stalled runs one SweepStalled round lists.
const stallBatch = 100

// SweepStalled raises one run_stalled alert for each run stalled since the last sweep:
// processing, its lease lapsed, and nothing has taken it since (its caller died
// mid-run). Each run is marked and alerted in its own transaction, the mark re-checking
// in its statement that the run is still stalled at the version listed and not marked:
// a stall is alerted once whichever instance sweeps, and a reclaim (a new version) that
// stalls again is alerted again. Nothing else changes: the next delivery of the key
// still reclaims the run, and an operator may re-drive it from the console.
func (s *Service) SweepStalled(ctx context.Context) error {
	for range 10 { // up to 1,000 a round; the next round takes the rest
		stalled, err := s.Store.RunsStalledUnmarked(ctx, s.At(), stallBatch)
		if err != nil {
			return fmt.Errorf("list stalled runs: %w", err)
		}
		alerted := 0
		for _, r := range stalled {
			err := s.Store.Transact(ctx, func(q store.Queries) error {
				marked, err := q.RunStallMark(ctx, r.Key, r.Version, s.At())
				if err != nil || !marked {
					return err
				}
				alerted++
				// Never the lease owner: it is the holder's credential on the run.
				fields := map[string]any{"run_version": r.Version}
				if r.LeaseExpiresAt != nil {
					fields["lease_expired_at"] = r.LeaseExpiresAt.UTC()
				}
				return Alert(ctx, q, s.At(), Raised{Key: r.Key, Kind: "run_stalled", Fields: fields})
			})
			if err != nil {
				return fmt.Errorf("alert the stall of %q: %w", r.Key, err)
			}
		}
		if alerted > 0 {
			s.Alerts.Wake()
		}
		if len(stalled) < stallBatch {
			return nil
		}
	}
	return nil
}
