package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/validation"
)

func (s *server) validate(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		leaseBody
		ActionType string          `json:"action_type"`
		Output     json.RawMessage `json:"output"`
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
	if body.ActionType == "" {
		return missing("action_type")
	}
	if len(body.Output) == 0 || bytes.Equal(body.Output, []byte("null")) {
		return missing("output")
	}
	res, err := s.Failures.Validate(r.Context(), failures.ValidateRequest{LeaseRequest: lr, ActionType: body.ActionType, Output: body.Output})
	if err != nil {
		return err
	}
	errs := res.Errors
	if errs == nil {
		errs = []validation.Error{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"valid": res.Valid, "repaired": res.Repaired, "errors": errs,
		"value": res.Value, "state": res.Run.State, "version": res.Run.Version, "repairs": res.Run.Repairs})
	return nil
}

func (s *server) failure(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		leaseBody
		Class        string `json:"class"`
		Detail       string `json:"detail"`
		RetryAfterMS int64  `json:"retry_after_ms"`
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
	if body.Class == "" {
		return missing("class")
	}
	if err := validText("detail", body.Detail, 2000); err != nil {
		return err
	}
	if body.RetryAfterMS < 0 || body.RetryAfterMS > int64(time.Hour/time.Millisecond) {
		return invalid("retry_after_ms", "must be from 0 to 3600000")
	}
	d, err := s.Failures.Failure(r.Context(), failures.FailureRequest{LeaseRequest: lr, Class: body.Class,
		Detail: body.Detail, RetryAfter: time.Duration(body.RetryAfterMS) * time.Millisecond})
	if err != nil {
		return err
	}
	out := map[string]any{"decision": d.Decision, "attempts": d.Attempts, "max_attempts": d.MaxAttempts,
		"state": d.Run.State, "version": d.Run.Version}
	if d.Decision == failures.DecisionRetry {
		out["level"], out["retry_after_ms"] = d.Level, d.RetryAfter.Milliseconds()
	}
	if d.Reason != "" {
		out["reason"] = d.Reason
	}
	if d.Level == "write" {
		out["requeued"] = d.Requeued
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) usage(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		leaseBody
		ModelCalls int    `json:"model_calls"`
		Tokens     int64  `json:"tokens"`
		ActionType string `json:"action_type"`
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
	run, err := s.Failures.Usage(r.Context(), lr, body.ModelCalls, body.Tokens, body.ActionType)
	if err != nil {
		return err
	}
	b := s.Failures.Budget(run.ActionType)
	writeJSON(w, http.StatusOK, map[string]any{"key": run.Key, "version": run.Version, "state": run.State,
		"model_calls": max(run.ModelCalls, run.Validations), "tokens": run.Tokens,
		"budget": map[string]any{"max_model_calls": b.MaxModelCalls, "max_tokens": b.MaxTokens, "run_deadline_ms": b.RunDeadline.Milliseconds()}})
	return nil
}

func (s *server) replace(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		NewKey string `json:"new_key"`
		Reason string `json:"reason"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	key := r.PathValue("key")
	if err := validKey("key", key); err != nil {
		return err
	}
	if err := validKey("new_key", body.NewKey); err != nil {
		return err
	}
	if err := validText("reason", body.Reason, 2000); err != nil {
		return err
	}
	rep, err := s.Failures.Replace(r.Context(), key, body.NewKey, body.Reason, actor(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"old_key": rep.OldKey, "new_key": rep.NewKey, "reason": rep.Reason,
		"actor": rep.Actor, "provider_ids": rep.ProviderIDs, "protocol": runs.RerunProtocol})
	return nil
}

// unpark is an operator's way out of a parked run (failures.Service.Unpark).
func (s *server) unpark(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		To     string `json:"to"`
		Reason string `json:"reason"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	key := r.PathValue("key")
	if err := validKey("key", key); err != nil {
		return err
	}
	if err := validText("reason", body.Reason, 2000); err != nil {
		return err
	}
	run, err := s.Failures.Unpark(r.Context(), key, store.State(body.To), body.Reason, actor(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"key": run.Key, "state": run.State, "version": run.Version})
	return nil
}
