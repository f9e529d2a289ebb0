package httpapi_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestRunsList lists runs newest first with each filter and in keyset pages, on both
// stores; bad filters are refused with invalid_field.
func TestRunsList(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.claim("ord-1")
		h.env.Clock.Advance(time.Hour)
		owner2, v2 := h.claim("ord-2")
		owner3, v3 := h.claim("ord-3")
		expect(t, h.post("/v1/runs/ord-3/transition", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"to":"completed"}`, owner3, v3)), 200, "")
		r := h.post("/v1/runs/ord-2/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"note","target":"default","payload":{"note":"n"}}`, owner2, v2))
		if r.status/100 != 2 {
			t.Fatalf("queue: %d %s", r.status, r.raw)
		}
		h.env.Clock.Advance(time.Hour)
		h.claim("other-1")
		keys := func(path string) ([]string, string) {
			t.Helper()
			r := h.get(path)
			expect(t, r, 200, "")
			var ks []string
			for _, run := range r.body["runs"].([]any) {
				run := run.(map[string]any)
				if _, leak := run["lease_owner"]; leak {
					t.Fatalf("the list shows a lease owner: %s", r.raw)
				}
				ks = append(ks, run["key"].(string))
			}
			next, _ := r.body["next_after"].(string)
			return ks, next
		}
		for _, tt := range []struct {
			query string
			want  []string
		}{
			{"", []string{"other-1", "ord-3", "ord-2", "ord-1"}},
			{"?state=completed", []string{"ord-3"}},
			{"?action_type=note", []string{"ord-2"}},
			{"?action_type=note&state=completed", nil},
			{"?action_type=email", nil},
			{"?state=processing&key_prefix=ord-", []string{"ord-2", "ord-1"}},
			{"?key_prefix=ord-", []string{"ord-3", "ord-2", "ord-1"}},
			{"?key_prefix=o", []string{"other-1", "ord-3", "ord-2", "ord-1"}},
			{"?key_prefix=x", nil},
			{"?older_than=90m", []string{"ord-1"}},
			{"?older_than=1h", []string{"ord-3", "ord-2", "ord-1"}},
			{"?older_than=1d", nil},
		} {
			if got, _ := keys("/v1/runs" + tt.query); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("GET /v1/runs%s = %v, want %v", tt.query, got, tt.want)
			}
		}
		// Keyset pages of one: every run once, in order, then no next page.
		var all []string
		path := "/v1/runs?limit=1"
		for range 10 {
			ks, next := keys(path)
			all = append(all, ks...)
			if next == "" {
				break
			}
			path = "/v1/runs?limit=1&after=" + next
		}
		if want := []string{"other-1", "ord-3", "ord-2", "ord-1"}; !reflect.DeepEqual(all, want) {
			t.Fatalf("pages = %v, want %v", all, want)
		}
		for _, bad := range []string{"state=bogus", "limit=0", "limit=501", "after=x", "after=12_", "older_than=soon", "key_prefix=" + strings.Repeat("k", 201)} {
			expect(t, h.get("/v1/runs?"+bad), 400, "invalid_field")
		}
	})
}
