package main

// airlock verify: proves, against a live deployment's database (and optionally its HTTP
// API), the guarantees airlock relies on, in a scratch namespace it removes afterwards.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
)

// verifyOptions are the command's own flags.
type verifyOptions struct {
	HTTPURL string        // the deployment's base URL ("" skips the HTTP checks)
	APIKey  string        // a runs-scope key for the HTTP claim check ("" skips it)
	Wait    time.Duration // how long a wake-up or a lease expiry may take
	// Now is the instance clock compared with the database's (nil: time.Now).
	Now func() time.Time
}

// verifyResult is one check's line.
type verifyResult struct {
	Name   string
	Status string // PASS, WARN, FAIL or SKIP (only FAIL makes verify exit non-zero)
	Detail string
	Fix    string // FAIL and WARN: what to change
}

func verifyCmd() *cobra.Command {
	var o verifyOptions
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Prove airlock's guarantees hold on this database (and, with --http-url, this deployment)",
		Long: `verify runs checks against the database airlock serve uses (--database-url) and,
with --http-url, against a running instance: concurrent claims of one key yield one lease,
a stale compare-and-set is refused, leases expire on the database clock, the kill switch
stops a send, LISTEN/NOTIFY wake-ups arrive (or polling is in force), transaction-scoped
advisory locks exclude, transactions run at the isolation level airlock expects, a commit
is on a synchronous standby before it is acknowledged (when standbys stream from the
server) and synchronous_commit does not weaken that, and the clocks of this host, the
instance and the database agree within the lease margin.

It works in a scratch namespace (run keys airlock-verify-<random>-…, action type
airlock-verify-<random>) and removes it afterwards. It prints one line per check
(PASS, FAIL with what to fix, WARN with what to look at, or SKIP saying why the check
does not apply) and exits non-zero if any check fails. It never creates or migrates a database.

Before the checks it prints on stderr the database's writer level, this binary's, and the
registered instances (serve and writing CLI commands: version, level, dispatch, started,
last seen, live or silent); an instance below the database's level writes nothing, and
a binary below it refuses to run the checks (they write).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			now, _, err := testClock()
			if err != nil {
				return err
			}
			o.Now = now
			if o.APIKey == "" {
				o.APIKey = os.Getenv("AIRLOCK_VERIFY_API_KEY")
			}
			return withExistingStore(cmd, cfg, func(st store.Store) error {
				// The fleet first, on stderr beside the database's name (stdout is one line
				// per check): it is what an upgrade needs to see, and it prints even where
				// this binary may not write (its checks write, in a scratch namespace).
				if err := printFleet(cmd.Context(), cmd.ErrOrStderr(), st, writerLevel()); err != nil {
					return err
				}
				return asWriter(cmd, st, func(st store.Store) error {
					results := runVerify(cmd.Context(), st, cfg, o)
					failed := printVerify(cmd.OutOrStdout(), results)
					if failed > 0 {
						return fmt.Errorf("verify: %d of %d checks failed", failed, len(results))
					}
					return nil
				})
			})
		},
	}
	cmd.Flags().StringVar(&o.HTTPURL, "http-url", "", "base URL of a running instance (e.g. http://127.0.0.1:8080): adds its readiness and clock checks")
	cmd.Flags().StringVar(&o.APIKey, "api-key", "", "an API key with the runs scope: adds concurrent claims through the HTTP API (or set AIRLOCK_VERIFY_API_KEY)")
	cmd.Flags().DurationVar(&o.Wait, "wait", 5*time.Second, "how long a NOTIFY wake-up may take to arrive")
	return cmd
}

// withExistingStore opens the configured store without creating or migrating it: verify
// checks a deployment as it is, and refuses one whose schema is not current.
func withExistingStore(cmd *cobra.Command, cfg config.Config, fn func(st store.Store) error) error {
	fmt.Fprintln(cmd.ErrOrStderr(), "airlock: database:", describeDatabase(cfg))
	if backend, target := cfg.Backend(); backend == "sqlite" {
		if _, err := os.Stat(target); err != nil {
			return fmt.Errorf("no database at %s: set AIRLOCK_DATABASE_URL (or --database-url) to the one airlock serve uses", absPath(target))
		}
	}
	st, err := openStore(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.SchemaCurrent(cmd.Context()); err != nil {
		return err
	}
	return fn(st)
}

// printFleet prints the database's writer level and the registered instances (live: seen
// within store.InstanceLiveWithin), flagging those below the level.
func printFleet(ctx context.Context, w io.Writer, st store.Store, own int) error {
	level, err := st.WriterLevelGet(ctx)
	if err != nil {
		return err
	}
	ins, err := st.InstanceList(ctx, time.Time{})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "writer level: database %d, this binary %d\n", level, own)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tROLE\tVERSION\tLEVEL\tDISPATCH\tSTARTED\tLAST SEEN\tSTATE")
	now, err := st.Clock(ctx) // the clock that stamped last_seen
	if err != nil {
		return err
	}
	for _, in := range ins {
		state := "live"
		if now.Sub(in.LastSeen) > store.InstanceLiveWithin {
			state = "silent"
		}
		if in.Level < level {
			state += ", below the database's level: writes nothing"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%v\t%s\t%s\t%s\n", in.ID, in.Role, in.Version, in.Level, in.Dispatch,
			in.StartedAt.UTC().Format(time.RFC3339), in.LastSeen.UTC().Format(time.RFC3339), state)
	}
	if len(ins) == 0 {
		fmt.Fprintln(tw, "(no instance registered)\t\t\t\t\t\t\t")
	}
	return tw.Flush()
}

func printVerify(w io.Writer, results []verifyResult) (failed int) {
	for _, r := range results {
		line := fmt.Sprintf("%s  %-22s %s", r.Status, r.Name, r.Detail)
		if r.Status == "FAIL" {
			failed++
		}
		if (r.Status == "FAIL" || r.Status == "WARN") && r.Fix != "" {
			line += " — fix: " + r.Fix
		}
		fmt.Fprintln(w, line)
	}
	return failed
}

// verifier is what the PostgreSQL store adds for verify; SQLite has only the cleanup.
type verifier interface {
	TransactionIsolation(ctx context.Context) (string, error)
	Multiplexed(ctx context.Context) (bool, error)
}

// citusChecker is what the PostgreSQL store adds for verify on a Citus coordinator.
type citusChecker interface {
	CitusHealth(ctx context.Context) (postgres.CitusHealth, error)
}

// citus checks what only Citus can break: a worker the coordinator cannot reach (every
// statement routed to its shards fails, with a retryable 503) and two-phase commits left
// unresolved after Citus's recovery (a worker that went away between PREPARE and COMMIT
// PREPARED keeps locks and rows no one sees until it is back).
func (v *verifyRun) citus(ctx context.Context) verifyResult {
	cc, ok := v.st.(citusChecker)
	if !ok {
		return skip("SQLite: not a Citus cluster")
	}
	h, err := cc.CitusHealth(ctx)
	if err != nil {
		return fail(fixDatabase, "%v", err)
	}
	if !h.Citus {
		return skip("not a Citus coordinator (no citus extension)")
	}
	if len(h.Unreachable) > 0 {
		return fail("start the worker, or fix the coordinator's connection to it (pg_dist_node, ~/.pgpass); its runs answer 503 until then",
			"%d of %d workers unreachable from the coordinator: %s", len(h.Unreachable), len(h.Workers), strings.Join(h.Unreachable, ", "))
	}
	if h.Pending2PC > 0 {
		return fail("run SELECT recover_prepared_transactions() on the coordinator once every worker is up; check the workers' pg_prepared_xacts",
			"%d two-phase commits still unresolved after recovery (pg_dist_transaction)", h.Pending2PC)
	}
	return pass("Citus coordinator: %d workers reachable (%s); no two-phase commit left unresolved", len(h.Workers), strings.Join(h.Workers, ", "))
}

type verifyCleaner interface {
	VerifyCleanup(ctx context.Context, prefix, scope string) error
}

// verifyCheckTimeout bounds one check, beyond --wait.
const verifyCheckTimeout = 20 * time.Second

// verifyRun is one run of the checks, with its scratch namespace.
type verifyRun struct {
	st     store.Store
	cfg    config.Config
	o      verifyOptions
	prefix string // run keys
	atype  string // action type (kill switch scope action:<atype>)
	n      int
}

func (v *verifyRun) key() string {
	v.n++
	return fmt.Sprintf("%s-%d", v.prefix, v.n)
}

func (v *verifyRun) now() time.Time {
	if v.o.Now != nil {
		return v.o.Now()
	}
	return time.Now()
}

// runVerify runs every check, in order, and removes the scratch namespace.
func runVerify(ctx context.Context, st store.Store, cfg config.Config, o verifyOptions) []verifyResult {
	if o.Wait <= 0 {
		o.Wait = 5 * time.Second
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := "airlock-verify-" + hex.EncodeToString(b[:])
	v := &verifyRun{st: st, cfg: cfg, o: o, prefix: id, atype: id}
	checks := []struct {
		name string
		fn   func(context.Context) verifyResult
	}{
		{"concurrent-claims", v.concurrentClaims},
		{"stale-cas", v.staleCAS},
		{"lease-expiry-clock", v.leaseExpiry},
		{"kill-switch", v.killSwitch},
		{"listen-notify", v.listenNotify},
		{"advisory-locks", v.advisoryLocks},
		{"isolation-level", v.isolation},
		{"pooler", v.pooler},
		{"replication", v.replication},
		{"synchronous-commit", v.synchronousCommit},
		{"clock-skew", v.clockSkew},
		{"citus", v.citus},
		{"http-readiness", v.httpReadiness},
		{"http-claims", v.httpClaims},
	}
	var out []verifyResult
	for _, c := range checks {
		// A check that cannot get its connections (a pool of one, a pooler out of
		// server connections) fails instead of waiting for ever.
		cctx, cancel := context.WithTimeout(ctx, verifyCheckTimeout+o.Wait)
		r := c.fn(cctx)
		if cctx.Err() != nil && r.Status != "PASS" {
			r = fail("give the pool at least 3 connections (pool_max_conns) and check the pooler's pool size",
				"did not finish within %s: %s", verifyCheckTimeout+o.Wait, r.Detail)
		}
		cancel()
		r.Name = c.name
		out = append(out, r)
	}
	r := verifyResult{Name: "cleanup", Status: "PASS", Detail: "removed the scratch runs, their events and kill switch row (" + id + ")"}
	if c, ok := st.(verifyCleaner); !ok {
		r = verifyResult{Name: "cleanup", Status: "FAIL", Detail: "this store cannot remove the scratch namespace " + id}
	} else if err := c.VerifyCleanup(context.WithoutCancel(ctx), id, effects.ActionScope(v.atype)); err != nil {
		r = verifyResult{Name: "cleanup", Status: "FAIL", Detail: err.Error(), Fix: "remove runs with keys starting " + id + " by hand"}
	}
	return append(out, r)
}

func pass(format string, a ...any) verifyResult {
	return verifyResult{Status: "PASS", Detail: fmt.Sprintf(format, a...)}
}

func skip(format string, a ...any) verifyResult {
	return verifyResult{Status: "SKIP", Detail: fmt.Sprintf(format, a...)}
}

func fail(fix, format string, a ...any) verifyResult {
	return verifyResult{Status: "FAIL", Detail: fmt.Sprintf(format, a...), Fix: fix}
}

func warn(fix, format string, a ...any) verifyResult {
	return verifyResult{Status: "WARN", Detail: fmt.Sprintf(format, a...), Fix: fix}
}

func (v *verifyRun) claim(ctx context.Context, key, owner string, lease time.Duration) (store.ClaimOutcome, error) {
	return v.st.Claim(ctx, store.ClaimParams{RunClaimParams: store.RunClaimParams{Key: key, PayloadHash: "verify",
		Owner: owner, Lease: lease, TriggerSource: "airlock-verify"}, Actor: "airlock-verify", AlertAfter: 1 << 30})
}

// fixDatabase is the advice when the database itself answers wrongly.
const fixDatabase = "airlock needs PostgreSQL ≥ 13 (or its SQLite file) reached directly or through a pooler in transaction mode; check for a proxy or replica that rewrites statements"

func (v *verifyRun) concurrentClaims(ctx context.Context) verifyResult {
	const n = 16
	key := v.key()
	var wg sync.WaitGroup
	var mu sync.Mutex
	claimed, errs := 0, []error{}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := v.claim(ctx, key, fmt.Sprintf("verify-owner-%d", i), time.Minute)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if out.Claimed {
				claimed++
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return fail("see the error: the database refused claims under concurrency", "%d of %d concurrent claims failed: %v", len(errs), n, errs[0])
	}
	if claimed != 1 {
		return fail(fixDatabase, "%d concurrent claims of one key granted %d leases, want 1", n, claimed)
	}
	return pass("%d concurrent claims of one key: 1 lease", n)
}

func (v *verifyRun) staleCAS(ctx context.Context) verifyResult {
	key := v.key()
	first, err := v.claim(ctx, key, "verify-a", time.Minute)
	if err != nil || !first.Claimed {
		return fail(fixDatabase, "claim: %v", err)
	}
	// Move the run on (its version goes up), then try a transition at the old version.
	_, err = v.st.RunTransition(ctx, store.RunTransitionParams{Key: key, Owner: "verify-a", Version: first.Run.Version,
		From: store.StateProcessing, To: store.StateFailedRetryable})
	if err != nil {
		return fail(fixDatabase, "a current compare-and-set was refused: %v", err)
	}
	_, err = v.st.RunTransition(ctx, store.RunTransitionParams{Key: key, Owner: "verify-a", Version: first.Run.Version,
		From: store.StateProcessing, To: store.StateCompleted})
	if !errors.Is(err, store.ErrNoMatch) {
		return fail(fixDatabase, "a compare-and-set at a stale version was not refused (err %v)", err)
	}
	return pass("a transition at a stale version is refused")
}

func (v *verifyRun) leaseExpiry(ctx context.Context) verifyResult {
	const lease = 2 * time.Second
	key := v.key()
	out, err := v.claim(ctx, key, "verify-a", lease)
	if err != nil || !out.Claimed {
		return fail(fixDatabase, "claim: %v", err)
	}
	dbNow, err := v.st.Clock(ctx)
	if err != nil {
		return fail(fixDatabase, "read the database clock: %v", err)
	}
	r := out.Run
	if r.LeaseExpiresAt == nil || r.LeaseStartedAt == nil || r.LeaseExpiresAt.Sub(*r.LeaseStartedAt) != lease {
		return fail(fixDatabase, "the lease was not stored as started + %s", lease)
	}
	if d := dbNow.Sub(*r.LeaseStartedAt); d < 0 || d > 2*time.Second {
		return fail(fixDatabase, "the lease started at %s, %s from the database clock %s: leases are not on the database clock",
			r.LeaseStartedAt.UTC().Format(time.RFC3339Nano), d, dbNow.UTC().Format(time.RFC3339Nano))
	}
	if early, err := v.claim(ctx, key, "verify-b", lease); err != nil || early.Claimed {
		return fail(fixDatabase, "a second owner took a live lease (err %v)", err)
	}
	deadline := time.Now().Add(lease + v.o.Wait)
	for {
		t, err := v.st.Clock(ctx)
		if err != nil {
			return fail(fixDatabase, "read the database clock: %v", err)
		}
		if t.After(*r.LeaseExpiresAt) {
			break
		}
		if time.Now().After(deadline) {
			return fail("check the database server's clock (NTP)", "the database clock did not pass the lease's expiry within %s", lease+v.o.Wait)
		}
		select {
		case <-ctx.Done():
			return fail("", "interrupted")
		case <-time.After(100 * time.Millisecond):
		}
	}
	late, err := v.claim(ctx, key, "verify-b", lease)
	if err != nil || !late.Claimed {
		return fail(fixDatabase, "the lease did not lapse once the database clock passed its expiry (err %v)", err)
	}
	return pass("a %s lease holds, then lapses when the %s clock passes its expiry", lease, clockName(v.st))
}

func clockName(st store.Store) string {
	if st.Backend() == "postgres" {
		return "database"
	}
	return "process (SQLite)"
}

func (v *verifyRun) killSwitch(ctx context.Context) verifyResult {
	svc, err := effects.New(runs.Base{Store: v.st}, effects.Config{AIActionsEnabled: v.cfg.AIActionsEnabled, AIActionsEnabledSet: true})
	if err != nil {
		return fail(fixDatabase, "build the outbox: %v", err)
	}
	scope := effects.ActionScope(v.atype)
	set := func(enabled bool) error {
		return v.st.Transact(ctx, func(q store.Queries) error {
			if err := q.KillSwitchGuard(ctx, true); err != nil {
				return err
			}
			return q.KillSwitchSet(ctx, store.KillSwitch{Scope: scope, Enabled: enabled, Reason: "airlock verify", Actor: "airlock-verify", UpdatedAt: time.Now()})
		})
	}
	read := func() (bool, string, error) {
		var ok bool
		var why string
		err := v.st.Transact(ctx, func(q store.Queries) error {
			var err error
			ok, why, err = svc.EnabledIn(ctx, q, v.atype)
			return err
		})
		return ok, why, err
	}
	if err := set(false); err != nil {
		return fail(fixDatabase, "set the kill switch: %v", err)
	}
	ok, why, err := read()
	if err != nil {
		return fail(fixDatabase, "read the kill switch in a send's transaction: %v", err)
	}
	if ok {
		return fail(fixDatabase, "a send's transaction did not see the kill switch disabled for %s", v.atype)
	}
	if err := set(true); err != nil {
		return fail(fixDatabase, "set the kill switch: %v", err)
	}
	ok, globalWhy, err := read()
	if err != nil {
		return fail(fixDatabase, "read the kill switch: %v", err)
	}
	if !ok {
		return pass("disabling %s stops its sends (%s); sends are stopped anyway here: %s", scope, why, globalWhy)
	}
	return pass("disabling %s stops its sends, enabling it lets them through", scope)
}

func (v *verifyRun) listenNotify(ctx context.Context) verifyResult {
	l, ok := v.st.(store.EffectListener)
	if !ok {
		return skip("%s has no NOTIFY: dispatchers poll (policy dispatch.interval); one process serves the file", v.st.Backend())
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	woke := make(chan struct{}, 64)
	done := make(chan struct{})
	go func() { defer close(done); l.ListenEffects(lctx, func() { woke <- struct{}{} }) }()
	defer func() { cancel(); <-done }()
	// The listener wakes once when it (re)connects; a NOTIFY sent before its LISTEN is
	// missed, so notify every 200 ms until a wake-up arrives after the first notify.
	deadline := time.After(v.o.Wait)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	notified := false
	for {
		select {
		case <-woke:
			if notified {
				return pass("a NOTIFY from one session woke a LISTEN on another")
			}
		case <-tick.C:
			for len(woke) > 0 {
				<-woke
			}
			if err := v.st.Transact(ctx, func(q store.Queries) error { return q.EffectNotify(ctx) }); err != nil {
				return fail(fixDatabase, "NOTIFY: %v", err)
			}
			notified = true
		case <-deadline:
			return fail("behind a pooler in transaction mode set AIRLOCK_LISTEN_DATABASE_URL to a direct connection (LISTEN needs a session); dispatchers otherwise only poll",
				"no wake-up arrived within %s of a NOTIFY", v.o.Wait)
		}
	}
}

func (v *verifyRun) advisoryLocks(ctx context.Context) verifyResult {
	if v.st.Backend() != "postgres" {
		return skip("SQLite: a write transaction excludes every other; there are no advisory locks")
	}
	scope := store.ReplayScope{APIKeyID: v.prefix, Route: "verify", Key: "lock"}
	held := make(chan struct{})
	release := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- v.st.Transact(ctx, func(q store.Queries) error {
			ok, err := q.ReplayLock(ctx, scope)
			if err == nil && !ok {
				err = errors.New("the first transaction did not get the free lock")
			}
			close(held)
			<-release
			return err
		})
	}()
	<-held
	var second bool
	err := v.st.Transact(ctx, func(q store.Queries) error {
		var err error
		second, err = q.ReplayLock(ctx, scope)
		return err
	})
	close(release)
	if ferr := <-first; ferr != nil {
		return fail(fixDatabase, "advisory lock: %v", ferr)
	}
	if err != nil {
		return fail(fixDatabase, "advisory lock: %v", err)
	}
	if second {
		return fail("a pooler in statement mode breaks transactions: use transaction (or session) pooling", "a second transaction took an advisory lock another transaction held")
	}
	var third bool
	err = v.st.Transact(ctx, func(q store.Queries) error {
		var err error
		third, err = q.ReplayLock(ctx, scope)
		return err
	})
	if err != nil || !third {
		return fail("the lock outlived its transaction: a session-level lock or a pooler that keeps sessions open across transactions", "the lock was not free after its transaction ended (err %v)", err)
	}
	return pass("a transaction-scoped advisory lock excludes a second transaction and ends with its own")
}

func (v *verifyRun) isolation(ctx context.Context) verifyResult {
	vf, ok := v.st.(verifier)
	if !ok {
		return skip("SQLite: write transactions are serialised (BEGIN IMMEDIATE); there is no isolation level to set")
	}
	level, err := vf.TransactionIsolation(ctx)
	if err != nil {
		return fail(fixDatabase, "%v", err)
	}
	if level != "read committed" {
		return fail("something rewrites BEGIN ISOLATION LEVEL READ COMMITTED: connect airlock to PostgreSQL or a pooler that passes it through",
			"airlock's transactions run at %q, want \"read committed\"", level)
	}
	return pass("airlock's transactions run at read committed (its locks are written for it)")
}

func (v *verifyRun) pooler(ctx context.Context) verifyResult {
	vf, ok := v.st.(verifier)
	if !ok {
		return skip("SQLite: no connection pooler")
	}
	pooled, err := vf.Multiplexed(ctx)
	if err != nil {
		return fail(fixDatabase, "%v", err)
	}
	if !pooled {
		return pass("each connection keeps its own server session (no transaction pooler in between)")
	}
	if err := refuseMisconfiguredPooler(ctx, v.st); err != nil {
		return fail(err.Error(), "a pooler in transaction mode multiplexes sessions and airlock is not set up for it")
	}
	return pass("a pooler in transaction mode multiplexes sessions: queries use no named prepared statements and LISTEN has a direct connection")
}

// leaseMarginOf is the dispatcher's margin for a lease (effects' leaseMargin: a tenth of
// the lease, at most 5 s): clocks further apart than this can end a lease early.
func leaseMarginOf(lease time.Duration) time.Duration { return min(lease/10, 5*time.Second) }

func (v *verifyRun) clockSkew(ctx context.Context) verifyResult {
	margin := leaseMarginOf(v.cfg.LeaseDefault)
	before := time.Now()
	dbNow, err := v.st.Clock(ctx)
	rtt := time.Since(before)
	if err != nil {
		return fail(fixDatabase, "read the database clock: %v", err)
	}
	local := v.now().Add(-rtt / 2)
	skew := local.Sub(dbNow)
	if skew.Abs() > margin+rtt/2 {
		return fail("synchronise this host's and the database server's clocks (NTP)",
			"this host's clock is %s from the database's, more than the lease margin %s", skew.Round(time.Millisecond), margin)
	}
	return pass("this host's clock is %s from the %s clock (lease margin %s)", skew.Round(time.Millisecond), clockName(v.st), margin)
}

func (v *verifyRun) httpReadiness(ctx context.Context) verifyResult {
	if v.o.HTTPURL == "" {
		return skip("no --http-url: the instance's readiness and clock are not checked")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(v.o.HTTPURL, "/")+"/readyz", nil)
	if err != nil {
		return fail("give --http-url as http(s)://host:port", "%v", err)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return fail("check --http-url and that airlock serve runs there", "%v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fail("see the instance's log and its /readyz body", "/readyz answered %d", resp.StatusCode)
	}
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return pass("/readyz answered 200 (no Date header: the instance's clock is not compared)")
	}
	dbNow, err := v.st.Clock(ctx)
	if err != nil {
		return fail(fixDatabase, "read the database clock: %v", err)
	}
	margin := leaseMarginOf(v.cfg.LeaseDefault)
	skew := date.Sub(dbNow.Truncate(time.Second))
	if skew.Abs() > margin+time.Second { // Date has one-second resolution
		return fail("synchronise the instance's host clock (NTP)", "the instance's clock (its Date header) is %s from the database's, more than the lease margin %s", skew, margin)
	}
	return pass("/readyz answered 200; the instance's clock is within %s of the database's (lease margin %s)", skew.Abs()+time.Second, margin)
}

func (v *verifyRun) httpClaims(ctx context.Context) verifyResult {
	if v.o.HTTPURL == "" || v.o.APIKey == "" {
		return skip("needs --http-url and --api-key (runs scope): concurrent claims through the API are not checked")
	}
	const n = 8
	key := v.key()
	body, _ := json.Marshal(map[string]any{"key": key, "payload": map[string]string{"verify": v.prefix}, "lease_seconds": 60})
	var wg sync.WaitGroup
	var mu sync.Mutex
	claimed, statuses := 0, map[int]int{}
	var firstErr error
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(v.o.HTTPURL, "/")+"/v1/runs/claim", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+v.o.APIKey)
			req.Header.Set("Content-Type", "application/json")
			resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = err
				return
			}
			defer resp.Body.Close()
			statuses[resp.StatusCode]++
			var out struct {
				Claimed bool `json:"claimed"`
			}
			if json.NewDecoder(resp.Body).Decode(&out) == nil && out.Claimed && resp.StatusCode < 300 {
				claimed++
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return fail("check --http-url", "%v", firstErr)
	}
	if statuses[http.StatusUnauthorized]+statuses[http.StatusForbidden] > 0 {
		return fail("give an API key with the runs scope (airlock apikey create --scope runs)", "the API refused the key: %v", statuses)
	}
	if claimed != 1 {
		return fail(fixDatabase, "%d concurrent claims through the API granted %d leases (statuses %v), want 1", n, claimed, statuses)
	}
	return pass("%d concurrent claims of one key through the API: 1 lease", n)
}
