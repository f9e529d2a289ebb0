package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// Ledger is a run's work ledger: what an agent needs to resume without guessing.
type Ledger struct {
	RunID      string   `json:"run_id"` // the run's key
	Goal       string   `json:"goal"`
	Invariants []string `json:"invariants"` // fixed by the first save; a change is refused
	Completed  []Step   `json:"completed"`  // in the order they were done
	Pending    []string `json:"pending"`
	// NextAllowedAction is the one step the agent may take next.
	NextAllowedAction string `json:"next_allowed_action"`
	// CheckpointVersion is 1 on the first save and one more on each later one.
	CheckpointVersion int `json:"checkpoint_version"`
	// Effects is derived by airlock from plan, confirm and reconcile; it is filled by
	// [Client.Ledger] and never sent by [Client.SaveLedger].
	Effects []LedgerEffect `json:"effects,omitempty"`
}

// Step is a completed step and the evidence a person (or the business) can check.
type Step struct {
	Step     string `json:"step"`
	Evidence string `json:"evidence"` // e.g. "artifact://sources-v3.json", "doc://weekly-report-42"
}

// LedgerEffect is an external effect as the ledger shows it.
type LedgerEffect struct {
	EffectID  string `json:"effect_id"`
	Action    string `json:"action"`
	Target    string `json:"target"`
	InputHash string `json:"input_hash"`
	Status    string `json:"status"` // planned, confirmed, unknown or cleared
	Receipt   string `json:"receipt,omitempty"`
}

// Effect statuses in the ledger.
const (
	EffectPlanned   = "planned"   // intent recorded, outcome not yet confirmed
	EffectConfirmed = "confirmed" // happened; Receipt is the external system's id
	EffectUnknown   = "unknown"   // a search could not decide: a person must
	EffectCleared   = "cleared"   // a search found nothing: plan again to execute
)

// Ledger reads the run's latest ledger; none saved yet is an error with code
// ledger_not_found.
func (c *Client) Ledger(ctx context.Context, key string) (Ledger, error) {
	var out Ledger
	_, err := c.do(ctx, http.MethodGet, runPath(key, "ledger"), nil, &out)
	return out, err
}

// SaveLedger stores l as the run's next checkpoint and returns its checkpoint version.
// l.CheckpointVersion must be the stored one plus 1 (1 for the first save); otherwise the
// error has code version_conflict. Other refusals: invariants_changed, invalid_ledger
// (see [APIError].Errors), lease_lost.
//
// For convenience, an empty RunID is set to key, nil lists are sent as empty ones, and
// Effects is never sent, so a ledger read with [Client.Ledger] can be changed and saved.
func (c *Client) SaveLedger(ctx context.Context, key, leaseOwner string, l Ledger) (int, error) {
	if l.RunID == "" {
		l.RunID = key
	}
	l.Effects = nil
	l.Invariants, l.Pending = nonNil(l.Invariants), nonNil(l.Pending)
	if l.Completed == nil {
		l.Completed = []Step{}
	}
	body := struct {
		LeaseOwner string `json:"lease_owner"`
		Ledger     Ledger `json:"ledger"`
	}{leaseOwner, l}
	var out struct {
		CheckpointVersion int   `json:"checkpoint_version"`
		Version           int64 `json:"version"`
	}
	if _, err := c.do(ctx, http.MethodPut, runPath(key, "ledger"), body, &out); err != nil {
		return 0, err
	}
	return out.CheckpointVersion, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// LedgerSchema returns the JSON Schema (draft 2020-12) every saved ledger must pass.
func (c *Client) LedgerSchema(ctx context.Context) (json.RawMessage, error) {
	var out json.RawMessage
	_, err := c.do(ctx, http.MethodGet, "/v1/ledger.schema.json", nil, &out)
	return out, err
}

// PlanRequest records the intent to perform an effect, before performing it.
type PlanRequest struct {
	LeaseOwner string `json:"lease_owner"`
	Action     string `json:"action"` // an action type of airlock's policy
	Target     string `json:"target"`
	InputHash  string `json:"input_hash"` // see [HashInput]
	// Input, optional, is what the effect will do (any JSON whose [HashInput] is
	// InputHash, else the plan is refused with invalid_field): a gated effect's approval
	// shows it to the person who decides, as a proposed effect's payload.
	Input json.RawMessage `json:"input,omitempty"`
	// Meta is recorded with the plan's events (meta.source_url on the card).
	Meta *Meta `json:"meta,omitempty"`
}

// Plan is airlock's answer to a plan: exactly one of these holds.
//   - Execute: perform the effect now, then [Client.Confirm] it with its receipt.
//   - Confirmed: it was performed before; do NOT perform it again. Receipt is its
//     receipt, empty when a person resolved it as sent without the provider's id.
//   - Approval != nil: the action is gated; the run waits for a person. Exit; after the
//     approval, claim the run again and plan again.
type Plan struct {
	Execute   bool
	Confirmed bool
	Receipt   string
	Result    json.RawMessage // with Receipt: the result confirmed with it, while retained
	Approval  *Approval
}

// Plan records the intent for effectID. Refusals to act on, by code:
// reconcile_first (a previous attempt stopped between plan and confirm: search the
// external system and call [Client.Reconcile]), input_mismatch (the same id with other
// input: stop), actions_disabled (the kill switch), unknown_action_type, lease_lost.
func (c *Client) Plan(ctx context.Context, key, effectID string, req PlanRequest) (Plan, error) {
	var raw struct {
		Execute   bool            `json:"execute"`
		Confirmed bool            `json:"confirmed"`
		Receipt   string          `json:"receipt"`
		Result    json.RawMessage `json:"result"`
		Approval
	}
	status, err := c.do(ctx, http.MethodPost, runPath(key, "ledger", "effects", effectID, "plan"), req, &raw)
	if err != nil {
		return Plan{}, err
	}
	if status == http.StatusAccepted {
		a := raw.Approval
		return Plan{Approval: &a}, nil
	}
	if !raw.Execute && !raw.Confirmed && raw.Receipt == "" {
		return Plan{}, fmt.Errorf("airlock: plan %s: neither execute nor a receipt in the answer", effectID)
	}
	return Plan{Execute: raw.Execute, Confirmed: !raw.Execute, Receipt: raw.Receipt, Result: raw.Result}, nil
}

// Confirm records that the planned effect happened, with the external system's id (or
// another checkable reference) as receipt.
func (c *Client) Confirm(ctx context.Context, key, effectID, leaseOwner, receipt string) error {
	return c.ConfirmResult(ctx, key, effectID, leaseOwner, receipt, nil)
}

// ConfirmResult is [Client.Confirm] with the effect's result (any JSON, at most 256 KiB):
// airlock keeps it under its payload retention and a later [Client.Plan] of the same
// effect answers it in [Plan].Result.
func (c *Client) ConfirmResult(ctx context.Context, key, effectID, leaseOwner, receipt string, result json.RawMessage) error {
	body := struct {
		LeaseOwner string          `json:"lease_owner"`
		Receipt    string          `json:"receipt"`
		Result     json.RawMessage `json:"result,omitempty"`
	}{leaseOwner, receipt, result}
	_, err := c.do(ctx, http.MethodPost, runPath(key, "ledger", "effects", effectID, "confirm"), body, nil)
	return err
}

// Reconcile reports what a search of the external system found for a planned (or
// unknown) effect: the receipts of the matching records, or undetermined when the search
// could not decide. It returns the effect's new status: [EffectCleared] (nothing found:
// plan again), [EffectConfirmed] (exactly one), or [EffectUnknown] (several, or
// undetermined: a person decides and resume says stop).
func (c *Client) Reconcile(ctx context.Context, key, effectID, leaseOwner string, found []string, undetermined bool) (string, error) {
	body := map[string]any{"lease_owner": leaseOwner}
	if undetermined {
		body["undetermined"] = true
	} else {
		body["found"] = nonNil(found)
	}
	var out struct {
		Status string `json:"status"`
	}
	if _, err := c.do(ctx, http.MethodPost, runPath(key, "ledger", "effects", effectID, "reconcile"), body, &out); err != nil {
		return "", err
	}
	return out.Status, nil
}

// Resume verdicts.
const (
	VerdictContinue  = "continue"  // go on from NextAllowedAction
	VerdictReconcile = "reconcile" // search the external system for Reconcile first
	VerdictWait      = "wait"      // a person's approval is pending
	VerdictStop      = "stop"      // a person decides; do not act
)

// Resume is airlock's verdict on how a run may go on.
type Resume struct {
	Verdict           string          `json:"verdict"`
	NextAllowedAction string          `json:"next_allowed_action"`
	Reconcile         []ReconcileItem `json:"reconcile"`
	Reasons           []string        `json:"reasons"`
	CheckpointVersion int             `json:"checkpoint_version"`
}

// ReconcileItem is an effect whose outcome must be looked up before the run goes on.
type ReconcileItem struct {
	EffectID  string `json:"effect_id"`
	Action    string `json:"action"`
	Target    string `json:"target"`
	InputHash string `json:"input_hash"`
	RunID     string `json:"run_id"`
}

// Resume asks how the run may go on. Call it after every claim, before acting.
func (c *Client) Resume(ctx context.Context, key string) (Resume, error) {
	var out Resume
	_, err := c.do(ctx, http.MethodGet, runPath(key, "resume"), nil, &out)
	return out, err
}

// ToolCall is one tool call an MCP gateway handled, recorded as a tool_call event.
type ToolCall struct {
	Tool      string `json:"tool"`
	Upstream  string `json:"upstream,omitempty"`
	Class     string `json:"class"` // read, effect or unclassified
	EffectID  string `json:"effect_id,omitempty"`
	InputHash string `json:"input_hash,omitempty"`
	Decision  string `json:"decision"`
	Action    string `json:"action_type,omitempty"`
}

// RecordToolCall writes c as a tool_call event on the run (which must exist; no lease
// is needed).
func (c *Client) RecordToolCall(ctx context.Context, key string, call ToolCall) error {
	_, err := c.do(ctx, http.MethodPost, runPath(key, "ledger", "calls"), call, nil)
	return err
}
