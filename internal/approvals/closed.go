package approvals

import (
	"context"
	"errors"

	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
)

// Action is the policy of an action type (nil when the policy has none): the card reads
// how its connector will carry the payload.
func (s *Service) Action(actionType string) *policy.Action { return s.Policy.Action(actionType) }

// Closed is the approval of a link that can no longer be used (decided or expired), for
// a person entitled to see what became of it: one who may decide it, or who decided it.
// Everyone else, and every unknown or still open token, gets ErrNotFound, so a link
// tells no one but its approvers whether it was ever valid — its requester included.
func (s *Service) Closed(ctx context.Context, tokenHash string, who Person) (store.Approval, error) {
	a, err := s.Store.ApprovalByTokenHash(ctx, tokenHash)
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, ErrNotFound
	}
	if err != nil {
		return store.Approval{}, err
	}
	now, err := s.Read(ctx, s.Store)
	if err != nil {
		return store.Approval{}, err
	}
	if a.ConsumedAt == nil && a.ExpiresAt.After(now) {
		return store.Approval{}, ErrNotFound // open: the card, not this
	}
	// The requester is no approver of their own request, whatever roles they hold
	// (ErrSelfApproval): they learn neither the outcome nor who decided from the link.
	decidedByMe := a.ConsumedAt != nil && a.ApproverSubject != "" && a.ApproverSubject == who.Subject
	if err := May(a, who); err != nil && !decidedByMe {
		return store.Approval{}, ErrNotFound
	}
	return a, nil
}
