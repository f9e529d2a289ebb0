package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestSecretsAndPersonalData plants secrets and personal data in a full flow, then
// searches every table and the whole log for them: secrets never appear; personal data
// only where sending needs it, and not after retention purges it.
func TestSecretsAndPersonalData(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		const (
			email = "ana.private@example.org"
			name  = "Ana PrivateSurname"
			card  = "4111-1111-1111-1111"
		)
		h.env.Policy.Action("email").LogFields = []string{"subject"}
		h.addUser("lead", "support-lead")
		lead := newBrowser(t)
		_, _, hdr := h.signIn(lead, "lead")
		var session string
		for _, c := range (&http.Response{Header: hdr}).Cookies() {
			if c.Name == "airlock_session" {
				session = c.Value
			}
		}
		if session == "" {
			t.Fatal("no session cookie")
		}

		r := h.post("/v1/runs/claim", `{"key":"p-1","payload":{"from":"`+email+`","name":"`+name+`"}}`)
		expect(t, r, 201, "")
		owner := r.body["lease_owner"].(string)
		q := h.post("/v1/runs/p-1/effects", fmt.Sprintf(`{"lease_owner":"%s","version":1,"action_type":"email","target":"default",
			"payload":{"subject":"Your refund","to":"%s","text":"Dear %s, card %s"}}`, owner, email, name, card))
		expect(t, q, 202, "")
		link := q.body["approve_url"].(string)
		token := strings.TrimPrefix(link, h.url+"/approve/")
		if code, _, _ := lead.do("POST", link, url.Values{"decision": {"approve"}}, nil); code != 200 {
			t.Fatalf("approve: %d", code)
		}
		if _, err := h.env.Dispatcher.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}

		secrets := map[string]string{"API key": h.runsKey, "admin key": h.adminKy, "approval token": token, "session id": session}
		personal := map[string]string{"email": email, "name": name, "card": card}
		db, logs := storetest.DumpAll(t, h.env.Store), h.logs.String()
		evs := h.get("/v1/runs/p-1/events").raw
		for what, v := range secrets {
			if strings.Contains(db, v) {
				t.Errorf("the database holds the raw %s", what)
			}
			if strings.Contains(logs, v) {
				t.Errorf("the log holds the raw %s", what)
			}
		}
		for what, v := range personal {
			if strings.Contains(logs, v) {
				t.Errorf("the log holds the %s", what)
			}
			if strings.Contains(evs, v) {
				t.Errorf("an event holds the %s", what)
			}
		}
		if !strings.Contains(evs, `Your refund`) {
			t.Error("the allowed log field (subject) is missing from the events")
		}
		// After retention, personal data is gone from every table; hashes and ids stay.
		counts, err := retention.Purge(context.Background(), h.env.Store, h.env.Policy, time.Now().Add(45*24*time.Hour), false)
		if err != nil {
			t.Fatal(err)
		}
		if counts["effect_payloads"] != 1 || counts["approval_payloads"] != 1 {
			t.Fatalf("purge: %v", counts)
		}
		db = storetest.DumpAll(t, h.env.Store)
		for what, v := range personal {
			if strings.Contains(db, v) {
				t.Errorf("after retention the database still holds the %s", what)
			}
		}
		if run := h.get("/v1/runs/p-1"); run.body["payload_hash"] == "" || len(run.body["effects"].([]any)) != 1 {
			t.Fatalf("hashes and ids must stay: %s", run.raw)
		}
	})
}
