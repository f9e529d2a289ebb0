package policy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestOIDCDefaults(t *testing.T) {
	p, err := Parse([]byte(`
oidc:
  issuer: https://login.example.com/realms/staff
  client_id: airlock
  client_secret_env: OIDC_SECRET
  role_map: {airlock-approvers: support-lead}
`), env(map[string]string{"OIDC_SECRET": "s3cret"}))
	if err != nil {
		t.Fatal(err)
	}
	o := p.OIDC
	if o.ClientSecret != "s3cret" || o.RoleClaim != "groups" || o.SubjectClaim != "email" ||
		!slices.Equal(o.Scopes, []string{"openid", "profile", "email", "groups"}) || o.RoleMap["airlock-approvers"] != "support-lead" {
		t.Fatalf("defaults: %+v", o)
	}
	// Another role claim: no groups scope is asked for.
	p, err = Parse([]byte(`oidc: {issuer: "http://127.0.0.1:5556/dex", client_id: a, client_secret_env: S, role_claim: roles}`), env(map[string]string{"S": "x"}))
	if err != nil || !slices.Equal(p.OIDC.Scopes, []string{"openid", "profile", "email"}) {
		t.Fatalf("role_claim roles: %v %+v", err, p)
	}
	// The secret from a file.
	f := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(f, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err = Parse([]byte(`oidc: {issuer: "https://idp.example", client_id: a, client_secret_file: "`+f+`"}`), env(nil))
	if err != nil || p.OIDC.ClientSecret != "from-file" {
		t.Fatalf("client_secret_file: %v", err)
	}
	if p, err := Parse([]byte(`actions: {}`), env(nil)); err != nil || p.OIDC != nil {
		t.Fatalf("without oidc: %v %+v", err, p.OIDC)
	}
}

func TestOIDCErrorsNameTheField(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	base := `issuer: "https://idp.example", client_id: a, client_secret_env: S`
	for _, c := range []struct{ doc, want string }{
		{`oidc: {issuer: "http://idp.example", client_id: a, client_secret_env: S}`, "oidc.issuer: must be an absolute https URL"},
		{`oidc: {issuer: "idp.example", client_id: a, client_secret_env: S}`, "oidc.issuer"},
		{`oidc: {issuer: "https://u:p@idp.example", client_id: a, client_secret_env: S}`, "oidc.issuer"},
		{`oidc: {issuer: "https://idp.example?x=1", client_id: a, client_secret_env: S}`, "oidc.issuer"},
		{`oidc: {issuer: "https://idp.example", client_secret_env: S}`, "oidc.client_id: required"},
		{`oidc: {issuer: "https://idp.example", client_id: a}`, "oidc.client_secret_env: required"},
		{`oidc: {issuer: "https://idp.example", client_id: a, client_secret_env: NOPE}`, "oidc.client_secret_env: environment variable NOPE is not set"},
		{`oidc: {issuer: "https://idp.example", client_id: a, client_secret_env: S, client_secret_file: /x}`, "oidc.client_secret_env: give client_secret_env or client_secret_file, not both"},
		{`oidc: {issuer: "https://idp.example", client_id: a, client_secret_file: /nonexistent/secret}`, "oidc.client_secret_file: cannot read"},
		{`oidc: {issuer: "https://idp.example", client_id: a, client_secret_file: "` + empty + `"}`, "oidc.client_secret_file: " + empty + " is empty"},
		{`oidc: {` + base + `, scopes: [profile, email]}`, "oidc.scopes: must include openid"},
		{`oidc: {` + base + `, scopes: [openid, "a b"]}`, `oidc.scopes: "a b" is not a scope`},
		{`oidc: {` + base + `, role_map: {staff: "support,support-lead"}}`, "oidc.role_map.staff"},
		{`oidc: {` + base + `, role_map: {staff: ""}}`, "oidc.role_map.staff"},
		{`oidc: {` + base + `, role_claim: "my groups"}`, "oidc.role_claim"},
		{`oidc: {` + base + `, subject_claim: " email"}`, "oidc.subject_claim"},
		{`oidc: {` + base + `, secret: x}`, "oidc.secret: unknown field"},
	} {
		_, err := Parse([]byte(c.doc), env(map[string]string{"S": "x"}))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.doc, err, c.want)
		}
	}
	// Loopback issuers may be plain http (a provider on the same machine, tests).
	for _, iss := range []string{"http://127.0.0.1:5556/dex", "http://localhost:8080/realms/x", "http://[::1]:9000"} {
		if _, err := Parse([]byte(`oidc: {issuer: "`+iss+`", client_id: a, client_secret_env: S}`), env(map[string]string{"S": "x"})); err != nil {
			t.Errorf("%s: %v", iss, err)
		}
	}
}
