package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// readOnly returns the harness's database as a store that answers reads and refuses every
// write. PostgreSQL: a pool whose sessions are read-only (default_transaction_read_only,
// what a standby after a failover also refuses writes with). SQLite: file permissions do
// not stop root, and tests run as root, so the store's one connection is switched to
// PRAGMA query_only, which fails writes with the same SQLITE_READONLY a read-only file
// gives ("attempt to write a readonly database").
func readOnly(t *testing.T, h *harness) store.Store {
	t.Helper()
	ctx := context.Background()
	switch st := h.env.Store.(type) {
	case *postgres.Store:
		cfg := st.Pool().Config()
		cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
		ro, err := postgres.OpenConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ro.Close() })
		return ro
	case *sqlite.Store:
		st.DB().SetMaxOpenConns(1)
		if _, err := st.DB().ExecContext(ctx, `PRAGMA query_only = ON`); err != nil {
			t.Fatal(err)
		}
		return st
	}
	t.Fatalf("unknown store %T", h.env.Store)
	return nil
}

// /readyz used to say ready while every write failed: readiness is a write that commits.
func TestReadyzChecksTheStoreCanWrite(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		expect(t, h.do("GET", "/readyz", "", "", ""), 200, "")
		ro := readOnly(t, h)
		base := h.another(func(d *httpapi.Deps) { d.Store = ro })
		// Reads still work: it is the write that fails.
		if _, err := ro.RunGet(context.Background(), "none"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("read on the read-only store: %v", err)
		}
		if _, err := ro.Claim(context.Background(), store.ClaimParams{RunClaimParams: store.RunClaimParams{Key: "ro-1", PayloadHash: "h", Owner: "o", Lease: 60e9}}); err == nil {
			t.Fatal("the read-only store took a write")
		}
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		checkLive(t, resp.Request, resp, raw)
		var body map[string]string
		_ = json.Unmarshal(raw, &body)
		if resp.StatusCode != 503 || body["error"] != "store_unavailable" || body["check"] != "write" || !strings.Contains(body["message"], "does not accept writes") {
			t.Fatalf("readyz on a read-only store: %d %s", resp.StatusCode, raw)
		}
		if !strings.Contains(h.logs.String(), "not ready: the database answers but does not accept writes") {
			t.Fatal("the reason is not logged")
		}
	})
}
