package web

import (
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Every page handler writes its page or returns an error, and writeError is the one
// place an error becomes a status and a page, and is logged: an outage is a 503 page
// that says to try again, a refusal (a *refusal, or a console action's domain error in
// ActionStatuses) is its page with its status, and anything else is a 500 whose cause
// is logged once and never shown (it may name hosts, files or SQL).

// handlerFunc is a page: it writes its answer, or returns an error for writeError.
type handlerFunc func(rw http.ResponseWriter, r *http.Request) error

// handle serves a page with the page security headers.
func (w *Web) handle(h handlerFunc) http.Handler { return headers(w.answer(h)) }

// answer runs h and answers its error by writeError.
func (w *Web) answer(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if err := h(rw, r); err != nil {
			w.writeError(rw, r, err)
		}
	})
}

// refusal is an answer other than the page asked for, on the request's merits: a status
// and the page (a template of the sign-in and approval pages, or of the console) that
// says why.
type refusal struct {
	status    int
	templates *template.Template // pages, or consolePages
	name      string
	data      any
	header    http.Header
}

func (e *refusal) Error() string { return fmt.Sprintf("%s (%d)", e.name, e.status) }

// refuse is a refusal with a page of the sign-in and approval pages.
func refuse(status int, name string, data any) *refusal {
	return &refusal{status: status, templates: pages, name: name, data: data}
}

// actionError is a console action's error, with how the console explains it: the
// action's title ("Not resolved") and the page to go back to.
type actionError struct {
	err         error
	v           viewer
	title, back string
}

func (e *actionError) Error() string { return e.err.Error() }
func (e *actionError) Unwrap() error { return e.err }

// ActionStatuses are the refusals a console action explains in the domain's words, with
// the API's status for each (the API's error table is the reference; a test in httpapi
// holds the two to the same status). Anything else is a 500 with the details only logged.
var ActionStatuses = []struct {
	Err    error
	Status int
}{
	{effects.ErrNotFound, http.StatusNotFound},
	{runs.ErrNotFound, http.StatusNotFound},
	{effects.ErrNotResolvable, http.StatusConflict},
	{effects.ErrEffectChanged, http.StatusConflict},
	{failures.ErrNotParked, http.StatusConflict},
	{effects.ErrUnknownActionType, http.StatusUnprocessableEntity},
	{approvals.ErrUnknownApproval, http.StatusNotFound},
	{approvals.ErrNotPending, http.StatusConflict},
	{approvals.ErrNoLink, http.StatusConflict},
}

// statusOf is the status of an error's page.
func statusOf(err error) int {
	var rf *refusal
	if errors.As(err, &rf) {
		return rf.status
	}
	// An outage first: whatever the request was doing, it was not refused on its merits.
	if errors.Is(err, store.ErrUnavailable) {
		return http.StatusServiceUnavailable
	}
	var ae *actionError
	if !errors.As(err, &ae) {
		return http.StatusInternalServerError
	}
	var fe *runs.FieldError
	if errors.As(err, &fe) {
		return http.StatusUnprocessableEntity // a form field: the page's status for bad input
	}
	for _, a := range ActionStatuses {
		if errors.Is(err, a.Err) {
			return a.Status
		}
	}
	return http.StatusInternalServerError
}

// writePage is writeTemplate for writeError: a page that fails to render is a 500.
func (w *Web) writePage(rw http.ResponseWriter, r *http.Request, t *template.Template, status int, name string, data any) {
	if err := writeTemplate(rw, t, status, name, data); err != nil {
		w.log.Error("page", "route", r.Pattern, "err", err)
		http.Error(rw, "internal error", http.StatusInternalServerError)
	}
}

// writeError answers a request whose handler returned err (nothing is written yet).
func (w *Web) writeError(rw http.ResponseWriter, r *http.Request, err error) {
	status := statusOf(err)
	var rf *refusal
	var ae *actionError
	switch {
	case errors.As(err, &rf):
		for k, vs := range rf.header {
			rw.Header()[k] = vs
		}
		w.writePage(rw, r, rf.templates, rf.status, rf.name, rf.data)
	case status == http.StatusServiceUnavailable:
		w.log.Warn("the database is unavailable", "route", r.Pattern, "err", err)
		rw.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
		w.writePage(rw, r, pages, status, "neutral.html", page{Title: "Try again in a moment",
			Message: "airlock cannot use its database just now. Try again in a few seconds: what you sent is safe to send again, and a decision already recorded is not taken twice."})
	case errors.As(err, &ae) && status != http.StatusInternalServerError:
		// The domain's refusal, in its words: its text names what was refused, no secret.
		msg := ae.err.Error()
		w.writePage(rw, r, consolePages, status, "console_message.html", w.messagePage(r, ae.v, ae.title,
			strings.ToUpper(msg[:1])+msg[1:]+". Nothing was changed.", ae.back))
	case ae != nil:
		w.log.Error("console action", "route", r.Pattern, "err", err)
		w.writePage(rw, r, consolePages, status, "console_message.html", w.messagePage(r, ae.v, ae.title,
			"Something went wrong; nothing was changed. The log has the details.", ae.back))
	default:
		w.log.Error("page", "route", r.Pattern, "err", err)
		http.Error(rw, "internal error", http.StatusInternalServerError)
	}
}
