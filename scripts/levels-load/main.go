// Command levels-load is the client side of scripts/levels-drill.sh: a recording
// provider (every send stored under the run key in its payload, never deduplicated, one
// in two answered 500 after it was stored, so the effect becomes unknown and is
// reconciled through the authoritative lookup), and clients that claim fresh runs and
// queue one effect each through whichever airlock instances DIR/urls lists at the moment.
// It starts when DIR/go exists (with the API key in DIR/key), runs until DIR/stop exists, waits for every acknowledged effect to reach the
// provider, and reports: effects acknowledged, stored twice, lost. Exit 1 when an effect
// was stored twice or lost.
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
}

func main() {
	dir := flag.String("dir", "", "the drill's work directory (urls, stop)")
	workers := flag.Int("workers", 4, "clients")
	settle := flag.Duration("settle", 90*time.Second, "how long the outbox may take after the load")
	flag.Parse()
	l := &load{dir: *dir, records: map[string]int{}, byEffect: map[string]int{}, acked: map[string]bool{}, statuses: map[int]int{}}
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
	for !exists(filepath.Join(l.dir, "stop")) {
		time.Sleep(200 * time.Millisecond)
	}
	stop()
	wg.Wait()
	deadline := time.Now().Add(*settle)
	for time.Now().Before(deadline) && l.missing() > 0 {
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
// refusals of availability (connection errors, 503) on the next one for up to a minute.
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
		st := 0
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			st = resp.StatusCode
			if out != nil {
				_ = json.Unmarshal(b, out)
			}
		}
		l.mu.Lock()
		l.statuses[st]++
		l.mu.Unlock()
		if st != 0 && st != http.StatusServiceUnavailable {
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
		st := l.call("/v1/runs/"+k+"/effects", "q-"+k, fmt.Sprintf(`{"lease_owner":%q,"version":%d,"action_type":"note","target":"default","effect_id":"e1","payload":{"k":%q}}`,
			c.Owner, c.Version, k), nil, i+1)
		if st == 200 || st == 201 {
			l.mu.Lock()
			l.acked[k] = true
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
	return n
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
	if twice > 0 || lost > 0 {
		return 1
	}
	return 0
}
