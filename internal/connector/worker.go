package connector

import (
	"slices"
	"time"
)

// Worker is the kind of an action type performed outside airlock: an external worker (an
// n8n sub-workflow, an agent, the MCP gateway) claims its effects over the API and
// reports back. Its section is optional.
var Worker = Kind{
	Name:       "worker",
	NewSection: func() Section { return &WorkerSection{} },
	Optional:   true,
	Outside:    true,
	Approving:  "queues this task for the worker, once",
}

// WorkerSection is actions.<type>.worker.
type WorkerSection struct {
	Targets []string `yaml:"targets"` // optional closed list of target names
}

// Validate: any list of names will do.
func (*WorkerSection) Validate(*Check) {}

// ValidTarget: one of targets when they are listed; anything non-empty otherwise (a
// worker's target is data, not a destination airlock dials).
func (w *WorkerSection) ValidTarget(target string) bool {
	if len(w.Targets) > 0 {
		return slices.Contains(w.Targets, target)
	}
	return target != ""
}

// SendTimeout is 0: no timeout of airlock's bounds what a worker does.
func (*WorkerSection) SendTimeout() time.Duration { return 0 }

// New builds nothing: the worker performs the effect.
func (*WorkerSection) New() (Connector, error) { return nil, nil }

// Card shows a worker's task as its named arguments (the payload object's fields). The
// target is named only when the action has more than its default one.
func (*WorkerSection) Card(req Request) (Card, bool) {
	args, ok := NamedFields(req.Payload)
	if !ok {
		return Card{}, false
	}
	c := Card{Heading: "Task the worker will perform",
		Fields: []CardField{{Label: "Task", Value: req.ActionType, Code: true}}, Bodies: args}
	if req.Target != "" && req.Target != "default" {
		c.Fields = append(c.Fields, CardField{Label: "Destination", Value: req.Target, Code: true})
	}
	return c, true
}
