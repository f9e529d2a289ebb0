package kinds_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/connector/kinds"
	"github.com/airlockhq/airlock/internal/policy"
)

// chat is a kind written the way a new one would be (a Slack-style channel message): this
// file is its package, and the Register call in init is its one row. Nothing else in
// airlock learns of it, yet the policy file takes its section, validation reports its
// problems, targets and payloads follow its rules, airlock builds its connector, and the
// approval card and notification show it.
var chat = connector.Kind{
	Name:       "chat",
	NewSection: func() connector.Section { return &chatSection{} },
	Approving:  "posts this message, once",
}

func init() { kinds.Register(chat) }

type chatSection struct {
	WebhookURL string             `yaml:"webhook_url"`
	Channels   []string           `yaml:"channels"`
	Timeout    connector.Duration `yaml:"timeout"`
}

func (s *chatSection) Defaults(given func(path ...string) bool) {
	if !given("timeout") {
		s.Timeout = connector.Duration(5 * time.Second)
	}
}

func (s *chatSection) Validate(c *connector.Check) {
	if u, err := url.Parse(s.WebhookURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		c.Add("webhook_url", "must be an absolute http(s) URL")
	}
	if len(s.Channels) == 0 {
		c.Add("channels", "required: the channels a message may go to")
	}
	if s.Timeout.D() < 100*time.Millisecond {
		c.Add("timeout", "must be at least 100ms")
	}
}

func (s *chatSection) ValidTarget(target string) bool { return slices.Contains(s.Channels, target) }
func (s *chatSection) SendTimeout() time.Duration     { return s.Timeout.D() }

type chatMessage struct {
	Text string `json:"text"`
}

func (s *chatSection) CheckPayload(payload json.RawMessage) error {
	var m chatMessage
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if dec.Decode(&m) != nil || m.Text == "" {
		return errors.New("a chat message is {\"text\": \"…\"}")
	}
	return nil
}

func (s *chatSection) New() (connector.Connector, error) {
	return &chatConn{url: s.WebhookURL, client: &http.Client{Timeout: s.Timeout.D()}}, nil
}

func (s *chatSection) Card(req connector.Request) (connector.Card, bool) {
	var m chatMessage
	if json.Unmarshal(req.Payload, &m) != nil {
		return connector.Card{}, false
	}
	return connector.Card{Heading: "Chat message to be posted",
		Fields: []connector.CardField{{Label: "Channel", Value: req.Target, Code: true}},
		Bodies: []connector.CardField{{Label: "Message", Value: m.Text}}}, true
}

// chatConn posts {channel, text} to the webhook with the idempotency key.
type chatConn struct {
	url    string
	client *http.Client
}

func (c *chatConn) Idempotent() bool { return true }

func (c *chatConn) Send(ctx context.Context, req connector.Request) connector.Result {
	var m chatMessage
	if json.Unmarshal(req.Payload, &m) != nil {
		return connector.Result{Outcome: connector.Refused, Class: "invalid_payload"}
	}
	body, _ := json.Marshal(map[string]string{"channel": req.Target, "text": m.Text})
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return connector.Result{Outcome: connector.Refused, Class: "invalid_request"}
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", req.EffectID)
	resp, err := c.client.Do(r)
	if err != nil {
		return connector.Result{Outcome: connector.Ambiguous, Class: "transport"}
	}
	defer resp.Body.Close()
	var out struct {
		TS string `json:"ts"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&out)
	switch {
	case resp.StatusCode/100 == 2:
		return connector.Result{Outcome: connector.Sent, ProviderID: out.TS}
	case resp.StatusCode == 429 || resp.StatusCode == 503:
		return connector.Result{Outcome: connector.Retryable, Class: "http_" + resp.Status[:3]}
	case resp.StatusCode/100 == 4:
		return connector.Result{Outcome: connector.Refused, Class: "http_" + resp.Status[:3]}
	}
	return connector.Result{Outcome: connector.Ambiguous, Class: "http_" + resp.Status[:3]}
}

// chatServer is the chat provider: it keeps what it was sent.
type chatServer struct {
	*httptest.Server
	mu       sync.Mutex
	received []map[string]string
	keys     []string
}

func newChatServer(t *testing.T) *chatServer {
	cs := &chatServer{}
	cs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m map[string]string
		if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
			http.Error(w, "bad json", 400)
			return
		}
		cs.mu.Lock()
		cs.received = append(cs.received, m)
		cs.keys = append(cs.keys, r.Header.Get("Idempotency-Key"))
		cs.mu.Unlock()
		_, _ = w.Write([]byte(`{"ok":true,"ts":"1700000000.000100"}`))
	}))
	t.Cleanup(cs.Close)
	return cs
}

func noEnv(string) (string, bool) { return "", false }

// One package and one row: a registered kind is a connector like http and smtp, from the
// policy file to the provider.
func TestRegisteredKindFromOneRow(t *testing.T) {
	cs := newChatServer(t)
	p, err := policy.Parse([]byte(`
actions:
  announce:
    connector: chat
    gate: none
    chat: {webhook_url: `+cs.URL+`/post, channels: ["#ops", "#general"]}
  note:
    connector: http
    gate: none
    http: {url: `+cs.URL+`/notes}
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	a := p.Action("announce")

	t.Run("PolicyDecodesAndDefaultsTheSection", func(t *testing.T) {
		s, ok := a.Section.(*chatSection)
		if !ok || s.Timeout.D() != 5*time.Second || len(s.Channels) != 2 {
			t.Fatalf("section = %#v", a.Section)
		}
		if a.Kind().Name != "chat" || a.Executor() != "dispatcher" || a.SendTimeout() != 5*time.Second {
			t.Fatalf("kind %q, executor %q, timeout %s", a.Kind().Name, a.Executor(), a.SendTimeout())
		}
		// The settle window's default is the kind's timeout plus the grace, as for http.
		if a.SettleWindow.D() != 5*time.Second+policy.DefaultSettleGrace {
			t.Fatalf("settle_window = %s", a.SettleWindow.D())
		}
	})

	t.Run("TargetsAndPayloadsFollowTheKind", func(t *testing.T) {
		if !a.ValidTarget("#ops") || a.ValidTarget("#random") || a.ValidTarget("") {
			t.Fatal("chat targets are its channels")
		}
		if err := a.CheckSendable([]byte(`{"text":"deploy at 5"}`)); err != nil {
			t.Fatal(err)
		}
		if err := a.CheckSendable([]byte(`{"text":"x","channel":"#random"}`)); err == nil {
			t.Fatal("a payload that names its own channel was accepted")
		}
		if a.Recipients("#ops") != nil || a.CheckRecipients("#ops", []byte(`{"text":"x"}`)) != nil {
			t.Fatal("the kind has no recipient rules, and none apply")
		}
	})

	t.Run("AirlockBuildsAndSendsItsConnector", func(t *testing.T) {
		conns, err := app.Connectors(p)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := conns["announce"]
		if !ok || conns["note"] == nil {
			t.Fatalf("connectors: %v", conns)
		}
		res := c.Send(context.Background(), connector.Request{EffectID: "run-1/e1", RunKey: "run-1", ActionType: "announce",
			Target: "#ops", Payload: []byte(`{"text":"deploy at 5"}`)})
		if res.Outcome != connector.Sent || res.ProviderID != "1700000000.000100" {
			t.Fatalf("send: %+v", res)
		}
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if len(cs.received) != 1 || cs.received[0]["channel"] != "#ops" || cs.received[0]["text"] != "deploy at 5" || cs.keys[0] != "run-1/e1" {
			t.Fatalf("the provider got %v with keys %v", cs.received, cs.keys)
		}
	})

	t.Run("TheApprovalShowsIt", func(t *testing.T) {
		card, ok := a.Card(connector.Request{EffectID: "run-1/e1", RunKey: "run-1", ActionType: "announce", Target: "#ops",
			Payload: []byte(`{"text":"deploy at 5"}`)})
		if !ok || card.Heading != "Chat message to be posted" || card.Fields[0].Value != "#ops" || card.Bodies[0].Value != "deploy at 5" {
			t.Fatalf("card = %+v, %v", card, ok)
		}
		if a.Kind().Approving != "posts this message, once" {
			t.Fatalf("approving = %q", a.Kind().Approving)
		}
	})
}

// The policy file's messages about connectors come from the table: the new kind is
// listed, its section's problems are reported under its path, a misspelt field of it
// gets the nearest name, and a section given beside another connector is refused.
func TestRegisteredKindValidation(t *testing.T) {
	cases := []struct{ name, doc, want string }{
		{"UnknownConnector", `{connector: fax, gate: none}`,
			`actions.a.connector: must be http, smtp, worker or chat, not "fax"`},
		{"SectionProblems", `{connector: chat, gate: none, chat: {webhook_url: "ftp://x", timeout: 1ms}}`,
			"actions.a.chat.webhook_url: must be an absolute http(s) URL; actions.a.chat.channels: required: the channels a message may go to; actions.a.chat.timeout: must be at least 100ms"},
		{"SectionRequired", `{connector: chat, gate: none}`, "actions.a.chat: required for connector chat"},
		{"Misspelt", `{connector: chat, gate: none, chat: {webhook_url: "https://x/", chanels: ["#a"]}}`,
			"actions.a.chat.chanels: unknown field; did you mean channels?"},
		{"Misplaced", `{connector: worker, gate: none, chat: {webhook_url: "https://x/", channels: ["#a"]}}`,
			`actions.a.chat: given, but the connector is "worker"`},
		{"BadDuration", `{connector: chat, gate: none, chat: {webhook_url: "https://x/", channels: ["#a"], timeout: soon}}`,
			`is not a duration such as 500ms, 5s or 2m`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.Parse([]byte("actions:\n  a: "+tc.doc+"\n"), noEnv)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestRegisterRefusesADuplicateOrEmptyKind(t *testing.T) {
	for _, k := range []connector.Kind{chat, {Name: "http", NewSection: chat.NewSection}, {Name: "x"}, {NewSection: chat.NewSection}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) did not panic", k.Name)
				}
			}()
			kinds.Register(k)
		}()
	}
	if got := kinds.Names(); !slices.Equal(got, []string{"http", "smtp", "worker", "chat"}) {
		t.Fatalf("names = %v", got)
	}
}
