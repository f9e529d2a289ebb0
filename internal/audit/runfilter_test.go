package audit_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// TestRunFilter reads the runs list's filters as GET /v1/runs and the console take them:
// each bad value is a FieldError naming its parameter, the clock is read only for
// older_than, and a cursor round-trips.
func TestRunFilter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	reads := 0
	clock := func() (time.Time, error) { reads++; return now, nil }
	p, err := audit.RunFilter(url.Values{}, clock)
	if err != nil || p.Limit != audit.RunListPage || p.State != "" || p.OlderThan != nil || !p.After.IsZero() || reads != 0 {
		t.Fatalf("no filters: %+v %v (clock read %d times)", p, err, reads)
	}
	run := store.Run{Key: "ord_7", CreatedAt: now.Add(-time.Hour)}
	q := url.Values{"state": {"completed"}, "action_type": {"email"}, "older_than": {"1d12h"}, "key_prefix": {"ord"}, "limit": {"500"}, "after": {audit.RunCursor(run)}}
	p, err = audit.RunFilter(q, clock)
	if err != nil || p.State != store.StateCompleted || p.ActionType != "email" || p.KeyPrefix != "ord" || p.Limit != 500 ||
		!p.OlderThan.Equal(now.Add(-36*time.Hour)) || p.After.ID != "ord_7" || !p.After.At.Equal(run.CreatedAt) || reads != 1 {
		t.Fatalf("all filters: %+v %v", p, err)
	}
	for q, field := range map[string]string{
		"state=bogus": "state", "limit=0": "limit", "limit=501": "limit", "limit=x": "limit", "after=x": "after", "after=12_": "after",
		"after=_k": "after", "older_than=soon": "older_than", "older_than=0s": "older_than", "older_than=-1h": "older_than",
		"key_prefix=" + strings.Repeat("k", 201): "key_prefix",
	} {
		v, _ := url.ParseQuery(q)
		_, err := audit.RunFilter(v, clock)
		var fe *runs.FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: %v, want a FieldError for %s", q, err, field)
		}
	}
	outage := errors.New("database down")
	if _, err := audit.RunFilter(url.Values{"older_than": {"1h"}}, func() (time.Time, error) { return time.Time{}, outage }); !errors.Is(err, outage) {
		t.Fatalf("the clock's error: %v", err)
	}
}
