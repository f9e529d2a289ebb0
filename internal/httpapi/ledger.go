package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/runs"
)

// ledgerKey reads and checks the path's key and, where there is one, effect id.
func ledgerPath(r *http.Request) (key, effectID string, err error) {
	key = r.PathValue("key")
	if err := validKey("key", key); err != nil {
		return "", "", err
	}
	if id := r.PathValue("effect_id"); id != "" {
		if err := validKey("effect_id", id); err != nil {
			return "", "", err
		}
		effectID = id
	}
	return key, effectID, nil
}

func (s *server) putLedger(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		LeaseOwner string          `json:"lease_owner"`
		Ledger     json.RawMessage `json:"ledger"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	key, _, err := ledgerPath(r)
	if err != nil {
		return err
	}
	if body.LeaseOwner == "" {
		return missing("lease_owner")
	}
	if len(body.Ledger) == 0 || bytes.Equal(body.Ledger, []byte("null")) {
		return missing("ledger")
	}
	cv, run, err := s.Ledger.Save(r.Context(), key, body.LeaseOwner, body.Ledger, actor(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"checkpoint_version": cv, "version": run.Version})
	return nil
}

func (s *server) getLedger(w http.ResponseWriter, r *http.Request) error {
	key, _, err := ledgerPath(r)
	if err != nil {
		return err
	}
	l, err := s.Ledger.Get(r.Context(), key)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

func (s *server) ledgerSchema(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/schema+json")
	_, err := w.Write(ledger.SchemaJSON)
	return err
}

func (s *server) plan(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		LeaseOwner string          `json:"lease_owner"`
		Action     string          `json:"action"`
		Target     string          `json:"target"`
		InputHash  string          `json:"input_hash"`
		Input      json.RawMessage `json:"input"`
		Meta       *runs.Meta      `json:"meta"`
	}
	if err := decode(r, &b); err != nil {
		return err
	}
	key, id, err := ledgerPath(r)
	if err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"lease_owner", b.LeaseOwner}, {"action", b.Action}, {"target", b.Target}, {"input_hash", b.InputHash}} {
		if f.v == "" {
			return missing(f.name)
		}
		if err := validVisible(f.name, f.v, 320); err != nil {
			return err
		}
	}
	if err := validMeta(b.Meta); err != nil {
		return err
	}
	if err := s.declared(r.Context(), b.Meta); err != nil {
		return err
	}
	if bytes.Equal(bytes.TrimSpace(b.Input), []byte("null")) {
		b.Input = nil
	}
	if len(b.Input) > maxResultBytes {
		return invalid("input", fmt.Sprintf("at most %d bytes", maxResultBytes))
	}
	res, err := s.Ledger.Plan(r.Context(), ledger.PlanRequest{Key: key, EffectID: id, Owner: b.LeaseOwner, Action: b.Action,
		Target: b.Target, InputHash: b.InputHash, Input: b.Input, Actor: actor(r), OnBehalfOf: principal(r.Context()).OnBehalfOf, Meta: b.Meta})
	if err != nil {
		return err
	}
	if a := res.Approval; a != nil {
		ctx, req := context.WithoutCancel(r.Context()), *a
		afterCommit(r.Context(), func() { s.Approvals.Notify(ctx, req, s.Log) })
		writeJSON(w, http.StatusAccepted, map[string]any{"execute": false, "approval_id": a.Approval.ID, "approve_url": a.URL,
			"expires_at": a.Approval.ExpiresAt, "state": a.Run.State, "version": a.Run.Version})
		return nil
	}
	out := map[string]any{"execute": res.Execute}
	if res.Confirmed {
		out["confirmed"] = true
	}
	if res.Receipt != "" {
		out["receipt"] = res.Receipt
	}
	if res.Result != nil {
		out["result"] = res.Result
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) confirm(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		LeaseOwner string          `json:"lease_owner"`
		Receipt    string          `json:"receipt"`
		Result     json.RawMessage `json:"result"`
	}
	if err := decode(r, &b); err != nil {
		return err
	}
	key, id, err := ledgerPath(r)
	if err != nil {
		return err
	}
	if b.LeaseOwner == "" {
		return missing("lease_owner")
	}
	if b.Receipt == "" {
		return missing("receipt")
	}
	if err := validText("receipt", b.Receipt, 500); err != nil {
		return err
	}
	if bytes.Equal(bytes.TrimSpace(b.Result), []byte("null")) {
		b.Result = nil
	}
	if len(b.Result) > maxResultBytes {
		return invalid("result", fmt.Sprintf("at most %d bytes; confirm with the receipt alone", maxResultBytes))
	}
	if err := s.Ledger.Confirm(r.Context(), ledger.ConfirmRequest{Key: key, EffectID: id, Owner: b.LeaseOwner, Receipt: b.Receipt, Result: b.Result, Actor: actor(r)}); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "confirmed", "receipt": b.Receipt})
	return nil
}

func (s *server) reconcile(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		LeaseOwner   string   `json:"lease_owner"`
		Found        []string `json:"found"`
		Undetermined bool     `json:"undetermined"`
	}
	if err := decode(r, &b); err != nil {
		return err
	}
	key, id, err := ledgerPath(r)
	if err != nil {
		return err
	}
	if b.LeaseOwner == "" {
		return missing("lease_owner")
	}
	if b.Found == nil && !b.Undetermined {
		return missing("found (or undetermined: true)")
	}
	for _, f := range b.Found {
		if err := validVisible("found", f, 500); err != nil {
			return err
		}
	}
	status, err := s.Ledger.Reconcile(r.Context(), ledger.ReconcileRequest{Key: key, EffectID: id, Owner: b.LeaseOwner, Found: b.Found, Undetermined: b.Undetermined, Actor: actor(r)})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": status})
	return nil
}

// maxResultBytes bounds a confirmed effect's recorded result (an MCP tool's answer).
const maxResultBytes = 256 << 10

// recordCall writes one tool call of an MCP gateway as an event on the run.
func (s *server) recordCall(w http.ResponseWriter, r *http.Request) error {
	var b ledger.Call
	if err := decode(r, &b); err != nil {
		return err
	}
	key, _, err := ledgerPath(r)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name, v  string
		required bool
	}{{"tool", b.Tool, true}, {"class", b.Class, true}, {"decision", b.Decision, true}, {"upstream", b.Upstream, false},
		{"effect_id", b.EffectID, false}, {"input_hash", b.InputHash, false}, {"action_type", b.Action, false}} {
		if f.v == "" {
			if f.required {
				return missing(f.name)
			}
			continue
		}
		if err := validText(f.name, f.v, 200); err != nil {
			return err
		}
	}
	if !slices.Contains([]string{"read", "effect", "unclassified"}, b.Class) {
		return invalid("class", "must be read, effect or unclassified")
	}
	if err := s.Ledger.RecordCall(r.Context(), key, b, actor(r)); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, map[string]any{"recorded": true})
	return nil
}

func (s *server) resume(w http.ResponseWriter, r *http.Request) error {
	key, _, err := ledgerPath(r)
	if err != nil {
		return err
	}
	v, err := s.Ledger.Resume(r.Context(), key)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}
