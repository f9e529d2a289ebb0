package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/fleet"
	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/slack"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/validation"
)

// Error is an API error with a stable machine-readable code.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"error"`
	Message string `json:"message"`
	// Errors lists schema violations (invalid_input).
	Errors []validation.Error `json:"errors,omitempty"`
	// Details are an error's particulars, for a client to read without parsing the
	// message (effect_rejected: effect_id, approval_id, rejected_by, reason).
	Details map[string]string `json:"details,omitempty"`
	// RetryAfter, when set, is sent as the Retry-After header (seconds).
	RetryAfter int `json:"-"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func apiError(status int, code, msg string) *Error {
	return &Error{Status: status, Code: code, Message: msg}
}

// errorTable maps domain sentinels to HTTP: the only place that does. Every code it (or
// an apiError call) answers is listed, with its status, in internal/errcodes, from which
// docs/errors.md, openapi.json's enum and the clients are generated
// (TestErrorCodesAreTheCatalog).
var errorTable = []struct {
	err    error
	status int
	code   string
}{
	{runs.ErrNotFound, http.StatusNotFound, "run_not_found"},
	{runs.ErrPayloadMismatch, http.StatusConflict, "payload_mismatch"},
	{runs.ErrLeaseLost, http.StatusConflict, "lease_lost"},
	{runs.ErrVersionConflict, http.StatusConflict, "version_conflict"},
	{runs.ErrLeaseLifetimeExceeded, http.StatusConflict, "lease_lifetime_exceeded"},
	{runs.ErrEffectsOpen, http.StatusConflict, "effects_open"},
	{runs.ErrInvalidTransition, http.StatusUnprocessableEntity, "invalid_transition"},
	{effects.ErrUnknownActionType, http.StatusUnprocessableEntity, "unknown_action_type"},
	{effects.ErrInvalidTarget, http.StatusUnprocessableEntity, "invalid_target"},
	{effects.ErrApprovalRequired, http.StatusConflict, "approval_required"},
	{effects.ErrEffectMismatch, http.StatusConflict, "effect_mismatch"},
	{effects.ErrActionsDisabled, http.StatusLocked, "actions_disabled"},
	{effects.ErrNotFound, http.StatusNotFound, "effect_not_found"},
	{effects.ErrEffectLeaseLost, http.StatusConflict, "lease_lost"},
	{effects.ErrNotResolvable, http.StatusConflict, "not_resolvable"},
	{effects.ErrEffectChanged, http.StatusConflict, "effect_changed"},
	{effects.ErrNotValidated, http.StatusUnprocessableEntity, "not_validated"},
	{effects.ErrUnsendablePayload, http.StatusUnprocessableEntity, "unsendable_payload"},
	{runs.ErrBudgetExhausted, http.StatusTooManyRequests, "budget_exhausted"},
	{failures.ErrNoSchema, http.StatusUnprocessableEntity, "no_schema"},
	{failures.ErrUnknownActionType, http.StatusUnprocessableEntity, "unknown_action_type"},
	{failures.ErrInvalidReplacement, http.StatusUnprocessableEntity, "invalid_replacement"},
	{failures.ErrNotFinished, http.StatusConflict, "not_finished"},
	{failures.ErrAlreadyReplaced, http.StatusConflict, "already_replaced"},
	{failures.ErrKeyInUse, http.StatusConflict, "key_in_use"},
	{failures.ErrNotParked, http.StatusConflict, "not_parked"},
	{approvals.ErrNotFound, http.StatusNotFound, "review_not_found"},
	{approvals.ErrDecisionNotAllowed, http.StatusUnprocessableEntity, "decision_not_allowed"},
	{approvals.ErrUnknownApproval, http.StatusNotFound, "approval_not_found"},
	{approvals.ErrNotPending, http.StatusConflict, "approval_not_pending"},
	{approvals.ErrNoLink, http.StatusConflict, "no_link"},
	{approvals.ErrConfusableIdentity, http.StatusUnprocessableEntity, "confusable_identity"},
	{policy.ErrGateTooWeak, http.StatusUnprocessableEntity, "gate_too_weak"},
	{ledger.ErrNotFound, http.StatusNotFound, "ledger_not_found"},
	{ledger.ErrInvariantsChanged, http.StatusConflict, "invariants_changed"},
	{ledger.ErrReconcileFirst, http.StatusConflict, "reconcile_first"},
	{ledger.ErrInputMismatch, http.StatusConflict, "input_mismatch"},
	{ledger.ErrNotPlanned, http.StatusConflict, "not_planned"},
	{ledger.ErrEffectRejected, http.StatusConflict, "effect_rejected"},
	{ledger.ErrNotSettled, http.StatusConflict, "not_settled"}, // with Retry-After: toAPIError
	{fleet.ErrLevelBehind, http.StatusServiceUnavailable, "writer_level_behind"},
	{slack.ErrNotConfigured, http.StatusNotFound, "slack_not_configured"},
	{slack.ErrSignature, http.StatusUnauthorized, "slack_signature_invalid"},
	{slack.ErrStale, http.StatusUnauthorized, "slack_request_stale"},
	{slack.ErrReplayed, http.StatusConflict, "slack_request_replayed"},
	{slack.ErrTeam, http.StatusForbidden, "slack_team_refused"},
	{apikeys.ErrInvalid, http.StatusUnauthorized, "unauthenticated"},
	{apikeys.ErrRevoked, http.StatusUnauthorized, "unauthenticated"},
}

// storeRetryAfter is the Retry-After of store_unavailable, in seconds: a PostgreSQL
// restart or failover takes a few, and clients that wait it do not pile onto a database
// that is coming back.
const storeRetryAfter = 2

// storeUnavailable is the answer to store.ErrUnavailable, whatever the route: the
// database cannot do the work now (a backend classified its driver's error). Its message
// is fixed: the cause names hosts, files or SQL and is only logged.
func storeUnavailable() *Error {
	return &Error{Status: http.StatusServiceUnavailable, Code: "store_unavailable", RetryAfter: storeRetryAfter,
		Message: "airlock cannot use its database just now; retry after Retry-After seconds with the same Idempotency-Key"}
}

// toAPIError classifies err. Unknown errors become 500 "internal" with a generic message:
// their text may name hosts or SQL and is only logged.
func toAPIError(err error) (*Error, bool) {
	var ae *Error
	if errors.As(err, &ae) {
		return ae, true
	}
	// An outage first: whatever the request was doing, it was not refused on its merits.
	if errors.Is(err, store.ErrUnavailable) {
		return storeUnavailable(), true
	}
	var ie *failures.InputError
	if errors.As(err, &ie) {
		e := apiError(http.StatusUnprocessableEntity, "invalid_input", ie.Error())
		e.Errors = ie.Errors
		return e, true
	}
	var ns *ledger.NotSettledError
	if errors.As(err, &ns) {
		e := apiError(http.StatusConflict, "not_settled", messageOf(err, ledger.ErrNotSettled))
		e.RetryAfter = max(1, int((ns.RetryAfter+time.Second-1)/time.Second))
		return e, true
	}
	var le *ledger.InvalidError
	if errors.As(err, &le) {
		e := apiError(http.StatusUnprocessableEntity, "invalid_ledger", le.Error())
		e.Errors = le.Errors
		return e, true
	}
	var rej *ledger.RejectedError
	if errors.As(err, &rej) {
		e := apiError(http.StatusConflict, "effect_rejected", messageOf(err, ledger.ErrEffectRejected))
		e.Details = map[string]string{"effect_id": rej.EffectID, "approval_id": rej.ApprovalID,
			"rejected_by": rej.RejectedBy, "reason": rej.Reason}
		return e, true
	}
	var fe *runs.FieldError
	if errors.As(err, &fe) {
		if fe.Missing {
			return apiError(http.StatusBadRequest, "missing_field", fe.Field+" is required"), true
		}
		return apiError(http.StatusBadRequest, "invalid_field", fe.Error()), true
	}
	for _, t := range errorTable {
		if errors.Is(err, t.err) {
			return apiError(t.status, t.code, messageOf(err, t.err)), true
		}
	}
	return apiError(http.StatusInternalServerError, "internal", "internal error; see the server log for the request id"), false
}

// messageOf keeps the domain's explanation but not the operation prefixes ("claim
// \"key\": ") that wrapping added: the client knows what it called.
func messageOf(err, sentinel error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, sentinel.Error()); i >= 0 {
		return msg[i:]
	}
	return sentinel.Error()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":"internal","message":"could not encode the response"}`)
	}
	writeJSONBytes(w, status, append(b, '\n'))
}

// The JSON answers' header values, shared by every answer instead of a new slice each
// (net/http's Header.Set allocates one per call). Capacity 1: an Add copies, never
// writes into them; nothing writes a header value in place.
var (
	headerJSON    = []string{"application/json"}[:1:1]
	headerNoStore = []string{"no-store"}[:1:1]
	headerNosniff = []string{"nosniff"}[:1:1]
)

// writeJSONBytes answers with b, a JSON document and its newline.
func writeJSONBytes(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h["Content-Type"] = headerJSON
	h["Cache-Control"] = headerNoStore
	h["X-Content-Type-Options"] = headerNosniff
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
