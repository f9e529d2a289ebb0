package httpapi_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// performedTwice returns the details of key's performed_twice alert events.
func (h *harness) performedTwice(key string) []map[string]any {
	h.t.Helper()
	evs, err := h.env.Store.EventList(context.Background(), key, 0, 1000)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []map[string]any
	for _, ev := range evs {
		var d map[string]any
		if ev.Kind == "alert" && json.Unmarshal(ev.Detail, &d) == nil && d["alert"] == "performed_twice" {
			out = append(out, d)
		}
	}
	return out
}

func (h *harness) alertsTotal(t *testing.T, kind string) float64 {
	t.Helper()
	return metricValue(t, h.do("GET", "/metrics", "", "", "").raw, `airlock_alerts_total{kind="`+kind+`"}`)
}

// TestPerformedTwiceAgentPausedPastLease is issue 32's probe over HTTP: agent A plans,
// stalls past its 2-second lease, B reclaims, reconciles ("none": A has not written yet),
// plans, acts and confirms; then A acts and confirms with its own receipt. A is refused
// (lease_lost) and its write changes nothing, but the second performance is on the record:
// an alert event carrying both receipts, raised through the alerter and counted.
func TestPerformedTwiceAgentPausedPastLease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		claim := func() string {
			r := h.post("/v1/runs/claim", `{"key":"probe-1","payload":{"ticket":42},"lease_seconds":2}`)
			expect(t, r, 201, "")
			return r.body["lease_owner"].(string)
		}
		base := "/v1/runs/probe-1/ledger/effects/doc-01/"
		plan := func(owner string) response {
			return h.post(base+"plan", `{"lease_owner":"`+owner+`","action":"create_internal_draft","target":"internal-docs","input_hash":"h1"}`)
		}
		confirm := func(owner, receipt string) response {
			return h.post(base+"confirm", `{"lease_owner":"`+owner+`","receipt":"`+receipt+`"}`)
		}
		a := claim()
		expect(t, h.do("PUT", "/v1/runs/probe-1/ledger", h.runsKey, "application/json", `{"lease_owner":"`+a+`","ledger":`+
			`{"run_id":"probe-1","goal":"g","invariants":[],"completed":[],"pending":["create"],"next_allowed_action":"create","checkpoint_version":1}}`), 200, "")
		if r := plan(a); r.status != 200 || r.body["execute"] != true {
			t.Fatalf("A's plan: %d %s", r.status, r.raw)
		}
		h.env.Clock.Advance(5 * time.Second) // A stalls past its lease

		b := claim()
		if v := h.get("/v1/runs/probe-1/resume"); v.body["verdict"] != "reconcile" {
			t.Fatalf("B's resume: %s", v.raw)
		}
		expect(t, h.post(base+"reconcile", `{"lease_owner":"`+b+`","found":[]}`), 200, "")
		if r := plan(b); r.status != 200 || r.body["execute"] != true {
			t.Fatalf("B's plan: %d %s", r.status, r.raw)
		}
		expect(t, confirm(b, "doc-B"), 200, "")
		before := h.alertsTotal(t, "performed_twice")

		// A wakes, acts on the external system and confirms.
		late := confirm(a, "doc-A")
		expect(t, late, 409, "lease_lost")
		if !strings.Contains(late.body["message"].(string), "performed_twice") {
			t.Fatalf("A is not told its receipt was recorded as a second performance: %s", late.raw)
		}
		// The record holds B's confirmation, unchanged.
		e := h.effectsOf("probe-1")[0]
		if e["state"] != "completed" || e["provider_id"] != "doc-B" {
			t.Fatalf("A's late confirm changed the effect: %v", e)
		}
		// ... and the evidence of A's.
		got := h.performedTwice("probe-1")
		if len(got) != 1 || got[0]["effect_id"] != "doc-01" || got[0]["receipt"] != "doc-B" || got[0]["late_receipt"] != "doc-A" ||
			got[0]["state"] != "completed" || got[0]["source"] != "confirm" {
			t.Fatalf("performed_twice events = %v", got)
		}
		if n := h.alertsTotal(t, "performed_twice"); n != before+1 {
			t.Fatalf("airlock_alerts_total{kind=performed_twice} = %v, want %v", n, before+1)
		}
		if !slices.Contains(h.env.Alerts.Kinds(), "performed_twice:probe-1") {
			t.Fatalf("alerts raised = %v", h.env.Alerts.Kinds())
		}
		evs := h.get("/v1/runs/probe-1/events")
		if !strings.Contains(evs.raw, `"performed_twice"`) {
			t.Fatalf("the run's events do not show it: %s", evs.raw)
		}

		// The same late confirmation again (a retry): one alert per effect and receipt.
		expect(t, confirm(a, "doc-A"), 409, "lease_lost")
		if got := h.performedTwice("probe-1"); len(got) != 1 {
			t.Fatalf("a repeated late confirm alerted again: %v", got)
		}
		if n := h.alertsTotal(t, "performed_twice"); n != before+1 {
			t.Fatalf("airlock_alerts_total after a repeat = %v, want %v", n, before+1)
		}
		// B's confirmation again, with its own receipt: an idempotent success, no alert.
		expect(t, confirm(b, "doc-B"), 200, "")
		if got := h.performedTwice("probe-1"); len(got) != 1 {
			t.Fatalf("an identical confirm alerted: %v", got)
		}
	})
}

// TestPerformedTwiceLateConfirmBeforeTheOther: A's late confirm arrives after B has
// reconciled the effect as not done and planned it again, before B confirms: airlock
// cannot stop B, but the record shows A's performance before B's lands.
func TestPerformedTwiceLateConfirmBeforeTheOther(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		claim := func() string {
			r := h.post("/v1/runs/claim", `{"key":"probe-2","payload":{"ticket":42},"lease_seconds":2}`)
			expect(t, r, 201, "")
			return r.body["lease_owner"].(string)
		}
		base := "/v1/runs/probe-2/ledger/effects/doc-01/"
		plan := func(owner string) response {
			return h.post(base+"plan", `{"lease_owner":"`+owner+`","action":"create_internal_draft","target":"internal-docs","input_hash":"h1"}`)
		}
		a := claim()
		expect(t, plan(a), 200, "")
		h.env.Clock.Advance(5 * time.Second)
		// A's lease lapsed and nobody took the run: its plan stands, the next holder will
		// find its document. Refused, not alerted.
		expect(t, h.post(base+"confirm", `{"lease_owner":"`+a+`","receipt":"doc-A0"}`), 409, "lease_lost")
		b := claim()
		// B took the run but has not touched the effect: A's plan is still A's. No alert.
		expect(t, h.post(base+"confirm", `{"lease_owner":"`+a+`","receipt":"doc-A1"}`), 409, "lease_lost")
		if got := h.performedTwice("probe-2"); len(got) != 0 {
			t.Fatalf("alerted while A's own plan stood: %v", got)
		}
		expect(t, h.post(base+"reconcile", `{"lease_owner":"`+b+`","found":[]}`), 200, "")
		expect(t, plan(b), 200, "")
		expect(t, h.post(base+"confirm", `{"lease_owner":"`+a+`","receipt":"doc-A"}`), 409, "lease_lost")
		got := h.performedTwice("probe-2")
		if len(got) != 1 || got[0]["late_receipt"] != "doc-A" || got[0]["state"] != "planned" || got[0]["receipt"] != nil {
			t.Fatalf("performed_twice events = %v", got)
		}
		if e := h.effectsOf("probe-2")[0]; e["state"] != "planned" {
			t.Fatalf("A's late confirm changed the effect: %v", e)
		}
	})
}

// TestPerformedTwiceHolderConfirmsAnotherReceipt: the holder itself confirms an effect
// already confirmed with another receipt (it performed it again): refused as before
// (not_planned), and alerted.
func TestPerformedTwiceHolderConfirmsAnotherReceipt(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		owner, _ := h.claim("twice-3")
		base := "/v1/runs/twice-3/ledger/effects/doc-01/"
		expect(t, h.post(base+"plan", `{"lease_owner":"`+owner+`","action":"create_internal_draft","target":"internal-docs","input_hash":"h1"}`), 200, "")
		expect(t, h.post(base+"confirm", `{"lease_owner":"`+owner+`","receipt":"doc-1"}`), 200, "")
		expect(t, h.post(base+"confirm", `{"lease_owner":"`+owner+`","receipt":"doc-1"}`), 200, "")
		if got := h.performedTwice("twice-3"); len(got) != 0 {
			t.Fatalf("an identical confirm alerted: %v", got)
		}
		expect(t, h.post(base+"confirm", `{"lease_owner":"`+owner+`","receipt":"doc-2"}`), 409, "not_planned")
		got := h.performedTwice("twice-3")
		if len(got) != 1 || got[0]["receipt"] != "doc-1" || got[0]["late_receipt"] != "doc-2" {
			t.Fatalf("performed_twice events = %v", got)
		}
		if e := h.effectsOf("twice-3")[0]; e["provider_id"] != "doc-1" {
			t.Fatalf("the second confirm changed the effect: %v", e)
		}
	})
}

// TestPerformedTwiceLateWorkerReport: an external worker whose lease lapsed reports
// completion after another worker completed the same effect with another receipt.
func TestPerformedTwiceLateWorkerReport(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		owner, v := h.claim("twice-w")
		q := h.post("/v1/runs/twice-w/effects", `{"lease_owner":"`+owner+`","version":`+strconv.FormatInt(v, 10)+`,"action_type":"task","target":"queue","payload":{"n":1}}`)
		expect(t, q, 201, "")
		claimEffect := func() (id, lease string) {
			c := h.do("POST", "/v1/effects/claim", h.workerKey, "application/json", `{"types":["task"],"lease_seconds":2}`)
			expect(t, c, 200, "")
			return c.body["id"].(string), c.body["lease_owner"].(string)
		}
		complete := func(id, lease, pid string) response {
			return h.do("POST", "/v1/effects/"+id+"/complete", h.workerKey, "application/json", `{"lease_owner":"`+lease+`","provider_id":"`+pid+`"}`)
		}
		id, w1 := claimEffect()
		h.env.Clock.Advance(5 * time.Second) // worker 1 stalls past its lease
		if err := h.env.Effects.SweepExpired(ctx); err != nil {
			t.Fatal(err)
		}
		expect(t, h.do("POST", "/v1/effects/"+id+"/resolve", h.operatorKey, "application/json",
			`{"outcome":"not_sent","note":"searched the queue: nothing"}`), 200, "")
		id2, w2 := claimEffect()
		if id2 != id {
			t.Fatalf("worker 2 claimed %s, want %s", id2, id)
		}
		expect(t, complete(id, w2, "job-2"), 200, "")
		expect(t, complete(id, w2, "job-2"), 409, "lease_lost") // a repeat: refused as before, no alert
		if got := h.performedTwice("twice-w"); len(got) != 0 {
			t.Fatalf("an identical report alerted: %v", got)
		}
		before := h.alertsTotal(t, "performed_twice")
		expect(t, complete(id, w1, "job-1"), 409, "lease_lost")
		expect(t, complete(id, w1, "job-1"), 409, "lease_lost")
		got := h.performedTwice("twice-w")
		if len(got) != 1 || got[0]["receipt"] != "job-2" || got[0]["late_receipt"] != "job-1" || got[0]["source"] != "worker_report" {
			t.Fatalf("performed_twice events = %v", got)
		}
		if n := h.alertsTotal(t, "performed_twice"); n != before+1 {
			t.Fatalf("airlock_alerts_total{kind=performed_twice} = %v, want %v", n, before+1)
		}
		if e, _ := h.env.Effects.Get(ctx, id); e.ProviderID != "job-2" {
			t.Fatalf("the late report changed the effect: %+v", e)
		}
	})
}
