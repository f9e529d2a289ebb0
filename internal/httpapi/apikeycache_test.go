package httpapi_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// instance serves the API over st as one `airlock serve` does, with an API-key cache of
// ttl on clock, and returns its URL.
func instance(t *testing.T, st store.Store, clock *storetest.Clock, ttl time.Duration) string {
	t.Helper()
	pol, err := policy.Parse([]byte("actions: {}\n"), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(nil)
	t.Cleanup(srv.Close)
	a, err := app.New(app.Options{Store: st, Policy: pol, Runs: apptest.LeaseConfig, PublicURL: "http://" + srv.Listener.Addr().String(),
		Now: clock.Now, APIKeys: apikeys.NewCache(ttl, clock.Now)})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = a.Handler
	srv.Start()
	return srv.URL
}

// TestRevokedKeyRefusedByEveryInstanceWithinTTL: two instances on one database each cache
// the key they checked; revoked in the database (as `airlock apikey revoke` does), it is
// refused by both once the TTL has passed — and not a moment later.
func TestRevokedKeyRefusedByEveryInstanceWithinTTL(t *testing.T) {
	const ttl = 2 * time.Second
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock()
			st1 := b.Open(t, clock)
			st2 := storetest.Reopen(t, st1, clock)
			urls := []string{instance(t, st1, clock, ttl), instance(t, st2, clock, ttl)}
			h := &harness{t: t}
			k, raw, err := apikeys.Create(context.Background(), st1, "n8n", []string{apikeys.ScopeRuns}, clock.Now())
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			claimOn := func(i int, key string) response {
				t.Helper()
				n++
				h.url = urls[i]
				return h.do("POST", "/v1/runs/claim", key, "application/json", fmt.Sprintf(`{"key":"k-%d","payload":{"n":%d}}`, n, n))
			}
			for i := range urls {
				expect(t, claimOn(i, raw), 201, "")
			}
			if err := st1.APIKeyRevoke(context.Background(), k.ID, clock.Now()); err != nil {
				t.Fatal(err)
			}
			// Within the TTL an instance may still trust what it checked (that is the cache)…
			clock.Advance(ttl - time.Millisecond)
			for i := range urls {
				expect(t, claimOn(i, raw), 201, "")
			}
			// …and once it has passed, every instance refuses the key.
			clock.Advance(time.Millisecond)
			for i := range urls {
				expect(t, claimOn(i, raw), 401, "unauthenticated")
			}
			// A refused key is not cached: it stays refused, and a key created now works at
			// once on every instance (no negative caching).
			for i := range urls {
				expect(t, claimOn(i, raw), 401, "unauthenticated")
				expect(t, claimOn(i, "alk_never-issued"), 401, "unauthenticated")
			}
			_, fresh, err := apikeys.Create(context.Background(), st2, "fresh", []string{apikeys.ScopeRuns}, clock.Now())
			if err != nil {
				t.Fatal(err)
			}
			for i := range urls {
				expect(t, claimOn(i, fresh), 201, "")
			}
		})
	}
}
