package httpapi_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestDecisionWritesCheckpoint: with the audit key and a checkpoint directory wired as
// serve wires them (app.Options.Checkpoints, Checkpointer.Serve), a person approving on
// the page (POST /approve/{token}) makes a signed checkpoint appear that holds the
// decided run's new head, long before the interval (an hour here); verify holds the trail
// to it after the effect is sent and retention purged. Through the whole flow — claim,
// effect, approval, decision, checkpoint, dispatch, purge — the log never carries the
// audit key, in hex or base64 of any alphabet. Both stores.
func TestDecisionWritesCheckpoint(t *testing.T) {
	key, err := store.NewAuditKey()
	if err != nil {
		t.Fatal(err)
	}
	keys := store.NewKeyring(key)
	for _, b := range storetest.KeyedBackends(key) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dir := t.TempDir()
			var cp *audit.Checkpointer
			h := newHarnessWith(t, b, func(env *apptest.EffectsEnv, o *app.Options) {
				cp = audit.NewCheckpointer(env.Store, key, dir, time.Hour)
				o.Checkpoints = cp
			})
			runCtx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); cp.Serve(runCtx, h.log) }()
			t.Cleanup(func() { stop(); wg.Wait() })
			st := h.env.Store

			// Events past retention, for the purge at the end to delete and seal a base.
			now, err := st.Clock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			old := now.Add(-500 * 24 * time.Hour)
			for range 3 {
				if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: "old-run", Kind: "note", Actor: "user:ann", Now: &old}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: "old-run", Kind: "note", Actor: "user:ann"}); err != nil {
				t.Fatal(err)
			}

			h.addUser("lead", "support-lead")
			link := h.propose("ticket-cp", "")
			if files, _ := audit.LoadCheckpoints(dir, keys); files != nil {
				t.Fatalf("a checkpoint before any decision: %d files", files.Files)
			}
			lead := newBrowser(t)
			h.signIn(lead, "lead")
			if code, page, _ := lead.do("POST", link, url.Values{"decision": {"approve"}}, nil); code != 200 || !strings.Contains(page, "Approved") {
				t.Fatalf("approve: %d %s", code, page)
			}
			head, err := st.ChainHeadGet(ctx, "ticket-cp")
			if err != nil {
				t.Fatal(err)
			}
			decided := int64(0)
			evs, err := st.ChainEvents(ctx, "ticket-cp", 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range evs {
				if e.Kind == string(store.EventApprovalDecided) && e.Seq != nil {
					decided = *e.Seq
				}
			}
			if decided == 0 || decided > head.Seq {
				t.Fatalf("approval_decided at link %d, head %d", decided, head.Seq)
			}
			// The wake's checkpoint, not the interval's: it holds the head the decision left.
			deadline := time.Now().Add(30 * time.Second)
			for {
				set, err := audit.LoadCheckpoints(dir, keys)
				if err == nil && set != nil {
					found := false
					for _, r := range set.Newest.Runs {
						if r.Key == "ticket-cp" && r.Seq == head.Seq && r.Head == head.Head {
							found = true
						}
					}
					if found {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("no checkpoint with ticket-cp at link %d (%s) within 30s of the decision: %v", head.Seq, head.Head, err)
				}
				time.Sleep(20 * time.Millisecond)
			}

			// The effect is sent, then retention purges old-run's first links.
			if _, err := h.env.Dispatcher.Tick(ctx); err != nil {
				t.Fatal(err)
			}
			if run := h.get("/v1/runs/ticket-cp"); run.body["state"] != "completed" {
				t.Fatalf("after dispatch: %s", run.raw)
			}
			if err := retention.Job(st, h.env.Policy, h.log)(ctx); err != nil {
				t.Fatal(err)
			}
			set, err := audit.LoadCheckpoints(dir, keys)
			if err != nil {
				t.Fatal(err)
			}
			since, err := st.ChainFirstKeyed(ctx)
			if err != nil {
				t.Fatal(err)
			}
			opt := audit.VerifyOptions{Keys: keys, Checkpoints: set, KeyedSince: since, RequireMAC: true, Retention: h.env.Policy.Retention.Events.D()}
			checked := map[string]audit.ChainCheck{}
			if err := audit.New(st, nil).VerifyAllWith(ctx, opt, func(c audit.ChainCheck) error { checked[c.Key] = c; return nil }); err != nil {
				t.Fatal(err)
			}
			if c := checked["ticket-cp"]; !c.OK || c.Checkpointed != head.Seq || c.Seq <= head.Seq {
				t.Fatalf("ticket-cp: %+v (checkpointed at %d)", c, head.Seq)
			}
			if c := checked["old-run"]; !c.OK || c.Purged != 3 {
				t.Fatalf("old-run after the purge: %+v", c)
			}

			logs := h.logs.String()
			for _, want := range []string{`"route":"POST /v1/runs/claim"`, "audit checkpoint written", "retention purge"} {
				if !strings.Contains(logs, want) {
					t.Fatalf("the log has no %q: the flow was not logged where this test looks\n%s", want, logs)
				}
			}
			for _, form := range keyForms(t, key) {
				if strings.Contains(logs, form) {
					t.Fatalf("the log carries the audit key (%s)", form)
				}
			}
			// The checkpoint files carry the key's id and signatures, never the key.
			files, _ := json.Marshal(set.Newest)
			for _, form := range keyForms(t, key) {
				if strings.Contains(string(files), form) {
					t.Fatalf("a checkpoint carries the audit key (%s)", form)
				}
			}
		})
	}
}

// keyForms are the ways the key's 32 bytes could be written: hex (both cases) and base64
// (standard and URL alphabets, padded or not), whole and as the key file's text.
func keyForms(t *testing.T, key *store.AuditKey) []string {
	t.Helper()
	enc := strings.TrimSpace(string(key.Encode()))
	secret, err := base64.RawURLEncoding.DecodeString(enc[strings.LastIndex(enc, ":")+1:])
	if err != nil || len(secret) != 32 {
		t.Fatalf("the key file's text: %v", err)
	}
	h := hex.EncodeToString(secret)
	return []string{enc, h, strings.ToUpper(h), base64.StdEncoding.EncodeToString(secret), base64.RawStdEncoding.EncodeToString(secret),
		base64.URLEncoding.EncodeToString(secret), base64.RawURLEncoding.EncodeToString(secret)}
}
