package web

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"github.com/airlockhq/airlock/internal/accounts"
	"github.com/airlockhq/airlock/internal/approvals"
)

// WithThrottle replaces accounts.DefaultThrottle.
func WithThrottle(t accounts.Throttle) Option { return func(w *Web) { w.signIn.Throttle = t } }

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

// login is a local sign-in: accounts.SignIn checks it under the throttle (429 with
// Retry-After while an account or a client address must wait), then a session starts.
func (w *Web) login(rw http.ResponseWriter, r *http.Request) error {
	form, bad := postForm(r, formField{name: "username", label: "user name", max: 200},
		formField{name: "password", label: "password", max: 1024})
	if bad != "" {
		w.observe("refused")
		return w.loginRefused(http.StatusBadRequest, bad)
	}
	u, err := w.signIn.Check(r.Context(), form["username"], form["password"], clientAddress(r))
	var throttled *accounts.ThrottledError
	switch {
	case errors.As(err, &throttled):
		w.observe("throttled")
		s := throttled.RetryAfter()
		w.log.Warn("sign-in throttled", "scope", throttled.Scope, "retry_after_s", s)
		rf := w.loginRefused(http.StatusTooManyRequests, fmt.Sprintf("Too many sign-in attempts. Try again in %d seconds.", s))
		rf.header = http.Header{"Retry-After": {strconv.FormatInt(s, 10)}}
		return rf
	case errors.Is(err, accounts.ErrRefused):
		w.observe("refused")
		return w.loginRefused(http.StatusUnauthorized, "Unknown user or wrong password.")
	case err != nil:
		return fmt.Errorf("sign-in: %w", err)
	}
	w.observe("ok")
	who := approvals.Person{Subject: u.Name, Roles: u.Roles}
	if err := w.startSession(rw, r, who, u.ID); err != nil {
		return err
	}
	if !w.hasIntent(r) {
		return w.signedIn(rw, &who)
	}
	http.Redirect(rw, r, "/approve/continue", http.StatusSeeOther)
	return nil
}
