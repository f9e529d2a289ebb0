package web

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/input"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/slack"
	"github.com/airlockhq/airlock/internal/store"
)

// Console is what the operator console acts through: the same domain services as the
// API, so a person's action and an API key's run one implementation.
type Console struct {
	Effects  *effects.Service
	Failures *failures.Service
	Audit    *audit.Service
	Policy   *policy.Policy
	// Slack gives link codes (the Link Slack page); nil or unconfigured: the page says so.
	Slack *slack.Service
}

// EnableConsole serves the operator console at /console (Register adds its routes).
func (w *Web) EnableConsole(c Console) {
	if c.Policy == nil {
		c.Policy = policy.Empty()
	}
	w.console = &c
}

// ConsolePatterns lists the console's routes (the OpenAPI test documents them).
var ConsolePatterns = []string{"GET /console", "GET /console/approvals/{id}", "POST /console/approvals/{id}", "POST /console/approvals/{id}/reissue",
	"GET /console/effects", "POST /console/effects/{id}/resolve", "GET /console/parked", "POST /console/runs/{key}/unpark", "POST /console/runs/{key}/redrive",
	"GET /console/runs", "GET /console/approvals", "GET /console/stuck", "GET /console/kill-switch", "POST /console/kill-switch", "GET /console/week",
	"GET /console/slack", "POST /console/slack/code"}

// consolePageSize is the rows of one page of a console list.
const consolePageSize = 50

// maxReason bounds a reason or a note, as the API does.
const maxReason = 2000

// level is what a console page or action needs.
type level int

const (
	levelPerson   level = iota // anyone signed in: their own approvals
	levelOperator              // console.operators (or admins): effects, parked runs, runs, pending approvals, the week
	levelAdmin                 // console.admins: the kill switch
)

// viewer is the signed-in person and what they may do.
type viewer struct {
	Person   *approvals.Person
	Operator bool
	Admin    bool
	CSRF     string
}

func (v viewer) may(l level) bool {
	switch l {
	case levelAdmin:
		return v.Admin
	case levelOperator:
		return v.Operator
	}
	return v.Person != nil
}

func (w *Web) viewer(r *http.Request) (viewer, bool, error) {
	who, err := w.person(r)
	if who == nil {
		return viewer{}, false, err
	}
	c := w.console.Policy.Console
	v := viewer{Person: who, Admin: c.Admins.Has(who.Subject, who.Roles)}
	v.Operator = v.Admin || c.Operators.Has(who.Subject, who.Roles)
	v.CSRF = csrfToken(r)
	return v, true, nil
}

// csrfToken binds a form to the session: an HMAC of a fixed label under the session
// cookie's value, which only the signed-in browser holds (the database keeps only its
// hash). Every console POST must carry it, on top of the same-origin checks.
func csrfToken(r *http.Request) string {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return ""
	}
	m := hmac.New(sha256.New, []byte(c.Value))
	m.Write([]byte("airlock console form"))
	return hex.EncodeToString(m.Sum(nil))
}

// consoleFrame is what every console page shows around its content.
type consoleFrame struct {
	viewer
	Title, Nav   string
	Notice, Err  string
	Now          time.Time
	Back         string
	Message      string
	BackLabel    string
	ConsoleRoles string
}

var consoleFuncs = template.FuncMap{
	"stamp":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 MST") },
	"stampsec": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") },
	"stampp": func(t *time.Time) string {
		if t == nil {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05 MST")
	},
	"age": func(now, t time.Time) string { return ago(now.Sub(t)) },
	"until": func(now, t time.Time) string {
		if !t.After(now) {
			return "expired"
		}
		return "in " + ago(t.Sub(now))
	},
	"cursor": formatCursor,
	"notes":  rowNotes,
	"answer": answerHTML,
	"shown":  input.Shown,
	"pct": func(f *float64) string {
		if f == nil {
			return "n/a"
		}
		return fmt.Sprintf("%.1f%%", *f*100)
	},
	"effectRow": func(it effectItem, now time.Time, csrf string) any {
		return struct {
			effectItem
			Now  time.Time
			CSRF string
		}{it, now, csrf}
	},
	"secs": func(f *float64) string {
		if f == nil {
			return "n/a"
		}
		return ago(time.Duration(*f * float64(time.Second)))
	},
}

var consolePages = template.Must(template.New("").Funcs(consoleFuncs).ParseFS(templateFS, "templates/console_*.html"))

// answerHTML is an explanation's answer for the page: the text is escaped, and a
// command the CLI writes between backticks (`airlock effects resolve`) shows as code,
// without the backticks.
func answerHTML(s string) template.HTML {
	var b strings.Builder
	for i, part := range strings.Split(s, "`") {
		if i%2 == 1 && part != "" {
			b.WriteString("<code>" + template.HTMLEscapeString(input.Shown(part)) + "</code>")
			continue
		}
		b.WriteString(template.HTMLEscapeString(input.Shown(part)))
	}
	return template.HTML(b.String())
}

// ago is a short, readable duration: 45s, 12m, 3h 5m, 2d 4h.
func ago(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
		fallthrough
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

// formatCursor is a keyset cursor: the last row's time (µs) and id; parseCursor reads it.
func formatCursor(at time.Time, id string) string {
	return strconv.FormatInt(at.UnixMicro(), 10) + "_" + id
}

func parseCursor(s string) store.Cursor {
	at, id, ok := strings.Cut(s, "_")
	us, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil || id == "" {
		return store.Cursor{}
	}
	return store.Cursor{At: time.UnixMicro(us).UTC(), ID: id}
}

// renderConsole is render for a console page.
func (w *Web) renderConsole(rw http.ResponseWriter, status int, name string, data any) error {
	return writeTemplate(rw, consolePages, status, name, data)
}

// messagePage is the console's one page for an outcome, a refusal or an error.
func (w *Web) messagePage(r *http.Request, v viewer, title, msg, back string) consoleFrame {
	return consoleFrame{viewer: v, Title: title, Message: msg, Back: back, Now: w.now(r)}
}

// consoleRefusal is a console request refused on its merits, with the message page.
func (w *Web) consoleRefusal(r *http.Request, v viewer, status int, title, msg, back string) *refusal {
	return &refusal{status: status, templates: consolePages, name: "console_message.html", data: w.messagePage(r, v, title, msg, back)}
}

func (w *Web) now(r *http.Request) time.Time {
	t, err := w.Read(r.Context(), w.store)
	if err != nil {
		return time.Now().UTC()
	}
	return t
}

// consoleHandler is a console page or action for the viewer v: it writes its answer, or
// returns an error for writeError.
type consoleHandler func(rw http.ResponseWriter, r *http.Request, v viewer) error

// consoleView serves a console page to someone signed in with the level it needs;
// anyone else is sent to sign in, or told the page is not for their role.
func (w *Web) consoleView(need level, h consoleHandler) http.Handler {
	return w.handle(func(rw http.ResponseWriter, r *http.Request) error {
		if bad := badInput(r); bad != "" {
			return w.consoleRefusal(r, viewer{}, http.StatusBadRequest, "Not shown", bad+" Nothing was looked up.", "/console")
		}
		v, ok, err := w.viewer(r)
		if err != nil {
			return err
		}
		if !ok {
			http.Redirect(rw, r, "/login", http.StatusSeeOther)
			return nil
		}
		if !v.may(need) {
			return w.consoleRefusal(r, v, http.StatusForbidden, "Not for your role", "This page is for "+levelName(need)+". Nothing is shown.", "/console")
		}
		return h(rw, r, v)
	})
}

// consoleAction is a console action: a same-origin form post (CrossOriginProtection and
// the Referer rule of every page form), from someone signed in, carrying the session's
// form token, by a person whose console role allows it. Anything else is 403 and changes
// nothing.
func (w *Web) consoleAction(need level, h consoleHandler) http.Handler {
	cop := http.NewCrossOriginProtection()
	return headers(cop.Handler(w.answer(sameOrigin(w.log, func(rw http.ResponseWriter, r *http.Request) error {
		if bad := badInput(r); bad != "" {
			return w.consoleRefusal(r, viewer{}, http.StatusBadRequest, "Not changed", bad+" Nothing was changed.", "/console")
		}
		v, ok, err := w.viewer(r)
		if err != nil {
			return err
		}
		if !ok {
			return w.consoleRefusal(r, v, http.StatusForbidden, "Sign in first", "You are not signed in. Nothing was changed.", "/login")
		}
		if got := r.PostFormValue("csrf"); v.CSRF == "" || !hmac.Equal([]byte(got), []byte(v.CSRF)) {
			w.log.Warn("console post refused", "route", r.Pattern, "reason", "missing or wrong form token")
			return w.consoleRefusal(r, v, http.StatusForbidden, "Refused", "This form was not sent from your console page. Nothing was changed. Open the page again and use its buttons.", "/console")
		}
		if !v.may(need) {
			w.log.Warn("console post refused", "route", r.Pattern, "reason", "role", "subject", v.Person.Subject)
			return w.consoleRefusal(r, v, http.StatusForbidden, "Not for your role", "Only "+levelName(need)+" may do this. Nothing was changed.", "/console")
		}
		return h(rw, r, v)
	}))))
}

func levelName(l level) string {
	switch l {
	case levelAdmin:
		return "console admins"
	case levelOperator:
		return "console operators"
	}
	return "people who are signed in"
}

func (w *Web) registerConsole(mux *http.ServeMux) {
	mux.Handle("GET /console", w.consoleView(levelPerson, w.consoleWaiting))
	mux.Handle("GET /console/approvals/{id}", w.consoleView(levelPerson, w.consoleApproval))
	mux.Handle("POST /console/approvals/{id}", w.consoleAction(levelPerson, w.consoleDecide))
	mux.Handle("POST /console/approvals/{id}/reissue", w.consoleAction(levelPerson, w.consoleReissue))
	mux.Handle("GET /console/effects", w.consoleView(levelOperator, w.consoleEffects))
	mux.Handle("POST /console/effects/{id}/resolve", w.consoleAction(levelOperator, w.consoleResolve))
	mux.Handle("GET /console/parked", w.consoleView(levelOperator, w.consoleParked))
	mux.Handle("GET /console/stuck", w.consoleView(levelOperator, w.consoleStuck))
	mux.Handle("POST /console/runs/{key}/unpark", w.consoleAction(levelOperator, w.consoleUnpark))
	mux.Handle("POST /console/runs/{key}/redrive", w.consoleAction(levelOperator, w.consoleRedrive))
	mux.Handle("GET /console/runs", w.consoleView(levelOperator, w.consoleRun))
	mux.Handle("GET /console/approvals", w.consoleView(levelOperator, w.consoleApprovals))
	mux.Handle("GET /console/kill-switch", w.consoleView(levelOperator, w.consoleKillSwitch))
	mux.Handle("POST /console/kill-switch", w.consoleAction(levelAdmin, w.consoleSetKillSwitch))
	mux.Handle("GET /console/week", w.consoleView(levelOperator, w.consoleWeek))
	mux.Handle("GET /console/slack", w.consoleView(levelPerson, w.consoleSlack))
	mux.Handle("POST /console/slack/code", w.consoleAction(levelPerson, w.consoleSlackCode))
}

// actor is how a console action is recorded: the person, and where they acted.
func consoleActor(v viewer) string { return "console:" + v.Person.Subject }

// notices are the fixed messages after an action (no text travels in the URL).
var notices = map[string]string{
	"resolved":    "The effect is resolved; the event records you and your note.",
	"unparked":    "The run is unparked; the event records you and your reason.",
	"released":    "The stalled run is released: the next delivery of its key claims it at once. The event records you and your reason.",
	"given_up":    "The stalled run is given up (failed_terminal); its pending effects are withdrawn. The event records you and your reason.",
	"kill_switch": "The kill switch is changed; the event records you and your reason.",
}

func (w *Web) frame(r *http.Request, v viewer, title, nav string) consoleFrame {
	return consoleFrame{viewer: v, Title: title, Nav: nav, Notice: notices[r.URL.Query().Get("done")], Now: w.now(r)}
}

// formReason is a required one-line reason or note (as the API takes it).
func formReason(r *http.Request, field string) (string, string) {
	s := strings.TrimSpace(r.PostFormValue(field))
	if s == "" {
		return "", "Say why (the " + field + " is required and is recorded with your name)."
	}
	return s, checkField(formField{label: field, max: maxReason}, s)
}

// ---- 1. Waiting for me ----

type waitingPage struct {
	consoleFrame
	Approvals []store.Approval
	Next      string
	Scanned   int
}

// consoleWaiting lists the pending approvals the person may decide, newest first. The
// list is read in keyset pages of every pending approval and filtered by the same rule
// as the card (approvals.May); a page reads at most 10 batches.
func (w *Web) consoleWaiting(rw http.ResponseWriter, r *http.Request, v viewer) error {
	p := waitingPage{consoleFrame: w.frame(r, v, "Waiting for me", "waiting")}
	after := parseCursor(r.URL.Query().Get("after"))
	now := p.Now
	exhausted := false
	for range 10 {
		batch, err := w.store.ApprovalsPending(r.Context(), after, &now, 2*consolePageSize)
		if err != nil {
			return fmt.Errorf("pending approvals: %w", err)
		}
		for _, a := range batch {
			p.Scanned++
			after = store.Cursor{At: a.CreatedAt, ID: a.ID}
			// A cancel link (act_with_window) is not a decision waiting: it is listed on its run.
			if approvals.May(a, *v.Person) == nil && !slices.Equal(a.AllowedDecisions, []string{approvals.Cancel}) {
				p.Approvals = append(p.Approvals, a)
				if len(p.Approvals) == consolePageSize {
					break
				}
			}
		}
		if len(p.Approvals) == consolePageSize {
			break
		}
		if len(batch) < 2*consolePageSize {
			exhausted = true
			break
		}
	}
	if !exhausted {
		p.Next = formatCursor(after.At, after.ID)
	}
	return w.renderConsole(rw, http.StatusOK, "console_waiting.html", p)
}

func (w *Web) consoleApproval(rw http.ResponseWriter, r *http.Request, v viewer) error {
	a, err := w.store.ApprovalByID(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrUnavailable) {
		return fmt.Errorf("approval: %w", err)
	}
	if err != nil {
		return neutral(v.Person)
	}
	return w.showCard(rw, r, a.TokenHash, "/console/approvals/"+a.ID, v.Person, http.StatusOK, "")
}

// consoleDecide decides through the same code as the approval link (approvals.Decide,
// reached by the approval's stored token hash): May, separation of duties, single use.
func (w *Web) consoleDecide(rw http.ResponseWriter, r *http.Request, v viewer) error {
	a, err := w.store.ApprovalByID(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrUnavailable) {
		return fmt.Errorf("approval: %w", err)
	}
	if err != nil {
		return neutral(v.Person)
	}
	return w.decideApproval(rw, r, a.TokenHash, "/console/approvals/"+a.ID)
}

type reissuedPage struct {
	consoleFrame
	Approval store.Approval
	URL      string
}

// consoleReissue gives a pending approval a fresh link through the API's operation
// (approvals.Service.Reissue: the old link dies at once, only the new token's hash is
// stored, event approval_link_reissued). Only one who may decide the approval may.
// The new link is shown once, on this page.
func (w *Web) consoleReissue(rw http.ResponseWriter, r *http.Request, v viewer) error {
	a, err := w.store.ApprovalByID(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrUnavailable) {
		return fmt.Errorf("approval: %w", err)
	}
	if err != nil {
		return neutral(v.Person)
	}
	if err := approvals.May(a, *v.Person); err != nil {
		return notApprover(v.Person, err)
	}
	reissued, err := w.approvals.Reissue(r.Context(), a.ID, consoleActor(v))
	if err != nil {
		return &actionError{err: err, v: v, title: "No new link", back: "/console"}
	}
	if slices.Contains(reissued.Approval.AllowedDecisions, approvals.Approve) {
		w.approvals.Notify(context.WithoutCancel(r.Context()), reissued, w.log)
	}
	return w.renderConsole(rw, http.StatusOK, "console_reissued.html", reissuedPage{consoleFrame: w.frame(r, v, "New approval link", "waiting"), Approval: reissued.Approval, URL: reissued.URL})
}

// ---- 2. Unknown and failed effects ----

type effectsPage struct {
	consoleFrame
	Unknown, Failed         []effectItem
	NextUnknown, NextFailed string
	AfterUnknown            string
	AfterFailed             string
	// Waiting are the effects due for UnsentAfter or longer that no sender has taken
	// (the first page, the longest due first); WaitingMore: there are more.
	Waiting     []store.Effect
	WaitingMore bool
	UnsentAfter string
}

func (w *Web) consoleEffects(rw http.ResponseWriter, r *http.Request, v viewer) error {
	p := effectsPage{consoleFrame: w.frame(r, v, "Unknown and failed effects", "effects")}
	q := r.URL.Query()
	p.AfterUnknown, p.AfterFailed = q.Get("unknown_after"), q.Get("failed_after")
	list := func(state store.EffectState, after string) ([]store.Effect, string, error) {
		effs, err := w.store.EffectsInState(r.Context(), state, parseCursor(after), consolePageSize+1)
		if err != nil || len(effs) <= consolePageSize {
			return effs, "", err
		}
		effs = effs[:consolePageSize]
		last := effs[len(effs)-1]
		return effs, formatCursor(last.UpdatedAt, last.ID), nil
	}
	unknown, nextUnknown, err := list(store.EffectUnknown, p.AfterUnknown)
	if err != nil {
		return fmt.Errorf("effects: %w", err)
	}
	failed, nextFailed, err := list(store.EffectFailed, p.AfterFailed)
	if err != nil {
		return fmt.Errorf("effects: %w", err)
	}
	p.NextUnknown, p.NextFailed = nextUnknown, nextFailed
	if p.Unknown, err = w.effectItems(r.Context(), unknown); err != nil {
		return fmt.Errorf("effects: %w", err)
	}
	if p.Failed, err = w.effectItems(r.Context(), failed); err != nil {
		return fmt.Errorf("effects: %w", err)
	}
	if p.Waiting, err = w.store.EffectsWaiting(r.Context(), p.Now.Add(-UnsentAfter), consolePageSize+1); err != nil {
		return fmt.Errorf("effects waiting: %w", err)
	}
	if len(p.Waiting) > consolePageSize {
		p.Waiting, p.WaitingMore = p.Waiting[:consolePageSize], true
	}
	p.UnsentAfter = ago(UnsentAfter)
	return w.renderConsole(rw, http.StatusOK, "console_effects.html", p)
}

func (w *Web) consoleResolve(rw http.ResponseWriter, r *http.Request, v viewer) error {
	note, bad := formReason(r, "note")
	if bad != "" {
		return w.consoleRefusal(r, v, http.StatusUnprocessableEntity, "Not resolved", bad+" Nothing was changed.", "/console/effects")
	}
	outcome, provider := r.PostFormValue("outcome"), strings.TrimSpace(r.PostFormValue("provider_id"))
	noID := outcome == "sent_no_id" // the form's "sent: the provider gave no id"
	if noID {
		outcome = effects.OutcomeSent
	}
	if outcome != effects.OutcomeSent || noID {
		provider = "" // the field is on every form; only "sent" with an id takes it
	}
	// The version the page showed: a decision on a row that changed since is refused.
	version, perr := strconv.ParseInt(r.PostFormValue("version"), 10, 64)
	if perr != nil || version < 1 {
		return w.consoleRefusal(r, v, http.StatusUnprocessableEntity, "Not resolved", "The form is missing the effect's version: reload the page. Nothing was changed.", "/console/effects")
	}
	_, err := w.console.Effects.Resolve(r.Context(), r.PathValue("id"),
		effects.Resolution{Outcome: outcome, ProviderID: provider, NoProviderID: noID, Note: note, Version: version}, consoleActor(v))
	if err != nil {
		return &actionError{err: err, v: v, title: "Not resolved", back: "/console/effects"}
	}
	http.Redirect(rw, r, "/console/effects?done=resolved", http.StatusSeeOther)
	return nil
}

// ---- 3. Parked runs ----

type parkedPage struct {
	consoleFrame
	Runs  []parkedRun
	Next  string
	After string
}

// parkedRun is a parked run with what parked it: the failure or the mismatch event's
// summary, and the detail its client gave.
type parkedRun struct {
	store.Run
	Failure  string
	Detail   string
	FailedAt *time.Time
}

func (w *Web) consoleParked(rw http.ResponseWriter, r *http.Request, v viewer) error {
	p := parkedPage{consoleFrame: w.frame(r, v, "Parked runs", "parked"), After: r.URL.Query().Get("after")}
	rs, err := w.store.RunsParked(r.Context(), parseCursor(p.After), consolePageSize+1)
	if err != nil {
		return fmt.Errorf("parked runs: %w", err)
	}
	if len(rs) > consolePageSize {
		rs = rs[:consolePageSize]
		last := rs[len(rs)-1]
		p.Next = formatCursor(last.UpdatedAt, last.Key)
	}
	for _, run := range rs {
		pr, err := w.parkedDetail(r.Context(), run)
		if err != nil {
			return fmt.Errorf("parked runs: %w", err)
		}
		p.Runs = append(p.Runs, pr)
	}
	return w.renderConsole(rw, http.StatusOK, "console_parked.html", p)
}

type stuckPage struct {
	consoleFrame
	Approvals []store.Approval
	Next      string
}

// consoleStuck lists the pending approvals nobody known can decide, newest first.
func (w *Web) consoleStuck(rw http.ResponseWriter, r *http.Request, v viewer) error {
	p := stuckPage{consoleFrame: w.frame(r, v, "Stuck approvals", "stuck")}
	aps, err := w.approvals.Undecidable(r.Context(), parseCursor(r.URL.Query().Get("after")), consolePageSize+1)
	if err != nil {
		return fmt.Errorf("stuck approvals: %w", err)
	}
	if len(aps) > consolePageSize {
		aps = aps[:consolePageSize]
		last := aps[len(aps)-1]
		p.Next = formatCursor(last.CreatedAt, last.ID)
	}
	p.Approvals = aps
	return w.renderConsole(rw, http.StatusOK, "console_stuck.html", p)
}

// parkedDetail finds the last event that parked the run: a failure (unknown_commit) or
// an input_mismatch. A run's events are read in pages, at most ten.
func (w *Web) parkedDetail(ctx context.Context, run store.Run) (parkedRun, error) {
	pr := parkedRun{Run: run}
	for after, pages := int64(0), 0; pages < 10; pages++ {
		evs, err := w.store.EventList(ctx, run.Key, after, 1000)
		if err != nil {
			return pr, fmt.Errorf("events of %q: %w", run.Key, err)
		}
		for _, e := range evs {
			if e.Kind != string(store.EventInputMismatch) && e.Kind != string(store.EventFailure) {
				continue
			}
			var d struct {
				Detail string `json:"detail"`
			}
			_ = json.Unmarshal(e.Detail, &d)
			at := e.At
			pr.Failure, pr.Detail, pr.FailedAt = audit.Summary(e), d.Detail, &at
		}
		if len(evs) < 1000 {
			break
		}
		after = evs[len(evs)-1].ID
	}
	return pr, nil
}

func (w *Web) consoleUnpark(rw http.ResponseWriter, r *http.Request, v viewer) error {
	reason, bad := formReason(r, "reason")
	if bad != "" {
		return w.consoleRefusal(r, v, http.StatusUnprocessableEntity, "Not unparked", bad+" Nothing was changed.", "/console/parked")
	}
	_, err := w.console.Failures.Unpark(r.Context(), r.PathValue("key"), store.State(r.PostFormValue("to")), reason, consoleActor(v))
	if err != nil {
		return &actionError{err: err, v: v, title: "Not unparked", back: "/console/parked"}
	}
	http.Redirect(rw, r, "/console/parked?done=unparked", http.StatusSeeOther)
	return nil
}

// consoleRedrive ends a stalled run's stall (failures.Redrive): released for its
// redelivery (failed_retryable) or given up (failed_terminal).
func (w *Web) consoleRedrive(rw http.ResponseWriter, r *http.Request, v viewer) error {
	key := r.PathValue("key")
	back := "/console/runs?key=" + url.QueryEscape(key)
	reason, bad := formReason(r, "reason")
	if bad != "" {
		return w.consoleRefusal(r, v, http.StatusUnprocessableEntity, "Not re-driven", bad+" Nothing was changed.", back)
	}
	to := store.State(r.PostFormValue("to"))
	_, err := w.console.Failures.Redrive(r.Context(), key, to, reason, consoleActor(v))
	if errors.Is(err, failures.ErrNotStalled) {
		return w.consoleRefusal(r, v, http.StatusConflict, "Not re-driven", strings.TrimPrefix(err.Error(), "re-drive "+strconv.Quote(key)+": ")+". Nothing was changed.", back)
	}
	if err != nil {
		return &actionError{err: err, v: v, title: "Not re-driven", back: back}
	}
	done := "released"
	if to == store.StateFailedTerminal {
		done = "given_up"
	}
	http.Redirect(rw, r, back+"&done="+done, http.StatusSeeOther)
	return nil
}

// ---- 4. Run ----

type runPage struct {
	consoleFrame
	Key     string
	Found   bool
	X       audit.Explanation
	Parked  bool
	Approve []store.Approval
	// Stalled: processing with its lease lapsed; the page offers the re-drive.
	Stalled bool
	// Protocol is the rerun protocol, for the operator deciding how to run work again.
	Protocol string
}

func (w *Web) consoleRun(rw http.ResponseWriter, r *http.Request, v viewer) error {
	p := runPage{consoleFrame: w.frame(r, v, "Run", "runs"), Key: strings.TrimSpace(r.URL.Query().Get("key")), Protocol: runs.RerunProtocol}
	if p.Key == "" {
		return w.consoleRuns(rw, r, v) // no key: the list of runs, to pick one
	}
	x, err := w.console.Audit.Explain(r.Context(), p.Key)
	switch {
	case errors.Is(err, runs.ErrNotFound):
		p.Err = "No run has the key " + strconv.Quote(p.Key) + "."
	case err != nil:
		return fmt.Errorf("explain: %w", err)
	default:
		p.Found, p.X, p.Title = true, x, "Run "+p.Key
		p.Parked = x.Processed.State == store.StateAwaitingHuman && slices.Contains(store.ParkReasons, x.Processed.ParkReason)
		p.Stalled = x.Processed.State == store.StateProcessing && !x.Processed.LeaseLive
	}
	status := http.StatusOK
	if !p.Found {
		status = http.StatusNotFound
	}
	return w.renderConsole(rw, status, "console_run.html", p)
}

// ---- 5. Kill switch ----

type killSwitchPage struct {
	consoleFrame
	EnvDisabled bool
	Global      *store.KillSwitch
	Actions     []killSwitchRow
	// The fleet: the database's writer level and the registered writers (what sends,
	// and which binary does it).
	Level     int
	Instances []instanceRow
}

type instanceRow struct {
	store.Instance
	Live   bool // seen within store.InstanceLiveWithin
	Behind bool // below the database's writer level: writes nothing
}

type killSwitchRow struct {
	Type    string
	Setting *store.KillSwitch
}

func (w *Web) consoleKillSwitch(rw http.ResponseWriter, r *http.Request, v viewer) error {
	p := killSwitchPage{consoleFrame: w.frame(r, v, "Kill switch", "kill")}
	switches, env, err := w.console.Effects.KillSwitch(r.Context())
	if err != nil {
		return fmt.Errorf("kill switch: %w", err)
	}
	p.EnvDisabled = env
	byScope := map[string]*store.KillSwitch{}
	for i := range switches {
		byScope[switches[i].Scope] = &switches[i]
	}
	p.Global = byScope[effects.GlobalScope]
	for _, t := range w.console.Policy.ActionTypes() {
		p.Actions = append(p.Actions, killSwitchRow{Type: t, Setting: byScope[effects.ActionScope(t)]})
	}
	if p.Level, err = w.store.WriterLevelGet(r.Context()); err != nil {
		return fmt.Errorf("kill switch: %w", err)
	}
	ins, err := w.store.InstanceList(r.Context(), time.Time{})
	if err != nil {
		return fmt.Errorf("kill switch: %w", err)
	}
	now, err := w.store.Clock(r.Context()) // the clock that stamped last_seen
	if err != nil {
		return fmt.Errorf("kill switch: %w", err)
	}
	for _, in := range ins {
		p.Instances = append(p.Instances, instanceRow{Instance: in, Live: now.Sub(in.LastSeen) <= store.InstanceLiveWithin, Behind: in.Level < p.Level})
	}
	return w.renderConsole(rw, http.StatusOK, "console_killswitch.html", p)
}

func (w *Web) consoleSetKillSwitch(rw http.ResponseWriter, r *http.Request, v viewer) error {
	reason, bad := formReason(r, "reason")
	if bad != "" {
		return w.consoleRefusal(r, v, http.StatusUnprocessableEntity, "Not changed", bad+" Nothing was changed.", "/console/kill-switch")
	}
	var enabled bool
	switch r.PostFormValue("enabled") {
	case "true":
		enabled = true
	case "false":
	default:
		return w.consoleRefusal(r, v, http.StatusUnprocessableEntity, "Not changed", "Choose enable or disable. Nothing was changed.", "/console/kill-switch")
	}
	if err := w.console.Effects.SetKillSwitch(r.Context(), r.PostFormValue("scope"), enabled, reason, consoleActor(v)); err != nil {
		return &actionError{err: err, v: v, title: "Not changed", back: "/console/kill-switch"}
	}
	http.Redirect(rw, r, "/console/kill-switch?done=kill_switch", http.StatusSeeOther)
	return nil
}

// ---- 6. This week ----

type weekPage struct {
	consoleFrame
	R      audit.Report
	Charts []template.HTML
	// StoppedAll: nothing is sent (the global setting, or AI_ACTIONS_ENABLED=false in
	// this process); StoppedTypes are the action types stopped on their own.
	StoppedAll   bool
	StoppedTypes []string
	// Outstanding now, besides the effects: pending approvals and parked runs, each
	// counted up to outstandingCap. Undecidable is the approvals nobody can decide
	// (counted exactly, on the approvals_undecidable partial index).
	Pending, Parked count
	Undecidable     *count
	trouble
	UnsentAfter string
	// Deliveries is every delivery the week saw: the claims plus the duplicates refused.
	Deliveries int64
}

// weeks is how many past weeks the charts show.
const weeks = 6

func (w *Web) consoleWeek(rw http.ResponseWriter, r *http.Request, v viewer) error {
	p := weekPage{consoleFrame: w.frame(r, v, "This week", "week")}
	// Reports over 1…weeks weeks back; a week's counts are the difference of two.
	cumulative := make([]audit.Report, weeks+1)
	for i := 1; i <= weeks; i++ {
		rep, err := w.console.Audit.Report(r.Context(), p.Now.Add(-time.Duration(i)*7*24*time.Hour))
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		cumulative[i] = rep
	}
	p.R = cumulative[1]
	p.Charts = weekCharts(cumulative, p.Now)
	_, env, err := w.console.Effects.KillSwitch(r.Context())
	if err != nil {
		return fmt.Errorf("kill switch: %w", err)
	}
	if p.Pending, p.Parked, err = w.outstanding(r.Context(), p.Now); err != nil {
		return err
	}
	n, err := w.store.ApprovalsUndecidableCount(r.Context(), &p.Now)
	if err != nil {
		return fmt.Errorf("undecidable approvals: %w", err)
	}
	p.Undecidable = &count{N: n}
	if p.trouble, err = w.troubleNow(r.Context(), p.Now, p.R.Since); err != nil {
		return err
	}
	p.UnsentAfter = ago(UnsentAfter)
	p.Deliveries = p.R.Claims + p.R.Duplicates
	p.StoppedAll = env || !p.R.KillSwitch.Enabled
	for _, scope := range p.R.KillSwitch.DisabledScopes {
		if t, ok := strings.CutPrefix(scope, "action:"); ok {
			p.StoppedTypes = append(p.StoppedTypes, t)
		}
	}
	return w.renderConsole(rw, http.StatusOK, "console_week.html", p)
}

// ---- Link Slack ----

type slackPage struct {
	consoleFrame
	Configured bool
	Code       string
	Expires    time.Time
}

func (w *Web) slackConfigured() bool {
	s := w.console.Slack
	return s != nil && s.Policy != nil && s.Policy.Slack != nil && s.Policy.Slack.SigningSecret != ""
}

// consoleSlack is the Link Slack page: the signed-in person asks for a one-time code.
func (w *Web) consoleSlack(rw http.ResponseWriter, r *http.Request, v viewer) error {
	return w.renderConsole(rw, http.StatusOK, "console_slack.html", slackPage{consoleFrame: w.frame(r, v, "Link Slack", "slack"),
		Configured: w.slackConfigured()})
}

// consoleSlackCode gives the signed-in person a one-time link code, shown once (only its
// hash is stored): the link completes when the same code comes back in a Slack request
// signed with the app's secret (/airlock link CODE).
func (w *Web) consoleSlackCode(rw http.ResponseWriter, r *http.Request, v viewer) error {
	p := slackPage{consoleFrame: w.frame(r, v, "Link Slack", "slack"), Configured: w.slackConfigured()}
	if !p.Configured {
		return w.renderConsole(rw, http.StatusNotFound, "console_slack.html", p)
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return w.consoleRefusal(r, v, http.StatusForbidden, "Sign in first", "You are not signed in. Nothing was changed.", "/login")
	}
	who, account, err := w.sessions.Account(r.Context(), c.Value)
	if err != nil {
		return fmt.Errorf("link slack: %w", err)
	}
	p.Code, p.Expires, err = w.console.Slack.NewCode(r.Context(), who.Subject, account)
	if err != nil {
		return fmt.Errorf("link slack: %w", err)
	}
	return w.renderConsole(rw, http.StatusOK, "console_slack.html", p)
}
