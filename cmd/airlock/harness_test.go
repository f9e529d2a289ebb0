package main

// The fault-injecting, invariant-checking harness: a seeded, randomized workload driven
// through the real API of several `airlock serve` processes on one database, while
// instances are SIGKILLed (at random and at the dispatcher's crash points), PostgreSQL
// backends are terminated mid-transaction (and, in the soak, the server restarted), the
// kill switch flips, and providers succeed, refuse, time out after accepting or hang, or are
// slow as the world's are (still processing after the client gave up, a queue, a lagging
// lookup, 409 while in progress: harness_time_test.go has the clean stops and the checks
// about time). An oracle provider counts every request per idempotency key. After the run the invariants
// below are checked, and a failing run prints its seed so it replays:
//
//	AIRLOCK_HARNESS_SEEDS=42 bash scripts/with-postgres.sh go test ./cmd/airlock -run TestHarness -v
//
// The soak runs longer and with more seeds: scripts/soak.sh.

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
)

// harnessSettings come from the environment so the soak can run the same test longer.
func harnessSettings(t *testing.T) (seeds []uint64, d time.Duration) {
	d = 20 * time.Second
	if v := os.Getenv("AIRLOCK_HARNESS_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("AIRLOCK_HARNESS_DURATION: %v", err)
		}
	}
	seeds = []uint64{1}
	if v := os.Getenv("AIRLOCK_HARNESS_SEEDS"); v != "" {
		seeds = nil
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil {
				t.Fatalf("AIRLOCK_HARNESS_SEEDS: %v", err)
			}
			seeds = append(seeds, n)
		}
	}
	return seeds, d
}

// harnessSettleWindow is the settle_window the harness gives its types that have a lookup:
// an authoritative "none" counts only this long after the attempt's send began (and only
// when a second one agrees, this long later), and every slow provider here has its record
// visible well within it (slowProcessing, queueWaitMax, lookupLag). Set it to 0 to watch
// the harness fail the way airlock did before issue 32 (the field is then left out, and
// the default window, timeout + 2m, keeps the short run's unknowns unsettled: set a
// window shorter than the slow providers' instead, e.g. 1s).
const harnessSettleWindow = 5 * time.Second

func TestHarness(t *testing.T) {
	seeds, d := harnessSettings(t)
	for backend, env := range databases(t) {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("%s/seed=%d", backend, seed), func(t *testing.T) {
				h := newHarness(t, backend, env, seed, d)
				h.run()
				h.check()
				if t.Failed() {
					t.Logf("replay: AIRLOCK_HARNESS_SEEDS=%d AIRLOCK_HARNESS_DURATION=%s (backend %s)", seed, d, backend)
				}
			})
		}
	}
}

// oracle is the provider: it counts every request per idempotency key, stores a record
// for every request it does not lose, and answers by the mode the effect's payload names.
// Its lookup answers honestly from the records, after a random delay (a lookup is often
// in flight while other things happen to its effect).
//
// It also does what slow providers do (docs/testing.md): a "slow" request keeps being
// processed after the client gave up and its record is kept only at the end; the queue
// server (an overloaded provider's intake) holds every request up to queueWaitMax before
// processing it, whether or not its client still waits; a lookup with lag=1 sees a record
// only lookupLag after it was kept; an idempotent "inprogress" request is processed
// slowly, stored once per key, and a request with the same key meanwhile gets 409.
type oracle struct {
	*httptest.Server
	queue    *httptest.Server // the overloaded provider: requests wait in its queue first
	mu       sync.Mutex
	requests map[string]int
	stored   map[string]int         // records kept, per key: the invariant is about these
	storedAt map[string][]time.Time // when each record was kept (a lagging lookup sees it later)
	inflight map[string]int         // requests accepted and not yet processed: a record may still come
	idem     map[string]string      // inprogress keys: "processing" or "done"
	arrivals map[string][]time.Time
	nonces   map[string][]string // the payload nonce of every request, per key
	lookups  int
}

// The slow providers' times, against the connector's 1 s timeout; the settle window the
// harness gives airlock (harnessSettleWindow) is longer than each.
const (
	slowProcessing = 2500 * time.Millisecond // a slow or in-progress request's work
	queueWaitMax   = 2200 * time.Millisecond // the longest an overloaded provider's queue holds a request
	lookupLag      = 1500 * time.Millisecond // how long a lagging lookup takes to see a record
)

func newOracle(t *testing.T) *oracle {
	o := &oracle{requests: map[string]int{}, stored: map[string]int{}, storedAt: map[string][]time.Time{},
		inflight: map[string]int{}, idem: map[string]string{}, arrivals: map[string][]time.Time{}, nonces: map[string][]string{}}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			o.lookup(w, r)
			return
		}
		o.post(w, r, 0)
	}))
	o.queue = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.post(w, r, time.Duration(rand.Int64N(int64(queueWaitMax))))
	}))
	t.Cleanup(o.queue.Close)
	t.Cleanup(o.Close)
	return o
}

// recordID is the provider's id of key's n-th record (from 0).
func recordID(key string, n int) string {
	if n == 0 {
		return "p-" + key
	}
	return fmt.Sprintf("p-%s#%d", key, n+1)
}

// keep stores a record for key and returns its id; the caller holds mu.
func (o *oracle) keep(key string) string {
	o.stored[key]++
	o.storedAt[key] = append(o.storedAt[key], time.Now())
	return recordID(key, o.stored[key]-1)
}

// lookup answers with the records this key created, as of its arrival; with lag=1 only
// those kept at least lookupLag ago (a search index behind the primary).
func (o *oracle) lookup(w http.ResponseWriter, r *http.Request) {
	key, lag := r.URL.Query().Get("key"), r.URL.Query().Get("lag") != ""
	o.mu.Lock()
	var ids []string
	for i, at := range o.storedAt[key] {
		if !lag || time.Since(at) >= lookupLag {
			ids = append(ids, fmt.Sprintf(`{"id":%q}`, recordID(key, i)))
		}
	}
	o.lookups++
	o.mu.Unlock()
	time.Sleep(time.Duration(rand.IntN(400)) * time.Millisecond) // answered as of its arrival
	fmt.Fprintf(w, "[%s]", strings.Join(ids, ","))
}

// post is a send. wait is how long the request waits in an overloaded provider's queue
// before it is processed (its client may have given up by then: it is processed anyway).
func (o *oracle) post(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	var body struct{ Mode, Nonce string }
	_ = json.NewDecoder(r.Body).Decode(&body)
	key := r.Header.Get("Idempotency-Key")
	o.mu.Lock()
	o.nonces[key] = append(o.nonces[key], body.Nonce)
	o.requests[key]++
	// A paused agent's act on a stale plan is not airlock's send: the kill switch check
	// (arrivals) does not judge it.
	if r.Header.Get("X-Harness-Stale") == "" {
		o.arrivals[key] = append(o.arrivals[key], time.Now())
	}
	if body.Mode == "inprogress" { // idempotent, as Stripe is: one record per key
		switch o.idem[key] {
		case "processing":
			o.mu.Unlock()
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"error":"a request with this Idempotency-Key is in progress"}`)
			return
		case "done":
			o.mu.Unlock()
			w.WriteHeader(http.StatusCreated) // the first request's answer again
			fmt.Fprintf(w, `{"id":%q}`, recordID(key, 0))
			return
		}
		o.idem[key] = "processing"
	}
	if wait > 0 || body.Mode == "slow" || body.Mode == "inprogress" {
		// Accepted: the record comes only when processing ends, whether or not the
		// client still waits.
		o.inflight[key]++
		o.mu.Unlock()
		time.Sleep(wait)
		if body.Mode == "slow" || body.Mode == "inprogress" {
			time.Sleep(slowProcessing)
		}
		o.mu.Lock()
		o.inflight[key]--
		id := o.keep(key)
		if body.Mode == "inprogress" {
			o.idem[key] = "done"
		}
		o.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, id)
		return
	}
	// lossy: the first request of a key is lost; refuse: nothing is kept.
	id := recordID(key, 0)
	if (body.Mode != "lossy" || o.requests[key] > 1) && body.Mode != "refuse" {
		id = o.keep(key)
	}
	o.mu.Unlock()
	switch body.Mode {
	case "lossy", "store500": // kept (but the first of lossy), and answered 500: unknown
		w.WriteHeader(http.StatusInternalServerError)
	case "refuse":
		w.WriteHeader(http.StatusBadRequest)
	case "timeout": // accepted, answered after the connector's timeout
		time.Sleep(1500 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, id)
	case "hang":
		<-r.Context().Done()
	default:
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, id)
	}
}

// records is how many records the provider keeps for key.
func (o *oracle) records(key string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stored[key]
}

// pending tells whether a request for key is still queued or processing at the provider:
// its record may yet appear.
func (o *oracle) pending(key string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.inflight[key] > 0
}

// settle waits (up to d) until no request is queued or processing, so that the records
// are final.
func (o *oracle) settle(d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		o.mu.Lock()
		n := 0
		for _, c := range o.inflight {
			n += c
		}
		o.mu.Unlock()
		if n == 0 {
			return true
		}
	}
	return false
}

type window struct{ from, to time.Time }

type harness struct {
	t        *testing.T
	backend  string
	seed     uint64
	duration time.Duration
	env      []string
	key      string // an API key with every scope
	appName  string // PostgreSQL application_name of this run's instances (a prefix: _<slot> follows)
	dbURL    string // the database, for the harness's own reads
	prov     *oracle
	// performed: the worker's ground truth (task effects it carried out), by effect id.
	performed sync.Map

	rmu sync.Mutex
	rng *rand.Rand

	imu   sync.Mutex
	insts []*serveProc // nil while down
	procs []*serveProc // every instance started, for their logs (checkAlerts)
	// skews are the instances' clock offsets (AIRLOCK_TEST_CLOCK_OFFSET), by slot; skewOf
	// by URL, for replies whose timestamps an instance's own clock wrote (SQLite).
	skews  []time.Duration
	skewOf map[string]time.Duration

	hmu       sync.Mutex
	history   []porcupine.Operation
	acked     map[string]bool // "run:KEY" and "effect:KEY/EFFECT_ID" for every 2xx write
	offs      []window        // kill switch off: from its acknowledgement to the enable request
	keys      []string
	short     []string // keys held with 1 s leases (checked by checkLeases, not porcupine)
	agents    []string // keys of agents' runs (2 s leases, one ledger effect each)
	gated     []*gatedEffect
	gatedKeys atomic.Int64
	spans     map[string][]*leaseSpan
	clientID  atomic.Int64
	kills     atomic.Int64
	// approverSignedIn: the approver's cookie jar holds a live session.
	approverSignedIn atomic.Bool
	faults           sync.Map // fault name → *atomic.Int64
	// toInstance counts the harness's requests in flight per instance URL (*atomic.Int64):
	// a clean stop waits for them, as a load balancer drains an instance.
	toInstance sync.Map
	// paused: agents' effects (provider keys) whose agent paused past its lease after plan;
	// staleConfirm: the status the paused agent's confirm finally got (0: no answer).
	paused       map[string]bool
	staleConfirm map[string]int
	// unsent: effects marked sent-begun during a clean stop whose request never reached
	// the provider (checked at the end: they must not end up unknown).
	unsent []unsentMark
}

func (h *harness) count(fault string) {
	n, _ := h.faults.LoadOrStore(fault, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
}

func newHarness(t *testing.T, backend string, env []string, seed uint64, d time.Duration) *harness {
	h := &harness{t: t, backend: backend, seed: seed, duration: d, prov: newOracle(t),
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), acked: map[string]bool{}, spans: map[string][]*leaseSpan{},
		paused: map[string]bool{}, staleConfirm: map[string]int{},
		appName: fmt.Sprintf("airlock_harness_%d_%d", seed, time.Now().UnixNano()%1e6)}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	settle := "" // airlock on main refuses the field: see harnessSettleWindow
	if harnessSettleWindow > 0 {
		settle = "\n    settle_window: " + harnessSettleWindow.String()
	}
	// slow, queued and lagged are the slow providers (docs/testing.md): their lookups are
	// honest and authoritative, and a request's record appears only after the connector
	// has given up on it.
	doc := fmt.Sprintf(`actions:
  note:
    connector: http
    gate: none
    http: {url: %[1]s/note, timeout: 1s, lookup_url: "%[1]s/note?key={effect_id}"}
    retry: {max_attempts: 3, backoff: 100ms, max_backoff: 200ms}%[3]s
  invoice:
    connector: http
    gate: none
    http: {url: %[1]s/invoice, timeout: 1s, lookup_url: "%[1]s/invoice?key={effect_id}", lookup_authoritative: true}%[3]s
  slow:
    connector: http
    gate: none
    http: {url: %[1]s/slow, timeout: 1s, lookup_url: "%[1]s/slow?key={effect_id}", lookup_authoritative: true}%[3]s
  queued:
    connector: http
    gate: none
    http: {url: %[2]s/queued, timeout: 1s, lookup_url: "%[1]s/queued?key={effect_id}", lookup_authoritative: true}%[3]s
  lagged:
    connector: http
    gate: none
    http: {url: %[1]s/lagged, timeout: 1s, lookup_url: "%[1]s/lagged?key={effect_id}&lag=1", lookup_authoritative: true}%[3]s
  publish:
    connector: worker
    gate: none
  crm:
    connector: http
    gate: none
    http: {url: %[1]s/crm, timeout: 1s, idempotent: true}
    retry: {max_attempts: 3, backoff: 100ms, max_backoff: 200ms}
  task:
    connector: worker
    gate: none
  digest:
    connector: http
    gate: act_with_window
    window: 10s
    reversible: true
    http: {url: %[1]s/digest, timeout: 1s}
    approvers: {roles: [lead]}
  mail:
    connector: http
    gate: approve_before_act
    http: {url: %[1]s/mail, timeout: 1s}
    approvers: {roles: [lead]}
    approval_ttl: 1h
dispatch: {interval: 50ms, lease: 3s, reconcile_interval: 300ms, drain: 2s}
`, h.prov.URL, h.prov.queue.URL, settle)
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	h.env = append(slices.Clone(env), "AIRLOCK_CONFIG="+path)
	for _, kv := range env {
		if u, ok := strings.CutPrefix(kv, "AIRLOCK_DATABASE_URL="); ok {
			h.dbURL = u
		}
	}
	if backend == "postgres" {
		for i, kv := range h.env {
			if u, ok := strings.CutPrefix(kv, "AIRLOCK_DATABASE_URL="); ok {
				h.env[i] = "AIRLOCK_DATABASE_URL=" + u + "&application_name=" + h.appName
			}
		}
	}
	if _, stderr, err := airlock(t, h.env, "migrate"); err != nil {
		t.Fatalf("migrate: %v\n%s", err, stderr)
	}
	k, stderr, err := airlock(t, h.env, "apikey", "create", "--name", "harness", "--scope", "runs,read,worker,operator,admin")
	if err != nil {
		t.Fatalf("apikey create: %v\n%s", err, stderr)
	}
	h.key = strings.TrimSpace(k)
	if _, stderr, err := airlock(t, append(slices.Clone(h.env), "AIRLOCK_USER_PASSWORD=harness-lead-pw"), "user", "add", fmt.Sprintf("lead%d", seed), "--role", "lead"); err != nil {
		t.Fatalf("user add: %v\n%s", err, stderr)
	}
	// Skewed clocks: PostgreSQL instances 3 s behind, 3 s ahead and on time (and, after
	// some restarts, 10 s off: longer than every lease); they decide by the database's
	// clock, so the invariants must hold. SQLite processes on one file share their host's
	// clock, so they are not skewed unless AIRLOCK_HARNESS_SQLITE_SKEW is set (which shows
	// what a lease is worth when two deciding clocks disagree).
	h.skews = []time.Duration{-3 * time.Second, 3 * time.Second}
	if backend == "postgres" {
		h.skews = append(h.skews, 0)
	} else if os.Getenv("AIRLOCK_HARNESS_SQLITE_SKEW") == "" {
		h.skews = []time.Duration{0, 0}
	}
	if os.Getenv("AIRLOCK_HARNESS_SKEW") == "0" {
		clear(h.skews)
	}
	h.skewOf = map[string]time.Duration{}
	for i := range h.skews {
		h.insts = append(h.insts, h.start(i))
	}
	for range 4 {
		h.moreKeys()
	}
	for i := range 4 {
		h.short = append(h.short, fmt.Sprintf("s%d-short%d", seed, i))
	}
	return h
}

// start starts the instance of slot i with its clock offset; the caller holds imu or is
// alone.
func (h *harness) start(i int, extra ...string) *serveProc {
	env := slices.Concat(h.env, extra)
	if d := h.skews[i]; d != 0 {
		env = append(env, "AIRLOCK_TEST_CLOCK_OFFSET="+d.String())
	}
	if h.backend == "postgres" { // application_name <prefix>_<slot>: a clean stop finds the slot's backends
		for j, kv := range env {
			if strings.HasPrefix(kv, "AIRLOCK_DATABASE_URL=") {
				env[j] = strings.Replace(kv, "application_name="+h.appName, fmt.Sprintf("application_name=%s_%d", h.appName, i), 1)
			}
		}
	}
	s := startServe(h.t, env)
	h.skewOf[s.URL] = h.skews[i]
	h.procs = append(h.procs, s)
	return s
}

// liveKey picks one of the 24 newest keys: new keys keep coming, so deliveries keep
// doing work rather than only meeting finished runs.
func (h *harness) liveKey() string {
	h.hmu.Lock()
	recent := h.keys[max(0, len(h.keys)-24):]
	h.hmu.Unlock()
	return recent[h.intn(len(recent))]
}

// moreKeys adds fresh keys as the run goes on.
func (h *harness) moreKeys() {
	h.hmu.Lock()
	defer h.hmu.Unlock()
	for range 6 {
		h.keys = append(h.keys, fmt.Sprintf("s%d-k%04d", h.seed, len(h.keys)))
	}
	h.agents = append(h.agents, fmt.Sprintf("s%d-agent%04d", h.seed, len(h.agents)))
}

// agentKey picks one of the 12 newest agents' runs (an agent's run ends once its effect
// is confirmed: new ones keep coming).
func (h *harness) agentKey() string {
	h.hmu.Lock()
	recent := h.agents[max(0, len(h.agents)-12):]
	h.hmu.Unlock()
	return recent[h.intn(len(recent))]
}

// recentKeys are the keys an operator looks at every round: the newest deliveries' and
// gated ones (all of them are looked at when the workload ends).
func (h *harness) recentKeys() []string {
	h.hmu.Lock()
	defer h.hmu.Unlock()
	keys := slices.Clone(h.keys[max(0, len(h.keys)-60):])
	for _, g := range h.gated[max(0, len(h.gated)-30):] {
		keys = append(keys, g.key)
	}
	return keys
}

// allKeys are the keys of every run with effects: the deliveries', the gated and the
// agents' ones.
func (h *harness) allKeys() []string {
	h.hmu.Lock()
	defer h.hmu.Unlock()
	keys := append(slices.Clone(h.keys), h.agents...)
	for _, g := range h.gated {
		keys = append(keys, g.key)
	}
	return keys
}

func (h *harness) intn(n int) int {
	h.rmu.Lock()
	defer h.rmu.Unlock()
	return h.rng.IntN(n)
}

// url returns a live instance's base URL.
func (h *harness) url() string {
	u, _ := h.pick()
	return u
}

// pick returns a live instance's base URL and its clock offset.
func (h *harness) pick() (string, time.Duration) {
	for {
		h.imu.Lock()
		var live []*serveProc
		for _, s := range h.insts {
			if s != nil {
				live = append(live, s)
			}
		}
		if len(live) > 0 {
			u := live[h.intn(len(live))].URL
			d := h.skewOf[u]
			h.imu.Unlock()
			return u, d
		}
		h.imu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
}

// call is one API request; status 0 means no reply (the outcome is unknown).
func (h *harness) call(method, path, body string, out any) int {
	st, _ := h.callAt(method, path, body, out)
	return st
}

// callAt is call that also tells how far ahead of real time the answering instance
// stamps times it decides (0 on PostgreSQL, where the database's clock decides).
func (h *harness) callAt(method, path, body string, out any) (int, time.Duration) {
	for try := 0; ; try++ {
		u, skew := h.pick()
		if h.backend == "postgres" {
			skew = 0
		}
		n, _ := h.toInstance.LoadOrStore(u, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		status, err := apiJSON(method, u+path, h.key, body, out)
		n.(*atomic.Int64).Add(-1)
		if err != nil && status == 0 {
			if method == "GET" && try < 5 { // a read is safe to repeat, on another instance
				time.Sleep(100 * time.Millisecond)
				continue
			}
			return 0, skew
		}
		return status, skew
	}
}

// The run model for the linearizability check (leases are long: none expires during the
// run, so a claim of a processing run never reclaims it).
type runModel struct {
	exists  bool
	owner   string // "?" when the claim's reply was lost
	version int64
	state   string
}

type runInput struct {
	op      string // claim | heartbeat | transition
	owner   string
	version int64
	to      string
}

type runOutput struct {
	known   bool // a reply came
	ok      bool // 2xx (claim: claimed)
	owner   string
	version int64
	state   string
}

var runLinearizability = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Metadata.(string)
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() []any { return []any{runModel{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(runModel), input.(runInput), output.(runOutput)
		reclaimable := s.exists && s.state == "failed_retryable"
		switch in.op {
		case "claim":
			applied := runModel{exists: true, owner: out.owner, version: 1, state: "processing"}
			if reclaimable {
				applied.version = s.version + 1
			}
			if !out.known {
				if !s.exists || reclaimable {
					applied.owner = "?"
					return []any{s, applied}
				}
				return []any{s}
			}
			if out.ok {
				if (s.exists && !reclaimable) || out.version != applied.version {
					return nil // a second owner, or a wrong version
				}
				return []any{applied}
			}
			if !s.exists || reclaimable || out.version != s.version || out.state != s.state {
				return nil // refused a claim it had to grant, or reported another state
			}
			return []any{s}
		case "heartbeat":
			holds := s.exists && s.owner == in.owner && s.version == in.version && s.state == "processing"
			if out.known && out.ok && !holds {
				return nil // a stale owner's heartbeat won
			}
			return []any{s}
		default: // transition
			holds := s.exists && s.owner == in.owner && s.version == in.version && s.state == "processing"
			moved := runModel{exists: true, owner: s.owner, version: s.version + 1, state: in.to}
			switch {
			case !out.known && holds:
				return []any{s, moved}
			case !out.known, out.known && !out.ok:
				return []any{s} // refused (effects_open counts too): nothing changed
			case !holds:
				return nil // a stale owner's compare-and-set won
			}
			return []any{moved}
		}
	},
}

func (h *harness) record(key string, in runInput, call time.Time, out runOutput) {
	h.hmu.Lock()
	defer h.hmu.Unlock()
	ret := time.Now().UnixNano()
	if !out.known {
		ret = 1<<62 - 1 // it may take effect at any time after the call
	}
	h.history = append(h.history, porcupine.Operation{ClientId: int(h.clientID.Add(1) % 64), Input: in,
		Call: call.UnixNano(), Output: out, Return: ret, Metadata: key})
}

func (h *harness) ack(what string) {
	h.hmu.Lock()
	h.acked[what] = true
	h.hmu.Unlock()
}

type claimOut struct {
	Claimed bool   `json:"claimed"`
	Owner   string `json:"lease_owner"`
	Version int64  `json:"version"`
	State   string `json:"state"`
}

func (h *harness) claim(key string) (claimOut, bool) {
	var c claimOut
	start := time.Now()
	st := h.call("POST", "/v1/runs/claim", `{"key":"`+key+`","payload_hash":"h-`+key+`","lease_seconds":600}`, &c)
	known := st == 200 || st == 201
	if st == 201 || st == 200 {
		h.ack("run:" + key)
	}
	if st != 0 && !known && st != 409 { // 409: refused with another hash never happens here
		known = false
	}
	h.record(key, runInput{op: "claim"}, start, runOutput{known: known, ok: c.Claimed, owner: c.Owner, version: c.Version, state: c.State})
	return c, known && c.Claimed
}

func (h *harness) lease(key, op, owner string, version int64, to string) bool {
	start := time.Now()
	body := fmt.Sprintf(`{"lease_owner":%q,"version":%d`, owner, version)
	if op == "transition" {
		body += fmt.Sprintf(`,"to":%q`, to)
	}
	st := h.call("POST", "/v1/runs/"+key+"/"+op, body+"}", nil)
	known := st != 0 && st < 500
	h.record(key, runInput{op: op, owner: owner, version: version, to: to}, start, runOutput{known: known, ok: st == 200})
	return st == 200
}

type runJSON struct {
	State   string `json:"state"`
	Version int64  `json:"version"`
	Effects []struct {
		ID         string `json:"id"`
		EffectID   string `json:"effect_id"`
		ActionType string `json:"action_type"`
		State      string `json:"state"`
		Version    int64  `json:"version"`
	} `json:"effects"`
}

// delivery is one workflow execution: claim (sometimes as concurrent duplicate
// deliveries), queue effects, wait for them, finish; sometimes a stale compare-and-set.
func (h *harness) delivery(ctx context.Context, key string) {
	n := 1
	if h.intn(3) == 0 {
		n = 3 // duplicate deliveries racing
	}
	var wg sync.WaitGroup
	var won atomic.Pointer[claimOut]
	for range n {
		wg.Go(func() {
			if c, ok := h.claim(key); ok {
				won.Store(&c)
			}
		})
	}
	wg.Wait()
	c := won.Load()
	if c == nil {
		return
	}
	if h.intn(2) == 0 {
		h.lease(key, "heartbeat", c.Owner, c.Version, "")
	}
	modes := map[string][]string{
		"": {"ok", "ok", "ok", "refuse", "timeout", "hang"},
		// invoice: reconciled by an authoritative lookup; its provider loses first sends, or
		// keeps a send and answers 500.
		"invoice": {"ok", "lossy", "lossy", "store500", "store500", "timeout", "refuse"},
		// The slow providers: still processing when the client gives up (slow), a queue
		// (every request of queued), a lookup that lags (lagged), and an idempotent
		// provider that answers 409 while the key's first request is in progress.
		"slow":   {"slow", "slow", "ok"},
		"queued": {"ok"},
		"lagged": {"store500", "store500", "timeout", "ok"},
		"crm":    {"ok", "ok", "refuse", "timeout", "hang", "inprogress", "inprogress"},
	}
	for i := range h.intn(3) {
		typ := []string{"note", "crm", "task", "note", "crm", "task", "note", "digest", "invoice", "invoice", "slow", "queued", "lagged"}[h.intn(13)] // digest: a cancel window
		ms, ok := modes[typ]
		if !ok {
			ms = modes[""]
		}
		mode := ms[h.intn(len(ms))]
		body := fmt.Sprintf(`{"lease_owner":%q,"version":%d,"action_type":%q,"target":"default","effect_id":"e%d","payload":{"mode":%q}}`,
			c.Owner, c.Version, typ, i, mode)
		var q struct {
			Effect struct {
				EffectID string `json:"effect_id"`
			} `json:"effect"`
		}
		if st := h.call("POST", "/v1/runs/"+key+"/effects", body, &q); st == 200 || st == 201 {
			h.ack("effect:" + key + "/" + q.Effect.EffectID)
		}
	}
	// Wait (bounded) for the effects to settle, then finish; or give the run back.
	to := "completed"
	if h.intn(4) == 0 {
		to = "failed_retryable"
	}
	for deadline := time.Now().Add(4 * time.Second); to == "completed" && time.Now().Before(deadline) && ctx.Err() == nil; {
		var r runJSON
		if h.call("GET", "/v1/runs/"+key, "", &r) == 200 && !slices.ContainsFunc(r.Effects, func(e struct {
			ID         string `json:"id"`
			EffectID   string `json:"effect_id"`
			ActionType string `json:"action_type"`
			State      string `json:"state"`
			Version    int64  `json:"version"`
		}) bool {
			return e.State == "pending" || e.State == "sending" || e.State == "unknown" || e.State == "failed"
		}) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !h.lease(key, "transition", c.Owner, c.Version, to) {
		h.lease(key, "transition", c.Owner, c.Version, "failed_retryable")
	}
	if h.intn(4) == 0 { // a stale owner tries again: it must never win
		h.lease(key, "transition", c.Owner, c.Version, "completed")
	}
}

// leaseSpan is one owner's hold of a short-lease key, on the machine's one clock (the
// database and the instances run here: PostgreSQL's now() and SQLite's process clock
// read the same time as the harness).
type leaseSpan struct {
	owner  string
	grant  time.Time // the claim's lease_expires_at minus the lease
	expiry time.Time // the latest expiry a successful heartbeat reported
	// latest bounds the expiry from above: a heartbeat without a reply (or with a 5xx) may
	// have committed, extending the lease by up to its length from when the reply failed.
	latest  time.Time
	endCall time.Time // when a transition that may have ended it was sent (zero: none)
	wonLate []string  // operations that succeeded after the lease they relied on had expired
}

// shortDelivery holds a key with a 1 s lease, heartbeats it late or on time, and ends it;
// other deliveries take it over when the lease lapses.
func (h *harness) shortDelivery(key string) {
	var c struct {
		Claimed bool      `json:"claimed"`
		Owner   string    `json:"lease_owner"`
		Version int64     `json:"version"`
		Expires time.Time `json:"lease_expires_at"`
	}
	st, skew := h.callAt("POST", "/v1/runs/claim", `{"key":"`+key+`","payload_hash":"h-`+key+`","lease_seconds":1}`, &c)
	if st != 201 || !c.Claimed {
		return
	}
	c.Expires = c.Expires.Add(-skew) // in real time
	sp := &leaseSpan{owner: c.Owner, grant: c.Expires.Add(-time.Second), expiry: c.Expires, latest: c.Expires}
	h.hmu.Lock()
	h.spans[key] = append(h.spans[key], sp)
	h.hmu.Unlock()
	for range h.intn(4) {
		time.Sleep(time.Duration(h.intn(1400)) * time.Millisecond) // sometimes past the lease
		var hb struct {
			Expires time.Time `json:"lease_expires_at"`
		}
		call := time.Now()
		st, skew := h.callAt("POST", "/v1/runs/"+key+"/heartbeat", fmt.Sprintf(`{"lease_owner":%q,"version":%d,"lease_seconds":1}`, c.Owner, c.Version), &hb)
		hb.Expires = hb.Expires.Add(-skew)
		h.hmu.Lock()
		switch {
		case st == 200:
			if call.After(sp.latest.Add(harnessClockTolerance)) {
				sp.wonLate = append(sp.wonLate, fmt.Sprintf("heartbeat sent %s after the lease expired", call.Sub(sp.latest)))
			}
			sp.expiry, sp.latest = hb.Expires, hb.Expires
		case st == 0 || st >= 500: // it may have committed
			sp.latest = time.Now().Add(time.Second)
		}
		h.hmu.Unlock()
	}
	time.Sleep(time.Duration(h.intn(1200)) * time.Millisecond)
	call := time.Now()
	to := []string{"completed", "failed_retryable"}[h.intn(2)]
	st = h.call("POST", "/v1/runs/"+key+"/transition", fmt.Sprintf(`{"lease_owner":%q,"version":%d,"to":%q}`, c.Owner, c.Version, to), nil)
	h.hmu.Lock()
	defer h.hmu.Unlock()
	if st == 200 || st == 0 || st >= 500 {
		sp.endCall = call
	}
	if st == 200 && call.After(sp.latest.Add(harnessClockTolerance)) {
		sp.wonLate = append(sp.wonLate, fmt.Sprintf("transition sent %s after the lease expired", call.Sub(sp.latest)))
	}
}

// agentDelivery is an agent's turn on its run through the work ledger, as `airlock mcp`
// drives it: plan the effect, perform it at the provider, confirm it. The agent may die
// before performing it or between performing and confirming; the next turn (after the 2 s
// lease) is told to reconcile first, looks the provider up and reconciles, and only an
// effect found absent runs again. An agent may also pause after plan for longer than its
// lease (a GC pause, a blocking call): another agent's turn takes the run over meanwhile,
// and the paused one then acts and confirms all the same, as a real one would. finish
// makes the agent reliable (the quiesce). It reports whether the effect is confirmed.
func (h *harness) agentDelivery(key string, finish bool) bool {
	var c claimOut
	if st := h.call("POST", "/v1/runs/claim", `{"key":"`+key+`","payload_hash":"h-`+key+`","lease_seconds":2}`, &c); (st != 200 && st != 201) || !c.Claimed {
		return false
	}
	h.ack("run:" + key)
	pk, path := key+"/publish", "/v1/runs/"+key+"/ledger/effects/publish/"
	for range 3 {
		var p struct {
			Execute bool   `json:"execute"`
			Receipt string `json:"receipt"`
		}
		st := h.call("POST", path+"plan", fmt.Sprintf(`{"lease_owner":%q,"action":"publish","target":"default","input_hash":"in-%s"}`, c.Owner, key), &p)
		switch {
		case st == 200 && p.Execute:
			fate := h.intn(5)
			if finish {
				fate = 3
			}
			if fate == 0 {
				h.count("agent_died_before_acting")
				return false
			}
			if fate == 4 { // paused past its 2 s lease; another agent's turn meanwhile
				h.hmu.Lock()
				h.paused[pk] = true
				h.hmu.Unlock()
				time.Sleep(2300 * time.Millisecond)
				h.agentDelivery(key, false)
				h.count("agent_paused_past_lease")
			}
			id := h.prov.act(h.t, pk, fate == 4)
			if fate == 1 {
				h.count("agent_died_before_confirming")
				return false
			}
			confirm := fmt.Sprintf(`{"lease_owner":%q,"receipt":%q}`, c.Owner, id)
			st := h.call("POST", path+"confirm", confirm, nil)
			if fate == 4 {
				// As the documented agents do (docs/agents.md): the paused agent reports what
				// it did, lease or not, retrying while airlock cannot be reached; the check
				// asks for the second performance's alert only where airlock heard it.
				for try := 0; (st == 0 || st == http.StatusServiceUnavailable) && try < 20; try++ {
					time.Sleep(250 * time.Millisecond)
					st = h.call("POST", path+"confirm", confirm, nil)
				}
				h.hmu.Lock()
				h.staleConfirm[pk] = st
				h.hmu.Unlock()
			}
			if st != 200 {
				return false
			}
		case st == 200 && p.Receipt != "": // confirmed by an earlier turn
		case st == 409: // reconcile first: what happened to the last plan?
			h.prov.mu.Lock()
			ids := []string{}
			for i := range h.prov.stored[pk] {
				ids = append(ids, fmt.Sprintf("%q", recordID(pk, i)))
			}
			h.prov.mu.Unlock()
			found := "[" + strings.Join(ids, ",") + "]"
			if h.call("POST", path+"reconcile", fmt.Sprintf(`{"lease_owner":%q,"found":%s}`, c.Owner, found), nil) != 200 {
				return false
			}
			h.count("agent_reconciled")
			continue
		default:
			return false
		}
		h.call("POST", "/v1/runs/"+key+"/transition", fmt.Sprintf(`{"lease_owner":%q,"version":%d,"to":"completed"}`, c.Owner, c.Version), nil)
		return true
	}
	return false
}

// act is an agent performing its effect at the provider itself; it returns the record's id.
// stale: the agent acts on a plan whose lease it lost (it paused).
func (o *oracle) act(t *testing.T, key string, stale bool) string {
	req, _ := http.NewRequest("POST", o.URL+"/publish", strings.NewReader(`{"mode":"ok"}`))
	req.Header.Set("Idempotency-Key", key)
	if stale {
		req.Header.Set("X-Harness-Stale", "1")
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("agent's own send: %v", err)
		return ""
	}
	defer resp.Body.Close()
	var rec struct{ ID string }
	_ = json.NewDecoder(resp.Body).Decode(&rec)
	return rec.ID
}

// gatedEffect is an effect of the gated type: its approval, what a person decided, and the
// nonce of the payload the approval showed.
type gatedEffect struct {
	key, effectID, token, nonce string
	decided                     string // "", approve, reject, or ? (the reply was lost)
	intended                    string // what the approver asked for (repeated after a lost reply)
}

// gatedDelivery asks for a gated effect: the run waits for a person.
func (h *harness) gatedDelivery() {
	key := fmt.Sprintf("s%d-g%04d", h.seed, h.gatedKeys.Add(1))
	c, ok := h.claim(key)
	if !ok {
		return
	}
	nonce := fmt.Sprintf("n%d", h.intn(1<<30))
	var a struct {
		URL string `json:"approve_url"`
	}
	body := fmt.Sprintf(`{"lease_owner":%q,"version":%d,"action_type":"mail","target":"default","effect_id":"m","payload":{"nonce":%q}}`,
		c.Owner, c.Version, nonce)
	if h.call("POST", "/v1/runs/"+key+"/effects", body, &a) != 202 {
		return
	}
	if h.intn(3) == 0 {
		// As if the 202 was lost: the same request again reissues the link (the first one
		// dies); retried until an answer comes, or the only live link would be unknown.
		for range 5 {
			var b struct {
				URL      string `json:"approve_url"`
				Reissued bool   `json:"reissued"`
			}
			if st := h.call("POST", "/v1/runs/"+key+"/effects", body, &b); st == 202 && b.Reissued {
				a.URL = b.URL
				h.count("approval_link_reissued")
				break
			}
		}
	}
	_, token, _ := strings.Cut(a.URL, "/approve/")
	h.hmu.Lock()
	h.gated = append(h.gated, &gatedEffect{key: key, effectID: "m", token: token, nonce: nonce})
	h.hmu.Unlock()
}

// approver signs in and decides open approvals: mostly approve, sometimes reject.
func (h *harness) approver(jar http.CookieJar, all bool) {
	h.hmu.Lock()
	var open []*gatedEffect
	for _, g := range h.gated {
		if g != nil && (g.decided == "" || g.decided == "?") {
			open = append(open, g)
		}
	}
	h.hmu.Unlock()
	c := &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	form := func(base, path string, v map[string]string) int {
		vals := make([]string, 0, len(v))
		for k, x := range v {
			vals = append(vals, k+"="+x)
		}
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(strings.Join(vals, "&")))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", base)
		resp, err := c.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, g := range open {
		if !all && h.intn(2) == 0 {
			continue
		}
		base := h.url()
		// Signed in once, as a person is, and again only when the session is gone. (Signing
		// in for every decision let the harness's one client address run into the sign-in
		// throttle in a soak: an instance killed between an attempt's count and its
		// forgiveness leaves the attempt counted.)
		if !h.approverSignedIn.Load() {
			if st := form(base, "/login", map[string]string{"username": fmt.Sprintf("lead%d", h.seed), "password": "harness-lead-pw"}); st != 303 && st != 200 {
				h.count(fmt.Sprintf("approver_sign_in_%d", st))
				continue
			}
			h.approverSignedIn.Store(true)
		}
		h.hmu.Lock()
		decision, retry := g.intended, g.decided == "?"
		h.hmu.Unlock()
		if decision == "" {
			decision = "approve"
			if h.intn(4) == 0 {
				decision = "reject"
			}
		}
		st := form(base, "/approve/"+g.token, map[string]string{"decision": decision, "reason": "harness"})
		if st != 200 {
			h.count(fmt.Sprintf("approver_answered_%d", st))
		}
		if st == 303 || st == 401 || st == 403 {
			h.approverSignedIn.Store(false) // sent to sign in: the session is gone
		}
		h.hmu.Lock()
		g.intended = decision
		switch {
		case st == 0 || st >= 500:
			g.decided = "?" // asked again, with the same decision, next round
		case st == 200 || retry:
			// After a lost reply, the same decision again: whichever attempt applied it
			// (a consumed token answers with the neutral page), it is this one.
			g.decided = decision
		}
		h.hmu.Unlock()
	}
}

// checkGated: a gated effect left only after its approval, with exactly the payload the
// approval showed, once; a rejected one never left; every gated run settled.
func (h *harness) checkGated() {
	for _, g := range h.gated {
		if g == nil {
			continue
		}
		pk := g.key + "/" + g.effectID
		h.prov.mu.Lock()
		nonces := slices.Clone(h.prov.nonces[pk])
		h.prov.mu.Unlock()
		switch g.decided {
		case "approve":
			if len(nonces) != 1 {
				h.t.Errorf("seed %d: approved %s reached the provider %d times", h.seed, pk, len(nonces))
			}
		case "reject", "":
			if len(nonces) > 0 {
				h.t.Errorf("seed %d: %s (%s) reached the provider without an approval", h.seed, pk, cmp.Or(g.decided, "undecided"))
			}
		}
		for _, n := range nonces {
			if n != g.nonce {
				h.t.Errorf("seed %d: %s sent payload nonce %s, the approval showed %s", h.seed, pk, n, g.nonce)
			}
		}
		var r runJSON
		if h.call("GET", "/v1/runs/"+g.key, "", &r) == 200 {
			want := map[string]string{"approve": "completed", "reject": "rejected"}[g.decided]
			if want != "" && r.State != want {
				h.t.Errorf("seed %d: gated run %s is %s after %s, want %s", h.seed, g.key, r.State, g.decided, want)
			}
		}
	}
}

// harnessClockTolerance absorbs the gap between a reply's timestamp and the harness
// reading the clock.
const harnessClockTolerance = 50 * time.Millisecond

// checkLeases: no two owners held a short-lease key at once, and nothing relying on a
// lapsed lease won.
func (h *harness) checkLeases() {
	for key, spans := range h.spans {
		slices.SortFunc(spans, func(a, b *leaseSpan) int { return a.grant.Compare(b.grant) })
		for i, a := range spans {
			for _, w := range a.wonLate {
				h.t.Errorf("seed %d: %s (owner %s…): %s", h.seed, key, a.owner[:8], w)
			}
			if i+1 == len(spans) {
				continue
			}
			b, end := spans[i+1], a.expiry
			if !a.endCall.IsZero() && a.endCall.Before(end) {
				end = a.endCall
			}
			if b.grant.Add(harnessClockTolerance).Before(end) {
				h.t.Errorf("seed %d: %s: owner %s… granted at %s while owner %s… held it until %s", h.seed, key,
					b.owner[:8], b.grant.Format("15:04:05.000"), a.owner[:8], end.Format("15:04:05.000"))
			}
		}
	}
}

// worker performs task effects as an external worker would; performed records which it
// carried out (the operator's ground truth for their unknowns).
func (h *harness) worker(performed *sync.Map, reliable bool) {
	var e struct {
		ID         string `json:"id"`
		LeaseOwner string `json:"lease_owner"`
		IK         string `json:"idempotency_key"`
	}
	if h.call("POST", "/v1/effects/claim", `{"types":["task"],"lease_seconds":2}`, &e) != 200 {
		return
	}
	fate := h.intn(5)
	if reliable {
		fate = 3
	}
	switch fate {
	case 0: // dies with the lease (performed or not)
		if h.intn(2) == 0 {
			performed.Store(e.ID, true)
		}
	case 4: // performs it, but its report arrives after the lease lapsed
		performed.Store(e.ID, true)
		time.Sleep(time.Duration(2000+h.intn(1500)) * time.Millisecond)
		h.call("POST", "/v1/effects/"+e.ID+"/complete", fmt.Sprintf(`{"lease_owner":%q,"provider_id":"w-late"}`, e.LeaseOwner), nil)
		h.count("worker_late_report")
	case 1:
		h.call("POST", "/v1/effects/"+e.ID+"/fail", fmt.Sprintf(`{"lease_owner":%q,"retryable":true}`, e.LeaseOwner), nil)
	default:
		performed.Store(e.ID, true)
		h.call("POST", "/v1/effects/"+e.ID+"/complete", fmt.Sprintf(`{"lease_owner":%q,"provider_id":"w"}`, e.LeaseOwner), nil)
	}
}

// operator resolves unknown and failed effects from the ground truth: the oracle's count
// for HTTP effects, the worker's record for tasks.
func (h *harness) operator(performed *sync.Map, all bool) {
	keys := h.allKeys()
	if !all {
		keys = h.recentKeys()
	}
	for _, key := range keys {
		var r runJSON
		if h.call("GET", "/v1/runs/"+key, "", &r) != 200 {
			continue
		}
		for _, e := range r.Effects {
			if e.State != "unknown" {
				continue
			}
			// Decided on the row just read: the version goes with the decision, so a row
			// that moved on meanwhile (reconciled, resent and unknown again) refuses it. A
			// request still queued or processing at the provider is waited for, as a person
			// who asked the provider would.
			if h.prov.pending(key + "/" + e.EffectID) {
				h.count("operator_waited_for_provider")
				continue
			}
			sent := h.prov.records(key+"/"+e.EffectID) > 0
			if e.ActionType == "task" {
				_, sent = performed.Load(e.ID)
			}
			body := fmt.Sprintf(`{"outcome":"not_sent","note":"harness oracle","version":%d}`, e.Version)
			if sent { // the oracle saw the record, not the provider's id for it
				body = fmt.Sprintf(`{"outcome":"sent","no_provider_id":true,"note":"harness oracle","version":%d}`, e.Version)
			}
			st := h.call("POST", "/v1/effects/"+e.ID+"/resolve", body, nil)
			if st == 409 {
				h.count("operator_decision_on_a_moved_effect")
			}
		}
	}
}

// fault injects one fault.
func (h *harness) fault() {
	switch f := h.intn(8); {
	case f >= 6: // a rolling deploy's clean stop; on PostgreSQL mostly mid begin-mark
		h.cleanStop(h.backend == "postgres" && h.intn(3) != 0)
	case f == 5 && h.intn(2) == 0: // the store refuses writes for longer than a send lease
		h.storeOutage()
	case f <= 1: // SIGKILL an instance; restart it, sometimes with a crash point armed
		h.imu.Lock()
		i := h.intn(len(h.insts))
		s := h.insts[i]
		h.insts[i] = nil
		h.imu.Unlock()
		if s == nil {
			return
		}
		_ = s.cmd.Process.Kill()
		<-s.done
		h.kills.Add(1)
		time.Sleep(time.Duration(100+h.intn(400)) * time.Millisecond)
		var extra []string
		h.count("sigkill")
		if h.intn(3) == 0 {
			point := []string{"after_lease", "after_send"}[h.intn(2)]
			extra = append(extra, "AIRLOCK_TEST_CRASH_AT="+point)
			h.count("armed_" + point)
		}
		h.imu.Lock()
		if h.backend == "postgres" && os.Getenv("AIRLOCK_HARNESS_SKEW") != "0" {
			// Restarted with another clock: sometimes further off than any lease is long.
			h.skews[i] = []time.Duration{-3 * time.Second, 3 * time.Second, -10 * time.Second, 10 * time.Second}[h.intn(4)]
			h.count(fmt.Sprintf("skew_%s", h.skews[i]))
		}
		h.insts[i] = h.start(i, extra...)
		h.imu.Unlock()
	case f == 2: // kill switch off for a moment
		if h.call("PUT", "/v1/admin/kill-switch", `{"enabled":false,"reason":"harness"}`, nil) != 200 {
			return
		}
		from := time.Now()
		time.Sleep(time.Duration(1500+h.intn(1500)) * time.Millisecond)
		to := time.Now()
		for h.call("PUT", "/v1/admin/kill-switch", `{"enabled":true,"reason":"harness"}`, nil) != 200 {
			time.Sleep(50 * time.Millisecond)
		}
		h.count("kill_switch_off")
		h.hmu.Lock()
		h.offs = append(h.offs, window{from, to})
		h.hmu.Unlock()
	case f == 3 && h.backend == "postgres": // terminate this run's backends mid-transaction
		conn, err := pgx.Connect(context.Background(), os.Getenv("AIRLOCK_TEST_DATABASE_URL"))
		if err != nil {
			return
		}
		_, _ = conn.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE left(application_name, length($1)) = $1`, h.appName)
		conn.Close(context.Background())
		h.count("backends_terminated")
	case f == 4 && h.backend == "postgres" && os.Getenv("AIRLOCK_HARNESS_PG_RESTART") != "":
		mode := []string{"fast", "immediate"}[h.intn(2)]
		cmd := exec.Command("bash", "-c", os.Getenv("AIRLOCK_HARNESS_PG_RESTART")+" "+mode)
		if out, err := cmd.CombinedOutput(); err != nil {
			h.t.Logf("pg restart (%s): %v\n%s", mode, err, out)
		}
		h.count("pg_restart_" + mode)
	case f == 4 && h.backend == "postgres" && os.Getenv("AIRLOCK_TEST_CITUS_CTL") != "":
		// On Citus (scripts/with-citus.sh): a worker stops (immediate) for longer than a
		// send lease, then starts again; the runs on it are refused meanwhile.
		n := 1 + h.intn(2)
		ctl := func(op string) error {
			out, err := exec.Command(os.Getenv("AIRLOCK_TEST_CITUS_CTL"), op, strconv.Itoa(n)).CombinedOutput()
			if err != nil {
				return fmt.Errorf("citus worker %d %s: %v\n%s", n, op, err, out)
			}
			return nil
		}
		if err := ctl("stop"); err != nil {
			h.t.Error(err)
			return
		}
		time.Sleep(time.Duration(3500+h.intn(1500)) * time.Millisecond)
		for try := 0; ; try++ {
			err := ctl("start")
			if err == nil {
				break
			}
			if try == 2 {
				h.t.Error(err)
				return
			}
		}
		h.count(fmt.Sprintf("citus_worker%d_stopped", n))
	}
}

// storeOutage makes the store refuse every write for longer than a send lease (3 s), so
// outcomes the providers gave cannot be recorded in time. PostgreSQL: this run's backends
// are terminated over and over for 4 s (nothing commits). SQLite: the harness holds the
// file's write lock for 6.5 s, past the instances' 5 s busy timeout (writes fail).
func (h *harness) storeOutage() {
	ctx := context.Background()
	if h.backend == "postgres" {
		conn, err := pgx.Connect(ctx, os.Getenv("AIRLOCK_TEST_DATABASE_URL"))
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE left(application_name, length($1)) = $1`, h.appName)
		}
		h.count("store_outage")
		return
	}
	var path string
	for _, kv := range h.env {
		if v, ok := strings.CutPrefix(kv, "AIRLOCK_DATABASE_URL="); ok {
			path = v
		}
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		h.t.Errorf("store outage: %v", err)
		return
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		return
	}
	time.Sleep(6500 * time.Millisecond)
	_, _ = conn.ExecContext(ctx, "ROLLBACK")
	h.count("store_outage")
}

// crashed restarts instances that died at an armed crash point.
func (h *harness) crashed() {
	h.imu.Lock()
	defer h.imu.Unlock()
	for i, s := range h.insts {
		if s == nil {
			continue
		}
		select {
		case <-s.done:
			// Only the armed crash points end an instance by themselves, with SIGKILL as a
			// power cut would; any other exit is a defect (its last lines say why).
			if ee, ok := s.err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				h.t.Errorf("seed %d: instance %d (%s) exited by itself (%v), not at a crash point; its last lines:\n%s",
					h.seed, i, s.URL, s.err, lastLines(s.Logs(), 20))
			}
			h.kills.Add(1)
			h.insts[i] = h.start(i)
		default:
		}
	}
}

// watchdog fails the run when an instance answers nothing at all, not even a 503 from
// /healthz, for hangAfter (30 s in the run) while its process lives: a hung instance stalls every client that
// reaches it, which no fault excuses. Its goroutines' stacks (SIGQUIT) go into its log,
// kept in a file whose path the failure names, with the stacks' airlock frames counted.
func (h *harness) watchdog(ctx context.Context, hangAfter time.Duration, fail func(format string, args ...any)) {
	c := &http.Client{Timeout: min(5*time.Second, hangAfter/3)}
	silent := map[*serveProc]time.Time{}
	for ctx.Err() == nil {
		time.Sleep(min(2*time.Second, hangAfter/5))
		h.imu.Lock()
		insts := slices.Clone(h.insts)
		h.imu.Unlock()
		for i, s := range insts {
			if s == nil {
				continue
			}
			resp, err := c.Get(s.URL + "/healthz")
			if err == nil {
				resp.Body.Close()
				delete(silent, s)
				continue
			}
			select {
			case <-s.done: // exited: crashed() restarts it and judges the exit
				continue
			default:
			}
			since, ok := silent[s]
			if !ok {
				silent[s] = time.Now()
				continue
			}
			if time.Since(since) < hangAfter {
				continue
			}
			delete(silent, s)
			_ = s.cmd.Process.Signal(syscall.SIGQUIT)
			_ = s.cmd.Process.Signal(syscall.SIGCONT) // a stopped process takes the SIGQUIT now
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.done
			}
			h.imu.Lock()
			if h.insts[i] == s {
				h.insts[i] = h.start(i)
			}
			h.imu.Unlock()
			path := filepath.Join(os.TempDir(), fmt.Sprintf("airlock-harness-hung-%d-%d-%d.log", h.seed, i, time.Now().Unix()))
			_ = os.WriteFile(path, []byte(s.Logs()), 0o644)
			fail("seed %d: instance %d (%s) answered nothing for %s (last error: %v); its log with every goroutine's stack: %s\nwhere its goroutines were:\n%s",
				h.seed, i, s.URL, hangAfter, err, path, stackDigest(s.Logs()))
		}
	}
}

// stackDigest counts a goroutine dump's goroutines by their first airlock function (else
// their innermost one).
func stackDigest(dump string) string {
	counts := map[string]int{}
	for _, g := range strings.Split(dump, "\n\ngoroutine ")[1:] {
		var frame string // the first airlock function, else the innermost one
		for _, l := range strings.Split(g, "\n")[1:] {
			if strings.HasPrefix(l, "\t") || l == "" {
				continue
			}
			if i := strings.LastIndex(l, "("); i > 0 {
				l = l[:i]
			}
			if frame == "" {
				frame = l
			}
			if strings.Contains(l, "airlockhq/airlock/") {
				frame = l
				break
			}
		}
		counts[frame]++
	}
	var out []string
	for f, n := range counts {
		out = append(out, fmt.Sprintf("%5d %s", n, f))
	}
	slices.Sort(out)
	slices.Reverse(out)
	return strings.Join(out[:min(len(out), 15)], "\n")
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (h *harness) run() {
	ctx, stop := context.WithTimeout(context.Background(), h.duration)
	defer stop()
	performed := &h.performed
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				switch h.intn(11) {
				case 10:
					h.agentDelivery(h.agentKey(), false)
				case 0, 1:
					h.worker(performed, false)
				case 2:
					h.shortDelivery(h.short[h.intn(len(h.short))])
				case 3:
					if h.intn(2) == 0 {
						h.gatedDelivery()
					} else {
						h.delivery(ctx, h.liveKey())
					}
				default:
					h.delivery(ctx, h.liveKey())
				}
			}
		})
	}
	wg.Go(func() {
		for ctx.Err() == nil {
			time.Sleep(time.Duration(500+h.intn(1500)) * time.Millisecond)
			h.fault()
			h.crashed()
		}
	})
	watch, unwatch := context.WithCancel(context.Background())
	var watching sync.WaitGroup
	watching.Go(func() { h.watchdog(watch, 30*time.Second, h.t.Errorf) })
	defer watching.Wait()
	defer unwatch()
	jar, _ := cookiejar.New(nil)
	wg.Go(func() {
		for ctx.Err() == nil {
			time.Sleep(300 * time.Millisecond)
			h.approver(jar, false)
		}
	})
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			time.Sleep(500 * time.Millisecond)
			h.crashed()
			h.operator(performed, false)
			if i%4 == 3 {
				h.moreKeys()
			}
		}
	})
	wg.Wait()
	// Quiesce: every instance up, sends allowed, unknowns resolved, until nothing is open.
	h.crashed()
	for h.call("PUT", "/v1/admin/kill-switch", `{"enabled":true,"reason":"harness end"}`, nil) != 200 {
		time.Sleep(50 * time.Millisecond)
	}
	for deadline := time.Now().Add(60 * time.Second); ; {
		h.crashed()
		h.operator(performed, true)
		h.worker(performed, true) // pending tasks wait for a worker
		h.approver(jar, true)     // and waiting approvals for a person
		h.hmu.Lock()
		agents := slices.Clone(h.agents)
		h.hmu.Unlock()
		for _, key := range agents {
			h.agentDelivery(key, true) // and planned agent effects for their agent
		}
		open := 0
		for _, key := range h.allKeys() {
			var r runJSON
			switch st := h.call("GET", "/v1/runs/"+key, "", &r); st {
			case 200:
				for _, e := range r.Effects {
					if e.State == "pending" || e.State == "sending" || e.State == "unknown" || e.State == "planned" {
						open++
					}
				}
			case 404:
			default:
				open++ // unreadable: not known to be settled
			}
		}
		if open == 0 {
			// Requests still queued or processing at a slow provider may yet keep records:
			// the checks judge the records once they are final.
			if !h.prov.settle(15 * time.Second) {
				h.t.Errorf("seed %d: the provider still processes requests 15 s after every effect settled", h.seed)
			}
			break
		}
		if time.Now().After(deadline) {
			h.t.Errorf("seed %d: %d effects still open (or runs unreadable) 60 s after the workload ended", h.seed, open)
			h.dumpLogs()
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dumpLogs shows the last lines of every instance's log (a failing run's diagnosis).
func (h *harness) dumpLogs() {
	h.imu.Lock()
	defer h.imu.Unlock()
	for i, s := range h.insts {
		if s == nil {
			continue
		}
		h.t.Logf("instance %d (%s), last log lines:\n%s", i, s.URL, lastLines(s.Logs(), 15))
	}
}

func (h *harness) check() {
	t := h.t
	h.crashed()
	defer func() {
		if t.Failed() {
			h.dumpLogs()
		}
	}()
	h.hmu.Lock()
	defer h.hmu.Unlock()
	faults := []string{}
	h.faults.Range(func(k, v any) bool {
		faults = append(faults, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	slices.Sort(faults)
	h.prov.mu.Lock()
	sends, lookups := 0, h.prov.lookups
	for _, n := range h.prov.requests {
		sends += n
	}
	h.prov.mu.Unlock()
	decided := map[string]int{}
	for _, g := range h.gated {
		decided[cmp.Or(g.decided, "undecided")]++
	}
	t.Logf("seed %d: %d run operations, %d provider requests, %d lookups, %d instance deaths, gated %v; clock offsets %v; faults %s", h.seed, len(h.history), sends,
		lookups, h.kills.Load(), decided, h.skews, strings.Join(faults, " "))

	// 1. No non-idempotent effect is stored twice by its provider (a lost first send may be
	// sent again; a kept one never).
	h.prov.mu.Lock()
	for key, n := range h.prov.stored {
		if n > 1 && !h.isCRM(key) && !h.paused[key] { // a paused agent's second record: checkPaused
			t.Errorf("seed %d: %s stored by the provider %d times (%d requests)", h.seed, key, n, h.prov.requests[key])
		}
	}
	// 2. Nothing was sent while the kill switch was off (sends begun before the disable
	// committed may still be on their way: half a second of grace).
	for key, ts := range h.prov.arrivals {
		for _, at := range ts {
			for _, w := range h.offs {
				if at.After(w.from.Add(500*time.Millisecond)) && at.Before(w.to) {
					t.Errorf("seed %d: %s reached the provider at %s, inside a kill-switch window %s–%s", h.seed, key,
						at.Format("15:04:05.000"), w.from.Format("15:04:05.000"), w.to.Format("15:04:05.000"))
				}
			}
		}
	}
	h.prov.mu.Unlock()

	// 3. Every acknowledged write is there after recovery; every effect ended, with its
	// events; no run hangs in approved or a parked state.
	keys := append(slices.Clone(h.keys), h.agents...)
	for _, g := range h.gated {
		keys = append(keys, g.key)
	}
	for _, key := range keys {
		var r runJSON
		st := h.call("GET", "/v1/runs/"+key, "", &r)
		if st == 404 {
			if h.acked["run:"+key] {
				t.Errorf("seed %d: run %s was acknowledged but is gone", h.seed, key)
			}
			continue
		}
		if st != 200 {
			t.Errorf("seed %d: GET run %s: %d", h.seed, key, st)
			continue
		}
		if slices.Contains([]string{"approved", "awaiting_human"}, r.State) {
			t.Errorf("seed %d: run %s is stuck in %s", h.seed, key, r.State)
		}
		var ev struct {
			Events []struct {
				Kind   string          `json:"kind"`
				Detail json.RawMessage `json:"detail"`
			} `json:"events"`
		}
		h.call("GET", "/v1/runs/"+key+"/events?limit=1000", "", &ev)
		kinds := map[string]bool{}
		queued := map[string]bool{}
		for _, e := range ev.Events {
			kinds[e.Kind] = true
			var d struct {
				EffectID string `json:"effect_id"`
			}
			_ = json.Unmarshal(e.Detail, &d)
			if e.Kind == "effect_queued" || e.Kind == "effect_planned" {
				queued[d.EffectID] = true
			}
		}
		if !kinds["claimed"] {
			t.Errorf("seed %d: run %s has no claimed event", h.seed, key)
		}
		have := map[string]bool{}
		for _, e := range r.Effects {
			have[e.EffectID] = true
			if !slices.Contains([]string{"completed", "failed", "cancelled"}, e.State) {
				t.Errorf("seed %d: effect %s/%s ended %s", h.seed, key, e.EffectID, e.State)
			}
			if !queued[e.EffectID] {
				t.Errorf("seed %d: effect %s/%s has no effect_queued event", h.seed, key, e.EffectID)
			}
			pk := key + "/" + e.EffectID
			if slices.Contains([]string{"note", "invoice", "slow", "queued", "lagged", "publish"}, e.ActionType) && e.State == "completed" &&
				h.prov.records(pk) != 1 && !h.paused[pk] {
				t.Errorf("seed %d: %s %s completed with %d records at the provider", h.seed, e.ActionType, pk, h.prov.records(pk))
			}
			// "failed" means not performed: the provider (the worker, for tasks) holds nothing.
			if e.State == "failed" {
				if _, done := h.performed.Load(e.ID); e.ActionType == "task" && done {
					t.Errorf("seed %d: task %s ended failed, but the worker performed it", h.seed, pk)
				} else if n := h.prov.records(pk); n > 0 {
					t.Errorf("seed %d: %s %s ended failed, but the provider holds %d record(s) of it", h.seed, e.ActionType, pk, n)
				}
			}
		}
		for w := range h.acked {
			if k, id, ok := strings.Cut(strings.TrimPrefix(w, "effect:"), "/"); ok && strings.HasPrefix(w, "effect:") && k == key && !have[id] {
				t.Errorf("seed %d: effect %s/%s was acknowledged but is gone", h.seed, key, id)
			}
		}
	}

	// 3b. Every change recorded in the runs', effects' and approvals' rows has its event.
	h.checkEvents(append(slices.Clone(keys), h.short...))
	// 3c. Against time: a clean stop left no unknown that never left, every committed alert
	// was raised, an agent's second performance is on record.
	h.checkTime(append(slices.Clone(keys), h.short...))

	// 4. Short leases: never two holders at once; nothing relying on a lapsed lease won.
	h.checkLeases()
	// 5. Gated effects left only with their approval, as approved, once.
	h.checkGated()

	// 6. Claims, heartbeats and transitions of long-lease keys are linearizable per key.
	res, info := porcupine.CheckOperationsVerbose(runLinearizability.ToModel(), h.history, time.Minute)
	if res != porcupine.Ok {
		path := filepath.Join(os.TempDir(), fmt.Sprintf("airlock-harness-%s-%d.html", h.backend, h.seed))
		_ = porcupine.VisualizePath(runLinearizability.ToModel(), info, path)
		t.Errorf("seed %d: run histories are not linearizable (%s); visualization: %s", h.seed, res, path)
		for _, ops := range runLinearizability.Partition(h.history) {
			if porcupine.CheckOperations(runLinearizability.ToModel(), ops) {
				continue
			}
			slices.SortFunc(ops, func(a, b porcupine.Operation) int { return int(a.Call - b.Call) })
			t.Logf("key %s:", ops[0].Metadata)
			for _, op := range ops {
				ret := "never"
				if op.Return < 1<<62-1 {
					ret = fmt.Sprintf("%+.3fs", float64(op.Return-ops[0].Call)/1e9)
				}
				t.Logf("  %+.3fs → %s  %+v → %+v", float64(op.Call-ops[0].Call)/1e9, ret, op.Input, op.Output)
			}
		}
	}
}

// isCRM tells whether a provider key belongs to an idempotent (crm) effect: resent with the
// same key by design.
func (h *harness) isCRM(key string) bool {
	k, id, ok := strings.Cut(key, "/")
	if !ok {
		return false
	}
	var r runJSON
	if st := h.call("GET", "/v1/runs/"+k, "", &r); st != 200 {
		h.t.Errorf("seed %d: GET run %s: %d (cannot tell its effect's type)", h.seed, k, st)
		return true
	}
	for _, e := range r.Effects {
		if e.EffectID == id {
			return e.ActionType == "crm"
		}
	}
	return false
}

// TestWatchdogDumpsAHungInstance stops an instance (SIGSTOP: it accepts connections and
// answers nothing, as a deadlocked process does) and requires the watchdog to fail the
// run with the instance's goroutine stacks, and to put a live instance in its slot.
func TestWatchdogDumpsAHungInstance(t *testing.T) {
	h := newHarness(t, "sqlite", databases(t)["sqlite"], 1, time.Second)
	hung := h.insts[0]
	if err := hung.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithTimeout(context.Background(), 60*time.Second)
	defer stop()
	var failures []string
	h.watchdog(ctx, 3*time.Second, func(format string, args ...any) {
		failures = append(failures, fmt.Sprintf(format, args...))
		stop()
	})
	if len(failures) != 1 {
		t.Fatalf("the watchdog reported %d failures for one hung instance: %q", len(failures), failures)
	}
	msg := failures[0]
	if !strings.Contains(msg, "instance 0 ("+hung.URL+") answered nothing") || !strings.Contains(msg, "airlockhq/airlock/") {
		t.Errorf("the failure does not name the instance and where its goroutines were:\n%s", msg)
	}
	path := msg[strings.Index(msg, "stack: ")+len("stack: ") : strings.Index(msg, "\nwhere")]
	dump, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(dump), "goroutine ") || !strings.Contains(string(dump), "SIGQUIT") {
		t.Errorf("the kept log %s holds no goroutine dump (%v)", path, err)
	}
	os.Remove(path)
	select {
	case <-hung.done:
	default:
		t.Error("the hung instance still runs")
	}
	if h.insts[0] == hung || h.insts[0] == nil {
		t.Fatal("no new instance took the hung one's slot")
	}
	if st, err := apiJSON("GET", h.insts[0].URL+"/healthz", h.key, "", nil); st != 200 {
		t.Errorf("the new instance: %d %v", st, err)
	}
}
