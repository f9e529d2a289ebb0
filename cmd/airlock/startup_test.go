package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// serve started while PostgreSQL is down or restarting waits for it (an outage error),
// but returns any other error at once, and gives up after its wait.
func TestWaitForStore(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	real, err := sqlite.Open(ctx, t.TempDir()+"/a.db", sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()
	down := fmt.Errorf("connect to postgres: %w", store.ErrUnavailable)

	tries := 0
	st, err := waitForStore(ctx, log, time.Minute, func() (store.Store, error) {
		if tries++; tries < 3 {
			return nil, down
		}
		return real, nil
	})
	if err != nil || st != real || tries != 3 {
		t.Fatalf("after two refusals: %v, %d tries", err, tries)
	}

	tries = 0
	bad := errors.New("password authentication failed")
	if _, err := waitForStore(ctx, log, time.Minute, func() (store.Store, error) { tries++; return nil, bad }); !errors.Is(err, bad) || tries != 1 {
		t.Fatalf("a refusal that is no outage: %v after %d tries", err, tries)
	}

	tries = 0
	start := time.Now()
	if _, err := waitForStore(ctx, log, 500*time.Millisecond, func() (store.Store, error) { tries++; return nil, down }); !errors.Is(err, store.ErrUnavailable) || tries < 2 {
		t.Fatalf("a database that stays down: %v after %d tries", err, tries)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("waited %s past a 500 ms wait", took)
	}
}
