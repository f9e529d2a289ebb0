package apptest

import (
	"testing"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

// EachEnv runs fn on every backend (storetest.Each: subtests sqlite and postgres), each
// with a fresh Env on the test clock. A top-level test named for its unit calls it, so
// `go test -run '^TestClaimNewKey$'` runs that one case on each backend.
func EachEnv(t *testing.T, fn func(t *testing.T, e *Env)) {
	t.Helper()
	storetest.Each(t, func(t *testing.T, b storetest.Backend) { fn(t, NewEnv(t, b, false)) })
}

// EachEffects is EachEnv with a fresh EffectsEnv (AI_ACTIONS_ENABLED unset).
func EachEffects(t *testing.T, fn func(t *testing.T, e *EffectsEnv)) {
	t.Helper()
	storetest.Each(t, func(t *testing.T, b storetest.Backend) { fn(t, NewEffectsEnv(t, b, "")) })
}
