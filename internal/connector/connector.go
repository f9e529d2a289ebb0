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
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"
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
	// Note, on a Sent result, says that ProviderID is not exactly what the provider gave
	// (NoteProviderIDEscaped, NoteProviderIDTruncated, NoteProviderIDUnstorable); "" when
	// it is. The send happened either way: the effect completes, and its event carries
	// the note.
	Note string
}

// MaxProviderIDLen is the longest provider id kept as the provider gave it (bytes).
const MaxProviderIDLen = 256

// Notes on a provider id that had to be altered to be kept (Result.Note).
const (
	// NoteProviderIDEscaped: the id held bytes that are not UTF-8, or control or other
	// unprintable characters; it is kept Go-quoted (strconv.Quote: "a\x00b"), which
	// strconv.Unquote reverses.
	NoteProviderIDEscaped = "provider_id_escaped"
	// NoteProviderIDTruncated: the id (escaped if need be) was longer than
	// MaxProviderIDLen; it is kept as its beginning, "…sha256:" and the first 16 hex
	// digits of the SHA-256 of the id as given.
	NoteProviderIDTruncated = "provider_id_truncated"
	// NoteProviderIDUnstorable: the store refused even the safe form; the effect
	// completed without a provider id.
	NoteProviderIDUnstorable = "provider_id_unstorable"
	// NoteProviderIDUnread: the provider answered 2xx (performed) but its body could not
	// be read whole (the connection broke, the deadline passed) and held no id: the
	// effect completed without one, and a person can look it up by the effect id.
	NoteProviderIDUnread = "provider_id_unread"
)

// SafeProviderID returns id in a form every store keeps and every log and page shows as
// it is (valid UTF-8, printable, at most MaxProviderIDLen bytes), and the note saying how
// it was altered ("" when it is returned unchanged). Connectors apply it where a
// provider's answer enters airlock, and the outbox again before recording, for any
// connector that does not.
func SafeProviderID(id string) (string, string) {
	if len(id) <= MaxProviderIDLen && printable(id) {
		return id, ""
	}
	safe, note := id, ""
	if !printable(id) {
		safe, note = strconv.Quote(id), NoteProviderIDEscaped
	}
	if len(safe) > MaxProviderIDLen {
		sum := sha256.Sum256([]byte(id))
		suffix := "…sha256:" + hex.EncodeToString(sum[:8])
		cut := MaxProviderIDLen - len(suffix)
		for cut > 0 && !utf8.RuneStart(safe[cut]) {
			cut--
		}
		safe, note = safe[:cut]+suffix, NoteProviderIDTruncated
	}
	return safe, note
}

// printable reports valid UTF-8 of printable characters only (unicode.IsPrint: letters,
// marks, numbers, punctuation, symbols and the ASCII space).
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
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
