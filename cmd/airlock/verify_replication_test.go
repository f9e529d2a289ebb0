package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store/postgres"
)

// newPGStandby clones primary with pg_basebackup -R and starts it as a streaming standby
// whose application_name is name; it is stopped and removed when t ends.
func newPGStandby(t *testing.T, primary *pgCluster, name string) *pgCluster {
	t.Helper()
	c := newPGClusterDir(t)
	c.run("pg_basebackup", "-h", "127.0.0.1", "-p", fmt.Sprint(primary.port), "-U", "postgres",
		"-D", c.data(), "-R", "-X", "stream", "--checkpoint=fast", "--no-sync")
	// Without application_name in primary_conninfo the WAL receiver goes by cluster_name.
	c.opts = "-c cluster_name=" + name
	c.start()
	return c
}

// pgExec runs statements on the server at url, each in its own transaction.
func pgExec(t *testing.T, url string, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// waitSyncState waits until the primary reports standby name streaming with sync_state want.
func waitSyncState(t *testing.T, url, name, want string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var state string
		err := conn.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`, name).Scan(&state)
		if err == nil && state == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("standby %s not streaming with sync_state %s within 20s (last: %q, %v)", name, want, state, err)
		}
		time.Sleep(50 * time.Millisecond) // replication state has no signal to wait on
	}
}

// replicationChecks runs verify's two replication checks in process against url, in a
// fresh pool (role and database settings apply to new sessions).
func replicationChecks(t *testing.T, url string) (repl, commit verifyResult) {
	t.Helper()
	ctx := context.Background()
	st, err := postgres.OpenWith(ctx, url, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	v := &verifyRun{st: st}
	return v.replication(ctx), v.synchronousCommit(ctx)
}

// The outside probe's cluster: a primary with an asynchronous streaming standby. verify
// used to pass it; a failover there loses acknowledged writes and sends effects twice.
// Now verify fails naming synchronous_standby_names; with the standby named there it
// passes; synchronous_commit=local for airlock's role fails; verify connected to the
// standby fails; and with the named standby gone it warns that writes will wait.
func TestVerifyReplication(t *testing.T) {
	primary := newPGCluster(t)
	standby := newPGStandby(t, primary, "standby1")
	waitSyncState(t, primary.url(), "standby1", "async")
	env := []string{"AIRLOCK_DATABASE_URL=" + primary.url()}
	if _, stderr, err := airlock(t, env, "migrate"); err != nil {
		t.Fatalf("migrate: %v\n%s", err, stderr)
	}

	t.Run("asynchronous standby fails", func(t *testing.T) {
		out, stderr, err := airlock(t, env, "verify", "--wait=2s")
		if err == nil {
			t.Fatalf("verify passed with an asynchronous standby:\n%s", out)
		}
		if !strings.Contains(stderr, "1 of 15 checks failed") {
			t.Errorf("stderr %q, want 1 of 15 checks failed", stderr)
		}
		t.Log(out)
		got := verifyLines(t, out)
		if got["replication"] != "FAIL" || got["synchronous-commit"] != "PASS" {
			t.Fatalf("replication %s, synchronous-commit %s; want FAIL, PASS:\n%s", got["replication"], got["synchronous-commit"], out)
		}
		line := lineOf(out, "replication")
		for _, want := range []string{"standby1", "synchronous_standby_names is empty", "send effects twice", "synchronous_mode: true", "synchronous_mode_strict: true"} {
			if !strings.Contains(line, want) {
				t.Errorf("replication line lacks %q:\n%s", want, line)
			}
		}
	})

	t.Run("connected to the standby fails", func(t *testing.T) {
		repl, _ := replicationChecks(t, standby.url())
		if repl.Status != "FAIL" || !strings.Contains(repl.Detail, "pg_is_in_recovery") {
			t.Errorf("on the standby: %s %s", repl.Status, repl.Detail)
		}
	})

	pgExec(t, primary.url(), `ALTER SYSTEM SET synchronous_standby_names = 'standby1'`, `SELECT pg_reload_conf()`)
	waitSyncState(t, primary.url(), "standby1", "sync")

	t.Run("synchronous standby passes", func(t *testing.T) {
		out, stderr, err := airlock(t, env, "verify", "--wait=2s")
		if err != nil {
			t.Fatalf("verify: %v\n%s\n%s", err, out, stderr)
		}
		t.Log(out)
		got := verifyLines(t, out)
		if got["replication"] != "PASS" || got["synchronous-commit"] != "PASS" {
			t.Fatalf("replication %s, synchronous-commit %s; want PASS, PASS:\n%s", got["replication"], got["synchronous-commit"], out)
		}
		if line := lineOf(out, "replication"); !strings.Contains(line, "synchronous standby standby1 (streaming, sync)") {
			t.Errorf("replication line does not name the synchronous standby:\n%s", line)
		}
	})

	t.Run("synchronous_commit for the role", func(t *testing.T) {
		for _, c := range []struct{ value, status, says string }{
			{"local", "FAIL", "commits do not wait for a synchronous standby"},
			{"remote_write", "WARN", "before it is flushed there"},
			{"off", "FAIL", "before its WAL is flushed"},
		} {
			pgExec(t, primary.url(), `ALTER ROLE postgres SET synchronous_commit = `+c.value)
			_, commit := replicationChecks(t, primary.url())
			t.Logf("%s %s — fix: %s", commit.Status, commit.Detail, commit.Fix)
			if commit.Status != c.status || !strings.Contains(commit.Detail, c.says) ||
				!strings.Contains(commit.Detail, "synchronous_commit is "+c.value) || !strings.Contains(commit.Detail, "set by ALTER ROLE postgres SET") ||
				commit.Fix != "ALTER ROLE postgres RESET synchronous_commit" {
				t.Errorf("synchronous_commit=%s for the role: %s %s — fix: %s; want %s saying %q", c.value, commit.Status, commit.Detail, commit.Fix, c.status, c.says)
			}
		}
		pgExec(t, primary.url(), `ALTER ROLE postgres RESET synchronous_commit`)
	})

	// What the warning says a missing synchronous standby costs: commits wait, so the
	// readiness write cannot commit and /readyz answers 503 until one is back (here, until
	// synchronous_standby_names is emptied).
	t.Run("named standby gone warns", func(t *testing.T) {
		base := serveProcess(t, env)
		readyz(t, base, http.StatusOK)
		standby.stop("fast")
		repl, _ := replicationChecks(t, primary.url())
		t.Logf("%s %s — fix: %s", repl.Status, repl.Detail, repl.Fix)
		if repl.Status != "WARN" || !strings.Contains(repl.Detail, `synchronous_standby_names is "standby1" but no standby is connected`) {
			t.Errorf("standby stopped: %s %s", repl.Status, repl.Detail)
		}
		readyz(t, base, http.StatusServiceUnavailable)
		pgExec(t, primary.url(), `ALTER SYSTEM RESET synchronous_standby_names`, `SELECT pg_reload_conf()`)
		readyz(t, base, http.StatusOK)
	})
}

// readyz waits up to 10 s for base's /readyz to answer want.
func readyz(t *testing.T, base string, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := 0
		if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(base + "/readyz"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			got = resp.StatusCode
		}
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz answered %d for 10 s, want %d", got, want)
		}
		time.Sleep(100 * time.Millisecond) // /readyz keeps its answer for a second
	}
}

// lineOf is verify's line for check.
func lineOf(out, check string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == check {
			return l
		}
	}
	return ""
}

// The cases the real cluster above does not reach, decided from what the server says.
func TestJudgeReplication(t *testing.T) {
	sb := func(name, syncState string) postgres.Standby {
		return postgres.Standby{Name: name, State: "streaming", SyncState: syncState}
	}
	for _, c := range []struct {
		name         string
		rep          postgres.Replication
		repl, commit string // statuses
		says         string // in the replication line
	}{
		{"single server", postgres.Replication{SyncCommit: "on"}, "PASS", "PASS", "as durable as this one server"},
		{"single server, local", postgres.Replication{SyncCommit: "local"}, "PASS", "WARN", "no standby streams"},
		{"single server, remote_write", postgres.Replication{SyncCommit: "remote_write"}, "PASS", "PASS", "no standby streams"},
		{"standby down, slot kept, asynchronous", postgres.Replication{SyncCommit: "on", IdleSlots: []string{"n2"}}, "WARN", "PASS", "physical replication slots n2"},
		{"named standby not among the connected", postgres.Replication{SyncCommit: "on", StandbyNames: "n3", Standbys: []postgres.Standby{sb("n2", "async")}}, "FAIL", "PASS", "no connected standby is synchronous"},
		{"sync_state hidden from the role", postgres.Replication{SyncCommit: "on", StandbyNames: "n2", Standbys: []postgres.Standby{sb("n2", "")}}, "WARN", "PASS", "may not see their sync_state"},
		{"sync and potential", postgres.Replication{SyncCommit: "remote_apply", StandbyNames: "FIRST 1 (n2, n3)", Standbys: []postgres.Standby{sb("n2", "sync"), sb("n3", "potential")}}, "PASS", "PASS", "synchronous standby n2"},
		{"sync and async", postgres.Replication{SyncCommit: "on", StandbyNames: "n2", Standbys: []postgres.Standby{sb("n2", "sync"), sb("n3", "async")}}, "PASS", "PASS", "never promote them"},
		{"quorum", postgres.Replication{SyncCommit: "on", StandbyNames: "ANY 1 (n2, n3)", Standbys: []postgres.Standby{sb("n2", "quorum"), sb("n3", "quorum")}}, "PASS", "PASS", "synchronous standby n2"},
		{"database override", postgres.Replication{SyncCommit: "off", SyncCommitSource: "database", SyncCommitServer: "on", Database: "airlock"}, "PASS", "FAIL", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			repl, commit := judgeReplication(c.rep), judgeSynchronousCommit(c.rep)
			if repl.Status != c.repl || !strings.Contains(repl.Detail, c.says) {
				t.Errorf("replication %s %s; want %s saying %q", repl.Status, repl.Detail, c.repl, c.says)
			}
			if commit.Status != c.commit {
				t.Errorf("synchronous-commit %s %s; want %s", commit.Status, commit.Detail, c.commit)
			}
		})
	}
	// A database's setting is named with what it overrides, and how to undo it.
	commit := judgeSynchronousCommit(postgres.Replication{SyncCommit: "off", SyncCommitSource: "database", SyncCommitServer: "on", Database: "airlock"})
	if !strings.Contains(commit.Detail, "set by ALTER DATABASE airlock SET, overriding on in the server's configuration") || commit.Fix != "ALTER DATABASE airlock RESET synchronous_commit" {
		t.Errorf("database override: %s — fix: %s", commit.Detail, commit.Fix)
	}
}
