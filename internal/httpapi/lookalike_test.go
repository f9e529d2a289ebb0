package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// confusableNames imitate ana, bob and carl, one or two per class the outside run used:
// capitals of Greek, Cyrillic, Lisu, Cherokee, Coptic, Canadian syllabics; Latin small
// capitals; capital I for l; blanks outside the invisible list inside a name (they are
// refused as invisible_character when not a plain space: see the first loop); combining
// marks on ASCII letters; and Cyrillic small letters.
var confusableNames = []string{
	"ΑΝΑ", "ΒΟΒ", "ВОВ", "АNА", "ꓮꓠꓮ", "ꓐꓳꓐ", "ᎪnᎪ", "ᏴOᏴ", "ⲀⲚⲀ", "ⲂⲞⲂ", "ᗅNᗅ", "ᗷOᗷ", "ᑕARL",
	"ᴀɴᴀ", "ʙᴏʙ", "ᴄᴀʀʟ", "carI", "CARI", "ca\u0332rl", "a\u0301na", "b\u0307ob", "аna", "вов",
	"an a", "bo b", "ΑΝΑ ",
}

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
		for i, rb := range []string{"an\u200ba", "an\u00ada", "ana\u200d", "\u202eana", "\u2066ana\u2069", "ana\u200e", "ana\u061c", "an\ufeffa",
			"an\u2800a", "ana\u2800", "an\U0001D159a", "an\u00a0a", "an\u1680a"} {
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
		// The same name up to case and width is ana's own name: accepted, and ana may not
		// decide it.
		for i, rb := range []string{"ANA", "ａｎａ", "Ana", " ana "} {
			r := queue(fmt.Sprintf("same-%d", i), rb, "email", "default")
			expect(t, r, 202, "")
			code, page, _ := ana.do("POST", r.body["approve_url"].(string), url.Values{"decision": {"approve"}}, nil)
			if code != http.StatusForbidden || !strings.Contains(page, "separation of duties") {
				t.Errorf("requested_by %q: ana decided her own request: %d", rb, code)
			}
		}
		// Look-alikes of a known account (ana, bob, carl) in every class the outside run
		// used are refused at the door (issue 33 item 2): 422 confusable_identity, nothing
		// written, so none reaches the gate.
		h.addUser("bob", "support")
		h.addUser("carl", "support")
		refused := 0
		for i, rb := range confusableNames {
			key := fmt.Sprintf("look-%d", i)
			owner, v := h.claim(key)
			mid := storetest.DumpAll(t, h.env.Store)
			r := h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"email","target":"default","payload":{"text":"refund"},"meta":{"requested_by":%q}}`, owner, v, rb))
			if r.status != 422 || r.body["error"] != "confusable_identity" {
				t.Errorf("requested_by %q (%U): %d %s; want 422 confusable_identity", rb, []rune(rb), r.status, r.raw)
				continue
			}
			if strings.Contains(r.raw, `"ana"`) || strings.Contains(r.raw, "bob") {
				t.Errorf("the refusal names the account: %s", r.raw)
			}
			if after := storetest.DumpAll(t, h.env.Store); after != mid {
				t.Errorf("requested_by %q: a refused request wrote to the database", rb)
			}
			refused++
		}
		t.Logf("%d of %d look-alikes refused at the door", refused, len(confusableNames))
		// The claim and the ledger's plan check it too.
		c := h.post("/v1/runs/claim", `{"key":"look-claim","payload":1,"meta":{"requested_by":"ΒΟΒ"}}`)
		expect(t, c, 422, "confusable_identity")
		owner, _ := h.claim("look-plan")
		p := h.post("/v1/runs/look-plan/ledger/effects/e-1/plan", fmt.Sprintf(`{"lease_owner":"%s","action":"task","target":"default","input_hash":"sha256:00","meta":{"requested_by":"carI"}}`, owner))
		expect(t, p, 422, "confusable_identity")
		// A key acting for a look-alike of a known person is not created.
		if _, _, err := apikeys.CreateSpec(context.Background(), h.env.Store, apikeys.Spec{Name: "ana-helper", Scopes: []string{"runs"}, OnBehalfOf: "ᴀɴᴀ"}, time.Now()); !errors.Is(err, approvals.ErrConfusableIdentity) {
			t.Errorf("a key on behalf of ᴀɴᴀ: %v", err)
		}
		// A name like nobody known is anyone's to declare; the gate still compares it the
		// way an attacker writes it: zoe, whose account comes later, may not decide a
		// request made as "ΖΟΕ" (Greek capitals), which folding first read as "ζοε".
		free := queue("look-free", "ΖΟΕ", "email", "default")
		expect(t, free, 202, "")
		h.addUser("zoe", "support-lead")
		zoe := newBrowser(t)
		h.signIn(zoe, "zoe")
		if code, page, _ := zoe.do("POST", free.body["approve_url"].(string), url.Values{"decision": {"approve"}}, nil); code != http.StatusForbidden || !strings.Contains(page, "separation of duties") {
			t.Errorf("zoe decided a request made as ΖΟΕ: %d", code)
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
		owner, _ = h.claim("tgt-plan")
		p = h.post("/v1/runs/tgt-plan/ledger/effects/e-1/plan", fmt.Sprintf(`{"lease_owner":"%s","action":"task","target":"slack\u202e","input_hash":"sha256:00"}`, owner))
		if p.status != 422 || p.body["error"] != "invisible_character" {
			t.Errorf("plan with a bidi target: %d %s", p.status, p.raw)
		}
	})
}
