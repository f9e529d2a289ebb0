package runs

import (
	"os"
	"strings"
	"testing"
)

// TestDiagramMatchesTransitions keeps docs/architecture.md's run diagram equal to the
// transitions table: every allowed move is drawn, and every drawn move between two
// states (other than claims) is allowed.
func TestDiagramMatchesTransitions(t *testing.T) {
	b, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "### A run")
	end := strings.Index(doc, "### An effect")
	if start < 0 || end < start {
		t.Fatal("docs/architecture.md has no run diagram")
	}
	drawn := map[string]bool{}
	for _, line := range strings.Split(doc[start:end], "\n") {
		from, rest, ok := strings.Cut(strings.TrimSpace(line), " --> ")
		if !ok || from == "[*]" {
			continue
		}
		to, label, _ := strings.Cut(rest, ":")
		if to == "[*]" || strings.Contains(label, "claim") {
			continue
		}
		drawn[from+" "+strings.TrimSpace(to)] = true
	}
	allowed := map[string]bool{}
	for _, tr := range transitions {
		k := string(tr.From) + " " + string(tr.To)
		allowed[k] = true
		if !drawn[k] {
			t.Errorf("the diagram lacks %s → %s", tr.From, tr.To)
		}
	}
	for k := range drawn {
		if allowed[k] {
			continue
		}
		t.Errorf("the diagram draws %s, which the transitions table does not allow", k)
	}
}
