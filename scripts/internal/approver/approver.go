// Package approver is the person of the load drills (scripts/failover-load,
// scripts/levels-load) who decides gated effects: a local account that signs in through
// POST /login, again whenever its session is gone, and decides through POST
// /approve/{token} with the approval page's form fields, as a browser would (the page's
// Origin, no redirects followed).
package approver

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

// Approver is one person signed in across every instance: one cookie jar, as a session
// is valid on any instance of one database.
type Approver struct {
	user, password string
	observe        func(route string, status int, start time.Time)
	browser        *http.Client
	signedIn       atomic.Bool
	signIns        atomic.Int64
}

// New is the approver user (password). observe, if not nil, sees each request's route
// ("login" or "decide"), status (0: no answer) and start.
func New(user, password string, observe func(route string, status int, start time.Time)) *Approver {
	jar, _ := cookiejar.New(nil)
	return &Approver{user: user, password: password, observe: observe, browser: &http.Client{Jar: jar, Timeout: 15 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Decide signs in at base unless signed in, then posts decision (with reason) on the
// approval behind token. tried is false when the sign-in failed and nothing was posted;
// status is the decision's answer (0: none). A redirect, 401 or 403 means the session is
// gone: the next Decide signs in again.
func (a *Approver) Decide(base, token, decision, reason string) (status int, tried bool) {
	if !a.signedIn.Load() {
		st := a.post(base, "/login", url.Values{"username": {a.user}, "password": {a.password}}, "login")
		if st != http.StatusSeeOther && st != http.StatusOK {
			return 0, false
		}
		a.signedIn.Store(true)
		a.signIns.Add(1)
	}
	st := a.post(base, "/approve/"+token, url.Values{"decision": {decision}, "reason": {reason}}, "decide")
	if st == http.StatusSeeOther || st == http.StatusUnauthorized || st == http.StatusForbidden {
		a.signedIn.Store(false)
	}
	return st, true
}

// SignIns is how many times the approver signed in.
func (a *Approver) SignIns() int { return int(a.signIns.Load()) }

func (a *Approver) post(base, path string, v url.Values, route string) int {
	req, _ := http.NewRequest("POST", base+path, strings.NewReader(v.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	start := time.Now()
	st := 0
	if resp, err := a.browser.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		st = resp.StatusCode
	}
	if a.observe != nil {
		a.observe(route, st, start)
	}
	return st
}
