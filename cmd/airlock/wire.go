package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/web"
)

// loadPolicy reads --config, or returns the empty policy (no action types) without one.
func loadPolicy(cfg config.Config) (*policy.Policy, error) {
	if cfg.PolicyFile == "" {
		return policy.Empty(), nil
	}
	return policy.Load(cfg.PolicyFile, os.LookupEnv)
}

// loadPolicyWithoutSecrets is loadPolicy for operator commands: they send nothing, so
// they need no connector secret in their environment.
func loadPolicyWithoutSecrets(cfg config.Config) (*policy.Policy, error) {
	if cfg.PolicyFile == "" {
		return policy.Empty(), nil
	}
	return policy.LoadWithoutSecrets(cfg.PolicyFile)
}

// webOptions discovers the OIDC provider when the policy configures single sign-on: a
// provider that cannot be reached stops start-up naming oidc.issuer.
func webOptions(ctx context.Context, p *policy.Policy, publicURL string) ([]web.Option, error) {
	if p.OIDC == nil {
		return nil, nil
	}
	o, err := web.DiscoverOIDC(ctx, p.OIDC, publicURL)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return []web.Option{web.WithOIDC(o)}, nil
}

// publicURLOf is where approval links point: AIRLOCK_PUBLIC_URL, else the policy's
// public_url, else the listen address on loopback.
func publicURLOf(cfg config.Config, p *policy.Policy) (string, error) {
	switch {
	case cfg.PublicURL != "":
		return cfg.PublicURL, nil
	case p.PublicURL != "":
		if err := config.CheckPublicURL(p.PublicURL); err != nil {
			return "", fmt.Errorf("policy: public_url: %w", err)
		}
		return strings.TrimRight(p.PublicURL, "/"), nil
	}
	u := "http://" + cfg.Listen
	if err := config.CheckPublicURL(u); err != nil {
		for _, name := range p.ActionNames() {
			if p.Action(name).Gate != policy.GateNone {
				return "", fmt.Errorf("set AIRLOCK_PUBLIC_URL: approval links of %s need an https address when airlock listens on %s", name, cfg.Listen)
			}
		}
		if p.OIDC != nil {
			return "", fmt.Errorf("set AIRLOCK_PUBLIC_URL: the oidc redirect URL needs an https address when airlock listens on %s", cfg.Listen)
		}
		return "", nil // no gated action type: no approval link is ever built
	}
	return u, nil
}
