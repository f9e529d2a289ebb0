package web

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// cardContext is what the card shows around the payload, read from the run's events
// and evidence: where the output came from and how it got here.
type cardContext struct {
	Model string
	// SourceURL is the source record's link the workflow or agent gave (meta.source_url,
	// http or https, checked at the API and again here).
	SourceURL   string
	Validations []cardValidation
	// Declined is why approve_by_exception sent this to a person (its rule did not hold).
	Declined *cardDeclined
	Evidence []cardEvidence
}

type cardValidation struct {
	Valid, Repaired bool
	Repairs, Max    int
	Errors          []string
}

type cardDeclined struct{ Reason, Rule string }

type cardEvidence struct{ Source, Name, Value string }

// cardContext reads the card's context from the run's events up to the approval's
// request: the latest meta.source_url given, the model and the validations.
func (w *Web) cardContext(ctx context.Context, a store.Approval) (cardContext, error) {
	var c cardContext
	for after := int64(0); ; {
		evs, err := w.store.EventList(ctx, a.RunKey, after, 1000)
		if err != nil {
			return c, fmt.Errorf("events of %q: %w", a.RunKey, err)
		}
		if len(evs) == 0 {
			break
		}
		for _, e := range evs {
			var m runs.Meta
			if len(e.Meta) > 0 && json.Unmarshal(e.Meta, &m) == nil && linkable(m.SourceURL) {
				c.SourceURL = m.SourceURL
			}
			switch e.Kind {
			case string(store.EventValidation):
				c.Validations = append(c.Validations, readValidation(e.Detail))
			case string(store.EventAutoApprovalDeclined):
				var d struct{ Reason, Rule string }
				_ = json.Unmarshal(e.Detail, &d)
				c.Declined = &cardDeclined{Reason: d.Reason, Rule: d.Rule}
			case string(store.EventApprovalRequested):
				if !strings.Contains(string(e.Detail), a.ID) {
					continue
				}
				if m.Model != nil {
					c.Model = strings.TrimSpace(m.Model.Provider + " " + m.Model.Name + " " + m.Model.Revision)
				}
				return c, w.cardEvidence(ctx, a, &c)
			}
		}
		after = evs[len(evs)-1].ID
	}
	return c, w.cardEvidence(ctx, a, &c)
}

func (w *Web) cardEvidence(ctx context.Context, a store.Approval, c *cardContext) error {
	ev, err := w.store.EvidenceByRun(ctx, a.RunKey)
	if err != nil {
		return fmt.Errorf("evidence of %q: %w", a.RunKey, err)
	}
	for _, e := range ev {
		c.Evidence = append(c.Evidence, cardEvidence{Source: e.Source, Name: e.Name, Value: connector.PrettyJSON(e.Value)})
	}
	return nil
}

func readValidation(detail json.RawMessage) cardValidation {
	var d struct {
		Valid      bool `json:"valid"`
		Repaired   bool `json:"repaired"`
		Repairs    int  `json:"repairs"`
		MaxRepairs int  `json:"max_repairs"`
		Errors     []struct {
			Pointer, Message string
		} `json:"errors"`
	}
	_ = json.Unmarshal(detail, &d)
	v := cardValidation{Valid: d.Valid, Repaired: d.Repaired, Repairs: d.Repairs, Max: d.MaxRepairs}
	for _, e := range d.Errors {
		p := e.Pointer
		if p == "" {
			p = "(the output)"
		}
		v.Errors = append(v.Errors, p+": "+e.Message)
	}
	return v
}

// linkable is approvals.Linkable: the one rule for the links a card makes.
func linkable(s string) bool { return approvals.Linkable(s) }
