package accounts

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Throttle is the sign-in backoff. Every attempt is counted per account name (known or
// not) and per client address, in the database so that every instance agrees, before
// the password is checked. Past Free attempts within Window, the next one waits Base,
// then twice as long each time, up to Max; until then the answer is ErrThrottled and the
// password is not even checked, the right one included. A right password clears its
// account's count and takes back its own attempt from the client's.
type Throttle struct {
	AccountFree, ClientFree int
	Base, Max, Window       time.Duration
}

// DefaultThrottle: 5 attempts per account and 20 per client address, then 1 s, 2 s,
// 4 s … up to 15 minutes; counts are forgotten after 15 quiet minutes.
var DefaultThrottle = Throttle{AccountFree: 5, ClientFree: 20, Base: time.Second, Max: 15 * time.Minute, Window: 15 * time.Minute}

// delay is how long the attempt after the n-th must wait.
func (t Throttle) delay(n, free int) time.Duration {
	if n <= free {
		return 0
	}
	d := t.Base
	for i := free + 1; i < n && d < t.Max; i++ {
		d *= 2
	}
	return min(d, t.Max)
}

// ErrRefused: an unknown account, a disabled one, or a wrong password — one answer for
// all three.
var ErrRefused = errors.New("unknown user or wrong password")

// ThrottledError refuses an attempt that came before its wait was over.
type ThrottledError struct {
	Wait  time.Duration
	Scope string // "client" or "account": which count made it wait
}

func (e *ThrottledError) Error() string { return "sign-in throttled (" + e.Scope + ")" }

// RetryAfter is the wait in whole seconds, at least 1 (the Retry-After header).
func (e *ThrottledError) RetryAfter() int64 { return retryAfter(e.Wait) }

func retryAfter(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}

// SignIn checks local sign-ins under the throttle.
type SignIn struct {
	Store    store.Store
	Throttle Throttle
	Log      *slog.Logger // a failure to clear a count after a right password
	runs.Clock
}

// Check counts the attempt of name from the client address client (see Throttle) and,
// if it need not wait, checks the password. It returns the account on a right password
// of an enabled account; else ErrRefused, a *ThrottledError, or the store's error.
func (s SignIn) Check(ctx context.Context, name, password, client string) (store.User, error) {
	keys := s.keys(name, client)
	u, err := s.Store.UserByName(ctx, name)
	known := err == nil && u.DisabledAt == nil
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return store.User{}, err
	}
	user := ""
	if err == nil {
		user = u.Name
	}
	err = s.waiting(ctx, keys)
	if err == nil {
		err = s.count(ctx, keys, user)
	}
	if err != nil {
		return store.User{}, err
	}
	hash := dummyHash()
	if known {
		hash = []byte(u.PasswordHash)
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || !known {
		return store.User{}, ErrRefused
	}
	if err := s.forgive(ctx, keys); err != nil && s.Log != nil {
		// The sign-in stands: the count only lapses later than it should.
		s.Log.Error("sign-in throttle", "err", err)
	}
	return u, nil
}

type throttleKey struct {
	key, scope string
	free       int
}

// keys: the client first, so a throttled client is refused before any row is created
// for the names it tries. Both are stored hashed.
func (s SignIn) keys(name, client string) []throttleKey {
	return []throttleKey{
		{"client:" + hashOf(client), "client", s.Throttle.ClientFree},
		{"account:" + hashOf(name), "account", s.Throttle.AccountFree},
	}
}

// waiting reads the backoff without writing: a throttled client costs no write.
func (s SignIn) waiting(ctx context.Context, keys []throttleKey) error {
	for _, k := range keys {
		t, now, err := s.Store.ThrottleGet(ctx, k.key, s.At())
		if err != nil {
			return err
		}
		if t.NextAt.After(now) {
			return &ThrottledError{t.NextAt.Sub(now), k.scope}
		}
	}
	return nil
}

// count records one attempt on every key in one transaction, or none if a key is
// waiting (another instance may have counted meanwhile). A key that starts to wait
// writes a signin_throttled event in the same transaction.
func (s SignIn) count(ctx context.Context, keys []throttleKey, user string) error {
	return s.Store.Transact(ctx, func(q store.Queries) error {
		for _, k := range keys {
			t, now, err := q.ThrottleLock(ctx, k.key, s.At())
			if err != nil {
				return err
			}
			if t.NextAt.After(now) {
				return &ThrottledError{t.NextAt.Sub(now), k.scope}
			}
			if now.Sub(t.UpdatedAt) > s.Throttle.Window {
				t.Failures = 0
			}
			t.Failures++
			d := s.Throttle.delay(t.Failures, k.free)
			t.NextAt, t.UpdatedAt = now.Add(d), now
			if err := q.ThrottlePut(ctx, t); err != nil {
				return err
			}
			if d > 0 {
				detail := map[string]any{"scope": k.scope, "attempts": t.Failures, "retry_after_seconds": retryAfter(d)}
				if k.scope == "account" && user != "" {
					detail["user"] = user
				}
				if err := runs.Event(ctx, q, s.At(), runs.Entry{Kind: store.EventSigninThrottled, Actor: "airlock", Detail: detail}); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// forgive clears the account's count after a right password and takes this attempt
// back from the client's.
func (s SignIn) forgive(ctx context.Context, keys []throttleKey) error {
	return s.Store.Transact(ctx, func(q store.Queries) error {
		for _, k := range keys {
			if k.scope == "account" {
				if err := q.ThrottleDelete(ctx, k.key); err != nil {
					return err
				}
				continue
			}
			t, now, err := q.ThrottleLock(ctx, k.key, s.At())
			if err != nil {
				return err
			}
			t.Failures = max(t.Failures-1, 0)
			if t.Failures <= k.free && t.NextAt.After(now) {
				t.NextAt = now
			}
			if err := q.ThrottlePut(ctx, t); err != nil {
				return err
			}
		}
		return nil
	})
}

// dummyHash is checked for unknown and disabled accounts, so that they take as long as
// a wrong password for a real one.
var dummyHash = sync.OnceValue(func() []byte {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	h, err := bcrypt.GenerateFromPassword(b, bcrypt.DefaultCost)
	if err != nil {
		panic(err)
	}
	return h
})
