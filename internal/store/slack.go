package store

import (
	"context"
	"time"
)

// SlackLink binds a Slack user, (TeamID, UserID) as Slack signs them, to the airlock
// person who decides when that user clicks a button: never a display name or an email.
type SlackLink struct {
	TeamID, UserID string
	Subject        string
	// AccountID is the local account linked ("" for single sign-on): a link does not
	// carry over to a new account that reuses a removed one's name.
	AccountID string
	LinkedAt  time.Time
	LinkedBy  string // cli:NAME, or person:NAME via slack:TEAM/USER
}

// SlackCode is a one-time link code a signed-in person took from the console. Only its
// hash is stored; one live code per subject.
type SlackCode struct {
	CodeHash  string
	Subject   string
	AccountID string
	ExpiresAt time.Time
}

// SlackQueries are the statements of decisions in Slack.
type SlackQueries interface {
	// SlackLinkPut links (TeamID, UserID) to a person, replacing the user's previous link.
	SlackLinkPut(ctx context.Context, l SlackLink) error
	// SlackLinkGet returns the user's link; ErrNotFound if none.
	SlackLinkGet(ctx context.Context, teamID, userID string) (SlackLink, error)
	// SlackLinkDelete removes the user's link; ErrNotFound if none.
	SlackLinkDelete(ctx context.Context, teamID, userID string) error
	// SlackCodePut stores a link code, replacing the subject's previous one.
	SlackCodePut(ctx context.Context, c SlackCode) error
	// SlackCodeTake deletes and returns the code of this hash if it has not expired at now
	// (nil: the backend's clock); ErrNotFound otherwise. Of two takes of one code, one
	// gets it.
	SlackCodeTake(ctx context.Context, codeHash string, now *time.Time) (SlackCode, error)
	// SlackRequestSeen records a signed request's signature hash at seenAt and forgets
	// those seen before forgetBefore; fresh is false when the hash was already recorded
	// (a replay), whichever instance recorded it.
	SlackRequestSeen(ctx context.Context, sigHash string, seenAt, forgetBefore time.Time) (fresh bool, err error)
	// PersonSeenGet returns the single sign-on record of subject; ErrNotFound if none.
	PersonSeenGet(ctx context.Context, subject string) (PersonSeen, error)
}
