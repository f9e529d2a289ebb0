package clienttest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/accounts"
	"github.com/airlockhq/airlock/internal/airlocktest"
	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// clientPolicy is the client tests' one policy file, which the Python and TypeScript
// tests' server (clients/testdata/serve.sh) loads too.
var clientPolicy = func() string {
	b, err := os.ReadFile("../../clients/testdata/policy.yaml")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

// testServer is one in-process airlock of a client test, with a runs-scoped client (c)
// and an operator-scoped one (op).
type testServer struct {
	*airlocktest.Server
	c, op *client.Client
}

// start is the Go client tests' one start-a-server helper: airlock in-process
// (airlocktest.Start, app.New's wiring behind real HTTP) on a fresh store of backend b
// with policy, stopped when t ends. roles, if any, is the role of the approver account
// "lead" (password "correct horse battery"), made before the server starts.
func start(t *testing.T, b storetest.Backend, policy string, roles ...string) testServer {
	t.Helper()
	ctx := context.Background()
	st := b.Open(t, nil)
	if len(roles) > 0 {
		if err := accounts.CreateUser(ctx, st, "lead", "correct horse battery", roles); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := airlocktest.Start(ctx, st, policy, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	_, opKey, err := apikeys.Create(ctx, st, "ops", []string{apikeys.ScopeOperator}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return testServer{Server: srv, c: client.New(srv.URL, srv.APIKey), op: client.New(srv.URL, opKey)}
}
