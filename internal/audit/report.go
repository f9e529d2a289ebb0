package audit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/store"
)

// Report is `airlock report`: the weekly figures, computed from the events of a window
// (at >= Since), plus what is outstanding now. A rate or a percentile is null when there
// was nothing to divide or rank. Field names are a stable contract.
type Report struct {
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// Runs is the number of runs with an event in the window; NewRuns, those first
	// claimed in it.
	Runs    int64 `json:"runs"`
	NewRuns int64 `json:"new_runs"`
	// Claims are the deliveries that took a run (first claims and reclaims); Duplicates,
	// those refused because the key was taken.
	Claims            int64    `json:"claims"`
	Reclaims          int64    `json:"reclaims"`
	Duplicates        int64    `json:"duplicates"`
	PayloadMismatches int64    `json:"payload_mismatches"`
	DuplicateRate     *float64 `json:"duplicate_rate"` // duplicates / (claims + duplicates)

	GateWait GateWait `json:"gate_wait"`

	Validations           int64    `json:"validations"`
	ValidationsInvalid    int64    `json:"validations_invalid"`
	ValidationFailureRate *float64 `json:"validation_failure_rate"` // invalid / validations

	Approvals    Approvals    `json:"approvals"`
	RetryCapHits RetryCapHits `json:"retry_cap_hits"`
	Effects      EffectCounts `json:"effects"`
	// Alerts counts the alert events of the window by kind.
	Alerts     map[string]int64 `json:"alerts"`
	KillSwitch KillSwitch       `json:"kill_switch"`
}

// GateWait is the time people took to decide approvals decided in the window, from
// approval_requested to approval_decided: airlock's own measurement, not an estimate.
type GateWait struct {
	Decided    int      `json:"decided"`
	Unpaired   int      `json:"unpaired"` // decisions whose request event is no longer kept
	P50Seconds *float64 `json:"p50_seconds"`
	P95Seconds *float64 `json:"p95_seconds"`
	MaxSeconds *float64 `json:"max_seconds"`
	Method     string   `json:"method"`
}

// Approvals compares approve_by_exception's automatic approvals with people's.
type Approvals struct {
	Auto          int64    `json:"auto"`           // auto_approved events
	HumanApproved int64    `json:"human_approved"` // approval_decided with decision approve
	HumanRejected int64    `json:"human_rejected"`
	AutoDeclined  int64    `json:"auto_declined"` // the rule did not hold: a person was asked
	AutoShare     *float64 `json:"auto_share"`    // auto / (auto + human_approved)
}

// RetryCapHits are the failures that used up their attempts: runs (the failure table's
// retry_cap) and effects (the outbox's max_attempts).
type RetryCapHits struct {
	Runs    int64 `json:"runs"`
	Effects int64 `json:"effects"`
	Total   int64 `json:"total"`
}

// EffectCounts are the outbox's figures: what happened in the window, and what is
// outstanding now.
type EffectCounts struct {
	Queued             int64 `json:"queued"`
	Sent               int64 `json:"sent"`
	Failed             int64 `json:"failed"`
	Unknown            int64 `json:"unknown"`
	UnknownOutstanding int64 `json:"unknown_outstanding"`
	FailedOutstanding  int64 `json:"failed_outstanding"`
}

// KillSwitch is the database's setting now (a process may also be held by
// AI_ACTIONS_ENABLED in its own environment, which the database cannot see).
type KillSwitch struct {
	Enabled        bool     `json:"enabled"`
	DisabledScopes []string `json:"disabled_scopes"`
}

// detailKinds are the events whose detail the report reads; the rest are only counted.
var detailKinds = []string{"validation", "effect_failed", "effect_reconciled", "effect_resolved", "alert"}

// Report computes the figures over the events at or after since.
func (s *Service) Report(ctx context.Context, since time.Time) (Report, error) {
	now, err := s.Read(ctx, s.store)
	if err != nil {
		return Report{}, fmt.Errorf("report: %w", err)
	}
	r := Report{Since: since.UTC(), Until: now.UTC(), Alerts: map[string]int64{}}
	c, err := s.store.AuditCount(ctx, since)
	if err != nil {
		return Report{}, fmt.Errorf("report: %w", err)
	}
	k := c.ByKind
	r.Runs, r.NewRuns = c.Runs, k["claimed"]
	r.Claims, r.Reclaims = k["claimed"]+k["lease_reclaimed"], k["lease_reclaimed"]
	r.Duplicates, r.PayloadMismatches = k["duplicate"], k["payload_mismatch"]
	r.DuplicateRate = ratio(r.Duplicates, r.Claims+r.Duplicates)
	r.Validations = k["validation"]
	r.Approvals.Auto, r.Approvals.AutoDeclined = k["auto_approved"], k["auto_approval_declined"]
	r.RetryCapHits.Runs = k["retry_cap"]
	r.Effects.Queued, r.Effects.Unknown, r.Effects.Failed = k["effect_queued"], k["effect_unknown"], k["effect_failed"]
	r.Effects.Sent = k["effect_completed"] + k["effect_confirmed"]

	err = s.store.AuditEvents(ctx, since, detailKinds, func(se store.Event) error {
		e := decode(se)
		switch e.Kind {
		case "validation":
			if e.detail["valid"] != true {
				r.ValidationsInvalid++
			}
		case "effect_failed":
			if e.has("retry_cap") { // a retryable failure past max_attempts, not a refusal
				r.RetryCapHits.Effects++
			}
		case "effect_reconciled", "effect_resolved":
			if _, ok := sentBy(e); ok {
				r.Effects.Sent++
			}
		case "alert":
			r.Alerts[e.str("alert")]++
		}
		return nil
	})
	if err != nil {
		return Report{}, fmt.Errorf("report: %w", err)
	}
	r.ValidationFailureRate = ratio(r.ValidationsInvalid, r.Validations)
	r.RetryCapHits.Total = r.RetryCapHits.Runs + r.RetryCapHits.Effects

	waits, err := s.store.AuditGateWaits(ctx, since)
	if err != nil {
		return Report{}, fmt.Errorf("report: %w", err)
	}
	var secs []float64
	for _, w := range waits {
		switch w.Decision {
		case "approve":
			r.Approvals.HumanApproved++
		case "reject":
			r.Approvals.HumanRejected++
		}
		if w.RequestedAt == nil {
			r.GateWait.Unpaired++
			continue
		}
		secs = append(secs, w.DecidedAt.Sub(*w.RequestedAt).Seconds())
	}
	r.GateWait.Decided = len(waits)
	r.GateWait.Method = "nearest-rank over approval_requested → approval_decided"
	r.GateWait.P50Seconds, r.GateWait.P95Seconds = Percentile(secs, 50), Percentile(secs, 95)
	r.GateWait.MaxSeconds = Percentile(secs, 100)
	r.Approvals.AutoShare = ratio(r.Approvals.Auto, r.Approvals.Auto+r.Approvals.HumanApproved)

	byState, err := s.store.EffectCountByState(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("report: %w", err)
	}
	r.Effects.UnknownOutstanding = int64(byState[store.EffectUnknown])
	r.Effects.FailedOutstanding = int64(byState[store.EffectFailed])

	switches, err := s.store.KillSwitchList(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("report: %w", err)
	}
	r.KillSwitch.DisabledScopes = []string{}
	for _, k := range switches {
		if k.Scope == effects.GlobalScope {
			r.KillSwitch.Enabled = k.Enabled // no global row at all means disabled: default-deny
		}
		if !k.Enabled {
			r.KillSwitch.DisabledScopes = append(r.KillSwitch.DisabledScopes, k.Scope)
		}
	}
	slices.Sort(r.KillSwitch.DisabledScopes)
	return r, nil
}

// ReportLast computes the report over the window that ends now.
func (s *Service) ReportLast(ctx context.Context, window time.Duration) (Report, error) {
	now, err := s.Read(ctx, s.store)
	if err != nil {
		return Report{}, fmt.Errorf("report: %w", err)
	}
	return s.Report(ctx, now.Add(-window))
}

func ratio(n, d int64) *float64 {
	if d == 0 {
		return nil
	}
	v := float64(n) / float64(d)
	return &v
}

// Percentile is the nearest-rank percentile p (0 < p ≤ 100) of values: a value that was
// observed, never an interpolation; nil for no values.
func Percentile(values []float64, p float64) *float64 {
	if len(values) == 0 {
		return nil
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	v := sorted[min(max(rank, 1), len(sorted))-1]
	return &v
}

var days = regexp.MustCompile(`^(\d+(?:\.\d+)?)d(.*)$`)

// ErrBadWindow: --since is neither a Go duration nor a number of days.
var ErrBadWindow = errors.New("a window is a duration such as 7d, 36h or 1d12h")

// ParseWindow reads a window length: a Go duration (36h, 90m) or days (7d, 1.5d, 1d12h).
func ParseWindow(s string) (time.Duration, error) {
	var d time.Duration
	rest := s
	if m := days.FindStringSubmatch(s); m != nil {
		n, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			return 0, fmt.Errorf("%w, not %q", ErrBadWindow, s)
		}
		d, rest = time.Duration(n*float64(24*time.Hour)), m[2]
	}
	if rest != "" {
		more, err := time.ParseDuration(rest)
		if err != nil {
			return 0, fmt.Errorf("%w, not %q", ErrBadWindow, s)
		}
		d += more
	}
	if d <= 0 {
		return 0, fmt.Errorf("%w, and longer than zero, not %q", ErrBadWindow, s)
	}
	return d, nil
}
