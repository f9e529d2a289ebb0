package metrics

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// A fresh server exports airlock_alerts_total for every kind at zero (issue 24, 12:
// operations.md lists it, and a new server had none).
func TestAlertKindsStartAtZero(t *testing.T) {
	m := New()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "airlock_alerts_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			got[label(mt, "kind")] = mt.GetCounter().GetValue()
		}
	}
	for _, k := range AlertKinds {
		if v, ok := got[k]; !ok || v != 0 {
			t.Errorf("airlock_alerts_total{kind=%q} = %v (present %v); want 0", k, v, ok)
		}
	}
}

// Every alert kind the domain raises by name is in AlertKinds.
func TestAlertKindsListEveryRaisedKind(t *testing.T) {
	// An alert is raised from its event (internal/alerts): runs.Alert(ctx, q, …, "kind",
	// …), runs.Terminate(…, "kind", map… or "kind",⏎ (an alert; nil: none), an event's
	// {"alert": "kind"}; a kind kept in a variable first: "…, alert = …, "kind"" (the last
	// literal of the assignment) and reconcile's const several.
	literal := regexp.MustCompile(`\bAlert\(ctx, q, [^"\n]*"([a-z_]+)"|Terminate\([^"\n]*"([a-z_]+)",(?: map|$)|"alert": "([a-z_]+)"|` +
		`\balert = [^"\n]*(?:"[^"\n]*", )*"([a-z_]+)"$|const several = "([a-z_]+)"`)
	var files []string
	err := filepath.WalkDir("..", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			for _, m := range literal.FindAllStringSubmatch(line, -1) {
				for _, k := range m[1:] {
					if k == "" {
						continue
					}
					found++
					if !slices.Contains(AlertKinds, k) {
						t.Errorf("%s raises alert kind %q, not in AlertKinds", f, k)
					}
				}
			}
		}
	}
	if found < 8 {
		t.Fatalf("found only %d alert kinds in the source: the scan is broken", found)
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
