package approvals

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Linkable: an absolute http or https URL with a host and no credentials, the only
// source links a card or a notification makes (javascript:, data: and the rest never are).
func Linkable(s string) bool {
	if s == "" {
		return false
	}
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil
}

// SourceURL is the source record's link of approval a, as its card shows it: the latest
// meta.source_url the workflow or agent gave on the run's events up to a's request
// (checked at the API, and by Linkable again here). "" when none was given.
//
// The request event exists whenever the approval does (one transaction wrote both), but
// a listing may hold it back behind an older writer still open (PostgreSQL); until it is
// seen the answer could only be an earlier link, so it is looked up again (bounded by
// sourceWait), and an error is returned rather than a link the effect did not name.
func (s *Service) SourceURL(ctx context.Context, a store.Approval) (string, error) {
	for wait, waited := 50*time.Millisecond, time.Duration(0); ; wait = min(2*wait, time.Second) {
		src, found, err := s.sourceUpTo(ctx, a)
		if err != nil || found {
			return src, err
		}
		if waited >= sourceWait {
			return "", fmt.Errorf("events of %q: the request of approval %s not listed after %s", a.RunKey, a.ID, sourceWait)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(wait):
			waited += wait
		}
	}
}

// sourceWait bounds how long SourceURL waits for an approval's request event to be listed.
const sourceWait = 30 * time.Second

// sourceUpTo walks a's run's events up to a's request event; found says it was reached.
func (s *Service) sourceUpTo(ctx context.Context, a store.Approval) (src string, found bool, err error) {
	for after := int64(0); ; {
		evs, err := s.Store.EventList(ctx, a.RunKey, after, 1000)
		if err != nil {
			return "", false, fmt.Errorf("events of %q: %w", a.RunKey, err)
		}
		for _, e := range evs {
			var m runs.Meta
			if len(e.Meta) > 0 && json.Unmarshal(e.Meta, &m) == nil && Linkable(m.SourceURL) {
				src = m.SourceURL
			}
			if e.Kind == string(store.EventApprovalRequested) && strings.Contains(string(e.Detail), a.ID) {
				return src, true, nil
			}
		}
		if len(evs) < 1000 {
			return src, false, nil
		}
		after = evs[len(evs)-1].ID
	}
}
