package approvals

import (
	"errors"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
)

// Separation of duties compares identities by skeleton, so a
// look-alike requested_by (Cyrillic а, a zero-width space or soft hyphen in a row stored
// before such names were refused) is the approver's own request; anna is not ana.
func TestMaySeesThroughLookAlikes(t *testing.T) {
	ana := Person{Subject: "ana", Roles: []string{"lead"}}
	approval := func(requestedBy string, requesters ...string) store.Approval {
		return store.Approval{ApproverRoles: []string{"lead"}, SeparationOfDuties: true, AllowedDecisions: []string{Approve, Reject},
			RequestedBy: requestedBy, Requesters: requesters}
	}
	for _, a := range []store.Approval{
		approval("\u0430na"), approval("an\u200ba"), approval("an\u00ada"), approval("\u0410NA"),
		approval("apikey:n8n", "apikey:n8n", Identity("\u0430na")), // a requester stored in the older normal form
	} {
		if err := May(a, ana); !errors.Is(err, ErrSelfApproval) {
			t.Errorf("requested by %q %q: May = %v; want ErrSelfApproval", a.RequestedBy, a.Requesters, err)
		}
	}
	if err := May(approval("anna", "apikey:n8n", "anna"), ana); err != nil {
		t.Errorf("anna's request: %v", err)
	}
	// A subject that is only look-alike characters of nothing is no one.
	if err := May(approval("bob"), Person{Subject: "\u200b", Roles: []string{"lead"}}); !errors.Is(err, ErrSelfApproval) {
		t.Errorf("an invisible subject: %v", err)
	}
}
