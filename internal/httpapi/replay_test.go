package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// send makes one request with an Idempotency-Key (none when idem is "") to base.
func (h *harness) send(base, method, path, apiKey, idem, body string) (response, error) {
	h.t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := response{status: resp.StatusCode, raw: string(raw), header: resp.Header}
	_ = json.Unmarshal(raw, &r.body)
	return r, nil
}

// lossyServer serves the API and loses every reply: the request runs to the end (its
// transaction commits), then the connection is closed with nothing sent, as when a
// network or a proxy drops the answer. served holds what would have been sent.
func lossyServer(t *testing.T, d httpapi.Deps) (url string, served func() (int, string)) {
	api := httpapi.New(d).Handler()
	var mu sync.Mutex
	var status int
	var body string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, r)
		mu.Lock()
		status, body = rec.Code, rec.Body.String()
		mu.Unlock()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.Close()
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() (int, string) { mu.Lock(); defer mu.Unlock(); return status, body }
}

// ackLost is the store of a database that commits and then loses the connection before
// the commit's reply arrives (PostgreSQL restarted with -m immediate): the request's
// writes are durable, and the API sees an error.
type ackLost struct {
	store.Store
	lose atomic.Bool
}

func (a *ackLost) Within(ctx context.Context, fn func(ctx context.Context) error) error {
	err := a.Store.Within(ctx, fn)
	if err == nil && a.lose.Load() {
		return store.Unavailable(errors.New("unexpected EOF: the connection closed before the commit was acknowledged"))
	}
	return err
}

func sameReply(t *testing.T, what string, got response, status int, body string) {
	t.Helper()
	if got.status != status || got.raw != body {
		t.Fatalf("%s: replayed %d %s; the original was %d %s", what, got.status, got.raw, status, body)
	}
	if got.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("%s: no Idempotent-Replayed header", what)
	}
}

// A reply lost after commit. Over real HTTP, the connection is closed
// after the request committed; the retry with the same Idempotency-Key gets the original
// status and body, and nothing runs twice.
func TestIdempotencyReplaysAReplyLostAfterCommit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		lossy, served := lossyServer(t, h.deps)
		lost := func(method, path, idem, body string) (int, string) {
			t.Helper()
			if r, err := h.send(lossy, method, path, h.runsKey, idem, body); err == nil {
				t.Fatalf("the reply was not lost: %d %s", r.status, r.raw)
			}
			return served()
		}
		retry := func(method, path, idem, body string) response {
			t.Helper()
			r, err := h.send(h.url, method, path, h.runsKey, idem, body)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}

		// Without a key, the retry of a claim whose reply was lost is refused (the issue).
		claim := `{"key":"lost-0","payload":{"n":1}}`
		if status, _ := lost("POST", "/v1/runs/claim", "", claim); status != 201 {
			t.Fatalf("claim: %d", status)
		}
		if r := retry("POST", "/v1/runs/claim", "", claim); r.status != 200 || r.body["claimed"] != false {
			t.Fatalf("retry without a key: %d %s", r.status, r.raw)
		}

		// With a key: claim, transition, effect, ledger — each replayed as first answered.
		claim = `{"key":"lost-1","payload":{"n":1}}`
		status, body := lost("POST", "/v1/runs/claim", "claim-lost-1", claim)
		if status != 201 {
			t.Fatalf("claim: %d %s", status, body)
		}
		r := retry("POST", "/v1/runs/claim", "claim-lost-1", claim)
		sameReply(t, "claim", r, status, body)
		owner := r.body["lease_owner"].(string)

		queue := fmt.Sprintf(`{"lease_owner":%q,"version":1,"action_type":"note","target":"default","payload":{"text":"hi"}}`, owner)
		status, body = lost("POST", "/v1/runs/lost-1/effects", "queue-1", queue)
		if status != 201 {
			t.Fatalf("queue: %d %s", status, body)
		}
		sameReply(t, "queue effect", retry("POST", "/v1/runs/lost-1/effects", "queue-1", queue), status, body)

		transition := fmt.Sprintf(`{"lease_owner":%q,"version":1,"to":"failed_terminal","result":{"why":"no"}}`, owner)
		status, body = lost("POST", "/v1/runs/lost-1/transition", "transition-1", transition)
		if status != 200 {
			t.Fatalf("transition: %d %s", status, body)
		}
		sameReply(t, "transition", retry("POST", "/v1/runs/lost-1/transition", "transition-1", transition), status, body)
		// A refusal is an outcome too: replayed, not run again.
		status, body = lost("POST", "/v1/runs/lost-1/transition", "transition-2", transition)
		if status != 409 {
			t.Fatalf("second transition: %d %s", status, body)
		}
		sameReply(t, "refused transition", retry("POST", "/v1/runs/lost-1/transition", "transition-2", transition), status, body)

		// Nothing ran twice.
		evs := h.get("/v1/runs/lost-1/events")
		var kinds []string
		for _, e := range evs.body["events"].([]any) {
			kinds = append(kinds, e.(map[string]any)["kind"].(string))
		}
		if got := strings.Join(kinds, ","); strings.Count(got, "claimed") != 1 || strings.Count(got, "transition") != 1 || strings.Contains(got, "duplicate") {
			t.Fatalf("events: %s", got)
		}
		if run := h.get("/v1/runs/lost-1"); len(run.body["effects"].([]any)) != 1 {
			t.Fatalf("effects: %s", run.raw)
		}
	})
}

// The case that showed the need: PostgreSQL restarted between commit and its
// acknowledgement, so the first answer is a 503 (it used to be a 500). The retry gets
// the committed outcome, not claimed:false or version_conflict.
func TestIdempotencyAfterCommitAcknowledgementLost(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		st := &ackLost{Store: h.env.Store}
		base := h.another(func(d *httpapi.Deps) { d.Store = st })
		do := func(idem, path, body string) response {
			t.Helper()
			r, err := h.send(base, "POST", path, h.runsKey, idem, body)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		claim := `{"key":"ack-1","payload":{"n":1}}`
		st.lose.Store(true)
		expect(t, do("c-1", "/v1/runs/claim", claim), 503, "store_unavailable")
		st.lose.Store(false)
		r := do("c-1", "/v1/runs/claim", claim)
		expect(t, r, 201, "")
		if r.body["claimed"] != true || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("claim retry: %s", r.raw)
		}
		owner := r.body["lease_owner"].(string)
		transition := fmt.Sprintf(`{"lease_owner":%q,"version":1,"to":"completed","result":{"id":"T-1"}}`, owner)
		st.lose.Store(true)
		expect(t, do("t-1", "/v1/runs/ack-1/transition", transition), 503, "store_unavailable")
		st.lose.Store(false)
		r = do("t-1", "/v1/runs/ack-1/transition", transition)
		expect(t, r, 200, "")
		if r.body["state"] != "completed" || r.body["version"] != 2.0 {
			t.Fatalf("transition retry: %s", r.raw)
		}
	})
}

// blocking holds a request inside its transaction, holding its key's lock, until
// released.
type blocking struct {
	store.Store
	entered chan struct{}
	release chan struct{}
}

func (b *blocking) ReplayGet(ctx context.Context, sc store.ReplayScope, now *time.Time) (store.Replay, error) {
	r, err := b.Store.ReplayGet(ctx, sc, now)
	b.entered <- struct{}{}
	<-b.release
	return r, err
}

func TestIdempotencyKeyRules(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		send := func(base, apiKey, idem, path, body string) response {
			t.Helper()
			r, err := h.send(base, "POST", path, apiKey, idem, body)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		claim := `{"key":"rule-1","payload":{"n":1}}`
		first := send(h.url, h.runsKey, "k-1", "/v1/runs/claim", claim)
		expect(t, first, 201, "")
		if first.header.Get("Idempotent-Replayed") != "" {
			t.Fatal("a first answer says it is replayed")
		}
		// Another body, or another route, with the same key: refused.
		expect(t, send(h.url, h.runsKey, "k-1", "/v1/runs/claim", `{"key":"rule-2","payload":{"n":1}}`), 422, "idempotency_key_reused")
		// The same key under another API key is another request.
		other := send(h.url, h.adminKy, "k-1", "/v1/runs/claim", `{"key":"rule-3","payload":{"n":1}}`)
		expect(t, other, 201, "")
		// Malformed keys.
		for _, bad := range []string{strings.Repeat("x", 256), "has space", "tab\tkey", "é"} {
			expect(t, send(h.url, h.runsKey, bad, "/v1/runs/claim", claim), 400, "invalid_idempotency_key")
		}
		// A duplicate while the first is in flight: 409 request_in_progress from the same
		// instance, and from another one on PostgreSQL (the key's lock); on SQLite another
		// instance waits for the write lock and gets the answer.
		bl := &blocking{Store: h.env.Store, entered: make(chan struct{}, 1), release: make(chan struct{})}
		base := h.another(func(d *httpapi.Deps) { d.Store = bl })
		claim = `{"key":"rule-4","payload":{"n":1}}`
		done := make(chan response, 2)
		go func() {
			r, err := h.send(base, "POST", "/v1/runs/claim", h.runsKey, "k-4", claim)
			if err != nil {
				t.Error(err)
			}
			done <- r
		}()
		<-bl.entered
		busy := send(base, h.runsKey, "k-4", "/v1/runs/claim", claim)
		expect(t, busy, 409, "request_in_progress")
		if busy.header.Get("Retry-After") == "" {
			t.Fatal("request_in_progress without Retry-After")
		}
		waited := make(chan response, 1)
		if h.env.Store.Backend() == "postgres" {
			expect(t, send(h.url, h.runsKey, "k-4", "/v1/runs/claim", claim), 409, "request_in_progress")
		} else {
			go func() {
				r, err := h.send(h.url, "POST", "/v1/runs/claim", h.runsKey, "k-4", claim)
				if err != nil {
					t.Error(err)
				}
				waited <- r
			}()
			time.Sleep(100 * time.Millisecond)
		}
		close(bl.release)
		orig := <-done
		expect(t, orig, 201, "")
		if h.env.Store.Backend() != "postgres" {
			sameReply(t, "waited for the first", <-waited, orig.status, orig.raw)
		}
		sameReply(t, "after the first finished", send(h.url, h.runsKey, "k-4", "/v1/runs/claim", claim), orig.status, orig.raw)
		if run := h.get("/v1/runs/rule-4"); run.body["duplicates"] != 0.0 || run.body["version"] != 1.0 {
			t.Fatalf("ran twice: %s", run.raw)
		}

		// An approval link in an answer is replayed but not stored readable: the record is
		// sealed with a key derived from the raw API key.
		owner, v := h.claim("rule-5")
		effect := fmt.Sprintf(`{"lease_owner":%q,"version":%d,"action_type":"email","target":"default","payload":{"to":"ana@example.com","text":"Refund"}}`, owner, v)
		gated := send(h.url, h.runsKey, "k-5", "/v1/runs/rule-5/effects", effect)
		expect(t, gated, 202, "")
		sameReply(t, "gated effect", send(h.url, h.runsKey, "k-5", "/v1/runs/rule-5/effects", effect), gated.status, gated.raw)
		token := strings.TrimPrefix(gated.body["approve_url"].(string), h.url+"/approve/")
		dump := storetest.DumpAll(t, h.env.Store)
		if !strings.Contains(dump, "k-5") {
			t.Fatal("no replay record")
		}
		if strings.Contains(dump, token) {
			t.Fatal("the approval token is readable in the database")
		}
		for _, l := range strings.Split(dump, "\n") {
			if strings.Contains(l, "k-") && (strings.Contains(l, "lease_owner") || strings.Contains(l, "approve")) {
				t.Fatalf("a replay record holds an answer in clear: %s", l)
			}
		}
	})
}
