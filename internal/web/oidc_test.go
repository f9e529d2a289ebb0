package web

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/policy"
)

func TestOIDCPerson(t *testing.T) {
	mapped := &OIDC{roleClaim: "groups", subjectClaim: "email", roleMap: map[string]string{"approvers": "support-lead", "leads": "support-lead", "desk": "support"}}
	plain := &OIDC{roleClaim: "roles", subjectClaim: "email"}
	for _, c := range []struct {
		name    string
		o       *OIDC
		claims  map[string]any
		subject string
		roles   []string
		dropped int
		err     string
	}{
		{"mapped, deduplicated, unmapped ignored", mapped, map[string]any{"email": "ana@example.com", "email_verified": true,
			"groups": []any{"approvers", "leads", "engineering", "desk"}}, "ana@example.com", []string{"support-lead", "support"}, 0, ""},
		{"no role claim: signed in without roles", mapped, map[string]any{"email": "ana@example.com", "email_verified": true}, "ana@example.com", nil, 0, ""},
		{"claim values are the roles without a map", plain, map[string]any{"email": "ana@example.com", "email_verified": "true",
			"roles": []any{"support-lead", 7, "a,support-lead", "x\ny"}}, "ana@example.com", []string{"support-lead"}, 2, ""},
		{"one string claim", plain, map[string]any{"email": "ana@example.com", "email_verified": true, "roles": "support"}, "ana@example.com", []string{"support"}, 0, ""},
		{"no email: sub", plain, map[string]any{"roles": "support"}, "sub-1", []string{"support"}, 0, ""},
		{"unverified email", plain, map[string]any{"email": "ceo@example.com", "email_verified": false}, "", nil, 0, "email_verified"},
		{"email_verified absent", plain, map[string]any{"email": "ceo@example.com"}, "", nil, 0, "email_verified"},
		{"other subject claim", &OIDC{roleClaim: "groups", subjectClaim: "preferred_username"}, map[string]any{"preferred_username": "ana", "email": "x@example.com"}, "ana", nil, 0, ""},
		// A subject that reads as another person's is no subject.
		{"zero-width space in the subject", &OIDC{roleClaim: "groups", subjectClaim: "preferred_username"}, map[string]any{"preferred_username": "an\u200ba"}, "", nil, 0, "no usable subject"},
		{"bidi override in the subject", &OIDC{roleClaim: "groups", subjectClaim: "preferred_username"}, map[string]any{"preferred_username": "\u202eana"}, "", nil, 0, "no usable subject"},
		{"soft hyphen in the subject", &OIDC{roleClaim: "groups", subjectClaim: "preferred_username"}, map[string]any{"preferred_username": "an\u00ada"}, "", nil, 0, "no usable subject"},
	} {
		t.Run(c.name, func(t *testing.T) {
			who, dropped, err := c.o.person("sub-1", c.claims)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || who.Subject != c.subject || !slices.Equal(who.Roles, c.roles) || dropped != c.dropped {
				t.Fatalf("got %+v dropped %d err %v; want %s %v dropped %d", who, dropped, err, c.subject, c.roles, c.dropped)
			}
		})
	}
	if _, _, err := plain.person("", map[string]any{}); err == nil {
		t.Fatal("a token without any subject signed someone in")
	}
}

func TestDiscoverOIDCErrorsNameTheIssuer(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	wrongIssuer := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"issuer":"https://elsewhere.example","authorization_endpoint":"https://elsewhere.example/a","token_endpoint":"https://elsewhere.example/t","jwks_uri":"https://elsewhere.example/k"}`))
	}))
	defer wrongIssuer.Close()
	var plainToken *httptest.Server
	plainToken = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"issuer":"` + plainToken.URL + `","authorization_endpoint":"https://idp.example/a","token_endpoint":"http://idp.example/t","jwks_uri":"https://idp.example/k"}`))
	}))
	defer plainToken.Close()
	for _, c := range []struct{ issuer, want string }{
		{dead.URL, "oidc.issuer: discovery at " + dead.URL},
		{wrongIssuer.URL, "oidc.issuer: discovery at " + wrongIssuer.URL},
		{plainToken.URL, "oidc.issuer: the discovery document's token_endpoint"},
	} {
		_, err := DiscoverOIDC(context.Background(), &policy.OIDC{Issuer: c.issuer, ClientID: "airlock", ClientSecret: "s"}, "https://airlock.example.com")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.issuer, err, c.want)
		}
	}
	if _, err := DiscoverOIDC(context.Background(), &policy.OIDC{Issuer: wrongIssuer.URL}, ""); err == nil || !strings.Contains(err.Error(), "public URL") {
		t.Errorf("no public URL: %v", err)
	}
}
