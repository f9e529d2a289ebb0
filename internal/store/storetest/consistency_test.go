package storetest_test

import (
	"testing"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

func TestConsistencyConformance(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			storetest.RunConsistency(t, b)
		})
	}
}
