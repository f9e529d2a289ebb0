package storetest

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// TestSlackStatements: a signature is fresh once however many instances record it at
// once, and forgotten after its window; a link code is taken once however many take it
// at once, never after it expired; a link is replaced by the user's next one.
func TestSlackStatements(t *testing.T) {
	Each(t, func(t *testing.T, b Backend) {
		st := newEnv(t, b).Store
		now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

		race := func(n int, fn func() bool) int {
			var wins atomic.Int32
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if fn() {
						wins.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			return int(wins.Load())
		}
		fresh := race(8, func() bool {
			ok, err := st.SlackRequestSeen(ctx, "sig-1", now, now.Add(-10*time.Minute))
			if err != nil {
				t.Error(err)
			}
			return ok
		})
		equal(t, "fresh records of one signature", fresh, 1)
		// Ten minutes later it is forgotten (no accepted timestamp can repeat it).
		ok, err := st.SlackRequestSeen(ctx, "sig-2", now.Add(11*time.Minute), now.Add(time.Minute))
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		ok, err = st.SlackRequestSeen(ctx, "sig-1", now.Add(11*time.Minute), now.Add(time.Minute))
		equal(t, "sig-1 fresh again after its window", ok, true)
		if err != nil {
			t.Fatal(err)
		}

		if err := st.SlackCodePut(ctx, store.SlackCode{CodeHash: "h-old", Subject: "ana", AccountID: "acc-1", ExpiresAt: now.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		if err := st.SlackCodePut(ctx, store.SlackCode{CodeHash: "h-new", Subject: "ana", AccountID: "acc-1", ExpiresAt: now.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.SlackCodeTake(ctx, "h-old", &now); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a replaced code was taken: %v", err)
		}
		later := now.Add(2 * time.Minute)
		if _, err := st.SlackCodeTake(ctx, "h-new", &later); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("an expired code was taken: %v", err)
		}
		if err := st.SlackCodePut(ctx, store.SlackCode{CodeHash: "h-3", Subject: "ana", AccountID: "acc-1", ExpiresAt: now.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		var got store.SlackCode
		var mu sync.Mutex
		taken := race(8, func() bool {
			c, err := st.SlackCodeTake(ctx, "h-3", &now)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				t.Error(err)
			}
			if err == nil {
				mu.Lock()
				got = c
				mu.Unlock()
			}
			return err == nil
		})
		equal(t, "takes of one code", taken, 1)
		equal(t, "the code's person", got.Subject+"/"+got.AccountID, "ana/acc-1")

		if err := st.SlackLinkPut(ctx, store.SlackLink{TeamID: "T1", UserID: "U1", Subject: "ana", AccountID: "acc-1", LinkedAt: now, LinkedBy: "cli:x"}); err != nil {
			t.Fatal(err)
		}
		if err := st.SlackLinkPut(ctx, store.SlackLink{TeamID: "T1", UserID: "U1", Subject: "bo", LinkedAt: now, LinkedBy: "cli:y"}); err != nil {
			t.Fatal(err)
		}
		l, err := st.SlackLinkGet(ctx, "T1", "U1")
		if err != nil || l.Subject != "bo" || l.AccountID != "" || l.LinkedBy != "cli:y" || !l.LinkedAt.Equal(now) {
			t.Fatalf("link: %+v %v", l, err)
		}
		if _, err := st.SlackLinkGet(ctx, "T2", "U1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("another team's user: %v", err)
		}
		if err := st.SlackLinkDelete(ctx, "T1", "U1"); err != nil {
			t.Fatal(err)
		}
		if err := st.SlackLinkDelete(ctx, "T1", "U1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("second unlink: %v", err)
		}
		if err := st.PersonSeenPut(ctx, store.PersonSeen{Subject: "idp-1", Roles: []string{"a", "b"}, SeenAt: now}); err != nil {
			t.Fatal(err)
		}
		p, err := st.PersonSeenGet(ctx, "idp-1")
		if err != nil || len(p.Roles) != 2 || !p.SeenAt.Equal(now) {
			t.Fatalf("person seen: %+v %v", p, err)
		}
		if _, err := st.PersonSeenGet(ctx, "idp-2"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("unknown person: %v", err)
		}
	})
}
