package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/scale"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
)

// citusShards is how many hash partitions stand for Citus's shards in TestCitusPlan.
const citusShards = 8

// TestCitusPlan keeps docs/scaling.md's Citus plan true as the schema and the
// statements grow. No Citus build is installable on these machines, so PostgreSQL's own
// hash partitioning stands in for Citus's hash distribution: every table the plan
// distributes is rebuilt as a table partitioned by HASH of its distribution column into
// citusShards partitions (with every primary key and unique constraint made to include
// that column, as Citus requires). Tables hashed on the same text value put it in the
// same partition number, which is Citus's co-location; partition pruning is its shard
// pruning. The hot operations (those TestHotQueriesUseIndexes runs, then citusOperations:
// every other method of the store but those citusUnrun names) run on that schema, every
// statement the store sends is recorded with the store method that sent it and the
// transaction it ran in, and each is run again under EXPLAIN ANALYZE in a transaction
// that is rolled back: the partitions it scanned (the plan's executed scans) or wrote
// (rows of its transaction) are the shards it would touch.
//
// It fails on: a statement touching more than one shard whose method and tables the
// plan's cross-shard table does not list; a node-local feature (advisory locks,
// LISTEN/NOTIFY, pg_locks, snapshots, ctid, SET LOCAL) its feature table does not list
// for the method; a transaction whose one-shard statements reach several shards that
// its transaction table does not list (by the function that began it); a table,
// trigger, or unique constraint without the distribution column that the plan does not
// list; and a row of the plan that nothing needs any more.
func TestCitusPlan(t *testing.T) {
	if os.Getenv("AIRLOCK_TEST_CITUS") == "1" {
		// It stands hash partitioning in for Citus on a plain PostgreSQL; on a real
		// cluster the tables are distributed already, and TestCitusRouting checks them.
		t.Skip("on Citus: TestCitusRouting checks the plan there")
	}
	plan := readCitusPlan(t, "../../docs/scaling.md")
	rec := &citusRecorder{open: map[*pgx.Conn]int{}}
	st := scale.OpenTraced(t, rec)
	ctx := context.Background()
	checkCitusSchema(t, st.Pool(), plan)
	if t.Failed() {
		return
	}
	e := scale.WithHistory(t, st, 400, 2000)
	parts, err := distributeByHash(ctx, st.Pool(), plan.distributed(), citusShards)
	if err != nil {
		t.Fatalf("distribute the plan's tables: %v", err)
	}
	rec.set(true)
	op := func(name string, fn func(ctx context.Context) error) {
		t.Helper()
		if err := fn(context.WithValue(ctx, opKey{}, name)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	hotOperations(e, st, op)
	citusOperations(t, e, st, op)
	rec.set(false)

	seenCross := map[string]bool{}
	seenFeature := map[string]bool{}
	checked := 0
	most := map[string]int{} // store method → the most shards one of its statements touched
	type result struct {
		touched  map[string]map[int]bool
		analyzed bool
	}
	cache := map[string]result{}
	reported := map[string]bool{}       // a statement's text, once reported
	txnShards := map[int]map[int]bool{} // transaction → shards its one-shard statements touched
	txnMethods := map[int]map[string]bool{}
	for _, s := range rec.stmts {
		if s.method == "" {
			if txControl.MatchString(s.sql) {
				continue
			}
			t.Logf("not a store statement (%s): %s", s.op, oneLine(s.sql))
			continue
		}
		for _, f := range citusFeatures {
			if !f.re.MatchString(s.sql) {
				continue
			}
			seenFeature[s.method+"\x00"+f.name] = true
			if !plan.features[s.method][f.name] {
				t.Errorf("%s (%s) uses %s, which is per node on Citus, and the plan's feature table does not list it for %s:\n%s",
					s.method, s.op, f.name, s.method, oneLine(s.sql))
			}
		}
		if !dml.MatchString(s.sql) {
			continue
		}
		key := s.sql + "\x00" + fmt.Sprint(s.args)
		res, ok := cache[key]
		if !ok {
			touched, analyzed, err := shardsTouched(ctx, st.Pool(), parts, plan.distributed(), s)
			if err != nil {
				t.Fatalf("%s (%s): %v\n%s", s.method, s.op, err, oneLine(s.sql))
			}
			res = result{touched, analyzed}
			cache[key] = res
			checked++
		}
		touched, analyzed := res.touched, res.analyzed
		if !analyzed && !reported["analyze\x00"+s.sql] {
			reported["analyze\x00"+s.sql] = true
			t.Logf("%s (%s) failed when run again: only EXPLAINed", s.method, s.op)
		}
		if most[s.method] < shardCount(touched) {
			most[s.method] = shardCount(touched)
		}
		blamed := crossShard(touched)
		if len(blamed) == 0 {
			if s.txn >= 0 {
				if txnShards[s.txn] == nil {
					txnShards[s.txn], txnMethods[s.txn] = map[int]bool{}, map[string]bool{}
				}
				for _, shards := range touched {
					for sh := range shards {
						txnShards[s.txn][sh] = true
					}
				}
				txnMethods[s.txn][s.method] = true
			}
			continue
		}
		seenCross[s.method] = true
		var missing []string
		for _, table := range blamed {
			if !plan.cross[s.method][table] {
				missing = append(missing, table)
			}
		}
		if len(missing) > 0 && !reported[s.sql] {
			reported[s.sql] = true
			how := "EXPLAIN ANALYZE"
			if !analyzed {
				how = "EXPLAIN (the statement failed when run again)"
			}
			t.Errorf("%s (%s) touches %s on more than one shard (%s: %s) and the plan does not list it as a cross-shard statement on %s:\n%s",
				s.method, s.op, strings.Join(missing, ", "), how, describeShards(touched), strings.Join(missing, ", "), oneLine(s.sql))
		}
	}
	seenTxn := map[string]bool{}
	for txn, shards := range txnShards {
		if len(shards) <= 1 {
			continue
		}
		caller := rec.txns[txn]
		seenTxn[caller] = true
		if !plan.txns[caller] && !reported["txn\x00"+caller] {
			reported["txn\x00"+caller] = true
			methods := slices.Sorted(maps.Keys(txnMethods[txn]))
			t.Errorf("a transaction begun by %s touches %d shards with one-shard statements (%s), and the plan's table of transactions does not list it",
				caller, len(shards), strings.Join(methods, ", "))
		}
	}
	for caller := range plan.txns {
		if !seenTxn[caller] {
			t.Errorf("the plan lists transactions begun by %s as spanning shards, but none did here: remove it from the plan, or make the operations run it", caller)
		}
	}
	for method := range plan.cross {
		if !seenCross[method] {
			t.Errorf("the plan lists %s as a cross-shard statement, but no statement of it touched more than one shard here: "+
				"remove it from the plan, or make the operations run it", method)
		}
	}
	for method, fs := range plan.features {
		for f := range fs {
			if !seenFeature[method+"\x00"+f] {
				t.Errorf("the plan lists %s as using %s, but no statement of it did here: remove it from the plan, or make the operations run it", method, f)
			}
		}
	}
	ran := map[string]bool{}
	for _, s := range rec.stmts {
		ran[s.method] = true
	}
	var notRun []string
	ty := reflect.TypeOf(st)
	for i := range ty.NumMethod() {
		if m := ty.Method(i).Name; !ran[m] && citusUnrun[m] == "" {
			notRun = append(notRun, m)
		}
	}
	if len(notRun) > 0 {
		t.Errorf("store methods the check never ran: %s. Make citusOperations run them, or list them in citusUnrun with the reason", strings.Join(notRun, ", "))
	}
	for m := range citusUnrun {
		if ran[m] {
			t.Errorf("citusUnrun lists %s, which the operations ran: remove it", m)
		}
	}
	var summary []string
	for m, n := range most {
		summary = append(summary, fmt.Sprintf("%s %d", m, n))
	}
	sort.Strings(summary)
	t.Logf("shards touched at most, by store method: %s", strings.Join(summary, ", "))
	if checked < 40 {
		t.Fatalf("only %d statements checked: the recorder missed the operations", checked)
	}
	t.Logf("%d statements checked against the plan on %d shards", checked, citusShards)
}

// citusOperations are the operations beyond the hot ones whose statements the plan
// must account for: several runs dispatched together, the sweepers, a gated effect
// approved, a replacement, an idempotent replay, chain verification, the kill switch,
// and a LISTEN woken by a NOTIFY.
func citusOperations(t *testing.T, e *apptest.EffectsEnv, st *postgres.Store, op func(name string, fn func(ctx context.Context) error)) {
	t.Helper()
	keys := []string{"cit-a", "cit-b", "cit-c", "cit-d"}
	var effs []store.Effect
	var approvalID string
	op("queue on four runs", func(ctx context.Context) error {
		for _, key := range keys {
			res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: key, PayloadHash: "h", Actor: "test"})
			if err != nil {
				return err
			}
			eff, _, _, err := e.Effects.Queue(ctx, effects.QueueRequest{Key: key, Owner: res.Run.LeaseOwner, Version: res.Run.Version,
				ActionType: "note", Target: "default", Payload: json.RawMessage(`{"n":2}`), Actor: "test"})
			if err != nil {
				return err
			}
			effs = append(effs, eff)
		}
		return nil
	})
	op("dispatch four runs", func(ctx context.Context) error { _, err := e.Dispatcher.Tick(ctx); return err })
	op("effect by id", func(ctx context.Context) error { _, err := e.Effects.Get(ctx, effs[0].ID); return err })
	op("transition", func(ctx context.Context) error {
		r, err := e.Runs.Get(ctx, keys[0])
		if err != nil {
			return err
		}
		_, err = e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: runs.LeaseRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version, Actor: "test"},
			To: store.StateCompleted, Result: json.RawMessage(`{"ok":true}`)})
		return err
	})
	op("gated effect approved", func(ctx context.Context) error {
		r, err := e.Runs.Get(ctx, keys[1])
		if err != nil {
			return err
		}
		sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version,
			ActionType: "email", Target: "default", Payload: json.RawMessage(`{"to":"a"}`), Actor: "apikey:wf"})
		if err != nil {
			return err
		}
		if sub.Approval == nil {
			return fmt.Errorf("the email was not gated: %+v", sub)
		}
		approvalID = sub.Approval.Approval.ID
		_, err = e.Approvals.Decide(ctx, approvals.HashToken(sub.Approval.Token), approvals.Approve, "",
			approvals.Person{Subject: "lead", Roles: []string{"support-lead"}})
		return err
	})
	op("worker report", func(ctx context.Context) error {
		r, err := e.Runs.Get(ctx, keys[2])
		if err != nil {
			return err
		}
		if _, _, _, err := e.Effects.Queue(ctx, effects.QueueRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version,
			ActionType: "task", Target: "default", Payload: json.RawMessage(`{"n":3}`), Actor: "test"}); err != nil {
			return err
		}
		eff, ok, err := e.Effects.WorkerClaim(ctx, []string{"task"}, time.Minute, "worker")
		if err != nil || !ok {
			return fmt.Errorf("worker claim: %v %v", ok, err)
		}
		_, err = e.Effects.WorkerReport(ctx, eff.ID, eff.LeaseOwner, connector.Result{Outcome: connector.Sent, ProviderID: "p-1"}, "worker")
		return err
	})
	// Statements the operations above reach only on paths that take long to stage (a
	// reconciliation answered "not yet", an approval expiring, a reissue, a readiness
	// check): the store's own methods send them as their callers would.
	op("by-id paths", func(ctx context.Context) error {
		eff := effs[0]
		if err := st.EffectCheckLater(ctx, eff.ID, eff.Version, e.Clock.Now()); err != nil && !errors.Is(err, store.ErrNoMatch) {
			return err
		}
		if _, err := st.ApprovalByID(ctx, approvalID); err != nil {
			return err
		}
		if _, err := st.ApprovalExpire(ctx, approvalID, nil); err != nil && !errors.Is(err, store.ErrNoMatch) {
			return err
		}
		// The begin-mark's and the grouped outcomes' transaction forms: the dispatcher takes
		// them for what BeginSends and EffectUpdateManyLocked leave (held, ended-run or
		// lost-lease effects; outcomes of approved runs), sent here by an owner that holds
		// nothing, so nothing changes.
		two := []string{effs[0].ID, effs[1].ID}
		if _, err := st.EffectMarkStarted(ctx, "citus-nobody", two, nil); err != nil {
			return err
		}
		var bq store.BatchQueries = st
		failed := "server_error"
		ps := []store.EffectUpdateParams{
			{ID: two[0], From: []store.EffectState{store.EffectSending}, Owner: "citus-nobody", To: store.EffectFailed, ErrorClass: &failed},
			{ID: two[1], From: []store.EffectState{store.EffectSending}, Owner: "citus-nobody", To: store.EffectFailed, ErrorClass: &failed},
		}
		if _, err := bq.EffectUpdateMany(ctx, ps, nil); err != nil {
			return err
		}
		// The fallback's run locks: a group of several runs locked in key order.
		if err := st.Transact(ctx, func(q store.Queries) error { _, err := q.RunLockKeys(ctx, keys); return err }); err != nil {
			return err
		}
		return st.ReadinessWrite(ctx, "citus-plan")
	})
	op("the rest of the store", func(ctx context.Context) error { return citusRest(ctx, e, st, approvalID) })
	op("sweepers", func(ctx context.Context) error {
		if err := e.Effects.SweepExpired(ctx); err != nil {
			return err
		}
		if err := e.Effects.Reconcile(ctx); err != nil {
			return err
		}
		if err := e.Runs.SweepStalled(ctx); err != nil {
			return err
		}
		// The stall mark, whether or not the sweep found a stalled run to mark.
		if _, err := st.RunStallMark(ctx, "cit-a", 1, nil); err != nil {
			return err
		}
		if _, err := st.EffectsWaiting(ctx, e.Clock.Now(), 10); err != nil { // the console's unsent list
			return err
		}
		return e.Approvals.Sweep(ctx) // expiry, warnings, escalations, approvals nobody can decide
	})
	// gen-5 and cit-new-5 hash to different partitions of eight, as most pairs of keys do.
	op("replacement", func(ctx context.Context) error {
		_, err := e.Failures.Replace(ctx, "gen-5", "cit-new-5", "rerun after a fix", "operator")
		if err != nil {
			return err
		}
		_, err = e.Runs.Claim(ctx, runs.ClaimRequest{Key: "cit-new-5", PayloadHash: "h", Actor: "test"})
		return err
	})
	op("kill switch", func(ctx context.Context) error {
		if err := e.Effects.SetKillSwitch(ctx, "action:ping", false, "test", "operator"); err != nil {
			return err
		}
		return e.Effects.SetKillSwitch(ctx, "action:ping", true, "test", "operator")
	})
	op("replay", func(ctx context.Context) error {
		scope := store.ReplayScope{APIKeyID: "k1", Route: "POST /v1/runs/claim", Key: "idem-1"}
		return st.Transact(ctx, func(q store.Queries) error {
			if ok, err := q.ReplayLock(ctx, scope); err != nil || !ok {
				return fmt.Errorf("replay lock: %v %v", ok, err)
			}
			if _, err := q.ReplayGet(ctx, scope, nil); !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("replay get: %v", err)
			}
			return q.ReplayInsert(ctx, store.Replay{ReplayScope: scope, RequestHash: "rh", Status: 200, Response: []byte("sealed")}, time.Hour, nil)
		})
	})
	op("audit checkpoint", func(ctx context.Context) error {
		key, err := store.NewAuditKey()
		if err != nil {
			return err
		}
		_, err = audit.New(st, nil).TakeCheckpoint(ctx, key)
		return err
	})
	op("verify chains", func(ctx context.Context) error {
		n := 0
		err := audit.New(st, nil).VerifyAll(ctx, func(c audit.ChainCheck) error {
			if !c.OK {
				return fmt.Errorf("chain of %q: %s", c.Key, c.Problem)
			}
			if n++; n == 300 {
				return errStopVerify
			}
			return nil
		})
		if errors.Is(err, errStopVerify) {
			return nil
		}
		return err
	})
	op("listen", func(ctx context.Context) error {
		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		woken := make(chan struct{}, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			st.ListenEffects(lctx, func() {
				select {
				case woken <- struct{}{}:
				default:
				}
			})
		}()
		defer func() { cancel(); <-done }()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); { // the LISTEN may start after the first NOTIFYs: send until one arrives
			if err := st.EffectNotify(ctx); err != nil {
				return err
			}
			select {
			case <-woken:
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
		return fmt.Errorf("no wake-up from LISTEN")
	})
}

var errStopVerify = errors.New("verified enough chains")

// citusUnrun are the methods of the PostgreSQL store that TestCitusPlan does not run,
// and why; every other method must send its statements during the check.
var citusUnrun = map[string]string{
	"Backend":                   "sends nothing",
	"ChainSnapshot":             "sends only BEGIN and ROLLBACK: the ChainHeadGet and ChainEvents verify runs in it are checked under their names",
	"Close":                     "sends nothing",
	"Pool":                      "sends nothing",
	"QueryMode":                 "sends nothing",
	"ListenSeparate":            "sends nothing",
	"ListenState":               "sends nothing: the LISTEN connection's state, kept in memory",
	"Ping":                      "a ping, no table",
	"Transact":                  "a wrapper: its statements are its callers'",
	"Within":                    "a wrapper: its statements are its callers'",
	"Migrate":                   "migrations run before the check, on the schema as the migrations make it",
	"ApplyMigrations":           "migrations run before the check, on the schema as the migrations make it",
	"ApplyMigrationList":        "migrations run before the check, on the schema as the migrations make it",
	"SchemaCurrent":             "reads schema_migrations (a coordinator table) at start-up",
	"HideCountedEffectsForTest": "one test's rolled-back delete",
	"IsCitus":                   "reads pg_extension (a catalog) at open and migrate",
	"CitusPlacement":            "reads Citus's catalog after migrate",
	"CitusHealth":               "airlock verify's citus line: Citus's catalog and node probes (TestVerifyCitusWorkerDown runs it on Citus)",
	"ShardedByRun":              "sends nothing: whether the database is a Citus coordinator, known at open",
}

// citusRest runs the store's remaining statements the way their callers send them:
// sign-in and API keys (reference tables), a run's evidence, failures, validations and
// ledger, the paths of requeue, cancel and refusal, and airlock verify's probes.
func citusRest(ctx context.Context, e *apptest.EffectsEnv, st *postgres.Store, approvalID string) error {
	now := e.Clock.Now()
	steps := []func() error{
		func() error { _, err := st.Clock(ctx); return err },
		func() error { _, err := st.AlertOutboxTake(ctx, 10); return err },
		func() error { return st.AlertOutboxDelete(ctx, []int64{0}) },
		func() error {
			_, err := st.EffectClaimRecheck(ctx, []string{"invoice"}, &now, time.Minute, 10)
			return err
		},
		func() error { return ignoreNoMatch(st.EffectRecheckDone(ctx, "cit-none", 1)) },
		func() error { _, err := st.WriterLevelGet(ctx); return err },
		func() error {
			_, err := st.InstanceHeartbeat(ctx, store.Instance{ID: "cit-instance", Hostname: "h", PID: 1, Version: "v", Level: store.WriterLevel, Role: "serve"}, &now)
			return err
		},
		func() error { _, err := st.InstanceList(ctx, now.Add(-time.Minute)); return err },
		func() error { return st.InstanceDeregister(ctx, "cit-instance") },
		func() error { _, err := st.Replication(ctx); return err },
		func() error {
			return st.APIKeyInsert(ctx, store.APIKey{ID: "cit-key", Name: "cit", Hash: "cit-hash", Scopes: []string{"runs"}, CreatedAt: now})
		},
		func() error { _, err := st.APIKeyByHash(ctx, "cit-hash"); return err },
		func() error { _, err := st.APIKeyList(ctx); return err },
		func() error { return st.APIKeyRevoke(ctx, "cit-key", now) },
		func() error {
			return st.UserInsert(ctx, store.User{ID: "cit-user", Name: "cit-lead", PasswordHash: "x", Roles: []string{"support-lead"}})
		},
		func() error { _, err := st.UserByName(ctx, "cit-lead"); return err },
		func() error { _, err := st.UserList(ctx); return err },
		func() error {
			_, err := st.UserUpdate(ctx, store.UserUpdateParams{Name: "cit-lead", Roles: []string{"support-lead", "admin"}})
			return err
		},
		func() error {
			return st.SessionInsert(ctx, store.Session{IDHash: "cit-session", UserID: "cit-user", Subject: "cit-lead",
				Roles: []string{"support-lead"}, CreatedAt: now, ExpiresAt: now.Add(time.Hour)})
		},
		func() error { _, err := st.SessionTouch(ctx, "cit-session", time.Hour, &now); return err },
		func() error { return st.SessionDelete(ctx, "cit-session") },
		func() error { _, err := st.SessionsEndForUser(ctx, "cit-user"); return err },
		func() error { return st.UserDelete(ctx, "cit-lead") },
		func() error { _, err := st.SecretGet(ctx, "intent_cookie"); return err },
		func() error { _, _, err := st.ThrottleGet(ctx, "client:cit", nil); return err },
		func() error {
			return st.Transact(ctx, func(q store.Queries) error {
				t, _, err := q.ThrottleLock(ctx, "client:cit", nil)
				if err != nil {
					return err
				}
				t.Failures++
				t.NextAt, t.UpdatedAt = now, now
				return q.ThrottlePut(ctx, t)
			})
		},
		func() error { return st.ThrottleDelete(ctx, "client:cit") },
		func() error {
			_, err := st.EvidenceInsert(ctx, store.Evidence{RunKey: "cit-c", Source: "classifier", Name: "score",
				Value: json.RawMessage(`0.99`), RecordedBy: "apikey:eval"})
			return err
		},
		func() error { _, err := st.EvidenceByRun(ctx, "cit-c"); return err },
		func() error { _, err := st.FailureAttempt(ctx, "cit-c", "timeout"); return err },
		func() error {
			_, err := st.ValidationInsert(ctx, store.Validation{RunKey: "cit-c", ActionType: "note", Valid: true, OutputHash: "o",
				Value: json.RawMessage(`{}`)})
			return err
		},
		func() error { _, err := st.ValidationLatestValid(ctx, "cit-c", "note"); return err },
		func() error {
			if err := st.LedgerInsert(ctx, "cit-c", 1, json.RawMessage(`{"steps":[]}`), nil); err != nil && !errors.Is(err, store.ErrNoMatch) {
				return err
			}
			_, _, err := st.LedgerLatest(ctx, "cit-c")
			return err
		},
		func() error { _, err := st.EffectByRunEffectID(ctx, "cit-c", "none"); return notFoundOK(err) },
		func() error { _, err := st.EffectRequeueFailed(ctx, "cit-c", nil); return err },
		func() error { _, err := st.EffectCancelPending(ctx, "cit-d", "run_failed", nil); return err },
		func() error { _, err := st.EventExistsExcept(ctx, "cit-c", []string{"claimed"}); return err },
		func() error {
			_, err := st.RunClaim(ctx, store.RunClaimParams{Key: "cit-e", PayloadHash: "h", Owner: "o", Lease: time.Minute})
			return err
		},
		func() error { _, err := st.RunRefuse(ctx, "cit-e", "h"); return err },
		func() error { _, err := st.ApprovalRekey(ctx, approvalID, "cit-rekeyed", nil); return noMatchOK(err) },
		func() error { _, err := st.ApprovalsOpen(ctx, "review", 10); return err },
		func() error {
			return st.PersonSeenPut(ctx, store.PersonSeen{Subject: "cit-sso", Roles: []string{"support-lead"}, SeenAt: now})
		},
		func() error { _, err := st.PeopleSeen(ctx, now.Add(-time.Hour)); return err },
		func() error { _, err := st.PersonSeenGet(ctx, "cit-sso"); return err },
		func() error {
			return st.SlackLinkPut(ctx, store.SlackLink{TeamID: "T1", UserID: "U1", Subject: "cit-sso", LinkedAt: now, LinkedBy: "cli:test"})
		},
		func() error { _, err := st.SlackLinkGet(ctx, "T1", "U1"); return err },
		func() error { return st.SlackLinkDelete(ctx, "T1", "U1") },
		func() error {
			return st.SlackCodePut(ctx, store.SlackCode{CodeHash: "cit-code", Subject: "cit-sso", ExpiresAt: now.Add(time.Hour)})
		},
		func() error { _, err := st.SlackCodeTake(ctx, "cit-code", &now); return err },
		func() error { _, err := st.SlackRequestSeen(ctx, "cit-sig", now, now.Add(-10*time.Minute)); return err },
		func() error { _, err := st.ApprovalsDue(ctx, store.StepWarn, nil, 10); return err },
		func() error {
			_, err := st.ApprovalClaimStep(ctx, approvalID, store.StepWarn, nil)
			return noMatchOK(err)
		},
		func() error { _, err := st.ApprovalSetUndecidable(ctx, approvalID, true, nil); return noMatchOK(err) },
		func() error { _, err := st.ApprovalSetUndecidable(ctx, approvalID, false, nil); return noMatchOK(err) },
		func() error { _, err := st.ApprovalsUndecidable(ctx, store.Cursor{}, nil, 10); return err },
		func() error { _, err := st.ApprovalsUndecidableCount(ctx, nil); return err },
		func() error { _, err := st.TransactionIsolation(ctx); return err },
		func() error { _, err := st.Multiplexed(ctx); return err },
		func() error { return st.VerifyCleanup(ctx, "verify-none-", "action:verify-none") },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
	}
	return nil
}

func notFoundOK(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	return err
}

func noMatchOK(err error) error {
	if errors.Is(err, store.ErrNoMatch) {
		return nil
	}
	return err
}

// --- the plan, as docs/scaling.md states it ---------------------------------------

type citusPlan struct {
	tables   map[string]citusTable      // every table of the schema
	cross    map[string]map[string]bool // store method → tables it may touch on several shards
	features map[string]map[string]bool // store method → node-local features it may use
	triggers map[string]string          // trigger → its table
	txns     map[string]bool            // callers of Transact whose transactions span shards
}

type citusTable struct {
	placement string // distributed, reference or coordinator
	column    string // the distribution column (distributed only)
	gains     []string
}

func (p citusPlan) distributed() map[string]string {
	out := map[string]string{}
	for name, tb := range p.tables {
		if tb.placement == "distributed" {
			out[name] = tb.column
		}
	}
	return out
}

// readCitusPlan reads the four tables of the plan's section "On Citus".
func readCitusPlan(t *testing.T, path string) citusPlan {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n### On Citus")
	if start < 0 {
		t.Fatalf("%s: no section \"### On Citus\"", path)
	}
	section := doc[start+1:]
	if end := strings.Index(section, "\n### What was tried"); end >= 0 {
		section = section[:end]
	}
	p := citusPlan{tables: map[string]citusTable{}, cross: map[string]map[string]bool{},
		features: map[string]map[string]bool{}, triggers: map[string]string{}, txns: map[string]bool{}}
	found := map[string]bool{}
	for _, tb := range markdownTables(section) {
		head := strings.Join(tb[0], "|")
		if len(tb[0]) > 1 {
			found[tb[0][0]+"|"+tb[0][1]] = true
		}
		for _, row := range tb[1:] {
			if len(row) < len(tb[0]) {
				t.Fatalf("%s: a row of the table headed %q has %d cells", path, head, len(row))
			}
			switch {
			case strings.HasPrefix(head, "Table|On Citus|Distribution column|Unique constraints that gain it|"):
				placement := row[1]
				if placement != "distributed" && placement != "reference" && placement != "coordinator" {
					t.Errorf("%s: table %s: placement %q is not distributed, reference or coordinator", path, row[0], placement)
				}
				col := row[2]
				if col == "—" {
					col = ""
				}
				if (placement == "distributed") != (col != "") {
					t.Errorf("%s: table %s: a distributed table names its distribution column, and only it", path, row[0])
				}
				p.tables[row[0]] = citusTable{placement: placement, column: col, gains: listCell(row[3])}
			case strings.HasPrefix(head, "Store method|Crosses shards on|"):
				for _, m := range listCell(row[0]) {
					p.cross[m] = setOf(listCell(row[1]))
				}
			case strings.HasPrefix(head, "Store method|Node-local feature|"):
				for _, m := range listCell(row[0]) {
					if p.features[m] == nil {
						p.features[m] = map[string]bool{}
					}
					for _, f := range listCell(row[1]) {
						p.features[m][f] = true
					}
				}
			case strings.HasPrefix(head, "Transaction begun by|Spans|"):
				for _, c := range listCell(row[0]) {
					p.txns[c] = true
				}
			case strings.HasPrefix(head, "Trigger|Table|"):
				for _, name := range listCell(row[0]) {
					p.triggers[name] = row[1]
				}
			}
		}
	}
	for _, want := range []string{"Table|On Citus", "Store method|Crosses shards on", "Store method|Node-local feature", "Trigger|Table", "Transaction begun by|Spans"} {
		if !found[want] {
			t.Fatalf("%s: the Citus plan has no table headed %q", path, strings.ReplaceAll(want, "|", " | "))
		}
	}
	return p
}

// markdownTables returns each table of a markdown text as rows of cells (header first,
// the separator row dropped), backticks and emphasis removed.
func markdownTables(text string) [][][]string {
	var out [][][]string
	var cur [][]string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			if cur != nil {
				out, cur = append(out, cur), nil
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i, c := range cells {
			cells[i] = strings.TrimSpace(strings.NewReplacer("`", "", "**", "").Replace(c))
		}
		if strings.Trim(strings.Join(cells, ""), "-: ") == "" {
			continue
		}
		cur = append(cur, cells)
	}
	if cur != nil {
		out = append(out, cur)
	}
	return out
}

// listCell splits a cell of comma-separated names; "—" is none.
func listCell(c string) []string {
	var out []string
	for _, s := range strings.Split(c, ",") {
		if s = strings.TrimSpace(s); s != "" && s != "—" {
			out = append(out, s)
		}
	}
	return out
}

func setOf(xs []string) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// --- the schema against the plan ------------------------------------------------------

// checkCitusSchema checks the migrated schema's tables, triggers and unique constraints
// against the plan, both ways.
func checkCitusSchema(t *testing.T, pool *pgxpool.Pool, plan citusPlan) {
	t.Helper()
	ctx := context.Background()
	tables := queryStrings(t, pool, `SELECT relname FROM pg_class
		WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p') ORDER BY relname`)
	for _, name := range tables {
		if _, ok := plan.tables[name]; !ok {
			t.Errorf("table %s is not in the Citus plan (docs/scaling.md): say whether it is distributed (by which column), a reference table, or stays on the coordinator", name)
		}
	}
	for name := range plan.tables {
		if !slices.Contains(tables, name) {
			t.Errorf("the Citus plan lists table %s, which the schema does not have", name)
		}
	}
	rows, err := pool.Query(ctx, `SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
		WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	triggers := map[string]string{}
	var name, table string
	if _, err := pgx.ForEachRow(rows, []any{&name, &table}, func() error { triggers[name] = table; return nil }); err != nil {
		t.Fatal(err)
	}
	for name, table := range triggers {
		if plan.triggers[name] != table {
			t.Errorf("trigger %s on %s is not in the Citus plan's trigger table (on Citus a trigger runs on a shard, if at all): say what it writes and what a deployment does", name, table)
		}
	}
	for name := range plan.triggers {
		if _, ok := triggers[name]; !ok {
			t.Errorf("the Citus plan lists trigger %s, which the schema does not have", name)
		}
	}
	for table, col := range plan.distributed() {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = $1::text::regclass AND attname = $2 AND NOT attisdropped`,
			table, col).Scan(&n); err != nil || n != 1 {
			t.Errorf("the Citus plan distributes %s by %s, which it does not have (%v)", table, col, err)
			continue
		}
		lacking := queryStrings(t, pool, `SELECT conname FROM pg_constraint
			WHERE conrelid = $1::text::regclass AND contype IN ('p', 'u')
			  AND NOT (SELECT attnum FROM pg_attribute WHERE attrelid = $1::text::regclass AND attname = $2) = ANY(conkey)
			ORDER BY conname`, table, col)
		if !slices.Equal(lacking, sorted(plan.tables[table].gains)) {
			t.Errorf("table %s: its unique constraints without %s are %v; the Citus plan says %v (Citus requires the distribution column in every unique constraint)",
				table, col, lacking, plan.tables[table].gains)
		}
	}
}

func sorted(xs []string) []string {
	out := slices.Clone(xs)
	sort.Strings(out)
	if out == nil {
		out = []string{}
	}
	return out
}

func queryStrings(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if out == nil {
		out = []string{}
	}
	return out
}

// --- hash partitions standing in for shards -------------------------------------------

type shardOf struct {
	table string
	shard int
}

// distributeByHash rebuilds each table (name → column) as a table partitioned by HASH of
// the column into n partitions <table>_p<i>, keeping its columns, defaults, identity,
// checks, indexes, triggers and foreign keys; a primary key or unique constraint without
// the column gets it first, as create_distributed_table requires. Rows are copied over
// before the triggers are made again, so none fires. It returns partition name →
// (table, shard).
func distributeByHash(ctx context.Context, pool *pgxpool.Pool, tables map[string]string, n int) (map[string]shardOf, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	names := make([]string, 0, len(tables))
	for name := range tables {
		names = append(names, name)
	}
	sort.Strings(names)
	strs := func(sql string, args ...any) ([]string, error) {
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[string])
	}
	var fks, later []string // foreign keys to and from the tables; their other definitions
	for _, name := range names {
		// Foreign keys from and to the table, dropped with it and added back at the end.
		defs, err := strs(`SELECT DISTINCT format('ALTER TABLE %I ADD CONSTRAINT %I %s', conrelid::regclass, conname, pg_get_constraintdef(oid))
			FROM pg_constraint WHERE contype = 'f' AND (conrelid = $1::text::regclass OR confrelid = $1::text::regclass)`, name)
		if err != nil {
			return nil, err
		}
		fks = append(fks, defs...)
		// Primary keys and unique constraints, with the column put first where missing.
		defs, err = strs(`SELECT format('ALTER TABLE %I ADD CONSTRAINT %I %s (%s)', $1::text, conname,
			  CASE contype WHEN 'p' THEN 'PRIMARY KEY' ELSE 'UNIQUE' END,
			  (SELECT string_agg(quote_ident(a), ', ' ORDER BY o) FROM unnest(
			    CASE WHEN $2::text = ANY(cols) THEN cols ELSE $2::text || cols END) WITH ORDINALITY AS u(a, o)))
			FROM (SELECT conname, contype, ARRAY(SELECT attname::text FROM unnest(conkey) WITH ORDINALITY AS k(num, o)
			        JOIN pg_attribute ON attrelid = conrelid AND attnum = k.num ORDER BY k.o) AS cols
			      FROM pg_constraint WHERE conrelid = $1::text::regclass AND contype IN ('p', 'u')) c`, name, tables[name])
		if err != nil {
			return nil, err
		}
		later = append(later, defs...)
		defs, err = strs(`SELECT pg_get_indexdef(indexrelid) FROM pg_index
			WHERE indrelid = $1::text::regclass AND NOT EXISTS (SELECT FROM pg_constraint WHERE conindid = indexrelid)`, name)
		if err != nil {
			return nil, err
		}
		later = append(later, defs...)
		defs, err = strs(`SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = $1::text::regclass AND NOT tgisinternal`, name)
		if err != nil {
			return nil, err
		}
		later = append(later, defs...)
	}
	for _, name := range names {
		drops, err := strs(`SELECT format('ALTER TABLE %I DROP CONSTRAINT IF EXISTS %I', conrelid::regclass, conname)
			FROM pg_constraint WHERE contype = 'f' AND (conrelid = $1::text::regclass OR confrelid = $1::text::regclass)`, name)
		if err != nil {
			return nil, err
		}
		for _, d := range drops {
			if _, err := tx.Exec(ctx, d); err != nil {
				return nil, fmt.Errorf("%s: %w", d, err)
			}
		}
	}
	parts := map[string]shardOf{}
	var identities []string
	for _, name := range names {
		// A serial column's sequence belongs to the old table: hand it to the new one.
		seqs, err := strs(`SELECT format('ALTER SEQUENCE %s OWNED BY %I.%I', pg_get_serial_sequence(quote_ident($1), attname), $1::text, attname)
			FROM pg_attribute WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped AND attidentity = ''
			  AND pg_get_serial_sequence(quote_ident($1), attname) IS NOT NULL`, name)
		if err != nil {
			return nil, err
		}
		id, old := pgx.Identifier{name}.Sanitize(), pgx.Identifier{name + "_plain"}.Sanitize()
		stmts := []string{
			`ALTER TABLE ` + id + ` RENAME TO ` + old,
			`CREATE TABLE ` + id + ` (LIKE ` + old + ` INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING CONSTRAINTS INCLUDING GENERATED)
			  PARTITION BY HASH (` + pgx.Identifier{tables[name]}.Sanitize() + `)`,
		}
		for i := range n {
			part := fmt.Sprintf("%s_p%d", name, i)
			parts[part] = shardOf{name, i}
			stmts = append(stmts, fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES WITH (MODULUS %d, REMAINDER %d)`,
				pgx.Identifier{part}.Sanitize(), id, n, i))
		}
		stmts = append(stmts, seqs...)
		stmts = append(stmts, `INSERT INTO `+id+` OVERRIDING SYSTEM VALUE SELECT * FROM `+old, `DROP TABLE `+old)
		// An identity column has a new sequence: it continues after the copied rows.
		idents, err := strs(`SELECT format('SELECT setval(pg_get_serial_sequence(%L, %L), coalesce(max(%I), 0) + 1, false) FROM %I', $1::text, attname, attname, $1::text)
			FROM pg_attribute WHERE attrelid = $1::text::regclass AND attidentity <> ''`, name)
		if err != nil {
			return nil, err
		}
		identities = append(identities, idents...)
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return nil, fmt.Errorf("%s: %w", oneLine(s), err)
			}
		}
	}
	slices.Sort(fks)
	fks = slices.Compact(fks) // a key between two of the tables was found from both
	analyze := `ANALYZE`
	for i, name := range names {
		analyze += map[bool]string{true: " ", false: ", "}[i == 0] + pgx.Identifier{name}.Sanitize()
	}
	for _, s := range slices.Concat(later, fks, identities, []string{analyze}) {
		if _, err := tx.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("%s: %w", oneLine(s), err)
		}
	}
	return parts, tx.Commit(ctx)
}

// shardsTouched runs s again under EXPLAIN ANALYZE in a transaction it rolls back and
// returns, per distributed table, the shards whose partitions it scanned (an executed
// scan of the plan) or wrote (rows of its transaction). A statement that fails when run
// again (a key it inserted exists now) is only EXPLAINed: its scans that survive
// pruning at plan time.
func shardsTouched(ctx context.Context, pool *pgxpool.Pool, parts map[string]shardOf, tables map[string]string, s citusStmt) (map[string]map[int]bool, bool, error) {
	touched := map[string]map[int]bool{}
	add := func(part string) {
		if p, ok := parts[part]; ok {
			if touched[p.table] == nil {
				touched[p.table] = map[int]bool{}
			}
			touched[p.table][p.shard] = true
		}
	}
	explain := func(analyze bool) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		opts := "FORMAT JSON"
		if analyze {
			opts = "ANALYZE, " + opts
		}
		var plan []struct {
			Plan citusPlanNode `json:"Plan"`
		}
		var raw []byte
		if err := tx.QueryRow(ctx, "EXPLAIN ("+opts+") "+s.sql, s.args...).Scan(&raw); err != nil {
			return err
		}
		if err := json.Unmarshal(raw, &plan); err != nil {
			return err
		}
		for _, p := range plan {
			p.Plan.walk(func(n citusPlanNode) {
				if !analyze || n.Loops > 0 {
					add(n.Relation)
				}
			})
		}
		if !analyze {
			return nil
		}
		var wrote bool
		if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned() IS NOT NULL`).Scan(&wrote); err != nil {
			return err
		}
		for table := range tables {
			if !wrote {
				break
			}
			rows, err := tx.Query(ctx, `SELECT DISTINCT tableoid::regclass::text FROM `+pgx.Identifier{table}.Sanitize()+`
				WHERE xmin::text = (pg_current_xact_id()::text::bigint % 4294967296)::text`)
			if err != nil {
				return err
			}
			written, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			for _, part := range written {
				add(part)
			}
		}
		return nil
	}
	if err := explain(true); err == nil {
		return touched, true, nil
	}
	touched = map[string]map[int]bool{}
	return touched, false, explain(false)
}

type citusPlanNode struct {
	Relation string          `json:"Relation Name"`
	Loops    float64         `json:"Actual Loops"`
	Plans    []citusPlanNode `json:"Plans"`
}

func (n citusPlanNode) walk(fn func(citusPlanNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// crossShard returns the tables to blame when a statement touched more than one shard:
// those it touched on several, else (one shard each, but not the same one) all of them.
func crossShard(touched map[string]map[int]bool) []string {
	all := map[int]bool{}
	var several, any []string
	for table, shards := range touched {
		for s := range shards {
			all[s] = true
		}
		if len(shards) > 1 {
			several = append(several, table)
		}
		any = append(any, table)
	}
	if len(all) <= 1 {
		return nil
	}
	if len(several) > 0 {
		sort.Strings(several)
		return several
	}
	sort.Strings(any)
	return any
}

func shardCount(touched map[string]map[int]bool) int {
	all := map[int]bool{}
	for _, shards := range touched {
		for s := range shards {
			all[s] = true
		}
	}
	return len(all)
}

func describeShards(touched map[string]map[int]bool) string {
	var out []string
	for table, shards := range touched {
		out = append(out, fmt.Sprintf("%s on %d of %d", table, len(shards), citusShards))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// citusFeatures are what runs on one node only: on Citus each is the coordinator's (or
// the one worker's a routed statement reaches), not the cluster's.
var citusFeatures = []struct {
	name string
	re   *regexp.Regexp
}{
	{"advisory lock", regexp.MustCompile(`(?i)pg_(try_)?advisory`)},
	{"NOTIFY", regexp.MustCompile(`(?i)pg_notify|^\s*NOTIFY\b`)},
	{"LISTEN", regexp.MustCompile(`(?i)^\s*(UN)?LISTEN\b`)},
	{"pg_locks", regexp.MustCompile(`(?i)\bpg_locks\b`)},
	{"snapshot", regexp.MustCompile(`(?i)pg_current_snapshot|pg_snapshot_`)},
	{"ctid", regexp.MustCompile(`(?i)\bctid\b`)},
	{"SET LOCAL", regexp.MustCompile(`(?i)^\s*SET\s+LOCAL\b`)},
}

// --- recording statements with the store method that sent them ------------------------

type citusStmt struct {
	method, sql, op string
	args            []any
	txn             int // the transaction it ran in (an index of citusRecorder.txns), or -1: autocommit
}

// citusRecorder is a pgx tracer that keeps, while on, every statement sent, and the
// transactions they ran in.
type citusRecorder struct {
	mu    sync.Mutex
	on    bool
	stmts []citusStmt
	txns  []string          // each transaction's caller of Transact
	open  map[*pgx.Conn]int // a connection's transaction in progress
}

func (r *citusRecorder) set(on bool) { r.mu.Lock(); r.on = on; r.mu.Unlock() }

var (
	txBegin = regexp.MustCompile(`(?i)^\s*begin\b`)
	txEnd   = regexp.MustCompile(`(?i)^\s*(commit|rollback)\s*$`)
)

func (r *citusRecorder) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on {
		return ctx
	}
	switch {
	case txBegin.MatchString(d.SQL):
		r.txns = append(r.txns, txnCaller())
		r.open[conn] = len(r.txns) - 1
		return ctx
	case txEnd.MatchString(d.SQL):
		delete(r.open, conn)
		return ctx
	}
	txn, ok := r.open[conn]
	if !ok {
		txn = -1
	}
	r.stmts = append(r.stmts, citusStmt{method: storeMethod(), sql: d.SQL, args: d.Args, op: opName(ctx), txn: txn})
	return ctx
}

// txnCaller names the function that began a transaction: the first frame outside pgx and
// the PostgreSQL store, without its module path and closure suffixes
// ("effects.(*Dispatcher).record").
func txnCaller() string {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		fn := f.Function
		if !strings.HasPrefix(fn, "github.com/jackc/") && !strings.HasPrefix(fn, postgresPkg) && !strings.HasPrefix(fn, "runtime.") {
			fn = strings.TrimPrefix(fn, "github.com/airlockhq/airlock/internal/")
			for closure.MatchString(fn) {
				fn = closure.ReplaceAllString(fn, "")
			}
			return fn
		}
		if !more {
			return ""
		}
	}
}

var closure = regexp.MustCompile(`\.(func|gowrap)\d+$`)

func (r *citusRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A pipelined batch (pgx.Batch: statements sent together before one Sync, such as
// BeginSends's guard and mark) runs in one implicit transaction unless it is sent inside
// one: the recorder counts it as a transaction of its own, begun by its caller, and keeps
// each of its statements as it is read back (inside the store method that reads it).
type batchKey struct{}

func (r *citusRecorder) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on {
		return ctx
	}
	if _, inTx := r.open[conn]; inTx {
		return ctx
	}
	r.txns = append(r.txns, txnCaller())
	r.open[conn] = len(r.txns) - 1
	return context.WithValue(ctx, batchKey{}, true)
}

func (r *citusRecorder) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on {
		return
	}
	txn, ok := r.open[conn]
	if !ok {
		txn = -1
	}
	r.stmts = append(r.stmts, citusStmt{method: storeMethod(), sql: d.SQL, args: d.Args, op: opName(ctx), txn: txn})
}

func (r *citusRecorder) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchEndData) {
	if own, _ := ctx.Value(batchKey{}).(bool); own {
		r.mu.Lock()
		delete(r.open, conn)
		r.mu.Unlock()
	}
}

const postgresPkg = "github.com/airlockhq/airlock/internal/store/postgres."

// storeMethod names the exported method of the PostgreSQL store that is sending a
// statement: the innermost frame of the postgres package whose method (or the method a
// closure belongs to) is exported and is not a transaction or statement wrapper.
func storeMethod() string {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		if name, ok := strings.CutPrefix(f.Function, postgresPkg); ok {
			parts := strings.Split(name, ".") // queries.RunGet, (*Store).ReadinessWrite.func1
			if len(parts) >= 2 {
				m := parts[1]
				if m != "" && m[0] >= 'A' && m[0] <= 'Z' && !wrappers[m] {
					return m
				}
			}
		}
		if !more {
			return ""
		}
	}
}

var wrappers = map[string]bool{"Exec": true, "Query": true, "QueryRow": true, "Transact": true, "Within": true}

var txControl = regexp.MustCompile(`(?i)^\s*(begin|commit|rollback|savepoint|release)\b`)

var spaces = regexp.MustCompile(`\s+`)

func oneLine(sql string) string { return strings.TrimSpace(spaces.ReplaceAllString(sql, " ")) }

// ignoreNoMatch is err unless it is store.ErrNoMatch (a statement that found no row
// still ran: the plan is about the statements, not their rows).
func ignoreNoMatch(err error) error {
	if errors.Is(err, store.ErrNoMatch) {
		return nil
	}
	return err
}
