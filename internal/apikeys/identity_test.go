package apikeys

import (
	"context"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

type insertKeys struct {
	store.Queries
	rows []store.APIKey
}

// The known identities are none: no accounts, no people seen, no keys yet.
func (k *insertKeys) UserList(context.Context) ([]store.User, error) { return nil, nil }
func (k *insertKeys) PeopleSeen(context.Context, time.Time) ([]store.PersonSeen, error) {
	return nil, nil
}
func (k *insertKeys) APIKeyList(context.Context) ([]store.APIKey, error) { return k.rows, nil }

func (k *insertKeys) APIKeyInsert(_ context.Context, row store.APIKey) error {
	k.rows = append(k.rows, row)
	return nil
}

// A key's name and the person it acts for are identities under
// separation of duties ("apikey:<name>", the person): one with an invisible or
// bidirectional character would read as someone else and is refused.
func TestKeyIdentitiesMustBeVisible(t *testing.T) {
	q := &insertKeys{}
	for _, spec := range []Spec{
		{Name: "ops\u200b", Scopes: []string{ScopeRuns}},
		{Name: "\u202eops", Scopes: []string{ScopeRuns}},
		{Name: "assistant", Scopes: []string{ScopeRuns}, OnBehalfOf: "an\u00ada"},
		{Name: "assistant", Scopes: []string{ScopeRuns}, OnBehalfOf: "ana\u2066"},
	} {
		if _, _, err := CreateSpec(context.Background(), q, spec, time.Now()); err == nil {
			t.Errorf("CreateSpec(%+q) succeeded", spec.Name+" / "+spec.OnBehalfOf)
		}
	}
	if len(q.rows) != 0 {
		t.Fatalf("refused keys were stored: %v", q.rows)
	}
	if _, _, err := CreateSpec(context.Background(), q, Spec{Name: "ana's assistant", Scopes: []string{ScopeRuns}, OnBehalfOf: "Ana López"}, time.Now()); err != nil || len(q.rows) != 1 {
		t.Fatalf("a plain key: %v", err)
	}
}
