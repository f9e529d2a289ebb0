package periodic_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/periodic"
)

// Every runs the task again and again, hands each live error to failed, drops the error
// of a run that ctx's end cut short, and returns once ctx ends.
func TestEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	errBoom := errors.New("boom")
	runs := make(chan int, 100)
	var failures []error
	n := 0
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		periodic.Every(ctx, time.Millisecond, func(ctx context.Context) error {
			n++
			runs <- n
			if n == 3 {
				cancel() // this run's error comes after ctx ended: dropped
			}
			return errBoom
		}, func(err error) { failures = append(failures, err) })
	}()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("Every did not return after ctx ended")
	}
	if got := len(runs); got != 3 {
		t.Fatalf("runs = %d, want 3 (none after ctx ended)", got)
	}
	if len(failures) != 2 || !errors.Is(failures[0], errBoom) {
		t.Fatalf("failures = %v, want the two errors of the runs before ctx ended", failures)
	}
}

// A nil failed is allowed: errors are then dropped.
func TestEveryNilFailed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		periodic.Every(ctx, time.Millisecond, func(context.Context) error { cancel(); return errors.New("x") }, nil)
	}()
	<-done
}
