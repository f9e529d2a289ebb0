package approvals

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

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
func (s *Service) SourceURL(ctx context.Context, a store.Approval) (string, error) {
	src := ""
	for after := int64(0); ; {
		evs, err := s.store.EventList(ctx, a.RunKey, after, 1000)
		if err != nil {
			return "", fmt.Errorf("events of %q: %w", a.RunKey, err)
		}
		for _, e := range evs {
			var m runs.Meta
			if len(e.Meta) > 0 && json.Unmarshal(e.Meta, &m) == nil && Linkable(m.SourceURL) {
				src = m.SourceURL
			}
			if e.Kind == string(store.EventApprovalRequested) && strings.Contains(string(e.Detail), a.ID) {
				return src, nil
			}
		}
		if len(evs) < 1000 {
			return src, nil
		}
		after = evs[len(evs)-1].ID
	}
}
