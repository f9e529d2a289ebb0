package approvals

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/input"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
)

// ErrConfusableIdentity is a declared identity (meta.requested_by, an API key's
// on-behalf-of) that reads like a known person's name but is not it: refused where it
// enters, so a look-alike never reaches a gate or an event.
var ErrConfusableIdentity = errors.New("the name reads like another known person's name but is not it; give the name exactly as that person signs in")

// KnownIdentities are the names airlock knows people by: local accounts (disabled ones
// too), people seen by single sign-on (ever), the people API keys act for, the API keys
// themselves (apikey:<name>) and the subjects the policy names as approvers.
func KnownIdentities(ctx context.Context, q store.Queries, p *policy.Policy) ([]string, error) {
	var out []string
	users, err := q.UserList(ctx)
	if err != nil {
		return nil, fmt.Errorf("known identities: %w", err)
	}
	for _, u := range users {
		out = append(out, u.Name)
	}
	seen, err := q.PeopleSeen(ctx, time.Time{})
	if err != nil {
		return nil, fmt.Errorf("known identities: %w", err)
	}
	for _, s := range seen {
		out = append(out, s.Subject)
	}
	keys, err := q.APIKeyList(ctx)
	if err != nil {
		return nil, fmt.Errorf("known identities: %w", err)
	}
	for _, k := range keys {
		out = append(out, "apikey:"+k.Name)
		if k.OnBehalfOf != "" {
			out = append(out, k.OnBehalfOf)
		}
	}
	if p != nil {
		for _, a := range p.Actions {
			if a != nil {
				out = append(out, a.Approvers.Subjects...)
			}
		}
	}
	return out, nil
}

// CheckDeclared refuses a declared identity that is confusable with a known one
// (input.SameIdentity) without being that name (input.Exact: the same name up to case,
// width and surrounding space). "" declares nobody and passes. The refusal does not say
// which name it resembles: a key holder learns no account names from it.
func CheckDeclared(ctx context.Context, q store.Queries, p *policy.Policy, name string) error {
	if strings.TrimSpace(name) == "" {
		return nil
	}
	known, err := KnownIdentities(ctx, q, p)
	if err != nil {
		return err
	}
	exact := input.Exact(name)
	var resembles bool
	for _, k := range known {
		if input.Exact(k) == exact {
			return nil // it is that person's name
		}
		resembles = resembles || input.SameIdentity(name, k)
	}
	if resembles {
		return ErrConfusableIdentity
	}
	return nil
}
