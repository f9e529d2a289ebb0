package runs_test

// Benchmarks of airlock's claim and transition beside the bare SQL statements, on
// every backend, in the same run. Each pair differs only in the code path:
//
//	BenchmarkClaim/<backend>/new                 ↔ BenchmarkClaim/<backend>/raw_sql
//	BenchmarkClaim/<backend>/duplicate           ↔ BenchmarkClaim/<backend>/raw_sql_duplicate
//	BenchmarkTransition/<backend>/airlock        ↔ BenchmarkTransition/<backend>/raw_sql
//	BenchmarkClaimParallel/<backend>/new         ↔ BenchmarkClaimParallel/<backend>/raw_sql
//
// The airlock side is runs.Service (one transaction: the statement, the event, and for a
// transition the open-effects check). The raw_sql side is the one statement a minimal
// implementation would run — an INSERT … ON CONFLICT claim, a compare-and-set UPDATE —
// in autocommit through the driver, on our columns. Both use the backend's real clock
// and a fresh store per benchmark run. Compare figures only within one run: the disk's
// fsync rate swings.
//
//	bash scripts/with-postgres.sh go test -run '^$' -bench . -benchtime 2000x -count 3 ./internal/runs/

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// benchHash stands in for a payload hash (SHA-256, hex).
const benchHash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

// parallelClients is how many goroutines BenchmarkClaimParallel runs, whatever GOMAXPROCS.
const parallelClients = 16

// seedLease is the lease the bare statements hard-code; apptest.LeaseConfig.DefaultLease is
// the same.
const seedLease = 5 * time.Minute

// rawSQL is the bare statements, run in autocommit on one backend.
type rawSQL interface {
	// claim is the one-statement atomic claim; it returns pgx.ErrNoRows / sql.ErrNoRows when
	// the key was not taken.
	claim(ctx context.Context, key, hash, owner string) (version int64, err error)
	// transition is the one-statement compare-and-set.
	transition(ctx context.Context, key, owner string, version int64, to store.State) (int64, error)
	// warm opens n connections so a parallel benchmark does not time the dialing.
	warm(ctx context.Context, n int) error
}

// The bare claim, with created_at/updated_at (NOT NULL here) set like updated_at.
const pgSeedClaim = `
INSERT INTO workflow_runs (
  idempotency_key, state, payload_hash, lease_owner, lease_expires_at, created_at, updated_at
)
VALUES ($1, 'processing', $2, $3, now() + interval '5 minutes', now(), now())
ON CONFLICT (idempotency_key) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner,
    lease_expires_at = EXCLUDED.lease_expires_at,
    state = 'processing',
    version = workflow_runs.version + 1,
    updated_at = now()
WHERE workflow_runs.payload_hash = EXCLUDED.payload_hash
  AND (workflow_runs.state = 'failed_retryable'
       OR (workflow_runs.state = 'processing'
           AND workflow_runs.lease_expires_at < now()))
RETURNING idempotency_key, lease_owner, version`

const pgSeedTransition = `
UPDATE workflow_runs
SET state = $4, version = version + 1, updated_at = now()
WHERE idempotency_key = $1
  AND lease_owner = $2
  AND version = $3
  AND lease_expires_at > now()
RETURNING version`

type pgRaw struct{ st *postgres.Store }

func (p pgRaw) claim(ctx context.Context, key, hash, owner string) (int64, error) {
	var k, o string
	var v int64
	err := p.st.Pool().QueryRow(ctx, pgSeedClaim, key, hash, owner).Scan(&k, &o, &v)
	return v, err
}

func (p pgRaw) transition(ctx context.Context, key, owner string, version int64, to store.State) (int64, error) {
	var v int64
	err := p.st.Pool().QueryRow(ctx, pgSeedTransition, key, owner, version, string(to)).Scan(&v)
	return v, err
}

func (p pgRaw) warm(ctx context.Context, n int) error {
	n = min(n, int(p.st.Pool().Config().MaxConns))
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for range n {
		c, err := p.st.Pool().Acquire(ctx)
		if err != nil {
			return err
		}
		held = append(held, c)
	}
	return nil
}

// The same statements on SQLite: times are INTEGER microseconds from the process clock
// (?4 is now), as the sqlite store does.
const sqliteSeedClaim = `
INSERT INTO workflow_runs (
  idempotency_key, state, payload_hash, lease_owner, lease_expires_at, created_at, updated_at
)
VALUES (?1, 'processing', ?2, ?3, ?4 + ?5, ?4, ?4)
ON CONFLICT (idempotency_key) DO UPDATE
SET lease_owner = excluded.lease_owner,
    lease_expires_at = excluded.lease_expires_at,
    state = 'processing',
    version = workflow_runs.version + 1,
    updated_at = ?4
WHERE workflow_runs.payload_hash = excluded.payload_hash
  AND (workflow_runs.state = 'failed_retryable'
       OR (workflow_runs.state = 'processing'
           AND workflow_runs.lease_expires_at < ?4))
RETURNING idempotency_key, lease_owner, version`

const sqliteSeedTransition = `
UPDATE workflow_runs
SET state = ?4, version = version + 1, updated_at = ?5
WHERE idempotency_key = ?1
  AND lease_owner = ?2
  AND version = ?3
  AND lease_expires_at > ?5
RETURNING version`

type sqliteRaw struct{ st *sqlite.Store }

func (s sqliteRaw) claim(ctx context.Context, key, hash, owner string) (int64, error) {
	var k, o string
	var v int64
	err := s.st.DB().QueryRowContext(ctx, sqliteSeedClaim, key, hash, owner,
		time.Now().UnixMicro(), seedLease.Microseconds()).Scan(&k, &o, &v)
	return v, err
}

func (s sqliteRaw) transition(ctx context.Context, key, owner string, version int64, to store.State) (int64, error) {
	var v int64
	err := s.st.DB().QueryRowContext(ctx, sqliteSeedTransition, key, owner, version, string(to),
		time.Now().UnixMicro()).Scan(&v)
	return v, err
}

func (s sqliteRaw) warm(ctx context.Context, n int) error {
	if m := s.st.DB().Stats().MaxOpenConnections; m > 0 {
		n = min(n, m)
	}
	var held []*sql.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range n {
		c, err := s.st.DB().Conn(ctx)
		if err != nil {
			return err
		}
		held = append(held, c)
	}
	return nil
}

func raw(b *testing.B, st store.Store) rawSQL {
	b.Helper()
	switch s := st.(type) {
	case *postgres.Store:
		return pgRaw{s}
	case *sqlite.Store:
		return sqliteRaw{s}
	}
	b.Fatalf("no raw driver for %T", st)
	return nil
}

// newEnv opens a fresh store with the backend's real clock (nothing faked).
func newEnv(b *testing.B, be storetest.Backend) (*apptest.Env, rawSQL) {
	b.Helper()
	e := apptest.NewEnv(b, be, true)
	return e, raw(b, e.Store)
}

func keys(prefix string, n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return ks
}

func owners(n int) []string {
	ows := make([]string, n)
	for i := range ows {
		ows[i] = uuid.NewString()
	}
	return ows
}

func claimReq(key string) runs.ClaimRequest {
	return runs.ClaimRequest{Key: key, PayloadHash: benchHash, Actor: "bench"}
}

func isNoRows(err error) bool {
	return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows)
}

func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	storetest.EachB(b, func(b *testing.B, be storetest.Backend) {
		// airlock: a fresh key each iteration, claimed.
		b.Run("new", func(b *testing.B) {
			e, _ := newEnv(b, be)
			ks := keys("new", b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				res, err := e.Runs.Claim(ctx, claimReq(ks[i]))
				if err != nil || !res.Claimed {
					b.Fatalf("claim %s: claimed=%v err=%v", ks[i], res.Claimed, err)
				}
			}
		})
		// the bare statement on a fresh key each iteration: the baseline for new.
		b.Run("raw_sql", func(b *testing.B) {
			_, r := newEnv(b, be)
			ks, ows := keys("raw", b.N), owners(b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if v, err := r.claim(ctx, ks[i], benchHash, ows[i]); err != nil || v != 1 {
					b.Fatalf("raw claim %s: version=%d err=%v", ks[i], v, err)
				}
			}
		})
		// airlock: one key with a live lease, claimed again each iteration: refused,
		// counted as a duplicate, and a "duplicate" event written.
		b.Run("duplicate", func(b *testing.B) {
			e, _ := newEnv(b, be)
			if _, err := e.Runs.Claim(ctx, claimReq("dup")); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				res, err := e.Runs.Claim(ctx, claimReq("dup"))
				if err != nil || res.Claimed || res.Run.Duplicates != int64(i+1) {
					b.Fatalf("duplicate claim %d: claimed=%v duplicates=%d err=%v", i, res.Claimed, res.Run.Duplicates, err)
				}
			}
		})
		// the bare statement on that key: it matches no row and returns nothing (its
		// caller would then read the row; that read is not timed here).
		b.Run("raw_sql_duplicate", func(b *testing.B) {
			_, r := newEnv(b, be)
			if _, err := r.claim(ctx, "dup", benchHash, uuid.NewString()); err != nil {
				b.Fatal(err)
			}
			ows := owners(b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := r.claim(ctx, "dup", benchHash, ows[i]); !isNoRows(err) {
					b.Fatalf("raw duplicate claim %d: err=%v, want no rows", i, err)
				}
			}
		})
	})
}

func BenchmarkTransition(b *testing.B) {
	ctx := context.Background()
	storetest.EachB(b, func(b *testing.B, be storetest.Backend) {
		// airlock: b.N keys claimed through the service before the timer; timed is
		// Service.Transition processing → completed (open-effects check, CAS, event).
		b.Run("airlock", func(b *testing.B) {
			e, _ := newEnv(b, be)
			held := make([]store.Run, b.N)
			for i, k := range keys("tr", b.N) {
				res, err := e.Runs.Claim(ctx, claimReq(k))
				if err != nil {
					b.Fatal(err)
				}
				held[i] = res.Run
			}
			b.ReportAllocs()
			b.ResetTimer()
			for _, r := range held {
				run, err := e.Runs.Transition(ctx, runs.TransitionRequest{
					LeaseRequest: runs.LeaseRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version, Actor: "bench"},
					To:           store.StateCompleted,
				})
				if err != nil || run.Version != r.Version+1 {
					b.Fatalf("transition %s: version=%d err=%v", r.Key, run.Version, err)
				}
			}
		})
		// the bare CAS on b.N keys claimed with the bare statement before the timer.
		b.Run("raw_sql", func(b *testing.B) {
			_, r := newEnv(b, be)
			ks, ows := keys("tr", b.N), owners(b.N)
			vs := make([]int64, b.N)
			for i := range ks {
				v, err := r.claim(ctx, ks[i], benchHash, ows[i])
				if err != nil {
					b.Fatal(err)
				}
				vs[i] = v
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range ks {
				v, err := r.transition(ctx, ks[i], ows[i], vs[i], store.StateCompleted)
				if err != nil || v != vs[i]+1 {
					b.Fatalf("raw transition %s: version=%d err=%v", ks[i], v, err)
				}
			}
		})
	})
}

// BenchmarkClaimParallel claims fresh keys from parallelClients goroutines at once:
// airlock's transactions (serialised in Go on SQLite) against the bare autocommit
// statement (serialised by SQLite's file lock and busy handler).
func BenchmarkClaimParallel(b *testing.B) {
	ctx := context.Background()
	parallel := func(b *testing.B, r rawSQL, claim func(i int) error) {
		b.Helper()
		if err := r.warm(ctx, parallelClients); err != nil {
			b.Fatal(err)
		}
		b.SetParallelism((parallelClients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := claim(int(next.Add(1) - 1)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	storetest.EachB(b, func(b *testing.B, be storetest.Backend) {
		b.Run("new", func(b *testing.B) {
			e, r := newEnv(b, be)
			ks := keys("par", b.N)
			parallel(b, r, func(i int) error {
				res, err := e.Runs.Claim(ctx, claimReq(ks[i]))
				if err == nil && !res.Claimed {
					err = fmt.Errorf("claim %s: not claimed", ks[i])
				}
				return err
			})
		})
		b.Run("raw_sql", func(b *testing.B) {
			_, r := newEnv(b, be)
			ks, ows := keys("par", b.N), owners(b.N)
			parallel(b, r, func(i int) error {
				v, err := r.claim(ctx, ks[i], benchHash, ows[i])
				if err == nil && v != 1 {
					err = fmt.Errorf("raw claim %s: version %d", ks[i], v)
				}
				return err
			})
		})
	})
}
