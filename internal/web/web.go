// Package web is airlock's pages for people: sign-in with local accounts or OpenID
// Connect single sign-on (oidc.go), and the approval confirmation page and decision.
// Pages are server-rendered and work without JavaScript; a GET never changes an
// approval; every POST passes net/http's CrossOriginProtection, and cookies are
// SameSite=Lax, HttpOnly, Secure over https. Accounts, sessions and the sign-in
// throttle live in internal/accounts; a handler here returns its errors, and
// writeError (errors.go) is the one place they become a status and a page.
package web

import (
	"bytes"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/accounts"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/input"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

//go:embed templates/*.html
var templateFS embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{"shown": input.Shown}).
	ParseFS(templateFS, "templates/layout.html", "templates/login.html", "templates/neutral.html", "templates/approval.html", "templates/closed.html"))

const (
	sessionCookie  = "airlock_session"
	intentCookie   = "airlock_intent"
	intentLifetime = 15 * time.Minute
)

// Web serves the pages.
type Web struct {
	store     store.Store
	approvals *approvals.Service
	log       *slog.Logger
	secure    bool  // Secure cookies: the public URL is https
	oidc      *OIDC // single sign-on, when configured
	sessions  accounts.Sessions
	signIn    accounts.SignIn // local sign-in, under its throttle
	observer  Observer
	intent    intentKey
	console   *Console // the operator console, when enabled
	runs.Clock
}

func New(st store.Store, ap *approvals.Service, log *slog.Logger, publicURL string, now func() time.Time, opts ...Option) *Web {
	clock := runs.Clock{Now: now}
	w := &Web{store: st, approvals: ap, log: log, secure: strings.HasPrefix(publicURL, "https://"), Clock: clock,
		sessions: accounts.Sessions{Store: st, Clock: clock},
		signIn:   accounts.SignIn{Store: st, Throttle: accounts.DefaultThrottle, Log: log, Clock: clock}}
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
	post := func(h handlerFunc) http.Handler { return headers(cop.Handler(w.answer(sameOrigin(w.log, checked(h))))) }
	get := func(h handlerFunc) http.Handler { return w.handle(checked(h)) }
	mux.Handle("GET /login", get(w.loginPage))
	mux.Handle("POST /login", post(w.login))
	mux.Handle("POST /logout", post(w.logout))
	mux.Handle("GET /login/oidc", get(w.oidcStart))
	mux.Handle("GET "+CallbackPath, get(w.oidcCallback))
	// "continue" is the page after a sign-in, found through the intent cookie: the raw
	// token never sits in a URL parameter or server-side.
	mux.Handle("GET /approve/continue", get(w.continuePage))
	mux.Handle("POST /approve/continue", post(w.continueDecide))
	mux.Handle("GET /approve/{token}", get(w.approvalPage))
	mux.Handle("POST /approve/{token}", post(w.decide))
	if w.console != nil {
		w.registerConsole(mux)
	}
}

// checked refuses, before anything else is read, a page request whose path, query or
// posted fields break input's text rule (badInput): the same rule as the console's and
// the API's, answered with a 400 page that changes nothing.
func checked(next handlerFunc) handlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) error {
		if bad := badInput(r); bad != "" {
			return refuse(http.StatusBadRequest, "neutral.html", page{Title: "Not read", Message: bad + " Nothing was changed."})
		}
		return next(rw, r)
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
func sameOrigin(log *slog.Logger, next handlerFunc) handlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) error {
		if r.Header.Get("Sec-Fetch-Site") == "" && r.Header.Get("Origin") == "" {
			ref, err := url.Parse(r.Header.Get("Referer"))
			if err != nil || ref.Host == "" || ref.Host != r.Host || (ref.Scheme != "http" && ref.Scheme != "https") {
				log.Warn("form post refused", "route", r.Pattern, "reason", "no Origin or Sec-Fetch-Site, and no Referer from this site")
				return refuse(http.StatusForbidden, "neutral.html", page{Title: "Refused",
					Message: "This form was not sent from an airlock page. Nothing was changed. Open the page again and use its buttons."})
			}
		}
		return next(rw, r)
	}
}

// randomValue is an OIDC flow's state or nonce: 32 random bytes, URL-safe base64.
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
	who, err := w.sessions.Person(r.Context(), c.Value)
	if errors.Is(err, accounts.ErrNoSession) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	return &who, nil
}

// RetryAfterSeconds is the Retry-After of the outage page, as of the API's 503.
const RetryAfterSeconds = 2

type page struct {
	Title, Message, Error string
	Link                  string // a console link on the signed-in page
	Person                *approvals.Person
	// Onward are where to go from here (the console, the run): no page is a dead end.
	Onward []pageLink
}

type pageLink struct{ Href, Label string }

// render writes the page name with status; when the template fails nothing is written
// and the error is returned (a 500 by writeError).
func (w *Web) render(rw http.ResponseWriter, status int, name string, data any) error {
	return writeTemplate(rw, pages, status, name, data)
}

// writeTemplate renders into a buffer first, so that a failed template writes nothing.
func writeTemplate(rw http.ResponseWriter, t *template.Template, status int, name string, data any) error {
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, name, data); err != nil {
		return fmt.Errorf("render page %s: %w", name, err)
	}
	rw.Header().Set("Content-Type", "text/html; charset=utf-8")
	rw.WriteHeader(status)
	_, _ = buf.WriteTo(rw)
	return nil
}

// neutral is the one page for unknown, expired and used links: no hint which. (An
// approver of a used or expired link sees its outcome instead: closedPage.)
func neutral(who *approvals.Person) error {
	msg := "The approval link is unknown, has expired, or has already been used. Nothing was changed."
	if who == nil {
		msg += " If you are one of its approvers, sign in and open the link again to see what was decided."
	}
	return refuse(http.StatusNotFound, "neutral.html", page{Title: "This link cannot be used", Message: msg, Person: who})
}

// onward are the links after a decision or on a closed link: the console (and the
// run, for its operators), when the console is on.
func (w *Web) onward(r *http.Request, who *approvals.Person, runKey string) []pageLink {
	if w.console == nil || who == nil {
		return nil
	}
	links := []pageLink{{Href: "/console", Label: "Waiting for me"}}
	c := w.console.Policy.Console
	if runKey != "" && (c.Operators.Has(who.Subject, who.Roles) || c.Admins.Has(who.Subject, who.Roles)) {
		links = append(links, pageLink{Href: "/console/runs?key=" + url.QueryEscape(runKey), Label: "The run's status"})
	}
	return links
}

type closedPage struct {
	page
	Approval store.Approval
	Outcome  string
}

// closedPage is a used or expired link opened by one of its approvers: what was
// decided, by whom and when, and nothing else changes.
func (w *Web) closedPage(rw http.ResponseWriter, r *http.Request, a store.Approval, who *approvals.Person) error {
	p := closedPage{page: page{Title: "Already decided", Person: who, Onward: w.onward(r, who, a.RunKey)}, Approval: a}
	switch {
	case a.ConsumedAt == nil:
		p.Title, p.Outcome = "Expired without a decision", "expired: nobody decided before it lapsed, and nothing was sent on it"
	case a.Decision == approvals.Approve && a.Executor == store.ExecutorAgent:
		p.Outcome = "approved: the agent may make this call once"
	case a.Decision == approvals.Approve:
		p.Outcome = "approved: the action was queued to be sent once"
	case a.Decision == approvals.Reject:
		p.Outcome = "rejected: nothing was sent"
	case a.Decision == approvals.Cancel:
		p.Outcome = "cancelled before it was sent"
	default:
		p.Outcome = a.Decision
	}
	return w.render(rw, http.StatusOK, "closed.html", p)
}

type loginPage struct {
	page
	SSO bool
}

func (w *Web) loginPage(rw http.ResponseWriter, r *http.Request) error {
	who, err := w.person(r)
	if err != nil {
		return err
	}
	if who != nil {
		return w.signedIn(rw, who)
	}
	return w.render(rw, http.StatusOK, "login.html", loginPage{page: page{Title: "Sign in"}, SSO: w.oidc != nil})
}

// loginRefused is the sign-in page again, with why it did not sign in.
func (w *Web) loginRefused(status int, msg string) *refusal {
	return refuse(status, "login.html", loginPage{page: page{Title: "Sign in", Error: msg}, SSO: w.oidc != nil})
}

func (w *Web) signedIn(rw http.ResponseWriter, who *approvals.Person) error {
	p := page{Title: "Signed in", Message: "You are signed in. Open your approval link again.", Person: who}
	if w.console != nil {
		p.Message, p.Link = "You are signed in. Open your approval link again, or the console.", "/console"
	}
	return w.render(rw, http.StatusOK, "neutral.html", p)
}

// startSession starts the server-side session of a sign-in, local or single sign-on
// (accounts.Sessions: only the id's hash is stored), and ends the one the browser held.
func (w *Web) startSession(rw http.ResponseWriter, r *http.Request, who approvals.Person, userID string) error {
	previous := ""
	if c, err := r.Cookie(sessionCookie); err == nil {
		previous = c.Value
	}
	id, err := w.sessions.Start(r.Context(), previous, who, userID)
	if err != nil {
		return fmt.Errorf("create session: %w", err)
	}
	w.setCookie(rw, sessionCookie, id, accounts.SessionLifetime)
	return nil
}

// hasIntent: an approval's place is kept across this sign-in.
func (w *Web) hasIntent(r *http.Request) bool {
	_, err := r.Cookie(intentCookie)
	return err == nil
}

func (w *Web) logout(rw http.ResponseWriter, r *http.Request) error {
	if c, err := r.Cookie(sessionCookie); err == nil && c.Value != "" {
		_ = w.sessions.End(r.Context(), c.Value)
	}
	w.setCookie(rw, sessionCookie, "", -time.Second)
	http.Redirect(rw, r, "/login", http.StatusSeeOther)
	return nil
}

// askLogin keeps the approval's place (its token's hash) in a sealed intent cookie, and
// sends the person to sign in. It writes nothing to the database.
func (w *Web) askLogin(rw http.ResponseWriter, r *http.Request, tokenHash string) error {
	value, err := w.sealIntent(r.Context(), tokenHash)
	if err != nil {
		return fmt.Errorf("keep login intent: %w", err)
	}
	w.setCookie(rw, intentCookie, value, intentLifetime)
	http.Redirect(rw, r, "/login", http.StatusSeeOther)
	return nil
}

type approvalPage struct {
	page
	Approval  store.Approval
	Run       store.Run
	Payload   string
	Action    string
	CanDecide bool
	Why       string
	// Approve is the approve button's words (approveLabel).
	Approve string
	// Recipients are a mail effect's envelope recipients, exactly as they will be sent.
	Recipients []string
	// CSRF is the console's form token (console cards only).
	CSRF string
	// Card is the payload as its connector carries it (card.go); nil: the JSON only.
	Card *effectCard
	// Notes say whether the expiry warning went out and whether it was escalated.
	Notes []approvalNote
	cardContext
}

// notApprover tells a signed-in person that this approval is not theirs to decide, and
// shows nothing of it.
func notApprover(who *approvals.Person, why error) error {
	return refuse(http.StatusForbidden, "neutral.html", page{Title: "You are not an approver of this action",
		Message: strings.ToUpper(why.Error()[:1]) + why.Error()[1:] + ". Nothing was changed; its content is shown only to those who may decide it.", Person: who})
}

// showCard writes the approval card of the token hash, for the person who may decide it,
// with status and errMsg (a decision refused on the card).
func (w *Web) showCard(rw http.ResponseWriter, r *http.Request, tokenHash, action string, who *approvals.Person, status int, errMsg string) error {
	a, run, err := w.approvals.Lookup(r.Context(), tokenHash)
	if errors.Is(err, store.ErrUnavailable) {
		return fmt.Errorf("approval page: %w", err)
	}
	if err != nil {
		if !errors.Is(err, approvals.ErrNotFound) {
			w.log.Error("approval page", "err", err)
			return neutral(who)
		}
		closed, err := w.approvals.Closed(r.Context(), tokenHash, *who)
		if errors.Is(err, store.ErrUnavailable) {
			return fmt.Errorf("approval page: %w", err)
		}
		if err != nil {
			return neutral(who)
		}
		return w.closedPage(rw, r, closed, who)
	}
	// The card, and the draft in it, is for the people who may decide it.
	if err := approvals.May(a, *who); err != nil {
		return notApprover(who, err)
	}
	cc, err := w.cardContext(r.Context(), a)
	if err != nil {
		return fmt.Errorf("approval page: %w", err)
	}
	p := approvalPage{page: page{Title: "Approval", Person: who, Error: errMsg}, Approval: a, Run: run,
		Payload: connector.PrettyJSON(a.Payload), Action: action,
		Recipients: w.approvals.Recipients(a), CanDecide: true, Card: renderCard(a, w.approvals.Action(a.ActionType)), Notes: cardNotes(a), cardContext: cc}
	p.Approve = approveLabel(a, p.Card)
	if strings.HasPrefix(action, "/console/") {
		p.CSRF = csrfToken(r)
	}
	return w.render(rw, status, "approval.html", p)
}

func (w *Web) approvalPage(rw http.ResponseWriter, r *http.Request) error {
	tokenHash := approvals.HashToken(r.PathValue("token"))
	who, err := w.person(r)
	if err != nil {
		return err
	}
	if who == nil {
		if _, _, err := w.approvals.Lookup(r.Context(), tokenHash); errors.Is(err, store.ErrUnavailable) {
			return fmt.Errorf("approval page: %w", err)
		} else if err != nil {
			return neutral(nil)
		}
		return w.askLogin(rw, r, tokenHash)
	}
	return w.showCard(rw, r, tokenHash, r.URL.Path, who, http.StatusOK, "")
}

func (w *Web) continuePage(rw http.ResponseWriter, r *http.Request) error {
	who, err := w.person(r)
	if err != nil {
		return err
	}
	tokenHash, ok := w.openIntent(r)
	switch {
	case !ok:
		return neutral(who)
	case who == nil:
		http.Redirect(rw, r, "/login", http.StatusSeeOther)
		return nil
	}
	return w.showCard(rw, r, tokenHash, "/approve/continue", who, http.StatusOK, "")
}

func (w *Web) decide(rw http.ResponseWriter, r *http.Request) error {
	return w.decideApproval(rw, r, approvals.HashToken(r.PathValue("token")), r.URL.Path)
}

func (w *Web) continueDecide(rw http.ResponseWriter, r *http.Request) error {
	tokenHash, ok := w.openIntent(r)
	if !ok {
		who, err := w.person(r)
		if err != nil {
			return err
		}
		return neutral(who)
	}
	return w.decideApproval(rw, r, tokenHash, "/approve/continue")
}

// decideApproval takes the decision on the approval of tokenHash, through
// approvals.Decide (May, separation of duties, single use). Its refusals are the
// approval pages' own: the not-an-approver page, the card again with why, the
// too-late page, the neutral page.
func (w *Web) decideApproval(rw http.ResponseWriter, r *http.Request, tokenHash, action string) error {
	who, err := w.person(r)
	if err != nil {
		return err
	}
	if who == nil {
		return w.askLogin(rw, r, tokenHash)
	}
	form, bad := postForm(r, formField{name: "decision", label: "decision", max: 20},
		formField{name: "reason", label: "reason", max: 2000, multiline: true})
	if bad != "" {
		return refuse(http.StatusBadRequest, "neutral.html", page{Title: "Not sent", Message: bad + " Nothing was decided.", Person: who})
	}
	decision, reason := form["decision"], strings.TrimSpace(form["reason"])
	if decision == approvals.Reject && reason == "" {
		return w.showCard(rw, r, tokenHash, action, who, http.StatusUnprocessableEntity, "Say why you reject it.")
	}
	a, err := w.approvals.Decide(r.Context(), tokenHash, decision, reason, *who)
	switch {
	case errors.Is(err, approvals.ErrForbidden), errors.Is(err, approvals.ErrSelfApproval):
		return notApprover(who, err)
	case errors.Is(err, approvals.ErrDecisionNotAllowed):
		return w.showCard(rw, r, tokenHash, action, who, http.StatusForbidden, err.Error())
	case errors.Is(err, approvals.ErrTooLate):
		return refuse(http.StatusConflict, "neutral.html", page{Title: "Too late to cancel", Message: err.Error(), Person: who})
	case errors.Is(err, approvals.ErrNotFound):
		return neutral(who)
	case err != nil:
		return fmt.Errorf("decide approval: %w", err)
	}
	msg := "Approved: the action is queued and will be sent once."
	switch {
	case a.Executor == store.ExecutorWorker:
		msg = "Approved: the task is queued for the worker, to be performed once."
	case a.Executor == store.ExecutorAgent && len(bytes.TrimSpace(a.Payload)) > 0 && string(bytes.TrimSpace(a.Payload)) != "null":
		msg = "Approved: the agent may now perform this action, once, with exactly the input shown."
	case a.Executor == store.ExecutorAgent:
		msg = "Approved: the agent may now perform this action, once, with the input it planned (none was shown)."
	}
	switch a.Decision {
	case approvals.Reject:
		msg = "Rejected: nothing will be sent."
	case approvals.Cancel:
		msg = "Cancelled: nothing will be sent."
	}
	return w.render(rw, http.StatusOK, "neutral.html", page{Title: "Decision recorded", Message: msg, Person: who, Onward: w.onward(r, who, a.RunKey)})
}
