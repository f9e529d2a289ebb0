package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oauth2-proxy/mockoidc"
)

// TestServeOIDC: serve discovers the provider at start-up; one it cannot reach stops it
// naming oidc.issuer.
func TestServeOIDC(t *testing.T) {
	idp, err := mockoidc.Run()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = idp.Shutdown() })
	cfg := idp.Config()
	policyFile := func(issuer string) string {
		f := filepath.Join(t.TempDir(), "airlock.yaml")
		doc := fmt.Sprintf("oidc: {issuer: '%s', client_id: '%s', client_secret_env: AIRLOCK_TEST_OIDC_SECRET}\n", issuer, cfg.ClientID)
		if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	env := []string{"AIRLOCK_DATABASE_URL=" + filepath.Join(t.TempDir(), "oidc.db"), "AIRLOCK_TEST_OIDC_SECRET=" + cfg.ClientSecret}

	t.Run("an unreachable provider stops start-up naming oidc.issuer", func(t *testing.T) {
		_, stderr, err := airlock(t, env, "serve", "--config", policyFile("http://127.0.0.1:1/oidc"), "--listen", "127.0.0.1:0")
		if err == nil || !strings.Contains(stderr, "policy: oidc.issuer: discovery at http://127.0.0.1:1/oidc failed") {
			t.Fatalf("err=%v stderr=%q", err, stderr)
		}
	})

	t.Run("sign in with SSO", func(t *testing.T) {
		base := serveProcess(t, append(env, "AIRLOCK_CONFIG="+policyFile(cfg.Issuer), "AIRLOCK_PUBLIC_URL=https://airlock.example.com"))
		resp, err := client.Get(base + "/login")
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(page), "Sign in with SSO") {
			t.Fatalf("sign-in page: %s", page)
		}
		noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		start, err := noFollow.Get(base + "/login/oidc")
		if err != nil {
			t.Fatal(err)
		}
		start.Body.Close()
		loc, _ := url.Parse(start.Header.Get("Location"))
		if start.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc.String(), idp.AuthorizationEndpoint()) ||
			loc.Query().Get("redirect_uri") != "https://airlock.example.com/login/oidc/callback" {
			t.Fatalf("start: %d %s", start.StatusCode, loc)
		}
		if c := start.Header.Get("Set-Cookie"); !strings.Contains(c, "Secure") || !strings.Contains(c, "HttpOnly") {
			t.Fatalf("flow cookie over an https public URL: %q", c)
		}
	})
}
