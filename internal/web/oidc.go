package web

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/input"
	"github.com/airlockhq/airlock/internal/policy"
)

const (
	// oidcCookie holds one sign-in attempt: state, nonce and PKCE verifier. It lives on
	// airlock's origin only (HttpOnly, SameSite=Lax, path /login/oidc), so every
	// instance can finish a flow another one started; the provider sees the state, the
	// nonce and the S256 challenge, never the verifier, and never an approval token.
	oidcCookie     = "airlock_oidc"
	oidcCookiePath = "/login/oidc"
	oidcFlowLife   = 10 * time.Minute
	// oidcTimeout bounds each call to the provider: discovery, token exchange, keys.
	oidcTimeout = 10 * time.Second
	// CallbackPath is the redirect URL's path, after the public URL.
	CallbackPath = "/login/oidc/callback"
)

// OIDC is a discovered OpenID Connect provider for "Sign in with SSO" (authorization
// code flow with PKCE).
type OIDC struct {
	oauth        oauth2.Config
	verifier     *oidc.IDTokenVerifier
	client       *http.Client
	roleClaim    string
	roleMap      map[string]string
	subjectClaim string
}

// DiscoverOIDC reads the provider's discovery document (bounded by a timeout) and
// prepares sign-in with it. Errors name oidc.issuer.
func DiscoverOIDC(ctx context.Context, cfg *policy.OIDC, publicURL string) (*OIDC, error) {
	if publicURL == "" {
		return nil, errors.New("oidc: single sign-on needs a public URL (AIRLOCK_PUBLIC_URL or public_url) for its redirect URL")
	}
	client := &http.Client{Timeout: oidcTimeout}
	dctx, cancel := context.WithTimeout(ctx, oidcTimeout)
	defer cancel()
	p, err := oidc.NewProvider(oidc.ClientContext(dctx, client), cfg.Issuer)
	if err != nil {
		return nil, fmt.Errorf("oidc.issuer: discovery at %s failed: %w", cfg.Issuer, err)
	}
	ep := p.Endpoint()
	for _, e := range []struct{ name, u string }{{"authorization_endpoint", ep.AuthURL}, {"token_endpoint", ep.TokenURL}} {
		if !safeEndpoint(e.u) {
			return nil, fmt.Errorf("oidc.issuer: the discovery document's %s %q is not an https URL", e.name, e.u)
		}
	}
	return &OIDC{
		oauth: oauth2.Config{ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret, Endpoint: ep, Scopes: cfg.Scopes,
			RedirectURL: strings.TrimRight(publicURL, "/") + CallbackPath},
		verifier:     p.Verifier(&oidc.Config{ClientID: cfg.ClientID}),
		client:       client,
		roleClaim:    cfg.RoleClaim,
		roleMap:      cfg.RoleMap,
		subjectClaim: cfg.SubjectClaim,
	}, nil
}

// safeEndpoint: https, or plain http on a loopback address (as the issuer may be).
func safeEndpoint(v string) bool {
	u, err := url.Parse(v)
	if err != nil || u.Host == "" {
		return false
	}
	if u.Scheme == "https" {
		return true
	}
	ip := net.ParseIP(u.Hostname())
	return u.Scheme == "http" && (u.Hostname() == "localhost" || ip != nil && ip.IsLoopback())
}

// Option configures New.
type Option func(*Web)

// WithOIDC adds "Sign in with SSO" through a discovered provider.
func WithOIDC(o *OIDC) Option { return func(w *Web) { w.oidc = o } }

func (w *Web) setFlowCookie(rw http.ResponseWriter, value string, maxAge time.Duration) {
	http.SetCookie(rw, &http.Cookie{Name: oidcCookie, Value: value, Path: oidcCookiePath, HttpOnly: true, Secure: w.secure,
		SameSite: http.SameSiteLaxMode, MaxAge: int(maxAge.Seconds())})
}

func noSSO() error {
	return refuse(http.StatusNotFound, "neutral.html", page{Title: "Single sign-on is not configured",
		Message: "This airlock has no single sign-on. Sign in with a local account."})
}

// oidcStart sends the person to the provider with a fresh state, nonce and S256
// challenge; the verifier stays in the flow cookie.
func (w *Web) oidcStart(rw http.ResponseWriter, r *http.Request) error {
	if w.oidc == nil {
		return noSSO()
	}
	state, nonce, verifier := randomValue(), randomValue(), oauth2.GenerateVerifier()
	w.setFlowCookie(rw, state+"."+nonce+"."+verifier, oidcFlowLife)
	http.Redirect(rw, r, w.oidc.oauth.AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier)), http.StatusSeeOther)
	return nil
}

// oidcCallback finishes a flow: the state must match the flow cookie's (constant-time),
// the code is exchanged with the verifier, the ID token is verified (issuer, audience,
// expiry, signature) and must carry the flow's nonce. Then the same server-side
// session as a local sign-in starts.
func (w *Web) oidcCallback(rw http.ResponseWriter, r *http.Request) error {
	if w.oidc == nil {
		return noSSO()
	}
	q := r.URL.Query()
	var flow []string
	if c, err := r.Cookie(oidcCookie); err == nil {
		flow = strings.Split(c.Value, ".")
	}
	if len(flow) != 3 || slices.Contains(flow, "") || subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(flow[0])) != 1 {
		// The flow cookie stays: a forged callback must not end a real attempt.
		w.log.Warn("sso sign-in refused", "reason", "state does not match this browser's sign-in attempt")
		return w.loginRefused(http.StatusBadRequest, "This sign-in cannot be completed: it expired, was already used, or was started in another browser. Sign in again.")
	}
	w.setFlowCookie(rw, "", -time.Second) // used up, whatever happens next
	deny := func(reason string, args ...any) error {
		w.log.Warn("sso sign-in refused", append([]any{"reason", reason}, args...)...)
		return w.loginRefused(http.StatusUnauthorized, "Single sign-on did not sign you in. Try again, or ask your administrator.")
	}
	if e := q.Get("error"); e != "" {
		return deny("the provider returned an error", "error", clip(e))
	}
	if q.Get("code") == "" {
		return deny("no code")
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(r.Context(), w.oidc.client), oidcTimeout)
	defer cancel()
	tok, err := w.oidc.oauth.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(flow[2]))
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) && re.Response != nil {
			return deny("token exchange failed", "status", re.Response.StatusCode, "error", clip(re.ErrorCode))
		}
		return deny("token exchange failed", "err", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return deny("the token response has no id_token")
	}
	idt, err := w.oidc.verifier.Verify(ctx, raw)
	if err != nil {
		return deny("ID token not valid", "err", err)
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(flow[1])) != 1 {
		return deny("the ID token's nonce does not match this sign-in attempt")
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return deny("ID token claims", "err", err)
	}
	who, dropped, err := w.oidc.person(idt.Subject, claims)
	if err != nil {
		return deny(err.Error())
	}
	if dropped > 0 {
		w.log.Warn("sso sign-in: claim values that cannot be roles were ignored", "claim", w.oidc.roleClaim, "ignored", dropped)
	}
	if err := w.startSession(rw, r, who, ""); err != nil {
		return err
	}
	w.log.Info("sso sign-in", "subject", who.Subject, "roles", who.Roles)
	to := "/login" // which says who is signed in
	if w.hasIntent(r) {
		to = "/approve/continue"
	}
	http.Redirect(rw, r, to, http.StatusSeeOther)
	return nil
}

// person reads the subject and the roles from verified ID token claims. dropped counts
// claim values that cannot be roles (a comma would split one into others).
func (o *OIDC) person(sub string, claims map[string]any) (who approvals.Person, dropped int, err error) {
	who.Subject = sub
	if v, ok := claims[o.subjectClaim].(string); ok && v != "" {
		who.Subject = v
		if o.subjectClaim == "email" && !truthy(claims["email_verified"]) {
			return who, 0, errors.New("the ID token's email is not marked email_verified: true (use another subject_claim with this provider)")
		}
	}
	// The subject is the approver's identity under separation of duties: an invisible or
	// bidirectional character would make it read as someone else's.
	if who.Subject == "" || input.Identity(who.Subject) != nil {
		return who, 0, fmt.Errorf("the ID token has no usable subject (%s or sub)", o.subjectClaim)
	}
	var values []string
	switch v := claims[o.roleClaim].(type) {
	case string:
		values = []string{v}
	case []any:
		for _, x := range v {
			if s, ok := x.(string); ok {
				values = append(values, s)
			}
		}
	}
	for _, v := range values {
		role := v
		if len(o.roleMap) > 0 {
			var ok bool
			if role, ok = o.roleMap[v]; !ok {
				continue
			}
		}
		if !policy.ValidRole(role) {
			dropped++
			continue
		}
		if !slices.Contains(who.Roles, role) {
			who.Roles = append(who.Roles, role)
		}
	}
	return who, dropped, nil
}

// truthy reads email_verified: only true (or "true") is verified. An address the
// provider does not vouch for could name someone else (approvers.subjects, separation of
// duties); with such a provider, set subject_claim to another claim.
func truthy(v any) bool {
	switch b := v.(type) {
	case bool:
		return b
	case string:
		return b == "true"
	}
	return false
}

// clip keeps a provider-supplied value short and printable for the log.
func clip(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, s)
	if len(s) > 64 {
		s = s[:64]
	}
	return s
}
