package sqlite_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// openAs is the environment variable that makes this test binary open one file and exit:
// the child process of TestReadOnlyFileRefusedAtOpen.
const openAs = "AIRLOCK_TEST_SQLITE_OPEN"

func TestMain(m *testing.M) {
	if path := os.Getenv(openAs); path != "" {
		st, err := sqlite.Open(context.Background(), path, sqlite.Options{})
		if err != nil {
			io.WriteString(os.Stdout, "open failed: "+err.Error())
			os.Exit(3)
		}
		st.Close()
		io.WriteString(os.Stdout, "opened")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A database file airlock may not write used to be opened read-only, every write then
// failed, and SQLite left a 0444 -shm file behind that broke the next start.
// Open refuses it with a clear message before SQLite creates anything.
//
// File permissions do not stop root, and tests run as root here: the open then happens in
// a child process (this test binary) running as nobody, so the permissions are real.
func TestReadOnlyFileRefusedAtOpen(t *testing.T) {
	dir, err := os.MkdirTemp("", "airlock-ro-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// A directory anyone may write: what lets SQLite create the -shm file in it.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "airlock.db")
	st, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	st.Close()
	for _, side := range []string{"-wal", "-shm"} {
		_ = os.Remove(path + side)
	}
	if err := os.Chmod(path, 0o444); err != nil {
		t.Fatal(err)
	}

	out := openAsNobody(t, dir, path)
	if !strings.Contains(out, "open failed") || !strings.Contains(out, "read-only") {
		t.Errorf("opening a read-only file: %q; want a failure that says read-only", out)
	}
	for _, side := range []string{"-wal", "-shm"} {
		if fi, err := os.Stat(path + side); err == nil {
			t.Errorf("%s left behind (mode %v)", filepath.Base(path+side), fi.Mode())
		}
	}

	// The -shm file such a start left behind, read-only, with the database fixed: refused
	// by name, not "unable to open database file" at the first write.
	if err := os.WriteFile(path+"-shm", make([]byte, 32768), 0o444); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(path, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path+"-shm", 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	out = openAsNobody(t, dir, path)
	if !strings.Contains(out, "open failed") || !strings.Contains(out, "airlock.db-shm is read-only") {
		t.Errorf("opening beside a read-only -shm: %q; want a failure that names it", out)
	}
}

// openAsNobody opens path as a user its permissions apply to: this process when it is not
// root, else a child (this test binary) running as nobody. It returns "opened" or
// "open failed: <error>".
func openAsNobody(t *testing.T, dir, path string) string {
	t.Helper()
	var out string
	if os.Geteuid() == 0 {
		bin := filepath.Join(dir, "sqlite.test")
		self, err := os.ReadFile(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, self, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), openAs+"="+path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		b, err := cmd.Output()
		out = string(b)
		if err != nil && !strings.HasPrefix(out, "open failed") {
			t.Fatalf("child as nobody: %v %s", err, out)
		}
		_ = os.Remove(bin)
	} else {
		st, err := sqlite.Open(context.Background(), path, sqlite.Options{})
		if err == nil {
			st.Close()
			out = "opened"
		} else {
			out = "open failed: " + err.Error()
		}
	}
	return out
}
