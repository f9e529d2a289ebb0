package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

// pgBouncer is a real PgBouncer in transaction pooling mode in front of the test
// PostgreSQL, for one fresh database: pooled reaches it through the pooler, direct past it.
type pgBouncer struct {
	pooled, direct string
}

// startPgBouncer starts PgBouncer (pool_mode=transaction, max 4 server connections) on a
// free loopback port. No pgbouncer binary: skipped with a message, failed under CI=true.
func startPgBouncer(t *testing.T) pgBouncer {
	t.Helper()
	upstream := storetest.PostgresURL(t)
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr == nil {
			bin, err = "/usr/sbin/pgbouncer", nil
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("pgbouncer not found: under CI the pooler tests must run (.ci/run installs it: apt-get install -y pgbouncer)")
		}
		t.Skip("pgbouncer not found: pooler tests skipped (apt-get install -y pgbouncer)")
	}
	pc, err := pgconn.ParseConfig(upstream)
	if err != nil {
		t.Fatal(err)
	}
	// A database of its own: PgBouncer passes no search_path, so no per-test schema.
	var b [4]byte
	_, _ = rand.Read(b[:])
	db := "airlock_pgb_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, upstream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)

	dir, err := os.MkdirTemp("", "airlock-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755) // PgBouncer refuses root: as root it runs as postgres
	port := freePort(t)
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%d dbname=%s user=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 4
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
`, db, pc.Host, pc.Port, db, pc.User, port)
	path := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(path, []byte(ini), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, path)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, PgBouncer needs another user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		os.RemoveAll(dir)
		if admin, err := pgx.Connect(context.Background(), upstream); err == nil {
			_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
			admin.Close(context.Background())
		}
		if t.Failed() {
			t.Logf("pgbouncer log:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer did not listen on %d: %v\n%s", port, err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	direct := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pc.User, net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))), db)
	return pgBouncer{
		pooled: fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", pc.User, port, db),
		direct: direct,
	}
}

// serveBriefly runs serve for at most 20 s (a serve that did not refuse to start is
// stopped with SIGTERM then) and returns its stderr.
func serveBriefly(t *testing.T, env []string) (string, error) {
	t.Helper()
	cmd := exec.Command(binary, "serve")
	cmd.Env = append(os.Environ(), append(env, "AIRLOCK_LISTEN=127.0.0.1:0")...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return errb.String(), err
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
		return errb.String(), nil // it served: no refusal
	}
}

// Behind PgBouncer in transaction pooling mode: serve with pgx's defaults refuses to
// start and says what to set; verify with named statements off but LISTEN through the
// pooler fails its LISTEN and pooler checks; set up as documented (exec mode, a direct
// LISTEN connection) serve runs through the pooler and verify passes every check,
// concurrent claims through the HTTP API included.
func TestPgBouncerTransactionPooling(t *testing.T) {
	pgb := startPgBouncer(t)
	if _, stderr, err := airlock(t, []string{"AIRLOCK_DATABASE_URL=" + pgb.direct}, "migrate"); err != nil {
		t.Fatalf("migrate: %v\n%s", err, stderr)
	}

	t.Run("serve refuses pgx defaults", func(t *testing.T) {
		stderr, err := serveBriefly(t, []string{"AIRLOCK_DATABASE_URL=" + pgb.pooled})
		if err == nil {
			t.Fatal("serve started behind a transaction pooler with named prepared statements")
		}
		for _, want := range []string{"pooler in transaction mode", "AIRLOCK_DATABASE_QUERY_MODE=exec", "AIRLOCK_LISTEN_DATABASE_URL"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("serve's refusal does not say %q:\n%s", want, stderr)
			}
		}
	})

	t.Run("serve refuses LISTEN through the pooler", func(t *testing.T) {
		stderr, err := serveBriefly(t, []string{"AIRLOCK_DATABASE_URL=" + pgb.pooled, "AIRLOCK_DATABASE_QUERY_MODE=exec"})
		if err == nil || !strings.Contains(stderr, "AIRLOCK_LISTEN_DATABASE_URL") || strings.Contains(stderr, "AIRLOCK_DATABASE_QUERY_MODE=exec") {
			t.Fatalf("err %v, stderr:\n%s", err, stderr)
		}
	})

	t.Run("verify fails LISTEN through the pooler", func(t *testing.T) {
		out, _, err := airlock(t, []string{"AIRLOCK_DATABASE_URL=" + pgb.pooled, "AIRLOCK_DATABASE_QUERY_MODE=exec"}, "verify", "--wait=2s")
		if err == nil {
			t.Fatalf("verify passed with LISTEN through a transaction pooler:\n%s", out)
		}
		got := verifyLines(t, out)
		for c, want := range map[string]string{"listen-notify": "FAIL", "pooler": "FAIL", "concurrent-claims": "PASS",
			"advisory-locks": "PASS", "isolation-level": "PASS", "cleanup": "PASS"} {
			if got[c] != want {
				t.Errorf("%s: %s, want %s\n%s", c, got[c], want, out)
			}
		}
		if !strings.Contains(out, "fix: behind a pooler in transaction mode set AIRLOCK_LISTEN_DATABASE_URL") {
			t.Errorf("no fix naming AIRLOCK_LISTEN_DATABASE_URL:\n%s", out)
		}
	})

	t.Run("works when set up for it", func(t *testing.T) {
		env := []string{"AIRLOCK_DATABASE_URL=" + pgb.pooled, "AIRLOCK_DATABASE_QUERY_MODE=exec", "AIRLOCK_LISTEN_DATABASE_URL=" + pgb.direct}
		key, stderr, err := airlock(t, env, "apikey", "create", "--name", "verify", "--scope", "runs")
		if err != nil {
			t.Fatalf("apikey create through the pooler: %v\n%s", err, stderr)
		}
		base := serveProcess(t, env)
		out, stderr, err := airlock(t, env, "verify", "--http-url", base, "--api-key", strings.TrimSpace(key))
		if err != nil {
			t.Fatalf("verify: %v\n%s\n%s", err, out, stderr)
		}
		got := verifyLines(t, out)
		for _, c := range verifyChecks {
			if c == "citus" && got[c] == "SKIP" { // one PostgreSQL behind the pooler, not Citus
				continue
			}
			if got[c] != "PASS" {
				t.Errorf("%s: %s, want PASS\n%s", c, got[c], out)
			}
		}
		if !strings.Contains(out, "multiplexes sessions") {
			t.Errorf("verify did not see the pooler:\n%s", out)
		}
	})
}
