package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
)

// effectView is an effect as the API shows it. The payload is shown only to the worker
// that must perform it.
type effectView struct {
	ID             string            `json:"id"`
	Key            string            `json:"key"`
	EffectID       string            `json:"effect_id"`
	ActionType     string            `json:"action_type"`
	Target         string            `json:"target"`
	Executor       string            `json:"executor"`
	State          store.EffectState `json:"state"`
	PayloadHash    string            `json:"payload_hash"`
	ProviderID     string            `json:"provider_id,omitempty"`
	Attempts       int               `json:"attempts"`
	Version        int64             `json:"version"`
	NotBefore      time.Time         `json:"not_before"`
	LastErrorClass string            `json:"last_error_class,omitempty"`
	CreatedAt      time.Time         `json:"created_at"`
	UpdatedAt      time.Time         `json:"updated_at"`
}

func viewEffect(e store.Effect) effectView {
	return effectView{ID: e.ID, Key: e.RunKey, EffectID: e.EffectID, ActionType: e.ActionType, Target: e.Target,
		Executor: e.Executor, State: e.State, PayloadHash: e.PayloadHash, ProviderID: e.ProviderID,
		Attempts: e.Attempts, Version: e.Version, NotBefore: e.NotBefore, LastErrorClass: e.LastErrorClass,
		CreatedAt: e.CreatedAt, UpdatedAt: e.UpdatedAt}
}

func (s *server) queueEffect(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		leaseBody
		ActionType string          `json:"action_type"`
		Target     string          `json:"target"`
		EffectID   string          `json:"effect_id"`
		Payload    json.RawMessage `json:"payload"`
		Evidence   json.RawMessage `json:"evidence"`
		Gate       string          `json:"gate"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	if len(body.Evidence) > 0 {
		// A workflow cannot vouch for its own output: evidence counts only when an evaluator
		// key recorded it on the run.
		return invalid("evidence", "is not taken from the effect request: an evaluator records it with POST /v1/runs/{key}/evidence")
	}
	lr, err := body.check(r)
	if err == nil {
		err = s.declared(r.Context(), lr.Meta)
	}
	if err != nil {
		return err
	}
	switch {
	case body.ActionType == "":
		return missing("action_type")
	case body.Target == "":
		return missing("target")
	}
	if bytes.Equal(body.Payload, []byte("null")) {
		body.Payload = nil // optional for a type with a schema: the validated value is queued
	}
	if err := validVisible("target", body.Target, 320); err != nil {
		return err
	}
	if body.EffectID != "" {
		if err := validKey("effect_id", body.EffectID); err != nil {
			return err
		}
	}
	sub, err := s.Effects.Submit(r.Context(), effects.QueueRequest{Key: lr.Key, Owner: lr.Owner, Version: lr.Version,
		ActionType: body.ActionType, Target: body.Target, EffectID: body.EffectID, Payload: body.Payload, Actor: lr.Actor,
		OnBehalfOf: principal(r.Context()).OnBehalfOf, Meta: lr.Meta, Gate: body.Gate})
	if err != nil {
		return err
	}
	if a := sub.Approval; a != nil && a.Approval.Mode == policy.GateActWithWindow {
		// Queued, but held until the window closes; the cancel link is in this response only
		// (the same request again gets a fresh one, and the previous link stops working).
		status := http.StatusCreated
		if !sub.Created {
			status = http.StatusOK
		}
		writeJSON(w, status, map[string]any{"created": sub.Created, "version": sub.Run.Version,
			"effect": viewEffect(sub.Effect), "cancel_url": a.URL, "not_before": sub.Effect.NotBefore, "reissued": a.Reissued})
		return nil
	}
	if a := sub.Approval; a != nil {
		ctx, req := context.WithoutCancel(r.Context()), *a
		afterCommit(r.Context(), func() { s.Approvals.Notify(ctx, req, s.Log) })
		// The raw token is in this response (and the approvers' notification) only: only its
		// hash is stored. The same request again reissues it: a fresh link, the old one dead.
		writeJSON(w, http.StatusAccepted, map[string]any{"approval_id": a.Approval.ID, "approve_url": a.URL,
			"expires_at": a.Approval.ExpiresAt, "state": a.Run.State, "version": a.Run.Version, "reissued": a.Reissued})
		return nil
	}
	status := http.StatusCreated
	if !sub.Created {
		status = http.StatusOK
	}
	writeJSON(w, status, map[string]any{"created": sub.Created, "version": sub.Run.Version, "effect": viewEffect(sub.Effect)})
	return nil
}

// reissueApproval gives a pending approval or an open cancel window a fresh link (the
// console's "resend link"): the old link stops working; approvers are notified again.
func (s *server) reissueApproval(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	re, err := s.Approvals.Reissue(r.Context(), id, actor(r))
	if err != nil {
		return err
	}
	out := map[string]any{"approval_id": re.Approval.ID, "key": re.Approval.RunKey, "mode": re.Approval.Mode,
		"effect_id": re.Approval.EffectID, "expires_at": re.Approval.ExpiresAt, "reissued": true}
	if slices.Contains(re.Approval.AllowedDecisions, approvals.Approve) {
		ctx := context.WithoutCancel(r.Context())
		afterCommit(r.Context(), func() { s.Approvals.Notify(ctx, re, s.Log) })
		out["approve_url"] = re.URL
	} else {
		out["cancel_url"] = re.URL
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// defaultWorkerLease is a worker claim's lease when it asks for none (capped by the
// longest lease a client may ask for).
const defaultWorkerLease = 5 * time.Minute

func (s *server) effectsClaim(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Types        []string `json:"types"`
		LeaseSeconds *int64   `json:"lease_seconds"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	if len(body.Types) == 0 {
		return missing("types")
	}
	k := principal(r.Context())
	for _, t := range body.Types {
		if !apikeys.MayHandle(k, t) {
			return apiError(http.StatusForbidden, "forbidden", "this worker key may claim only: "+strings.Join(k.Types, ", "))
		}
	}
	lease, err := leaseSeconds(body.LeaseSeconds, s.Runs.MaxLease()) // a worker's lease too: one it cannot outlive
	if err != nil {
		return err
	}
	if lease == 0 {
		lease = min(defaultWorkerLease, s.Runs.MaxLease()) // never past AIRLOCK_LEASE_MAX
	}
	e, ok, err := s.Effects.WorkerClaim(r.Context(), body.Types, lease, actor(r))
	if err != nil {
		return err
	}
	if !ok {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	writeJSON(w, http.StatusOK, struct {
		effectView
		LeaseOwner     string          `json:"lease_owner"`
		LeaseExpiresAt *time.Time      `json:"lease_expires_at"`
		Payload        json.RawMessage `json:"payload"`
		IdempotencyKey string          `json:"idempotency_key"`
	}{viewEffect(e), e.LeaseOwner, e.LeaseExpiresAt, e.Payload, effects.ProviderKey(e)})
	return nil
}

// workerReport serves /complete, /fail and /unknown for the worker holding the effect.
func (s *server) workerReport(outcome connector.Outcome) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		var body struct {
			LeaseOwner   string `json:"lease_owner"`
			ProviderID   string `json:"provider_id"`
			Retryable    bool   `json:"retryable"`
			Class        string `json:"class"`
			RetryAfterMS int64  `json:"retry_after_ms"`
		}
		if err := decode(r, &body); err != nil {
			return err
		}
		if body.LeaseOwner == "" {
			return missing("lease_owner")
		}
		if err := validVisible("provider_id", body.ProviderID, 200); err != nil {
			return err
		}
		if err := validText("class", body.Class, 200); err != nil {
			return err
		}
		if body.RetryAfterMS < 0 || body.RetryAfterMS > int64(time.Hour/time.Millisecond) {
			return invalid("retry_after_ms", "must be from 0 to 3600000")
		}
		res := connector.Result{Outcome: outcome, ProviderID: body.ProviderID, Class: body.Class}
		if outcome == connector.Refused && body.Retryable {
			res.Outcome, res.RetryAfter = connector.Retryable, time.Duration(body.RetryAfterMS)*time.Millisecond
		}
		if outcome != connector.Sent && body.ProviderID != "" {
			return invalid("provider_id", "only on complete")
		}
		if k := principal(r.Context()); len(k.Types) > 0 {
			e, err := s.Effects.Get(r.Context(), r.PathValue("id"))
			if err != nil {
				return err
			}
			if !apikeys.MayHandle(k, e.ActionType) {
				return apiError(http.StatusForbidden, "forbidden", "this worker key may handle only: "+strings.Join(k.Types, ", "))
			}
		}
		e, err := s.Effects.WorkerReport(r.Context(), r.PathValue("id"), body.LeaseOwner, res, actor(r))
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, viewEffect(e))
		return nil
	}
}

func (s *server) resolveEffect(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Outcome      string `json:"outcome"`
		ProviderID   string `json:"provider_id"`
		NoProviderID bool   `json:"no_provider_id"`
		Note         string `json:"note"`
		Version      int64  `json:"version"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	if body.Outcome == "" {
		return missing("outcome")
	}
	if err := validText("note", body.Note, 2000); err != nil {
		return err
	}
	if err := validVisible("provider_id", body.ProviderID, 200); err != nil {
		return err
	}
	e, err := s.Effects.Resolve(r.Context(), r.PathValue("id"),
		effects.Resolution{Outcome: body.Outcome, ProviderID: body.ProviderID, NoProviderID: body.NoProviderID,
			Note: body.Note, Version: body.Version}, actor(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewEffect(e))
	return nil
}

type killSwitchView struct {
	Scope     string    `json:"scope"`
	Enabled   bool      `json:"enabled"`
	Reason    string    `json:"reason"`
	Actor     string    `json:"actor"`
	UpdatedAt time.Time `json:"updated_at"`
}

func (s *server) getKillSwitch(w http.ResponseWriter, r *http.Request) error {
	switches, envDisabled, err := s.Effects.KillSwitch(r.Context())
	if err != nil {
		return err
	}
	out := struct {
		Scopes      []killSwitchView `json:"scopes"`
		EnvDisabled bool             `json:"env_disabled"`
		Enabled     bool             `json:"enabled"`
	}{Scopes: []killSwitchView{}, EnvDisabled: envDisabled}
	out.Enabled, _ = s.Effects.Enabled(r.Context(), "")
	for _, k := range switches {
		out.Scopes = append(out.Scopes, killSwitchView(k))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) putKillSwitch(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Scope   string `json:"scope"`
		Enabled *bool  `json:"enabled"`
		Reason  string `json:"reason"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	if body.Enabled == nil {
		return missing("enabled")
	}
	if body.Scope == "" {
		body.Scope = effects.GlobalScope
	}
	if err := validText("reason", body.Reason, 500); err != nil {
		return err
	}
	if err := s.Effects.SetKillSwitch(r.Context(), body.Scope, *body.Enabled, body.Reason, actor(r)); err != nil {
		return err
	}
	return s.getKillSwitch(w, r)
}

// cancelEffect withdraws an act_with_window effect: an operator key may, and a runs key
// that holds the run's live lease (lease_owner). Approvers use the cancel link.
func (s *server) cancelEffect(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Reason     string `json:"reason"`
		LeaseOwner string `json:"lease_owner"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	if err := validText("reason", body.Reason, 2000); err != nil {
		return err
	}
	k := principal(r.Context())
	by := effects.Canceller{Operator: apikeys.Allows(k.Scopes, apikeys.ScopeOperator), Owner: body.LeaseOwner}
	switch {
	case by.Operator:
	case !apikeys.Allows(k.Scopes, apikeys.ScopeRuns):
		return apiError(http.StatusForbidden, "forbidden", "cancelling needs an operator key, or a runs key holding the run's lease")
	case body.LeaseOwner == "":
		return missing("lease_owner")
	}
	e, err := s.Effects.Cancel(r.Context(), r.PathValue("id"), body.Reason, actor(r), by)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewEffect(e))
	return nil
}

func (s *server) reviews(w http.ResponseWriter, r *http.Request) error {
	list, err := s.Approvals.Reviews(r.Context())
	if err != nil {
		return err
	}
	out := make([]map[string]any, 0, len(list))
	for _, a := range list {
		out = append(out, map[string]any{"id": a.ID, "key": a.RunKey, "action_type": a.ActionType, "target": a.Target,
			"effect_id": a.EffectID, "payload_hash": a.PayloadHash, "created_at": a.CreatedAt, "expires_at": a.ExpiresAt})
	}
	writeJSON(w, http.StatusOK, map[string]any{"reviews": out})
	return nil
}

func (s *server) review(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Decision string `json:"decision"`
		Note     string `json:"note"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	if body.Decision == "" {
		return missing("decision")
	}
	if err := validText("note", body.Note, 2000); err != nil {
		return err
	}
	k := principal(r.Context())
	a, err := s.Approvals.Review(r.Context(), r.PathValue("id"), body.Decision, body.Note,
		approvals.Person{Subject: "apikey:" + k.Name, Roles: k.Scopes})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": a.ID, "decision": a.Decision, "reviewed_by": a.ApproverSubject})
	return nil
}

// recordEvidence stores an evaluator's finding on a run for approve_by_exception. The
// source is the key's name; only a key that carries the evaluator scope itself (not
// through admin) may record one.
func (s *server) recordEvidence(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Name  string          `json:"name"`
		Value json.RawMessage `json:"value"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	key := r.PathValue("key")
	if err := validKey("key", key); err != nil {
		return err
	}
	k := principal(r.Context())
	if !slices.Contains(k.Scopes, apikeys.ScopeEvaluator) {
		return apiError(http.StatusForbidden, "forbidden", "evidence is recorded only by keys with the evaluator scope")
	}
	switch {
	case body.Name == "":
		return missing("name")
	case len(body.Value) == 0 || bytes.Equal(body.Value, []byte("null")):
		return missing("value")
	}
	if err := validText("name", body.Name, 100); err != nil {
		return err
	}
	ev, err := s.Approvals.RecordEvidence(r.Context(), key, k.Name, body.Name, body.Value, actor(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, map[string]any{"key": ev.RunKey, "source": ev.Source, "name": ev.Name,
		"value": ev.Value, "recorded_at": ev.CreatedAt})
	return nil
}
