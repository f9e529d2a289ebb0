package apikeys_test

import (
	"context"
	"errors"
	"testing"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/store"
)

var ctx = context.Background()

// TestAPIKeys: keys are created, found by their hash and revoked alike on every
// backend.
func TestAPIKeys(t *testing.T) { apptest.EachEnv(t, testAPIKeys) }

func testAPIKeys(t *testing.T, e *apptest.Env) {
	k, raw, err := apikeys.Create(ctx, e.Store, "n8n", []string{apikeys.ScopeRuns}, e.Clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if k.Hash == raw || k.Hash != apikeys.Hash(raw) {
		t.Fatal("the stored hash is not the key's SHA-256")
	}
	got, err := apikeys.Authenticate(ctx, e.Store, raw)
	if err != nil || got.ID != k.ID || got.Scopes[0] != apikeys.ScopeRuns {
		t.Fatalf("authenticate: %+v, %v", got, err)
	}
	if _, err := apikeys.Authenticate(ctx, e.Store, raw+"x"); !errors.Is(err, apikeys.ErrInvalid) {
		t.Fatalf("a wrong key: %v", err)
	}
	list, err := e.Store.APIKeyList(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v, %v", list, err)
	}
	if err := e.Store.APIKeyRevoke(ctx, k.ID, e.Clock.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := apikeys.Authenticate(ctx, e.Store, raw); !errors.Is(err, apikeys.ErrRevoked) {
		t.Fatalf("a revoked key: %v", err)
	}
	if err := e.Store.APIKeyRevoke(ctx, k.ID, e.Clock.Now()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke twice: %v", err)
	}
}
