// Package store defines airlock's storage contract: one interface, the row types it
// returns and the sentinel errors it translates driver errors into. The backends live in
// postgres/ and sqlite/; storetest/ opens each for tests and holds the contract
// tests no service above the store takes part in.
//
// Stores hold SQL, not business rules: a method is one statement (or a fixed, documented
// sequence), and the domain packages decide which to run inside one Transact.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors every backend returns instead of driver errors.
var (
	// ErrNotFound: the row asked for does not exist.
	ErrNotFound = errors.New("not found")
	// ErrNoMatch: a compare-and-set found no row in the expected condition. The caller
	// reads the row to tell the client why.
	ErrNoMatch = errors.New("compare-and-set matched no row")
	// ErrUnfenced: an EffectUpdate would make an effect sendable again without naming the
	// row it decided on (neither Owner nor Version). A programming error, never retried.
	ErrUnfenced = errors.New("store: an effect is made sendable again only by compare-and-set on its lease owner or version")
	// ErrSchemaOutdated: the database has not been migrated to what this binary needs.
	ErrSchemaOutdated = errors.New("database schema is not up to date")
	// ErrInvalidValue: the database refused a value of the statement itself — bytes it
	// cannot store (PostgreSQL's data exceptions, SQLSTATE class 22: NUL or invalid UTF-8
	// in text, \u0000 in jsonb) or a broken constraint (class 23; SQLite's
	// SQLITE_CONSTRAINT). The same statement with the same values fails the same way, so
	// it is not retried; a transient failure (a lost connection) never carries this.
	// Transact and Within return it alongside the driver's error (errors.Is finds both).
	ErrInvalidValue = errors.New("the database refused a value")
	// ErrUnavailable: the database cannot do the work now — it is unreachable,
	// restarting or shutting down, read-only (a standby, a failover in progress, a
	// read-only file), out of disk, memory or connections, failing I/O, or locked past the
	// busy timeout — and the same request may succeed when sent again. Each backend
	// classifies its driver's errors into it (Unavailable); the cause stays wrapped, for
	// the log only.
	ErrUnavailable = errors.New("the database is unavailable")
)

// Unavailable marks err, a driver error that says the database cannot serve now, as
// ErrUnavailable; the cause stays reachable with errors.Is and errors.As. A nil error, or
// one already marked, is returned as it is.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// Headroom is a store that can tell how much its database may still grow: the embedded
// SQLite file, whose disk is this machine's. (A PostgreSQL server's disk is not visible
// to its clients: a full one shows as ErrUnavailable on the write that needs it.)
type Headroom interface {
	// Headroom returns how many bytes the database can still grow by: the free space of
	// the file system that holds it, or less if the database is capped (max_page_count).
	Headroom(ctx context.Context) (int64, error)
}

// State is a run's state; the CHECK constraint in both schemas lists the same set.
type State string

const (
	StateProcessing      State = "processing"
	StateAwaitingHuman   State = "awaiting_human"
	StateApproved        State = "approved"
	StateCompleted       State = "completed"
	StateFailedRetryable State = "failed_retryable"
	StateFailedTerminal  State = "failed_terminal"
	StateRejected        State = "rejected"
)

// States lists every run state.
var States = []State{StateProcessing, StateAwaitingHuman, StateApproved, StateCompleted,
	StateFailedRetryable, StateFailedTerminal, StateRejected}

// Run is a row of workflow_runs.
type Run struct {
	Key             string
	State           State
	PayloadHash     string
	LeaseOwner      string     // the last owner; "" before any claim
	LeaseStartedAt  *time.Time // when LeaseOwner claimed; caps the lease's total life
	LeaseExpiresAt  *time.Time // nil when no lease is live by construction
	Version         int64
	Result          json.RawMessage
	Duplicates      int64 // refused claims with the same payload hash
	Reclaims        int64 // claims that took the run over from an earlier owner
	TriggerSource   string
	WorkflowVersion string
	CreatedAt       time.Time
	UpdatedAt       time.Time
	// Budgets and failure handling.
	ActionType  string // the first action type validated or queued on the run (its budget)
	Repairs     int    // validation results that needed fixing
	Validations int    // validations airlock has seen
	ModelCalls  int    // reported by the client
	Tokens      int64  // reported by the client
	ParkReason  string // why the run waits in awaiting_human (unknown_commit, approval)
	ReplacedBy  string // the key that replaced this run (rerun protocol)
}

// LeaseLive reports whether the run's lease is held at now.
func (r Run) LeaseLive(now time.Time) bool {
	return r.State == StateProcessing && r.LeaseExpiresAt != nil && r.LeaseExpiresAt.After(now)
}

// Event is a row of the append-only events table.
type Event struct {
	ID      int64
	RunKey  string
	At      time.Time
	Kind    string
	Version int64 // the run's version after the event (0 when the run did not change)
	Actor   string
	Meta    json.RawMessage
	Detail  json.RawMessage
}

// APIKey is a row of api_keys. Only the SHA-256 of the key is stored.
type APIKey struct {
	ID        string
	Name      string
	Hash      string
	Scopes    []string
	CreatedAt time.Time
	RevokedAt *time.Time
	// OnBehalfOf names the person the key acts for: their request is theirs, so they can
	// never approve it ("" for none).
	OnBehalfOf string
	// Types limits a worker key to these action types (nil: every worker type).
	Types []string
}

// EffectListener is a store that can tell one instance that another queued an effect
// (PostgreSQL LISTEN/NOTIFY). ListenEffects calls wake for every notification until ctx
// ends, reconnecting after errors.
type EffectListener interface {
	ListenEffects(ctx context.Context, wake func())
}

// ListenReporter is an EffectListener that reports, for metrics, whether its LISTEN
// connection is up and how many notifications it has received.
type ListenReporter interface {
	ListenState() (listening bool, notifications uint64)
}

// BatchQueries are statements a backend may offer for a group of rows at once
// (PostgreSQL): one statement where Queries has one per row. A caller type-asserts its
// Queries and otherwise does the same row by row; the results are the same either way.
type BatchQueries interface {
	// EffectUpdateMany applies several outcome compare-and-sets in one statement, each
	// exactly as EffectUpdate would: From exactly [sending], Owner set, To any state but
	// sending, and no field besides ProviderID, NotBefore, ErrorClass and Now (the same
	// Now for all); ids distinct. Anything else is refused whole with ErrUnbatchable. In
	// the same statement it inserts events[i] for each update i that applied, all in the
	// order given (events may be shorter than ps). It returns, by index, whether that
	// update applied (false: ErrNoMatch for that one alone). It returns no effect: an
	// applied update leaves the row as EffectUpdate would (the caller knows what it set).
	EffectUpdateMany(ctx context.Context, ps []EffectUpdateParams, events [][]EventInsertParams) ([]bool, error)
	// EffectUpdateManyLocked is EffectUpdateMany that, in the same statement and before it
	// touches any effect, locks (FOR UPDATE, in key order) the runs of the effects in ps
	// that are not approved, and applies only the updates of those runs. It also returns
	// the keys it locked (nil when no update applied: the caller cannot tell which it
	// locked then, and records them again the usual way). On the Store, outside a
	// transaction, it is one autocommit statement: a group's run locks, compare-and-sets
	// and events commit together in one round trip. On a Citus coordinator it applies
	// nothing and returns no keys (its lock would be one FOR UPDATE across shards, which
	// Citus refuses): the caller records the group the usual way.
	EffectUpdateManyLocked(ctx context.Context, ps []EffectUpdateParams, events [][]EventInsertParams) (locked []string, applied []bool, err error)
}

// RunSharded is offered by a store whose runs' rows may live on different nodes (the
// PostgreSQL store on a Citus coordinator): ShardedByRun then reports true, and callers
// keep each transaction to one run where they can (a transaction over several runs there
// commits with two-phase commit).
type RunSharded interface {
	ShardedByRun() bool
}

// ErrUnbatchable: EffectUpdateMany was given an update it does not apply in a batch.
var ErrUnbatchable = errors.New("store: this effect update is not an outcome a batch applies")

// Batchable reports whether EffectUpdateMany applies p (see BatchQueries).
func (p EffectUpdateParams) Batchable() bool {
	return len(p.From) == 1 && p.From[0] == EffectSending && p.Owner != "" && p.To != EffectSending &&
		p.To != "" && p.Version == 0 && p.Payload == nil && !p.ReleaseAttempt && !p.Started &&
		!p.LeaseExpired && !p.NotStarted && p.Attempts == 0 && p.FromErrorClass == "" && !p.Ambiguous && !p.Unambiguous &&
		!p.NoneConfirmed && p.RecheckAfter == 0
}

// Store is one database. Methods on Store itself run outside any transaction.
type Store interface {
	Queries
	// Transact runs fn in one transaction and commits if it returns nil; an error or a
	// panic rolls everything back. On SQLite the transaction begins IMMEDIATE. On
	// PostgreSQL it is READ COMMITTED, and a transaction aborted by a deadlock or a
	// serialization failure is run again (a few times): fn must be safe to run more than
	// once — it sets, rather than accumulates, anything it keeps outside itself, and does
	// nothing outside the database that a rolled-back run would leave behind.
	Transact(ctx context.Context, fn func(q Queries) error) error
	// ChainSnapshot runs fn on one consistent read-only snapshot of the database
	// (PostgreSQL: a REPEATABLE READ READ ONLY transaction; SQLite: one read transaction),
	// so verify never sees a purge half done: the head and the events it reads are of one
	// moment, whatever commits meanwhile.
	ChainSnapshot(ctx context.Context, fn func(q ChainQueries) error) error
	// Within runs fn in one transaction and commits if it returns nil, like Transact, and
	// every statement made through this store with fn's ctx joins that transaction: Store
	// methods, Claim, and Transact, whose transaction becomes a savepoint (rolled back
	// alone when its fn fails). The API runs a request that carries an Idempotency-Key in
	// it, so the request's writes and its recorded reply commit together. fn must not use
	// its ctx from other goroutines.
	Within(ctx context.Context, fn func(ctx context.Context) error) error
	// Claim is a whole claim: what ClaimSequence does, each change with its events. On
	// PostgreSQL in autocommit (or in the transaction its ctx joins): one statement (one
	// round trip) when the claim takes the run, a second one to record a refusal; on
	// SQLite in one transaction.
	Claim(ctx context.Context, p ClaimParams) (ClaimOutcome, error)
	// LeaseEffects is a whole lease (EffectLease, which is one statement, and for the types
	// of p.Begin the begin-mark in that statement, after the kill switch's shared guard): on
	// PostgreSQL in autocommit (one round trip, no BEGIN and COMMIT; guard and statement
	// pipelined in one implicit transaction; or in the transaction its ctx joins), on
	// SQLite in one IMMEDIATE transaction.
	LeaseEffects(ctx context.Context, p EffectLeaseParams) ([]Effect, error)
	// BeginSends is a whole begin-mark for a leased batch, committed: EffectMarkStarted for
	// those of ids whose action type the kill switch allows (a global row that is enabled,
	// no disabled row for the type), read under the kill switch's shared guard after the
	// guard is taken, in one transaction. It returns the ids it marked; one it did not mark
	// is held by the kill switch, its run ended failed_terminal or its lease is gone, and
	// the caller finds out which in a transaction of its own. On PostgreSQL one round trip
	// (the guard and the mark pipelined in one implicit transaction, or in the transaction
	// ctx joins); on SQLite one IMMEDIATE transaction.
	BeginSends(ctx context.Context, owner string, ids []string, now *time.Time) ([]string, error)
	// Migrate applies the embedded migrations that have not run yet, safely when several
	// processes start at once.
	Migrate(ctx context.Context) error
	// ApplyMigrations is Migrate that also says which migrations this call applied (their
	// file names, in order; none when the schema was current or another process applied
	// them first). A migration that raises the writer level is refused with
	// ErrLowerWriters (a *LowerWriters naming them) while live instances of a lower level
	// are registered, unless p.Force; the check runs in the migration's transaction, so
	// an instance registering meanwhile either is seen or reads the raised level.
	ApplyMigrations(ctx context.Context, p MigrateParams) ([]string, error)
	// SchemaCurrent returns ErrSchemaOutdated when migrations are pending.
	SchemaCurrent(ctx context.Context) error
	Ping(ctx context.Context) error
	// ReadinessWrite proves the database takes a committed write: it records that
	// instance checked now in its row of readiness (0014_readiness.sql), forgets instances
	// silent for a day, and commits durably (synchronous_commit on, for PostgreSQL). A
	// write that is rolled back proves nothing — it needs no disk space, and a standby
	// takes it until the end — so this one commits.
	ReadinessWrite(ctx context.Context, instance string) error
	FleetQueries
	Backend() string
	Close() error
}

// Queries are the statements. Where a param has Now, nil means the backend's clock:
// PostgreSQL's now() (shared by every instance), the process clock on SQLite.
type Queries interface {
	EffectQueries
	FailureQueries
	ApprovalQueries
	EvidenceQueries
	LedgerQueries
	RetentionQueries
	AuditQueries
	ReplayQueries
	ConsoleQueries
	ChainQueries
	RunListQueries
	StuckQueries
	AlertQueries
	SlackQueries
	// Clock is the backend's clock: PostgreSQL's now() (the transaction's start inside
	// Transact), the process clock on SQLite.
	Clock(ctx context.Context) (time.Time, error)
	// RunClaim is the single atomic claim statement: it inserts a new run, or takes over
	// one with the same payload hash that is failed_retryable or processing with no live
	// lease. It returns ErrNoMatch when the key exists and was not taken.
	RunClaim(ctx context.Context, p RunClaimParams) (Run, error)
	// RunRefuse records a refused claim of an existing key in one statement: it counts a
	// duplicate when the payload hash matches and changes nothing otherwise, and returns
	// the row. ErrNotFound if the key does not exist.
	RunRefuse(ctx context.Context, key, payloadHash string) (Run, error)
	RunGet(ctx context.Context, key string) (Run, error)
	// RunHeartbeat moves a live lease held by Owner at Version, never past LeaseStartedAt +
	// Lifetime; ErrNoMatch otherwise, including when the lease already reaches that cap.
	RunHeartbeat(ctx context.Context, p RunHeartbeatParams) (Run, error)
	// RunTransition is the compare-and-set on key, owner, version, From and a live lease.
	// ErrNoMatch when the row is not in that condition.
	RunTransition(ctx context.Context, p RunTransitionParams) (Run, error)
	// RunOpenEffects counts the run's effects that are open or failed: such a run cannot
	// complete.
	RunOpenEffects(ctx context.Context, key string) (int, error)

	EventInsert(ctx context.Context, p EventInsertParams) (Event, error)
	// EventExistsExcept reports whether the run has a committed event of a kind not in
	// kinds, however many events it has.
	EventExistsExcept(ctx context.Context, key string, kinds []string) (bool, error)
	// EventList returns at most Limit of a run's events after the event afterID (0: from
	// the start), in an order in which paging never skips one: an event that commits later
	// never sorts before one already returned. SQLite commits one writer at a time, so that
	// is id order. On PostgreSQL ids are taken at insert, not commit: it is (writing
	// transaction, id), and only events whose transaction is older than every one still in
	// flight are returned (a short page waits briefly for such writers to end).
	EventList(ctx context.Context, key string, afterID int64, limit int) ([]Event, error)

	APIKeyInsert(ctx context.Context, k APIKey) error
	// APIKeyByHash returns the key with that hash, revoked or not; ErrNotFound if none.
	APIKeyByHash(ctx context.Context, hash string) (APIKey, error)
	APIKeyList(ctx context.Context) ([]APIKey, error)
	// APIKeyRevoke marks a key revoked; ErrNotFound if no unrevoked key has that id.
	APIKeyRevoke(ctx context.Context, id string, at time.Time) error
}

type RunClaimParams struct {
	Key             string
	PayloadHash     string
	Owner           string
	Lease           time.Duration
	TriggerSource   string
	WorkflowVersion string
	Now             *time.Time
}

type RunHeartbeatParams struct {
	Key      string
	Owner    string
	Version  int64
	Lease    time.Duration
	Lifetime time.Duration // the lease never extends past LeaseStartedAt + Lifetime
	Now      *time.Time
}

type RunTransitionParams struct {
	Key        string
	Owner      string
	Version    int64
	From       State
	To         State
	Result     json.RawMessage // nil keeps the stored result
	ParkReason string          // stored as the run's park_reason ("" clears it)
	Now        *time.Time
}

// RunCountParams adds to a run's counters; ActionType is recorded if none is yet. The
// model-call and token totals stop at their largest value (2^31-1, 2^63-1) rather than
// overflow: a run that reaches either is over any budget.
type RunCountParams struct {
	Key         string
	ActionType  string
	ModelCalls  int
	Tokens      int64
	Validations int
	Repairs     int
}

// Validation is a row of validations: the result of checking one model output.
type Validation struct {
	ID         int64
	RunKey     string
	ActionType string
	Valid      bool
	Repaired   bool
	OutputHash string          // SHA-256 of the raw output: the output itself is never stored
	Value      json.RawMessage // the validated value (valid only)
	Errors     json.RawMessage // [{pointer, keyword, message}] (invalid only)
	CreatedAt  time.Time
}

// Replacement links a finished run to the new, upstream-issued key that corrects it.
type Replacement struct {
	OldKey      string
	NewKey      string
	Reason      string
	Actor       string
	ProviderIDs []string // the original's external results
	CreatedAt   time.Time
}

// FailureQueries are the statements of failure handling.
type FailureQueries interface {
	// RunCount adds to the run's counters and returns it; ErrNotFound if it does not exist.
	RunCount(ctx context.Context, p RunCountParams) (Run, error)
	ValidationInsert(ctx context.Context, v Validation) (Validation, error)
	// ValidationLatestValid returns the run's latest passing validation for an action
	// type; ErrNotFound if none.
	ValidationLatestValid(ctx context.Context, key, actionType string) (Validation, error)
	// FailureAttempt counts one more failure of class on the run and returns the count.
	FailureAttempt(ctx context.Context, key, class string) (int, error)
	// EffectRequeueFailed queues the run's failed dispatcher effects again.
	EffectRequeueFailed(ctx context.Context, key string, now *time.Time) ([]Effect, error)
	ReplacementInsert(ctx context.Context, r Replacement) error
	// ReplacementFind returns the replacement of key (byNew false: key is the replaced run)
	// or by key (byNew true: key is the replacing one); ErrNotFound if none.
	ReplacementFind(ctx context.Context, key string, byNew bool) (Replacement, error)
	RunSetReplacedBy(ctx context.Context, key, newKey string) error
}

type EventInsertParams struct {
	RunKey  string
	Kind    string
	Version int64
	Actor   string
	Meta    json.RawMessage
	Detail  json.RawMessage
	Now     *time.Time
}

// EffectState is an effect's state; the CHECK constraint in both schemas lists the same set.
type EffectState string

const (
	EffectPending   EffectState = "pending"   // queued, waiting for its not_before
	EffectSending   EffectState = "sending"   // leased by a dispatcher or an external worker
	EffectPlanned   EffectState = "planned"   // an agent's recorded intent (ledger)
	EffectCompleted EffectState = "completed" // sent, with provider_id when the provider gave one
	EffectUnknown   EffectState = "unknown"   // may or may not have happened: reconcile
	EffectFailed    EffectState = "failed"    // definitely not performed, not retried further
	EffectCancelled EffectState = "cancelled" // withdrawn before sending, or abandoned by an operator
)

// Executors of an effect.
const (
	ExecutorDispatcher = "dispatcher" // sent by airlock's dispatcher through a connector
	ExecutorWorker     = "worker"     // claimed and performed by an external worker
	ExecutorAgent      = "agent"      // performed by the agent itself: planned before, confirmed after
)

// Effect is a row of effects: one external write of a run.
type Effect struct {
	ID             string // addresses the effect in /v1/effects/{id}
	RunKey         string
	EffectID       string // the client's stable id, or derived from action type + target; the provider idempotency key
	ActionType     string
	Target         string
	Executor       string
	Payload        json.RawMessage
	PayloadHash    string
	State          EffectState
	LeaseOwner     string
	LeaseExpiresAt *time.Time
	// SendStartedAt is committed just before the connector is called: a sender whose lease
	// expired without it certainly never sent.
	SendStartedAt *time.Time
	NextCheckAt   *time.Time // an unknown effect's next reconciliation (nil: due now)
	// AmbiguousAt is when the latest attempt whose outcome was ambiguous began (nil: none
	// was, or its absence was proven since). A lookup's "none" counts only once the
	// action type's settle window has passed from here, and no later refusal records the
	// effect failed: the ambiguous request may still have been performed.
	AmbiguousAt *time.Time
	// NoneConfirmedAt is when a confirmed "none" queued the effect again: once its resend
	// completes, it is looked up once more (NextCheckAt on the completed row).
	NoneConfirmedAt *time.Time
	Checks          int // reconciliation checks of the unknown effect so far
	ProviderID      string
	Attempts        int
	NotBefore       time.Time
	LastErrorClass  string
	CreatedAt       time.Time
	UpdatedAt       time.Time
	// Version is 1 when queued; every statement that changes the effect adds one. A
	// decision taken on a row read earlier is applied by compare-and-set on its version.
	Version int64
	// TraceParent is the W3C traceparent of the request that queued the effect ("" when
	// none): the dispatcher sends it in that trace.
	TraceParent string
}

// KillSwitch is one scope's setting: "global" or "action:<type>".
type KillSwitch struct {
	Scope     string
	Enabled   bool
	Reason    string
	Actor     string
	UpdatedAt time.Time
}

// RunLockParams names a lease holder's view of a run.
type RunLockParams struct {
	Key     string
	Owner   string
	Version int64
	Now     *time.Time
}

// EffectLeaseParams selects due pending effects to lease: at most Caps[type] of each
// listed type, at most Limit in all, oldest not_before first.
//
// Begin lists action types whose send begins with the lease: LeaseEffects marks each
// effect of those types it leases as begun (send_started_at, as BeginSends would) in the
// same statement, under the kill switch's shared guard, when the kill switch allows the
// type and the run is not failed_terminal; the others come back unmarked, for BeginSends.
// Only for types whose provider honours the idempotency key: an instance that dies after
// such a lease leaves an effect begun, which the sweeper resends with the same key
// instead of queueing it as never sent. A store may mark none of them (Citus does not):
// the caller sends only the effects that come back with SendStartedAt set, and begins the
// rest itself. EffectLease alone never marks (it holds no guard).
type EffectLeaseParams struct {
	Executor string
	Caps     map[string]int
	Owner    string
	Lease    time.Duration
	Limit    int
	Now      *time.Time
	Begin    []string
}

// EffectUpdateParams is a compare-and-set on an effect: it applies only when the effect is
// in one of From and, when Owner is set, leased by Owner, and, when Version is set, still
// at that version.
//
// A change that makes an effect sendable again (To pending or planned) must name the exact
// row it decided on: by Owner (a lease is one send attempt: its owner is never reused) or
// by Version. EffectUpdate refuses one with neither (ErrUnfenced): a state that comes back
// round — unknown → pending → sending → unknown — must never be taken for the one that was
// looked at, or an answer about the first send queues a second.
type EffectUpdateParams struct {
	ID         string
	From       []EffectState
	Owner      string
	Version    int64 // 0: any version
	To         EffectState
	ProviderID *string    // nil keeps the stored value
	NotBefore  *time.Time // nil keeps the stored value
	ErrorClass *string    // nil keeps the stored value
	// Payload replaces the stored payload when non-nil (an agent's confirmed result: the
	// MCP gateway's recorded tool result, purged with every payload under retention).
	Payload json.RawMessage
	// ReleaseAttempt undoes the attempt count of a lease that never tried to send.
	ReleaseAttempt bool
	// Started marks the send as begun (To must be sending).
	Started bool
	// LeaseExpired applies the change only if the lease has expired at Now; NotStarted
	// only if the send was never marked begun. The sweeper decides with both in the
	// statement that changes the row, never on a row it read earlier.
	LeaseExpired bool
	NotStarted   bool
	// Attempts, when non-zero, applies the change only if the effect's attempt count is
	// that, and FromErrorClass, when non-empty, only if its last error class is that: with
	// From they match the effect exactly as one lease left it (a later lease counts an
	// attempt), so a late writer can never overwrite what a later send recorded.
	Attempts       int
	FromErrorClass string
	// Ambiguous records that this attempt's outcome was ambiguous: AmbiguousAt becomes
	// the attempt's send_started_at (Now if it has none). Unambiguous clears AmbiguousAt:
	// the request's absence was proven (a lookup's confirmed "none", an operator's "not
	// sent").
	Ambiguous   bool
	Unambiguous bool
	// NoneConfirmed records that a confirmed "none" queues the effect again
	// (NoneConfirmedAt = Now). RecheckAfter, with To completed, makes the completed
	// effect due for one more lookup that long after Now.
	NoneConfirmed bool
	RecheckAfter  time.Duration
	Now           *time.Time
}

// CheckFenced refuses an update that makes an effect sendable again (To pending or
// planned) without the lease owner or the version it was decided on. Every backend's
// EffectUpdate calls it first.
func (p EffectUpdateParams) CheckFenced() error {
	if (p.To == EffectPending || p.To == EffectPlanned) && p.Owner == "" && p.Version == 0 {
		return fmt.Errorf("%w (effect %s to %s)", ErrUnfenced, p.ID, p.To)
	}
	return nil
}

// EffectListParams filters effects for operators.
type EffectListParams struct {
	RunKey string        // "" for every run
	States []EffectState // nil for every state
	Limit  int           // 0: no limit (a run's effects are read whole: verdicts need all of them)
}

// EffectQueries are the statements on effects and the kill switch.
type EffectQueries interface {
	// RunLock reads the run held by Owner at Version with a live lease, locking its row
	// until the transaction ends (so effects are queued under the lease). ErrNoMatch otherwise.
	RunLock(ctx context.Context, p RunLockParams) (Run, error)
	// EffectInsert queues e unless (run key, effect id) exists; it returns the stored
	// effect and whether it was inserted.
	EffectInsert(ctx context.Context, e Effect) (Effect, bool, error)
	EffectGet(ctx context.Context, id string) (Effect, error)
	EffectList(ctx context.Context, p EffectListParams) ([]Effect, error)
	// EffectLease moves due pending effects of an executor to sending under a new lease and
	// counts an attempt; several instances never lease the same effect (SKIP LOCKED on
	// PostgreSQL, the write lock on SQLite).
	EffectLease(ctx context.Context, p EffectLeaseParams) ([]Effect, error)
	// EffectUpdate is the effect's compare-and-set; ErrNoMatch when it does not apply.
	// Moving an effect into unknown makes it due for reconciliation at once.
	EffectUpdate(ctx context.Context, p EffectUpdateParams) (Effect, error)
	// EffectMarkStarted commits "the send begins" for those of ids that owner still
	// leases with a live lease at now, not yet begun, whose run is not failed_terminal;
	// it returns the ids it marked. It sets send_started_at and moves version, and leaves
	// updated_at as the lease set it (on PostgreSQL the update is then HOT).
	EffectMarkStarted(ctx context.Context, owner string, ids []string, now *time.Time) ([]string, error)
	// EffectClaimUnknown claims up to limit unknown dispatcher effects of the given types
	// whose next reconciliation is due at now, the longest waiting first: in the statement
	// that lists them, each is made due again only after claim (and its version moves), so
	// two instances never look up the same effect at once. The claimed rows are returned
	// at their new version.
	EffectClaimUnknown(ctx context.Context, types []string, now *time.Time, claim time.Duration, limit int) ([]Effect, error)
	// EffectCheckLater counts one reconciliation check of an unknown effect (or of a
	// completed one due for its recheck) still at version and sets when it is next due;
	// ErrNoMatch if the effect moved on.
	EffectCheckLater(ctx context.Context, id string, version int64, at time.Time) error
	// EffectClaimRecheck claims, as EffectClaimUnknown does, up to limit completed
	// dispatcher effects of the given types whose recheck (one more lookup after a resend
	// that a confirmed "none" allowed) is due at now.
	EffectClaimRecheck(ctx context.Context, types []string, now *time.Time, claim time.Duration, limit int) ([]Effect, error)
	// EffectRecheckDone ends a completed effect's recheck, if it is still at version.
	EffectRecheckDone(ctx context.Context, id string, version int64) error
	// EffectCancelPending cancels the run's pending effects (its run ended: they never
	// leave) and returns them.
	EffectCancelPending(ctx context.Context, key, class string, now *time.Time) ([]Effect, error)
	// EffectNotify wakes the dispatchers of every instance when the transaction commits
	// (PostgreSQL NOTIFY); a no-op where instances cannot be told (SQLite).
	EffectNotify(ctx context.Context) error
	// RunLockKeys locks the rows of these runs, in key order, until the transaction ends,
	// and returns them. Every transaction that counts a run's effects and then changes the
	// run (or an effect's openness) takes it first. Missing keys are left out.
	RunLockKeys(ctx context.Context, keys []string) (map[string]Run, error)
	// KillSwitchGuard orders kill switch changes against sends: a change takes it
	// exclusively, a send's begin-mark shared, both until their transaction ends, so a
	// change that commits first is seen by every later mark.
	KillSwitchGuard(ctx context.Context, exclusive bool) error
	// EffectExpiredLeases lists effects still sending whose lease expired before now.
	EffectExpiredLeases(ctx context.Context, now *time.Time, limit int) ([]Effect, error)
	// EffectCountByState counts effects per state (metrics).
	EffectCountByState(ctx context.Context) (map[EffectState]int, error)

	KillSwitchList(ctx context.Context) ([]KillSwitch, error)
	KillSwitchSet(ctx context.Context, k KillSwitch) error
}

// User is a local account (the embedded default's login; SSO users have none).
type User struct {
	ID           string
	Name         string
	PasswordHash string
	Roles        []string
	CreatedAt    time.Time
	DisabledAt   *time.Time
}

// Session is a logged-in person. Only the SHA-256 of the cookie value is stored.
type Session struct {
	IDHash     string
	UserID     string // the local account signed in; "" for single sign-on
	Subject    string
	Roles      []string
	CreatedAt  time.Time
	LastSeenAt time.Time
	ExpiresAt  time.Time
}

// UserUpdateParams change an account: nil fields stay.
type UserUpdateParams struct {
	Name         string
	Roles        []string
	PasswordHash *string
	// Disabled: true disables at DisabledAt (or now), false enables.
	Disabled   *bool
	DisabledAt *time.Time
}

// Throttle is the sign-in backoff of one account or one client.
type Throttle struct {
	Key       string
	Failures  int       // attempts counted since the window began
	NextAt    time.Time // no attempt is checked before this
	UpdatedAt time.Time
}

// Approval is a single-use challenge that holds a proposed effect until a decision.
type Approval struct {
	ID               string
	RunKey           string
	TokenHash        string
	Mode             string
	AllowedDecisions []string
	ExpiresAt        time.Time
	ConsumedAt       *time.Time
	Decision         string
	ApproverSubject  string
	Reason           string
	RequestedBy      string
	// Requesters are the normalised identities of whoever asked (the API key, the person
	// it acts for, the declared requested_by): under separation of duties none may decide.
	Requesters         []string
	ApproverRoles      []string
	ApproverSubjects   []string
	SeparationOfDuties bool
	ActionType         string
	Target             string
	EffectID           string
	Executor           string
	Payload            json.RawMessage
	PayloadHash        string
	CreatedAt          time.Time
	// WarnAt is when the expiry warning is due (nil: none); WarnedAt when an instance
	// claimed it (once, by compare-and-set).
	WarnAt, WarnedAt *time.Time
	// EscalateAt is when EscalationRoles may also decide (nil: no escalation);
	// EscalatedAt when an instance claimed the escalation. May honours EscalationRoles
	// only once EscalatedAt is set.
	EscalateAt, EscalatedAt *time.Time
	EscalationRoles         []string
	// UndecidableSince is the start of the current episode in which no known person could
	// decide the approval (nil: someone can, or it was never checked).
	UndecidableSince *time.Time
}

// ApprovalConsumeParams is an atomic consume (one UPDATE … RETURNING): it applies only
// to an unexpired, unconsumed approval whose allowed decisions include Decision.
type ApprovalConsumeParams struct {
	TokenHash string
	Decision  string
	Subject   string
	Reason    string
	Now       *time.Time
}

// RunSetStateParams is airlock's own move of a run (gates, expiry): a compare-and-set on
// the state alone, releasing any lease.
type RunSetStateParams struct {
	Key        string
	From, To   State
	Result     json.RawMessage
	ParkReason string
	Now        *time.Time
}

// ApprovalQueries are the statements of the approval gates.
type ApprovalQueries interface {
	UserInsert(ctx context.Context, u User) error
	UserByName(ctx context.Context, name string) (User, error)
	SessionInsert(ctx context.Context, s Session) error
	// SessionTouch returns the session if it is live at now (idle and absolute limits) and
	// marks it seen; ErrNotFound otherwise.
	SessionTouch(ctx context.Context, idHash string, idle time.Duration, now *time.Time) (Session, error)
	SessionDelete(ctx context.Context, idHash string) error
	// UserList lists local accounts by name.
	UserList(ctx context.Context) ([]User, error)
	// UserUpdate changes one account and ends its sessions in the same statement batch;
	// ErrNotFound if no account has that name.
	UserUpdate(ctx context.Context, p UserUpdateParams) (User, error)
	// UserDelete removes an account and its sessions; ErrNotFound if none.
	UserDelete(ctx context.Context, name string) error
	// SessionsEndForUser deletes every session of a local account; it returns how many.
	SessionsEndForUser(ctx context.Context, userID string) (int64, error)
	// SecretGet returns a key generated at migrate (site_secrets); ErrNotFound if none.
	SecretGet(ctx context.Context, name string) ([]byte, error)
	// ThrottleGet returns the key's sign-in backoff (Key "" when it has none) and the
	// current time: *now, else the database clock (PostgreSQL) or the process clock.
	ThrottleGet(ctx context.Context, key string, now *time.Time) (Throttle, time.Time, error)
	// ThrottleLock is ThrottleGet that creates the row if needed and locks it until the
	// transaction ends (use it inside Transact).
	ThrottleLock(ctx context.Context, key string, now *time.Time) (Throttle, time.Time, error)
	ThrottlePut(ctx context.Context, t Throttle) error
	ThrottleDelete(ctx context.Context, key string) error
	ApprovalInsert(ctx context.Context, a Approval) error
	ApprovalByTokenHash(ctx context.Context, tokenHash string) (Approval, error)
	ApprovalByID(ctx context.Context, id string) (Approval, error)
	// ApprovalsOpen lists unconsumed approvals of a mode, oldest first.
	ApprovalsOpen(ctx context.Context, mode string, limit int) ([]Approval, error)
	ApprovalsByRun(ctx context.Context, key string) ([]Approval, error)
	// ApprovalConsume consumes in one UPDATE … RETURNING; ErrNoMatch when it does not apply.
	ApprovalConsume(ctx context.Context, p ApprovalConsumeParams) (Approval, error)
	// ApprovalsExpired lists unconsumed approvals whose expiry has passed.
	ApprovalsExpired(ctx context.Context, now *time.Time, limit int) ([]Approval, error)
	// ApprovalExpire consumes an expired approval with decision "expired"; ErrNoMatch if
	// it was decided or expired meanwhile.
	ApprovalExpire(ctx context.Context, id string, now *time.Time) (Approval, error)
	// ApprovalRekey replaces the token hash of an open (unconsumed, unexpired at now)
	// approval: the old link stops working in the same statement. ErrNoMatch if it is
	// not open.
	ApprovalRekey(ctx context.Context, id, tokenHash string, now *time.Time) (Approval, error)
	RunSetState(ctx context.Context, p RunSetStateParams) (Run, error)
}

// Evidence is one evaluator's finding on a run (approve_by_exception), recorded by an
// evaluator key whose name is the source — never taken from the effect request.
type Evidence struct {
	ID         int64
	RunKey     string
	Source     string
	Name       string
	Value      json.RawMessage
	RecordedBy string
	CreatedAt  time.Time
}

// EvidenceQueries store evaluators' findings.
type EvidenceQueries interface {
	// EvidenceInsert records a finding on an existing run.
	EvidenceInsert(ctx context.Context, e Evidence) (Evidence, error)
	// EvidenceByRun lists a run's findings, oldest first.
	EvidenceByRun(ctx context.Context, key string) ([]Evidence, error)
}

// LedgerQueries are the statements of the work ledger.
type LedgerQueries interface {
	// LedgerInsert stores a checkpoint; ErrNoMatch if that version exists already.
	LedgerInsert(ctx context.Context, key string, checkpoint int, doc json.RawMessage, now *time.Time) error
	// LedgerLatest returns the run's newest checkpoint; ErrNotFound if it has none.
	LedgerLatest(ctx context.Context, key string) (int, json.RawMessage, error)
	// EffectByRunEffectID returns the run's effect with that effect id; ErrNotFound if none.
	EffectByRunEffectID(ctx context.Context, key, effectID string) (Effect, error)
}

// PurgeParams say what has outlived its retention.
type PurgeParams struct {
	// PayloadsBefore: payloads, results, validated values and ledgers of finished work
	// last touched before this are removed (hashes and ids stay). An effect's payload goes
	// only once it can never be sent again (completed or cancelled): a failed or unknown
	// one may still be resolved not_sent and resent.
	PayloadsBefore time.Time
	// EventsBefore: events older than this are deleted.
	EventsBefore time.Time
	// Now expires sessions, login intents, Idempotency-Key records, and the people seen by
	// single sign-on more than store.PeopleSeenHorizon before it.
	Now    time.Time
	DryRun bool
	// Batch is the most rows one statement changes (0: PurgeBatch). Each batch is its own
	// transaction, so a purge of millions of rows never holds a lock for long.
	Batch int
	// Yield runs between two batches with how long the last one took; it returns an
	// error to stop. Nil: pause as long as the batch took (capped at a second), so the
	// purge holds SQLite's write lock at most half of the time and never starves writers.
	Yield func(ctx context.Context, took time.Duration) error
}

// PurgeBatch is the default batch of a purge: a few milliseconds of work.
const PurgeBatch = 1000

// BatchSize is p.Batch or its default.
func (p PurgeParams) BatchSize() int {
	if p.Batch > 0 {
		return p.Batch
	}
	return PurgeBatch
}

// Between yields between two batches: p.Yield, or a pause as long as the batch took.
func (p PurgeParams) Between(ctx context.Context, took time.Duration) error {
	if p.Yield != nil {
		return p.Yield(ctx, took)
	}
	t := time.NewTimer(min(max(took, time.Millisecond), time.Second))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// PurgeCounts is what a purge removed (or, dry, would remove), by kind.
type PurgeCounts map[string]int64

// RetentionQueries enforce retention. Every statement is set-based and idempotent, so
// several instances may purge at once; each kind is removed in batches, found through an
// index, so a purge that removes nothing reads nothing and one that removes millions
// holds no lock for long.
type RetentionQueries interface {
	Purge(ctx context.Context, p PurgeParams) (PurgeCounts, error)
}

// AuditCounts are plain counts over the events of a window.
type AuditCounts struct {
	ByKind map[string]int64 // events by kind
	Runs   int64            // distinct run keys with an event (the system key "" excluded)
}

// GateWait is one decided approval: when it was requested and when a person decided.
type GateWait struct {
	RunKey     string
	ApprovalID string
	Decision   string
	// RequestedAt is nil when the approval_requested event is no longer kept (retention).
	RequestedAt *time.Time
	DecidedAt   time.Time
}

// AuditQueries are the read-only statements of the audit report: its figures are
// computed from the events table, the one record every step writes. They read the
// window's events through indexes on (at) and (kind, at) (0010_cost.sql): their cost
// follows the events of the window, not those kept before it.
type AuditQueries interface {
	// AuditCount counts the events at or after since by kind, and the runs they belong to.
	AuditCount(ctx context.Context, since time.Time) (AuditCounts, error)
	// AuditEvents calls fn with each event of kinds at or after since, in no particular
	// order, streaming them from one statement; an error from fn stops it.
	AuditEvents(ctx context.Context, since time.Time, kinds []string, fn func(Event) error) error
	// AuditGateWaits pairs every approval_decided event at or after since with the
	// approval_requested event of the same run and approval_id, in id order.
	AuditGateWaits(ctx context.Context, since time.Time) ([]GateWait, error)
}

// EncodeList is the stored form of a list whose items may hold any character (a JSON
// array; "" for none).
func EncodeList(l []string) string {
	if len(l) == 0 {
		return ""
	}
	b, _ := json.Marshal(l)
	return string(b)
}

// DecodeList reads EncodeList's form.
func DecodeList(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var l []string
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		return nil, errors.New("stored list is not a JSON array")
	}
	return l, nil
}

// ReplayScope names one idempotency record: the API key (its id), the route pattern
// ("POST /v1/runs/claim") and the client's Idempotency-Key.
type ReplayScope struct {
	APIKeyID string
	Route    string
	Key      string
}

// Replay is a row of replays: the answer to a mutating request made with an
// Idempotency-Key, written in the transaction of the request's own writes.
type Replay struct {
	ReplayScope
	RequestHash string // SHA-256 of the method, path and body
	Status      int
	Response    []byte // sealed with a key derived from the raw API key: opaque here
	CreatedAt   time.Time
	ExpiresAt   time.Time
}

// ReplayQueries are the statements of idempotent replays; they run in a transaction.
type ReplayQueries interface {
	// ReplayLock takes the scope's lock until the transaction ends, without waiting, and
	// reports whether it got it: false while another transaction (another instance) runs
	// a request with the same scope. PostgreSQL: a transaction-level advisory lock.
	// SQLite: true (a write transaction already excludes every other).
	ReplayLock(ctx context.Context, s ReplayScope) (bool, error)
	// ReplayGet returns the scope's record unexpired at now; ErrNotFound if none.
	ReplayGet(ctx context.Context, s ReplayScope, now *time.Time) (Replay, error)
	// ReplayInsert records an answer kept for ttl, replacing an expired record of the
	// scope; ErrNoMatch if an unexpired one exists.
	ReplayInsert(ctx context.Context, r Replay, ttl time.Duration, now *time.Time) error
}

// Cursor is a keyset position in a list ordered by a time and an id: the last row of a
// page. The zero Cursor starts at the beginning.
type Cursor struct {
	At time.Time
	ID string
}

// IsZero reports whether c starts at the beginning.
func (c Cursor) IsZero() bool { return c.ID == "" && c.At.IsZero() }

// ParkReasons are the reasons that park a run in awaiting_human with no way out but a
// person's decision (the console's parked runs; RunUnpark).
var ParkReasons = []string{"unknown_commit", "input_mismatch"}

// ConsoleQueries are the operator console's lists: keyset pages through partial indexes
// (0012_console.sql) that hold only the rows a list shows, so a page costs the same with
// millions of runs, effects or approvals behind it.
type ConsoleQueries interface {
	// ApprovalsPending lists undecided, unexpired approvals at now, other than sampled
	// reviews, newest first, after the cursor (the last row of the previous page).
	ApprovalsPending(ctx context.Context, after Cursor, now *time.Time, limit int) ([]Approval, error)
	// EffectsInState lists the effects in state (unknown or failed), the longest in it
	// first (updated_at, id), after the cursor.
	EffectsInState(ctx context.Context, state EffectState, after Cursor, limit int) ([]Effect, error)
	// RunsParked lists runs parked in awaiting_human for one of ParkReasons, the newest
	// first (updated_at, key), after the cursor.
	RunsParked(ctx context.Context, after Cursor, limit int) ([]Run, error)
}
