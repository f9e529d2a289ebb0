package runs

import (
	"encoding/json"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
)

func TestClientTransitions(t *testing.T) {
	for _, from := range store.States {
		for _, to := range store.States {
			want := from == store.StateProcessing &&
				(to == store.StateCompleted || to == store.StateFailedRetryable || to == store.StateFailedTerminal)
			if got := Allowed(from, to, Client); got != want {
				t.Errorf("client %s → %s: allowed=%v, want %v", from, to, got, want)
			}
		}
	}
}

func TestTerminalStatesHaveNoWayOut(t *testing.T) {
	for _, from := range []store.State{store.StateCompleted, store.StateFailedTerminal, store.StateRejected} {
		for _, to := range store.States {
			if Allowed(from, to, Client) || Allowed(from, to, System) {
				t.Errorf("%s → %s is allowed; terminal states are final", from, to)
			}
		}
	}
}

func TestHashPayloadIsCanonical(t *testing.T) {
	a, err := HashPayload(json.RawMessage(`{"b":1,"a":[1,2,{"y":1e2,"x":"\u00e9"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := HashPayload(json.RawMessage("{ \"a\": [1, 2, {\"x\": \"é\", \"y\": 100}], \"b\": 1.0 }"))
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("equivalent documents hash differently: %s vs %s", a, b)
	}
	c, _ := HashPayload(json.RawMessage(`{"b":2,"a":[1,2,{"y":1e2,"x":"é"}]}`))
	if c == a {
		t.Fatal("different documents hash the same")
	}
	if _, err := HashPayload(json.RawMessage(`{"a":`)); err == nil {
		t.Fatal("invalid JSON hashed")
	}
}
