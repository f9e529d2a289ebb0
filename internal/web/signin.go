package web

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Throttle is the sign-in backoff. Every attempt is counted per account name (known or
// not) and per client address, in the database so that every instance agrees, before
// the password is checked. Past Free attempts within Window, the next one waits Base,
// then twice as long each time, up to Max; until then the answer is 429 with
// Retry-After and the password is not even checked, the right one included. A right
// password clears its account's count and takes back its own attempt from the client's.
type Throttle struct {
	AccountFree, ClientFree int
	Base, Max, Window       time.Duration
}

// DefaultThrottle: 5 attempts per account and 20 per client address, then 1 s, 2 s,
// 4 s … up to 15 minutes; counts are forgotten after 15 quiet minutes.
var DefaultThrottle = Throttle{AccountFree: 5, ClientFree: 20, Base: time.Second, Max: 15 * time.Minute, Window: 15 * time.Minute}

// WithThrottle replaces DefaultThrottle.
func WithThrottle(t Throttle) Option { return func(w *Web) { w.throttle = t } }

// Observer counts sign-ins by result: ok, refused, throttled (metrics.Metrics).
type Observer interface {
	SignIn(result string)
}

// WithObserver counts sign-ins.
func WithObserver(o Observer) Option { return func(w *Web) { w.observer = o } }

func (w *Web) observe(result string) {
	if w.observer != nil {
		w.observer.SignIn(result)
	}
}

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

type throttleKey struct {
	key, scope string
	free       int
}

// throttleKeys: the client first, so a throttled client is refused before any row is
// created for the names it tries.
func (w *Web) throttleKeys(r *http.Request, name string) []throttleKey {
	return []throttleKey{
		{"client:" + hashOf(clientAddress(r)), "client", w.throttle.ClientFree},
		{"account:" + hashOf(name), "account", w.throttle.AccountFree},
	}
}

// clientAddress is the peer's IP address; IPv6 clients count by their /64, which one
// host may hold whole. airlock does not read X-Forwarded-For.
func clientAddress(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return ip.String()
}

// errThrottled carries the wait of a refused attempt.
type errThrottled struct {
	wait  time.Duration
	scope string
}

func (e errThrottled) Error() string { return "sign-in throttled (" + e.scope + ")" }

// waiting reads the backoff without writing: a throttled client costs no write.
func (w *Web) waiting(ctx context.Context, keys []throttleKey) error {
	for _, k := range keys {
		t, now, err := w.store.ThrottleGet(ctx, k.key, w.At())
		if err != nil {
			return err
		}
		if t.NextAt.After(now) {
			return errThrottled{t.NextAt.Sub(now), k.scope}
		}
	}
	return nil
}

// count records one attempt on every key in one transaction, or none if a key is
// waiting (another instance may have counted meanwhile). A key that starts to wait
// writes a signin_throttled event in the same transaction.
func (w *Web) count(ctx context.Context, keys []throttleKey, user string) error {
	return w.store.Transact(ctx, func(q store.Queries) error {
		for _, k := range keys {
			t, now, err := q.ThrottleLock(ctx, k.key, w.At())
			if err != nil {
				return err
			}
			if t.NextAt.After(now) {
				return errThrottled{t.NextAt.Sub(now), k.scope}
			}
			if now.Sub(t.UpdatedAt) > w.throttle.Window {
				t.Failures = 0
			}
			t.Failures++
			d := w.throttle.delay(t.Failures, k.free)
			t.NextAt, t.UpdatedAt = now.Add(d), now
			if err := q.ThrottlePut(ctx, t); err != nil {
				return err
			}
			if d > 0 {
				detail := map[string]any{"scope": k.scope, "attempts": t.Failures, "retry_after_seconds": retryAfter(d)}
				if k.scope == "account" && user != "" {
					detail["user"] = user
				}
				if err := runs.Event(ctx, q, w.At(), "", store.EventSigninThrottled, 0, "airlock", nil, detail); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// forgive clears the account's count after a right password and takes this attempt
// back from the client's.
func (w *Web) forgive(ctx context.Context, keys []throttleKey) error {
	return w.store.Transact(ctx, func(q store.Queries) error {
		for _, k := range keys {
			if k.scope == "account" {
				if err := q.ThrottleDelete(ctx, k.key); err != nil {
					return err
				}
				continue
			}
			t, now, err := q.ThrottleLock(ctx, k.key, w.At())
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

func retryAfter(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
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

func (w *Web) login(rw http.ResponseWriter, r *http.Request) {
	form, bad := postForm(r, formField{name: "username", label: "user name", max: 200},
		formField{name: "password", label: "password", max: 1024})
	if bad != "" {
		w.observe("refused")
		w.loginError(rw, r, http.StatusBadRequest, bad)
		return
	}
	name, password := form["username"], form["password"]
	ctx := r.Context()
	keys := w.throttleKeys(r, name)
	u, err := w.store.UserByName(ctx, name)
	known := err == nil && u.DisabledAt == nil
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		w.fail(rw, "sign-in", err)
		return
	}
	user := ""
	if err == nil {
		user = u.Name
	}
	err = w.waiting(ctx, keys)
	if err == nil {
		err = w.count(ctx, keys, user)
	}
	var th errThrottled
	if errors.As(err, &th) {
		w.observe("throttled")
		w.log.Warn("sign-in throttled", "scope", th.scope, "retry_after_s", retryAfter(th.wait))
		s := retryAfter(th.wait)
		rw.Header().Set("Retry-After", strconv.FormatInt(s, 10))
		w.loginError(rw, r, http.StatusTooManyRequests, fmt.Sprintf("Too many sign-in attempts. Try again in %d seconds.", s))
		return
	}
	if err != nil {
		w.fail(rw, "sign-in throttle", err)
		return
	}
	hash := dummyHash()
	if known {
		hash = []byte(u.PasswordHash)
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || !known {
		w.observe("refused")
		w.loginError(rw, r, http.StatusUnauthorized, "Unknown user or wrong password.")
		return
	}
	if err := w.forgive(ctx, keys); err != nil {
		w.log.Error("sign-in throttle", "err", err)
	}
	w.observe("ok")
	who := approvals.Person{Subject: u.Name, Roles: u.Roles}
	if !w.startSession(rw, r, who, u.ID) {
		return
	}
	if !w.hasIntent(r) {
		w.signedIn(rw, &who)
		return
	}
	http.Redirect(rw, r, "/approve/continue", http.StatusSeeOther)
}
