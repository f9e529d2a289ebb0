// Package dashboards_test checks the Grafana dashboard against the metrics airlock
// exposes, so a renamed metric or label breaks a test instead of a panel.
package dashboards_test

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockhq/airlock/internal/metrics"
)

// exposed returns every metric name airlock's registry can expose — the collectors of
// metrics.New() and the database gauges serve registers — with their label names.
// A histogram is exposed as _bucket (with le), _sum and _count, never by its own name.
func exposed(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	labels := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	describe := func(c prometheus.Collector, histogram bool) {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			s := d.String()
			m := fqName.FindStringSubmatch(s)
			if m == nil {
				t.Fatalf("cannot read a metric name from %s", s)
			}
			var ls []string
			if l := labels.FindStringSubmatch(s); l != nil && l[1] != "" {
				ls = strings.Split(l[1], ",")
			}
			if !histogram {
				out[m[1]] = ls
				continue
			}
			out[m[1]+"_bucket"] = append(slices.Clone(ls), "le")
			out[m[1]+"_sum"], out[m[1]+"_count"] = ls, ls
		}
	}
	m := metrics.New()
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if !f.CanInterface() {
			continue
		}
		c, ok := f.Interface().(prometheus.Collector)
		if !ok || f.Type() == reflect.TypeOf(m.Registry) {
			continue
		}
		_, vec := f.Interface().(prometheus.ObserverVec)
		_, one := f.Interface().(prometheus.Histogram)
		describe(c, vec || one)
	}
	describe(metrics.Gauges{}, false)
	return out
}

// promqlWords are PromQL's functions, aggregations and keywords: never metric names.
var promqlWords = []string{"sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile",
	"count_values", "rate", "irate", "increase", "delta", "idelta", "deriv", "histogram_quantile", "clamp_min", "clamp_max",
	"vector", "scalar", "time", "abs", "ceil", "floor", "round", "absent", "changes", "resets", "sort", "sort_desc",
	"label_replace", "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "count_over_time",
	"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}

var (
	strLit    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	selector  = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	matcher   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"`)
	grouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	rangeSel  = regexp.MustCompile(`\[[^\]]*\]`)
	braces    = regexp.MustCompile(`\{[^}]*\}`)
	ident     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	numberLit = regexp.MustCompile(`\b\d+(\.\d+)?([eE][-+]?\d+)?\b`)
)

// check returns the problems of one PromQL expression: metric names the registry does not
// expose, label names a metric does not have, and the metrics it names.
func check(expr string, known map[string][]string) (problems, names []string) {
	grouped := map[string]bool{}
	for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				grouped[l] = true
			}
		}
	}
	for _, s := range selector.FindAllStringSubmatch(expr, -1) {
		labels, ok := known[s[1]]
		if !ok {
			continue // reported below
		}
		for _, m := range matcher.FindAllStringSubmatch(s[2], -1) {
			if m[1] != "__name__" && !slices.Contains(labels, m[1]) {
				problems = append(problems, s[1]+" has no label "+m[1])
			}
		}
	}
	rest := strLit.ReplaceAllString(expr, `""`)
	rest = grouping.ReplaceAllString(rest, " ")
	rest = braces.ReplaceAllString(rest, " ")
	rest = rangeSel.ReplaceAllString(rest, " ")
	rest = numberLit.ReplaceAllString(rest, " ")
	for _, loc := range ident.FindAllStringIndex(rest, -1) {
		word := rest[loc[0]:loc[1]]
		if slices.Contains(promqlWords, word) {
			continue
		}
		if next := strings.TrimLeft(rest[loc[1]:], " "); strings.HasPrefix(next, "(") {
			problems = append(problems, "unknown function "+word)
			continue
		}
		if _, ok := known[word]; !ok {
			problems = append(problems, "unknown metric "+word)
			continue
		}
		names = append(names, word)
	}
	for l := range grouped {
		found := false
		for _, n := range names {
			found = found || slices.Contains(known[n], l)
		}
		if !found {
			problems = append(problems, "no metric of the expression has the label "+l)
		}
	}
	return problems, names
}

// exprs collects every PromQL expression in a dashboard, panels in rows included.
func exprs(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "expr" {
				*out = append(*out, s)
				continue
			}
			exprs(x, out)
		}
	case []any:
		for _, x := range v {
			exprs(x, out)
		}
	}
}

func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile("airlock.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string           `json:"uid"`
		Panels []map[string]any `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("airlock.json is not valid JSON: %v", err)
	}
	var doc any
	_ = json.Unmarshal(raw, &doc)
	var all []string
	exprs(doc, &all)
	if len(all) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	known := exposed(t)
	used := map[string]bool{}
	for _, e := range all {
		problems, names := check(e, known)
		for _, p := range problems {
			t.Errorf("%s: %s", e, p)
		}
		for _, n := range names {
			used[n] = true
		}
	}
	// The report's figures each have a panel.
	for _, want := range []string{"airlock_claims_total", "airlock_gate_wait_seconds_bucket", "airlock_validations_total",
		"airlock_approvals_total", "airlock_alerts_total", "airlock_effects", "airlock_kill_switch_enabled"} {
		if !used[want] {
			t.Errorf("no panel uses %s", want)
		}
	}
	if !strings.Contains(string(raw), `airlock_alerts_total{kind=\"retry_cap\"}`) {
		t.Error("no panel counts retry-cap hits")
	}
	ids := map[float64]bool{}
	for _, p := range dash.Panels {
		id, _ := p["id"].(float64)
		if ids[id] || id == 0 {
			t.Errorf("panel %v: missing or repeated id", p["title"])
		}
		ids[id] = true
		if _, ok := p["gridPos"].(map[string]any); !ok {
			t.Errorf("panel %v has no gridPos", p["title"])
		}
	}
	if dash.UID == "" {
		t.Error("the dashboard has no uid")
	}
}

// TestCheckCatchesMistakes keeps the checker honest: each of these must be refused.
func TestCheckCatchesMistakes(t *testing.T) {
	known := exposed(t)
	for _, bad := range []string{
		`sum(rate(airlock_claim_total[5m]))`,
		`sum(rate(airlock_claims_total{result="duplicate"}[5m]))`,
		`histogram_quantile(0.5, sum by (le) (rate(airlock_gate_wait_seconds[5m])))`,
		`sum(rate(airlock_gate_wait_seconds_bucket{mode="x", kind="y"}[5m]))`,
		`sum by (kind) (airlock_effects)`,
		`sumx(airlock_effects)`,
	} {
		if problems, _ := check(bad, known); len(problems) == 0 {
			t.Errorf("%s passed the check", bad)
		}
	}
	if problems, _ := check(`histogram_quantile(0.95, sum by (le, mode) (rate(airlock_gate_wait_seconds_bucket[$__rate_interval])))`, known); len(problems) > 0 {
		t.Errorf("a good expression was refused: %v", problems)
	}
}
