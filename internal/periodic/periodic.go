// Package periodic runs a background task on a ticker: serve's sweepers, the alert
// relay's poll, the instance heartbeat and the dispatcher's late outcomes share this one
// loop.
package periodic

import (
	"context"
	"time"
)

// Every runs fn each interval (the first run one interval from now) until ctx ends.
// failed, if not nil, gets each error fn returns while ctx is live; an error after ctx
// ended is the shutdown's, not the task's, and is dropped.
func Every(ctx context.Context, interval time.Duration, fn func(context.Context) error, failed func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := fn(ctx); err != nil && ctx.Err() == nil && failed != nil {
				failed(err)
			}
		}
	}
}
