package storetest_test

import (
	"testing"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

// onEachBackend runs one conformance suite on every backend, in parallel.
func onEachBackend(t *testing.T, suite func(*testing.T, storetest.Backend)) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			suite(t, b)
		})
	}
}

func TestConformance(t *testing.T)            { onEachBackend(t, storetest.Run) }
func TestEffectsConformance(t *testing.T)     { onEachBackend(t, storetest.RunEffects) }
func TestFailuresConformance(t *testing.T)    { onEachBackend(t, storetest.RunFailures) }
func TestLedgerConformance(t *testing.T)      { onEachBackend(t, storetest.RunLedger) }
func TestGatesConformance(t *testing.T)       { onEachBackend(t, storetest.RunGates) }
func TestConsoleConformance(t *testing.T)     { onEachBackend(t, storetest.RunConsole) }
func TestCostConformance(t *testing.T)        { onEachBackend(t, storetest.RunCost) }
func TestConsistencyConformance(t *testing.T) { onEachBackend(t, storetest.RunConsistency) }
func TestRequeueConformance(t *testing.T)     { onEachBackend(t, storetest.RunRequeue) }
func TestOutageConformance(t *testing.T)      { onEachBackend(t, storetest.RunOutage) }
func TestChainConformance(t *testing.T)       { onEachBackend(t, storetest.RunChain) }
