package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

type claimRequest struct {
	Key             string          `json:"key"`
	Payload         json.RawMessage `json:"payload"`
	PayloadHash     string          `json:"payload_hash"`
	TriggerSource   string          `json:"trigger_source"`
	WorkflowVersion string          `json:"workflow_version"`
	LeaseSeconds    *int64          `json:"lease_seconds"`
	Meta            *runs.Meta      `json:"meta"`
}

type claimResponse struct {
	Claimed        bool            `json:"claimed"`
	Reclaimed      bool            `json:"reclaimed,omitempty"`
	Key            string          `json:"key"`
	State          store.State     `json:"state"`
	Version        int64           `json:"version"`
	PayloadHash    string          `json:"payload_hash"`
	LeaseOwner     string          `json:"lease_owner,omitempty"`
	LeaseExpiresAt *time.Time      `json:"lease_expires_at,omitempty"`
	Result         json.RawMessage `json:"result,omitempty"`
}

func (s *server) claim(w http.ResponseWriter, r *http.Request) error {
	var req claimRequest
	if err := decodeClaim(r, &req); err != nil {
		return err
	}
	if err := validKey("key", req.Key); err != nil {
		return err
	}
	hasPayload := len(req.Payload) > 0 && !bytes.Equal(req.Payload, []byte("null"))
	switch {
	case hasPayload && req.PayloadHash != "":
		return invalid("payload_hash", "give payload or payload_hash, not both")
	case !hasPayload && req.PayloadHash == "":
		return missing("payload or payload_hash")
	}
	hash := req.PayloadHash
	if hasPayload {
		var err error
		if hash, err = runs.HashPayload(req.Payload); err != nil {
			return invalid("payload", "cannot be canonicalised (RFC 8785): "+err.Error())
		}
	} else if err := validKey("payload_hash", hash); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"trigger_source", req.TriggerSource}, {"workflow_version", req.WorkflowVersion}} {
		if err := validText(f.name, f.v, 200); err != nil {
			return err
		}
	}
	if err := validMeta(req.Meta); err != nil {
		return err
	}
	if err := s.declared(r.Context(), req.Meta); err != nil {
		return err
	}
	trigger := req.TriggerSource
	if trigger == "" && req.Meta != nil {
		trigger = req.Meta.TriggerSource
	}
	if !hasPayload && s.Failures.HasInputSchema(trigger) {
		return invalid("payload", "this trigger source's input is checked against a schema: send payload, not payload_hash")
	}
	if hasPayload {
		if err := s.Failures.CheckInput(trigger, req.Payload); err != nil {
			return err
		}
	}
	lease, err := leaseSeconds(req.LeaseSeconds, s.Runs.MaxLease())
	if err != nil {
		return err
	}
	res, err := s.Runs.Claim(r.Context(), runs.ClaimRequest{
		Key: req.Key, PayloadHash: hash, TriggerSource: req.TriggerSource,
		WorkflowVersion: req.WorkflowVersion, Lease: lease, Actor: actor(r), Meta: req.Meta,
	})
	if err != nil {
		return err
	}
	run := res.Run
	resp := claimResponse{Claimed: res.Claimed, Reclaimed: res.Reclaimed, Key: run.Key, State: run.State,
		Version: run.Version, PayloadHash: run.PayloadHash}
	if res.Claimed {
		resp.LeaseOwner, resp.LeaseExpiresAt = run.LeaseOwner, run.LeaseExpiresAt
		writeClaimJSON(w, http.StatusCreated, &resp)
		return nil
	}
	resp.Result = run.Result
	// A duplicate while another process holds a live lease says when that lease lapses
	// (never who holds it), so a waiting client sleeps once instead of polling.
	if run.State == store.StateProcessing && run.LeaseExpiresAt != nil {
		resp.LeaseExpiresAt = run.LeaseExpiresAt
	}
	writeClaimJSON(w, http.StatusOK, &resp)
	return nil
}

// leaseSeconds reads lease_seconds, bounded by max before it becomes a Duration (which
// would wrap: 18446744075 s is about one second as nanoseconds in an int64).
func leaseSeconds(v *int64, max time.Duration) (time.Duration, error) {
	if v == nil {
		return 0, nil
	}
	if *v <= 0 || *v > int64(max/time.Second) {
		return 0, invalid("lease_seconds", fmt.Sprintf("must be between 1 and %d seconds", int64(max/time.Second)))
	}
	return time.Duration(*v) * time.Second, nil
}

// runView is GET /v1/runs/{key}. It never shows the lease owner: that value is the
// capability to move the run, held only by whoever claimed it.
type runView struct {
	Key             string          `json:"key"`
	State           store.State     `json:"state"`
	Version         int64           `json:"version"`
	PayloadHash     string          `json:"payload_hash"`
	Result          json.RawMessage `json:"result,omitempty"`
	Lease           leaseView       `json:"lease"`
	Duplicates      int64           `json:"duplicates"`
	Reclaims        int64           `json:"reclaims"`
	TriggerSource   string          `json:"trigger_source,omitempty"`
	WorkflowVersion string          `json:"workflow_version,omitempty"`
	CreatedAt       time.Time       `json:"created_at"`
	UpdatedAt       time.Time       `json:"updated_at"`
	Effects         []effectView    `json:"effects"`
	ActionType      string          `json:"action_type,omitempty"`
	ModelCalls      int             `json:"model_calls"`
	Tokens          int64           `json:"tokens"`
	Validations     int             `json:"validations"`
	Repairs         int             `json:"repairs"`
	ParkReason      string          `json:"park_reason,omitempty"`
	ReplacedBy      *replacement    `json:"replaced_by,omitempty"`
	Replaces        *replacement    `json:"replaces,omitempty"`
}

// replacement is one side of a rerun-protocol link.
type replacement struct {
	Key         string    `json:"key"`
	Reason      string    `json:"reason"`
	Actor       string    `json:"actor"`
	ProviderIDs []string  `json:"provider_ids"`
	At          time.Time `json:"at"`
}

type leaseView struct {
	Live      bool       `json:"live"`
	StartedAt *time.Time `json:"started_at,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

func (s *server) getRun(w http.ResponseWriter, r *http.Request) error {
	key := r.PathValue("key")
	if err := validKey("key", key); err != nil {
		return err
	}
	run, err := s.Runs.Get(r.Context(), key)
	if err != nil {
		return err
	}
	now, err := s.Store.Clock(r.Context())
	if err != nil {
		return err
	}
	effs, err := s.Effects.List(r.Context(), store.EffectListParams{RunKey: key})
	if err != nil {
		return err
	}
	views := make([]effectView, 0, len(effs))
	for _, e := range effs {
		views = append(views, viewEffect(e))
	}
	by, of, err := s.Failures.Replacements(r.Context(), key)
	if err != nil {
		return err
	}
	view := runView{Effects: views,
		Key: run.Key, State: run.State, Version: run.Version, PayloadHash: run.PayloadHash,
		Result: run.Result, Duplicates: run.Duplicates, Reclaims: run.Reclaims,
		Lease:         leaseView{Live: run.LeaseLive(now), StartedAt: run.LeaseStartedAt, ExpiresAt: run.LeaseExpiresAt},
		TriggerSource: run.TriggerSource, WorkflowVersion: run.WorkflowVersion,
		CreatedAt: run.CreatedAt, UpdatedAt: run.UpdatedAt,
		ActionType: run.ActionType, ModelCalls: max(run.ModelCalls, run.Validations), Tokens: run.Tokens,
		Validations: run.Validations, Repairs: run.Repairs, ParkReason: run.ParkReason,
	}
	if by != nil {
		view.ReplacedBy = &replacement{Key: by.NewKey, Reason: by.Reason, Actor: by.Actor, ProviderIDs: by.ProviderIDs, At: by.CreatedAt}
	}
	if of != nil {
		view.Replaces = &replacement{Key: of.OldKey, Reason: of.Reason, Actor: of.Actor, ProviderIDs: of.ProviderIDs, At: of.CreatedAt}
	}
	writeJSON(w, http.StatusOK, view)
	return nil
}

type eventView struct {
	ID      int64           `json:"id"`
	At      time.Time       `json:"at"`
	Kind    string          `json:"kind"`
	Version int64           `json:"version,omitempty"`
	Actor   string          `json:"actor,omitempty"`
	Meta    json.RawMessage `json:"meta,omitempty"`
	Detail  json.RawMessage `json:"detail,omitempty"`
}

func (s *server) events(w http.ResponseWriter, r *http.Request) error {
	key := r.PathValue("key")
	if err := validKey("key", key); err != nil {
		return err
	}
	after, limit := int64(0), 100
	if v := r.URL.Query().Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return invalid("after", "must be an event id (a whole number ≥ 0)")
		}
		after = n
	}
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return invalid("limit", "must be from 1 to 1000")
		}
		limit = n
	}
	evs, err := s.Runs.Events(r.Context(), key, after, limit)
	if err != nil {
		return err
	}
	out := struct {
		Events    []eventView `json:"events"`
		NextAfter int64       `json:"next_after,omitempty"`
	}{Events: make([]eventView, 0, len(evs))}
	for _, e := range evs {
		out.Events = append(out.Events, eventView{ID: e.ID, At: e.At, Kind: e.Kind, Version: e.Version, Actor: e.Actor, Meta: e.Meta, Detail: e.Detail})
	}
	if len(evs) == limit {
		out.NextAfter = evs[len(evs)-1].ID
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

type leaseBody struct {
	LeaseOwner string     `json:"lease_owner"`
	Version    *int64     `json:"version"`
	Meta       *runs.Meta `json:"meta"`
}

func (b leaseBody) check(r *http.Request) (runs.LeaseRequest, error) {
	key := r.PathValue("key")
	if err := validKey("key", key); err != nil {
		return runs.LeaseRequest{}, err
	}
	if b.LeaseOwner == "" {
		return runs.LeaseRequest{}, missing("lease_owner")
	}
	if len(b.LeaseOwner) > 100 {
		return runs.LeaseRequest{}, invalid("lease_owner", "longer than 100 characters")
	}
	if b.Version == nil {
		return runs.LeaseRequest{}, missing("version")
	}
	if err := validMeta(b.Meta); err != nil {
		return runs.LeaseRequest{}, err
	}
	return runs.LeaseRequest{Key: key, Owner: b.LeaseOwner, Version: *b.Version, Actor: actor(r), Meta: b.Meta}, nil
}

func (s *server) heartbeat(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		leaseBody
		LeaseSeconds *int64 `json:"lease_seconds"`
		Release      bool   `json:"release"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	lr, err := body.check(r)
	if err == nil {
		err = s.declared(r.Context(), lr.Meta)
	}
	if err != nil {
		return err
	}
	var run store.Run
	if body.Release {
		if body.LeaseSeconds != nil {
			return invalid("lease_seconds", "not with release: a release ends the lease now")
		}
		run, err = s.Runs.Release(r.Context(), lr)
	} else {
		var lease time.Duration
		if lease, err = leaseSeconds(body.LeaseSeconds, s.Runs.MaxLease()); err != nil {
			return err
		}
		run, err = s.Runs.Heartbeat(r.Context(), lr, lease)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"key": run.Key, "version": run.Version,
		"lease_expires_at": run.LeaseExpiresAt, "lease_started_at": run.LeaseStartedAt})
	return nil
}

func (s *server) transition(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		leaseBody
		To     string          `json:"to"`
		Result json.RawMessage `json:"result"`
		Alert  string          `json:"alert"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	lr, err := body.check(r)
	if err == nil {
		err = s.declared(r.Context(), lr.Meta)
	}
	if err != nil {
		return err
	}
	if body.To == "" {
		return missing("to")
	}
	if err := validText("alert", body.Alert, 200); err != nil {
		return err
	}
	result := body.Result
	if bytes.Equal(result, []byte("null")) {
		result = nil
	}
	run, err := s.Runs.Transition(r.Context(), runs.TransitionRequest{LeaseRequest: lr, To: store.State(body.To), Result: result, Alert: body.Alert})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"key": run.Key, "state": run.State, "version": run.Version})
	return nil
}
