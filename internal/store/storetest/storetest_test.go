package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
)

// TestReplayRecords is the store contract that no service above the store takes part in:
// replay records. (The behaviours of runs, effects, approvals, failures and the ledger
// are tested beside those packages, on every backend, through Each.)
func TestReplayRecords(t *testing.T) { each(t, testReplayRecords) }

// each runs fn on every backend (Each), each with a fresh env: a top-level test named for
// its unit calls it, so `go test -run '^TestReplayRecords$'` runs that one case on each.
func each(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Helper()
	Each(t, func(t *testing.T, b Backend) { fn(t, newEnv(t, b)) })
}

var ctx = context.Background()

// env is one store-contract test's store and clock.
type env struct {
	Store store.Store
	Clock *Clock
}

func newEnv(t *testing.T, b Backend) *env {
	t.Helper()
	e := &env{Clock: NewClock()}
	e.Store = b.Open(t, e.Clock)
	return e
}

func equal(t *testing.T, what string, got, want any) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func wantErr(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("err = %v, want %v", err, want)
	}
}

// kinds are the kinds of key's events, oldest first.
func kinds(t *testing.T, e *env, key string) []string {
	t.Helper()
	evs, err := e.Store.EventList(ctx, key, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Kind)
	}
	return out
}
