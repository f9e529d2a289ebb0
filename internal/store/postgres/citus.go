package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
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
		if err := exec(`CREATE OR REPLACE FUNCTION airlock_now(t timestamptz) RETURNS timestamptz
			LANGUAGE plpgsql STABLE AS 'BEGIN RETURN coalesce(t, now()); END'`); err != nil {
			return err
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
