package main

// verify's replication checks: an acknowledged write must survive the failover a
// highly available PostgreSQL is there for. With asynchronous replication it need not,
// and it is worse than lost durability for airlock: an effect sent on the old primary
// whose `completed` had not reached the standby is pending again on the new one, and is
// sent again.

import (
	"context"
	"fmt"
	"strings"

	"github.com/airlockhq/airlock/internal/store/postgres"
)

type replicationReader interface {
	Replication(ctx context.Context) (postgres.Replication, error)
}

// asyncConsequence is what an asynchronous standby costs when it is promoted.
const asyncConsequence = "a failover to it loses acknowledged writes and can send effects twice (an effect sent on the old primary whose completion had not reached the standby is pending again on the new one)"

// fixSynchronous is how to make a standby synchronous.
const fixSynchronous = "with Patroni set synchronous_mode: true and synchronous_mode_strict: true (patronictl edit-config); otherwise set synchronous_standby_names to the standbys' application_name (e.g. 'FIRST 1 (standby1)') and reload"

func (v *verifyRun) readReplication(ctx context.Context) (postgres.Replication, *verifyResult) {
	rr, ok := v.st.(replicationReader)
	if !ok {
		r := skip("SQLite: one file on one host; there is no replication (back the file up)")
		return postgres.Replication{}, &r
	}
	rep, err := rr.Replication(ctx)
	if err != nil {
		r := fail("see the error", "%v", err)
		return rep, &r
	}
	return rep, nil
}

func (v *verifyRun) replication(ctx context.Context) verifyResult {
	rep, r := v.readReplication(ctx)
	if r != nil {
		return *r
	}
	return judgeReplication(rep)
}

func (v *verifyRun) synchronousCommit(ctx context.Context) verifyResult {
	rep, r := v.readReplication(ctx)
	if r != nil {
		return *r
	}
	return judgeSynchronousCommit(rep)
}

// judgeReplication decides the replication line from what the server says.
func judgeReplication(rep postgres.Replication) verifyResult {
	if rep.InRecovery {
		return fail("point AIRLOCK_DATABASE_URL at the primary (several hosts: add target_session_attrs=read-write; with Patroni, its primary service or VIP)",
			"connected to a standby (pg_is_in_recovery() is true): it refuses airlock's writes, and what it shows lags the primary")
	}
	names := strings.TrimSpace(rep.StandbyNames)
	var sync, others, async, unseen []string
	for _, s := range rep.Standbys {
		desc := fmt.Sprintf("%s (%s, %s)", orUnnamed(s.Name), orUnknown(s.State), orUnknown(s.SyncState))
		switch s.SyncState {
		case "sync", "quorum":
			sync = append(sync, desc)
		case "":
			unseen = append(unseen, desc)
			others = append(others, desc)
		case "async":
			async = append(async, desc)
			others = append(others, desc)
		default: // potential: takes over if a synchronous one goes
			others = append(others, desc)
		}
	}
	switch {
	case len(rep.Standbys) == 0 && names != "":
		return warn("start the standby, or empty synchronous_standby_names if this server is meant to run alone (with Patroni: synchronous_mode_strict waits for a standby by design)",
			"synchronous_standby_names is %q but no standby is connected: every commit waits until one is (Patroni's synchronous_mode_strict does this on purpose), so airlock's writes hang and /readyz answers 503 until a standby is back", names)
	case len(rep.Standbys) == 0 && len(rep.IdleSlots) > 0:
		return warn(fixSynchronous,
			"no standby streams from this server now, but physical replication slots %s wait for one, and synchronous_standby_names is empty: when it streams again it is asynchronous, and %s",
			strings.Join(rep.IdleSlots, ", "), asyncConsequence)
	case len(rep.Standbys) == 0:
		return pass("no standby streams from this server: acknowledged writes are as durable as this one server (its disk, backups and WAL archive); a standby added later must be synchronous (synchronous_standby_names)")
	case len(sync) > 0 && len(async) > 0:
		return pass("synchronous standby %s: a commit is acknowledged once it has the WAL (synchronous_standby_names %q); %s stream asynchronously: never promote them (Patroni does not in synchronous_mode)",
			strings.Join(sync, ", "), names, strings.Join(async, ", "))
	case len(sync) > 0:
		return pass("synchronous standby %s: a commit is acknowledged once it has the WAL (synchronous_standby_names %q)", strings.Join(sync, ", "), names)
	case names == "":
		return fail(fixSynchronous,
			"%d standby(s) stream from this server, %s, and synchronous_standby_names is empty: replication is asynchronous, so %s",
			len(rep.Standbys), strings.Join(others, ", "), asyncConsequence)
	case len(unseen) > 0:
		return warn("grant the role verify runs as pg_monitor (or pg_read_all_stats) and run it again",
			"synchronous_standby_names is %q and standby(s) %s stream, but this role may not see their sync_state: whether one is synchronous is not known", names, strings.Join(unseen, ", "))
	default:
		return fail("name the standbys' application_name in synchronous_standby_names and reload (with Patroni, synchronous_mode: true manages it)",
			"synchronous_standby_names is %q but no connected standby is synchronous, %s: commits wait for a standby that is not there, and the ones that are replicate asynchronously, so %s",
			names, strings.Join(others, ", "), asyncConsequence)
	}
}

// judgeSynchronousCommit decides the synchronous-commit line: the setting airlock's own
// sessions get (a role's or database's setting overrides the server's).
func judgeSynchronousCommit(rep postgres.Replication) verifyResult {
	named := strings.TrimSpace(rep.StandbyNames) != ""
	synced := false
	for _, s := range rep.Standbys {
		synced = synced || s.SyncState == "sync" || s.SyncState == "quorum"
	}
	origin, fix := syncCommitOrigin(rep)
	setting := fmt.Sprintf("synchronous_commit is %s for airlock's sessions (role %s, database %s)%s", rep.SyncCommit, rep.Role, rep.Database, origin)
	switch rep.SyncCommit {
	case "on", "remote_apply":
		where := ""
		if synced {
			where = " here and on the synchronous standby"
		}
		return pass("%s: a commit is acknowledged once its WAL is flushed%s", setting, where)
	case "off":
		return fail(fix, "%s: a commit is acknowledged before its WAL is flushed, so a crash loses acknowledged writes and can send effects twice (an effect whose completion was lost is pending again)", setting)
	case "local":
		if named || len(rep.Standbys) > 0 {
			return fail(fix, "%s: commits do not wait for a synchronous standby, even one named in synchronous_standby_names, so %s", setting, asyncConsequence)
		}
		return warn(fix, "%s: the same as on while no standby streams, but once a synchronous one does, commits will not wait for it", setting)
	case "remote_write":
		if named {
			return warn(fix, "%s: a commit is acknowledged once the synchronous standby has written its WAL but before it is flushed there; the primary lost together with a crash of the standby's host loses it", setting)
		}
		return pass("%s: the same as on while no standby is synchronous", setting)
	}
	return warn(fix, "%s: not a value this check knows", setting)
}

// syncCommitOrigin says where airlock's sessions get synchronous_commit from, when not
// from the server's configuration, and how to set it back.
func syncCommitOrigin(rep postgres.Replication) (origin, fix string) {
	server := ""
	if rep.SyncCommitServer != "" && rep.SyncCommitServer != rep.SyncCommit {
		server = fmt.Sprintf(", overriding %s in the server's configuration", rep.SyncCommitServer)
	}
	switch rep.SyncCommitSource {
	case "user":
		return fmt.Sprintf(", set by ALTER ROLE %s SET%s", rep.Role, server), fmt.Sprintf("ALTER ROLE %s RESET synchronous_commit", rep.Role)
	case "database":
		return fmt.Sprintf(", set by ALTER DATABASE %s SET%s", rep.Database, server), fmt.Sprintf("ALTER DATABASE %s RESET synchronous_commit", rep.Database)
	case "database user":
		return fmt.Sprintf(", set by ALTER ROLE %s IN DATABASE %s SET%s", rep.Role, rep.Database, server),
			fmt.Sprintf("ALTER ROLE %s IN DATABASE %s RESET synchronous_commit", rep.Role, rep.Database)
	case "client":
		return fmt.Sprintf(", set by the connection string (options or PGOPTIONS)%s", server), "remove synchronous_commit from AIRLOCK_DATABASE_URL's options (and PGOPTIONS)"
	}
	return "", "set synchronous_commit = on in postgresql.conf (Patroni: postgresql.parameters) and reload"
}

func orUnnamed(s string) string {
	if s == "" {
		return "(no application_name)"
	}
	return s
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
