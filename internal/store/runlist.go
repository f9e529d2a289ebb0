package store

import (
	"context"
	"time"
)

// RunListParams are GET /v1/runs's filters; each zero value means "any".
type RunListParams struct {
	State      State
	ActionType string     // runs with an effect or an approval of this action type
	OlderThan  *time.Time // created at or before
	KeyPrefix  string
	// StalledAt, when set, keeps the runs stalled at that time: processing, their lease
	// lapsed (nothing completed them; the next delivery of the key would reclaim them).
	StalledAt *time.Time
	After     Cursor // the last row of the previous page: (created_at, key)
	Limit     int
}

// KeyPrefixEnd is the first key past every key that starts with prefix in byte order
// (the prefix with the last code point appended): a key range an index can scan. A key
// with U+10FFFF right after the prefix sorts past it and is not listed.
func KeyPrefixEnd(prefix string) string { return prefix + "\U0010FFFF" }

// RunListQueries list runs for operators.
type RunListQueries interface {
	// RunList lists runs newest first (created_at, key), after the cursor, filtered:
	// the statement names only the filters given, each on an index (0016_runlist.sql;
	// on PostgreSQL the runs of every state are one range per state, merged: 0036).
	RunList(ctx context.Context, p RunListParams) ([]Run, error)
	// RunsStalledUnmarked lists up to limit runs stalled at now (processing, lease
	// lapsed) and not yet marked at their current version, the oldest lapse first.
	RunsStalledUnmarked(ctx context.Context, now *time.Time, limit int) ([]Run, error)
	// RunStallMark marks the run's stall at version, if it is still stalled at now at
	// that version and not marked yet; it reports whether it did. The caller alerts in
	// the same transaction, so a stall is alerted once however many sweepers race. The
	// mark changes neither the version nor updated_at.
	RunStallMark(ctx context.Context, key string, version int64, now *time.Time) (bool, error)
	// EffectsWaiting lists pending effects of a dispatcher or a worker that have been due
	// since dueBefore or earlier (approved or queued, never sent), the longest due first.
	EffectsWaiting(ctx context.Context, dueBefore time.Time, limit int) ([]Effect, error)
}
