package httpapi_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// A database that cannot commit — a synchronous standby gone under strict synchronous
// mode, here a lock another session holds on the runs — is answered 503
// store_unavailable within the request bound, not left hanging until the client gives
// up (and then logged as a 500).
func TestRequestsAreBounded(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		const bound = time.Second
		h := newHarnessWith(t, b, func(_ *apptest.EffectsEnv, o *app.Options) { o.RequestTimeout = bound })
		ctx := context.Background()
		var release func()
		switch st := h.env.Store.(type) {
		case *postgres.Store:
			tx, err := st.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `LOCK TABLE workflow_runs IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			release = func() { _ = tx.Rollback(ctx) }
		case *sqlite.Store:
			conn, err := st.DB().Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
				t.Fatal(err)
			}
			release = func() { _, _ = conn.ExecContext(ctx, `ROLLBACK`); conn.Close() }
		default:
			t.Fatalf("store %T", st)
		}
		defer release()
		start := time.Now()
		r := h.post("/v1/runs/claim", `{"key":"bounded","payload":{}}`)
		took := time.Since(start)
		expect(t, r, http.StatusServiceUnavailable, "store_unavailable")
		if took > bound+4*time.Second {
			t.Errorf("answered after %s: the bound is %s", took, bound)
		}
		release()
		expect(t, h.post("/v1/runs/claim", `{"key":"bounded","payload":{}}`), http.StatusCreated, "")
	})
}
