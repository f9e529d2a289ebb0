package main

// The harness against time (issue 32): instances stopped cleanly as a rolling deploy stops
// them (on PostgreSQL sometimes while a begin-mark's reply is on the wire), and the checks
// that evidence is not taken as final before it can be: a clean stop leaves no unknown
// effect whose request never left, every committed alert event was raised, and an agent
// that paused past its lease and performed its effect a second time is on record.

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// killSwitchGuardKey is the advisory lock every PostgreSQL begin-mark takes shared and a
// kill switch change exclusive (killSwitchLock in internal/store/postgres: "airkill").
const killSwitchGuardKey int64 = 0x6169726b696c6c

// unsentMark is an effect marked sent-begun during a clean stop whose request never
// reached the provider.
type unsentMark struct {
	key, effectID, actionType string
	startedAt                 time.Time
	stop                      string
}

// openStore opens the run's database for the harness's own reads (not under the
// instances' application_name: the faults that terminate their backends spare it).
func (h *harness) openStore(ctx context.Context) (store.Store, error) {
	if h.backend == "postgres" {
		return postgres.Open(ctx, h.dbURL)
	}
	return sqlite.Open(ctx, h.dbURL, sqlite.Options{})
}

// cleanStop stops one instance as a rolling deploy does: out of the harness's routing, its
// requests finished, SIGTERM, a clean exit (anything else fails the run), a new instance in
// its slot. midMark (PostgreSQL) sends the SIGTERM while the instance's begin-mark waits for
// its reply: the harness holds the kill switch's guard (which every begin-mark takes
// shared) until the instance's dispatcher waits on it, sends SIGTERM, and lets the mark go
// on once the shutdown has given up on it; the server then commits a mark whose reply
// goes to a client that is gone. Effects marked during the stop whose request never
// reached the provider are kept for checkTime.
func (h *harness) cleanStop(midMark bool) {
	h.imu.Lock()
	i := h.intn(len(h.insts))
	s := h.insts[i]
	h.insts[i] = nil
	h.imu.Unlock()
	if s == nil {
		return
	}
	if n, ok := h.toInstance.Load(s.URL); ok {
		for end := time.Now().Add(5 * time.Second); n.(*atomic.Int64).Load() > 0 && time.Now().Before(end); {
			time.Sleep(20 * time.Millisecond)
		}
	}
	from := time.Now()
	var release func()
	if midMark {
		release = h.holdBeginMarks(i)
	}
	kind := "clean_stop"
	if release != nil {
		kind = "clean_stop_mid_mark"
	}
	h.count(kind)
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	if release != nil {
		// The shutdown cancels the dispatcher's context as soon as the HTTP server has
		// drained (at once: the harness routes nothing to it now). pgx then stops reading
		// and sends a cancel request, which aborts the mark if it is still waiting: the
		// guard is let go as the instance says it shuts down, a few milliseconds either
		// side, so the mark commits while its reply is on the wire to a client that gives
		// up — or (as often) just before or just after, which is no fault of the product.
		for end := time.Now().Add(2 * time.Second); !strings.Contains(s.Logs(), `"msg":"shutting down"`) && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Duration(h.intn(3000)) * time.Microsecond)
		release()
	}
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		h.t.Errorf("seed %d: instance %d (%s) did not stop within 30 s of SIGTERM; its last lines:\n%s", h.seed, i, s.URL, lastLines(s.Logs(), 20))
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	armed := slices.ContainsFunc(s.cmd.Env, func(kv string) bool { return strings.HasPrefix(kv, "AIRLOCK_TEST_CRASH_AT=") })
	switch ee, ok := s.err.(*exec.ExitError); {
	case s.err == nil:
	case armed && ok && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL:
		h.count("clean_stop_met_crash_point") // its armed crash point came first
		h.kills.Add(1)
	default:
		h.t.Errorf("seed %d: instance %d (%s) exited with %v after SIGTERM; its last lines:\n%s", h.seed, i, s.URL, s.err, lastLines(s.Logs(), 20))
	}
	to := time.Now()
	h.imu.Lock()
	h.insts[i] = h.start(i)
	h.imu.Unlock()
	// A live sender's request reaches the provider within milliseconds of its mark; the
	// stopped one's lease (3 s) has not lapsed yet, so its marks are still there to read.
	time.Sleep(1200 * time.Millisecond)
	h.findUnsent(from, to, fmt.Sprintf("%s of instance %d %s–%s", kind, i, from.Format("15:04:05.000"), to.Format("15:04:05.000")))
}

// holdBeginMarks takes the kill switch's guard exclusively and waits (up to 3 s) until
// instance i's dispatcher waits for it in a begin-mark; it returns the release, or nil
// (released already) when the instance had nothing to mark.
func (h *harness) holdBeginMarks(i int) func() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, h.dbURL)
	if err != nil {
		return nil
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, killSwitchGuardKey); err != nil {
		conn.Close(ctx)
		return nil
	}
	release := func() {
		_, _ = conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, killSwitchGuardKey)
		conn.Close(ctx)
	}
	app := fmt.Sprintf("%s_%d", h.appName, i)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'`, app).Scan(&n); err != nil {
			break
		}
		if n > 0 {
			return release
		}
	}
	release()
	return nil
}

// findUnsent keeps the effects whose send began between from and to (the stop) and whose
// request the provider never received: a live sender's arrives within milliseconds. The
// idempotent type is left out: its lapsed lease is resent with the same key, not unknown.
func (h *harness) findUnsent(from, to time.Time, stop string) {
	ctx := context.Background()
	st, err := h.openStore(ctx)
	if err != nil {
		h.t.Logf("seed %d: open the database after a clean stop: %v", h.seed, err)
		return
	}
	defer st.Close()
	effs, err := st.EffectList(ctx, store.EffectListParams{States: []store.EffectState{store.EffectSending, store.EffectUnknown}})
	if err != nil {
		h.t.Logf("seed %d: list effects after a clean stop: %v", h.seed, err)
		return
	}
	tol := 200 * time.Millisecond
	if h.backend == "sqlite" { // an instance's own clock stamps the mark there
		for _, d := range h.skews {
			tol = max(tol, d.Abs()+200*time.Millisecond)
		}
	}
	for _, e := range effs {
		if e.Executor != store.ExecutorDispatcher || e.SendStartedAt == nil || e.ActionType == "crm" {
			continue
		}
		at := *e.SendStartedAt
		if at.Before(from.Add(-tol)) || at.After(to.Add(tol)) {
			continue
		}
		pk := e.RunKey + "/" + e.EffectID
		h.prov.mu.Lock()
		arrived := slices.ContainsFunc(h.prov.arrivals[pk], func(t time.Time) bool { return t.After(at.Add(-tol)) })
		h.prov.mu.Unlock()
		if arrived {
			continue
		}
		h.hmu.Lock()
		h.unsent = append(h.unsent, unsentMark{key: e.RunKey, effectID: e.EffectID, actionType: e.ActionType, startedAt: at, stop: stop})
		h.hmu.Unlock()
	}
}

// alertLine is an instance's warn line for a raised alert.
type alertLine struct {
	Level   string `json:"level"`
	Msg     string `json:"msg"`
	Alert   string `json:"alert"`
	Key     string `json:"key"`
	EventID any    `json:"event_id"`
}

// checkTime runs the checks about time; the caller holds hmu.
//   - A clean stop leaves no unknown effect whose request never left: every mark findUnsent
//     kept must not have become unknown (the sweeper's lease_expired).
//   - Every committed alert event was raised: each instance's log (killed ones' too) has
//     its warn line "alert", matched by event_id where the line has one, else by kind and
//     key (at least as many lines as events).
//   - An effect an agent performed twice (it paused past its lease, another agent's turn
//     performed it meanwhile) has an alert event naming it: airlock cannot stop an agent
//     that acts on a stale plan, but the second performance must not go unseen.
func (h *harness) checkTime(keys []string) {
	t := h.t
	ctx := context.Background()
	st, err := h.openStore(ctx)
	if err != nil {
		t.Errorf("seed %d: open the database for the time checks: %v", h.seed, err)
		return
	}
	defer st.Close()
	type alertEvent struct {
		id         int64
		kind, key  string
		effectID   string
		errorClass string
		at         time.Time
	}
	var alerts []alertEvent
	unknowns := map[string][]alertEvent{} // "key/effect" → its lease_expired unknown events
	foundTwice := map[string]bool{}       // "key/effect" → a search reported two or more records
	for _, key := range append(slices.Clone(keys), "") {
		for after := int64(0); ; {
			page, err := st.EventList(ctx, key, after, 500)
			if err != nil {
				t.Errorf("seed %d: events of %q: %v", h.seed, key, err)
				return
			}
			for _, e := range page {
				var d struct {
					Alert      string `json:"alert"`
					EffectID   string `json:"effect_id"`
					ErrorClass string `json:"error_class"`
					Found      int    `json:"found"`
				}
				_ = json.Unmarshal(e.Detail, &d)
				ev := alertEvent{id: e.ID, kind: d.Alert, key: key, effectID: d.EffectID, errorClass: d.ErrorClass, at: e.At}
				switch {
				case e.Kind == string(store.EventAlert):
					alerts = append(alerts, ev)
				case e.Kind == string(store.EventEffectReconciled) && d.Found >= 2:
					foundTwice[key+"/"+d.EffectID] = true
				case e.Kind == string(store.EventEffectUnknown) && d.ErrorClass == "lease_expired":
					unknowns[key+"/"+d.EffectID] = append(unknowns[key+"/"+d.EffectID], ev)
				}
			}
			if len(page) < 500 {
				break
			}
			after = page[len(page)-1].ID
		}
	}

	// A clean stop leaves no unknown whose request never left.
	for _, u := range h.unsent {
		if slices.ContainsFunc(unknowns[u.key+"/"+u.effectID], func(e alertEvent) bool { return !e.at.Before(u.startedAt) }) {
			t.Errorf("seed %d: %s %s/%s became unknown (lease_expired) after a clean stop, though its request never left: marked sent-begun at %s during the %s, no request at the provider since",
				h.seed, u.actionType, u.key, u.effectID, u.startedAt.Format("15:04:05.000"), u.stop)
		}
	}

	// Every committed alert event was raised.
	h.imu.Lock()
	procs := slices.Clone(h.procs)
	h.imu.Unlock()
	raisedIDs := map[string]bool{}
	raised := map[string]int{} // kind + " on " + key → lines without an event_id
	for _, s := range procs {
		for _, l := range strings.Split(s.Logs(), "\n") {
			var a alertLine
			if !strings.Contains(l, `"msg":"alert"`) || json.Unmarshal([]byte(l), &a) != nil || a.Msg != "alert" || a.Level != "WARN" {
				continue
			}
			if a.EventID != nil {
				raisedIDs[fmt.Sprint(a.EventID)] = true
			} else {
				raised[a.Alert+" on "+a.Key]++
			}
		}
	}
	missing := map[string]int{}
	for _, a := range alerts {
		switch k := a.kind + " on " + a.key; {
		case raisedIDs[fmt.Sprint(a.id)]:
		case raised[k] > 0:
			raised[k]--
		default:
			missing[k]++
		}
	}
	for k, n := range missing {
		t.Errorf("seed %d: alert %s: %d committed alert event(s) with no warn line \"alert\" in any instance's log", h.seed, k, n)
	}

	// An agent's second performance is on record.
	for pk := range h.paused {
		if h.prov.records(pk) < 2 {
			continue
		}
		if st, ok := h.staleConfirm[pk]; ok && (st == 0 || st >= 500) {
			// The paused agent's report never reached a store that could keep it (its
			// instance died, the store was out, every retry): nothing told airlock.
			h.count("stale_confirm_unheard")
			continue
		}
		key, id, _ := strings.Cut(pk, "/")
		if slices.ContainsFunc(alerts, func(a alertEvent) bool {
			return a.key == key && a.effectID == id && a.kind != "agent_effect_unknown"
		}) {
			continue
		}
		// A later holder's search found both records first: its effect_reconciled event
		// says so (found ≥ 2), the effect went unknown with agent_effect_unknown, and a
		// person decided it — the record is not clean either, whatever the effect's state
		// now (the harness's operator may have resolved it since).
		e, err := st.EffectByRunEffectID(ctx, key, id)
		if foundTwice[pk] && slices.ContainsFunc(alerts, func(a alertEvent) bool { return a.key == key && a.effectID == id }) {
			h.count("twice_found_by_a_search")
			continue
		}
		t.Errorf("seed %d: %s performed twice (an agent paused past its lease, another agent's turn performed it meanwhile; %d records) and no alert event says so (its stale confirm answered %d; the effect is %s, err %v)",
			h.seed, pk, h.prov.records(pk), h.staleConfirm[pk], e.State, err)
	}
}
