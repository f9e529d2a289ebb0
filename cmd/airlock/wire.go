package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/connector/httpconn"
	"github.com/airlockhq/airlock/internal/connector/smtpconn"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
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

// connectors builds one connector per action type that airlock sends itself.
func connectors(p *policy.Policy) (map[string]connector.Connector, error) {
	out := map[string]connector.Connector{}
	for _, name := range p.ActionNames() {
		a := p.Action(name)
		var c connector.Connector
		var err error
		switch {
		case a.HTTP != nil:
			h := a.HTTP
			c, err = httpconn.New(httpconn.Config{Targets: h.Targets, Idempotent: h.Idempotent, Token: h.Token,
				TokenHeader: h.TokenHeader, Timeout: h.Timeout.D(), LookupURL: h.LookupURL,
				LookupAuthoritative: h.LookupAuthoritative, IDField: h.IDField})
		case a.SMTP != nil:
			m := a.SMTP
			c, err = smtpconn.New(smtpconn.Config{Host: m.Host, Port: m.Port, Username: m.Username, Password: m.Password,
				From: m.From, TLS: m.TLS, Timeout: m.Timeout.D(), Targets: m.Targets})
		default:
			continue // worker: performed outside airlock
		}
		if err != nil {
			return nil, fmt.Errorf("policy: actions.%s: %w", name, err)
		}
		out[name] = c
	}
	return out, nil
}

// newEffects wires the outbox service from the policy and the configuration (its
// AIActionsEnabled defaults to "true", which is what AI_ACTIONS_ENABLED unset means).
func newEffects(cfg config.Config, st store.Store, p *policy.Policy, conns map[string]connector.Connector, log *slog.Logger, m *metrics.Metrics, budgets func(string) runs.Budget) *effects.Service {
	svc := effects.NewService(effects.Options{Store: st, Policy: p, Connectors: conns, Log: log, Budgets: budgets,
		Alerts: metrics.Alerter{Log: log, Metrics: m}, AIActionsEnabled: cfg.AIActionsEnabled, AIActionsEnabledSet: true})
	svc.Observe = func(outcome string, d time.Duration) {
		m.Dispatch.WithLabelValues(outcome).Observe(d.Seconds())
	}
	m.Registry.MustRegister(metrics.Gauges{
		Effects: func(ctx context.Context) (map[string]int, error) {
			counts, err := st.EffectCountByState(ctx)
			out := map[string]int{}
			for s, n := range counts {
				out[string(s)] = n
			}
			return out, err
		},
		Enabled: func(ctx context.Context) bool { ok, _ := svc.Enabled(ctx, ""); return ok },
	})
	return svc
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
