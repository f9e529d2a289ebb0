package httpapi_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

// A declared requested_by with a zero-width space, a soft hyphen or a
// Cyrillic look-alike ("аna" for "ana") dodged "an approver may not approve their own
// request", and a right-to-left override was accepted in a target (and shown reversed on
// the card). Identities with invisible or bidirectional characters, and such targets, are
// refused when queued (422 invisible_character); look-alikes are the same person under
// separation of duties (compared by their UTS #39 skeleton); on both stores.
func TestSeparationOfDutiesNotDodgedByLookAlikes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("ana", "support-lead")
		ana := newBrowser(t)
		if code, _, _ := h.signIn(ana, "ana"); code != 200 {
			t.Fatalf("sign in: %d", code)
		}
		queue := func(key, requestedBy, action, target string) response {
			owner, v := h.claim(key)
			return h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":%q,"target":%q,"payload":{"text":"refund"},"meta":{"requested_by":%q}}`,
				owner, v, action, target, requestedBy))
		}
		// Invisible and bidirectional characters: refused before anything is written.
		for i, rb := range []string{"an\u200ba", "an\u00ada", "ana\u200d", "\u202eana", "\u2066ana\u2069", "ana\u200e", "ana\u061c", "an\ufeffa"} {
			key := fmt.Sprintf("inv-%d", i)
			owner, v := h.claim(key)
			mid := storetest.DumpAll(t, h.env.Store)
			r := h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"email","target":"default","payload":{"text":"refund"},"meta":{"requested_by":%q}}`, owner, v, rb))
			if r.status != 422 || (r.body["error"] != "invisible_character" && r.body["error"] != "invalid_identity") {
				t.Errorf("requested_by %q: %d %s; want 422 invisible_character", rb, r.status, r.raw)
				if link, _ := r.body["approve_url"].(string); link != "" {
					if code, _, _ := ana.do("POST", link, url.Values{"decision": {"approve"}}, nil); code == http.StatusOK {
						t.Errorf("requested_by %q: ana approved her own request", rb)
					}
				}
			}
			if after := storetest.DumpAll(t, h.env.Store); after != mid && r.status == 422 {
				t.Errorf("requested_by %q: a refused request wrote to the database", rb)
			}
		}
		// Look-alikes are valid names, and they are ana.
		for i, rb := range []string{"\u0430na", "\u0430n\u0430", "\u0410NA", "ａｎａ", "Ana"} {
			r := queue(fmt.Sprintf("look-%d", i), rb, "email", "default")
			expect(t, r, 202, "")
			code, page, _ := ana.do("POST", r.body["approve_url"].(string), url.Values{"decision": {"approve"}}, nil)
			if code != http.StatusForbidden || !strings.Contains(page, "separation of duties") {
				t.Errorf("requested_by %q: ana decided her own request: %d", rb, code)
			}
		}
		// Someone else is still someone else.
		r := queue("other-1", "anna", "email", "default")
		expect(t, r, 202, "")
		if code, _, _ := ana.do("POST", r.body["approve_url"].(string), url.Values{"decision": {"approve"}}, nil); code != http.StatusOK {
			t.Fatalf("ana may approve anna's request: %d", code)
		}
		// A target with a bidi control or an invisible character is refused: the card would
		// show it reversed or as another target.
		for i, target := range []string{"slack\u202e", "\u202ekcals", "sl\u200back", "\u2067slack\u2069"} {
			r := queue(fmt.Sprintf("tgt-%d", i), "", "task", target)
			if r.status != 422 || r.body["error"] != "invisible_character" {
				t.Errorf("target %q: %d %s; want 422 invisible_character", target, r.status, r.raw)
			}
		}
		owner, _ := h.claim("tgt-plan")
		p := h.post("/v1/runs/tgt-plan/ledger/effects/e-1/plan", fmt.Sprintf(`{"lease_owner":"%s","action":"task","target":"slack\u202e","input_hash":"sha256:00"}`, owner))
		if p.status != 422 || p.body["error"] != "invisible_character" {
			t.Errorf("plan with a bidi target: %d %s", p.status, p.raw)
		}
	})
}
