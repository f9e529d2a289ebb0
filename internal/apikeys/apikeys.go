// Package apikeys issues and checks the bearer keys of machine clients. A key is shown
// once, at creation; only its SHA-256 is stored, so a database dump grants nothing.
package apikeys

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/google/uuid"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/input"
	"github.com/airlockhq/airlock/internal/store"
)

// Scopes a key may carry. admin implies every other scope.
const (
	ScopeRuns     = "runs"     // claim, heartbeat, transition and read runs
	ScopeRead     = "read"     // read runs and their events
	ScopeWorker   = "worker"   // external workers: claim effects and report their outcome
	ScopeOperator = "operator" // resolve unknown or failed effects
	ScopeAdmin    = "admin"    // everything, including the kill switch
	// ScopeEvaluator records evidence for approve_by_exception under the key's name as
	// the source. It is never combined with a scope that acts: the workflow that asks for
	// an auto-approval must not be able to vouch for itself.
	ScopeEvaluator = "evaluator"
)

// AllScopes lists the valid scopes in the order help texts show them.
var AllScopes = []string{ScopeRuns, ScopeRead, ScopeWorker, ScopeOperator, ScopeAdmin, ScopeEvaluator}

// prefix marks airlock keys so secret scanners and people can recognise one.
const prefix = "alk_"

var (
	ErrInvalid = errors.New("invalid API key")
	ErrRevoked = errors.New("API key revoked")
)

// Hash is the stored form of a raw key.
func Hash(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return hex.EncodeToString(sum[:])
}

// ParseScopes checks a comma-separated scope list.
func ParseScopes(s string) ([]string, error) {
	var out []string
	for _, sc := range strings.Split(s, ",") {
		sc = strings.TrimSpace(sc)
		if sc == "" {
			continue
		}
		if !slices.Contains(AllScopes, sc) {
			return nil, fmt.Errorf("unknown scope %q (valid: %s)", sc, strings.Join(AllScopes, ", "))
		}
		if !slices.Contains(out, sc) {
			out = append(out, sc)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("at least one scope is required (valid: %s)", strings.Join(AllScopes, ", "))
	}
	if slices.Contains(out, ScopeEvaluator) && slices.ContainsFunc(out, func(s string) bool { return s != ScopeEvaluator && s != ScopeRead }) {
		return nil, errors.New("evaluator cannot be combined with runs, worker, operator or admin: evidence must come from outside the workflow")
	}
	return out, nil
}

// Spec describes a key to create.
type Spec struct {
	Name   string
	Scopes []string
	// OnBehalfOf names the person the key acts for (optional): requests made with it are
	// theirs, so under separation of duties that person cannot approve them.
	OnBehalfOf string
	// Types limits a worker key to these action types (optional; worker keys only).
	Types []string
}

// Create stores a new key and returns it with its raw value, which is never stored.
func Create(ctx context.Context, q store.Queries, name string, scopes []string, now time.Time) (store.APIKey, string, error) {
	return CreateSpec(ctx, q, Spec{Name: name, Scopes: scopes}, now)
}

// CreateSpec stores a new key as spec says and returns it with its raw value.
func CreateSpec(ctx context.Context, q store.Queries, spec Spec, now time.Time) (store.APIKey, string, error) {
	name, scopes := strings.TrimSpace(spec.Name), spec.Scopes
	// Both are identities under separation of duties (apikey:<name>, the person): they
	// must read as what they are compared as.
	if name == "" || len(name) > 100 || input.Identity(name) != nil {
		return store.APIKey{}, "", errors.New("a name of 1 to 100 characters is required, without control, invisible or bidirectional characters")
	}
	onBehalfOf := strings.TrimSpace(spec.OnBehalfOf)
	if len(onBehalfOf) > 200 || input.Identity(onBehalfOf) != nil {
		return store.APIKey{}, "", errors.New("on-behalf-of: at most 200 characters, no control, invisible or bidirectional characters")
	}
	// The person the key acts for is a declared identity: one that reads like a known
	// person's name without being it is refused, as meta.requested_by is.
	if err := approvals.CheckDeclared(ctx, q, nil, onBehalfOf); err != nil {
		return store.APIKey{}, "", fmt.Errorf("on-behalf-of: %w", err)
	}
	var types []string
	for _, t := range spec.Types {
		if t = strings.TrimSpace(t); strings.ContainsFunc(t, func(r rune) bool { return r == ',' || unicode.IsSpace(r) || unicode.IsControl(r) }) {
			return store.APIKey{}, "", fmt.Errorf("types: %q is not an action type name", t)
		}
		if t != "" && !slices.Contains(types, t) {
			types = append(types, t)
		}
	}
	if len(types) > 0 && !slices.Equal(scopes, []string{ScopeWorker}) {
		return store.APIKey{}, "", errors.New("types limit worker keys: use them with --scope worker alone")
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return store.APIKey{}, "", fmt.Errorf("generate key: %w", err)
	}
	raw := prefix + base64.RawURLEncoding.EncodeToString(secret)
	k := store.APIKey{ID: uuid.NewString(), Name: name, Hash: Hash(raw), Scopes: scopes, CreatedAt: now.UTC(),
		OnBehalfOf: onBehalfOf, Types: types}
	if err := q.APIKeyInsert(ctx, k); err != nil {
		return store.APIKey{}, "", err
	}
	return k, raw, nil
}

// Authenticate returns the live key for a raw bearer value.
func Authenticate(ctx context.Context, q store.Queries, raw string) (store.APIKey, error) {
	if !strings.HasPrefix(raw, prefix) || len(raw) > 200 {
		return store.APIKey{}, ErrInvalid
	}
	k, err := q.APIKeyByHash(ctx, Hash(raw))
	if errors.Is(err, store.ErrNotFound) {
		return store.APIKey{}, ErrInvalid
	}
	if err != nil {
		return store.APIKey{}, fmt.Errorf("look up API key: %w", err)
	}
	if k.RevokedAt != nil {
		return store.APIKey{}, ErrRevoked
	}
	return k, nil
}

// Allows reports whether a key with these scopes may use a route needing scope.
func Allows(have []string, need string) bool {
	if slices.Contains(have, ScopeAdmin) || slices.Contains(have, need) {
		return true
	}
	// Every client that may act on runs or effects may also read them.
	return need == ScopeRead && len(have) > 0
}

// Cache remembers, for a short TTL, the keys that authenticated, so a client's every
// request does not cost a database round trip. Entries are keyed by the key's SHA-256
// (the raw key is never kept) and only live keys are cached: an unknown or revoked key is
// looked up every time. A key revoked in the database (on any instance: revocation is
// `airlock apikey revoke`) stops working here at most TTL later.
type Cache struct {
	ttl time.Duration
	now func() time.Time
	max int

	mu      sync.Mutex
	entries map[string]cached // by hash
}

type cached struct {
	key   store.APIKey
	until time.Time
}

// NewCache caches for ttl (≤ 0: nothing is cached); now may be nil (the process clock).
func NewCache(ttl time.Duration, now func() time.Time) *Cache {
	if now == nil {
		now = time.Now
	}
	return &Cache{ttl: ttl, now: now, max: 10000, entries: map[string]cached{}}
}

// Authenticate is Authenticate through the cache; a nil Cache caches nothing.
func (c *Cache) Authenticate(ctx context.Context, q store.Queries, raw string) (store.APIKey, error) {
	if c == nil || c.ttl <= 0 {
		return Authenticate(ctx, q, raw)
	}
	if !strings.HasPrefix(raw, prefix) || len(raw) > 200 {
		return store.APIKey{}, ErrInvalid
	}
	hash := Hash(raw)
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[hash]
	c.mu.Unlock()
	if ok && now.Before(e.until) {
		return e.key, nil
	}
	k, err := Authenticate(ctx, q, raw)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		delete(c.entries, hash)
		return k, err
	}
	if len(c.entries) >= c.max {
		for h, e := range c.entries {
			if !now.Before(e.until) {
				delete(c.entries, h)
			}
		}
		if len(c.entries) >= c.max {
			clear(c.entries)
		}
	}
	c.entries[hash] = cached{key: k, until: now.Add(c.ttl)}
	return k, nil
}

// MayHandle reports whether key may claim or report effects of actionType: a worker key
// limited to types handles only those.
func MayHandle(k store.APIKey, actionType string) bool {
	return len(k.Types) == 0 || slices.Contains(k.Types, actionType)
}
