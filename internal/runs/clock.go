package runs

import (
	"context"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// Clock is a service's sense of now. Without Now it is the backend's clock — PostgreSQL's
// now(), shared by every instance, or the SQLite process clock; tests set Now to move time
// without sleeping.
type Clock struct {
	Now func() time.Time
}

// At is the Now param of store calls: nil means the backend's clock.
func (c Clock) At() *time.Time {
	if c.Now == nil {
		return nil
	}
	t := c.Now()
	return &t
}

// Read returns now inside a transaction: the injected time, else the backend's.
func (c Clock) Read(ctx context.Context, q store.Queries) (time.Time, error) {
	if c.Now != nil {
		return c.Now(), nil
	}
	return q.Clock(ctx)
}

// AtOrZero is At as a value: the zero time tells a store to use the backend's clock.
func (c Clock) AtOrZero() time.Time {
	if t := c.At(); t != nil {
		return *t
	}
	return time.Time{}
}
