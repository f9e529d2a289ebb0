// Package connector is the boundary where an effect leaves airlock. A connector sends
// one effect and classifies what happened into an Outcome the dispatcher can act on
// safely; the concrete connectors live in sub-packages (httpconn, smtpconn).
//
// The classification is the whole point: a send that definitely did not happen may be
// retried; one that may have happened is Ambiguous and is never resent automatically
// unless the connector proves provider-side idempotency.
package connector

import (
	"context"
	"encoding/json"
	"time"
)

// Request is one effect to send.
type Request struct {
	// EffectID is the provider idempotency key: stable across attempts and unique across
	// runs (airlock passes "<run key>/<effect id>"; keys cannot hold a slash). Connectors
	// send it as the HTTP Idempotency-Key header, derive the SMTP Message-ID from it, and
	// search for it in lookups.
	EffectID   string
	RunKey     string
	ActionType string
	// Target names one of the targets configured for the action type; it is never a URL
	// or address supplied by a client.
	Target  string
	Payload json.RawMessage
}

// Outcome is what a send attempt established.
type Outcome int

const (
	// Sent: the provider accepted the effect. Result.ProviderID holds its id, if any.
	Sent Outcome = iota + 1
	// Retryable: definitely not performed (refused before a byte was sent, 429, 503, a
	// temporary SMTP reply before DATA); it may be tried again after RetryAfter.
	Retryable
	// Refused: definitely not performed, and trying again will not help (4xx, a permanent
	// SMTP reply).
	Refused
	// Ambiguous: the request may have been performed (timeout or transport error after the
	// request was written, 5xx other than 503, no final reply to DATA).
	Ambiguous
)

func (o Outcome) String() string {
	switch o {
	case Sent:
		return "sent"
	case Retryable:
		return "retryable"
	case Refused:
		return "refused"
	case Ambiguous:
		return "ambiguous"
	}
	return "invalid"
}

// Result is a classified attempt.
type Result struct {
	Outcome    Outcome
	ProviderID string
	// RetryAfter is the provider's Retry-After, when it gave one (Retryable only).
	RetryAfter time.Duration
	// Class is a short, fixed error class for events and metrics, e.g. "timeout",
	// "connection_refused", "dns", "tls", "http_503", "smtp_550". It never holds host
	// names, URLs, credentials or response bodies.
	Class string
}

// Connector sends effects of the action types configured to use it.
type Connector interface {
	Send(ctx context.Context, req Request) Result
	// Idempotent reports whether the provider is configured as honouring the idempotency
	// key, so an Ambiguous send may be repeated with the same EffectID.
	Idempotent() bool
}

// Lookup is implemented by connectors that can search the provider for an effect by its
// idempotency key (reconciliation of Ambiguous sends).
type Lookup interface {
	// Lookup returns the provider ids found for req.EffectID: none, one, or several.
	Lookup(ctx context.Context, req Request) ([]string, error)
	// Authoritative reports whether "none found" proves the effect was not performed.
	Authoritative() bool
}
