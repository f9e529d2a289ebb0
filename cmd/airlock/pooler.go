package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
)

// refuseMisconfiguredPooler stops serve when a pooler in transaction mode (PgBouncer's
// pool_mode=transaction) stands between airlock and PostgreSQL and airlock is not set up
// for it: named prepared statements would land on other server sessions, and a LISTEN on
// a pooled connection would never hear a NOTIFY. The message says what to set.
func refuseMisconfiguredPooler(ctx context.Context, st store.Store) error {
	pg, ok := st.(*postgres.Store)
	if !ok {
		return nil
	}
	pooled, err := pg.Multiplexed(ctx)
	if err != nil || !pooled {
		return err
	}
	var missing []string
	if pg.QueryMode() == pgx.QueryExecModeCacheStatement {
		missing = append(missing, "AIRLOCK_DATABASE_QUERY_MODE=exec (no named prepared statements)")
	}
	if !pg.ListenSeparate() {
		missing = append(missing, "AIRLOCK_LISTEN_DATABASE_URL to a direct connection to PostgreSQL, past the pooler (LISTEN needs a session)")
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("the database URL goes through a pooler in transaction mode (connections share server sessions): set %s, or connect airlock directly or through session pooling",
		strings.Join(missing, " and "))
}
