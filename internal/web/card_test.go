package web

import (
	"errors"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/connector/kinds"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
)

func TestLinkable(t *testing.T) {
	for s, want := range map[string]bool{
		"https://support.example.com/t/1": true, "http://x.example/a?b=c": true,
		"javascript:alert(1)": false, "JAVASCRIPT:alert(1)": false, "data:text/html,x": false,
		"//evil.example/x": false, "/t/1": false, "https://u:p@x.example/": false, "": false, "https://": false,
	} {
		if got := linkable(s); got != want {
			t.Errorf("linkable(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestAnswerHTML(t *testing.T) {
	got := string(answerHTML("unknown: <b>x</b> — check, then `airlock effects resolve`"))
	want := "unknown: &lt;b&gt;x&lt;/b&gt; — check, then <code>airlock effects resolve</code>"
	if got != want {
		t.Fatalf("answerHTML = %q, want %q", got, want)
	}
}

// memo is a kind registered only here: the approval page's card of its effects comes
// from its row, with the approve button of what airlock sends.
type memoSection struct {
	To string `yaml:"to"`
}

func (*memoSection) Validate(*connector.Check)   {}
func (m *memoSection) ValidTarget(t string) bool { return t == m.To }
func (*memoSection) SendTimeout() time.Duration  { return time.Second }
func (*memoSection) New() (connector.Connector, error) {
	return nil, errors.New("not sent in this test")
}
func (m *memoSection) Card(req connector.Request) (connector.Card, bool) {
	return connector.Card{Heading: "Memo to " + m.To, Fields: []connector.CardField{{Label: "Key", Value: req.EffectID, Code: true}},
		Bodies: []connector.CardField{{Label: "Memo", Value: string(req.Payload)}}}, true
}

func TestRenderCardAsksTheKind(t *testing.T) {
	kinds.Register(connector.Kind{Name: "memo", NewSection: func() connector.Section { return &memoSection{} }})
	p, err := policy.Parse([]byte(`
actions:
  memo_ceo: {connector: memo, gate: none, memo: {to: ceo}}
  task: {connector: worker, gate: none}
`), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	c := renderCard(store.Approval{RunKey: "r1", EffectID: "e1", ActionType: "memo_ceo", Target: "ceo",
		Executor: store.ExecutorDispatcher, Payload: []byte(`"hello"`)}, p.Action("memo_ceo"))
	if c == nil || c.Heading != "Memo to ceo" || c.Approve != approveSend || c.Fields[0].Value != "r1/e1" || c.Bodies[0].Value != `"hello"` {
		t.Fatalf("memo card = %+v", c)
	}
	w := renderCard(store.Approval{RunKey: "r1", EffectID: "e2", ActionType: "task", Target: "default",
		Executor: store.ExecutorWorker, Payload: []byte(`{"b":2,"a":"x"}`)}, p.Action("task"))
	if w == nil || w.Heading != "Task the worker will perform" || w.Approve != approvePerform || len(w.Bodies) != 2 || w.Bodies[0].Label != "a" {
		t.Fatalf("worker card = %+v", w)
	}
}
