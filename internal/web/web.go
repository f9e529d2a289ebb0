// Package web is airlock's pages for people: sign-in with local accounts or OpenID
// Connect single sign-on (oidc.go), and the approval confirmation page and decision.
// Pages are server-rendered and work without JavaScript; a GET never changes an
// approval; every POST passes net/http's CrossOriginProtection, and cookies are
// SameSite=Lax, HttpOnly, Secure over https.
package web

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"html/template"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/input"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

//go:embed templates/*.html
var templateFS embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{"shown": input.Shown}).
	ParseFS(templateFS, "templates/layout.html", "templates/login.html", "templates/neutral.html", "templates/approval.html"))

const (
	sessionCookie = "airlock_session"
	intentCookie  = "airlock_intent"
	// SessionIdle and SessionLifetime bound a session: idle, and absolute.
	SessionIdle     = 30 * time.Minute
	SessionLifetime = 12 * time.Hour
	intentLifetime  = 15 * time.Minute
)

// Web serves the pages.
type Web struct {
	store     store.Store
	approvals *approvals.Service
	log       *slog.Logger
	secure    bool  // Secure cookies: the public URL is https
	oidc      *OIDC // single sign-on, when configured
	throttle  Throttle
	observer  Observer
	intent    intentKey
	console   *Console // the operator console, when enabled
	runs.Clock
}

func New(st store.Store, ap *approvals.Service, log *slog.Logger, publicURL string, now func() time.Time, opts ...Option) *Web {
	w := &Web{store: st, approvals: ap, log: log, secure: strings.HasPrefix(publicURL, "https://"), Clock: runs.Clock{Now: now}, throttle: DefaultThrottle}
	for _, o := range opts {
		o(w)
	}
	return w
}

// Patterns lists the routes Register adds (the OpenAPI test documents them).
var Patterns = []string{"GET /login", "POST /login", "POST /logout", "GET /approve/{token}", "POST /approve/{token}",
	"GET /approve/continue", "POST /approve/continue", "GET /login/oidc", "GET " + CallbackPath}

// Register adds the pages to mux.
func (w *Web) Register(mux *http.ServeMux) {
	cop := http.NewCrossOriginProtection()
	post := func(h http.HandlerFunc) http.Handler { return headers(cop.Handler(w.sameOrigin(h))) }
	mux.Handle("GET /login", headers(http.HandlerFunc(w.loginPage)))
	mux.Handle("POST /login", post(w.login))
	mux.Handle("POST /logout", post(w.logout))
	mux.Handle("GET /login/oidc", headers(http.HandlerFunc(w.oidcStart)))
	mux.Handle("GET "+CallbackPath, headers(http.HandlerFunc(w.oidcCallback)))
	// "continue" is the page after a sign-in, found through the intent cookie: the raw
	// token never sits in a URL parameter or server-side.
	mux.Handle("GET /approve/continue", headers(http.HandlerFunc(w.continuePage)))
	mux.Handle("POST /approve/continue", post(w.continueDecide))
	mux.Handle("GET /approve/{token}", headers(http.HandlerFunc(w.approvalPage)))
	mux.Handle("POST /approve/{token}", post(w.decide))
	if w.console != nil {
		w.registerConsole(mux)
	}
}

// headers are the page security headers: no framing, no referrer (an approval URL holds
// a token), no caching, nothing loaded from anywhere.
func headers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		h := rw.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		if r.Body != nil {
			r.Body = http.MaxBytesReader(rw, r.Body, 64<<10)
		}
		next.ServeHTTP(rw, r)
	})
}

// sameOrigin completes CrossOriginProtection, which lets a request without Origin and
// Sec-Fetch-Site through (it takes it for a non-browser client): a form post must come
// from a browser, so without both it needs a Referer on this host, and without any of
// the three it is refused.
func (w *Web) sameOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Sec-Fetch-Site") == "" && r.Header.Get("Origin") == "" {
			ref, err := url.Parse(r.Header.Get("Referer"))
			if err != nil || ref.Host == "" || ref.Host != r.Host || (ref.Scheme != "http" && ref.Scheme != "https") {
				w.log.Warn("form post refused", "route", r.Pattern, "reason", "no Origin or Sec-Fetch-Site, and no Referer from this site")
				w.render(rw, http.StatusForbidden, "neutral.html", page{Title: "Refused",
					Message: "This form was not sent from an airlock page. Nothing was changed. Open the page again and use its buttons."})
				return
			}
		}
		next.ServeHTTP(rw, r)
	})
}

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func randomValue() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (w *Web) setCookie(rw http.ResponseWriter, name, value string, maxAge time.Duration) {
	http.SetCookie(rw, &http.Cookie{Name: name, Value: value, Path: "/", HttpOnly: true, Secure: w.secure,
		SameSite: http.SameSiteLaxMode, MaxAge: int(maxAge.Seconds())})
}

// person returns the signed-in person, or nil. The error is store.ErrUnavailable when
// the database could not say (the session is touched, a write): nobody is taken for
// signed out, and sent to sign in, because of an outage.
func (w *Web) person(r *http.Request) (*approvals.Person, error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil, nil
	}
	s, err := w.store.SessionTouch(r.Context(), hashOf(c.Value), SessionIdle, w.At())
	if errors.Is(err, store.ErrUnavailable) {
		return nil, err
	}
	if err != nil {
		return nil, nil
	}
	return &approvals.Person{Subject: s.Subject, Roles: s.Roles}, nil
}

// whoIs is person for a page: when the database cannot say, it answers the request with
// the try-again page and ok is false.
func (w *Web) whoIs(rw http.ResponseWriter, r *http.Request) (who *approvals.Person, ok bool) {
	who, err := w.person(r)
	if err != nil {
		w.fail(rw, "session", err)
		return nil, false
	}
	return who, true
}

// fail answers a request that the store failed: 503 and a page that says to try again
// when the database is unavailable (store.ErrUnavailable), else 500. Both are logged.
func (w *Web) fail(rw http.ResponseWriter, what string, err error) {
	if errors.Is(err, store.ErrUnavailable) {
		w.log.Warn(what+": the database is unavailable", "err", err)
		w.unavailable(rw)
		return
	}
	w.log.Error(what, "err", err)
	http.Error(rw, "internal error", http.StatusInternalServerError)
}

// unavailable is the page of an outage: nothing is wrong with the request, and sending
// it again (the browser's reload, the form again) is safe — a decision is taken once,
// and a sign-in only signs in.
func (w *Web) unavailable(rw http.ResponseWriter) {
	rw.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
	w.render(rw, http.StatusServiceUnavailable, "neutral.html", page{Title: "Try again in a moment",
		Message: "airlock cannot use its database just now. Try again in a few seconds: what you sent is safe to send again, and a decision already recorded is not taken twice."})
}

// RetryAfterSeconds is the Retry-After of the outage page, as of the API's 503.
const RetryAfterSeconds = 2

type page struct {
	Title, Message, Error string
	Link                  string // a console link on the signed-in page
	Person                *approvals.Person
}

func (w *Web) render(rw http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := pages.ExecuteTemplate(&buf, name, data); err != nil {
		w.log.Error("render page", "page", name, "err", err)
		http.Error(rw, "internal error", http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "text/html; charset=utf-8")
	rw.WriteHeader(status)
	_, _ = buf.WriteTo(rw)
}

// neutral is the one page for unknown, expired and used links: no hint which.
func (w *Web) neutral(rw http.ResponseWriter, who *approvals.Person) {
	w.render(rw, http.StatusNotFound, "neutral.html", page{Title: "This link cannot be used",
		Message: "The approval link is unknown, has expired, or has already been used. Nothing was changed.", Person: who})
}

type loginPage struct {
	page
	SSO bool
}

func (w *Web) loginPage(rw http.ResponseWriter, r *http.Request) {
	who, ok := w.whoIs(rw, r)
	if !ok {
		return
	}
	if who != nil {
		w.signedIn(rw, who)
		return
	}
	w.render(rw, http.StatusOK, "login.html", loginPage{page: page{Title: "Sign in"}, SSO: w.oidc != nil})
}

func (w *Web) loginError(rw http.ResponseWriter, r *http.Request, status int, msg string) {
	w.render(rw, status, "login.html", loginPage{page: page{Title: "Sign in", Error: msg}, SSO: w.oidc != nil})
}

func (w *Web) signedIn(rw http.ResponseWriter, who *approvals.Person) {
	p := page{Title: "Signed in", Message: "You are signed in. Open your approval link again.", Person: who}
	if w.console != nil {
		p.Message, p.Link = "You are signed in. Open your approval link again, or the console.", "/console"
	}
	w.render(rw, http.StatusOK, "neutral.html", p)
}

// startSession starts the server-side session of a sign-in, local or single sign-on:
// only the cookie value's hash is stored; a session the browser held before ends.
func (w *Web) startSession(rw http.ResponseWriter, r *http.Request, who approvals.Person, userID string) bool {
	if c, err := r.Cookie(sessionCookie); err == nil && c.Value != "" {
		_ = w.store.SessionDelete(r.Context(), hashOf(c.Value))
	}
	value := randomValue()
	// The database's clock (or the test's): sessions are checked against it, and another
	// instance's process clock may differ from this one's.
	now, err := w.Read(r.Context(), w.store)
	if err != nil {
		w.fail(rw, "create session", err)
		return false
	}
	if err := w.store.SessionInsert(r.Context(), store.Session{IDHash: hashOf(value), UserID: userID, Subject: who.Subject, Roles: who.Roles,
		CreatedAt: now, ExpiresAt: now.Add(SessionLifetime)}); err != nil {
		w.fail(rw, "create session", err)
		return false
	}
	w.setCookie(rw, sessionCookie, value, SessionLifetime)
	return true
}

// hasIntent: an approval's place is kept across this sign-in.
func (w *Web) hasIntent(r *http.Request) bool {
	_, err := r.Cookie(intentCookie)
	return err == nil
}

func (w *Web) logout(rw http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		_ = w.store.SessionDelete(r.Context(), hashOf(c.Value))
	}
	w.setCookie(rw, sessionCookie, "", -time.Second)
	http.Redirect(rw, r, "/login", http.StatusSeeOther)
}

// askLogin keeps the approval's place (its token's hash) in a sealed intent cookie, and
// sends the person to sign in. It writes nothing to the database.
func (w *Web) askLogin(rw http.ResponseWriter, r *http.Request, tokenHash string) {
	value, err := w.sealIntent(r.Context(), tokenHash)
	if err != nil {
		w.fail(rw, "keep login intent", err)
		return
	}
	w.setCookie(rw, intentCookie, value, intentLifetime)
	http.Redirect(rw, r, "/login", http.StatusSeeOther)
}

type approvalPage struct {
	page
	Approval  store.Approval
	Run       store.Run
	Payload   string
	Model     string
	Action    string
	CanDecide bool
	Why       string
	Protocol  string
	// Recipients are a mail effect's envelope recipients, exactly as they will be sent.
	Recipients []string
	// CSRF is the console's form token (console cards only).
	CSRF string
	// Call is an MCP tool call's input (tool and arguments), when the payload is one.
	Call *toolCall
}

// toolCall is an MCP tool call as an approval holds it: {"tool", "arguments"}.
type toolCall struct {
	Tool      string
	Arguments []namedArg
}

type namedArg struct{ Name, Value string }

// asToolCall reads an agent effect's payload as an MCP tool call, each argument's value
// as indented JSON (a string as itself); nil when it is not one.
func asToolCall(a store.Approval) *toolCall {
	if a.Executor != store.ExecutorAgent || len(a.Payload) == 0 {
		return nil
	}
	var in struct {
		Tool      string                     `json:"tool"`
		Arguments map[string]json.RawMessage `json:"arguments"`
	}
	if json.Unmarshal(a.Payload, &in) != nil || in.Tool == "" || in.Arguments == nil {
		return nil
	}
	c := &toolCall{Tool: in.Tool}
	for _, k := range slices.Sorted(maps.Keys(in.Arguments)) {
		v := in.Arguments[k]
		var str string
		if json.Unmarshal(v, &str) != nil {
			var pretty bytes.Buffer
			if json.Indent(&pretty, v, "", "  ") != nil {
				pretty.Reset()
				pretty.Write(v)
			}
			str = pretty.String()
		}
		c.Arguments = append(c.Arguments, namedArg{Name: k, Value: str})
	}
	return c
}

// notApprover tells a signed-in person that this approval is not theirs to decide, and
// shows nothing of it.
func (w *Web) notApprover(rw http.ResponseWriter, who *approvals.Person, why error) {
	w.render(rw, http.StatusForbidden, "neutral.html", page{Title: "You are not an approver of this action",
		Message: strings.ToUpper(why.Error()[:1]) + why.Error()[1:] + ". Nothing was changed; its content is shown only to those who may decide it.", Person: who})
}

func (w *Web) show(rw http.ResponseWriter, r *http.Request, tokenHash, action string, who *approvals.Person, status int, errMsg string) {
	a, run, err := w.approvals.Lookup(r.Context(), tokenHash)
	if errors.Is(err, store.ErrUnavailable) {
		w.fail(rw, "approval page", err)
		return
	}
	if err != nil {
		if !errors.Is(err, approvals.ErrNotFound) {
			w.log.Error("approval page", "err", err)
		}
		w.neutral(rw, who)
		return
	}
	// The card, and the draft in it, is for the people who may decide it.
	if err := approvals.May(a, *who); err != nil {
		w.notApprover(rw, who, err)
		return
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, a.Payload, "", "  "); err != nil {
		pretty.Write(a.Payload)
	}
	p := approvalPage{page: page{Title: "Approval", Person: who, Error: errMsg}, Approval: a, Run: run,
		Payload: pretty.String(), Model: w.model(r.Context(), a), Action: action, Protocol: runs.RerunProtocol,
		Recipients: w.approvals.Recipients(a), CanDecide: true, Call: asToolCall(a)}
	if strings.HasPrefix(action, "/console/") {
		p.CSRF = csrfToken(r)
	}
	w.render(rw, status, "approval.html", p)
}

// model reads the model that drafted the effect from the request's event.
func (w *Web) model(ctx context.Context, a store.Approval) string {
	for after := int64(0); ; {
		evs, err := w.store.EventList(ctx, a.RunKey, after, 1000)
		if err != nil || len(evs) == 0 {
			return ""
		}
		for _, e := range evs {
			if e.Kind != "approval_requested" || !strings.Contains(string(e.Detail), a.ID) {
				continue
			}
			var m runs.Meta
			if json.Unmarshal(e.Meta, &m) == nil && m.Model != nil {
				return strings.TrimSpace(m.Model.Provider + " " + m.Model.Name + " " + m.Model.Revision)
			}
			return ""
		}
		after = evs[len(evs)-1].ID
	}
}

func (w *Web) approvalPage(rw http.ResponseWriter, r *http.Request) {
	th := approvals.HashToken(r.PathValue("token"))
	who, ok := w.whoIs(rw, r)
	if !ok {
		return
	}
	if who == nil {
		if _, _, err := w.approvals.Lookup(r.Context(), th); errors.Is(err, store.ErrUnavailable) {
			w.fail(rw, "approval page", err)
			return
		} else if err != nil {
			w.neutral(rw, nil)
			return
		}
		w.askLogin(rw, r, th)
		return
	}
	w.show(rw, r, th, r.URL.Path, who, http.StatusOK, "")
}

func (w *Web) continueTokenHash(r *http.Request) (string, bool) {
	return w.openIntent(r)
}

func (w *Web) continuePage(rw http.ResponseWriter, r *http.Request) {
	who, ok := w.whoIs(rw, r)
	if !ok {
		return
	}
	th, ok := w.continueTokenHash(r)
	switch {
	case !ok:
		w.neutral(rw, who)
	case who == nil:
		http.Redirect(rw, r, "/login", http.StatusSeeOther)
	default:
		w.show(rw, r, th, "/approve/continue", who, http.StatusOK, "")
	}
}

func (w *Web) decide(rw http.ResponseWriter, r *http.Request) {
	w.decideHash(rw, r, approvals.HashToken(r.PathValue("token")), r.URL.Path)
}

func (w *Web) continueDecide(rw http.ResponseWriter, r *http.Request) {
	th, ok := w.continueTokenHash(r)
	if !ok {
		who, ok := w.whoIs(rw, r)
		if ok {
			w.neutral(rw, who)
		}
		return
	}
	w.decideHash(rw, r, th, "/approve/continue")
}

func (w *Web) decideHash(rw http.ResponseWriter, r *http.Request, th, action string) {
	who, ok := w.whoIs(rw, r)
	if !ok {
		return
	}
	if who == nil {
		w.askLogin(rw, r, th)
		return
	}
	form, bad := postForm(r, formField{name: "decision", label: "decision", max: 20},
		formField{name: "reason", label: "reason", max: 2000, multiline: true})
	if bad != "" {
		w.render(rw, http.StatusBadRequest, "neutral.html", page{Title: "Not sent", Message: bad + " Nothing was decided.", Person: who})
		return
	}
	decision, reason := form["decision"], strings.TrimSpace(form["reason"])
	if decision == approvals.Reject && reason == "" {
		w.show(rw, r, th, action, who, http.StatusUnprocessableEntity, "Say why you reject it.")
		return
	}
	a, err := w.approvals.Decide(r.Context(), th, decision, reason, *who)
	switch {
	case errors.Is(err, approvals.ErrForbidden), errors.Is(err, approvals.ErrSelfApproval):
		w.notApprover(rw, who, err)
		return
	case errors.Is(err, approvals.ErrDecisionNotAllowed):
		w.show(rw, r, th, action, who, http.StatusForbidden, err.Error())
		return
	case errors.Is(err, approvals.ErrTooLate):
		w.render(rw, http.StatusConflict, "neutral.html", page{Title: "Too late to cancel", Message: err.Error(), Person: who})
		return
	case errors.Is(err, approvals.ErrNotFound):
		w.neutral(rw, who)
		return
	case err != nil:
		w.fail(rw, "decide approval", err)
		return
	}
	msg := "Approved: the action is queued and will be sent once."
	switch a.Decision {
	case approvals.Reject:
		msg = "Rejected: nothing will be sent."
	case approvals.Cancel:
		msg = "Cancelled: nothing will be sent."
	}
	w.render(rw, http.StatusOK, "neutral.html", page{Title: "Decision recorded", Message: msg, Person: who})
}
