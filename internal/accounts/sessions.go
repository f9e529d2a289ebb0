package accounts

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

const (
	// SessionIdle and SessionLifetime bound a session: idle, and absolute.
	SessionIdle     = 30 * time.Minute
	SessionLifetime = 12 * time.Hour
)

// Sessions are the server-side sessions of people signed in, local or by single
// sign-on. A session's id is a random value only the browser holds (in its cookie); the
// store keeps its SHA-256 hash, so a database read gives no session away.
type Sessions struct {
	Store store.Store
	runs.Clock
}

// Start begins a session for who (userID is the local account's, "" for single sign-on)
// and ends the one the browser held before (previous, its id, or ""). It returns the new
// session's id, for the cookie.
func (s Sessions) Start(ctx context.Context, previous string, who approvals.Person, userID string) (string, error) {
	if previous != "" {
		_ = s.Store.SessionDelete(ctx, hashOf(previous))
	}
	id := randomValue()
	// The database's clock (or the test's): sessions are checked against it, and another
	// instance's process clock may differ from this one's.
	now, err := s.Read(ctx, s.Store)
	if err != nil {
		return "", err
	}
	err = s.Store.Transact(ctx, func(q store.Queries) error {
		if err := q.SessionInsert(ctx, store.Session{IDHash: hashOf(id), UserID: userID, Subject: who.Subject, Roles: who.Roles,
			CreatedAt: now, ExpiresAt: now.Add(SessionLifetime)}); err != nil {
			return err
		}
		if userID != "" {
			return nil
		}
		// Single sign-on keeps no account: remember who signed in with which roles, so
		// that an approval nobody known can decide is found (approvals.Holders).
		return q.PersonSeenPut(ctx, store.PersonSeen{Subject: who.Subject, Roles: who.Roles, SeenAt: now})
	})
	if err != nil {
		return "", err
	}
	return id, nil
}

// ErrNoSession: the id names no live session (unknown, ended, idle too long, or past its
// lifetime).
var ErrNoSession = errors.New("no live session")

// Person returns the person of a live session and renews its idle time; ErrNoSession
// when id names none. The error is store.ErrUnavailable when the database could not say
// (the session is touched, a write): nobody is taken for signed out because of an outage.
func (s Sessions) Person(ctx context.Context, id string) (approvals.Person, error) {
	who, _, err := s.Account(ctx, id)
	return who, err
}

// Account is Person with the local account signed in ("" for single sign-on).
func (s Sessions) Account(ctx context.Context, id string) (approvals.Person, string, error) {
	if id == "" {
		return approvals.Person{}, "", ErrNoSession
	}
	sess, err := s.Store.SessionTouch(ctx, hashOf(id), SessionIdle, s.At())
	if errors.Is(err, store.ErrUnavailable) {
		return approvals.Person{}, "", err
	}
	if err != nil {
		return approvals.Person{}, "", ErrNoSession
	}
	return approvals.Person{Subject: sess.Subject, Roles: sess.Roles}, sess.UserID, nil
}

// End ends the session (signing out); an unknown id is no error.
func (s Sessions) End(ctx context.Context, id string) error {
	return s.Store.SessionDelete(ctx, hashOf(id))
}

// hashOf is how a secret of this package (a session id, a throttle key's address or
// name) is stored: its SHA-256, hex.
func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// randomValue is a session id: 32 random bytes, URL-safe base64.
func randomValue() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
