package audit

import (
	"fmt"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/internal/store"
)

// Summary is one line that says what an event recorded, for a person reading the
// timeline. It uses only what events hold: hashes, ids, classes and log_fields, never a
// payload.
func Summary(se store.Event) string {
	e := decode(se)
	id := e.str("effect_id")
	at := func(k string) string {
		if t := e.time(k); t != nil {
			return stamp(*t)
		}
		return "?"
	}
	with := func(s, k, label string) string {
		if v := e.str(k); v != "" {
			return s + label + v
		}
		return s
	}
	switch e.Kind {
	case "claimed":
		s := "claimed; lease until " + at("lease_expires_at")
		return with(s, "replaces", "; replaces ")
	case "lease_reclaimed":
		return fmt.Sprintf("reclaimed after the lease lapsed (reclaim %s); lease until %s", e.str("reclaims"), at("lease_expires_at"))
	case "duplicate":
		return fmt.Sprintf("duplicate delivery refused: the run was %s (duplicate %s)", e.str("state"), e.str("duplicates"))
	case "payload_mismatch":
		return "refused: the same key with a different payload"
	case "heartbeat":
		return "lease extended to " + at("lease_expires_at")
	case "transition":
		return with(e.str("from")+" → "+e.str("to"), "reason", ": ")
	case "run_unparked":
		return fmt.Sprintf("unparked (was parked for %s): %s → %s; reason: %s", e.str("parked_for"), e.str("from"), e.str("to"), e.str("reason"))
	case "run_redriven":
		return fmt.Sprintf("re-driven: stalled since its lease lapsed at %s, %s → %s; reason: %s", at("lease_expired_at"), e.str("from"), e.str("to"), e.str("reason"))
	case "alert":
		// A workflow's own reason (workflow_gave_up: the node's Alert Reason, a client's
		// transition alert) is what tells a person why; it is text, escaped where shown.
		return with(with(with("alert: "+e.str("alert"), "effect_id", " on effect "), "error_class", ", "), "reason", "; reason: ")
	case "effect_queued":
		s := fmt.Sprintf("effect %s queued: %s → %s (%s)", id, e.str("action_type"), e.str("target"), e.str("executor"))
		if e.str("approval_id") != "" {
			s += " after its approval"
		}
		return s
	case "effect_claimed":
		return fmt.Sprintf("effect %s leased by an external worker (attempt %s)", id, e.str("attempts"))
	case "effect_completed":
		s := with(fmt.Sprintf("effect %s sent (attempt %s)", id, e.str("attempts")), "provider_id", "; provider id ")
		return with(s, "provider_id_note", ", ")
	case "effect_retry_scheduled":
		s := fmt.Sprintf("effect %s not sent (%s): retry in %sms", id, e.str("error_class"), e.str("retry_in_ms"))
		if e.detail["ambiguous"] == true {
			s += ", with the same idempotency key"
		}
		return s
	case "effect_failed":
		s := fmt.Sprintf("effect %s failed (%s) after %s attempt(s)", id, e.str("error_class"), e.str("attempts"))
		if e.has("retry_cap") {
			s += "; retry cap " + e.str("retry_cap") + " reached"
		}
		return s
	case "effect_unknown":
		return fmt.Sprintf("effect %s: outcome unknown (%s); never resent automatically", id, e.str("error_class"))
	case "effect_requeued":
		return with("effect "+id+" queued again", "reason", ": ")
	case "effect_resolved":
		s := fmt.Sprintf("effect %s resolved by an operator: %s (was %s)", id, e.str("outcome"), e.str("from"))
		return with(with(s, "provider_id", "; provider id "), "note", "; note: ")
	case "effect_reconciled":
		s := fmt.Sprintf("effect %s reconciled: %s found", id, e.str("found"))
		if st := e.str("status"); st != "" {
			s += " → " + st
		}
		s = with(s, "source", " by the ")
		return with(with(s, "provider_id", "; provider id "), "provider_id_note", ", ")
	case "effect_cancelled":
		return with("effect "+id+" cancelled", "reason", ": ")
	case "send_blocked":
		return with("effect "+id+" held by the kill switch", "reason", ": ")
	case "validation":
		s := e.str("action_type") + " output "
		switch {
		case e.detail["valid"] == true && e.detail["repaired"] == true:
			s += "valid after repair"
		case e.detail["valid"] == true:
			s += "valid"
		default:
			n := 0
			if errs, ok := e.detail["errors"].([]any); ok {
				n = len(errs)
			}
			s += fmt.Sprintf("invalid (%d error(s))", n)
		}
		return s + fmt.Sprintf("; repairs %s/%s", e.str("repairs"), e.str("max_repairs"))
	case "failure":
		s := fmt.Sprintf("failure %s (attempt %s): %s", e.str("class"), e.str("attempts"), e.str("decision"))
		if l := e.str("level"); l != "" {
			s += " (" + l + ")"
		}
		return with(s, "reason", ", ")
	case "retry_cap":
		return fmt.Sprintf("retry cap reached: %s after %s of %s attempts", e.str("class"), e.str("attempts"), e.str("max_attempts"))
	case "approval_requested":
		return fmt.Sprintf("approval requested (%s) for %s → %s by %s; expires %s", e.str("mode"), e.str("action_type"),
			e.str("target"), e.str("requested_by"), at("expires_at"))
	case "approval_decided":
		return with(fmt.Sprintf("%s by %s", e.str("decision"), e.str("approver")), "reason", ": ")
	case "auto_approved":
		return with(fmt.Sprintf("effect %s auto-approved by rule %q (policy version %s)", id, e.str("rule"), e.str("policy_version")),
			"review_id", "; sampled for review ")
	case "auto_approval_declined":
		return fmt.Sprintf("auto-approval declined (%s): a person decides", e.str("reason"))
	case "auto_approval_reviewed":
		return with(fmt.Sprintf("auto-approval of %s reviewed: %s", id, e.str("decision")), "note", "; note: ")
	case "approval_link_reissued":
		return fmt.Sprintf("a fresh %s link for effect %s (the old link no longer works); expires %s", e.str("mode"), id, at("expires_at"))
	case "approval_undecidable":
		return fmt.Sprintf("nobody known can decide approval %s: approvers %s %s hold no enabled account or recent sign-in (or only the requester does)",
			e.str("approval_id"), e.str("approver_roles"), e.str("approver_subjects"))
	case "approval_expiry_warning":
		return fmt.Sprintf("approval %s expires at %s unanswered: approvers warned", e.str("approval_id"), at("expires_at"))
	case "approval_escalated":
		return fmt.Sprintf("approval %s escalated: roles %s may also decide", e.str("approval_id"), e.str("roles"))
	case "cancel_window_closed":
		return "the cancel window of effect " + id + " closed unused"
	case "auto_approval_review_expired":
		return "the review of auto-approved effect " + id + " expired unreviewed"
	case "cancel_window_opened":
		return fmt.Sprintf("effect %s may be cancelled until %s", id, at("not_before"))
	case "ledger_saved":
		return with(fmt.Sprintf("ledger checkpoint %s saved", e.str("checkpoint_version")), "next_allowed_action", "; next: ")
	case "effect_planned":
		s := fmt.Sprintf("agent plans effect %s: %s → %s", id, e.str("action_type"), e.str("target"))
		if e.detail["again"] == true {
			s += " (again, after it was cleared)"
		}
		return s
	case "effect_confirmed":
		return with("agent confirmed effect "+id, "receipt", "; receipt ")
	case "tool_call":
		s := fmt.Sprintf("MCP tool %s (%s): %s", e.str("tool"), e.str("class"), e.str("decision"))
		if id != "" {
			s += ", effect " + id
		}
		return s
	case "input_mismatch":
		return "effect " + id + " planned again with another input: the run is parked for a person"
	case "replaced":
		return with("replaced by "+e.str("new_key"), "reason", ": ")
	case "usage":
		return fmt.Sprintf("usage: +%s model calls, +%s tokens (total %s calls, %s tokens)", e.str("model_calls"),
			e.str("tokens"), e.str("total_model_calls"), e.str("total_tokens"))
	}
	return generic(e.detail)
}

// Generic is the kinds Summary leaves to generic on purpose: their detail fields say it.
// Every other kind in store.EventKinds has its own case (a test holds the two to that).
var Generic = []store.EventKind{store.EventKillSwitch, store.EventEvidenceRecorded, store.EventSigninThrottled, store.EventUserChanged}

// generic lists an unfamiliar event's scalar detail fields, so a kind added later still
// says something.
func generic(d map[string]any) string {
	var parts []string
	for k, v := range d {
		switch v.(type) {
		case string, float64, bool:
			parts = append(parts, fmt.Sprintf("%s=%v", k, v))
		}
	}
	slices.Sort(parts)
	s := strings.Join(parts, " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}
