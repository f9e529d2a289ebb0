package httpapi_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// Issue 33 item 4: a NUL or invalid UTF-8 in key_prefix, action_type or after answered
// 500 on PostgreSQL and 200 on SQLite (GET /v1/runs, GET /v1/approvals). One text rule
// now runs before any handler on every route: query names and values and path values
// with a NUL, invalid UTF-8 or a control character, and a query that does not parse, are
// 400 invalid_field, on both stores, and nothing is written.
func TestQueryAndPathTextRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.claim("qp-1")
		before := storetest.DumpAll(t, h.env.Store)
		bad := []string{"%00", "a%00b", "%ff", "a%c3", "%1b", "%7f", "%c0%80"}
		// The listing APIs, parameter by parameter.
		for _, path := range []string{"/v1/runs", "/v1/approvals"} {
			for _, param := range []string{"key_prefix", "action_type", "after", "state", "limit"} {
				for _, v := range bad {
					r := h.do("GET", path+"?"+param+"="+v, h.readKey, "", "")
					if r.status != 400 || r.body["error"] != "invalid_field" || !strings.Contains(r.body["message"].(string), param) {
						t.Errorf("GET %s?%s=%s: %d %s; want 400 invalid_field naming %s", path, param, v, r.status, r.raw, param)
					}
				}
			}
			for _, q := range []string{"%00=x", "key_prefix=%zz", "key_prefix=a;b"} {
				if r := h.do("GET", path+"?"+q, h.readKey, "", ""); r.status != 400 || r.body["error"] != "invalid_field" {
					t.Errorf("GET %s?%s: %d %s; want 400 invalid_field", path, q, r.status, r.raw)
				}
			}
		}
		// Every route: a hostile query, and a hostile path value where it has one.
		for _, rt := range httpapi.Routes {
			path := wildcard.ReplaceAllLiteralString(rt.Pattern, "qp-1")
			r := h.do(rt.Method, path+"?x=%00", h.adminKy, "application/json", "{}")
			if r.status != 400 || r.body["error"] != "invalid_field" {
				t.Errorf("%s %s?x=%%00: %d %.200s; want 400 invalid_field", rt.Method, path, r.status, r.raw)
			}
			if !wildcard.MatchString(rt.Pattern) {
				continue
			}
			for _, v := range []string{"%00", "%ff", "%1b"} {
				path := wildcard.ReplaceAllLiteralString(rt.Pattern, "qp"+v)
				r := h.do(rt.Method, path, h.adminKy, "application/json", "{}")
				if r.status != 400 || r.body["error"] != "invalid_field" {
					t.Errorf("%s %s: %d %.200s; want 400 invalid_field", rt.Method, path, r.status, r.raw)
				}
			}
		}
		// The pages: the same rule, answered with a 400 page.
		for _, path := range []string{"/login?x=%00", "/login?next=%ff", "/approve/" + strings.Repeat("A", 42) + "%00", "/approve/continue?a=%1b", "/login/oidc?x=%00"} {
			if r := h.do("GET", path, "", "", ""); r.status != 400 || !strings.Contains(r.raw, "<html") {
				t.Errorf("GET %s: %d %.200s; want a 400 page", path, r.status, r.raw)
			}
		}
		// A valid query still works: ana, a key prefix with a space, non-ASCII text.
		for _, q := range []string{"key_prefix=" + url.QueryEscape("qp ü"), "action_type=" + url.QueryEscape("näte")} {
			if r := h.do("GET", "/v1/runs?"+q, h.readKey, "", ""); r.status != 200 {
				t.Errorf("GET /v1/runs?%s: %d %s", q, r.status, r.raw)
			}
		}
		if after := storetest.DumpAll(t, h.env.Store); after != before {
			t.Error("a refused request wrote to the database")
		}
	})
}
