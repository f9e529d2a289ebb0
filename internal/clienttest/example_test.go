package clienttest

import (
	"context"
	"fmt"
	"os"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/airlocktest"
)

// startAirlock serves airlock in-process for these examples, with the policy
//
//	actions:
//	  create_internal_draft: {connector: worker, gate: none}
//
// A real agent points client.New at its airlock server (`airlock serve --config …`).
func startAirlock() (url, apiKey string, stop func()) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "airlock-example-")
	if err != nil {
		panic(err)
	}
	st, err := airlocktest.OpenSQLite(ctx, dir)
	if err != nil {
		panic(err)
	}
	srv, err := airlocktest.Start(ctx, st, airlocktest.AgentPolicy, nil)
	if err != nil {
		panic(err)
	}
	return srv.URL, srv.APIKey, func() {
		srv.Close()
		st.Close()
		os.RemoveAll(dir)
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// An agent claims its run, saves its first ledger, records the intent to create a
// document, creates it, confirms it with the document's id, saves the step, and asks
// airlock how to go on.
func Example() {
	url, apiKey, stop := startAirlock()
	defer stop()
	ctx := context.Background()
	c := client.New(url, apiKey)
	const key = "report-2026w48"

	claim, err := c.Claim(ctx, client.ClaimRequest{Key: key, Payload: map[string]string{"week": "2026-W48"}, LeaseSeconds: 60})
	must(err)
	fmt.Println("claimed:", claim.Claimed, claim.State)

	// A new run has no ledger yet: resume says continue, and the first save is checkpoint 1.
	l := client.Ledger{
		Goal:              "Draft the weekly report and share it internally",
		Invariants:        []string{"Never send customer names to external services"},
		Pending:           []string{"create_internal_draft", "compare_figures"},
		NextAllowedAction: "create_internal_draft",
		CheckpointVersion: 1,
	}
	cp, err := c.SaveLedger(ctx, key, claim.LeaseOwner, l)
	must(err)
	fmt.Println("checkpoint:", cp)

	// Before the external effect: record the intent, keyed by a stable effect id.
	input := map[string]string{"title": "Weekly report 2026-W48", "body": "Revenue 1,204; tickets 311"}
	hash, err := client.HashInput(input)
	must(err)
	plan, err := c.Plan(ctx, key, "share-draft-01", client.PlanRequest{
		LeaseOwner: claim.LeaseOwner, Action: "create_internal_draft", Target: "internal-docs", InputHash: hash})
	must(err)
	fmt.Println("execute:", plan.Execute)

	// ... create the document here; the document system answers with its id ...
	receipt := "doc://weekly-report-48"
	must(c.Confirm(ctx, key, "share-draft-01", claim.LeaseOwner, receipt))

	// Planning the same effect again (after a restart, say) returns the receipt instead.
	again, err := c.Plan(ctx, key, "share-draft-01", client.PlanRequest{
		LeaseOwner: claim.LeaseOwner, Action: "create_internal_draft", Target: "internal-docs", InputHash: hash})
	must(err)
	fmt.Println("execute again:", again.Execute, "receipt:", again.Receipt)

	l.Completed = append(l.Completed, client.Step{Step: "create_internal_draft", Evidence: receipt})
	l.Pending, l.NextAllowedAction, l.CheckpointVersion = []string{"compare_figures"}, "compare_figures", 2
	cp, err = c.SaveLedger(ctx, key, claim.LeaseOwner, l)
	must(err)
	fmt.Println("checkpoint:", cp)

	r, err := c.Resume(ctx, key)
	must(err)
	fmt.Println("resume:", r.Verdict, r.NextAllowedAction)

	saved, err := c.Ledger(ctx, key)
	must(err)
	for _, e := range saved.Effects {
		fmt.Println("effect:", e.EffectID, e.Status, e.Receipt)
	}
	// Output:
	// claimed: true processing
	// checkpoint: 1
	// execute: true
	// execute again: false receipt: doc://weekly-report-48
	// checkpoint: 2
	// resume: continue compare_figures
	// effect: share-draft-01 confirmed doc://weekly-report-48
}

// An agent stopped between plan and confirm: the document may or may not exist. Resume
// says reconcile; the agent searches the document system by run id and reports what it
// found, and only then goes on.
func Example_reconcile() {
	url, apiKey, stop := startAirlock()
	defer stop()
	ctx := context.Background()
	c := client.New(url, apiKey)
	const key = "report-2026w49"

	claim, err := c.Claim(ctx, client.ClaimRequest{Key: key, Payload: map[string]string{"week": "2026-W49"}, LeaseSeconds: 60})
	must(err)
	_, err = c.SaveLedger(ctx, key, claim.LeaseOwner, client.Ledger{Goal: "Draft the weekly report",
		Pending: []string{"create_internal_draft"}, NextAllowedAction: "create_internal_draft", CheckpointVersion: 1})
	must(err)
	hash, err := client.HashInput(map[string]string{"title": "Weekly report 2026-W49"})
	must(err)
	plan := client.PlanRequest{LeaseOwner: claim.LeaseOwner, Action: "create_internal_draft", Target: "internal-docs", InputHash: hash}
	_, err = c.Plan(ctx, key, "share-draft-01", plan)
	must(err)
	// ... the agent stops here, before it confirms ...

	r, err := c.Resume(ctx, key)
	must(err)
	fmt.Println("resume:", r.Verdict, r.Reconcile[0].EffectID, r.Reconcile[0].RunID)

	// Planning it again is refused until it is reconciled.
	_, err = c.Plan(ctx, key, "share-draft-01", plan)
	fmt.Println("plan again:", client.IsCode(err, "reconcile_first"))

	// The search of the document system by run id found one document.
	status, err := c.Reconcile(ctx, key, "share-draft-01", claim.LeaseOwner, []string{"doc://weekly-report-49"}, false)
	must(err)
	fmt.Println("reconciled:", status)

	r, err = c.Resume(ctx, key)
	must(err)
	fmt.Println("resume:", r.Verdict, r.NextAllowedAction)
	// Output:
	// resume: reconcile share-draft-01 report-2026w49
	// plan again: true
	// reconciled: confirmed
	// resume: continue create_internal_draft
}

// Saves are compare-and-set on the checkpoint version: a second writer holding an old
// view of the ledger is refused, and must stop.
func Example_isCode() {
	url, apiKey, stop := startAirlock()
	defer stop()
	ctx := context.Background()
	c := client.New(url, apiKey)

	claim, err := c.Claim(ctx, client.ClaimRequest{Key: "report-2026w50", PayloadHash: "w50", LeaseSeconds: 60})
	must(err)
	l := client.Ledger{Goal: "Draft the weekly report", Pending: []string{"sources_collected"},
		NextAllowedAction: "sources_collected", CheckpointVersion: 1}
	_, err = c.SaveLedger(ctx, claim.Key, claim.LeaseOwner, l)
	must(err)
	_, err = c.SaveLedger(ctx, claim.Key, claim.LeaseOwner, l) // checkpoint 1 again
	fmt.Println(client.IsCode(err, "version_conflict"))

	l.Invariants, l.CheckpointVersion = []string{"a new rule"}, 2
	_, err = c.SaveLedger(ctx, claim.Key, claim.LeaseOwner, l)
	fmt.Println(client.IsCode(err, "invariants_changed"))
	// Output:
	// true
	// true
}

// HashInput is canonical: the same input hashes the same however it is spelled.
func Example_hashInput() {
	a, _ := client.HashInput(map[string]any{"title": "Weekly report", "pages": 3})
	b, _ := client.HashInput(struct {
		Pages float64 `json:"pages"`
		Title string  `json:"title"`
	}{3.0, "Weekly report"})
	fmt.Println(a == b, len(a))
	// Output: true 64
}
