// Package slack takes decisions from Slack without weakening the gate: every request is
// checked against the Slack app's signing secret (v0 HMAC-SHA256 over
// "v0:timestamp:body", compared in constant time), refused when its timestamp is more
// than five minutes off or when it was seen before (in the store, so every instance
// agrees), and its user decides only as the airlock person they were linked to (a
// one-time code from the console completed by a signed slash command, or an admin's
// `airlock user link-slack`) — never by a name or an email the payload carries. The
// decision itself is approvals.DecideBy, the page's own path: roles, separation of
// duties, expiry, single use, the payload hash the message showed, the events, the
// outbox. After it, the message is replaced through its response_url with the outcome.
package slack

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/accounts"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// MaxSkew is how far a request's timestamp may be from airlock's clock.
const MaxSkew = 5 * time.Minute

// CodeLifetime is how long a link code from the console may be used.
const CodeLifetime = 10 * time.Minute

// Refusals of a request, before anything in it is read.
var (
	ErrNotConfigured = errors.New("decisions in Slack are not configured (policy slack section)")
	ErrSignature     = errors.New("the request does not carry a valid Slack signature")
	ErrStale         = errors.New("the request's Slack timestamp is more than five minutes from airlock's clock")
	ErrReplayed      = errors.New("this signed Slack request was already received")
	ErrTeam          = errors.New("requests from this Slack workspace are not taken")
)

// Service answers Slack's requests.
type Service struct {
	runs.Base
	approvals *approvals.Service
	client    *http.Client
}

// Config is what the Slack service needs beside its Base.
type Config struct {
	// Approvals decides approvals (DecideBy, the page's own path); nil: a service that
	// only links and unlinks accounts (the command line): Slack's requests are refused
	// as not configured.
	Approvals *approvals.Service
	// Client posts to response_url and Slack's API (nil: a client with a 5 s timeout).
	Client *http.Client
}

// New builds the Slack service over b; its policy's slack section configures it.
func New(b runs.Base, cfg Config) (*Service, error) {
	b, err := b.Fill()
	if err != nil {
		return nil, fmt.Errorf("slack: %w", err)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 5 * time.Second}
	}
	return &Service{Base: b, approvals: cfg.Approvals, client: cfg.Client}, nil
}

func (s *Service) conf() (*policy.Slack, error) {
	if s == nil || s.approvals == nil || s.Policy.Slack == nil || s.Policy.Slack.SigningSecret == "" {
		return nil, ErrNotConfigured
	}
	return s.Policy.Slack, nil
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Sign is Slack's v0 signature of body sent at ts (unix seconds), as Slack documents it:
// "v0=" + hex(HMAC-SHA256(secret, "v0:" + ts + ":" + body)).
func Sign(secret, ts string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("v0:" + ts + ":"))
	m.Write(body)
	return "v0=" + hex.EncodeToString(m.Sum(nil))
}

// Verify checks a request's signature and timestamp (headers X-Slack-Signature and
// X-Slack-Request-Timestamp), then records it so that it is taken once: ErrSignature,
// ErrStale or ErrReplayed. Nothing of the body is read before it passes.
func (s *Service) Verify(ctx context.Context, ts, sig string, body []byte) error {
	c, err := s.conf()
	if err != nil {
		return err
	}
	want := Sign(c.SigningSecret, ts, body)
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return ErrSignature
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return ErrSignature
	}
	now := s.now()
	if d := now.Sub(time.Unix(sec, 0)); d > MaxSkew || d < -MaxSkew {
		return ErrStale
	}
	sum := sha256.Sum256([]byte(sig))
	// Forget what no accepted timestamp can repeat: older than twice the skew.
	fresh, err := s.Store.SlackRequestSeen(ctx, hex.EncodeToString(sum[:]), now, now.Add(-2*MaxSkew))
	if err != nil {
		return fmt.Errorf("slack request: %w", err)
	}
	if !fresh {
		return ErrReplayed
	}
	return nil
}

// Person is the airlock person a Slack user is linked to, with their roles now: a local
// account's current roles (none if it was disabled, removed or replaced), or a single
// sign-on person's roles of their last sign-in, no older than a session may be.
func (s *Service) Person(ctx context.Context, team, user string) (approvals.Person, error) {
	l, err := s.Store.SlackLinkGet(ctx, team, user)
	if errors.Is(err, store.ErrNotFound) {
		return approvals.Person{}, errNotLinked
	}
	if err != nil {
		return approvals.Person{}, err
	}
	if l.AccountID != "" {
		u, err := s.Store.UserByName(ctx, l.Subject)
		if errors.Is(err, store.ErrNotFound) || (err == nil && (u.ID != l.AccountID || u.DisabledAt != nil)) {
			return approvals.Person{}, errAccountGone
		}
		if err != nil {
			return approvals.Person{}, err
		}
		return approvals.Person{Subject: u.Name, Roles: u.Roles}, nil
	}
	p, err := s.Store.PersonSeenGet(ctx, l.Subject)
	if errors.Is(err, store.ErrNotFound) || (err == nil && s.now().Sub(p.SeenAt) > accounts.SessionLifetime) {
		return approvals.Person{}, errSignInAgain
	}
	if err != nil {
		return approvals.Person{}, err
	}
	return approvals.Person{Subject: p.Subject, Roles: p.Roles}, nil
}

// Answers to a user that change nothing (ephemeral messages).
var (
	errNotLinked   = errors.New("your Slack account is not linked to an airlock person, so nothing was decided. Link it: sign in to the airlock console, open Link Slack (/console/slack), and send the command it shows (/airlock link CODE), or ask an admin to run airlock user link-slack")
	errAccountGone = errors.New("the airlock account your Slack account is linked to is disabled or no longer exists, so nothing was decided")
	errSignInAgain = errors.New("airlock has not seen you sign in within the last 12 hours, so it does not know your roles now and nothing was decided. Sign in to the airlock console once, then click again")
)

// NewCode gives the signed-in person a one-time link code (returned once; only its
// hash is stored, replacing any earlier one of theirs). accountID is their local
// account's id, "" for single sign-on.
func (s *Service) NewCode(ctx context.Context, subject, accountID string) (string, time.Time, error) {
	b := make([]byte, 10)
	if _, err := rand.Read(b); err != nil {
		return "", time.Time{}, fmt.Errorf("slack link code: %w", err)
	}
	code := strings.ToUpper(hex.EncodeToString(b))
	expires := s.now().Add(CodeLifetime)
	if err := s.Store.SlackCodePut(ctx, store.SlackCode{CodeHash: hashCode(code), Subject: subject, AccountID: accountID,
		ExpiresAt: expires}); err != nil {
		return "", time.Time{}, err
	}
	return code, expires, nil
}

func hashCode(code string) string {
	sum := sha256.Sum256([]byte("airlock slack link\n" + strings.ToUpper(strings.TrimSpace(code))))
	return hex.EncodeToString(sum[:])
}

// Link links (team, user) to subject (an admin's `airlock user link-slack`, actor
// cli:NAME), with a user_changed event.
func (s *Service) Link(ctx context.Context, team, user, subject, accountID, actor string) error {
	return s.Store.Transact(ctx, func(q store.Queries) error {
		if err := q.SlackLinkPut(ctx, store.SlackLink{TeamID: team, UserID: user, Subject: subject, AccountID: accountID,
			LinkedAt: s.now(), LinkedBy: actor}); err != nil {
			return err
		}
		return runs.Event(ctx, q, s.At(), runs.Entry{Kind: store.EventUserChanged, Actor: actor, Detail: map[string]any{
			"user": subject, "change": "slack_linked:" + team + "/" + user}})
	})
}

// Unlink removes (team, user)'s link; store.ErrNotFound if it had none.
func (s *Service) Unlink(ctx context.Context, team, user, actor string) error {
	return s.Store.Transact(ctx, func(q store.Queries) error {
		l, err := q.SlackLinkGet(ctx, team, user)
		if err != nil {
			return err
		}
		if err := q.SlackLinkDelete(ctx, team, user); err != nil {
			return err
		}
		return runs.Event(ctx, q, s.At(), runs.Entry{Kind: store.EventUserChanged, Actor: actor, Detail: map[string]any{
			"user": l.Subject, "change": "slack_unlinked:" + team + "/" + user}})
	})
}

// post sends a JSON body to a response_url, only if it is under one of the configured
// prefixes (Slack's hooks): airlock posts to no other address a payload names.
func (s *Service) post(ctx context.Context, url string, body []byte) {
	c, err := s.conf()
	if err != nil || url == "" {
		return
	}
	ok := false
	for _, p := range c.ResponseURLPrefixes {
		ok = ok || strings.HasPrefix(url, p)
	}
	if !ok {
		s.Log.Warn("slack response_url refused", "reason", "not under slack.response_url_prefixes")
		return
	}
	if _, err := s.send(ctx, url, "", body); err != nil {
		s.Log.Warn("slack response not sent", "reason", err)
	}
}

// send posts body as JSON, with a bearer token when given; the URL (a capability) is
// not logged.
func (s *Service) send(ctx context.Context, url, token string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, errors.New("bad URL")
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, errors.New("transport error")
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return b, fmt.Errorf("status %d", resp.StatusCode)
	}
	return b, nil
}
