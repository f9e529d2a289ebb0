package httpapi

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// approvalListItem is one row of GET /v1/approvals: who may decide it and where it
// stands, never its payload or token.
type approvalListItem struct {
	ID               string     `json:"id"`
	Key              string     `json:"key"`
	Mode             string     `json:"mode"`
	ActionType       string     `json:"action_type"`
	Target           string     `json:"target"`
	RequestedBy      string     `json:"requested_by"`
	ApproverRoles    []string   `json:"approver_roles"`
	ApproverSubjects []string   `json:"approver_subjects"`
	EscalationRoles  []string   `json:"escalation_roles,omitempty"`
	EscalatedAt      *time.Time `json:"escalated_at,omitempty"`
	WarnedAt         *time.Time `json:"warned_at,omitempty"`
	UndecidableSince *time.Time `json:"undecidable_since,omitempty"`
	CreatedAt        time.Time  `json:"created_at"`
	ExpiresAt        time.Time  `json:"expires_at"`
	ConsoleURL       string     `json:"console_url"`
}

// listApprovals is GET /v1/approvals: pending approvals (not sampled reviews), newest
// first, in keyset pages; undecidable=true keeps only those nobody known can decide.
func (s *server) listApprovals(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, undecidable := 50, false
	switch v := q.Get("undecidable"); v {
	case "", "false":
	case "true":
		undecidable = true
	default:
		return invalid("undecidable", "must be true or false")
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			return invalid("limit", "must be from 1 to 500")
		}
		limit = n
	}
	var after store.Cursor
	if v := q.Get("after"); v != "" {
		at, id, ok := strings.Cut(v, "_")
		us, err := strconv.ParseInt(at, 10, 64)
		if !ok || err != nil || id == "" {
			return invalid("after", "must be the next_after of the previous page")
		}
		after = store.Cursor{At: time.UnixMicro(us).UTC(), ID: id}
	}
	var list []store.Approval
	var err error
	if undecidable {
		list, err = s.Approvals.Undecidable(r.Context(), after, limit)
	} else {
		list, err = s.Store.ApprovalsPending(r.Context(), after, s.Approvals.At(), limit)
	}
	if err != nil {
		return err
	}
	out := struct {
		Approvals []approvalListItem `json:"approvals"`
		NextAfter string             `json:"next_after,omitempty"`
	}{Approvals: make([]approvalListItem, 0, len(list))}
	for _, a := range list {
		out.Approvals = append(out.Approvals, approvalListItem{ID: a.ID, Key: a.RunKey, Mode: a.Mode, ActionType: a.ActionType,
			Target: a.Target, RequestedBy: a.RequestedBy, ApproverRoles: orEmpty(a.ApproverRoles), ApproverSubjects: orEmpty(a.ApproverSubjects),
			EscalationRoles: a.EscalationRoles, EscalatedAt: a.EscalatedAt, WarnedAt: a.WarnedAt, UndecidableSince: a.UndecidableSince,
			CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt, ConsoleURL: s.Approvals.ConsoleURL(a.ID)})
	}
	if len(list) == limit {
		last := list[len(list)-1]
		out.NextAfter = strconv.FormatInt(last.CreatedAt.UnixMicro(), 10) + "_" + last.ID
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
