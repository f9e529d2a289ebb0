package httpapi

import (
	"net/http"
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
// (older_than: created at least that long ago) and key prefix, in keyset pages. The
// filters are read by audit.RunFilter, as the console's runs page reads them.
func (s *server) listRuns(w http.ResponseWriter, r *http.Request) error {
	p, err := audit.RunFilter(r.URL.Query(), func() (time.Time, error) { return s.Runs.Read(r.Context(), s.Store) })
	if err != nil {
		return err
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
		out.NextAfter = audit.RunCursor(runs[len(runs)-1])
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
