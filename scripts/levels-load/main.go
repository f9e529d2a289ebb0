// Command levels-load is the client side of scripts/levels-drill.sh: a recording
// provider (every send stored under the run key in its payload, never deduplicated, one
// in two answered 500 after it was stored, so the effect becomes unknown and is
// reconciled through the authoritative lookup), and clients that claim fresh runs and
// queue one effect each through whichever airlock instances DIR/urls lists at the moment.
// One run in three queues a gated effect instead (action type "gated", approve_before_act):
// a signed-in approver (-approver, -password: a local account) decides it through the
// approval page of whichever instance is listed, as scripts/failover-load does; one in
// four of those a rejection. It starts when DIR/go exists (with the API key in DIR/key),
// runs until DIR/stop exists, decides what is still open (then writes DIR/decided), keeps
// its provider up until DIR/done exists and every acknowledged effect (and every approved
// one) has reached it, or -settle has passed, and reports: effects
// acknowledged, stored twice, lost; approvals approved and sent once, approved but not
// sent, sent without an approval. Exit 1 when an effect was stored twice or lost, or a
// gated effect went against its decision.
package main

import (
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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/scripts/internal/approver"
)

type load struct {
	dir, key string
	mu       sync.Mutex
	records  map[string]int // run key → sends stored
	byEffect map[string]int // Idempotency-Key (the effect id) → sends stored: the lookup
	acked    map[string]bool
	statuses map[int]int
	sends    atomic.Int64
	lookups  atomic.Int64

	user        string             // the approver's account ("": no gated effects)
	person      *approver.Approver // who signs in as user and decides
	gated       []*gate            // gated effects acknowledged (202), with the decision the approver takes
	lostReplies int                // decisions whose answer was lost and whose retry found the link used
}

type gate struct {
	key, token, decision string
	decided              bool
	unanswered           bool // an attempt got no answer or a 5xx: it may have applied
}

func main() {
	dir := flag.String("dir", "", "the drill's work directory (urls, stop)")
	workers := flag.Int("workers", 4, "clients")
	settle := flag.Duration("settle", 90*time.Second, "how long the outbox may take after the load")
	user := flag.String("approver", "", "approver account name (gated effects need one)")
	password := flag.String("password", "", "approver password")
	flag.Parse()
	l := &load{dir: *dir, user: *user, person: approver.New(*user, *password, nil), records: map[string]int{}, byEffect: map[string]int{}, acked: map[string]bool{}, statuses: map[int]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = http.Serve(ln, http.HandlerFunc(l.provide)) }()
	if err := os.WriteFile(filepath.Join(l.dir, "provider.addr"), []byte(ln.Addr().String()), 0o644); err != nil {
		log.Fatal(err)
	}
	for !exists(filepath.Join(l.dir, "go")) {
		time.Sleep(100 * time.Millisecond)
	}
	k, err := os.ReadFile(filepath.Join(l.dir, "key")) // an API key with the runs scope
	if err != nil {
		log.Fatal(err)
	}
	l.key = strings.TrimSpace(string(k))
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range *workers {
		wg.Add(1)
		go func() { defer wg.Done(); l.worker(ctx, w) }()
	}
	var ap sync.WaitGroup
	ap.Add(1)
	go func() { defer ap.Done(); l.approver(ctx) }()
	for !exists(filepath.Join(l.dir, "stop")) {
		time.Sleep(200 * time.Millisecond)
	}
	stop()
	wg.Wait()
	ap.Wait()
	deadline := time.Now().Add(*settle)
	// Decide what is still open (the load has stopped; approvals go on until all are decided).
	for time.Now().Before(deadline) && l.decideOpen() > 0 {
		time.Sleep(300 * time.Millisecond)
	}
	// The provider (and its lookup) stays up until the script has seen every effect
	// finish in the database (DIR/done), or the deadline: an effect a killed instance had
	// claimed for reconciliation waits for that claim to lapse (5 min) before its lookup.
	_ = os.WriteFile(filepath.Join(l.dir, "decided"), nil, 0o644)
	for time.Now().Before(deadline) && (l.missing() > 0 || !exists(filepath.Join(l.dir, "done"))) {
		time.Sleep(500 * time.Millisecond)
	}
	os.Exit(l.report())
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// provide is the provider: POST stores, GET ?key= looks up (authoritative).
func (l *load) provide(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		l.lookups.Add(1)
		l.mu.Lock()
		n := l.byEffect[r.URL.Query().Get("key")]
		l.mu.Unlock()
		if n > 0 {
			fmt.Fprintf(w, `[{"id":%q}]`, "p-"+r.URL.Query().Get("key"))
			return
		}
		fmt.Fprint(w, `[]`)
		return
	}
	var body struct{ K string }
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &body)
	l.mu.Lock()
	l.records[body.K]++
	l.byEffect[r.Header.Get("Idempotency-Key")]++
	first := l.records[body.K] == 1
	l.mu.Unlock()
	n := l.sends.Add(1)
	time.Sleep(50 * time.Millisecond)
	if first && n%2 == 0 { // stored, but the answer says it failed: unknown, then a lookup
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q}`, "p-"+body.K)
}

func (l *load) urls() []string {
	b, _ := os.ReadFile(filepath.Join(l.dir, "urls"))
	return strings.Fields(string(b))
}

// call sends one request with an Idempotency-Key to the instances in turn, retrying
// refusals of availability (connection errors, 503, 409 request_in_progress: the first
// attempt's instance was killed mid-request) on the next one for up to a minute.
func (l *load) call(path, idem, body string, out any, start int) int {
	deadline := time.Now().Add(time.Minute)
	for i := start; time.Now().Before(deadline); i++ {
		us := l.urls()
		if len(us) == 0 {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		req, _ := http.NewRequest("POST", us[i%len(us)]+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+l.key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", idem)
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		st, inProgress := 0, false
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			st = resp.StatusCode
			if out != nil {
				_ = json.Unmarshal(b, out)
			}
			inProgress = st == http.StatusConflict && strings.Contains(string(b), "request_in_progress")
		}
		l.mu.Lock()
		l.statuses[st]++
		l.mu.Unlock()
		if st != 0 && st != http.StatusServiceUnavailable && !inProgress {
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0
}

func (l *load) worker(ctx context.Context, w int) {
	for i := 1; ctx.Err() == nil; i++ {
		k := fmt.Sprintf("lv-%d-%d", w, i)
		var c struct {
			Claimed bool   `json:"claimed"`
			Owner   string `json:"lease_owner"`
			Version int64  `json:"version"`
		}
		if st := l.call("/v1/runs/claim", "c-"+k, fmt.Sprintf(`{"key":%q,"payload":{"n":%d}}`, k, i), &c, i); st/100 != 2 || !c.Claimed {
			continue
		}
		action := "note"
		if l.user != "" && i%3 == 0 {
			action = "gated"
		}
		var q struct {
			URL string `json:"approve_url"`
		}
		st := l.call("/v1/runs/"+k+"/effects", "q-"+k, fmt.Sprintf(`{"lease_owner":%q,"version":%d,"action_type":%q,"target":"default","effect_id":"e1","payload":{"k":%q}}`,
			c.Owner, c.Version, action, k), &q, i+1)
		switch {
		case action == "note" && (st == 200 || st == 201):
			l.mu.Lock()
			l.acked[k] = true
			l.mu.Unlock()
		case action == "gated" && st == 202:
			_, token, _ := strings.Cut(q.URL, "/approve/")
			dec := "approve"
			if i%4 == 0 {
				dec = "reject"
			}
			l.mu.Lock()
			l.gated = append(l.gated, &gate{key: k, token: token, decision: dec})
			l.mu.Unlock()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (l *load) missing() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for k := range l.acked {
		if l.records[k] == 0 {
			n++
		}
	}
	for _, g := range l.gated {
		if g.decided && g.decision == "approve" && l.records[g.key] == 0 {
			n++
		}
	}
	return n
}

// The approver (scripts/internal/approver, as scripts/failover-load's) decides through
// whichever instances DIR/urls lists at the moment.

// approver decides the open approvals while the load runs.
func (l *load) approver(ctx context.Context) {
	if l.user == "" {
		return
	}
	for ctx.Err() == nil {
		l.decideOpen()
		time.Sleep(300 * time.Millisecond)
	}
}

// decideOpen tries each undecided approval once, signing in again whenever the session
// is gone, retrying a decision that got no answer or a 5xx with the same decision; it
// returns how many are still open.
func (l *load) decideOpen() int {
	l.mu.Lock()
	var open []*gate
	for _, g := range l.gated {
		if !g.decided {
			open = append(open, g)
		}
	}
	l.mu.Unlock()
	left := 0
	for n, g := range open {
		us := l.urls()
		if len(us) == 0 {
			return len(open)
		}
		st, tried := l.person.Decide(us[n%len(us)], g.token, g.decision, "drill")
		switch {
		case !tried: // the sign-in failed: again next round
		case st == 200:
			l.mu.Lock()
			g.decided = true
			l.mu.Unlock()
			continue
		case st == 404 && g.unanswered:
			// A used link answers like an unknown one: an earlier attempt whose answer
			// was lost applied it (the report checks the database's decision).
			l.mu.Lock()
			g.decided = true
			l.lostReplies++
			l.mu.Unlock()
			continue
		case st == 0 || st >= 500:
			g.unanswered = true
		}
		left++
	}
	return left
}

func (l *load) report() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	twice, lost := 0, 0
	for k, n := range l.records {
		if n > 1 {
			twice++
			fmt.Printf("stored %d times: %s\n", n, k)
		}
	}
	for k := range l.acked {
		if l.records[k] == 0 {
			lost++
			fmt.Printf("lost: %s\n", k)
		}
	}
	fmt.Printf("effects acknowledged %d, stored by the provider %d (sends %d, lookups %d), stored twice %d, lost %d, statuses %v\n",
		len(l.acked), len(l.records), l.sends.Load(), l.lookups.Load(), twice, lost, l.statuses)
	approvedSent, approvedUnsent, rejected, undecided, without := 0, 0, 0, 0, 0
	for _, g := range l.gated {
		c := l.records[g.key]
		switch {
		case g.decided && g.decision == "approve" && c == 1:
			approvedSent++
		case g.decided && g.decision == "approve" && c == 0:
			approvedUnsent++
			fmt.Printf("approved but not sent: %s\n", g.key)
		case g.decided && g.decision == "approve": // c > 1: counted as stored twice above
		case c > 0:
			without++
			fmt.Printf("sent without an approval (%s, decided %v): %s\n", g.decision, g.decided, g.key)
		case g.decided:
			rejected++
		default:
			undecided++
		}
	}
	fmt.Printf("gated effects %d (sign-ins %d, decisions whose answer was lost %d): approved and sent once %d, approved but not sent %d, rejected and not sent %d, undecided %d, sent without an approval %d\n",
		len(l.gated), l.person.SignIns(), l.lostReplies, approvedSent, approvedUnsent, rejected, undecided, without)
	if twice > 0 || lost > 0 || approvedUnsent > 0 || without > 0 || undecided > 0 {
		return 1
	}
	return 0
}
