package audit

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// RunListPage is the rows of a runs list page unless the query says otherwise.
const RunListPage = 50

// maxKeyPrefix bounds key_prefix as a key is bounded.
const maxKeyPrefix = 200

// RunFilter reads the filters of a runs list — GET /v1/runs and the console's runs
// page read them alike — from a query: state, action_type, older_than (a window: created
// at least that long before now), key_prefix, limit (1–500) and after (the previous
// page's cursor, "µs_key"). now is the database clock, read only for older_than. A bad
// value is a *runs.FieldError naming the parameter; nothing is looked up.
func RunFilter(q url.Values, now func() (time.Time, error)) (store.RunListParams, error) {
	p := store.RunListParams{Limit: RunListPage, ActionType: q.Get("action_type"), KeyPrefix: q.Get("key_prefix")}
	if v := q.Get("state"); v != "" {
		if !slices.Contains(store.States, store.State(v)) {
			return p, &runs.FieldError{Field: "state", Msg: "must be one of " + joinStates()}
		}
		p.State = store.State(v)
	}
	if len(p.KeyPrefix) > maxKeyPrefix {
		return p, &runs.FieldError{Field: "key_prefix", Msg: "must be at most 200 bytes"}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			return p, &runs.FieldError{Field: "limit", Msg: "must be from 1 to 500"}
		}
		p.Limit = n
	}
	if v := q.Get("after"); v != "" {
		c, ok := ParseRunCursor(v)
		if !ok {
			return p, &runs.FieldError{Field: "after", Msg: "must be the next_after of the previous page"}
		}
		p.After = c
	}
	switch v := q.Get("stalled"); v {
	case "":
	case "true":
		t, err := now()
		if err != nil {
			return p, err
		}
		p.StalledAt = &t
	default:
		return p, &runs.FieldError{Field: "stalled", Msg: "must be true (or left out)"}
	}
	if v := q.Get("older_than"); v != "" {
		d, err := ParseWindow(v)
		if err != nil {
			return p, &runs.FieldError{Field: "older_than", Msg: "must be a Go duration (36h) or days (7d)"}
		}
		t, err := now()
		if err != nil {
			return p, err
		}
		cutoff := t.Add(-d)
		p.OlderThan = &cutoff
	}
	return p, nil
}

// RunCursor is the cursor after run: its creation time (µs) and key.
func RunCursor(run store.Run) string {
	return strconv.FormatInt(run.CreatedAt.UnixMicro(), 10) + "_" + run.Key
}

// ParseRunCursor reads RunCursor's form.
func ParseRunCursor(s string) (store.Cursor, bool) {
	at, key, ok := strings.Cut(s, "_")
	us, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil || key == "" {
		return store.Cursor{}, false
	}
	return store.Cursor{At: time.UnixMicro(us).UTC(), ID: key}, true
}

func joinStates() string {
	var s []string
	for _, st := range store.States {
		s = append(s, string(st))
	}
	return strings.Join(s, ", ")
}
