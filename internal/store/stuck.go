package store

import (
	"context"
	"time"
)

// ApprovalStep is a one-time step of a pending approval, claimed by a compare-and-set on
// its column so that of several instances exactly one takes it.
type ApprovalStep string

const (
	// StepWarn is the expiry warning (warn_at → warned_at).
	StepWarn ApprovalStep = "warn"
	// StepEscalate is the escalation to a second role (escalate_at → escalated_at).
	StepEscalate ApprovalStep = "escalate"
)

// PeopleSeenHorizon is how long a person known only by single sign-on counts as holding
// the roles of their last sign-in (approvals.PeopleHorizon); the retention purge removes
// the people_seen rows older than that, which nothing reads any more.
const PeopleSeenHorizon = 90 * 24 * time.Hour

// PersonSeen is someone who signed in by single sign-on, with the roles they last had:
// airlock keeps no account for them, so this is all it knows of who holds a role.
type PersonSeen struct {
	Subject string
	Roles   []string
	SeenAt  time.Time
}

// StuckQueries find approvals nobody attends to: due warnings and escalations, and those
// nobody known can decide (0019_stuck.sql).
type StuckQueries interface {
	// ApprovalsDue lists pending approvals (unconsumed, unexpired at now) whose step is
	// due at now and not yet claimed, the earliest due first.
	ApprovalsDue(ctx context.Context, step ApprovalStep, now *time.Time, limit int) ([]Approval, error)
	// ApprovalClaimStep marks the step taken at now in one UPDATE … RETURNING, only if it
	// is due, not yet taken, and the approval still pending; ErrNoMatch otherwise.
	ApprovalClaimStep(ctx context.Context, id string, step ApprovalStep, now *time.Time) (Approval, error)
	// ApprovalSetUndecidable starts (undecidable) or ends an episode: it sets
	// undecidable_since to now only if it was unset and the approval is pending, or
	// clears it only if it was set. ErrNoMatch when nothing changed, so that of several
	// instances exactly one records the start.
	ApprovalSetUndecidable(ctx context.Context, id string, undecidable bool, now *time.Time) (Approval, error)
	// ApprovalsUndecidable lists pending approvals in an undecidable episode, newest
	// first (created_at, id), after the cursor.
	ApprovalsUndecidable(ctx context.Context, after Cursor, now *time.Time, limit int) ([]Approval, error)
	// ApprovalsUndecidableCount counts them (the gauge).
	ApprovalsUndecidableCount(ctx context.Context, now *time.Time) (int, error)
	// PersonSeenPut records a single sign-on with the roles it brought.
	PersonSeenPut(ctx context.Context, p PersonSeen) error
	// PeopleSeen lists the people who signed in by single sign-on since the given time.
	PeopleSeen(ctx context.Context, since time.Time) ([]PersonSeen, error)
}
