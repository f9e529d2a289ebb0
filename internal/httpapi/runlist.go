package httpapi

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/store"
)

// runListItem is one row of GET /v1/runs: what an operator needs to pick a run, never
// the lease owner.
type runListItem struct {
	Key             string      `json:"key"`
	State           store.State `json:"state"`
	Version         int64       `json:"version"`
	ParkReason      string      `json:"park_reason,omitempty"`
	TriggerSource   string      `json:"trigger_source,omitempty"`
	WorkflowVersion string      `json:"workflow_version,omitempty"`
	CreatedAt       time.Time   `json:"created_at"`
	UpdatedAt       time.Time   `json:"updated_at"`
}

// listRuns is GET /v1/runs: runs newest first, filtered by state, action type, age
// (older_than: created at least that long ago) and key prefix, in keyset pages.
func (s *server) listRuns(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := store.RunListParams{Limit: 50, ActionType: q.Get("action_type"), KeyPrefix: q.Get("key_prefix")}
	if v := q.Get("state"); v != "" {
		if !slices.Contains(store.States, store.State(v)) {
			return invalid("state", "must be one of "+joinStates())
		}
		p.State = store.State(v)
	}
	if len(p.KeyPrefix) > maxKeyLen {
		return invalid("key_prefix", "must be at most 200 bytes")
	}
	if v := q.Get("older_than"); v != "" {
		d, err := audit.ParseWindow(v)
		if err != nil {
			return invalid("older_than", "must be a Go duration (36h) or days (7d)")
		}
		now, err := s.Runs.Read(r.Context(), s.Store)
		if err != nil {
			return err
		}
		cutoff := now.Add(-d)
		p.OlderThan = &cutoff
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			return invalid("limit", "must be from 1 to 500")
		}
		p.Limit = n
	}
	if v := q.Get("after"); v != "" {
		at, key, ok := strings.Cut(v, "_")
		us, err := strconv.ParseInt(at, 10, 64)
		if !ok || err != nil || key == "" {
			return invalid("after", "must be the next_after of the previous page")
		}
		p.After = store.Cursor{At: time.UnixMicro(us).UTC(), ID: key}
	}
	runs, err := s.Store.RunList(r.Context(), p)
	if err != nil {
		return err
	}
	out := struct {
		Runs      []runListItem `json:"runs"`
		NextAfter string        `json:"next_after,omitempty"`
	}{Runs: make([]runListItem, 0, len(runs))}
	for _, run := range runs {
		out.Runs = append(out.Runs, runListItem{Key: run.Key, State: run.State, Version: run.Version, ParkReason: run.ParkReason,
			TriggerSource: run.TriggerSource, WorkflowVersion: run.WorkflowVersion, CreatedAt: run.CreatedAt, UpdatedAt: run.UpdatedAt})
	}
	if len(runs) == p.Limit {
		last := runs[len(runs)-1]
		out.NextAfter = strconv.FormatInt(last.CreatedAt.UnixMicro(), 10) + "_" + last.Key
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func joinStates() string {
	var s []string
	for _, st := range store.States {
		s = append(s, string(st))
	}
	return strings.Join(s, ", ")
}
