package web

import (
	"fmt"
	"html"
	"html/template"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
)

// weekly is one figure per week, oldest first; nil where there was nothing to divide.
type weekly struct {
	title  string
	values []*float64
	label  func(float64) string
	max    float64 // the axis' top at least (1 for rates)
}

// weekCharts turns cumulative reports (cum[i] covers the last i weeks) into one small
// bar chart per figure over the weeks, drawn here as SVG: the browser needs no script.
func weekCharts(cum []audit.Report, now time.Time) []template.HTML {
	n := len(cum) - 1
	ratio := func(num, den int64) *float64 {
		if den <= 0 {
			return nil
		}
		f := float64(num) / float64(den)
		return &f
	}
	count := func(v int64) *float64 { f := float64(v); return &f }
	dup, inv, auto, caps := weekly{title: "Duplicate-delivery rate", max: 0.01}, weekly{title: "Validation failure rate", max: 0.01},
		weekly{title: "Auto share of approvals", max: 0.01}, weekly{title: "Retry-cap hits", max: 1}
	pct := func(f float64) string { return fmt.Sprintf("%.0f%%", f*100) }
	dup.label, inv.label, auto.label = pct, pct, pct
	caps.label = func(f float64) string { return fmt.Sprintf("%.0f", f) }
	var labels []string
	for i := n; i >= 1; i-- { // oldest week first
		a, b := cum[i], cum[i-1] // the week is a minus b
		d := func(f func(audit.Report) int64) int64 { return f(a) - f(b) }
		claims := d(func(r audit.Report) int64 { return r.Claims })
		dups := d(func(r audit.Report) int64 { return r.Duplicates })
		dup.values = append(dup.values, ratio(dups, claims+dups))
		vals := d(func(r audit.Report) int64 { return r.Validations })
		inv.values = append(inv.values, ratio(d(func(r audit.Report) int64 { return r.ValidationsInvalid }), vals))
		au := d(func(r audit.Report) int64 { return r.Approvals.Auto })
		hu := d(func(r audit.Report) int64 { return r.Approvals.HumanApproved })
		auto.values = append(auto.values, ratio(au, au+hu))
		caps.values = append(caps.values, count(d(func(r audit.Report) int64 { return r.RetryCapHits.Total })))
		labels = append(labels, now.Add(-time.Duration(i)*7*24*time.Hour).UTC().Format("Jan 2"))
	}
	out := []template.HTML{}
	for _, c := range []weekly{dup, inv, auto, caps} {
		out = append(out, c.svg(labels))
	}
	return out
}

// svg draws the bars. Every string in it is escaped; the numbers are computed here.
func (c weekly) svg(labels []string) template.HTML {
	const w, h, top, bottom, left = 320, 150, 22, 24, 6
	top1 := c.max
	for _, v := range c.values {
		if v != nil && *v > top1 {
			top1 = *v
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<figure class="chart"><svg viewBox="0 0 %d %d" width="100%%" role="img" aria-label="%s by week" xmlns="http://www.w3.org/2000/svg">`,
		w, h, html.EscapeString(c.title))
	slot := float64(w-2*left) / float64(len(c.values))
	plot := float64(h - top - bottom)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#bbb"/>`, left, h-bottom, w-left, h-bottom)
	for i, v := range c.values {
		x := float64(left) + float64(i)*slot
		cx := x + slot/2
		if v == nil {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" font-size="11" fill="#888">n/a</text>`, cx, h-bottom-4)
		} else {
			bh := plot * *v / top1
			fill := "#5b7fa6"
			if i == len(c.values)-1 {
				fill = "#2f5d8a" // this week
			}
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" rx="2"/>`, x+slot*0.18, float64(h-bottom)-bh, slot*0.64, bh, fill)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="11" fill="#333">%s</text>`, cx, float64(h-bottom)-bh-4, html.EscapeString(c.label(*v)))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" font-size="10" fill="#555">%s</text>`, cx, h-8, html.EscapeString(labels[i]))
	}
	fmt.Fprintf(&b, `</svg><figcaption>%s, by week (the last bar is this week)</figcaption></figure>`, html.EscapeString(c.title))
	return template.HTML(b.String()) //nolint:gosec // built above from escaped strings and numbers
}
