package effects_test

// BenchmarkDispatch times the outbox dispatcher beside the bare statements a dispatcher
// needs, on every backend, in the same run:
//
//	BenchmarkDispatch/<backend>/airlock_1     one effects.Dispatcher calling Tick
//	BenchmarkDispatch/<backend>/airlock_2     two Dispatchers calling Tick concurrently
//	BenchmarkDispatch/<backend>/raw_sql       lease 16 due rows, then one CAS per row
//	BenchmarkDispatch/<backend>/raw_sql_http  raw_sql plus one HTTP POST per row
//
// Each sub-benchmark opens a fresh store with the backend's real clock and puts b.N due
// pending "note" effects in it before the timer; the timer runs until every one is
// completed, and effects/s is b.N over that time. The provider is a local no-op HTTP
// server (200 {"id":"x"}); its client keeps connections alive, and conns reports how
// many TCP connections the provider accepted during the run.
//
// airlock is effects.Dispatcher.Tick: the expired-lease sweep, the lease transaction,
// then per effect the kill-switch read, the send-started mark (its own commit), the
// connector's POST and the outcome's compare-and-set with its event in one transaction.
// raw_sql is the lease statement and the outcome's compare-and-set alone, each in
// autocommit through the driver; raw_sql_http adds the POST, so airlock_1/raw_sql_http is
// airlock's bookkeeping at equal HTTP cost. Compare figures only within one run: the
// disk's fsync rate swings.
//
//	bash scripts/with-postgres.sh go test -run '^$' -bench BenchmarkDispatch -benchtime 2000x -count 3 ./internal/effects/

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/connector/httpconn"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

const (
	dispatchBatch = 16              // effects leased per round, airlock and raw alike
	dispatchLease = 2 * time.Minute // send lease, as in apptest.NewEffectsEnv
	dispatchRuns  = 64              // run keys the effects are spread over
	// dispatchTimeout bounds one sub-benchmark run, so a dispatch that cannot finish
	// fails instead of hanging.
	dispatchTimeout = 5 * time.Minute
)

// noopProvider is a local HTTP provider that accepts every POST at once.
type noopProvider struct {
	srv      *httptest.Server
	client   *http.Client // keep-alive: one connection per concurrent sender
	requests atomic.Int64
	conns    atomic.Int64 // TCP connections accepted
}

func newNoopProvider(b *testing.B) *noopProvider {
	b.Helper()
	p := &noopProvider{}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		p.requests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"id":"x"}`)
	}))
	p.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			p.conns.Add(1)
		}
	}
	p.srv.Start()
	b.Cleanup(p.srv.Close)
	// Enough idle connections per host that no sender's connection is ever closed
	// after a request (the default keeps 2).
	tr := &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}
	b.Cleanup(tr.CloseIdleConnections) // runs before srv.Close
	p.client = &http.Client{Transport: tr}
	return p
}

// notesURL is the "note" action's URL in apptest.PolicyYAML.
func (p *noopProvider) notesURL() string { return p.srv.URL + "/notes" }

// dispatchEnv is a fresh store with the backend's real clock and an outbox whose "note"
// action sends to a noopProvider through the http connector.
type dispatchEnv struct {
	*apptest.Env
	provider *noopProvider
	effects  *effects.Service
	notSent  atomic.Int64 // sends whose outcome was not "sent"
}

func newDispatchEnv(b *testing.B, be storetest.Backend) *dispatchEnv {
	b.Helper()
	e := &dispatchEnv{Env: apptest.NewEnv(b, be, true), provider: newNoopProvider(b)}
	pol, err := policy.Parse([]byte(apptest.PolicyYAML(e.provider.srv.URL)), func(string) (string, bool) { return "", false })
	if err != nil {
		b.Fatal(err)
	}
	h := pol.Action("note").Section.(*httpconn.Section)
	c, err := httpconn.New(httpconn.Config{Targets: h.Targets, Idempotent: h.Idempotent, Timeout: h.Timeout.D(),
		LookupURL: h.LookupURL, LookupAuthoritative: h.LookupAuthoritative, IDField: h.IDField,
		Client: e.provider.client})
	if err != nil {
		b.Fatal(err)
	}
	e.effects = e.newService(b, pol, c, func(outcome string, _ time.Duration) {
		if outcome != connector.Sent.String() {
			e.notSent.Add(1)
		}
	})
	return e
}

// attempts is an observer of send attempts only.
type attempts struct {
	runs.NopObserver
	fn func(outcome string, d time.Duration)
}

func (a attempts) Attempt(outcome string, d time.Duration) { a.fn(outcome, d) }

// newService is the environment's outbox under pol, sending "note" through c, telling
// attempt about every send.
func (e *dispatchEnv) newService(b *testing.B, pol *policy.Policy, c connector.Connector, attempt func(string, time.Duration)) *effects.Service {
	svc, err := effects.New(runs.Base{Store: e.Store, Policy: pol, Alerts: e.Alerts, Observer: attempts{fn: attempt}},
		effects.Config{Connectors: map[string]connector.Connector{"note": c}})
	if err != nil {
		b.Fatal(err)
	}
	return svc
}

// seed puts n due pending "note" effects in the store, spread over dispatchRuns runs
// claimed through runs.Service, in one transaction (so setup does not pay n commits).
// Each row is what effects.Service.Queue inserts; not_before is a second ago, in queue
// order.
func (e *dispatchEnv) seed(b *testing.B, n int) {
	b.Helper()
	ctx := context.Background()
	runKeys := make([]string, min(n, dispatchRuns))
	for i := range runKeys {
		runKeys[i] = fmt.Sprintf("disp-%d", i)
		if res, err := e.Runs.Claim(ctx, claimReq(runKeys[i])); err != nil || !res.Claimed {
			b.Fatalf("claim %s: claimed=%v err=%v", runKeys[i], res.Claimed, err)
		}
	}
	ids, ks, eids, payloads := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i := range n {
		ids[i], ks[i] = uuid.NewString(), runKeys[i%len(runKeys)]
		eids[i], payloads[i] = fmt.Sprintf("fx-%d", i), fmt.Sprintf(`{"i":%d}`, i)
	}
	switch st := e.Store.(type) {
	case *postgres.Store:
		_, err := st.Pool().Exec(ctx, `
			INSERT INTO effects (id, idempotency_key, effect_id, action_type, target, executor, payload,
			  payload_hash, state, not_before, created_at, updated_at)
			SELECT id, k, eid, 'note', 'default', 'dispatcher', p::jsonb, $5, 'pending',
			  now() - interval '1 second' + ord * interval '1 microsecond', now(), now()
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS t(id, k, eid, p, ord)`,
			ids, ks, eids, payloads, benchHash)
		if err != nil {
			b.Fatalf("seed effects: %v", err)
		}
	case *sqlite.Store:
		err := func() error {
			tx, err := st.DB().BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }() // after Commit: a no-op
			stmt, err := tx.PrepareContext(ctx, `
				INSERT INTO effects (id, idempotency_key, effect_id, action_type, target, executor, payload,
				  payload_hash, state, not_before, created_at, updated_at)
				VALUES (?, ?, ?, 'note', 'default', 'dispatcher', ?, ?, 'pending', ?, ?, ?)`)
			if err != nil {
				return err
			}
			defer stmt.Close()
			base := time.Now().Add(-time.Second).UnixMicro()
			for i := range n {
				at := base + int64(i)
				if _, err := stmt.ExecContext(ctx, ids[i], ks[i], eids[i], payloads[i], benchHash, at, at, at); err != nil {
					return err
				}
			}
			return tx.Commit()
		}()
		if err != nil {
			b.Fatalf("seed effects: %v", err)
		}
	default:
		b.Fatalf("no seeding for %T", e.Store)
	}
}

// timeDispatch times run, then checks that all b.N effects are completed and, when
// sends is true, that each was POSTed once over at most maxConns connections.
func (e *dispatchEnv) timeDispatch(b *testing.B, sends bool, maxConns int, run func(ctx context.Context)) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dispatchTimeout)
	defer cancel()
	conns0 := e.provider.conns.Load()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	run(ctx)
	elapsed := time.Since(start)
	b.StopTimer()
	if b.Failed() {
		return
	}
	if n := e.notSent.Load(); n > 0 {
		b.Fatalf("%d sends were not sent", n)
	}
	counts, err := e.Store.EffectCountByState(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if counts[store.EffectCompleted] != b.N || len(counts) != 1 {
		b.Fatalf("effects by state after dispatch: %v, want %d completed", counts, b.N)
	}
	if sends {
		if got := e.provider.requests.Load(); got != int64(b.N) {
			b.Fatalf("provider got %d requests, want %d", got, b.N)
		}
		conns := e.provider.conns.Load() - conns0
		if conns > int64(maxConns) {
			b.Fatalf("provider accepted %d connections for %d senders: the client does not reuse them", conns, maxConns)
		}
		b.ReportMetric(float64(conns), "conns")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "effects/s")
}

// dispatchAirlock runs workers effects.Dispatchers, each calling Tick until a round leases
// nothing (then every due effect is leased or sent by someone).
func dispatchAirlock(b *testing.B, be storetest.Backend, workers int) {
	e := newDispatchEnv(b, be)
	e.seed(b, b.N)
	// Each dispatcher sends a leased batch concurrently: up to a batch of connections each.
	e.timeDispatch(b, true, workers*dispatchBatch, func(ctx context.Context) {
		var wg sync.WaitGroup
		for range workers {
			d := &effects.Dispatcher{Service: e.effects, BatchSize: dispatchBatch, Lease: dispatchLease, Interval: 10 * time.Millisecond}
			wg.Go(func() {
				for {
					n, err := d.Tick(ctx)
					if err != nil {
						b.Error(err)
						return
					}
					if n == 0 {
						return
					}
				}
			})
		}
		wg.Wait()
	})
}

// rawEffect is what the raw lease returns: what a send needs.
type rawEffect struct {
	id, key, effectID string
	payload           []byte
}

// rawDispatch is the bare statements of a dispatcher, each in autocommit.
type rawDispatch interface {
	// lease moves up to dispatchBatch due pending dispatcher effects to sending under owner.
	lease(ctx context.Context, owner string) ([]rawEffect, error)
	// complete is the outcome's compare-and-set: sending under owner → completed.
	complete(ctx context.Context, id, providerID, owner string) error
}

func newRawDispatch(b *testing.B, st store.Store) rawDispatch {
	b.Helper()
	switch s := st.(type) {
	case *postgres.Store:
		return pgRawDispatch{s}
	case *sqlite.Store:
		return sqliteRawDispatch{s}
	}
	b.Fatalf("no raw driver for %T", st)
	return nil
}

// The store's lease statement (its CTE written as a subquery in FROM), fixed to the
// dispatcher executor, every action type, the real clock and a lease of dispatchLease.
const pgRawLease = `
UPDATE effects e
SET state = 'sending', lease_owner = $1, attempts = e.attempts + 1,
    lease_expires_at = now() + interval '2 minutes', updated_at = now()
FROM (
  SELECT id FROM effects
  WHERE state = 'pending' AND executor = 'dispatcher' AND not_before <= now()
  ORDER BY not_before
  LIMIT 16
  FOR UPDATE SKIP LOCKED
) due
WHERE e.id = due.id
RETURNING e.id, e.idempotency_key, e.effect_id, e.payload`

const pgRawComplete = `
UPDATE effects
SET state = 'completed', provider_id = $2, lease_owner = '', lease_expires_at = NULL, updated_at = now()
WHERE id = $1 AND state = 'sending' AND lease_owner = $3`

type pgRawDispatch struct{ st *postgres.Store }

func (p pgRawDispatch) lease(ctx context.Context, owner string) ([]rawEffect, error) {
	rows, err := p.st.Pool().Query(ctx, pgRawLease, owner)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []rawEffect
	for rows.Next() {
		var r rawEffect
		if err := rows.Scan(&r.id, &r.key, &r.effectID, &r.payload); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func (p pgRawDispatch) complete(ctx context.Context, id, providerID, owner string) error {
	tag, err := p.st.Pool().Exec(ctx, pgRawComplete, id, providerID, owner)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("complete %s: %d rows", id, tag.RowsAffected())
	}
	return err
}

// The sqlite store's lease statement, fixed like pgRawLease; ?2 is now in microseconds.
const sqliteRawLease = `
UPDATE effects
SET state = 'sending', lease_owner = ?1, attempts = attempts + 1,
    lease_expires_at = ?2 + ?3, updated_at = ?2
WHERE id IN (
  SELECT id FROM effects
  WHERE state = 'pending' AND executor = 'dispatcher' AND not_before <= ?2
  ORDER BY not_before
  LIMIT 16
)
RETURNING id, idempotency_key, effect_id, payload`

const sqliteRawComplete = `
UPDATE effects
SET state = 'completed', provider_id = ?2, lease_owner = '', lease_expires_at = NULL, updated_at = ?4
WHERE id = ?1 AND state = 'sending' AND lease_owner = ?3`

type sqliteRawDispatch struct{ st *sqlite.Store }

func (s sqliteRawDispatch) lease(ctx context.Context, owner string) ([]rawEffect, error) {
	rows, err := s.st.DB().QueryContext(ctx, sqliteRawLease, owner, time.Now().UnixMicro(), dispatchLease.Microseconds())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []rawEffect
	for rows.Next() {
		var r rawEffect
		if err := rows.Scan(&r.id, &r.key, &r.effectID, &r.payload); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func (s sqliteRawDispatch) complete(ctx context.Context, id, providerID, owner string) error {
	res, err := s.st.DB().ExecContext(ctx, sqliteRawComplete, id, providerID, owner, time.Now().UnixMicro())
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("complete %s: %d rows (%v)", id, n, err)
	}
	return nil
}

// rawPost is one send without the connector's classification: POST the payload with the
// idempotency key and read the provider id from a 2xx JSON reply.
func rawPost(ctx context.Context, client *http.Client, url string, r rawEffect) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(r.payload))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", r.key+"/"+r.effectID)
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var body struct {
		ID string `json:"id"`
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body)
	_, _ = io.Copy(io.Discard, resp.Body) // read to EOF so the connection is reused
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("provider answered %d", resp.StatusCode)
	}
	return body.ID, err
}

// dispatchRaw leases batches until one comes back empty, completing each row (after a
// POST when send is true).
func dispatchRaw(b *testing.B, be storetest.Backend, send bool) {
	e := newDispatchEnv(b, be)
	e.seed(b, b.N)
	r := newRawDispatch(b, e.Store)
	e.timeDispatch(b, send, 1, func(ctx context.Context) {
		for {
			owner := "raw:" + uuid.NewString()
			batch, err := r.lease(ctx, owner)
			if err != nil {
				b.Fatalf("raw lease: %v", err)
			}
			if len(batch) == 0 {
				return
			}
			for _, fx := range batch {
				providerID := "x"
				if send {
					if providerID, err = rawPost(ctx, e.provider.client, e.provider.notesURL(), fx); err != nil {
						b.Fatalf("raw send %s: %v", fx.id, err)
					}
				}
				if err := r.complete(ctx, fx.id, providerID, owner); err != nil {
					b.Fatalf("raw complete: %v", err)
				}
			}
		}
	})
}

// benchHash stands in for a payload hash (SHA-256, hex).
const benchHash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func claimReq(key string) runs.ClaimRequest {
	return runs.ClaimRequest{Key: key, PayloadHash: benchHash, Actor: "bench"}
}

func BenchmarkDispatch(b *testing.B) {
	storetest.EachB(b, func(b *testing.B, be storetest.Backend) {
		b.Run("airlock_1", func(b *testing.B) { dispatchAirlock(b, be, 1) })
		b.Run("airlock_2", func(b *testing.B) { dispatchAirlock(b, be, 2) })
		b.Run("raw_sql", func(b *testing.B) { dispatchRaw(b, be, false) })
		b.Run("raw_sql_http", func(b *testing.B) { dispatchRaw(b, be, true) })
	})
}
