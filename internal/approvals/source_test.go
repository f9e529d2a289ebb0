package approvals_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestSourceURLWaitsForItsRequest: the source link of an approval is the latest one given
// up to the approval's own request event. On PostgreSQL a listing holds back events
// committed behind an older writer still open; the request event exists (the approval
// does), so the link is looked up until it is seen — never answered from the claim's
// earlier link (an older writer held open past the listing's own ~2 s wait once made a
// Slack card link the ticket instead of the record the effect named).
func TestSourceURLWaitsForItsRequest(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		e := apptest.NewEffectsEnv(t, b, "")
		ctx := context.Background()
		const key = "src-held"
		const fromClaim, fromEffect = "https://support.example.com/t/1", "https://crm.example.com/c/9"
		meta := func(u string) json.RawMessage { return json.RawMessage(`{"source_url":"` + u + `"}`) }
		if _, err := e.Store.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: string(store.EventClaimed), Meta: meta(fromClaim)}); err != nil {
			t.Fatal(err)
		}
		started, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		if b.Name == "postgres" {
			go func() {
				done <- e.Store.Transact(ctx, func(q store.Queries) error {
					if _, err := q.EventInsert(ctx, store.EventInsertParams{RunKey: "src-other", Kind: "older"}); err != nil {
						return err
					}
					close(started)
					<-release
					return nil
				})
			}()
			<-started
		} else {
			close(release)
			done <- nil
		}
		a := store.Approval{ID: "ap-src-held", RunKey: key}
		if _, err := e.Store.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: string(store.EventApprovalRequested),
			Meta: meta(fromEffect), Detail: json.RawMessage(`{"approval_id":"` + a.ID + `"}`)}); err != nil {
			t.Fatal(err)
		}
		if b.Name == "postgres" {
			time.AfterFunc(3*time.Second, func() { close(release) })
		}
		got, err := e.Approvals.SourceURL(ctx, a)
		if werr := <-done; werr != nil {
			t.Fatal(werr)
		}
		if err != nil {
			t.Fatal(err)
		}
		apptest.Equal(t, "source link", got, fromEffect)
	})
}
