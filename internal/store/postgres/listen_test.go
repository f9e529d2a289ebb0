package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// The LISTEN connection re-LISTENs after its session dies (a failover, a restart, an
// administrator's pg_terminate_backend): NOTIFY wake-ups arrive again on a new session,
// and ListenState (the metrics airlock_effects_listening and
// airlock_effects_notifications_total) says so — also while every connection of the pool
// is busy (before, the LISTEN held one of the pool's connections: "pool connection 16 of
// 16: context deadline exceeded (does the LISTEN hold one of them?)", and waited for one
// after each reconnect).
func TestListenReestablishedAfterSessionEnds(t *testing.T) {
	ctx := context.Background()
	cfg := storetest.NewPostgresSchema(t)
	app := "airlock_listen_" + time.Now().Format("150405.000000")
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	st, err := postgres.OpenConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	admin := storetest.NewPostgresSchema(t) // another schema's pool: a session of its own
	adm, err := postgres.OpenConfig(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()

	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	wakes := make(chan struct{}, 1024)
	go func() {
		defer close(done)
		st.ListenEffects(lctx, func() { wakes <- struct{}{} })
	}()
	defer func() { cancel(); <-done }()

	// listenerPid is the backend holding LISTEN for this store (0 while there is none).
	listenerPid := func() int32 {
		var pid int32
		_ = adm.Pool().QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE application_name = $1 AND query ILIKE 'LISTEN%' AND state = 'idle'`, app).Scan(&pid)
		return pid
	}
	// notified sends NOTIFY (from another session) until ListenState counts one more than
	// before; it fails the test after 30 s without one.
	notified := func(what string) {
		t.Helper()
		_, before := st.ListenState()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := adm.Pool().Exec(ctx, `NOTIFY airlock_effects`); err != nil {
				t.Fatal(err)
			}
			if up, n := st.ListenState(); up && n > before {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no NOTIFY wake-up counted within 30 s (listening %v)", what, func() bool { up, _ := st.ListenState(); return up }())
			}
		}
	}
	notified("first LISTEN")
	first := listenerPid()
	if first == 0 {
		t.Fatal("no session in LISTEN")
	}
	for round := range 3 {
		if _, err := adm.Pool().Exec(ctx, `SELECT pg_terminate_backend($1::int)`, first); err != nil {
			t.Fatal(err)
		}
		notified("after the LISTEN session was terminated")
		again := listenerPid()
		if again == 0 || again == first {
			t.Fatalf("round %d: listener session %d after terminating %d: want a new one", round, again, first)
		}
		first = again
	}
	// Every pool connection busy (as when writers wait for a synchronous standby after a
	// failover): the LISTEN still comes back, on a connection of its own.
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for i := range st.Pool().Config().MaxConns {
		actx, acancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := st.Pool().Acquire(actx)
		acancel()
		if err != nil {
			t.Fatalf("pool connection %d of %d: %v (does the LISTEN hold one of them?)", i+1, st.Pool().Config().MaxConns, err)
		}
		held = append(held, c)
	}
	if _, err := adm.Pool().Exec(ctx, `SELECT pg_terminate_backend($1::int)`, first); err != nil {
		t.Fatal(err)
	}
	notified("after the LISTEN session was terminated, with every pool connection busy")
	if up, n := st.ListenState(); !up || n < 5 {
		t.Fatalf("ListenState = %v, %d; want listening with at least 5 notifications", up, n)
	}
}
