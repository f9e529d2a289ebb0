package approvals

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Stuck approvals: the ones nobody known can decide, the ones about to lapse unanswered,
// and the ones escalated to a second role. Every instance sweeps them (Sweep); each
// one-time step is claimed by a compare-and-set on its column (store.StuckQueries), so
// that of several instances exactly one writes the event, raises the alert and notifies.

// PeopleHorizon is how long a person known only by single sign-on counts as holding the
// roles they last signed in with: airlock keeps no account for them, so it cannot know
// that the identity provider took a role away, or that someone new holds it, until they
// sign in. The retention purge removes whom it no longer counts.
const PeopleHorizon = store.PeopleSeenHorizon

// Holders is everyone airlock knows who could sign in and decide at now: the enabled
// local accounts with their roles, and the people who signed in by single sign-on within
// PeopleHorizon with the roles of their last sign-in.
func Holders(ctx context.Context, q store.Queries, now time.Time) ([]Person, error) {
	users, err := q.UserList(ctx)
	if err != nil {
		return nil, fmt.Errorf("list local accounts: %w", err)
	}
	var out []Person
	for _, u := range users {
		if u.DisabledAt == nil {
			out = append(out, Person{Subject: u.Name, Roles: u.Roles})
		}
	}
	seen, err := q.PeopleSeen(ctx, now.Add(-PeopleHorizon))
	if err != nil {
		return nil, err
	}
	for _, p := range seen {
		out = append(out, Person{Subject: p.Subject, Roles: p.Roles})
	}
	return out, nil
}

// Decidable reports whether someone among people may decide a (May: roles, subjects, an
// escalation that has happened, separation of duties).
func Decidable(a store.Approval, people []Person) bool {
	return slices.ContainsFunc(people, func(p Person) bool { return May(a, p) == nil })
}

// gated reports whether a is a decision a person owes: not a cancel window (the effect
// goes ahead without anyone) nor a sampled review.
func gated(a store.Approval) bool {
	return a.Mode != policy.GateActWithWindow && a.Mode != ModeReview
}

// steps fills in the one-time steps of a new approval of type act, opened at now.
func steps(ap *store.Approval, act *policy.Action, now time.Time) {
	if w := act.Approval.WarnBefore.D(); w > 0 {
		at := ap.ExpiresAt.Add(-w)
		ap.WarnAt = &at
	}
	if x := act.Approval.Escalate; x != nil {
		at := now.Add(x.After.D())
		ap.EscalateAt, ap.EscalationRoles = &at, slices.Clone(x.Roles)
	}
}

// undecidableAtRequest marks a new approval undecidable when nobody known may decide it;
// Request then writes its event, and the caller's Notify raises the alert after the commit.
func (s *Service) undecidableAtRequest(ctx context.Context, q store.Queries, ap *store.Approval, now time.Time) error {
	people, err := Holders(ctx, q, now)
	if err != nil {
		return err
	}
	if !Decidable(*ap, people) {
		ap.UndecidableSince = &now
	}
	return nil
}

func (s *Service) undecidableEvents(ctx context.Context, q store.Queries, a store.Approval, version int64) error {
	detail := map[string]any{"approval_id": a.ID, "action_type": a.ActionType,
		"approver_roles": a.ApproverRoles, "approver_subjects": a.ApproverSubjects, "requested_by": a.RequestedBy}
	if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: a.RunKey, Kind: store.EventApprovalUndecidable, Version: version, Actor: "airlock",
		Detail: detail}); err != nil {
		return err
	}
	return runs.Event(ctx, q, s.At(), runs.Entry{Key: a.RunKey, Kind: store.EventAlert, Version: version, Actor: "airlock",
		Detail: map[string]any{"alert": AlertUndecidable, "approval_id": a.ID}})
}

// Alert kinds of stuck approvals (metrics.AlertKinds).
const (
	AlertUndecidable   = "approval_undecidable"
	AlertExpiryWarning = "approval_expiry_warning"
)

// Sweep is every instance's periodic pass over pending approvals: expire the lapsed ones,
// warn before they lapse, escalate, and find those nobody can decide. A failure of one
// part does not stop the others; the first error is returned.
func (s *Service) Sweep(ctx context.Context) error {
	return errors.Join(s.ExpireDue(ctx), s.WarnDue(ctx), s.EscalateDue(ctx), s.CheckUndecidable(ctx))
}

// WarnDue warns the approvers of every pending approval whose warn_at has come: once per
// approval across instances (the claim of warned_at), with an approval_expiry_warning
// event, an alert and a notification on the type's webhooks.
func (s *Service) WarnDue(ctx context.Context) error {
	return s.stepDue(ctx, store.StepWarn, store.EventApprovalExpiryWarning, func(a store.Approval) map[string]any {
		return map[string]any{"approval_id": a.ID, "expires_at": a.ExpiresAt, "approver_roles": a.ApproverRoles,
			"approver_subjects": a.ApproverSubjects}
	})
}

// EscalateDue escalates every pending approval whose escalate_at has come: from the claim
// of escalated_at on, May lets its escalation roles decide too (separation of duties
// still holds). Once per approval across instances, with an approval_escalated event and
// a notification.
func (s *Service) EscalateDue(ctx context.Context) error {
	return s.stepDue(ctx, store.StepEscalate, store.EventApprovalEscalated, func(a store.Approval) map[string]any {
		return map[string]any{"approval_id": a.ID, "roles": a.EscalationRoles, "expires_at": a.ExpiresAt}
	})
}

func (s *Service) stepDue(ctx context.Context, step store.ApprovalStep, kind store.EventKind, detail func(store.Approval) map[string]any) error {
	due, err := s.Store.ApprovalsDue(ctx, step, s.At(), 100)
	if err != nil {
		return err
	}
	s.hook("approval_steps_listed")
	for _, a := range due {
		var claimed store.Approval
		err := s.Store.Transact(ctx, func(q store.Queries) error {
			if _, err := q.RunLockKeys(ctx, []string{a.RunKey}); err != nil { // runs first
				return err
			}
			var err error
			if claimed, err = q.ApprovalClaimStep(ctx, a.ID, step, s.At()); err != nil {
				return err
			}
			if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: a.RunKey, Kind: kind, Actor: "airlock", Detail: detail(claimed)}); err != nil {
				return err
			}
			if step != store.StepWarn {
				return nil
			}
			return runs.Event(ctx, q, s.At(), runs.Entry{Key: a.RunKey, Kind: store.EventAlert, Actor: "airlock",
				Detail: map[string]any{"alert": AlertExpiryWarning, "approval_id": a.ID}})
		})
		if errors.Is(err, store.ErrNoMatch) {
			continue // taken by another instance, or decided meanwhile
		}
		if err != nil {
			return fmt.Errorf("%s approval %s: %w", step, a.ID, err)
		}
		title := "Approval expires soon: " + claimed.ActionType
		if step == store.StepWarn {
			s.Alerts.Wake()
		} else {
			title = "Approval escalated: " + claimed.ActionType
		}
		s.announce(ctx, claimed, title)
	}
	return nil
}

// announce posts a card about a (a warning, an escalation) to its type's webhooks and
// the legacy notify.webhook_url. It links to the approval's console page, never a token.
func (s *Service) announce(ctx context.Context, a store.Approval, title string) {
	act := s.Policy.Action(a.ActionType)
	if act == nil {
		return
	}
	c := s.cardOf(ctx, a, act, s.Log)
	c.Title = title
	s.notifyWebhooks(ctx, c, a, act, s.Log)
	if hook := s.Policy.Notify.WebhookURL; hook != "" {
		s.webhooks.Add(1)
		go func() {
			defer s.webhooks.Done()
			body, _ := SlackPayload(c)
			if status, _ := s.postOnce(context.WithoutCancel(ctx), hook, body); status/100 != 2 {
				s.Log.Warn("approval notification not sent", "key", a.RunKey, "status", status)
			}
		}()
	}
}

// CheckUndecidable looks at every pending approval a person owes and starts or ends its
// undecidable episode: one approval_undecidable event (and alert) when nobody known may
// decide it, whichever instance sees it first; the mark is cleared when someone may
// again (an account added or given the role, a sign-in, an escalation).
func (s *Service) CheckUndecidable(ctx context.Context) error {
	now, err := s.Read(ctx, s.Store)
	if err != nil {
		return err
	}
	people, err := Holders(ctx, s.Store, now)
	if err != nil {
		return err
	}
	var after store.Cursor
	for {
		page, err := s.Store.ApprovalsPending(ctx, after, s.At(), 500)
		if err != nil {
			return err
		}
		s.hook("undecidable_listed")
		for _, a := range page {
			if !gated(a) {
				continue
			}
			switch can := Decidable(a, people); {
			case !can && a.UndecidableSince == nil:
				if err := s.markUndecidable(ctx, a); err != nil {
					return err
				}
			case can && a.UndecidableSince != nil:
				if _, err := s.Store.ApprovalSetUndecidable(ctx, a.ID, false, s.At()); err != nil && !errors.Is(err, store.ErrNoMatch) {
					return err
				}
				s.Log.Info("approval decidable again", "key", a.RunKey, "approval_id", a.ID)
			}
		}
		if len(page) < 500 {
			return nil
		}
		last := page[len(page)-1]
		after = store.Cursor{At: last.CreatedAt, ID: last.ID}
	}
}

func (s *Service) markUndecidable(ctx context.Context, a store.Approval) error {
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		if _, err := q.RunLockKeys(ctx, []string{a.RunKey}); err != nil { // runs first
			return err
		}
		marked, err := q.ApprovalSetUndecidable(ctx, a.ID, true, s.At())
		if err != nil {
			return err
		}
		return s.undecidableEvents(ctx, q, marked, 0)
	})
	if errors.Is(err, store.ErrNoMatch) {
		return nil // marked by another instance, or decided meanwhile
	}
	if err != nil {
		return fmt.Errorf("mark approval %s undecidable: %w", a.ID, err)
	}
	s.Alerts.Wake()
	return nil
}

// Undecidable lists the pending approvals nobody known can decide, newest first.
func (s *Service) Undecidable(ctx context.Context, after store.Cursor, limit int) ([]store.Approval, error) {
	return s.Store.ApprovalsUndecidable(ctx, after, s.At(), limit)
}

// ConsoleURL is the console page of an approval (no token: the person signs in).
func (s *Service) ConsoleURL(id string) string {
	return s.publicURL + "/console/approvals/" + url.PathEscape(id)
}
