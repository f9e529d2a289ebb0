// Command failover-load is the client side of scripts/failover-drill.sh: a recording
// provider, the load (claims, effects, approvals) through every airlock instance, a
// watcher of each instance's LISTEN metrics, and the final accounting. The script owns the
// database cluster and the kills; this program owns everything a client and a provider
// see. It runs until DIR/stop exists, lets the outbox settle, settles what is left unknown
// itself (as an operator would, from the provider's records), prints the report and exits
// non-zero when a guarantee was broken.
//
// Files in DIR it reads: stop (the script's "load over"), kills (one line per round:
// "round kill_ms node promoted_ms"). Files it writes: requests.log, listen.log.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/scripts/internal/approver"
)

func main() {
	var (
		dir      = flag.String("dir", "", "the drill's work directory")
		urls     = flag.String("urls", "", "airlock instances, comma-separated base URLs")
		key      = flag.String("key", "", "API key with the runs, read and operator scopes")
		user     = flag.String("approver", "", "approver account name")
		password = flag.String("password", "", "approver password")
		dsn      = flag.String("dsn", "", "multi-host DSN of the cluster (read-write)")
		provAddr = flag.String("provider", "127.0.0.1:0", "listen address of the recording provider")
		workers  = flag.Int("workers", 4, "clients queueing effects")
		settle   = flag.Duration("settle", 90*time.Second, "how long the outbox may take to settle after the load")
	)
	flag.Parse()
	d := &drill{dir: *dir, urls: strings.Split(*urls, ","), key: *key,
		dsn: *dsn, records: map[string]int{}, statuses: map[string]map[int]int{}, replayed: map[string]int{}}
	d.person = approver.New(*user, *password, func(route string, st int, start time.Time) { d.count(route, st, start, false, "-") })
	ln, err := net.Listen("tcp", *provAddr)
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = http.Serve(ln, http.HandlerFunc(d.provide)) }()
	if err := os.WriteFile(filepath.Join(d.dir, "provider.addr"), []byte(ln.Addr().String()), 0o644); err != nil {
		log.Fatal(err)
	}
	d.waitReady()
	d.reqLog, _ = os.Create(filepath.Join(d.dir, "requests.log"))
	d.listenLog, _ = os.Create(filepath.Join(d.dir, "listen.log"))
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range *workers {
		wg.Add(1)
		go func() { defer wg.Done(); d.worker(ctx, w) }()
	}
	var bg sync.WaitGroup
	bg.Add(3)
	go func() { defer bg.Done(); d.approver(ctx) }()
	go func() { defer bg.Done(); d.watchListen(ctx) }()
	go func() { defer bg.Done(); d.notifier(ctx) }()
	for {
		if _, err := os.Stat(filepath.Join(d.dir, "stop")); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	stop()
	wg.Wait()
	// Decide what is still open (the load has stopped; approvals go on until all are decided).
	actx, acancel := context.WithTimeout(context.Background(), *settle)
	d.approveAll(actx)
	acancel()
	bg.Wait()
	os.Exit(d.report(*settle))
}

type drill struct {
	dir, key, dsn string
	urls          []string
	person        *approver.Approver // the approver: signs in, decides

	mu       sync.Mutex
	records  map[string]int // provider: records stored per Idempotency-Key
	requests int
	statuses map[string]map[int]int // route → status → count (0: no answer)
	replayed map[string]int         // route → answers replayed from an Idempotency-Key record
	acked    []ack
	gated    []*gate
	reqLog   *os.File
	// listenLog lines: "ms instance listening notifications".
	listenLog *os.File
	lookups   atomic.Int64
	// lostReplies are decisions whose answer never arrived and whose retry found the link
	// used.
	lostReplies int
}

type ack struct{ key, what string } // what: claim, effect
type gate struct {
	key, token, decision string
	decided              bool
	unanswered           bool // an attempt got no answer or a 5xx: it may have applied
}

// provide is the recording provider: every POST is a record stored under its
// Idempotency-Key (it does not deduplicate, so a second request is a second record); a
// GET ?key= lists the records of that key (airlock's authoritative lookup).
func (d *drill) provide(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		d.lookups.Add(1)
		k := r.URL.Query().Get("key")
		d.mu.Lock()
		n := d.records[k]
		d.mu.Unlock()
		if n > 0 {
			fmt.Fprintf(w, `[{"id":%q}]`, "p-"+k)
			return
		}
		fmt.Fprint(w, `[]`)
		return
	}
	k := r.Header.Get("Idempotency-Key")
	_, _ = io.Copy(io.Discard, r.Body)
	d.mu.Lock()
	d.records[k]++
	d.requests++
	d.mu.Unlock()
	// A provider that takes a moment: sends are in flight when the primary dies, so some
	// outcomes meet a database that is gone.
	time.Sleep(150 * time.Millisecond)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q}`, "p-"+k)
}

func (d *drill) waitReady() {
	for _, u := range d.urls {
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(300 * time.Millisecond) {
			if resp, err := http.Get(u + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				log.Fatalf("%s not ready", u)
			}
		}
	}
}

var client = &http.Client{Timeout: 15 * time.Second}

// call POSTs body with an Idempotency-Key, retrying what the API says is retryable (503,
// 409 request_in_progress, no answer) on the other instances, until an answer or ctx
// ends. Every attempt is counted and logged.
func (d *drill) call(ctx context.Context, route, path, idem, body string, out any, start int) (int, bool) {
	for i := start; ; i++ {
		u := d.urls[i%len(d.urls)]
		req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), "POST", u+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+d.key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", idem)
		t0 := time.Now()
		resp, err := client.Do(req)
		st, replayed, code := 0, false, ""
		var raw []byte
		if err == nil {
			raw, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			st, replayed = resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true"
			var e struct {
				Error struct{ Code string } `json:"error"`
				Code  string                `json:"code"`
			}
			_ = json.Unmarshal(raw, &e)
			code = e.Error.Code + e.Code
		}
		d.count(route, st, t0, replayed, code)
		switch {
		case st == 0 || st == 503 || st == 409 && code == "request_in_progress":
			if ctx.Err() != nil && i-start > 200 {
				return st, false
			}
			time.Sleep(250 * time.Millisecond)
			continue
		}
		if out != nil {
			_ = json.Unmarshal(raw, out)
		}
		return st, replayed
	}
}

func (d *drill) count(route string, st int, t0 time.Time, replayed bool, code string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.statuses[route] == nil {
		d.statuses[route] = map[int]int{}
	}
	d.statuses[route][st]++
	if replayed {
		d.replayed[route]++
	}
	fmt.Fprintf(d.reqLog, "%d %d %s %d %v %s\n", t0.UnixMilli(), time.Now().UnixMilli(), route, st, replayed, cmpOr(code, "-"))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// worker claims fresh runs and queues one effect on each: two of three plain (sent at
// once), one gated (sent after an approval).
func (d *drill) worker(ctx context.Context, w int) {
	for i := 1; ctx.Err() == nil; i++ {
		k := fmt.Sprintf("drill-%d-%d", w, i)
		var c struct {
			Claimed bool   `json:"claimed"`
			Owner   string `json:"lease_owner"`
			Version int64  `json:"version"`
		}
		st, _ := d.call(ctx, "claim", "/v1/runs/claim", "c-"+k, fmt.Sprintf(`{"key":%q,"payload":{"n":%d}}`, k, i), &c, i)
		if st/100 != 2 || !c.Claimed {
			continue
		}
		d.ackd(k, "claim")
		action, eid := "note", "e1"
		if i%3 == 0 {
			action, eid = "gated", "g1"
		}
		var q struct {
			URL string `json:"approve_url"`
		}
		st, _ = d.call(ctx, "effect", "/v1/runs/"+k+"/effects", "q-"+k,
			fmt.Sprintf(`{"lease_owner":%q,"version":%d,"action_type":%q,"target":"default","effect_id":%q,"payload":{"n":%d}}`,
				c.Owner, c.Version, action, eid, i), &q, i+1)
		switch st {
		case 201, 200:
			d.ackd(k, "effect")
		case 202:
			d.ackd(k, "gated")
			_, token, _ := strings.Cut(q.URL, "/approve/")
			dec := "approve"
			if i%4 == 0 {
				dec = "reject"
			}
			d.mu.Lock()
			d.gated = append(d.gated, &gate{key: k, token: token, decision: dec})
			d.mu.Unlock()
		}
	}
}

func (d *drill) ackd(k, what string) {
	d.mu.Lock()
	d.acked = append(d.acked, ack{k, what})
	d.mu.Unlock()
}

// approver signs in (again whenever its session is gone) and decides the open approvals
// while the load runs, retrying a decision that got no answer or a 503 with the same
// decision.
func (d *drill) approver(ctx context.Context) {
	for ctx.Err() == nil {
		d.decideOpen(ctx)
		time.Sleep(300 * time.Millisecond)
	}
}

func (d *drill) approveAll(ctx context.Context) {
	for ctx.Err() == nil && d.decideOpen(ctx) > 0 {
		time.Sleep(300 * time.Millisecond)
	}
}

// decideOpen tries each undecided approval once; it returns how many are still open.
func (d *drill) decideOpen(ctx context.Context) int {
	d.mu.Lock()
	var open []*gate
	for _, g := range d.gated {
		if !g.decided {
			open = append(open, g)
		}
	}
	d.mu.Unlock()
	left := 0
	for n, g := range open {
		if ctx.Err() != nil {
			return len(open) - n
		}
		st, tried := d.person.Decide(d.urls[n%len(d.urls)], g.token, g.decision, "drill")
		if !tried {
			left++
			continue
		}
		if st == 200 {
			d.mu.Lock()
			g.decided = true
			d.mu.Unlock()
			d.ackd(g.key, "decision:"+g.decision)
			continue
		}
		if st == 404 && g.unanswered {
			// A used link answers like an unknown one: an earlier attempt whose answer
			// was lost applied it. Not acknowledged to this client; the report shows
			// what the database holds.
			d.mu.Lock()
			g.decided = true
			d.lostReplies++
			d.mu.Unlock()
			continue
		}
		if st == 0 || st >= 500 {
			g.unanswered = true
		}
		left++
	}
	return left
}

// watchListen scrapes each instance's /metrics every 100 ms and logs each change of its
// LISTEN state and notification count.
func (d *drill) watchListen(ctx context.Context) {
	var wg sync.WaitGroup
	for i, u := range d.urls {
		wg.Add(1)
		go func() { // one watcher per instance: a slow scrape of one does not delay the other
			defer wg.Done()
			last := ""
			for ctx.Err() == nil {
				// The LISTEN metrics are read as the scrape starts (the rest of /metrics
				// may wait for the database): the change is logged at the scrape's start.
				t0 := time.Now()
				if up, n, ok := scrape(u); ok {
					if s := fmt.Sprintf("%d %d", up, n); s != last {
						last = s
						d.mu.Lock()
						fmt.Fprintf(d.listenLog, "%d %d %s\n", t0.UnixMilli(), i+1, s)
						d.mu.Unlock()
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
}

func scrape(u string) (up, n int64, ok bool) {
	c := &http.Client{Timeout: 6 * time.Second}
	resp, err := c.Get(u + "/metrics")
	if err != nil {
		return 0, 0, false
	}
	defer resp.Body.Close()
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "airlock_effects_listening":
			up, found = int64(v), found+1
		case "airlock_effects_notifications_total":
			n, found = int64(v), found+1
		}
	}
	return up, n, found == 2
}

// notifier sends NOTIFY airlock_effects to whichever node accepts writes every 200 ms, so
// the time until each instance hears one again after a promotion does not wait for the
// first commit (which, under synchronous_mode_strict, waits for the standby).
func (d *drill) notifier(ctx context.Context) {
	var conn *pgx.Conn
	failed := false
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			c, err := pgx.Connect(ctx, d.dsn)
			if err == nil {
				conn = c
			}
		}
		if conn != nil {
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			t0 := time.Now()
			if _, err := conn.Exec(qctx, `NOTIFY airlock_effects`); err != nil {
				_ = conn.Close(context.Background())
				conn = nil
				failed = true
			} else if failed {
				// The first NOTIFY through a new session: a primary accepts sessions again
				// (logged as instance 0, sent at t0).
				failed = false
				d.mu.Lock()
				fmt.Fprintf(d.listenLog, "%d 0 1 0\n", t0.UnixMilli())
				d.mu.Unlock()
			}
			cancel()
		} else {
			failed = true
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// report checks the acknowledged writes against the new primary, waits for the outbox to
// settle, settles what stays unknown, and prints the figures. It returns the exit status.
func (d *drill) report(settle time.Duration) int {
	ctx := context.Background()
	db, err := pgx.Connect(ctx, d.dsn)
	if err != nil {
		log.Fatalf("connect for the report: %v", err)
	}
	defer db.Close(ctx)
	fail := 0
	bad := func(format string, a ...any) { fmt.Printf("FAIL: "+format+"\n", a...); fail = 1 }

	// 1. Acknowledged writes are on the new primary.
	runsSet, effSet, apprSet := map[string]bool{}, map[string]bool{}, map[string]bool{}
	decided := map[string]string{}
	rows, _ := db.Query(ctx, `SELECT r.idempotency_key, coalesce(e.effect_id, ''), coalesce(a.decision, ''), a.id IS NOT NULL
		FROM workflow_runs r LEFT JOIN effects e ON e.idempotency_key = r.idempotency_key
		LEFT JOIN approvals a ON a.idempotency_key = r.idempotency_key
		WHERE r.idempotency_key LIKE 'drill-%'`)
	for rows.Next() {
		var k, e, dec string
		var appr bool
		_ = rows.Scan(&k, &e, &dec, &appr)
		runsSet[k] = true
		apprSet[k] = apprSet[k] || appr
		if e != "" {
			effSet[k] = true
		}
		if dec != "" {
			decided[k] = dec
		}
	}
	if err := rows.Err(); err != nil {
		log.Fatalf("read runs: %v", err)
	}
	lost := map[string]int{}
	acks := map[string]int{}
	for _, a := range d.acked {
		acks[strings.Split(a.what, ":")[0]]++
		switch {
		case a.what == "claim" && !runsSet[a.key], a.what == "effect" && !effSet[a.key], a.what == "gated" && !apprSet[a.key]:
			lost[a.what]++
		case strings.HasPrefix(a.what, "decision:"):
			want := strings.TrimPrefix(a.what, "decision:")
			if dec := decided[a.key]; dec != want {
				fmt.Printf("decision on %s acknowledged as %s, stored as %q\n", a.key, want, dec)
				lost["decision"]++
			}
		}
	}
	fmt.Printf("acknowledged writes: %d claims, %d effects queued, %d gated effects awaiting approval, %d approval decisions\n",
		acks["claim"], acks["effect"], acks["gated"], acks["decision"])
	nl := lost["claim"] + lost["effect"] + lost["gated"] + lost["decision"]
	fmt.Printf("acknowledged writes lost: %d (claims %d, effects %d, approvals %d, decisions %d)\n", nl, lost["claim"], lost["effect"], lost["gated"], lost["decision"])
	if nl > 0 {
		bad("acknowledged writes lost")
	}

	// 2. The outbox settles: nothing pending, sending or unknown (approved gated effects
	// included); reconciliation's lookups settle unknowns; what is left after settle is
	// resolved here as an operator would, from the provider's records.
	// open counts the effects not settled; unknown lists those only an operator can settle
	// (the gated type has no lookup).
	open := func() (n int, unknown []string) {
		r, _ := db.Query(ctx, `SELECT id, state, action_type FROM effects WHERE idempotency_key LIKE 'drill-%' AND state IN ('pending','sending','unknown')`)
		for r.Next() {
			var id, st, at string
			_ = r.Scan(&id, &st, &at)
			n++
			if st == "unknown" && at == "gated" {
				unknown = append(unknown, id)
			}
		}
		return n, unknown
	}
	t0 := time.Now()
	n, unknown := open()
	for ; n > len(unknown) && time.Since(t0) < settle; n, unknown = open() {
		time.Sleep(time.Second)
	}
	fmt.Printf("outbox settled %.1f s after the load stopped (%d still open, %d of them unknown without a lookup)\n", time.Since(t0).Seconds(), n, len(unknown))
	resolved := map[string]int{}
	for _, id := range unknown {
		var k, eid string
		var version int64
		_ = db.QueryRow(ctx, `SELECT idempotency_key, effect_id, version FROM effects WHERE id = $1`, id).Scan(&k, &eid, &version)
		d.mu.Lock()
		stored := d.records[k+"/"+eid]
		d.mu.Unlock()
		body := fmt.Sprintf(`{"outcome":"not_sent","note":"drill: the provider has no record","version":%d}`, version)
		if stored > 0 {
			body = fmt.Sprintf(`{"outcome":"sent","provider_id":%q,"note":"drill: the provider has it","version":%d}`, "p-"+k+"/"+eid, version)
		}
		st, _ := d.call(ctx, "resolve", "/v1/effects/"+id+"/resolve", "r-"+id, body, nil, 0)
		resolved[fmt.Sprintf("%d", st)]++
	}
	if len(unknown) > 0 {
		for t1 := time.Now(); time.Since(t1) < settle; time.Sleep(time.Second) {
			if n, _ = open(); n == 0 {
				break
			}
		}
	}
	if n, _ = open(); n > 0 {
		bad("%d effects still pending, sending or unknown", n)
	}

	// 3. Effects stored twice by the provider, and gated effects sent against a rejection.
	d.mu.Lock()
	twice, totalRecords := 0, 0
	for k, c := range d.records {
		totalRecords += c
		if c > 1 {
			twice++
			fmt.Printf("stored %d times: %s\n", c, k)
		}
	}
	requests := d.requests
	d.mu.Unlock()
	var completed, cancelled, failed int
	_ = db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state='completed'), count(*) FILTER (WHERE state='cancelled'), count(*) FILTER (WHERE state='failed')
		FROM effects WHERE idempotency_key LIKE 'drill-%'`).Scan(&completed, &cancelled, &failed)
	fmt.Printf("provider: %d requests, %d records; effects completed %d, cancelled %d, failed %d\n", requests, totalRecords, completed, cancelled, failed)
	fmt.Printf("effects stored twice by the provider: %d\n", twice)
	if twice > 0 {
		bad("effects stored twice")
	}
	var approvedSent, rejectedSent, approvedUnsent, rejected int
	for k, dec := range decided {
		d.mu.Lock()
		c := d.records[k+"/g1"]
		d.mu.Unlock()
		switch {
		case dec == "reject" && c > 0:
			rejectedSent++
		case dec == "reject":
			rejected++
		case dec == "approve" && c == 1:
			approvedSent++
		case dec == "approve":
			approvedUnsent++
		}
	}
	wrong := 0
	for _, g := range d.gated {
		if g.unanswered && g.decided && decided[g.key] != g.decision {
			wrong++
		}
	}
	fmt.Printf("decisions whose answer was lost and whose retry found the link used: %d (%d stored otherwise than asked)\n", d.lostReplies, wrong)
	if wrong > 0 {
		bad("a decision whose answer was lost was stored otherwise")
	}
	fmt.Printf("gated: %d approved and sent once, %d approved but not sent; %d rejected and not sent, %d rejected but sent\n", approvedSent, approvedUnsent, rejected, rejectedSent)
	if rejectedSent+approvedUnsent > 0 {
		bad("a gated effect went against its decision")
	}
	var unk, recLookup, recLate, res int
	_ = db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'effect_unknown'),
		count(*) FILTER (WHERE kind = 'effect_reconciled' AND coalesce(detail->>'source','') <> 'dispatcher''s late outcome'),
		count(*) FILTER (WHERE kind = 'effect_reconciled' AND detail->>'source' = 'dispatcher''s late outcome'),
		count(*) FILTER (WHERE kind = 'effect_resolved')
		FROM events WHERE run_key LIKE 'drill-%'`).Scan(&unk, &recLookup, &recLate, &res)
	fmt.Printf("unknowns created: %d; settled by reconciliation's lookup %d, by the dispatcher's late outcome %d, by operator resolve %d (this drill, from the provider's records: %v); provider lookups %d\n",
		unk, recLookup, recLate, res, resolved, d.lookups.Load())

	// 4. What clients saw.
	d.mu.Lock()
	routes := make([]string, 0, len(d.statuses))
	for r := range d.statuses {
		routes = append(routes, r)
	}
	sort.Strings(routes)
	var other int
	for _, r := range routes {
		var parts []string
		codes := make([]int, 0)
		for c := range d.statuses[r] {
			codes = append(codes, c)
		}
		sort.Ints(codes)
		for _, c := range codes {
			parts = append(parts, fmt.Sprintf("%d×%d", c, d.statuses[r][c]))
			if c >= 500 && c != 503 {
				other += d.statuses[r][c]
			}
		}
		rep := ""
		if d.replayed[r] > 0 {
			rep = fmt.Sprintf(" (%d answered from the Idempotency-Key record: a retry after a lost reply)", d.replayed[r])
		}
		fmt.Printf("statuses %-7s %s%s\n", r, strings.Join(parts, " "), rep)
	}
	d.mu.Unlock()
	fmt.Printf("5xx other than 503: %d\n", other)
	if other > 0 {
		bad("clients saw 5xx other than 503")
	}
	d.rounds()
	return fail
}

// rounds prints, per round, the promotion, the first write acknowledged after it, and
// when each instance's LISTEN heard a NOTIFY again.
func (d *drill) rounds() {
	b, _ := os.ReadFile(filepath.Join(d.dir, "kills"))
	reqs := readLines(filepath.Join(d.dir, "requests.log"))
	lis := readLines(filepath.Join(d.dir, "listen.log"))
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		kill, _ := strconv.ParseInt(f[1], 10, 64)
		prom, _ := strconv.ParseInt(f[3], 10, 64)
		// Writes are out from the kill until the first write (claim, effect, decision)
		// acknowledged fresh (not replayed) by the new primary: one that started after
		// the kill and was answered after the promotion.
		write := func(r []string) bool { return r[2] == "claim" || r[2] == "effect" || r[2] == "decide" }
		ok := func(r []string) bool { return r[3] == "200" || r[3] == "201" || r[3] == "202" }
		var back int64
		for _, r := range reqs { // "start end route status replayed code"
			start, _ := strconv.ParseInt(r[0], 10, 64)
			end, _ := strconv.ParseInt(r[1], 10, 64)
			if start > kill && end > prom && write(r) && ok(r) && r[4] == "false" && (back == 0 || end < back) {
				back = end
			}
		}
		refused := 0
		for _, r := range reqs {
			start, _ := strconv.ParseInt(r[0], 10, 64)
			if start > kill && (back == 0 || start <= back) && write(r) && !ok(r) {
				refused++
			}
		}
		var relisten []string
		for inst := 1; inst <= len(d.urls); inst++ {
			// The LISTEN gauge back at 1 after a 0 (its reconnect), and the first
			// notification counted after the promotion.
			var down, up, heard int64
			var base int64 = -1
			for _, l := range lis { // "ms instance listening notifications"
				if l[1] != strconv.Itoa(inst) {
					continue
				}
				ms, _ := strconv.ParseInt(l[0], 10, 64)
				n, _ := strconv.ParseInt(l[3], 10, 64)
				if ms <= kill {
					base = n
					continue
				}
				if l[2] == "0" && down == 0 {
					down = ms
				}
				if l[2] == "1" && down > 0 && up == 0 {
					up = ms
				}
				if base >= 0 && n > base && ms > prom && heard == 0 {
					heard = ms
				}
			}
			since := func(t int64) string {
				if t == 0 {
					return "never"
				}
				return fmt.Sprintf("%+.1f s", float64(t-prom)/1000)
			}
			relisten = append(relisten, fmt.Sprintf("instance %d LISTEN lost %s, back %s, first NOTIFY %s", inst, since(down), since(up), since(heard)))
		}
		wb := "never"
		if back > 0 {
			wb = fmt.Sprintf("%.1f s", float64(back-kill)/1000)
		}
		fmt.Printf("round %s (%s killed): promoted %.1f s after the kill; writes back %s after the kill (%d write attempts refused meanwhile)\n",
			f[0], f[2], float64(prom-kill)/1000, wb, refused)
		var sender int64
		for _, l := range lis {
			if ms, _ := strconv.ParseInt(l[0], 10, 64); l[1] == "0" && ms > kill {
				sender = ms
				break
			}
		}
		snd := "never"
		if sender > 0 {
			snd = fmt.Sprintf("%+.1f s", float64(sender-prom)/1000)
		}
		fmt.Printf("round %s relative to the promotion: the drill's NOTIFY sender had a session on the new primary %s; %s\n", f[0], snd, strings.Join(relisten, "; "))
	}
}

func readLines(p string) [][]string {
	b, _ := os.ReadFile(p)
	var out [][]string
	for _, l := range bytes.Split(b, []byte("\n")) {
		if f := strings.Fields(string(l)); len(f) >= 4 {
			out = append(out, f)
		}
	}
	return out
}
