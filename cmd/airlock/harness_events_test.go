package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// checkEvents: every change has its event. The rows of runs, effects and approvals are
// read from the database itself and compared, per run key, with the run's event log:
//   - every version the run went through (1 … its version) has an event at that version;
//   - every effect has its effect_queued (an agent's: effect_planned), an event recording its last attempt count, and
//     an event for the state it ended in;
//   - every approval has the event that opened it, and a consumed one the event of what
//     consumed it (a decision, a cancel, an expiry).
func (h *harness) checkEvents(keys []string) {
	ctx := context.Background()
	var url string
	for _, kv := range h.env {
		if u, ok := strings.CutPrefix(kv, "AIRLOCK_DATABASE_URL="); ok {
			url = u
		}
	}
	var st store.Store
	var err error
	if h.backend == "postgres" {
		st, err = postgres.Open(ctx, url)
	} else {
		st, err = sqlite.Open(ctx, url, sqlite.Options{})
	}
	if err != nil {
		h.t.Errorf("seed %d: open the database to compare rows with events: %v", h.seed, err)
		return
	}
	defer st.Close()
	gaps := 0
	gap := func(format string, args ...any) {
		if gaps++; gaps <= 20 {
			h.t.Errorf("seed %d: every change has its event: "+format, append([]any{h.seed}, args...)...)
		}
	}
	for _, key := range keys {
		run, err := st.RunGet(ctx, key)
		if err != nil {
			continue // never created (acknowledged writes are checked elsewhere)
		}
		var evs []store.Event
		for after := int64(0); ; {
			page, err := st.EventList(ctx, key, after, 500)
			if err != nil {
				h.t.Errorf("seed %d: events of %s: %v", h.seed, key, err)
				return
			}
			evs = append(evs, page...)
			if len(page) < 500 {
				break
			}
			after = page[len(page)-1].ID
		}
		type ev struct {
			kind    string
			version int64
			d       map[string]any
		}
		var all []ev
		versions := map[int64]bool{}
		for _, e := range evs {
			var d map[string]any
			_ = json.Unmarshal(e.Detail, &d)
			all = append(all, ev{e.Kind, e.Version, d})
			versions[e.Version] = true
		}
		for v := int64(1); v <= run.Version; v++ {
			if !versions[v] {
				gap("run %s is at version %d (%s) but no event records version %d", key, run.Version, run.State, v)
			}
		}
		of := func(field, value string, kinds ...string) []ev {
			var out []ev
			for _, e := range all {
				if s, _ := e.d[field].(string); s == value && (len(kinds) == 0 || slices.Contains(kinds, e.kind)) {
					out = append(out, e)
				}
			}
			return out
		}
		effs, err := st.EffectList(ctx, store.EffectListParams{RunKey: key, Limit: 10000})
		if err != nil {
			h.t.Errorf("seed %d: effects of %s: %v", h.seed, key, err)
			return
		}
		for _, e := range effs {
			mine := of("effect_id", e.EffectID)
			kinds := map[string]bool{}
			maxAttempts := 0
			for _, x := range mine {
				kinds[x.kind] = true
				if n, ok := x.d["attempts"].(float64); ok {
					maxAttempts = max(maxAttempts, int(n))
				}
			}
			queued := "effect_queued"
			if e.Executor == store.ExecutorAgent {
				queued = "effect_planned" // an agent's, through the ledger
			}
			if !kinds[queued] {
				gap("effect %s/%s has no %s event", key, e.EffectID, queued)
			}
			if e.Attempts > 0 && maxAttempts != e.Attempts {
				gap("effect %s/%s made %d attempts; its events record %d (%v)", key, e.EffectID, e.Attempts, maxAttempts, kindsOf(mine))
			}
			want := map[store.EffectState][]string{
				store.EffectCompleted: {"effect_completed", "effect_resolved", "effect_reconciled", "effect_confirmed"},
				store.EffectFailed:    {"effect_failed", "effect_resolved"},
				store.EffectCancelled: {"effect_cancelled", "effect_resolved"},
				store.EffectUnknown:   {"effect_unknown"},
			}[e.State]
			if want != nil && !slices.ContainsFunc(want, func(k string) bool { return kinds[k] }) {
				gap("effect %s/%s is %s but has none of the events %v (%v)", key, e.EffectID, e.State, want, kindsOf(mine))
			}
		}
		aps, err := st.ApprovalsByRun(ctx, key)
		if err != nil {
			h.t.Errorf("seed %d: approvals of %s: %v", h.seed, key, err)
			return
		}
		for _, a := range aps {
			mine := of("approval_id", a.ID)
			opened := []string{"approval_requested"}
			if a.Mode == "act_with_window" {
				opened = []string{"cancel_window_opened"}
			}
			if a.Mode == "review" {
				continue // a sample of an auto-approval: its effect's auto_approved event names it
			}
			if len(of("approval_id", a.ID, opened...)) == 0 {
				gap("approval %s of %s (%s) has no %v event", a.ID, key, a.Mode, opened)
			}
			if a.ConsumedAt == nil {
				continue
			}
			consumed := map[string][]string{"approve": {"approval_decided"}, "reject": {"approval_decided"},
				"cancel": {"effect_cancelled"}, "expired": {"transition", "cancel_window_closed"}}[a.Decision]
			if len(of("approval_id", a.ID, consumed...)) == 0 {
				gap("approval %s of %s was consumed (%s) but has none of the events %v (%v)", a.ID, key, a.Decision, consumed, kindsOf(mine))
			}
		}
	}
	if gaps > 20 {
		h.t.Errorf("seed %d: … and %d more changes without their event", h.seed, gaps-20)
	}
}

func kindsOf[E any](evs []E) string {
	var out []string
	for _, e := range evs {
		out = append(out, strings.SplitN(fmt.Sprintf("%v", e), " ", 2)[0][1:])
	}
	return strings.Join(out, ",")
}
