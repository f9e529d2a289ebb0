// Command airlock is the safety layer's binary: the server and its operator commands.
// It turns flags and environment into a config, wires the parts, and runs; the rules
// live in internal/.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/internal/alerts"
	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/fleet"
	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/periodic"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/tracing"
	"github.com/airlockhq/airlock/internal/version"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "airlock:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "airlock",
		Short: "A safety layer for workflows and agents that call AI models and then touch the outside world",
		Long: `airlock claims each unit of work once under an idempotency key, holds it under a
lease, and moves it only by compare-and-set, recording every step as an event.

Every option below can also be set by its environment variable (shown in brackets);
a flag wins over the environment, which wins over the default.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, o := range config.Options {
		addOptionFlag(root.PersistentFlags(), o)
	}
	root.AddCommand(serveCmd(), migrateCmd(), purgeCmd(), apikeyCmd(), userCmd(), runsCmd(), effectsCmd(), actionsCmd(), versionCmd(), benchCmd(), healthcheckCmd(), mcpCmd(), verifyCmd())
	root.AddCommand(explainCmd(), reportCmd(), auditCmd())
	return root
}

// loadConfig resolves the options table from the flags given and the environment.
func loadConfig(cmd *cobra.Command) (config.Config, error) {
	given := map[string]string{}
	for _, o := range config.Options {
		if f := cmd.Flags().Lookup(o.Flag); f != nil && f.Changed {
			given[o.Flag] = f.Value.String()
		}
	}
	return config.Load(given, os.LookupEnv)
}

func openStore(ctx context.Context, cfg config.Config) (store.Store, error) {
	return openStoreAt(ctx, cfg, nil)
}

// openStoreAt opens the store with now as the process clock (nil: time.Now). PostgreSQL
// decides by its own clock; SQLite's clock is the process's.
func openStoreAt(ctx context.Context, cfg config.Config, now func() time.Time) (store.Store, error) {
	key, err := auditKey(cfg)
	if err != nil {
		return nil, err
	}
	backend, target := cfg.Backend()
	if backend == "postgres" {
		return postgres.OpenWith(ctx, target, postgres.Options{ListenURL: cfg.ListenDatabaseURL, QueryMode: cfg.DatabaseQueryMode, AuditKey: key})
	}
	return sqlite.Open(ctx, target, sqlite.Options{Synchronous: cfg.SQLiteSynchronous, Now: now, AuditKey: key})
}

// auditKey reads AIRLOCK_AUDIT_KEY_FILE (nil when none is set).
func auditKey(cfg config.Config) (*store.AuditKey, error) {
	if cfg.AuditKeyFile == "" {
		return nil, nil
	}
	k, err := store.ReadAuditKey(cfg.AuditKeyFile)
	if err != nil {
		return nil, fmt.Errorf("AIRLOCK_AUDIT_KEY_FILE (--audit-key-file): %w", err)
	}
	return k, nil
}

// startupWait is how long serve waits at start for a PostgreSQL that is unavailable (not
// up yet, restarting, failing over): an instance started meanwhile comes up when the
// database does, instead of exiting into its supervisor's restart loop.
const startupWait = time.Minute

// waitForStore opens the store, trying again with backoff (200 ms doubling to 5 s) while
// the error is store.ErrUnavailable, for up to wait. Any other error returns at once.
// serve's other start-up steps that need the database (registering the instance) wait
// the same way: a connection ended by the server (a restart, a failover, a terminated
// backend) between them is the same outage.
func waitForStore[T any](ctx context.Context, log *slog.Logger, wait time.Duration, open func() (T, error)) (T, error) {
	deadline := time.Now().Add(wait)
	backoff := 200 * time.Millisecond
	for {
		st, err := open()
		if err == nil || !errors.Is(err, store.ErrUnavailable) || time.Now().Add(backoff).After(deadline) {
			return st, err
		}
		log.Warn("the database is unavailable: waiting for it", "retry_in", backoff.String(), "err", err)
		select {
		case <-ctx.Done():
			var zero T
			return zero, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// prepareStore makes an opened store ready to serve: the pooler check, the migrations (or
// the schema check), and a committed readiness write.
func prepareStore(ctx context.Context, cfg config.Config, st store.Store, instance string) error {
	if err := refuseMisconfiguredPooler(ctx, st); err != nil {
		return err
	}
	if cfg.Migrate {
		if err := st.Migrate(ctx); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	} else if err := st.SchemaCurrent(ctx); err != nil {
		return err
	}
	// A database that answers reads but refuses writes would fail every request but reads:
	// the readiness write (a committed one) at start, as /readyz makes it after.
	if err := st.ReadinessWrite(ctx, instance); err != nil {
		return fmt.Errorf("the database does not accept writes (read-only file, session or standby, or a full disk?): %w", err)
	}
	return nil
}

func newLogger(cfg config.Config) *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
}

func serveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run the HTTP API (migrates the database first unless --migrate=false)",
		Long: `serve runs airlock's HTTP API on --listen. With no configuration it uses the SQLite
file ./airlock.db, created on first start. Stop it with SIGINT or SIGTERM: it finishes
requests in flight, then exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return serve(ctx, cfg, newLogger(cfg))
		},
	}
}

func serve(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	setMemoryLimit(cfg, log)
	// The process clock: time.Now, or in a test build a skewed one (AIRLOCK_TEST_CLOCK_OFFSET).
	// Only services' nil clocks are ever wired here: PostgreSQL decides by its own clock.
	now, skew, err := testClock()
	if err != nil {
		return err
	}
	if skew != 0 {
		log.Warn("test build: the process clock is skewed", "offset", skew.String())
	}
	var wait time.Duration // SQLite: a file that cannot be opened will not open later
	if backend, _ := cfg.Backend(); backend == "postgres" {
		wait = startupWait
	}
	// Every start-up step that talks to the database is retried as one while PostgreSQL is
	// unavailable: a backend terminated (or a server restarting) during the migration's
	// lock is the same outage as one during the first connection.
	instance := httpapi.InstanceName()
	st, err := waitForStore(ctx, log, wait, func() (store.Store, error) {
		st, err := openStoreAt(ctx, cfg, now)
		if err != nil {
			return nil, err
		}
		if err := prepareStore(ctx, cfg, st, instance); err != nil {
			st.Close()
			return nil, err
		}
		return st, nil
	})
	if err != nil {
		return err
	}
	defer st.Close()
	pol, err := loadPolicy(cfg)
	if err != nil {
		return err
	}
	conns, err := app.Connectors(pol)
	if err != nil {
		return err
	}
	publicURL, err := publicURLOf(cfg, pol)
	if err != nil {
		return err
	}
	webOpts, err := webOptions(ctx, pol, publicURL)
	if err != nil {
		return err
	}
	tracer, stopTracing, err := tracing.Setup(ctx, cfg.Tracing)
	if err != nil {
		return err
	}
	defer stopTracing(context.Background())
	// Registered as a writer before anything writes: the database's level decides whether
	// this binary may (internal/fleet). Behind it, serve still answers reads.
	member, err := waitForStore(ctx, log, startupWait, func() (*fleet.Member, error) {
		return fleet.Join(ctx, fleet.Config{Store: st, ID: instance, Role: "serve", Dispatch: !pol.Dispatch.Disabled, Level: writerLevel(), Log: log})
	})
	if err != nil {
		return err
	}
	defer func() { _ = member.Leave(context.Background()) }()
	if err := member.Err(); err != nil {
		log.Error("writer level behind: serving reads only; writes are refused with 503 writer_level_behind", "err", err)
	}
	cp, err := checkpointer(cfg, st)
	if err != nil {
		return err
	}
	a, err := app.New(app.Options{Checkpoints: cp, Store: st, Policy: pol, Connectors: conns, PublicURL: publicURL, Log: log, Writers: member,
		Runs: runs.Config{DefaultLease: cfg.LeaseDefault, MaxLease: cfg.LeaseMax,
			MaxLeaseLifetime: cfg.LeaseLifetimeMax, ReclaimAlertAfter: cfg.ReclaimAlertAfter},
		AIActionsEnabled: cfg.AIActionsEnabled, AIActionsEnabledSet: true, Web: webOpts,
		MaxBodyBytes: cfg.MaxBodyBytes, APIKeys: apikeys.NewCache(cfg.APIKeyCacheTTL, now), Tracer: tracer, Instance: instance})
	if err != nil {
		return err
	}
	eff, gate := a.Effects, a.Approvals
	srv := &http.Server{
		Handler:           a.Handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return listenError(cfg.Listen, err)
	}
	backend, _ := cfg.Backend()
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); member.Run(bg) }()
	// Every background writer runs only while the member may write: a raised writer level
	// stops it for good, a registry out of reach until a heartbeat gets through.
	writer := func(fn func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); member.While(bg, writerPoll, fn) }()
	}
	if !pol.Dispatch.Disabled {
		d := &effects.Dispatcher{Service: eff, BatchSize: pol.Dispatch.BatchSize, Concurrency: pol.Dispatch.Concurrency,
			Lease: pol.Dispatch.Lease.D(), Interval: pol.Dispatch.Interval.D(), Drain: pol.Dispatch.Drain.D(), Crash: crashHook(), Tracer: tracer}
		writer(d.Run)
		writer(func(ctx context.Context) { every(ctx, pol.Dispatch.ReconcileInterval.D(), eff.Reconcile, log) })
	}
	// Every instance sweeps lapsed effect leases, dispatching or not: an external worker's
	// lease must end even where no dispatcher runs.
	sweep := min(pol.Dispatch.Interval.D()*10, 5*time.Second)
	// Every instance relays the alert outbox: the services wake it after committing an
	// alert; the poll raises what another process committed, or what a crash left.
	writer(func(ctx context.Context) { a.Alerts.Run(ctx, alerts.PollInterval) })
	writer(func(ctx context.Context) { every(ctx, sweep, eff.SweepExpired, log) })
	writer(func(ctx context.Context) { every(ctx, 10*time.Second, gate.Sweep, log) })
	// Every instance looks for stalled runs (lease lapsed, nothing completed them): one
	// run_stalled alert per stall, whichever instance marks it first.
	writer(func(ctx context.Context) { every(ctx, 10*time.Second, a.Runs.SweepStalled, log) })
	writer(func(ctx context.Context) { every(ctx, pol.Retention.Interval.D(), retention.Job(st, pol, log), log) })
	if cp != nil {
		// Not a writer of the database: checkpoints go on while the level is behind.
		wg.Add(1)
		go func() {
			defer wg.Done()
			cp.Serve(bg, log) // app.New wired every approval decision to wake it
		}()
	}
	// Background work stops after the HTTP server has drained, before the store closes.
	defer func() { stopBG(); wg.Wait() }()
	log.Info("airlock serving", "addr", ln.Addr().String(), "backend", backend, "database", describeDatabase(cfg), "version", version.String(), "instance", instance,
		"action_types", len(pol.Actions), "dispatcher", !pol.Dispatch.Disabled)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// checkpointer is serve's audit checkpoint writer (nil without
// AIRLOCK_AUDIT_CHECKPOINT_DIR). The directory must exist and take a file now: a
// checkpoint that cannot be written stops start-up rather than failing unseen later.
func checkpointer(cfg config.Config, st store.Store) (*audit.Checkpointer, error) {
	if cfg.AuditCheckpointDir == "" {
		return nil, nil
	}
	key, err := auditKey(cfg)
	if err != nil {
		return nil, err
	}
	if key == nil {
		return nil, errors.New("AIRLOCK_AUDIT_CHECKPOINT_DIR needs AIRLOCK_AUDIT_KEY_FILE: checkpoints are signed with the audit key")
	}
	f, err := os.CreateTemp(cfg.AuditCheckpointDir, ".checkpoint-probe-*")
	if err != nil {
		return nil, fmt.Errorf("AIRLOCK_AUDIT_CHECKPOINT_DIR (--audit-checkpoint-dir): %w", err)
	}
	f.Close()
	os.Remove(f.Name())
	return audit.NewCheckpointer(st, key, cfg.AuditCheckpointDir, cfg.AuditCheckpointInterval), nil
}

// writerPoll is how often a background writer looks whether it may still write (the
// member learns it from its heartbeat, every store.InstanceHeartbeat).
const writerPoll = time.Second

// every runs fn each interval until ctx ends, logging failures.
func every(ctx context.Context, interval time.Duration, fn func(context.Context) error, log *slog.Logger) {
	periodic.Every(ctx, interval, fn, func(err error) { log.Error("background task failed", "err", err) })
}

func migrateCmd() *cobra.Command {
	var force, citus bool
	cmd := &cobra.Command{
		Use:   "migrate [--force] [--citus]",
		Short: "Apply pending database migrations and exit",
		Long: `migrate applies the migrations embedded in this binary that the database has not
run yet. It is safe to run from several processes at once: they take turns.

A migration that raises the writer level (CHANGELOG.md names them) is refused while a
live instance (one whose heartbeat was seen in the last 20s) of a lower level is
registered; migrate names them. Stop or upgrade them first (docs/deployment.md,
Upgrades). --force applies it anyway: each of those instances goes on writing under the
old rules until its next heartbeat (up to 5s, longer if the database is slow to answer
it) — the window in which a fence it does not know can be broken (an effect sent
twice) — and then refuses every write.

On a Citus coordinator (a PostgreSQL with the citus extension) migrate then places the
tables as docs/architecture.md's Citus plan says: distributed by run key and co-located,
reference tables on every node, the rest on the coordinator (docs/deployment.md, Citus).
It detects the extension, so serve and the tests migrate the same way; --citus makes its
absence an error instead of a single-node schema.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.ErrOrStderr(), "airlock: database:", describeDatabase(cfg))
			st, err := openStore(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			applied, err := st.ApplyMigrations(cmd.Context(), store.MigrateParams{Force: force, Citus: citus})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if pg, ok := st.(*postgres.Store); ok {
				if d, r, err := pg.CitusPlacement(cmd.Context()); err != nil {
					return err
				} else if d+r > 0 {
					fmt.Fprintf(out, "citus: %d distributed tables (co-located by run key), %d reference tables; the others on the coordinator\n", d, r)
				}
			}
			if len(applied) == 0 {
				fmt.Fprintln(out, "database is up to date: no migration to apply")
				return nil
			}
			fmt.Fprintf(out, "applied %d migration(s): %s\n", len(applied), strings.Join(applied, ", "))
			fmt.Fprintln(out, "database is up to date")
			return nil
		},
	}
	cmd.Flags().BoolVar(&citus, "citus", false, "require a Citus coordinator (the citus extension): fail instead of creating a single-node schema; on a coordinator the tables are distributed per the Citus plan with or without it")
	cmd.Flags().BoolVar(&force, "force", false, "raise the writer level even while live lower-level instances are registered (they write under the old rules until their next heartbeat)")
	return cmd
}

// withStore opens the configured, migrated store for an operator command. It never
// creates a database: a SQLite file that does not exist is an error (run from another
// directory, ./airlock.db would be a new, empty database the server never sees), and it
// says on stderr which database it used.
func withStore(cmd *cobra.Command, fn func(st store.Store) error) error {
	cfg, err := loadConfig(cmd)
	if err != nil {
		return err
	}
	backend, target := cfg.Backend()
	fmt.Fprintln(cmd.ErrOrStderr(), "airlock: database:", describeDatabase(cfg))
	if backend == "sqlite" {
		if _, err := os.Stat(target); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("no database at %s: set AIRLOCK_DATABASE_URL (or --database-url) to the one airlock serve uses, or create it with `airlock migrate`", absPath(target))
		}
	}
	st, err := openStore(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Migrate(cmd.Context()); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if readOnlyCommands[cmd.CommandPath()] {
		return fn(st)
	}
	return asWriter(cmd, st, fn)
}

// readOnlyCommands are the operator commands that write nothing; every other command that
// opens the store writes, and runs only as a registered writer of the database's level.
var readOnlyCommands = map[string]bool{
	"airlock explain": true, "airlock report": true, "airlock audit verify": true, "airlock audit checkpoint": true,
	"airlock effects list": true, "airlock actions status": true,
	"airlock apikey list": true, "airlock user list": true,
}

// asWriter runs fn as a registered writer (internal/fleet): it refuses when the database's
// writer level is above this binary's, heartbeats while fn runs (a long purge stays
// visible to `airlock migrate`), and deregisters when fn returns.
func asWriter(cmd *cobra.Command, st store.Store, fn func(st store.Store) error) error {
	ctx := cmd.Context()
	m, err := fleet.Join(ctx, fleet.Config{Store: st, Role: strings.TrimPrefix(cmd.CommandPath(), "airlock "), Level: writerLevel()})
	if err != nil {
		return err
	}
	defer func() { _ = m.Leave(context.WithoutCancel(ctx)) }()
	if err := m.Err(); err != nil {
		return fmt.Errorf("refusing to write: %w", err)
	}
	hctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); m.Run(hctx) }()
	defer func() { stop(); <-done }()
	return fn(st)
}

// describeDatabase names the database a config points at, never its password:
// "sqlite /abs/path" or "postgres user@host:port/dbname".
func describeDatabase(cfg config.Config) string {
	backend, target := cfg.Backend()
	if backend == "sqlite" {
		return "sqlite " + absPath(target)
	}
	pc, err := pgconn.ParseConfig(target)
	if err != nil {
		return "postgres (unparsable connection string)"
	}
	return fmt.Sprintf("postgres %s@%s/%s", pc.User, net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))), pc.Database)
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func apikeyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "apikey",
		Short: "Create, list and revoke API keys for machine clients",
		Long: `API keys authenticate machine clients (n8n, agents) as Authorization: Bearer <key>.
A key is printed once, when it is created; airlock stores only its SHA-256.

Scopes: runs (claim, heartbeat, transition, read), read (read only), worker (claim
effects and report outcomes), operator (resolve effects, replace runs, cancel), admin (all),
evaluator (record evidence for approve_by_exception under the key's name as the source;
never combined with runs, worker, operator or admin).

--on-behalf-of names the person a key acts for: requests made with it are that person's,
so under separation of duties they cannot approve them. --types limits a worker key to
some action types: it never receives another type's payloads.`,
	}
	var name, onBehalfOf, types string
	var scopes []string
	create := &cobra.Command{
		Use:   "create --name NAME --scope SCOPES",
		Short: "Create a key and print it once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sc, err := apikeys.ParseScopes(strings.Join(scopes, ","))
			if err != nil {
				return fmt.Errorf("--scope: %w", err)
			}
			return withStore(cmd, func(st store.Store) error {
				var ts []string
				if types != "" {
					ts = strings.Split(types, ",")
				}
				k, raw, err := apikeys.CreateSpec(cmd.Context(), st, apikeys.Spec{Name: name, Scopes: sc, OnBehalfOf: onBehalfOf, Types: ts}, time.Now())
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.ErrOrStderr(), "created API key", k.ID, "("+k.Name+"); it is shown once, store it now:")
				fmt.Fprintln(cmd.OutOrStdout(), raw)
				return nil
			})
		},
	}
	create.Flags().StringVar(&name, "name", "", "who uses the key, e.g. n8n (required)")
	create.Flags().StringSliceVar(&scopes, "scope", []string{apikeys.ScopeRuns}, "scopes, repeated or comma-separated: "+strings.Join(apikeys.AllScopes, ", "))
	create.Flags().StringVar(&onBehalfOf, "on-behalf-of", "", "the person this key acts for (they can never approve its requests)")
	create.Flags().StringVar(&types, "types", "", "worker keys: comma-separated action types the key may claim (default: every worker type)")
	_ = create.MarkFlagRequired("name")

	list := &cobra.Command{
		Use:   "list",
		Short: "List keys (never their values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd, func(st store.Store) error {
				keys, err := st.APIKeyList(cmd.Context())
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tNAME\tSCOPES\tON_BEHALF_OF\tTYPES\tCREATED\tREVOKED")
				for _, k := range keys {
					revoked := "-"
					if k.RevokedAt != nil {
						revoked = k.RevokedAt.UTC().Format(time.RFC3339)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, strings.Join(k.Scopes, ","), orDash(k.OnBehalfOf),
						orDash(strings.Join(k.Types, ",")), k.CreatedAt.UTC().Format(time.RFC3339), revoked)
				}
				return tw.Flush()
			})
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a key: requests with it get 401 within --api-key-cache-ttl (2s by default)",
		Long: `revoke marks the key revoked in the database. Each serve trusts a key it has checked
for AIRLOCK_API_KEY_CACHE_TTL (default 2s), so every instance answers 401 to it within
that time; the revocation prints "revoked ID" and is recorded with the key's row.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd, func(st store.Store) error {
				err := st.APIKeyRevoke(cmd.Context(), args[0], time.Now())
				if errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("no unrevoked API key has id %q", args[0])
				}
				if err == nil {
					fmt.Fprintln(cmd.OutOrStdout(), "revoked", args[0])
				}
				return err
			})
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

// healthcheckCmd asks the local server's /readyz, or with --live its /healthz: for
// container health checks, in an image that has no shell or curl to do it.
func healthcheckCmd() *cobra.Command {
	var timeout time.Duration
	var live bool
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 if the server on --listen answers /readyz (--live: /healthz) with 200 (for container health checks)",
		Long: `healthcheck asks the server on --listen whether it is ready (/readyz: the database
answers, its schema is current, a write commits, and a SQLite disk has room), or with
--live only whether it is alive (/healthz: the process serves HTTP). The image's
HEALTHCHECK uses --live: an orchestrator that replaces unhealthy containers must not
replace every instance while the database restarts. Use the readiness form where health
decides traffic, not restarts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			host, port, _ := net.SplitHostPort(cfg.Listen)
			if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
				host = "127.0.0.1"
			}
			path, state := "/readyz", "ready"
			if live {
				path, state = "/healthz", "alive"
			}
			url := "http://" + net.JoinHostPort(host, port) + path
			resp, err := (&http.Client{Timeout: timeout}).Get(url)
			if err != nil {
				return fmt.Errorf("not %s: %w", state, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("not %s: %s answered %d", state, url, resp.StatusCode)
			}
			fmt.Fprintln(cmd.OutOrStdout(), state)
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for the answer")
	cmd.Flags().BoolVar(&live, "live", false, "ask /healthz (alive) instead of /readyz (ready)")
	return cmd
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "airlock", version.String())
		},
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// listenError says why serve cannot listen on addr and what to do about it.
func listenError(addr string, err error) error {
	var hint string
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		hint = "the address is already in use: another program listens there (another airlock serve?). Stop it, or give serve another address: --listen 127.0.0.1:8081 (or AIRLOCK_LISTEN)"
	case errors.Is(err, syscall.EACCES):
		hint = "permission denied: ports below 1024 need privileges. Use a port of 1024 or more (--listen 127.0.0.1:8080), or grant the binary CAP_NET_BIND_SERVICE"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		hint = "this machine has no such address. Use one of its own: 127.0.0.1 for this machine only, 0.0.0.0 for every interface (--listen or AIRLOCK_LISTEN)"
	default:
		return fmt.Errorf("cannot listen on %s: %w", addr, err)
	}
	return fmt.Errorf("cannot listen on %s: %s (%w)", addr, hint, err)
}
