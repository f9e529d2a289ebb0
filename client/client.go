package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gowebpki/jcs"
)

// Client calls one airlock server. Its fields may be set directly; the zero HTTP uses
// http.DefaultClient. A Client is safe for concurrent use.
type Client struct {
	BaseURL string // e.g. "http://127.0.0.1:8080", without a trailing /v1
	APIKey  string // sent as Authorization: Bearer; needs the runs scope to act
	HTTP    *http.Client
	// Retries is how many times a request is sent again after a transport error (no
	// answer), a 5xx answer — 503 store_unavailable is airlock's database out for a
	// moment — or 409 request_in_progress, with growing pauses, each at least the
	// answer's Retry-After (at most 5 s). A mutating
	// request is retried with the same Idempotency-Key, so airlock answers a retry of a
	// request that already committed from its record instead of running it again. New
	// sets 2; the zero Client does not retry.
	Retries int
}

// New returns a client of the server at baseURL with a 30-second request timeout that
// retries a failed request twice.
func New(baseURL, apiKey string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), APIKey: apiKey, HTTP: &http.Client{Timeout: 30 * time.Second}, Retries: 2}
}

type idemKey struct{}

// WithIdempotencyKey makes the mutating call made with ctx send key as its
// Idempotency-Key instead of a fresh random one. Derive it from what identifies the step
// (the run key and the step's name), and a process that restarts and repeats the step
// gets the first answer back for 24 hours instead of running it again. One key per
// logical request: airlock refuses the same key with a different body
// (idempotency_key_reused).
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idemKey{}, key)
}

// idempotencyKey is the caller's key, or a new random one.
func idempotencyKey(ctx context.Context) string {
	if k, ok := ctx.Value(idemKey{}).(string); ok && k != "" {
		return k
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// APIError is an error answer from airlock: {"error": code, "message": …}.
type APIError struct {
	Status  int    // the HTTP status
	Code    string // stable, machine-readable: "lease_lost", "reconcile_first", …
	Message string // for people
	// Errors lists schema violations (invalid_ledger, invalid_input).
	Errors []SchemaError
	// Details are the error's particulars as a JSON object, when it has any
	// (effect_rejected: effect_id, approval_id, rejected_by, reason); see docs/errors.md.
	Details json.RawMessage
}

// SchemaError is one JSON Schema violation, located by a JSON pointer.
type SchemaError struct {
	Pointer string `json:"pointer"`
	Keyword string `json:"keyword"`
	Message string `json:"message"`
}

func (e *APIError) Error() string {
	return fmt.Sprintf("airlock: %d %s: %s", e.Status, e.Code, e.Message)
}

// IsCode reports whether err is (or wraps) an [*APIError] with this code.
func IsCode(err error, code string) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == code
}

// HashInput returns the lowercase hex SHA-256 of v's JSON encoding in canonical form
// (RFC 8785: sorted keys, no insignificant whitespace, normalised numbers) — the same
// hash airlock computes for a claim's payload, and the one to give [Client.Plan].
//
// The hash must be stable: airlock compares it on every plan of an effect id, and a
// different hash for the same id stops the run (input_mismatch). Hash only the input that
// defines the effect (the document's title and body, a message's recipient and text),
// never timestamps, random ids or anything recomputed differently after a restart.
func HashInput(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("hash input: %w", err)
	}
	canon, err := jcs.Transform(b)
	if err != nil {
		return "", fmt.Errorf("hash input: %w", err)
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}

// do sends one request and decodes a 2xx answer into out (when non-nil). It returns the
// status so callers can tell 200 from 201 or 202. A mutating request carries an
// Idempotency-Key, the same on each of its retries.
func (c *Client) do(ctx context.Context, method, path string, body, out any) (int, error) {
	var payload []byte
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, fmt.Errorf("airlock: encode %s %s: %w", method, path, err)
		}
		payload = b
	}
	idem := ""
	if method != http.MethodGet {
		idem = idempotencyKey(ctx)
	}
	for attempt := 0; ; attempt++ {
		status, retryAfter, err := c.once(ctx, method, path, idem, payload, body != nil, out)
		if status < 0 { // the request could not be built: nothing was sent
			return 0, err
		}
		if err == nil || attempt >= c.Retries || !retryable(status, err) || ctx.Err() != nil {
			return status, err
		}
		pause := time.Duration(200<<attempt) * time.Millisecond
		if retryAfter > 0 {
			pause = max(pause, retryAfter)
		}
		select {
		case <-ctx.Done():
			return status, err
		case <-time.After(min(pause, 5*time.Second)):
		}
	}
}

// retryable: no answer at all, an outage, or the same request still running.
func retryable(status int, err error) bool {
	var ae *APIError
	switch {
	case status == 0:
		return true
	case errors.As(err, &ae) && ae.Code == "request_in_progress":
		return true
	}
	return status == http.StatusInternalServerError || status == http.StatusBadGateway ||
		status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}

func (c *Client) once(ctx context.Context, method, path, idem string, payload []byte, hasBody bool, out any) (int, time.Duration, error) {
	var rd io.Reader
	if hasBody {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return -1, 0, fmt.Errorf("airlock: %w", err)
	}
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("airlock: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	var retryAfter time.Duration
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		retryAfter = time.Duration(s) * time.Second
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, 0, fmt.Errorf("airlock: %s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, retryAfter, decodeError(resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, 0, fmt.Errorf("airlock: %s %s: decode answer: %w", method, path, err)
		}
	}
	return resp.StatusCode, 0, nil
}

func decodeError(status int, raw []byte) error {
	var body struct {
		Code    string          `json:"error"`
		Message string          `json:"message"`
		Errors  []SchemaError   `json:"errors"`
		Details json.RawMessage `json:"details"`
	}
	if json.Unmarshal(raw, &body) == nil && body.Code != "" {
		return &APIError{Status: status, Code: body.Code, Message: body.Message, Errors: body.Errors, Details: body.Details}
	}
	// Not airlock's format (a proxy in between): keep a short, printable excerpt.
	msg := strings.TrimSpace(string(raw))
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	return &APIError{Status: status, Message: msg}
}

// runPath is /v1/runs/{key} plus more segments, each escaped.
func runPath(key string, more ...string) string {
	var b strings.Builder
	b.WriteString("/v1/runs/")
	b.WriteString(url.PathEscape(key))
	for _, m := range more {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(m))
	}
	return b.String()
}

// Meta describes who and what made a request; airlock records it in the run's events.
type Meta struct {
	WorkflowVersion  string `json:"workflow_version,omitempty"`
	TriggerSource    string `json:"trigger_source,omitempty"`
	Model            *Model `json:"model,omitempty"`
	ProviderCategory string `json:"provider_category,omitempty"`
	RequestedBy      string `json:"requested_by,omitempty"`
	// SourceURL links the source record (an http or https URL): the approval card shows
	// it as a link; anything else is refused with invalid_source_url.
	SourceURL string `json:"source_url,omitempty"`
}

// Model identifies the model that produced an output.
type Model struct {
	Provider string `json:"provider,omitempty"`
	Name     string `json:"name,omitempty"`
	Revision string `json:"revision,omitempty"`
}

// ClaimRequest is POST /v1/runs/claim. Give Payload (hashed by airlock) or PayloadHash.
type ClaimRequest struct {
	Key           string `json:"key"`
	Payload       any    `json:"payload,omitempty"`
	PayloadHash   string `json:"payload_hash,omitempty"`
	TriggerSource string `json:"trigger_source,omitempty"`
	LeaseSeconds  int    `json:"lease_seconds,omitempty"` // 0: the server's default
	Meta          *Meta  `json:"meta,omitempty"`
}

// Claim is the answer to a claim. With Claimed, LeaseOwner and Version are what every
// later call on the run needs; without it, State (and Result, once finished) tell what
// became of the run.
type Claim struct {
	Claimed        bool            `json:"claimed"`
	Reclaimed      bool            `json:"reclaimed"` // an expired or retryable run taken over
	Key            string          `json:"key"`
	State          string          `json:"state"`
	Version        int64           `json:"version"`
	PayloadHash    string          `json:"payload_hash"`
	LeaseOwner     string          `json:"lease_owner"`
	LeaseExpiresAt *time.Time      `json:"lease_expires_at"`
	Result         json.RawMessage `json:"result"`
}

// Run states.
const (
	StateProcessing      = "processing"
	StateCompleted       = "completed"
	StateFailedRetryable = "failed_retryable"
	StateFailedTerminal  = "failed_terminal"
	StateAwaitingHuman   = "awaiting_human"
	StateApproved        = "approved"
	StateRejected        = "rejected"
)

// Claim claims req.Key: 201 claimed, 200 not claimed (a duplicate, or a run that is
// finished, parked or held by a live lease). A different payload under the same key is
// an error with code payload_mismatch.
func (c *Client) Claim(ctx context.Context, req ClaimRequest) (Claim, error) {
	var out Claim
	_, err := c.do(ctx, http.MethodPost, "/v1/runs/claim", req, &out)
	return out, err
}

// HeartbeatRequest renews the lease of a run this process holds.
type HeartbeatRequest struct {
	LeaseOwner   string `json:"lease_owner"`
	Version      int64  `json:"version"`
	LeaseSeconds int    `json:"lease_seconds,omitempty"`
	Meta         *Meta  `json:"meta,omitempty"`
}

// Lease is a renewed lease. A heartbeat moves the lease, never the version.
type Lease struct {
	Key       string    `json:"key"`
	Version   int64     `json:"version"`
	ExpiresAt time.Time `json:"lease_expires_at"`
	StartedAt time.Time `json:"lease_started_at"`
}

// Heartbeat extends the lease. lease_lost means the lease expired or was taken over: the
// caller no longer owns the run and must stop acting on it.
func (c *Client) Heartbeat(ctx context.Context, key string, req HeartbeatRequest) (Lease, error) {
	var out Lease
	_, err := c.do(ctx, http.MethodPost, runPath(key, "heartbeat"), req, &out)
	return out, err
}

// Release ends the lease of a run this process holds, now (a clean exit): the run stays
// processing and the next claim takes it at once, instead of waiting for the lease to
// lapse.
func (c *Client) Release(ctx context.Context, key, leaseOwner string, version int64) error {
	body := map[string]any{"lease_owner": leaseOwner, "version": version, "release": true}
	_, err := c.do(ctx, http.MethodPost, runPath(key, "heartbeat"), body, nil)
	return err
}

// TransitionRequest moves a run: To is completed, failed_retryable or failed_terminal.
type TransitionRequest struct {
	LeaseOwner string `json:"lease_owner"`
	Version    int64  `json:"version"`
	To         string `json:"to"`
	Result     any    `json:"result,omitempty"` // stored with a terminal state, returned to later claims
	// Alert, a reason of at most 200 characters, is allowed only with To failed_terminal
	// (else 400 invalid_field) and raises the alert workflow_gave_up with that reason: a
	// client that gives up on a run tells a person. Empty: no alert.
	Alert string `json:"alert,omitempty"`
	Meta  *Meta  `json:"meta,omitempty"`
}

// Transition is a run's state after a transition.
type Transition struct {
	Key     string `json:"key"`
	State   string `json:"state"`
	Version int64  `json:"version"`
}

// Transition moves the run by compare-and-set on lease owner and version.
func (c *Client) Transition(ctx context.Context, key string, req TransitionRequest) (Transition, error) {
	var out Transition
	_, err := c.do(ctx, http.MethodPost, runPath(key, "transition"), req, &out)
	return out, err
}

// Run is GET /v1/runs/{key}: a read-only view that never shows the lease owner.
type Run struct {
	Key         string          `json:"key"`
	State       string          `json:"state"`
	Version     int64           `json:"version"`
	PayloadHash string          `json:"payload_hash"`
	Result      json.RawMessage `json:"result"`
	Lease       struct {
		Live      bool       `json:"live"`
		StartedAt *time.Time `json:"started_at"`
		ExpiresAt *time.Time `json:"expires_at"`
	} `json:"lease"`
	Duplicates int64       `json:"duplicates"`
	Reclaims   int64       `json:"reclaims"`
	Effects    []RunEffect `json:"effects"`
	ParkReason string      `json:"park_reason"`
	CreatedAt  time.Time   `json:"created_at"`
	UpdatedAt  time.Time   `json:"updated_at"`
}

// RunEffect is one of a run's effects as the outbox sees it.
type RunEffect struct {
	ID          string    `json:"id"` // addresses the effect under /v1/effects/{id}
	EffectID    string    `json:"effect_id"`
	ActionType  string    `json:"action_type"`
	Target      string    `json:"target"`
	Executor    string    `json:"executor"` // dispatcher, worker or agent
	State       string    `json:"state"`    // pending, sending, planned, completed, unknown, failed, cancelled
	PayloadHash string    `json:"payload_hash"`
	ProviderID  string    `json:"provider_id"`
	Attempts    int       `json:"attempts"`
	Version     int64     `json:"version"` // an operator's resolve sends it back (compare-and-set)
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// Run reads the run; a missing one is an error with code run_not_found.
func (c *Client) Run(ctx context.Context, key string) (Run, error) {
	var out Run
	_, err := c.do(ctx, http.MethodGet, runPath(key), nil, &out)
	return out, err
}

// QueueEffectRequest asks airlock's outbox to perform an effect (POST /v1/runs/{key}/effects).
// Agents that perform an effect themselves use [Client.Plan] and [Client.Confirm] instead.
type QueueEffectRequest struct {
	LeaseOwner string `json:"lease_owner"`
	Version    int64  `json:"version"`
	ActionType string `json:"action_type"`
	Target     string `json:"target"`
	Payload    any    `json:"payload,omitempty"`
	EffectID   string `json:"effect_id,omitempty"`
	Gate       string `json:"gate,omitempty"` // ask for a stricter gate than the policy's
	Meta       *Meta  `json:"meta,omitempty"`
}

// QueuedEffect is the answer to [Client.QueueEffect]: the effect (queued now, or already
// queued when Created is false), or, for a gated action type, the approval it waits for.
type QueuedEffect struct {
	Created   bool       `json:"created"`
	Version   int64      `json:"version"`
	Effect    *RunEffect `json:"effect"`
	CancelURL string     `json:"cancel_url"` // act_with_window only
	NotBefore *time.Time `json:"not_before"` // act_with_window only
	// Approval is set (and Effect nil) when the run now waits for a person (202).
	Approval *Approval `json:"-"`
	State    string    `json:"state"`
}

// Approval is a pending human decision. ApproveURL carries a single-use secret: hand it
// to the approvers, never log it.
type Approval struct {
	ID         string    `json:"approval_id"`
	ApproveURL string    `json:"approve_url"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// QueueEffect queues an effect under the run's lease.
func (c *Client) QueueEffect(ctx context.Context, key string, req QueueEffectRequest) (QueuedEffect, error) {
	var raw json.RawMessage
	status, err := c.do(ctx, http.MethodPost, runPath(key, "effects"), req, &raw)
	if err != nil {
		return QueuedEffect{}, err
	}
	var out QueuedEffect
	if err := json.Unmarshal(raw, &out); err != nil {
		return QueuedEffect{}, fmt.Errorf("airlock: decode effect: %w", err)
	}
	if status == http.StatusAccepted {
		var a Approval
		if err := json.Unmarshal(raw, &a); err != nil {
			return QueuedEffect{}, fmt.Errorf("airlock: decode approval: %w", err)
		}
		out.Approval = &a
	}
	return out, nil
}

// Event is one entry of a run's audit timeline.
type Event struct {
	ID      int64           `json:"id"`
	At      time.Time       `json:"at"`
	Kind    string          `json:"kind"` // claimed, ledger_saved, effect_planned, effect_confirmed, …
	Version int64           `json:"version"`
	Actor   string          `json:"actor"`
	Meta    json.RawMessage `json:"meta"`
	Detail  json.RawMessage `json:"detail"`
}

// Events returns the run's events after the event id after (0: from the first), oldest
// first, at most limit (0: the server's default of 100), and the after of the next page
// (0 when this was the last).
func (c *Client) Events(ctx context.Context, key string, after int64, limit int) ([]Event, int64, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := runPath(key, "events")
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out struct {
		Events    []Event `json:"events"`
		NextAfter int64   `json:"next_after"`
	}
	if _, err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, 0, err
	}
	return out.Events, out.NextAfter, nil
}

// PendingApproval is one row of GET /v1/approvals: a pending approval, who may decide it
// and where it stands; never its payload or its approve link's token.
type PendingApproval struct {
	ID               string   `json:"id"`
	Key              string   `json:"key"` // the run's key
	Mode             string   `json:"mode"`
	ActionType       string   `json:"action_type"`
	Target           string   `json:"target"`
	RequestedBy      string   `json:"requested_by"`
	ApproverRoles    []string `json:"approver_roles"`
	ApproverSubjects []string `json:"approver_subjects"`
	// EscalationRoles may decide too once EscalatedAt is set.
	EscalationRoles []string   `json:"escalation_roles"`
	EscalatedAt     *time.Time `json:"escalated_at"`
	WarnedAt        *time.Time `json:"warned_at"` // when the expiry warning went out
	// UndecidableSince is set while nobody known may decide the approval.
	UndecidableSince *time.Time `json:"undecidable_since"`
	CreatedAt        time.Time  `json:"created_at"`
	ExpiresAt        time.Time  `json:"expires_at"`
	ConsoleURL       string     `json:"console_url"` // the console's page of it, for signed-in people
}

// ApprovalsFilter selects a page of [Client.Approvals].
type ApprovalsFilter struct {
	Undecidable bool   // only the approvals nobody known can decide
	After       string // the previous page's next cursor ("": the first page)
	Limit       int    // 1 to 500; 0: the server's default of 50
}

// Approvals lists the pending approvals of every run, newest first (an operator key), one
// keyset page at a time, and the After of the next page ("" when this was the last).
func (c *Client) Approvals(ctx context.Context, f ApprovalsFilter) ([]PendingApproval, string, error) {
	q := url.Values{}
	if f.Undecidable {
		q.Set("undecidable", "true")
	}
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.After != "" {
		q.Set("after", f.After)
	}
	path := "/v1/approvals"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out struct {
		Approvals []PendingApproval `json:"approvals"`
		NextAfter string            `json:"next_after"`
	}
	if _, err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, "", err
	}
	return out.Approvals, out.NextAfter, nil
}
