package httpapi_test

import (
	"fmt"
	"testing"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// An SMTP payload the connector can never send (cc, headers, a bad
// reply_to) was accepted at queue time and could be approved, to fail at send time. It
// is now refused when queued — before an approval opens — with 422 unsendable_payload,
// on both stores, and nothing is written.
func TestUnsendableMailRefusedAtQueue(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			var ms *apptest.MailServer
			h := newHarnessWith(t, b, apptest.SMTPActions(t, &ms))
			owner, v := h.claim("m-1")
			queue := func(action, payload string) response {
				return h.post("/v1/runs/m-1/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"%s","target":"alice@example.com","payload":%s}`,
					owner, v, action, payload))
			}
			before := storetest.DumpAll(t, h.env.Store)
			for _, action := range []string{"mail", "mail_now"} { // gated and not
				for _, p := range []string{
					`{"subject":"Refund","text":"t","cc":"eve@example.net"}`,
					`{"subject":"Refund","text":"t","headers":{"Bcc":"eve@example.net"}}`,
					`{"subject":"Refund","text":"t","reply_to":"not an address"}`,
					`{"subject":"Refund","text":"t","reply_to":"a@b.example, eve@example.net"}`,
					`{"subject":"Refund"}`,
					`{"subject":"Refund","text":42}`,
					`{"subject":"Refund","text":"t","to":7}`,
					`["subject","text"]`,
				} {
					r := queue(action, p)
					if r.status != 422 || r.body["error"] != "unsendable_payload" {
						t.Errorf("%s with %s: %d %s; want 422 unsendable_payload", action, p, r.status, r.raw)
					}
				}
			}
			if after := storetest.DumpAll(t, h.env.Store); after != before {
				t.Fatal("a refused payload wrote to the database (an approval opened?)")
			}
			// What the connector sends is still queued: a gated one waits for a person.
			expect(t, queue("mail", `{"subject":"Refund","text":"t","html":"<p>t</p>","reply_to":"Support <help@example.com>"}`), 202, "")
		})
	}
}
