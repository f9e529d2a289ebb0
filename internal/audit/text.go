package audit

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteExplanation prints an explanation for a person on call: the four answers first,
// then the tables they come from, then the timeline.
func WriteExplanation(w io.Writer, x Explanation) error {
	p := x.Processed
	fmt.Fprintf(w, "%s: %s (version %d)", x.Key, p.State, p.Version)
	if p.ParkReason != "" {
		fmt.Fprintf(w, ", parked: %s", p.ParkReason)
	}
	fmt.Fprintf(w, "\nas of %s\n\n", stamp(x.AsOf))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Processed?\t%s\n", p.Answer)
	fmt.Fprintf(tw, "Sent?\t%s\n", x.Sent.Answer)
	fmt.Fprintf(tw, "Who approved?\t%s\n", x.Approved.Answer)
	fmt.Fprintf(tw, "Which model?\t%s\n", x.Model.Answer)
	if err := tw.Flush(); err != nil {
		return err
	}
	var facts []string
	if p.TriggerSource != "" {
		facts = append(facts, "trigger "+p.TriggerSource)
	}
	facts = append(facts, "payload sha256 "+short(p.PayloadHash))
	if p.ReplacedBy != "" {
		facts = append(facts, "replaced by "+p.ReplacedBy)
	}
	if p.Replaces != "" {
		facts = append(facts, "replaces "+p.Replaces)
	}
	if len(x.Model.ProviderCategories) > 0 {
		facts = append(facts, "provider category "+strings.Join(x.Model.ProviderCategories, ", "))
	}
	fmt.Fprintf(w, "(%s)\n", strings.Join(facts, "; "))

	if len(p.Claims) > 1 {
		section(w, "CLAIMS")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  AT\tKIND\tBY\tVERSION")
		for _, c := range p.Claims {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\n", stamp(c.At), c.Kind, dash(c.Actor), c.Version)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(x.Sent.Effects) > 0 {
		section(w, "EFFECTS")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  EFFECT_ID\tACTION\tTARGET\tEXECUTOR\tSTATE\tPROVIDER_ID\tATTEMPTS\tERROR\tSENT_AT\tRECORDED_BY\tID")
		for _, e := range x.Sent.Effects {
			sentAt, via := "-", "-"
			if e.SentAt != nil {
				sentAt = stamp(*e.SentAt)
			}
			if e.SentVia != "" {
				via = e.SentVia + " (" + dash(e.SentBy) + ")"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", e.EffectID, e.ActionType, e.Target, e.Executor,
				e.State, dash(e.ProviderID), e.Attempts, dash(e.LastErrorClass), sentAt, via, e.ID)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(x.Approved.Approvals) > 0 {
		section(w, "APPROVALS")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  MODE\tACTION\tEFFECT_ID\tREQUESTED_BY\tREQUESTED_AT\tSTATUS\tBY\tDECIDED_AT\tWAIT\tREASON")
		for _, a := range x.Approved.Approvals {
			decided, wait := "-", "-"
			if a.DecidedAt != nil {
				decided = stamp(*a.DecidedAt)
			}
			if a.WaitSeconds != nil {
				wait = seconds(*a.WaitSeconds)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Mode, a.ActionType, a.EffectID, dash(a.RequestedBy),
				stamp(a.RequestedAt), a.Status, dash(a.Approver), decided, wait, dash(a.Reason))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(x.Approved.AutoApprovals)+len(x.Approved.AutoDeclined) > 0 {
		section(w, "AUTO-APPROVALS")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  AT\tOUTCOME\tEFFECT_ID\tRULE\tPOLICY_VERSION\tREVIEW")
		for _, a := range x.Approved.AutoApprovals {
			review := dash(a.Review)
			if a.ReviewedBy != "" {
				review += " by " + a.ReviewedBy
			}
			fmt.Fprintf(tw, "  %s\tapproved\t%s\t%s\t%s\t%s\n", stamp(a.At), a.EffectID, a.Rule, a.PolicyVersion, review)
		}
		for _, a := range x.Approved.AutoDeclined {
			fmt.Fprintf(tw, "  %s\tdeclined: %s\t-\t%s\t%s\t-\n", stamp(a.At), a.Reason, a.Rule, a.PolicyVersion)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(x.Model.Validations) > 0 {
		section(w, "VALIDATIONS")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  AT\tACTION\tRESULT\tERRORS\tMODEL\tOUTPUT_SHA256")
		for _, v := range x.Model.Validations {
			result := "invalid"
			switch {
			case v.Valid && v.Repaired:
				result = "valid (repaired)"
			case v.Valid:
				result = "valid"
			}
			var errs []string
			for _, e := range v.Errors {
				errs = append(errs, dash(e.Pointer)+" "+e.Keyword)
			}
			m := "-"
			if v.Model != nil {
				m = ModelName(v.Model.Provider, v.Model.Name, v.Model.Revision)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", stamp(v.At), v.ActionType, result, dash(strings.Join(errs, ", ")), m, short(v.OutputHash))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	section(w, "TIMELINE")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  AT\tKIND\tACTOR\tSUMMARY")
	for _, s := range x.Timeline {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", stamp(s.At), s.Kind, dash(s.Actor), s.Summary)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if x.TimelineTruncated {
		fmt.Fprintf(w, "  … cut at %d events: GET /v1/runs/%s/events pages through all of them\n", MaxTimeline, x.Key)
	}
	return nil
}

// WriteReport prints the report's figures, each with how it is computed.
func WriteReport(w io.Writer, r Report) error {
	fmt.Fprintf(w, "airlock report: %s → %s (%s)\n\n", stamp(r.Since), stamp(r.Until), r.Until.Sub(r.Since).Round(time.Minute))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(name, value, how string) { fmt.Fprintf(tw, "%s\t%s\t%s\n", name, value, how) }
	row("FIGURE", "VALUE", "FROM")
	row("duplicate-delivery rate", pct(r.DuplicateRate), fmt.Sprintf("duplicates / (claims + duplicates) = %d / (%d + %d)", r.Duplicates, r.Claims, r.Duplicates))
	g := r.GateWait
	row("gate wait p50", secs(g.P50Seconds), fmt.Sprintf("%s, measured here (%s)", plural(g.Decided, "decided approval", "decided approvals"), g.Method))
	row("gate wait p95", secs(g.P95Seconds), fmt.Sprintf("max %s", secs(g.MaxSeconds)))
	if g.Unpaired > 0 {
		row("", "", fmt.Sprintf("%d decisions without their request event (retention) are not ranked", g.Unpaired))
	}
	row("validation failure rate", pct(r.ValidationFailureRate), fmt.Sprintf("invalid / validations = %d / %d", r.ValidationsInvalid, r.Validations))
	a := r.Approvals
	row("auto vs human approvals", fmt.Sprintf("%d : %d", a.Auto, a.HumanApproved),
		fmt.Sprintf("auto share %s; %d rejected by people; %d auto-approvals declined to a person", pct(a.AutoShare), a.HumanRejected, a.AutoDeclined))
	row("retry-cap hits", fmt.Sprint(r.RetryCapHits.Total), plural(int(r.RetryCapHits.Runs), "run", "runs")+" (failure table) + "+
		plural(int(r.RetryCapHits.Effects), "effect", "effects")+" (outbox max_attempts)")
	row("runs", fmt.Sprint(r.Runs), fmt.Sprintf("with an event in the window; %d new", r.NewRuns))
	row("claims", fmt.Sprint(r.Claims), fmt.Sprintf("%d reclaims of lapsed leases; %d deliveries with another payload refused", r.Reclaims, r.PayloadMismatches))
	e := r.Effects
	row("effects sent", fmt.Sprint(e.Sent), fmt.Sprintf("%d queued, %d failed, %d became unknown", e.Queued, e.Failed, e.Unknown))
	row("unknown effects outstanding", fmt.Sprint(e.UnknownOutstanding), fmt.Sprintf("now; %d failed outstanding (`airlock effects list --state unknown,failed`)", e.FailedOutstanding))
	ks := "enabled"
	if !r.KillSwitch.Enabled {
		ks = "DISABLED"
	}
	how := "global setting in the database"
	if len(r.KillSwitch.DisabledScopes) > 0 {
		how += "; disabled: " + strings.Join(r.KillSwitch.DisabledScopes, ", ")
	}
	row("kill switch", ks, how)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Alerts) > 0 {
		fmt.Fprintln(w, "\nALERTS")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, k := range slices.Sorted(maps.Keys(r.Alerts)) {
			fmt.Fprintf(tw, "  %s\t%d\n", k, r.Alerts[k])
		}
		return tw.Flush()
	}
	return nil
}

func section(w io.Writer, name string) { fmt.Fprintf(w, "\n%s\n", name) }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func short(hash string) string {
	if len(hash) > 12 {
		return hash[:12] + "…"
	}
	return dash(hash)
}

func pct(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", *v*100)
}

func secs(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return seconds(*v)
}
