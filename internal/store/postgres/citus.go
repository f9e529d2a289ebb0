package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

// The Citus placement of docs/scaling.md's plan ("Where each table goes"): the tables
// distributed by their run key, co-located with workflow_runs, and the reference tables.
// Every other table stays a plain table on the coordinator.
var (
	// CitusDistributed maps each distributed table to its distribution column, in the
	// order they are distributed (workflow_runs, the anchor of the co-location group, first).
	CitusDistributed = []CitusTable{
		{"workflow_runs", "idempotency_key"},
		{"effects", "idempotency_key"},
		{"effect_count_deltas", "run_key"},
		{"events", "run_key"},
		{"event_chains", "run_key"},
		{"alert_outbox", "run_key"},
		{"validations", "idempotency_key"},
		{"run_failures", "idempotency_key"},
		{"approvals", "idempotency_key"},
		{"ledgers", "idempotency_key"},
		{"evidence", "idempotency_key"},
		{"replacements", "new_key"},
	}
	// CitusReference are the tables copied to every node.
	CitusReference = []string{"api_keys", "users", "people_seen", "slack_links", "kill_switch", "site_secrets"}
)

// CitusTable is a distributed table and its distribution column.
type CitusTable struct{ Table, Column string }

// ErrNoCitus is returned by RequireCitus when the database has no citus extension.
var ErrNoCitus = errors.New("the database has no citus extension: run CREATE EXTENSION citus on the coordinator (and every worker), or migrate without --citus")

// IsCitus reports whether the database has the citus extension, i.e. is a Citus
// coordinator (or a worker, which airlock must not be pointed at).
func (s *Store) IsCitus(ctx context.Context) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')`).Scan(&ok)
	return ok, err
}

// distributeCitus places the tables per the plan on a Citus coordinator: the ones not yet
// distributed are made so (their primary keys and unique constraints first gaining the
// distribution column, a foreign key not on it dropped), the reference tables copied to
// every node. It runs after the migrations, in its own transaction under the migration
// lock, and does nothing for a table already placed, so it is idempotent: a release whose
// migration adds a table places it the next time migrate runs.
func (s *Store) distributeCitus(ctx context.Context) (placed []string, err error) {
	err = s.transact(ctx, func(tx pgx.Tx) error {
		placed = nil
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
			return fmt.Errorf("lock migrations: %w", err)
		}
		// Several tables distributed in one transaction, with foreign keys between them:
		// Citus needs one connection per node for that.
		if _, err := tx.Exec(ctx, `SET LOCAL citus.multi_shard_modify_mode TO 'sequential'`); err != nil {
			return err
		}
		// The triggers of events and effects are created on each shard and fire on the
		// worker that holds it; what they write is co-located (docs/scaling.md).
		if _, err := tx.Exec(ctx, `SET LOCAL citus.enable_unsafe_triggers TO on`); err != nil {
			return err
		}
		strs := func(sql string, args ...any) ([]string, error) {
			rows, err := tx.Query(ctx, sql, args...)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[string])
		}
		placedAlready := func(table string) (bool, error) {
			var ok bool
			err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))`, table).Scan(&ok)
			return ok, err
		}
		exec := func(stmts ...string) error {
			for _, st := range stmts {
				if _, err := tx.Exec(ctx, st); err != nil {
					return fmt.Errorf("citus: %s: %w", st, err)
				}
			}
			return nil
		}
		// airlock_now (0032) as a function Citus does not inline: it then evaluates the call
		// on the coordinator, where one inlined into a COALESCE it refuses in an UPDATE.
		// Only once: Citus sends the DDL to every worker, and an instance that starts while
		// a worker is down migrates a schema already placed; that must need no worker.
		var swapped bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
			WHERE p.oid = to_regprocedure('airlock_now(timestamptz)') AND l.lanname = 'plpgsql')`).Scan(&swapped); err != nil {
			return fmt.Errorf("citus: read airlock_now: %w", err)
		}
		if !swapped {
			if err := exec(`CREATE OR REPLACE FUNCTION airlock_now(t timestamptz) RETURNS timestamptz
			LANGUAGE plpgsql STABLE AS 'BEGIN RETURN coalesce(t, now()); END'`); err != nil {
				return err
			}
		}
		var todo []CitusTable
		for _, d := range CitusDistributed {
			ok, err := placedAlready(d.Table)
			if err != nil {
				return fmt.Errorf("citus: read pg_dist_partition: %w", err)
			}
			if !ok {
				todo = append(todo, d)
			}
		}
		for _, d := range todo {
			// A foreign key whose columns do not include the distribution column cannot
			// hold across shards (replacements.old_key → workflow_runs): Citus refuses it.
			drops, err := strs(`SELECT format('ALTER TABLE %s DROP CONSTRAINT %I', conrelid::regclass, conname)
				FROM pg_constraint WHERE contype = 'f' AND conrelid = to_regclass($1)
				  AND NOT EXISTS (SELECT FROM unnest(conkey) k(num) JOIN pg_attribute a ON a.attrelid = conrelid AND a.attnum = k.num WHERE a.attname = $2)`,
				d.Table, d.Column)
			if err != nil {
				return err
			}
			if err := exec(drops...); err != nil {
				return err
			}
			// A primary key or unique constraint without the distribution column gains it
			// (first), and what it indexed alone keeps a plain index: lookups by id alone
			// still find the row on each shard by index.
			rows, err := tx.Query(ctx, `SELECT conname, contype = 'p',
				  ARRAY(SELECT quote_ident(attname) FROM unnest(conkey) WITH ORDINALITY k(num, o)
				        JOIN pg_attribute ON attrelid = conrelid AND attnum = k.num ORDER BY k.o)
				FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype IN ('p', 'u')
				  AND NOT EXISTS (SELECT FROM unnest(conkey) k(num) JOIN pg_attribute a ON a.attrelid = conrelid AND a.attnum = k.num WHERE a.attname = $2)`,
				d.Table, d.Column)
			if err != nil {
				return err
			}
			type con struct {
				name    string
				primary bool
				cols    []string
			}
			cons, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (con, error) {
				var c con
				err := r.Scan(&c.name, &c.primary, &c.cols)
				return c, err
			})
			if err != nil {
				return err
			}
			table, col := pgx.Identifier{d.Table}.Sanitize(), pgx.Identifier{d.Column}.Sanitize()
			for _, c := range cons {
				kind := "UNIQUE"
				if c.primary {
					kind = "PRIMARY KEY"
				}
				name := pgx.Identifier{c.name}.Sanitize()
				cols := joinCols(c.cols)
				if err := exec(
					`ALTER TABLE `+table+` DROP CONSTRAINT `+name,
					`ALTER TABLE `+table+` ADD CONSTRAINT `+name+` `+kind+` (`+col+`, `+cols+`)`,
					`CREATE INDEX IF NOT EXISTS `+pgx.Identifier{c.name + "_alone"}.Sanitize()+` ON `+table+` (`+cols+`)`,
				); err != nil {
					return err
				}
			}
		}
		// A trigger's function runs on the worker, in Citus's connection, whose search_path
		// is the worker's default: pin each one to this schema, so the tables it writes are
		// found there (a schema other than public, as the tests use, would not be).
		for _, d := range todo {
			pins, err := strs(`SELECT DISTINCT format('ALTER FUNCTION %s SET search_path = %I', tgfoid::regprocedure, current_schema())
				FROM pg_trigger WHERE tgrelid = to_regclass($1) AND NOT tgisinternal`, d.Table)
			if err != nil {
				return err
			}
			if err := exec(pins...); err != nil {
				return err
			}
		}
		for _, d := range todo {
			colocate := "workflow_runs"
			if d.Table == "workflow_runs" {
				colocate = "default"
			}
			// A table with rows (a single-node database restored onto the coordinator) is
			// copied into its shards; its triggers must not fire on that copy (the chain
			// trigger would chain the events again).
			if err := exec(`ALTER TABLE ` + pgx.Identifier{d.Table}.Sanitize() + ` DISABLE TRIGGER USER`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT create_distributed_table($1, $2, colocate_with => $3)`, d.Table, d.Column, colocate); err != nil {
				return fmt.Errorf("citus: distribute %s by %s: %w", d.Table, d.Column, err)
			}
			if err := exec(`ALTER TABLE ` + pgx.Identifier{d.Table}.Sanitize() + ` ENABLE TRIGGER USER`); err != nil {
				return err
			}
			placed = append(placed, d.Table+" (distributed by "+d.Column+")")
		}
		// The rows a distributed table had are in its shards now; the coordinator's copy
		// is dead weight (Citus keeps it until told).
		for _, d := range todo {
			if _, err := tx.Exec(ctx, `SELECT truncate_local_data_after_distributing_table($1)`, d.Table); err != nil {
				return fmt.Errorf("citus: remove %s's local rows after distributing it: %w", d.Table, err)
			}
		}
		for _, r := range CitusReference {
			ok, err := placedAlready(r)
			if err != nil {
				return err
			}
			if ok {
				continue
			}
			if _, err := tx.Exec(ctx, `SELECT create_reference_table($1)`, r); err != nil {
				return fmt.Errorf("citus: reference table %s: %w", r, err)
			}
			placed = append(placed, r+" (reference)")
		}
		return nil
	})
	return placed, err
}

func joinCols(cols []string) string {
	s := ""
	for i, c := range cols {
		if i > 0 {
			s += ", "
		}
		s += c
	}
	return s
}

// CitusPlacement counts the tables of this schema that Citus distributes and those it
// copies as reference tables (0, 0 on a plain PostgreSQL).
func (s *Store) CitusPlacement(ctx context.Context) (distributed, reference int, err error) {
	citus, err := s.IsCitus(ctx)
	if err != nil || !citus {
		return 0, 0, err
	}
	err = s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE partmethod = 'h'), count(*) FILTER (WHERE partmethod = 'n' AND repmodel = 't')
		FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
		WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())`).Scan(&distributed, &reference)
	return distributed, reference, err
}

// On Citus, Citus refuses FOR UPDATE on a statement that reaches several shards, and a
// LIMIT inside a LATERAL probe over a function's rows (the lease's per-type caps): the
// statements that take due rows of any run (EffectLease, EffectClaimUnknown,
// EffectClaimRecheck) are then two steps. A multi-shard read without locks picks the
// candidates (each shard reads its partial index up to the limit, the coordinator merges)
// and names each one's shard; then, shard by shard in the candidates' order, one statement
// routed to that shard takes those of them still due with FOR UPDATE SKIP LOCKED and
// updates them — a compare-and-set, so two dispatchers that read the same candidates
// never both take one: the second skips it, or finds it taken. The read takes twice the
// caps, so candidates another dispatcher took leave room for the spares.

// citusCandidate is a due row of effects read by the multi-shard step, with its shard.
type citusCandidate struct {
	id, key, actionType string
	shard               int64
}

// citusTakeByShard groups cands (in the order read) by shard and calls take once per
// shard, in the order each shard's first candidate was read, with the candidates that still
// fit: per action type no more than caps allows (nil: no caps), in all no more than limit.
// take returns what it took (fewer when another dispatcher was first); what is left of the
// caps goes to the next shards' candidates.
func citusTakeByShard(cands []citusCandidate, caps map[string]int, limit int, take func(keys, ids []string) ([]store.Effect, error)) ([]store.Effect, error) {
	var order []int64
	byShard := map[int64][]citusCandidate{}
	for _, c := range cands {
		if _, ok := byShard[c.shard]; !ok {
			order = append(order, c.shard)
		}
		byShard[c.shard] = append(byShard[c.shard], c)
	}
	left := map[string]int{}
	for t, n := range caps {
		left[t] = n
	}
	var out []store.Effect
	for _, sh := range order {
		if len(out) >= limit {
			break
		}
		var keys, ids []string
		want := map[string]int{}
		for _, c := range byShard[sh] {
			if len(out)+len(ids) >= limit {
				break
			}
			if caps != nil && want[c.actionType] >= left[c.actionType] {
				continue
			}
			want[c.actionType]++
			keys, ids = append(keys, c.key), append(ids, c.id)
		}
		if len(ids) == 0 {
			continue
		}
		got, err := take(keys, ids)
		if err != nil {
			return out, err
		}
		for _, e := range got {
			left[e.ActionType]--
		}
		out = append(out, got...)
	}
	return out, nil
}

func collectCandidates(rows pgx.Rows, err error) ([]citusCandidate, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (citusCandidate, error) {
		var c citusCandidate
		err := r.Scan(&c.id, &c.key, &c.actionType, &c.shard)
		return c, err
	})
}

// citusCandidatesOf wraps a multi-shard read of (id, idempotency_key, action_type) with
// each row's shard, computed on the coordinator from the merged rows.
func citusCandidatesOf(read string) string {
	return `SELECT c.id, c.idempotency_key, c.action_type,
		  get_shard_id_for_distribution_column('effects', c.idempotency_key)
		FROM (` + read + `) c`
}

// citusLeaseSQL is the lease's read on Citus for n action types: one branch per type up
// to twice its cap (Citus plans each branch as a multi-shard read whose rows it merges on
// the coordinator), then the oldest up to twice the limit. $1 executor, $2 now, $3 limit,
// then each type's name and cap.
func citusLeaseSQL(n int) string {
	citusLeaseMu.Lock()
	defer citusLeaseMu.Unlock()
	if s, ok := citusLeaseCache[n]; ok {
		return s
	}
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		fmt.Fprintf(&b, `(SELECT id, idempotency_key, action_type, not_before FROM effects
			WHERE state = 'pending' AND executor = $1 AND action_type = $%d
			  AND not_before <= airlock_now($2::timestamptz)
			ORDER BY not_before LIMIT 2 * $%d::int)`, 4+2*i, 5+2*i)
	}
	s := citusCandidatesOf(`SELECT * FROM (` + b.String() + `) u ORDER BY not_before LIMIT 2 * $3::int`)
	citusLeaseCache[n] = s
	return s
}

var (
	citusLeaseMu    sync.Mutex
	citusLeaseCache = map[int]string{}
)

// citusLeaseTakeSQL leases the candidates of one shard still due: $1 executor, $2 types,
// $3 owner, $4 lease in microseconds, $5 now, $6 keys (all on that shard, which routes the
// statement there), $7 ids.
var citusLeaseTakeSQL onceString

func (q queries) effectLeaseCitus(ctx context.Context, p store.EffectLeaseParams, types []string, caps []int32) ([]store.Effect, error) {
	args := []any{p.Executor, p.Now, p.Limit}
	capOf := make(map[string]int, len(types))
	for i, t := range types {
		args = append(args, t, caps[i])
		capOf[t] = int(caps[i])
	}
	cands, err := collectCandidates(q.db.Query(ctx, citusLeaseSQL(len(types)), args...))
	if err != nil {
		return nil, fmt.Errorf("lease effects: read due effects: %w", err)
	}
	sql := citusLeaseTakeSQL.get(func() string {
		return `
			WITH due AS (
			  SELECT id FROM effects
			  WHERE idempotency_key = ANY($6) AND id = ANY($7)
			    AND state = 'pending' AND executor = $1 AND action_type = ANY($2)
			    AND not_before <= airlock_now($5::timestamptz)
			  FOR UPDATE SKIP LOCKED
			)
			UPDATE effects e
			SET state = 'sending', lease_owner = $3, attempts = e.attempts + 1, send_started_at = NULL, version = e.version + 1,
			    lease_expires_at = airlock_now($5::timestamptz) + $4::bigint * interval '1 microsecond',
			    updated_at = airlock_now($5::timestamptz)
			FROM due WHERE e.idempotency_key = ANY($6) AND e.id = due.id
			RETURNING ` + prefixed("e.", effectColumns)
	})
	return citusTakeByShard(cands, capOf, p.Limit, func(keys, ids []string) ([]store.Effect, error) {
		return collectEffects(q.db.Query(ctx, sql, p.Executor, types, p.Owner, micros(p.Lease), p.Now, keys, ids))
	})
}

// effectClaimCitus is EffectClaimUnknown's and EffectClaimRecheck's form on Citus: read
// (a multi-shard read of id, idempotency_key, action_type in claim order, $1 types, $2
// now, $3 limit), then claim shard by shard: the rows of $4 keys and $5 ids that still
// match cond ($1 types, $2 now), pushed back by $3 microseconds.
func (q queries) effectClaimCitus(ctx context.Context, read, cond string, types []string, now *time.Time, claim time.Duration, limit int) ([]store.Effect, error) {
	cands, err := collectCandidates(q.db.Query(ctx, citusCandidatesOf(read), types, now, 2*limit))
	if err != nil {
		return nil, err
	}
	sql := `
		WITH due AS (
		  SELECT id FROM effects
		  WHERE idempotency_key = ANY($4) AND id = ANY($5) AND executor = 'dispatcher' AND action_type = ANY($1)
		    AND ` + cond + `
		  FOR UPDATE SKIP LOCKED
		)
		UPDATE effects e SET next_check_at = airlock_now($2::timestamptz) + $3::bigint * interval '1 microsecond',
		  version = e.version + 1
		FROM due WHERE e.idempotency_key = ANY($4) AND e.id = due.id
		RETURNING ` + prefixed("e.", effectColumns)
	return citusTakeByShard(cands, nil, limit, func(keys, ids []string) ([]store.Effect, error) {
		return collectEffects(q.db.Query(ctx, sql, types, now, micros(claim), keys, ids))
	})
}

// runLockKeysCitus locks the runs one statement each, in key order: each is routed to its
// run's shard (Citus refuses one FOR UPDATE across shards); the transaction then spans
// their workers and commits with two-phase commit.
func (q queries) runLockKeysCitus(ctx context.Context, keys []string) (map[string]store.Run, error) {
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	out := make(map[string]store.Run, len(sorted))
	for _, k := range sorted {
		r, err := scanRun(q.db.QueryRow(ctx, `SELECT `+runColumns+` FROM workflow_runs
			WHERE idempotency_key = $1 FOR UPDATE`, k))
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lock runs: %w", err)
		}
		out[r.Key] = r
	}
	return out, nil
}

// alertOutboxTakeCitus is AlertOutboxTake on Citus, in the two steps of the lease: the
// oldest rows of every shard (a multi-shard read without locks), then, shard by shard, a
// statement routed there that locks those still present with SKIP LOCKED. The rows come
// back oldest first, as on one PostgreSQL; a relay that read the same rows as another
// gets those the other did not lock.
func (q queries) alertOutboxTakeCitus(ctx context.Context, limit int) ([]store.Event, error) {
	rows, err := q.db.Query(ctx, `SELECT c.event_id, c.run_key, get_shard_id_for_distribution_column('alert_outbox', c.run_key)
		FROM (SELECT event_id, run_key FROM alert_outbox ORDER BY event_id LIMIT $1) c`, limit)
	if err != nil {
		return nil, fmt.Errorf("take alert outbox: %w", err)
	}
	type cand struct {
		id    int64
		key   string
		shard int64
	}
	cands, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cand, error) {
		var c cand
		err := r.Scan(&c.id, &c.key, &c.shard)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("take alert outbox: %w", err)
	}
	var order []int64
	byShard := map[int64][]cand{}
	for _, c := range cands {
		if _, ok := byShard[c.shard]; !ok {
			order = append(order, c.shard)
		}
		byShard[c.shard] = append(byShard[c.shard], c)
	}
	var out []store.Event
	for _, sh := range order {
		keys, ids := make([]string, 0, len(byShard[sh])), make([]int64, 0, len(byShard[sh]))
		for _, c := range byShard[sh] {
			keys, ids = append(keys, c.key), append(ids, c.id)
		}
		evs, err := collectAlerts(q.db.Query(ctx, `SELECT event_id, run_key, at, detail FROM alert_outbox
			WHERE run_key = ANY($1) AND event_id = ANY($2) FOR UPDATE SKIP LOCKED`, keys, ids))
		if err != nil {
			return nil, fmt.Errorf("take alert outbox: %w", err)
		}
		out = append(out, evs...)
	}
	slices.SortFunc(out, func(a, b store.Event) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// eventListCitus is EventList's statement on Citus, in two: Citus cannot plan
// pg_snapshot_xip in a statement routed to a worker, and the horizon belongs to the
// coordinator anyway. An event's xid is the coordinator's transaction id (Citus evaluates
// the column's default, pg_current_xact_id(), there before it routes the insert; checked by
// TestCitusEventOrder), and every writing transaction holds its locks on the coordinator's
// tables, so the horizon is read there first (a statement on no distributed table runs on
// the coordinator), then the page, routed to the run's worker, below it. The page's
// snapshot is later than the horizon's: a transaction below the horizon had ended before
// the horizon was read, so its events are in the page's snapshot.
//
// What this cannot see: a transaction that wrote to several workers commits with two-phase
// commit, the coordinator first, then COMMIT PREPARED on each worker; between the two its
// events are below the horizon but not yet visible (docs/scaling.md, "What was tried").
func (q queries) eventListCitus(ctx context.Context, key string, afterID int64, limit int) (pgx.Rows, error) {
	var xmin string
	if err := q.db.QueryRow(ctx, `SELECT xmin::text FROM (`+eventHorizonSQL+`) h`).Scan(&xmin); err != nil {
		return nil, err
	}
	return q.db.Query(ctx, `
		WITH cursor AS (SELECT xid FROM events WHERE run_key = $1 AND id = $2),
		horizon AS (SELECT $4::xid8 AS xmin),`+eventPageSQL, key, afterID, limit, xmin)
}

// citusRowKey names a row of each table Purge batches that is not on the coordinator
// alone (a distributed or reference table on Citus): its primary key, which a batch names
// its rows by there instead of ctid.
var citusRowKey = map[string]string{
	"effects":       "(idempotency_key, id)",
	"approvals":     "(idempotency_key, id)",
	"validations":   "(idempotency_key, id)",
	"workflow_runs": "idempotency_key",
	"ledgers":       "idempotency_key",
	"events":        "(run_key, id)",
	"people_seen":   "subject",
}

// chainBasesCitus moves the purged runs' chain bases one statement each, in key order:
// each is routed to its run's shard, and its row
// lock taken in the order writers take them, where one statement over the runs would need
// a FOR UPDATE across shards, which Citus refuses.
func (q queries) chainBasesCitus(ctx context.Context, keys []string, seqs []int64, hashes []string, ats []int64, macKeys, macs []*string) error {
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
	for _, i := range idx {
		// The head is in the run's row (0035) or in event_chains; the other statement
		// finds nothing.
		if _, err := q.db.Exec(ctx, `UPDATE workflow_runs SET chain_base_seq = $2, chain_base_hash = $3,
			  chain_base_at = timestamptz 'epoch' + $4::bigint * interval '1 microsecond', chain_base_mac_key = $5, chain_base_mac = $6
			WHERE idempotency_key = $1 AND chain_seq IS NOT NULL AND coalesce(chain_base_seq, 0) < $2`,
			keys[i], seqs[i], hashes[i], ats[i], macKeys[i], macs[i]); err != nil {
			return err
		}
		if _, err := q.db.Exec(ctx, `UPDATE event_chains SET base_seq = $2, base_hash = $3,
			  base_at = timestamptz 'epoch' + $4::bigint * interval '1 microsecond', base_mac_key = $5, base_mac = $6
			WHERE run_key = $1 AND base_seq < $2`, keys[i], seqs[i], hashes[i], ats[i], macKeys[i], macs[i]); err != nil {
			return err
		}
	}
	return nil
}

// ShardedByRun reports whether the database is a Citus coordinator (store.RunSharded).
func (s *Store) ShardedByRun() bool { return s.citus }

// CitusHealth is what `airlock verify` checks of a Citus cluster: whether the database is
// a coordinator at all, its primary workers, the ones the coordinator cannot reach or has
// marked inactive (a statement routed to one of their shards fails), and the two-phase
// commits left unresolved. It first asks Citus to recover prepared transactions (what its
// maintenance daemon does every citus.recover_2pc_interval: commit those whose
// coordinator transaction committed, roll back the rest); pending counts those still
// recorded after it, which a worker that cannot be reached keeps.
func (s *Store) CitusHealth(ctx context.Context) (h CitusHealth, err error) {
	if h.Citus, err = s.IsCitus(ctx); err != nil || !h.Citus {
		return h, err
	}
	rows, err := s.pool.Query(ctx, `SELECT nodename || ':' || nodeport, isactive FROM pg_dist_node
		WHERE noderole = 'primary' AND groupid <> 0 ORDER BY nodeid`)
	if err != nil {
		return h, fmt.Errorf("citus: list workers: %w", err)
	}
	var inactive []string
	var name string
	var active bool
	_, err = pgx.ForEachRow(rows, []any{&name, &active}, func() error {
		h.Workers = append(h.Workers, name)
		if !active {
			inactive = append(inactive, name)
		}
		return nil
	})
	if err != nil {
		return h, fmt.Errorf("citus: list workers: %w", err)
	}
	// Reachability, each worker probed from the coordinator with a short timeout.
	for _, w := range h.Workers {
		host, port, _ := strings.Cut(w, ":")
		var ok bool
		if err := s.pool.QueryRow(ctx, `SELECT citus_check_connection_to_node($1, $2::int)`, host, port).Scan(&ok); err != nil || !ok {
			if !slices.Contains(inactive, w) {
				inactive = append(inactive, w)
			}
		}
	}
	h.Unreachable = inactive
	if _, err := s.pool.Exec(ctx, `SELECT recover_prepared_transactions()`); err != nil && len(h.Unreachable) == 0 {
		return h, fmt.Errorf("citus: recover prepared transactions: %w", err)
	}
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_dist_transaction`).Scan(&h.Pending2PC); err != nil {
		return h, fmt.Errorf("citus: read pg_dist_transaction: %w", err)
	}
	return h, nil
}

// CitusHealth is CitusHealth's answer.
type CitusHealth struct {
	Citus       bool     // the database is a Citus coordinator
	Workers     []string // host:port of each primary worker
	Unreachable []string // workers the coordinator cannot reach or has marked inactive
	Pending2PC  int64    // two-phase commits still recorded after recovery
}
