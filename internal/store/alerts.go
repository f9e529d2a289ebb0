package store

import "context"

// AlertQueries read and clear the alert outbox (0026_alert_outbox.sql): a trigger on
// events writes one row per alert event, in the transaction that inserts the event,
// whichever statement inserts it (the claim's and the dispatcher's batched statements
// included). The relay (internal/alerts) raises each row and deletes it in one
// transaction, so an alert whose event committed is raised at least once, never lost to a
// lost reply or a crash between the commit and the raise. A row is not an event: the
// hash chain, audit verify and retention do not see it.
type AlertQueries interface {
	// AlertOutboxTake returns up to limit rows of the alert outbox, oldest event first, as
	// the events they were written for (ID is the event's id, Kind "alert"), held until
	// the transaction ends. On PostgreSQL the rows are locked FOR UPDATE SKIP LOCKED, so
	// several relays share the outbox and never take the same row at once; on SQLite
	// the transaction's write lock holds them.
	AlertOutboxTake(ctx context.Context, limit int) ([]Event, error)
	// AlertOutboxDelete removes the rows of these event ids (ids with no row are
	// ignored).
	AlertOutboxDelete(ctx context.Context, eventIDs []int64) error
}
