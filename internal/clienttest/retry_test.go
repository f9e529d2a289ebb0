package clienttest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/airlocktest"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// dropFirst is a proxy in front of airlock that loses the first reply to each mutating
// route after airlock committed it, and records the Idempotency-Key of every request.
type dropFirst struct {
	proxy *httputil.ReverseProxy
	mu    sync.Mutex
	seen  map[string][]string // path -> Idempotency-Key of each request
}

func (d *dropFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	d.seen[r.URL.Path] = append(d.seen[r.URL.Path], r.Header.Get("Idempotency-Key"))
	first := len(d.seen[r.URL.Path]) == 1 && r.Method != http.MethodGet
	d.mu.Unlock()
	if !first {
		d.proxy.ServeHTTP(w, r)
		return
	}
	d.proxy.ServeHTTP(httptest.NewRecorder(), r) // airlock answers; the answer is lost
	conn, _, _ := w.(http.Hijacker).Hijack()
	conn.Close()
}

// The client sends an Idempotency-Key on mutating calls and the same
// one on its retries, so a reply lost after commit costs nothing: the claim still holds
// the lease, the transition still completes the run.
func TestRetriesReuseTheIdempotencyKey(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			srv := start(t, b, airlocktest.AgentPolicy)
			up, _ := url.Parse(srv.URL)
			d := &dropFirst{proxy: httputil.NewSingleHostReverseProxy(up), seen: map[string][]string{}}
			front := httptest.NewServer(d)
			t.Cleanup(front.Close)
			c := client.New(front.URL, srv.APIKey)
			ctx := context.Background()

			cl, err := c.Claim(ctx, client.ClaimRequest{Key: "r-1", Payload: map[string]int{"n": 1}, LeaseSeconds: 60})
			if err != nil || !cl.Claimed || cl.LeaseOwner == "" {
				t.Fatalf("claim after a lost reply: %+v %v", cl, err)
			}
			tr, err := c.Transition(ctx, "r-1", client.TransitionRequest{LeaseOwner: cl.LeaseOwner, Version: cl.Version, To: client.StateCompleted, Result: map[string]string{"id": "x"}})
			if err != nil || tr.State != client.StateCompleted {
				t.Fatalf("transition after a lost reply: %+v %v", tr, err)
			}
			run, err := c.Run(ctx, "r-1")
			if err != nil || run.Duplicates != 0 || run.Version != 2 {
				t.Fatalf("run: %+v %v", run, err)
			}
			d.mu.Lock()
			for _, p := range []string{"/v1/runs/claim", "/v1/runs/r-1/transition"} {
				keys := d.seen[p]
				if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
					t.Errorf("%s: Idempotency-Keys %q; want one key sent twice", p, keys)
				}
			}
			if keys := d.seen["/v1/runs/r-1"]; len(keys) != 1 || keys[0] != "" {
				t.Errorf("GET sent Idempotency-Key %q", keys)
			}
			if d.seen["/v1/runs/claim"][0] == d.seen["/v1/runs/r-1/transition"][0] {
				t.Error("two calls shared a key")
			}
			d.mu.Unlock()

			// A caller's own key is sent as given.
			ctx = client.WithIdempotencyKey(ctx, "step-r-2-claim")
			if _, err := c.Claim(ctx, client.ClaimRequest{Key: "r-2", Payload: 1, LeaseSeconds: 60}); err != nil {
				t.Fatal(err)
			}
			again, err := c.Claim(ctx, client.ClaimRequest{Key: "r-2", Payload: 1, LeaseSeconds: 60})
			if err != nil || !again.Claimed {
				t.Fatalf("the same step again: %+v %v (want the first answer)", again, err)
			}
		})
	}
}

// An outage of airlock's database is 503 store_unavailable with
// Retry-After. The client waits that long and sends the same request again, with the same
// Idempotency-Key, so a request that did commit before the outage is not run twice.
func TestRetriesWaitRetryAfterOfAnOutage(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	var at []time.Time
	var outage atomic.Bool // the next request is answered 503
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys, at = append(keys, r.Header.Get("Idempotency-Key")), append(at, time.Now())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if outage.Swap(false) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"store_unavailable","message":"airlock cannot use its database just now"}`))
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"claimed":true,"state":"processing","version":1,"lease_owner":"o-1"}`))
	}))
	t.Cleanup(srv.Close)
	outage.Store(true)
	cl, err := client.New(srv.URL, "k").Claim(context.Background(), client.ClaimRequest{Key: "r-1", Payload: 1})
	if err != nil || !cl.Claimed {
		t.Fatalf("claim through an outage: %+v %v", cl, err)
	}
	mu.Lock()
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Fatalf("Idempotency-Keys %q; want one key sent twice", keys)
	}
	if wait := at[1].Sub(at[0]); wait < 900*time.Millisecond {
		t.Fatalf("retried after %s; Retry-After said 1 s", wait)
	}
	mu.Unlock()
	// Without retries, the outage is the answer, by its code.
	c := client.New(srv.URL, "k")
	c.Retries = 0
	outage.Store(true)
	if _, err := c.Claim(context.Background(), client.ClaimRequest{Key: "r-2", Payload: 1}); !client.IsCode(err, "store_unavailable") {
		t.Fatalf("no retries: %v; want store_unavailable", err)
	}
}
