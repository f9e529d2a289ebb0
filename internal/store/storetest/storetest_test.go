package storetest_test

import (
	"testing"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, b)
		})
	}
}

func TestEffectsConformance(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			storetest.RunEffects(t, b)
		})
	}
}

func TestFailuresConformance(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			storetest.RunFailures(t, b)
		})
	}
}

func TestLedgerConformance(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			storetest.RunLedger(t, b)
		})
	}
}

func TestGatesConformance(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			storetest.RunGates(t, b)
		})
	}
}

func TestCostConformance(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			storetest.RunCost(t, b)
		})
	}
}
