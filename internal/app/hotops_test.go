package app_test

import (
	"context"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/scale"
	"github.com/airlockhq/airlock/internal/store/postgres"
)

// The Citus plan tests replay internal/scale's hot operations (its TestHotQueriesUseIndexes
// EXPLAINs the same ones), naming each in the context their statements carry.
type opKey = scale.OpKey

var dml = scale.DML

func opName(ctx context.Context) string { return scale.OpName(ctx) }

// hotOperations is scale.HotOperations.
func hotOperations(e *apptest.EffectsEnv, st *postgres.Store, op func(name string, fn func(ctx context.Context) error)) {
	scale.HotOperations(e, st, op)
}
