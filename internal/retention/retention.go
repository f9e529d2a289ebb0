// Package retention enforces the policy's retention: what has outlived it is removed,
// keeping the hashes and ids an audit needs. Several instances may purge at once: every
// statement is set-based and idempotent.
package retention

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
)

// Purge removes (or with dry, counts) what is older than the policy allows at now; the
// zero now is the database's clock, the one that stamped the rows (PostgreSQL's now()):
// an instance whose own clock runs ahead must not purge what is not yet due.
func Purge(ctx context.Context, st store.Store, p *policy.Policy, now time.Time, dry bool) (store.PurgeCounts, error) {
	if now.IsZero() {
		var err error
		if now, err = st.Clock(ctx); err != nil {
			return nil, fmt.Errorf("purge: %w", err)
		}
	}
	counts, err := st.Purge(ctx, store.PurgeParams{
		PayloadsBefore: now.Add(-p.Retention.Payloads.D()),
		EventsBefore:   now.Add(-p.Retention.Events.D()),
		Now:            now, DryRun: dry,
	})
	if err != nil {
		return nil, fmt.Errorf("purge: %w", err)
	}
	return counts, nil
}

// Job is one scheduled purge, for `every`: it logs what it removed.
func Job(st store.Store, p *policy.Policy, log *slog.Logger) func(context.Context) error {
	return func(ctx context.Context) error {
		counts, err := Purge(ctx, st, p, time.Time{}, false)
		if err != nil {
			return err
		}
		var attrs []any
		for k, n := range counts {
			if n > 0 {
				attrs = append(attrs, k, n)
			}
		}
		if len(attrs) > 0 {
			log.Info("retention purge", attrs...)
		}
		return nil
	}
}
