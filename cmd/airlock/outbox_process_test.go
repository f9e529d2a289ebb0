package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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

	"github.com/airlockhq/airlock/internal/apptest"
)

// The outbox against real `airlock serve` processes: crashes at each point of a send, and
// two dispatcher processes sharing one database.

// serveProc is a running `airlock serve` whose process the test controls (serveProcess in
// main_test.go hides it): crash tests need its pid and its exit status.
type serveProc struct {
	URL  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited; err is set then
	err  error
	mu   sync.Mutex
	logs bytes.Buffer
}

// startServe starts `airlock serve` on a free port. A process still running when the test
// ends gets SIGTERM and must exit cleanly; one that crashed is left as it is.
func startServe(t *testing.T, env []string) *serveProc {
	t.Helper()
	return startServeBinary(t, binary, env)
}

// startServeBinary is startServe with another build of airlock.
func startServeBinary(t *testing.T, bin string, env []string) *serveProc {
	t.Helper()
	s := &serveProc{cmd: exec.Command(bin, "serve"), done: make(chan struct{})}
	s.cmd.Env = slices.Concat(os.Environ(), env, []string{"AIRLOCK_LISTEN=127.0.0.1:0", "AIRLOCK_LOG_LEVEL=info"})
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			// Log the line before announcing the address: a test may read Logs() for the
			// readiness line as soon as startServe returns.
			s.mu.Lock()
			s.logs.Write(append(sc.Bytes(), '\n'))
			s.mu.Unlock()
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "airlock serving" {
				addr <- line.Addr
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		s.err = s.cmd.Wait() // after the last read of the pipe, as Wait requires
		close(s.done)
	}()
	t.Cleanup(func() {
		select {
		case <-s.done:
			return
		default:
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
			if s.err != nil {
				t.Errorf("airlock serve exited with %v after SIGTERM:\n%s", s.err, s.Logs())
			}
		case <-time.After(20 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
			t.Error("airlock serve did not stop on SIGTERM")
		}
	})
	select {
	case a := <-addr:
		s.URL = "http://" + a
		return s
	case <-s.done:
		t.Fatalf("airlock serve exited before serving (%v):\n%s", s.err, s.Logs())
	case <-time.After(60 * time.Second):
		t.Fatalf("airlock serve did not start:\n%s", s.Logs())
	}
	return nil
}

// Errors returns the error-level lines of the process's log.
func (s *serveProc) Errors() string {
	var out []string
	for _, l := range strings.Split(s.Logs(), "\n") {
		if strings.Contains(l, `"level":"ERROR"`) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func (s *serveProc) Logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs.String()
}

// waitExit waits for the process to end by itself and returns its exit error.
func (s *serveProc) waitExit(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case <-s.done:
		return s.err
	case <-time.After(within):
		t.Fatalf("airlock serve still running after %s:\n%s", within, s.Logs())
		return nil
	}
}

// setupDB migrates the database env points at and returns an API key with scope runs.
func setupDB(t *testing.T, env []string) string {
	t.Helper()
	if _, stderr, err := airlock(t, env, "migrate"); err != nil {
		t.Fatalf("migrate: %v\n%s", err, stderr)
	}
	key, stderr, err := airlock(t, env, "apikey", "create", "--name", "outbox", "--scope", "runs")
	if err != nil {
		t.Fatalf("apikey create: %v\n%s", err, stderr)
	}
	return strings.TrimSpace(key)
}

// writePolicy writes a policy file with the one action type `note` and returns the env
// entry that points airlock at it.
func writePolicy(t *testing.T, httpSection string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	// A send may not outlive its lease: the connector's timeout stays under dispatch.lease.
	httpSection = strings.Replace(httpSection, "{", "{timeout: 1500ms, ", 1)
	doc := "actions:\n  note:\n    connector: http\n    gate: none\n    http: " + httpSection + "\n" +
		"    retry: {backoff: 100ms, max_backoff: 100ms}\n" +
		"dispatch: {interval: 50ms, lease: 2s, reconcile_interval: 200ms}\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return "AIRLOCK_CONFIG=" + path
}

// apiOnly returns env with its policy file copied, dispatching disabled.
func apiOnly(t *testing.T, env []string) []string {
	t.Helper()
	out := slices.Clone(env)
	for i, kv := range out {
		if path, ok := strings.CutPrefix(kv, "AIRLOCK_CONFIG="); ok {
			doc, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			p2 := filepath.Join(t.TempDir(), "api-only.yaml")
			doc = bytes.Replace(doc, []byte("dispatch: {"), []byte("dispatch: {disabled: true, "), 1)
			if err := os.WriteFile(p2, doc, 0o600); err != nil {
				t.Fatal(err)
			}
			out[i] = "AIRLOCK_CONFIG=" + p2
		}
	}
	return out
}

func apiJSON(method, url, apiKey, body string, out any) (int, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s: %w: %s", url, err, b)
		}
	}
	return resp.StatusCode, nil
}

type effectJSON struct {
	EffectID       string `json:"effect_id"`
	State          string `json:"state"`
	ProviderID     string `json:"provider_id"`
	Attempts       int    `json:"attempts"`
	LastErrorClass string `json:"last_error_class"`
}

// queueNote claims key and queues one `note` effect on it; it returns the provider's
// idempotency key for the effect ("<run key>/<effect id>").
func queueNote(claimAt, queueAt, apiKey, key string) (string, error) {
	c, err := postClaim(claimAt, apiKey, key)
	if err != nil {
		return "", err
	}
	if !c.Claimed {
		return "", fmt.Errorf("claim %s: not claimed", key)
	}
	var q struct {
		Created bool       `json:"created"`
		Effect  effectJSON `json:"effect"`
	}
	body := `{"lease_owner":"` + c.Owner + `","version":1,"action_type":"note","target":"default","payload":{"text":"note for ` + key + `"}}`
	if _, err := apiJSON("POST", queueAt+"/v1/runs/"+key+"/effects", apiKey, body, &q); err != nil {
		return "", err
	}
	if !q.Created || q.Effect.State != "pending" {
		return "", fmt.Errorf("queue on %s: created=%v state=%s", key, q.Created, q.Effect.State)
	}
	return key + "/" + q.Effect.EffectID, nil
}

// runEffect reads the run's only effect through GET /v1/runs/{key}.
func runEffect(base, apiKey, key string) (effectJSON, error) {
	var run struct{ Effects []effectJSON }
	if _, err := apiJSON("GET", base+"/v1/runs/"+key, apiKey, "", &run); err != nil {
		return effectJSON{}, err
	}
	if len(run.Effects) != 1 {
		return effectJSON{}, fmt.Errorf("run %s has %d effects, want 1", key, len(run.Effects))
	}
	return run.Effects[0], nil
}

func eventKinds(t *testing.T, base, apiKey, key string) []string {
	t.Helper()
	var out struct{ Events []struct{ Kind string } }
	if _, err := apiJSON("GET", base+"/v1/runs/"+key+"/events?limit=1000", apiKey, "", &out); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range out.Events {
		kinds = append(kinds, e.Kind)
	}
	return kinds
}

// crashProvider is the provider behind `note`: apptest.Provider counts the requests per
// Idempotency-Key; crashProvider keeps the artifacts they create (one per request, or one
// per key when it is idempotent), serves lookups of them, and can SIGKILL airlock after
// accepting the first request and before answering it.
type crashProvider struct {
	*apptest.Provider
	Lookup     *httptest.Server // GET ?key=<idempotency key> → [{"id": …}]
	idempotent bool
	killPID    atomic.Int64
	lookups    atomic.Int64
	mu         sync.Mutex
	artifacts  map[string][]string
	seq        int
}

func newCrashProvider(t *testing.T, idempotent bool) *crashProvider {
	p := &crashProvider{Provider: apptest.NewProvider(t), idempotent: idempotent, artifacts: map[string][]string{}}
	p.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		var id string
		if have := p.artifacts[key]; p.idempotent && len(have) > 0 {
			id = have[0] // the same key again: the same artifact, not a second one
		} else {
			p.seq++
			id = fmt.Sprintf("art-%d", p.seq)
			p.artifacts[key] = append(have, id)
		}
		p.mu.Unlock()
		if pid := p.killPID.Swap(0); pid > 0 {
			// Accepted and recorded; airlock dies before the response reaches it. (With the
			// body read, net/http notices the closed connection and ends r.Context().)
			_, _ = io.Copy(io.Discard, r.Body)
			_ = syscall.Kill(int(pid), syscall.SIGKILL)
			select {
			case <-r.Context().Done(): // the dead process's connection closed
			case <-time.After(15 * time.Second):
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, id)
	}
	p.Lookup = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.lookups.Add(1)
		recs := []map[string]string{}
		for _, id := range p.Artifacts(r.URL.Query().Get("key")) {
			recs = append(recs, map[string]string{"id": id})
		}
		_ = json.NewEncoder(w).Encode(recs)
	}))
	t.Cleanup(p.Lookup.Close)
	return p
}

func (p *crashProvider) Artifacts(key string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.artifacts[key])
}

// crashWant is where an effect ends after a crash and a restart.
type crashWant struct {
	atCrash   int // send requests the provider had received when airlock died
	state     string
	requests  int    // send requests under the effect's key, the crashed one included
	artifacts int    // what the provider holds for the key
	event     string // an event on the run that shows which path got it there
}

// TestOutboxCrashPoints kills `airlock serve` at each point of a send, restarts it, and
// checks where the effect ends and what the provider holds: the crash test airlock
// must pass ("stop just before the external write, just after it, and just before its
// receipt is saved; resumed from each, exactly one artifact remains"). Exactly one
// artifact remains in every case; where airlock cannot know whether a plain provider
// acted and has no lookup, the effect stays unknown for a person to resolve, and is
// never resent.
func TestOutboxCrashPoints(t *testing.T) {
	points := []struct{ name, crashAt string }{
		{"after_lease", "after_lease"}, // (1) leased, the provider not called yet
		{"response_lost", ""},          // (2) the provider accepted; its response never arrived
		{"after_send", "after_send"},   // (3) airlock has the response, not yet committed
	}
	kinds := []struct{ name, http string }{
		{"plain", "{url: %[1]s/notes}"},
		{"idempotent", "{url: %[1]s/notes, idempotent: true}"},
		{"lookup", `{url: %[1]s/notes, lookup_url: "%[2]s/notes?key={effect_id}"}`},
	}
	want := func(point, kind string) crashWant {
		switch {
		case point == "after_lease" && kind == "idempotent": // the lease began the send: resent with the same key, sent once
			return crashWant{0, "completed", 1, 1, "effect_retry_scheduled"}
		case point == "after_lease": // the send never began (no send_started_at): queued again, sent once
			return crashWant{0, "completed", 1, 1, "effect_requeued"}
		case kind == "idempotent": // resent with the same key; the provider answers with its artifact
			return crashWant{1, "completed", 2, 1, "effect_retry_scheduled"}
		case kind == "lookup": // the lookup finds the one artifact
			return crashWant{1, "completed", 1, 1, "effect_reconciled"}
		default: // may have happened, provider not idempotent: unknown, never resent
			return crashWant{1, "unknown", 1, 1, "effect_unknown"}
		}
	}
	for _, point := range points {
		for _, kind := range kinds {
			t.Run(point.name+"/"+kind.name, func(t *testing.T) {
				t.Parallel()
				for backend, env := range databases(t) {
					t.Run(backend, func(t *testing.T) {
						t.Parallel()
						crashScenario(t, env, point.crashAt, kind.name, kind.http, want(point.name, kind.name))
					})
				}
			})
		}
	}
}

func crashScenario(t *testing.T, env []string, crashAt, kind, httpSection string, want crashWant) {
	prov := newCrashProvider(t, kind == "idempotent")
	env = append(slices.Clone(env), writePolicy(t, fmt.Sprintf(httpSection, prov.URL, prov.Lookup.URL)))
	apiKey := setupDB(t, env)

	first := env
	if crashAt != "" {
		first = append(slices.Clone(env), "AIRLOCK_TEST_CRASH_AT="+crashAt)
	}
	s1 := startServe(t, first)
	if crashAt == "" {
		prov.killPID.Store(int64(s1.cmd.Process.Pid))
	}
	// The effect is queued through an instance that does not dispatch: queueing wakes
	// s1's dispatcher at once, and s1 may die before it could answer the request.
	api := startServe(t, apiOnly(t, env))
	const key = "crash-1"
	pkey, err := queueNote(api.URL, api.URL, apiKey, key)
	if err != nil {
		t.Fatalf("%v\n%s", err, s1.Errors())
	}
	if err := s1.waitExit(t, 15*time.Second); err == nil || err.Error() != "signal: killed" {
		t.Fatalf("airlock serve exited with %v, want signal: killed:\n%s", err, s1.Logs())
	}
	if crashed := prov.Requests(pkey); crashed != want.atCrash {
		t.Fatalf("airlock died after %d requests, want %d", crashed, want.atCrash)
	}

	s2 := startServe(t, env) // no crash point: it sweeps the dead sender's lease
	var got effectJSON
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err = runEffect(s2.URL, apiKey, key)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == want.state || slices.Contains([]string{"completed", "failed", "cancelled"}, got.State) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("effect is %s (%+v) after 15s, want %s; events %v", got.State, got, want.state, eventKinds(t, s2.URL, apiKey, key))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got.State == "unknown" {
		// Unknown must stay unknown: ~10 dispatch rounds and 2 reconciliations later, no
		// second request has gone out.
		time.Sleep(500 * time.Millisecond)
		if got, err = runEffect(s2.URL, apiKey, key); err != nil {
			t.Fatal(err)
		}
	}
	arts := prov.Artifacts(pkey)
	// Event pages show only what no older transaction still in flight (on this shared test
	// server: any test's) could precede: the last events may take a moment to appear.
	events := eventKinds(t, s2.URL, apiKey, key)
	for deadline := time.Now().Add(10 * time.Second); !slices.Contains(events, want.event) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		events = eventKinds(t, s2.URL, apiKey, key)
	}
	t.Logf("requests %d; artifacts %v; effect %+v; events %v", prov.Requests(pkey), arts, got, events)
	if got.State != want.state {
		t.Errorf("effect %s, want %s", got.State, want.state)
	}
	if n := prov.Requests(pkey); n != want.requests {
		t.Errorf("provider got %d requests under %s, want %d", n, pkey, want.requests)
	}
	if prov.Total() != want.requests {
		t.Errorf("provider got %d requests in all, want %d", prov.Total(), want.requests)
	}
	if len(arts) > 1 || len(arts) != want.artifacts {
		t.Errorf("provider holds %d artifacts for %s, want %d (never more than one)", len(arts), pkey, want.artifacts)
	}
	if want.state == "completed" && (len(arts) == 0 || got.ProviderID != arts[0]) {
		t.Errorf("provider_id %q, want the artifact's id %v", got.ProviderID, arts)
	}
	if !slices.Contains(events, want.event) {
		t.Errorf("events %v lack %s", events, want.event)
	}
	if want.event == "effect_reconciled" && prov.lookups.Load() == 0 {
		t.Error("the lookup was never asked")
	}
}

// TestTwoDispatcherProcesses queues 1,000 effects through two `airlock serve` processes
// on one database and checks that each is sent exactly once, by either process.
func TestTwoDispatcherProcesses(t *testing.T) {
	const runs, workers = 1000, 16
	for backend, env := range databases(t) {
		t.Run(backend, func(t *testing.T) {
			prov := apptest.NewProvider(t) // plain: counts requests per Idempotency-Key
			env := append(slices.Clone(env), writePolicy(t, fmt.Sprintf("{url: %s/notes}", prov.URL)))
			apiKey := setupDB(t, env)
			servers := []*serveProc{startServe(t, env), startServe(t, env)}

			start := time.Now()
			pkeys := make([]string, runs)
			var next atomic.Int64
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1) - 1)
						if i >= runs || t.Failed() {
							return
						}
						// Claimed on one process, queued through the other.
						k, err := queueNote(servers[i%2].URL, servers[(i+1)%2].URL, apiKey, fmt.Sprintf("run-%d", i))
						if err != nil {
							t.Error(err)
							return
						}
						pkeys[i] = k
					}
				}()
			}
			wg.Wait()
			if t.Failed() {
				t.Fatalf("server errors:\n%s\n%s", servers[0].Errors(), servers[1].Errors())
			}
			queued := time.Since(start)

			// Every effect completed, read through both processes.
			deadline := time.Now().Add(60 * time.Second)
			next.Store(0)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1) - 1)
						if i >= runs || t.Failed() {
							return
						}
						key := fmt.Sprintf("run-%d", i)
						for {
							e, err := runEffect(servers[w%2].URL, apiKey, key)
							if err != nil {
								t.Error(err)
								return
							}
							if e.State == "completed" {
								if e.ProviderID != "p-"+pkeys[i] {
									t.Errorf("%s: provider_id %q, want %q", key, e.ProviderID, "p-"+pkeys[i])
								}
								break
							}
							if e.State != "pending" && e.State != "sending" || time.Now().After(deadline) {
								t.Errorf("%s: effect %+v, want completed", key, e)
								return
							}
							time.Sleep(50 * time.Millisecond)
						}
					}
				}()
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			for i, k := range pkeys {
				if n := prov.Requests(k); n != 1 {
					t.Errorf("run-%d: provider got %d requests under %s, want exactly 1", i, n, k)
				}
			}
			if n := prov.Total(); n != runs {
				t.Errorf("provider got %d requests in all, want %d", n, runs)
			}
			var sent []int
			for _, s := range servers {
				sent = append(sent, sentCount(t, s.URL))
			}
			t.Logf("%d effects queued in %s, all completed after %s; sent by process: %v",
				runs, queued.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), sent)
			if sent[0]+sent[1] != runs {
				t.Errorf("the processes report %v sends, %d in all; want %d", sent, sent[0]+sent[1], runs)
			}
			if backend == "postgres" && (sent[0] == 0 || sent[1] == 0) {
				t.Errorf("sends by process %v: both dispatchers should have sent some", sent)
			}
		})
	}
}

// sentCount reads airlock_dispatch_seconds_count{outcome="sent"} from a process's /metrics.
func sentCount(t *testing.T, base string) int {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `airlock_dispatch_seconds_count{outcome="sent"} `); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", sc.Text(), err)
			}
			return int(n)
		}
	}
	return 0 // no send observed: the series does not exist yet
}
