package httpapi

import (
	"net/http"

	"github.com/airlockhq/airlock/internal/audit"
)

// explain is GET /v1/runs/{key}/explain: was it processed, sent, approved, and by which
// model, with the timeline.
func (s *server) explain(w http.ResponseWriter, r *http.Request) error {
	key := r.PathValue("key")
	if err := validKey("key", key); err != nil {
		return err
	}
	svc := s.Audit
	if svc == nil { // it needs nothing but the store
		svc = audit.New(s.Store, nil)
	}
	x, err := svc.Explain(r.Context(), key)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, x)
	return nil
}
