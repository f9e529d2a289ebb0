package approvals_test

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/accounts"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// stuckPolicy: refunds are decided by finance within 2h; the approvers are warned 30m
// before the approval lapses, and after 1h lead may decide too. Both steps are announced
// on the chat webhook.
const stuckPolicy = `
notify:
  webhooks:
    chat: {format: slack, url_env: CHAT_URL}
actions:
  refund:
    connector: worker
    approvers: {roles: [finance]}
    approval_ttl: 2h
    approval: {warn_before: 30m, escalate: {after: 1h, roles: [lead]}}
    notify: [chat]
`

// chat is a webhook receiver that keeps the titles of the cards posted to it.
type chat struct {
	mu     sync.Mutex
	titles []string
	bodies []string
}

func (c *chat) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var m struct {
		Blocks []struct {
			Type string `json:"type"`
			Text struct {
				Text string `json:"text"`
			} `json:"text"`
		} `json:"blocks"`
	}
	_ = json.Unmarshal(b, &m)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bodies = append(c.bodies, string(b))
	for _, bl := range m.Blocks {
		if bl.Type == "header" {
			c.titles = append(c.titles, bl.Text.Text)
		}
	}
}

func (c *chat) posted() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.bodies)
}

func (c *chat) seen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.titles)
}

type stuckEnv struct {
	*apptest.EffectsEnv
	pol  *policy.Policy
	svc  *approvals.Service // instance 1
	svc2 *approvals.Service // instance 2, over its own connection to the same database
	chat *chat
}

func newStuckEnv(t *testing.T, b storetest.Backend) *stuckEnv {
	e := &stuckEnv{EffectsEnv: apptest.NewEffectsEnv(t, b, ""), chat: &chat{}}
	srv := httptest.NewServer(e.chat)
	t.Cleanup(srv.Close)
	pol, err := policy.Parse([]byte(stuckPolicy), func(k string) (string, bool) { return srv.URL, k == "CHAT_URL" })
	if err != nil {
		t.Fatal(err)
	}
	e.pol = pol
	for _, svc := range []**approvals.Service{&e.svc, &e.svc2} {
		st := e.Store
		if svc == &e.svc2 {
			st = storetest.Reopen(t, e.Store, e.Clock)
		}
		base := runs.Base{Store: st, Policy: pol, Clock: runs.Clock{Now: e.Clock.Now}, Alerts: e.Alerts}
		outbox, err := effects.NewOutbox(base)
		if err != nil {
			t.Fatal(err)
		}
		if *svc, err = approvals.New(base, approvals.Config{Outbox: outbox, PublicURL: "http://airlock.test"}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { e.svc.WaitNotifications(); e.svc2.WaitNotifications() })
	return e
}

// request opens a refund approval on a new run key, asked for by requester.
func (e *stuckEnv) request(t *testing.T, key, requester string) approvals.Requested {
	t.Helper()
	r := e.ClaimRun(t, key)
	var out approvals.Requested
	err := e.Store.Transact(ctx, func(q store.Queries) error {
		var err error
		out, err = e.svc.Request(ctx, q, r, approvals.Proposed{ActionType: "refund", Target: "default",
			EffectID: "refund-1", Executor: store.ExecutorWorker, Payload: json.RawMessage(`{"amount":12}`), PayloadHash: "h"},
			approvals.Ask{Action: e.pol.Action("refund"), By: approvals.NewRequester("apikey:n8n", "", requester), Actor: "apikey:n8n",
				Meta: &runs.Meta{RequestedBy: requester}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	e.svc.Notify(ctx, out, slog.New(slog.DiscardHandler))
	return out
}

func (e *stuckEnv) count(t *testing.T, key string, kind store.EventKind) int {
	t.Helper()
	n := 0
	for _, k := range e.Kinds(t, key) {
		if k == string(kind) {
			n++
		}
	}
	return n
}

func (e *stuckEnv) listed(t *testing.T) []string {
	t.Helper()
	aps, err := e.svc.Undecidable(ctx, store.Cursor{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, a := range aps {
		keys = append(keys, a.RunKey)
	}
	now := e.Clock.Now()
	n, err := e.Store.ApprovalsUndecidableCount(ctx, &now)
	if err != nil || n != len(keys) {
		t.Fatalf("count %d, list %v: %v", n, keys, err)
	}
	return keys
}

func (e *stuckEnv) sweep(t *testing.T) {
	t.Helper()
	for _, s := range []*approvals.Service{e.svc, e.svc2} {
		if err := s.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Approvals nobody can decide, expiry warnings and escalations, each test on both
// stores.
func TestUndecidableEpisodes(t *testing.T)                      { eachStuck(t, testUndecidableEpisodes) }
func TestUndecidableBySeparationOfDuties(t *testing.T)          { eachStuck(t, testUndecidableBySoD) }
func TestSingleSignOnHolders(t *testing.T)                      { eachStuck(t, testSingleSignOnHolders) }
func TestUndecidableOncePerEpisodeAcrossInstances(t *testing.T) { eachStuck(t, testUndecidableRace) }
func TestExpiryWarningOnceAcrossInstances(t *testing.T)         { eachStuck(t, testWarningRace) }
func TestEscalationOnceAndMayHonoursIt(t *testing.T)            { eachStuck(t, testEscalation) }

// eachStuck runs fn on every backend with a fresh stuckEnv.
func eachStuck(t *testing.T, fn func(t *testing.T, e *stuckEnv)) {
	t.Helper()
	storetest.Each(t, func(t *testing.T, b storetest.Backend) { fn(t, newStuckEnv(t, b)) })
}

func testUndecidableEpisodes(t *testing.T, e *stuckEnv) {
	r := e.request(t, "refund-a", "ana")
	if r.Approval.UndecidableSince == nil {
		t.Fatal("nobody holds finance, and the new approval is not marked undecidable")
	}
	apptest.Equal(t, "events at creation", e.Kinds(t, "refund-a"), []string{"claimed", "approval_requested", "approval_undecidable", "alert"})
	apptest.Equal(t, "listed", e.listed(t), []string{"refund-a"})
	e.sweep(t)
	e.sweep(t)
	apptest.Equal(t, "events after sweeps", e.count(t, "refund-a", store.EventApprovalUndecidable), 1)
	if !slices.Contains(e.Alerts.Kinds(), "approval_undecidable:refund-a") {
		t.Fatalf("no alert: %v", e.Alerts.Kinds())
	}

	// Someone gets the role: the episode ends, with no new event.
	e.AddApprover(t, "fin", "finance")
	e.sweep(t)
	apptest.Equal(t, "listed with an approver", e.listed(t), []string(nil))
	apptest.Equal(t, "events", e.count(t, "refund-a", store.EventApprovalUndecidable), 1)

	// A new approval with that approver is decidable from the start.
	e.Clock.Advance(time.Minute) // the list is newest first
	if r := e.request(t, "refund-b", "ana"); r.Approval.UndecidableSince != nil {
		t.Fatal("an approval finance can decide is marked undecidable")
	}

	// The account is disabled: a second episode, one more event each.
	acc := accounts.Accounts{Store: e.Store, Actor: "cli:test"}
	if _, err := acc.Disable(ctx, "fin"); err != nil {
		t.Fatal(err)
	}
	e.sweep(t)
	e.sweep(t)
	apptest.Equal(t, "listed after the disable", e.listed(t), []string{"refund-b", "refund-a"})
	apptest.Equal(t, "events, second episode", e.count(t, "refund-a", store.EventApprovalUndecidable), 2)
	apptest.Equal(t, "events of b", e.count(t, "refund-b", store.EventApprovalUndecidable), 1)

	// Decided or lapsed approvals leave the list.
	e.Clock.Advance(2*time.Hour + time.Second)
	e.sweep(t)
	apptest.Equal(t, "listed after expiry", e.listed(t), []string(nil))
}

func testUndecidableBySoD(t *testing.T, e *stuckEnv) {
	e.AddApprover(t, "ana", "finance")
	// ana is the only holder of finance and asked for it herself: nobody may decide.
	if r := e.request(t, "refund-sod", "ＡＮＡ"); r.Approval.UndecidableSince == nil {
		t.Fatal("only the requester holds the role, and the approval is not marked undecidable")
	}
	if r := e.request(t, "refund-other", "bob"); r.Approval.UndecidableSince != nil {
		t.Fatal("ana may decide bob's request, yet it is marked undecidable")
	}
	apptest.Equal(t, "listed", e.listed(t), []string{"refund-sod"})
}

func testSingleSignOnHolders(t *testing.T, e *stuckEnv) {
	sessions := accounts.Sessions{Store: e.Store, Clock: runs.Clock{Now: e.Clock.Now}}
	if _, err := sessions.Start(ctx, "", approvals.Person{Subject: "olga@example.com", Roles: []string{"finance"}}, ""); err != nil {
		t.Fatal(err)
	}
	if r := e.request(t, "refund-sso", "ana"); r.Approval.UndecidableSince != nil {
		t.Fatal("olga signed in by SSO with finance, yet the approval is undecidable")
	}
	// Past the horizon her last sign-in no longer counts.
	e.Clock.Advance(approvals.PeopleHorizon + time.Hour)
	if r := e.request(t, "refund-late", "ana"); r.Approval.UndecidableSince == nil {
		t.Fatal("a sign-in older than the horizon still counts")
	}
	// She signs in again without the role: still nobody.
	if _, err := sessions.Start(ctx, "", approvals.Person{Subject: "olga@example.com", Roles: []string{"support"}}, ""); err != nil {
		t.Fatal(err)
	}
	e.sweep(t)
	apptest.Equal(t, "listed", e.listed(t), []string{"refund-late"})
	// And with it: decidable again.
	if _, err := sessions.Start(ctx, "", approvals.Person{Subject: "olga@example.com", Roles: []string{"finance"}}, ""); err != nil {
		t.Fatal(err)
	}
	e.sweep(t)
	apptest.Equal(t, "listed after her sign-in with finance", e.listed(t), []string(nil))
}

// barrier makes both instances reach point before either goes on.
func barrier(point string, s1, s2 *approvals.Service) {
	var wg sync.WaitGroup
	wg.Add(2)
	var once [2]sync.Once
	for i, s := range []*approvals.Service{s1, s2} {
		s.Hook = func(p string) {
			if p == point {
				once[i].Do(func() { wg.Done(); wg.Wait() })
			}
		}
	}
}

// both runs fn on the two instances at once.
func both(t *testing.T, e *stuckEnv, fn func(*approvals.Service) error) {
	t.Helper()
	errs := make(chan error, 2)
	for _, s := range []*approvals.Service{e.svc, e.svc2} {
		go func() { errs <- fn(s) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func testUndecidableRace(t *testing.T, e *stuckEnv) {
	e.AddApprover(t, "fin", "finance")
	rr := e.request(t, "refund-race", "ana")
	t.Logf("at creation: %v; kinds %v", rr.Approval.UndecidableSince, e.Kinds(t, "refund-race"))
	acc := accounts.Accounts{Store: e.Store, Actor: "cli:test"}
	if _, err := acc.Disable(ctx, "fin"); err != nil {
		t.Fatal(err)
	}
	// Both instances list the approval as unmarked before either marks it.
	barrier("undecidable_listed", e.svc, e.svc2)
	both(t, e, func(s *approvals.Service) error { return s.CheckUndecidable(ctx) })
	apptest.Equal(t, "events", e.Kinds(t, "refund-race"), []string{"claimed", "approval_requested", "approval_undecidable", "alert"})
}

func testWarningRace(t *testing.T, e *stuckEnv) {
	e.AddApprover(t, "fin", "finance")
	r := e.request(t, "refund-warn", "ana")
	decided := e.request(t, "refund-decided", "ana")
	if _, err := e.svc.Decide(ctx, approvals.HashToken(decided.Token), approvals.Approve, "", approvals.Person{Subject: "fin", Roles: []string{"finance"}}); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(90*time.Minute - time.Second) // a second before warn_at (expires at +2h, warn 30m before)
	e.sweep(t)
	apptest.Equal(t, "warnings before warn_at", e.count(t, "refund-warn", store.EventApprovalExpiryWarning), 0)
	e.Clock.Advance(time.Second)
	barrier("approval_steps_listed", e.svc, e.svc2)
	both(t, e, func(s *approvals.Service) error { return s.WarnDue(ctx) })
	e.svc.Hook, e.svc2.Hook = nil, nil
	e.sweep(t)
	apptest.Equal(t, "warnings", e.count(t, "refund-warn", store.EventApprovalExpiryWarning), 1)
	apptest.Equal(t, "warnings of a decided approval", e.count(t, "refund-decided", store.EventApprovalExpiryWarning), 0)
	e.svc.WaitNotifications()
	e.svc2.WaitNotifications()
	warned := 0
	for _, title := range e.chat.seen() {
		if title == "Approval expires soon: refund" {
			warned++
		}
	}
	apptest.Equal(t, "warning posts", warned, 1)
	for _, body := range e.chat.posted() {
		if strings.Contains(body, r.Token) || strings.Contains(body, "/approve/") {
			t.Fatalf("a chat post carries the approval link's token: %s", body)
		}
	}
	if !slices.Contains(e.Alerts.Kinds(), "approval_expiry_warning:refund-warn") {
		t.Fatalf("no alert: %v", e.Alerts.Kinds())
	}
	a, err := e.Store.ApprovalByID(ctx, r.Approval.ID)
	if err != nil || a.WarnedAt == nil {
		t.Fatalf("warned_at: %+v %v", a.WarnedAt, err)
	}
	// The warning changes nothing else: it may still be decided.
	if _, err := e.svc.Decide(ctx, approvals.HashToken(r.Token), approvals.Approve, "", approvals.Person{Subject: "fin", Roles: []string{"finance"}}); err != nil {
		t.Fatalf("decide after the warning: %v", err)
	}
}

func testEscalation(t *testing.T, e *stuckEnv) {
	e.AddApprover(t, "lea", "lead")
	r := e.request(t, "refund-esc", "ana")
	own := e.request(t, "refund-own", "lea") // lea asked for this one herself
	lea := approvals.Person{Subject: "lea", Roles: []string{"lead"}}
	if err := approvals.May(r.Approval, lea); !errors.Is(err, approvals.ErrForbidden) {
		t.Fatalf("lead decides before the escalation: %v", err)
	}
	if r.Approval.UndecidableSince == nil {
		t.Fatal("before the escalation only lead could decide, yet the approval is not undecidable")
	}
	e.Clock.Advance(time.Hour - time.Second)
	e.sweep(t)
	if _, err := e.svc.Decide(ctx, approvals.HashToken(r.Token), approvals.Approve, "", lea); !errors.Is(err, approvals.ErrForbidden) {
		t.Fatalf("lead decides a second before the escalation: %v", err)
	}
	e.Clock.Advance(time.Second)
	barrier("approval_steps_listed", e.svc, e.svc2)
	both(t, e, func(s *approvals.Service) error { return s.EscalateDue(ctx) })
	e.svc.Hook, e.svc2.Hook = nil, nil
	e.sweep(t)
	apptest.Equal(t, "escalations", e.count(t, "refund-esc", store.EventApprovalEscalated), 1)
	a, err := e.Store.ApprovalByID(ctx, r.Approval.ID)
	if err != nil || a.EscalatedAt == nil {
		t.Fatalf("escalated_at: %+v %v", a, err)
	}
	if err := approvals.May(a, lea); err != nil {
		t.Fatalf("lead may not decide after the escalation: %v", err)
	}
	// Separation of duties still holds for the escalation role.
	ownA, _ := e.Store.ApprovalByID(ctx, own.Approval.ID)
	if err := approvals.May(ownA, lea); !errors.Is(err, approvals.ErrSelfApproval) {
		t.Fatalf("lea decides her own request after the escalation: %v", err)
	}
	// Decidable now: the escalation ended the undecidable episode of refund-esc only.
	apptest.Equal(t, "listed", e.listed(t), []string{"refund-own"})
	e.svc.WaitNotifications()
	e.svc2.WaitNotifications()
	n := 0
	for _, title := range e.chat.seen() {
		if title == "Approval escalated: refund" {
			n++
		}
	}
	apptest.Equal(t, "escalation posts", n, 2) // one per approval
	if _, err := e.svc.Decide(ctx, approvals.HashToken(r.Token), approvals.Approve, "", lea); err != nil {
		t.Fatalf("lead decides after the escalation: %v", err)
	}
}
