package accounts_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/accounts"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

const password = "correct horse battery"

// forEachBackend runs test against a fresh store of each backend, on a test clock.
func forEachBackend(t *testing.T, test func(t *testing.T, st store.Store, clock *storetest.Clock)) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock()
			test(t, b.Open(t, clock), clock)
		})
	}
}

func TestSessionsStoreOnlyHashes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, st store.Store, clock *storetest.Clock) {
		ctx := context.Background()
		s := accounts.Sessions{Store: st, Clock: runs.Clock{Now: clock.Now}}
		ana := approvals.Person{Subject: "ana", Roles: []string{"support-lead"}}
		first, err := s.Start(ctx, "", ana, "")
		if err != nil {
			t.Fatal(err)
		}
		second, err := s.Start(ctx, first, ana, "")
		if err != nil {
			t.Fatal(err)
		}
		if first == second || len(second) < 40 {
			t.Fatalf("session ids %q, %q", first, second)
		}
		if db := storetest.DumpAll(t, st); strings.Contains(db, first) || strings.Contains(db, second) {
			t.Fatal("a session id is stored as it is")
		}
		if _, err := s.Person(ctx, first); !errors.Is(err, accounts.ErrNoSession) {
			t.Fatalf("the session a new sign-in replaced: %v", err)
		}
		who, err := s.Person(ctx, second)
		if err != nil || who.Subject != "ana" || len(who.Roles) != 1 || who.Roles[0] != "support-lead" {
			t.Fatalf("person = %+v, %v", who, err)
		}
		// Idle time is renewed by use; the lifetime is not.
		for range 30 {
			clock.Advance(accounts.SessionIdle - time.Minute)
			if _, err := s.Person(ctx, second); err != nil {
				break
			}
		}
		if _, err := s.Person(ctx, second); !errors.Is(err, accounts.ErrNoSession) {
			t.Fatalf("a session in use past its lifetime: %v", err)
		}
		third, _ := s.Start(ctx, "", ana, "")
		clock.Advance(accounts.SessionIdle + time.Second)
		if _, err := s.Person(ctx, third); !errors.Is(err, accounts.ErrNoSession) {
			t.Fatalf("an idle session: %v", err)
		}
		fourth, _ := s.Start(ctx, "", ana, "")
		if err := s.End(ctx, fourth); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Person(ctx, fourth); !errors.Is(err, accounts.ErrNoSession) {
			t.Fatalf("an ended session: %v", err)
		}
		if _, err := s.Person(ctx, ""); !errors.Is(err, accounts.ErrNoSession) {
			t.Fatalf("no id: %v", err)
		}
	})
}

// Every change that affects what a person may do ends their sessions.
func TestAccountChangesEndSessions(t *testing.T) {
	forEachBackend(t, func(t *testing.T, st store.Store, clock *storetest.Clock) {
		ctx := context.Background()
		if err := accounts.CreateUser(ctx, st, "lead", password, []string{"support-lead"}); err != nil {
			t.Fatal(err)
		}
		if err := accounts.CreateUser(ctx, st, "lead", password, []string{"support-lead"}); err == nil {
			t.Fatal("a second account of the same name")
		}
		if db := storetest.DumpAll(t, st); strings.Contains(db, password) {
			t.Fatal("a password is stored as it is")
		}
		s := accounts.Sessions{Store: st, Clock: runs.Clock{Now: clock.Now}}
		a := accounts.Accounts{Store: st, Actor: "test:ops"}
		for _, c := range []struct {
			name   string
			change func() error
		}{
			{"roles", func() error { _, err := a.SetRoles(ctx, "lead", "support"); return err }},
			{"password", func() error { _, err := a.ResetPassword(ctx, "lead", "another long password"); return err }},
			{"disable", func() error { _, err := a.Disable(ctx, "lead"); return err }},
			{"remove", func() error { return a.Remove(ctx, "lead") }},
		} {
			u, err := st.UserByName(ctx, "lead")
			if err != nil {
				t.Fatal(err)
			}
			id, err := s.Start(ctx, "", approvals.Person{Subject: u.Name, Roles: u.Roles}, u.ID)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.change(); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if _, err := s.Person(ctx, id); !errors.Is(err, accounts.ErrNoSession) {
				t.Errorf("%s: the session lives on (%v)", c.name, err)
			}
			if c.name == "disable" {
				if _, err := a.Enable(ctx, "lead"); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := a.Disable(ctx, "lead"); !errors.Is(err, accounts.ErrNoUser) {
			t.Fatalf("disable a removed account: %v", err)
		}
	})
}

// logs collects what SignIn logs.
type logs struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

var _ io.Writer = (*logs)(nil)

func TestSignInThrottle(t *testing.T) {
	forEachBackend(t, func(t *testing.T, st store.Store, clock *storetest.Clock) {
		ctx := context.Background()
		if err := accounts.CreateUser(ctx, st, "lead", password, []string{"support-lead"}); err != nil {
			t.Fatal(err)
		}
		var logged logs
		th := accounts.Throttle{AccountFree: 1, ClientFree: 100, Base: time.Second, Max: 2 * time.Second, Window: time.Hour}
		s := accounts.SignIn{Store: st, Throttle: th, Log: slog.New(slog.NewTextHandler(&logged, nil)), Clock: runs.Clock{Now: clock.Now}}
		if _, err := s.Check(ctx, "lead", "wrong password", "192.0.2.1"); !errors.Is(err, accounts.ErrRefused) {
			t.Fatalf("attempt 1: %v", err)
		}
		// The second wrong attempt is counted and starts the wait: 1 s, then 2 s, 2 s.
		for i, want := range []int64{1, 2, 2} {
			if _, err := s.Check(ctx, "lead", "wrong password", "192.0.2.1"); !errors.Is(err, accounts.ErrRefused) {
				t.Fatalf("attempt %d: %v", i+2, err)
			}
			_, err := s.Check(ctx, "lead", password, "192.0.2.1")
			var te *accounts.ThrottledError
			if !errors.As(err, &te) || te.Scope != "account" || te.RetryAfter() != want {
				t.Fatalf("the right password while waiting (%d): %v", i, err)
			}
			clock.Advance(time.Duration(want) * time.Second)
		}
		// Unknown and disabled accounts are refused as a wrong password is.
		if _, err := s.Check(ctx, "nobody", password, "192.0.2.1"); !errors.Is(err, accounts.ErrRefused) {
			t.Fatalf("unknown account: %v", err)
		}
		u, err := s.Check(ctx, "lead", password, "192.0.2.1")
		if err != nil || u.Name != "lead" {
			t.Fatalf("the right password after the wait: %+v %v", u, err)
		}
		// A right password clears the account's count: a free attempt again, not a wait.
		if _, err := s.Check(ctx, "lead", "wrong password", "192.0.2.1"); !errors.Is(err, accounts.ErrRefused) {
			t.Fatalf("after a sign-in: %v", err)
		}
		if _, err := (accounts.Accounts{Store: st, Actor: "test"}).Disable(ctx, "lead"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Check(ctx, "lead", password, "192.0.2.9"); !errors.Is(err, accounts.ErrRefused) {
			t.Fatalf("a disabled account: %v", err)
		}
		// Names and addresses are counted under their hashes, and never logged.
		db := storetest.DumpAll(t, st)
		for _, secret := range []string{"192.0.2.1", "account:lead", password, "wrong password"} {
			if strings.Contains(db, secret) || strings.Contains(logged.b.String(), secret) {
				t.Errorf("%q is stored or logged as it is", secret)
			}
		}
	})
}
