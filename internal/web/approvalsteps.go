package web

import (
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// approvalNote is one of a pending approval's one-time steps as the card tells it: the
// expiry warning or the escalation, done or still to come.
type approvalNote struct {
	ID, Label, Text string
	Done            bool
}

// roleList is "role a, role b".
func roleList(roles []string) string {
	out := make([]string, len(roles))
	for i, r := range roles {
		out[i] = "role " + r
	}
	return strings.Join(out, ", ")
}

func stampOf(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 MST") }

// cardNotes say on the card whether the approval's expiry warning went out and whether it
// was escalated, to which roles and since when (warned_at, escalated_at), or when each is
// due; a step the action type does not have is left out.
func cardNotes(a store.Approval) []approvalNote {
	var out []approvalNote
	switch {
	case a.WarnedAt != nil:
		out = append(out, approvalNote{"warned", "Expiry warning", "sent " + stampOf(*a.WarnedAt) + ": the approvers were told it expires soon", true})
	case a.WarnAt != nil:
		out = append(out, approvalNote{"warned", "Expiry warning", "not sent yet; due " + stampOf(*a.WarnAt), false})
	}
	switch {
	case a.EscalatedAt != nil:
		out = append(out, approvalNote{"escalated", "Escalation", "escalated " + stampOf(*a.EscalatedAt) + ": " + roleList(a.EscalationRoles) + " may decide too", true})
	case a.EscalateAt != nil && len(a.EscalationRoles) > 0:
		out = append(out, approvalNote{"escalated", "Escalation", "not yet; " + roleList(a.EscalationRoles) + " may decide too from " + stampOf(*a.EscalateAt) + " if nobody has decided by then", false})
	}
	return out
}

// rowNotes is what a console list's row says of the steps taken: "warned 5m ago",
// "escalated to role lead 35m ago"; "" when neither happened.
func rowNotes(a store.Approval, now time.Time) string {
	var out []string
	if a.WarnedAt != nil {
		out = append(out, "expiry warning sent "+ago(now.Sub(*a.WarnedAt))+" ago")
	}
	if a.EscalatedAt != nil {
		out = append(out, "escalated to "+roleList(a.EscalationRoles)+" "+ago(now.Sub(*a.EscalatedAt))+" ago")
	}
	return strings.Join(out, " · ")
}
