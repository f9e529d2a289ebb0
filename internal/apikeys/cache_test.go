package apikeys

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// countingKeys answers APIKeyByHash from one row and counts the lookups (the database
// side of the cache is tested over HTTP on both stores in internal/httpapi).
type countingKeys struct {
	store.Queries
	row     store.APIKey
	lookups int
}

func (c *countingKeys) APIKeyByHash(_ context.Context, hash string) (store.APIKey, error) {
	c.lookups++
	if hash != c.row.Hash {
		return store.APIKey{}, store.ErrNotFound
	}
	return c.row, nil
}

func TestCacheKeepsOnlyHashesOfLiveKeysForTTL(t *testing.T) {
	ctx := context.Background()
	raw := "alk_0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"
	q := &countingKeys{row: store.APIKey{ID: "id-1", Name: "n8n", Hash: Hash(raw), Scopes: []string{ScopeRuns}}}
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	c := NewCache(2*time.Second, func() time.Time { return now })
	lookups := func(want int) {
		t.Helper()
		if q.lookups != want {
			t.Fatalf("%d lookups, want %d", q.lookups, want)
		}
	}
	for range 3 {
		if k, err := c.Authenticate(ctx, q, raw); err != nil || k.ID != "id-1" {
			t.Fatalf("authenticate: %+v %v", k, err)
		}
	}
	lookups(1)
	if s := fmt.Sprintf("%+v", c.entries); strings.Contains(s, raw) || !strings.Contains(s, Hash(raw)) {
		t.Fatalf("the cache must hold the key's hash, never the key: %s", s)
	}
	now = now.Add(2 * time.Second)
	q.row.RevokedAt = &now
	for range 2 {
		if _, err := c.Authenticate(ctx, q, raw); !errors.Is(err, ErrRevoked) {
			t.Fatalf("revoked key after the TTL: %v", err)
		}
	}
	lookups(3) // a refused key is looked up every time
	for range 2 {
		if _, err := c.Authenticate(ctx, q, raw+"x"); !errors.Is(err, ErrInvalid) {
			t.Fatalf("unknown key: %v", err)
		}
	}
	lookups(5)
	if len(c.entries) != 0 {
		t.Fatalf("refused keys were cached: %+v", c.entries)
	}
	// A nil cache or a zero TTL looks every key up.
	q.row.RevokedAt = nil
	for _, c := range []*Cache{nil, NewCache(0, nil)} {
		before := q.lookups
		for range 2 {
			if _, err := c.Authenticate(ctx, q, raw); err != nil {
				t.Fatal(err)
			}
		}
		if q.lookups != before+2 {
			t.Fatalf("%d lookups without a cache, want 2", q.lookups-before)
		}
	}
}
