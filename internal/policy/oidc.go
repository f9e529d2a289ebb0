package policy

import (
	"net"
	"net/url"
	"slices"
	"sort"
	"strings"
	"unicode"
)

// OIDC is single sign-on through an OpenID Connect provider (authorization code flow
// with PKCE), beside local accounts. The redirect URL to register at the provider is
// <public_url>/login/oidc/callback.
type OIDC struct {
	Issuer           string `yaml:"issuer"`
	ClientID         string `yaml:"client_id"`
	ClientSecretEnv  string `yaml:"client_secret_env"`
	ClientSecretFile string `yaml:"client_secret_file"`
	// RoleClaim is the ID token claim that holds the person's groups or roles (a string
	// or a list of strings). Default "groups".
	RoleClaim string `yaml:"role_claim"`
	// RoleMap turns claim values into airlock roles; values it does not name give no
	// role. Without it the claim values are the roles.
	RoleMap map[string]string `yaml:"role_map"`
	// Scopes asked for. Default openid, profile, email, and groups when RoleClaim is
	// groups.
	Scopes []string `yaml:"scopes"`
	// SubjectClaim names the person (approvers.subjects, separation of duties). Default
	// "email"; the token's "sub" when the claim is absent.
	SubjectClaim string `yaml:"subject_claim"`
	// ClientSecret is resolved from ClientSecretEnv or ClientSecretFile at load time.
	ClientSecret string `yaml:"-"`
}

func (o *OIDC) defaults() {
	if o == nil {
		return
	}
	if o.RoleClaim == "" {
		o.RoleClaim = "groups"
	}
	if o.SubjectClaim == "" {
		o.SubjectClaim = "email"
	}
	if o.Scopes == nil {
		o.Scopes = []string{"openid", "profile", "email"}
		if o.RoleClaim == "groups" {
			o.Scopes = append(o.Scopes, "groups")
		}
	}
}

// ValidRole reports whether r can be an airlock role: sessions and approvals keep roles
// as a comma-separated list, so a comma (or a control character) would split one role
// into others.
func ValidRole(r string) bool {
	return r != "" && len(r) <= 200 && !strings.ContainsFunc(r, func(c rune) bool { return c == ',' || unicode.IsControl(c) })
}

func (o *OIDC) validate(f string, e *errs, lookupEnv func(string) (string, bool)) {
	if o == nil {
		return
	}
	if u, err := url.Parse(o.Issuer); err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" ||
		(u.Scheme != "https" && !(u.Scheme == "http" && loopback(u.Hostname()))) {
		e.add(f+".issuer", "must be an absolute https URL without query or credentials (plain http only on a loopback address)")
	}
	if o.ClientID == "" {
		e.add(f+".client_id", "required")
	}
	before := len(*e)
	o.ClientSecret = secret(f, "client_secret", o.ClientSecretEnv, o.ClientSecretFile, e, lookupEnv)
	switch {
	case o.ClientSecretEnv == "" && o.ClientSecretFile == "":
		e.add(f+".client_secret_env", "required (or client_secret_file)")
	case lookupEnv != nil && len(*e) == before && o.ClientSecret == "":
		e.add(f+".client_secret_file", "%s is empty", o.ClientSecretFile)
	}
	for _, c := range []struct{ field, v string }{{"role_claim", o.RoleClaim}, {"subject_claim", o.SubjectClaim}} {
		if strings.TrimSpace(c.v) != c.v || strings.ContainsFunc(c.v, unicode.IsSpace) {
			e.add(f+"."+c.field, "must be a claim name without spaces")
		}
	}
	if !slices.Contains(o.Scopes, "openid") {
		e.add(f+".scopes", "must include openid")
	}
	for _, s := range o.Scopes {
		if s == "" || strings.ContainsFunc(s, func(c rune) bool { return unicode.IsSpace(c) || unicode.IsControl(c) }) {
			e.add(f+".scopes", "%q is not a scope", s)
		}
	}
	keys := make([]string, 0, len(o.RoleMap))
	for k := range o.RoleMap {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "" {
			e.add(f+".role_map", "a claim value must not be empty")
		}
		if !ValidRole(o.RoleMap[k]) {
			e.add(f+".role_map."+k, "%q is not a role: give one role, without commas", o.RoleMap[k])
		}
	}
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
