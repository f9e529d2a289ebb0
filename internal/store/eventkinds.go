package store

import (
	"slices"
	"strings"
)

// EventKind names what an event records. The values are stored in every database and read
// by clients, docs and the audit: they never change. Every kind written is one of these
// constants; the audit's summary covers each (a test holds it to that).
type EventKind string

// The kinds, grouped by what writes them.
const (
	// The claim (ClaimSequence and the backends' single-statement claims, whose SQL spells
	// the same four strings).
	EventClaimed         EventKind = "claimed"
	EventLeaseReclaimed  EventKind = "lease_reclaimed"
	EventDuplicate       EventKind = "duplicate"
	EventPayloadMismatch EventKind = "payload_mismatch"

	// Runs.
	EventHeartbeat   EventKind = "heartbeat"
	EventTransition  EventKind = "transition"
	EventAlert       EventKind = "alert"
	EventRunUnparked EventKind = "run_unparked"
	EventRunRedriven EventKind = "run_redriven"
	EventReplaced    EventKind = "replaced"
	EventValidation  EventKind = "validation"
	EventFailure     EventKind = "failure"
	EventRetryCap    EventKind = "retry_cap"
	EventUsage       EventKind = "usage"

	// Effects.
	EventEffectQueued         EventKind = "effect_queued"
	EventEffectClaimed        EventKind = "effect_claimed"
	EventEffectCompleted      EventKind = "effect_completed"
	EventEffectRetryScheduled EventKind = "effect_retry_scheduled"
	EventEffectFailed         EventKind = "effect_failed"
	EventEffectUnknown        EventKind = "effect_unknown"
	EventEffectRequeued       EventKind = "effect_requeued"
	EventEffectResolved       EventKind = "effect_resolved"
	EventEffectReconciled     EventKind = "effect_reconciled"
	EventEffectCancelled      EventKind = "effect_cancelled"
	EventSendBlocked          EventKind = "send_blocked"
	EventKillSwitch           EventKind = "kill_switch"

	// Approvals.
	EventApprovalRequested         EventKind = "approval_requested"
	EventApprovalDecided           EventKind = "approval_decided"
	EventApprovalLinkReissued      EventKind = "approval_link_reissued"
	EventAutoApproved              EventKind = "auto_approved"
	EventAutoApprovalDeclined      EventKind = "auto_approval_declined"
	EventAutoApprovalReviewed      EventKind = "auto_approval_reviewed"
	EventAutoApprovalReviewExpired EventKind = "auto_approval_review_expired"
	EventCancelWindowOpened        EventKind = "cancel_window_opened"
	EventCancelWindowClosed        EventKind = "cancel_window_closed"
	EventEvidenceRecorded          EventKind = "evidence_recorded"
	EventApprovalUndecidable       EventKind = "approval_undecidable"
	EventApprovalExpiryWarning     EventKind = "approval_expiry_warning"
	EventApprovalEscalated         EventKind = "approval_escalated"

	// The agent ledger and the MCP gateway.
	EventLedgerSaved     EventKind = "ledger_saved"
	EventEffectPlanned   EventKind = "effect_planned"
	EventEffectConfirmed EventKind = "effect_confirmed"
	EventInputMismatch   EventKind = "input_mismatch"
	EventToolCall        EventKind = "tool_call"

	// Console accounts (on the system key).
	EventSigninThrottled EventKind = "signin_throttled"
	EventUserChanged     EventKind = "user_changed"
)

// EventKinds is every kind airlock writes.
var EventKinds = []EventKind{
	EventClaimed, EventLeaseReclaimed, EventDuplicate, EventPayloadMismatch,
	EventHeartbeat, EventTransition, EventAlert, EventRunUnparked, EventRunRedriven, EventReplaced, EventValidation,
	EventFailure, EventRetryCap, EventUsage,
	EventEffectQueued, EventEffectClaimed, EventEffectCompleted, EventEffectRetryScheduled, EventEffectFailed,
	EventEffectUnknown, EventEffectRequeued, EventEffectResolved, EventEffectReconciled, EventEffectCancelled,
	EventSendBlocked, EventKillSwitch,
	EventApprovalRequested, EventApprovalDecided, EventApprovalLinkReissued, EventAutoApproved,
	EventAutoApprovalDeclined, EventAutoApprovalReviewed, EventAutoApprovalReviewExpired,
	EventCancelWindowOpened, EventCancelWindowClosed, EventEvidenceRecorded,
	EventApprovalUndecidable, EventApprovalExpiryWarning, EventApprovalEscalated,
	EventLedgerSaved, EventEffectPlanned, EventEffectConfirmed, EventInputMismatch, EventToolCall,
	EventSigninThrottled, EventUserChanged,
}

// ReportKinds are the kinds whose events the report reads one by one (its details and its
// gate waits). The index the report reads them from, events_report_kind_at (migration
// 0023), holds only these, so the lifecycle's events — a claim's, an effect's — write no
// entry in it. Each backend repeats the list in its queries word for word
// (ReportKindsPredicate), which lets SQLite and a generic PostgreSQL plan use that index.
var ReportKinds = []EventKind{EventAlert, EventApprovalDecided, EventEffectFailed, EventEffectReconciled,
	EventEffectResolved, EventValidation}

// ReportKindsPredicate is events_report_kind_at's WHERE clause, as the migrations spell it.
func ReportKindsPredicate() string {
	quoted := make([]string, len(ReportKinds))
	for i, k := range ReportKinds {
		quoted[i] = "'" + string(k) + "'"
	}
	return "kind IN (" + strings.Join(quoted, ", ") + ")"
}

// AreReportKinds reports whether every kind of kinds is one of ReportKinds: only then may
// a query read them from events_report_kind_at.
func AreReportKinds(kinds []string) bool {
	for _, k := range kinds {
		if !slices.Contains(ReportKinds, EventKind(k)) {
			return false
		}
	}
	return true
}
