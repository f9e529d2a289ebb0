package smtpconn

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/big"
	"mime"
	"net"
	netmail "net/mail"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/airlockhq/airlock/internal/connector"
)

// Planted secrets: no Result may contain any of them.
const (
	secretUser  = "user-SECRET-4b1d"
	secretPass  = "pass-SECRET-7f3a"
	secretReply = "REPLY-SECRET-9c1e" // in every scripted server reply
	secretHost  = "secret-smtp-host.invalid"
	secretRcpt  = "victim@secret-recipient.example"
	sender      = "airlock-sender@example.org"
)

var leaks = []string{secretUser, secretPass, secretReply, "secret-smtp-host", "secret-recipient", "airlock-sender", "127.0.0.1"}

func checkNoLeak(t *testing.T, res connector.Result) {
	t.Helper()
	s := fmt.Sprintf("%#v", res)
	for _, leak := range leaks {
		if strings.Contains(s, leak) {
			t.Errorf("result %s contains %q", s, leak)
		}
	}
}

func reply(code int) *smtp.SMTPError {
	return &smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCode{code / 100, 0, 0},
		Message: secretReply + " for " + secretRcpt}
}

// script tells the go-smtp test server where to fail.
type script struct {
	auth       bool            // offer AUTH PLAIN, accept only secretUser/secretPass
	authReply  *smtp.SMTPError // reply to any AUTH instead
	tls        string          // "starttls": offer STARTTLS; "implicit": TLS from the first byte
	ehlo       *smtp.SMTPError
	mail, rcpt *smtp.SMTPError
	stallMail  bool            // never answer MAIL FROM
	skipData   bool            // never read the content
	afterData  string          // after reading the content: "drop" the connection or "stall"
	data       *smtp.SMTPError // final reply to the content
}

type received struct {
	from string
	to   []string
	data []byte
}

type server struct {
	port    int
	got     chan received // every message whose content was read in full
	release chan struct{} // closed at cleanup, ends every stall
}

// startServer runs an emersion/go-smtp server on 127.0.0.1 that follows sc.
func startServer(t *testing.T, sc script) *server {
	t.Helper()
	srv := &server{got: make(chan received, 4), release: make(chan struct{})}
	s := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		if sc.ehlo != nil {
			return nil, sc.ehlo
		}
		return &session{sc: sc, srv: srv, conn: c}, nil
	}))
	s.Domain = "localhost"
	s.AllowInsecureAuth = true
	s.ErrorLog = log.New(io.Discard, "", 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.port = ln.Addr().(*net.TCPAddr).Port
	switch sc.tls {
	case "starttls":
		s.TLSConfig = serverTLS(t)
	case "implicit":
		ln = tls.NewListener(ln, serverTLS(t))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ln)
	}()
	t.Cleanup(func() {
		close(srv.release)
		_ = s.Close()
		<-done
	})
	return srv
}

type session struct {
	sc   script
	srv  *server
	conn *smtp.Conn
	from string
	to   []string
}

func (s *session) AuthMechanisms() []string {
	if s.sc.auth {
		return []string{sasl.Plain}
	}
	return nil
}

func (s *session) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if s.sc.authReply != nil {
			return s.sc.authReply
		}
		if user != secretUser || pass != secretPass {
			return smtp.ErrAuthFailed
		}
		return nil
	}), nil
}

func (s *session) Mail(from string, _ *smtp.MailOptions) error {
	if s.sc.stallMail {
		<-s.srv.release
	}
	s.from = from
	if s.sc.mail != nil {
		return s.sc.mail
	}
	return nil
}

func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if s.sc.rcpt != nil {
		return s.sc.rcpt
	}
	s.to = append(s.to, to)
	return nil
}

func (s *session) Data(r io.Reader) error {
	if s.sc.skipData {
		<-s.srv.release
		return nil
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.srv.got <- received{from: s.from, to: s.to, data: data}
	switch s.sc.afterData {
	case "drop":
		_ = s.conn.Conn().Close() // the content is in, the final reply never leaves
	case "stall":
		<-s.srv.release
	}
	if s.sc.data != nil {
		return s.sc.data
	}
	return nil
}

func (s *session) Reset()        {}
func (s *session) Logout() error { return nil }

// rawServer answers one connection with canned replies keyed by verb ("greeting",
// "EHLO", "MAIL", ...), for what go-smtp cannot be scripted to do: refuse the greeting or
// the DATA command itself. An empty reply closes the connection instead.
func rawServer(t *testing.T, replies map[string]string) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		say := func(verb string) bool {
			r, ok := replies[verb]
			if !ok {
				r = map[string]string{"greeting": "220 localhost", "QUIT": "221 bye"}[verb]
				if r == "" {
					r = "250 ok"
				}
			}
			if r == "" {
				return false
			}
			_, err := fmt.Fprintf(conn, "%s\r\n", r)
			return err == nil
		}
		lines := bufio.NewScanner(conn)
		for ok := say("greeting"); ok && lines.Scan(); {
			verb, _, _ := strings.Cut(lines.Text(), " ")
			ok = say(strings.ToUpper(verb))
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	return port
}

var testCA = sync.OnceValues(func() (tls.Certificate, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "smtpconn test"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:        true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		panic(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, roots
})

func serverTLS(t *testing.T) *tls.Config {
	cert, _ := testCA()
	return &tls.Config{Certificates: []tls.Certificate{cert}}
}

// trust makes c accept the test server's certificate.
func trust(c *Connector) {
	_, roots := testCA()
	c.tls = &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

func testConfig(port int) Config {
	return Config{Host: "127.0.0.1", Port: port, From: sender, TLS: "none", Timeout: 5 * time.Second}
}

func newConnector(t *testing.T, cfg Config) *Connector {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// request is an effect to secretRcpt: without smtp.targets the target is the recipient.
func request(payload string) connector.Request { return requestTo(secretRcpt, payload) }

func requestTo(target, payload string) connector.Request {
	return connector.Request{EffectID: "order-4711/welcome-01", RunKey: "order-4711", ActionType: "send_email",
		Target: target, Payload: json.RawMessage(payload)}
}

const okPayload = `{"to": "` + secretRcpt + `", "subject": "Hello", "text": "Body"}`

func TestSendClassification(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		sc    *script           // go-smtp server
		raw   map[string]string // or a raw scripted server
		cfg   func(*Config)
		trust bool
		want  connector.Outcome
		class string
		// queued: the server read the whole content, so an Ambiguous is real.
		queued bool
	}{
		{name: "sent", sc: &script{}, want: connector.Sent, queued: true},

		// Connecting: nothing can have been sent.
		{name: "connection refused", cfg: func(c *Config) { c.Port = closedPort(t) },
			want: connector.Retryable, class: "connection_refused"},
		{name: "dns", cfg: func(c *Config) { c.Host, c.Port, c.TLS, c.Password = secretHost, 587, "starttls", secretPass },
			want: connector.Retryable, class: "dns"},
		{name: "greeting 421", raw: map[string]string{"greeting": "421 " + secretReply},
			want: connector.Retryable, class: "smtp_421"},
		{name: "greeting 554", raw: map[string]string{"greeting": "554 " + secretReply},
			want: connector.Refused, class: "smtp_554"},
		{name: "greeting dropped", raw: map[string]string{"greeting": ""},
			want: connector.Retryable, class: "connection_lost"},
		{name: "ehlo 421", sc: &script{ehlo: reply(421)}, want: connector.Retryable, class: "smtp_421"},
		{name: "ehlo 554", sc: &script{ehlo: reply(554)}, want: connector.Refused, class: "smtp_554"},
		{name: "starttls not offered", sc: &script{}, cfg: func(c *Config) { c.TLS = "starttls" },
			want: connector.Retryable, class: "tls"},
		{name: "starttls untrusted certificate", sc: &script{tls: "starttls"}, cfg: func(c *Config) { c.TLS = "starttls" },
			want: connector.Retryable, class: "tls"},
		{name: "implicit tls untrusted certificate", sc: &script{tls: "implicit"}, cfg: func(c *Config) { c.TLS = "tls" },
			want: connector.Retryable, class: "tls"},
		{name: "implicit tls against plain server", sc: &script{}, cfg: func(c *Config) { c.TLS = "tls" }, trust: true,
			want: connector.Retryable, class: "tls"},
		{name: "auth wrong password", sc: &script{auth: true},
			cfg:  func(c *Config) { c.Username, c.Password = secretUser, secretPass+"-wrong" },
			want: connector.Refused, class: "auth"},
		{name: "auth 454", sc: &script{auth: true, authReply: reply(454)},
			cfg:  func(c *Config) { c.Username, c.Password = secretUser, secretPass },
			want: connector.Retryable, class: "auth"},
		{name: "auth not offered", sc: &script{},
			cfg:  func(c *Config) { c.Username, c.Password = secretUser, secretPass },
			want: connector.Refused, class: "auth"},

		// The transaction, before the content: nothing was accepted.
		{name: "mail 451", sc: &script{mail: reply(451)}, want: connector.Retryable, class: "smtp_451"},
		{name: "mail 550", sc: &script{mail: reply(550)}, want: connector.Refused, class: "smtp_550"},
		{name: "mail timeout", sc: &script{stallMail: true}, cfg: func(c *Config) { c.Timeout = time.Second },
			want: connector.Retryable, class: "timeout"},
		{name: "rcpt 450", sc: &script{rcpt: reply(450)}, want: connector.Retryable, class: "smtp_450"},
		{name: "rcpt 550", sc: &script{rcpt: reply(550)}, want: connector.Refused, class: "smtp_550"},
		{name: "data command 451", raw: map[string]string{"DATA": "451 " + secretReply},
			want: connector.Retryable, class: "smtp_451"},
		{name: "data command 554", raw: map[string]string{"DATA": "554 " + secretReply},
			want: connector.Refused, class: "smtp_554"},
		{name: "dropped before 354", raw: map[string]string{"DATA": ""},
			want: connector.Retryable, class: "connection_lost"},
		{name: "content not read", sc: &script{skipData: true}, cfg: func(c *Config) { c.Timeout = time.Second },
			want: connector.Retryable, class: "timeout"},

		// The final reply to the content decides.
		{name: "final 452", sc: &script{data: reply(452)}, want: connector.Retryable, class: "smtp_452", queued: true},
		{name: "final 554", sc: &script{data: reply(554)}, want: connector.Refused, class: "smtp_554", queued: true},
		{name: "dropped before final reply", sc: &script{afterData: "drop"},
			want: connector.Ambiguous, class: "connection_lost", queued: true},
		{name: "no final reply before timeout", sc: &script{afterData: "stall"}, cfg: func(c *Config) { c.Timeout = time.Second },
			want: connector.Ambiguous, class: "timeout", queued: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var srv *server
			port := 0
			switch {
			case tt.sc != nil:
				srv = startServer(t, *tt.sc)
				port = srv.port
			case tt.raw != nil:
				port = rawServer(t, tt.raw)
			}
			cfg := testConfig(port)
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			c := newConnector(t, cfg)
			if tt.trust {
				trust(c)
			}
			payload := okPayload
			if tt.name == "content not read" {
				// 8 MiB: twice Linux's default tcp_wmem maximum, so the writes block on a server
				// that never reads and the deadline fires mid-content.
				payload = `{"to": "` + secretRcpt + `", "subject": "Big", "text": "` + strings.Repeat("0123456789abcdef", 1<<19) + `"}`
			}

			res := c.Send(context.Background(), request(payload))

			if res.Outcome != tt.want || res.Class != tt.class {
				t.Errorf("got %v %q, want %v %q", res.Outcome, res.Class, tt.want, tt.class)
			}
			if (res.ProviderID != "") != (tt.want == connector.Sent) {
				t.Errorf("ProviderID %q with outcome %v", res.ProviderID, res.Outcome)
			}
			checkNoLeak(t, res)
			if srv != nil {
				if got := len(srv.got) > 0; got != tt.queued {
					t.Errorf("server read the content: %v, want %v", got, tt.queued)
				}
			}
		})
	}
}

func TestSendDelivers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		sc    script
		cfg   func(*Config)
		trust bool
	}{
		{name: "plain", sc: script{}},
		{name: "plain with auth on loopback", sc: script{auth: true},
			cfg: func(c *Config) { c.Username, c.Password = secretUser, secretPass }},
		{name: "starttls with auth", sc: script{tls: "starttls", auth: true}, trust: true,
			cfg: func(c *Config) { c.TLS, c.Username, c.Password = "starttls", secretUser, secretPass }},
		{name: "implicit tls with auth", sc: script{tls: "implicit", auth: true}, trust: true,
			cfg: func(c *Config) { c.TLS, c.Username, c.Password = "tls", secretUser, secretPass }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := startServer(t, tt.sc)
			cfg := testConfig(srv.port)
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			c := newConnector(t, cfg)
			if tt.trust {
				trust(c)
			}
			req := requestTo("a@example.net", `{"to": ["a@example.net"], "subject": "Grüße\r\nBcc: evil@example.com",
				"text": "Hello text", "html": "<p>Hello html</p>", "reply_to": "support@example.org"}`)

			res := c.Send(context.Background(), req)

			if res.Outcome != connector.Sent || res.Class != "" {
				t.Fatalf("got %+v, want sent", res)
			}
			if !regexp.MustCompile(`^[0-9a-f]{32}@example\.org$`).MatchString(res.ProviderID) {
				t.Errorf("ProviderID %q is not a derived Message-ID", res.ProviderID)
			}
			if res.ProviderID != c.MessageID(req.EffectID) {
				t.Errorf("ProviderID %q, MessageID %q", res.ProviderID, c.MessageID(req.EffectID))
			}
			var got received
			select {
			case got = <-srv.got:
			default:
				t.Fatal("server received nothing")
			}
			if got.from != sender || strings.Join(got.to, ",") != "a@example.net" {
				t.Errorf("envelope from %q to %q", got.from, got.to)
			}
			msg, err := netmail.ReadMessage(strings.NewReader(string(got.data)))
			if err != nil {
				t.Fatal(err)
			}
			subject, err := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
			if err != nil {
				t.Fatal(err)
			}
			for header, want := range map[string]string{
				"Message-Id":          "<" + res.ProviderID + ">",
				"X-Airlock-Effect-Id": "", // the run key stays inside
				"From":                "<" + sender + ">",
				"To":                  `<a@example.net>`,
				"Reply-To":            "<support@example.org>",
				"Bcc":                 "",
			} {
				if got := msg.Header.Get(header); got != want {
					t.Errorf("%s: %q, want %q", header, got, want)
				}
			}
			if subject != "Grüße\r\nBcc: evil@example.com" {
				t.Errorf("Subject: %q", subject)
			}
			body, _ := io.ReadAll(msg.Body)
			if !strings.Contains(string(body), "Hello text") || !strings.Contains(string(body), "<p>Hello html</p>") {
				t.Errorf("body lacks the text or html part:\n%s", body)
			}
		})
	}
}

func TestSendTargets(t *testing.T) {
	t.Parallel()
	srv := startServer(t, script{})
	cfg := testConfig(srv.port)
	cfg.Targets = map[string]string{"customer": "fixed@example.net"}
	c := newConnector(t, cfg)

	res := c.Send(context.Background(), requestTo("customer", `{"subject": "Hi", "text": "Body"}`))
	if res.Outcome != connector.Sent {
		t.Fatalf("got %+v, want sent", res)
	}
	if got := <-srv.got; strings.Join(got.to, ",") != "fixed@example.net" {
		t.Errorf("sent to %q, want the policy's target", got.to)
	}

	for name, req := range map[string]connector.Request{
		"payload names a recipient": requestTo("customer", okPayload),
		"unknown target":            {EffectID: "e", Target: "other", Payload: json.RawMessage(`{"subject": "Hi", "text": "Body"}`)},
	} {
		res := c.Send(context.Background(), req)
		if res.Outcome != connector.Refused {
			t.Errorf("%s: got %+v, want refused", name, res)
		}
	}
	if len(srv.got) != 0 {
		t.Error("a refused request reached the server")
	}
}

func TestSendRefusesBadRequests(t *testing.T) {
	t.Parallel()
	// Nothing listens: had Send connected, the class would be connection_refused.
	c := newConnector(t, testConfig(closedPort(t)))
	tests := map[string]struct {
		req   connector.Request
		class string
	}{
		"no effect id":  {connector.Request{Payload: json.RawMessage(okPayload)}, "invalid_request"},
		"ctl effect id": {connector.Request{EffectID: "e\r\nBcc: x@example.com", Payload: json.RawMessage(okPayload)}, "invalid_request"},
		"not json":      {request(`to: a@b`), "invalid_payload"},
		"null":          {request(`null`), "invalid_payload"},
		"trailing data": {request(okPayload + `{}`), "invalid_payload"},
		"unknown field": {requestTo("a@example.net", `{"to": "a@example.net", "subject": "s", "text": "t", "cc": "x@example.net"}`), "invalid_payload"},
		"empty to list": {request(`{"to": [], "subject": "s", "text": "t"}`), "invalid_payload"},
		"to is number":  {request(`{"to": 5, "subject": "s", "text": "t"}`), "invalid_payload"},
		"bad to":        {request(`{"to": "not an address", "subject": "s", "text": "t"}`), "invalid_payload"},
		"missing subj":  {requestTo("a@example.net", `{"to": "a@example.net", "text": "t"}`), "invalid_payload"},
		"missing text":  {requestTo("a@example.net", `{"to": "a@example.net", "subject": "s"}`), "invalid_payload"},
		"bad reply_to":  {requestTo("a@example.net", `{"to": "a@example.net", "subject": "s", "text": "t", "reply_to": "x"}`), "invalid_payload"},
		// The target is the recipient: a payload cannot send the mail anywhere else.
		"to names another recipient": {requestTo("alice@example.com", `{"to": "mallory@example.net", "subject": "s", "text": "t"}`), "invalid_payload"},
		"to adds a recipient":        {requestTo("alice@example.com", `{"to": ["alice@example.com", "eve@example.net"], "subject": "s", "text": "t"}`), "invalid_payload"},
		"target is a list":           {requestTo("alice@example.com, eve@example.net", `{"subject": "s", "text": "t"}`), "invalid_target"},
		"target with a name":         {requestTo("Alice <alice@example.com>", `{"subject": "s", "text": "t"}`), "invalid_target"},
	}
	for name, tt := range tests {
		res := c.Send(context.Background(), tt.req)
		if res.Outcome != connector.Refused || res.Class != tt.class {
			t.Errorf("%s: got %v %q, want refused %q", name, res.Outcome, res.Class, tt.class)
		}
	}
}

func TestSendHonoursContext(t *testing.T) {
	t.Parallel()
	c := newConnector(t, testConfig(closedPort(t)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if res := c.Send(ctx, request(okPayload)); res.Outcome != connector.Retryable || res.Class != "timeout" {
		t.Errorf("cancelled context: got %+v", res)
	}
}

func TestMessageID(t *testing.T) {
	t.Parallel()
	c := newConnector(t, testConfig(25))
	// sha256("order-4711/welcome-01"), first 16 bytes: reproducible from the effect id alone.
	if got, want := c.MessageID("order-4711/welcome-01"), "c899e6f9aae1066b8588cc62bde123f3@example.org"; got != want {
		t.Errorf("MessageID = %q, want %q", got, want)
	}
	if c.MessageID("r1/e1") == c.MessageID("r2/e1") {
		t.Error("distinct effects share a Message-ID")
	}
	// The provider id of an SMTP send is this derived id, never the server's reply text:
	// it is always one every store keeps as it is (no NUL, no bytes that are not UTF-8).
	if id := c.MessageID("r1/\x00\xff"); func() bool { s, note := connector.SafeProviderID(id); return s != id || note != "" }() {
		t.Errorf("MessageID %q is not a safe provider id", id)
	}
	custom := newConnector(t, Config{Host: "mx.example", Port: 587, From: "a@example.org", MessageIDDomain: "airlock.example"})
	if got := custom.MessageID("e"); !strings.HasSuffix(got, "@airlock.example") {
		t.Errorf("MessageIDDomain ignored: %q", got)
	}
	if c.Idempotent() {
		t.Error("SMTP must not claim idempotency")
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	ok := Config{Host: "smtp.example.com", Port: 587, From: "Airlock <airlock@example.com>"}
	tests := map[string]func(*Config){
		"no host":            func(c *Config) { c.Host = "" },
		"url as host":        func(c *Config) { c.Host = "smtp://smtp.example.com" },
		"unix socket":        func(c *Config) { c.Host = "unix:///run/smtp.sock" },
		"port 0":             func(c *Config) { c.Port = 0 },
		"port too big":       func(c *Config) { c.Port = 70000 },
		"bad from":           func(c *Config) { c.From = "airlock" },
		"bad tls":            func(c *Config) { c.TLS = "ssl" },
		"no tls remote":      func(c *Config) { c.TLS = "none" },
		"negative timeout":   func(c *Config) { c.Timeout = -time.Second },
		"bad message domain": func(c *Config) { c.MessageIDDomain = "a>b" },
		"bad target":         func(c *Config) { c.Targets = map[string]string{"t": "nope"} },
	}
	for name, mutate := range tests {
		cfg := ok
		mutate(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c, err := New(ok)
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.TLS != "starttls" || c.cfg.Timeout != DefaultTimeout || c.cfg.MessageIDDomain != "example.com" {
		t.Errorf("defaults: %+v", c.cfg)
	}
	for _, host := range []string{"localhost", "127.0.0.1", "::1"} {
		if _, err := New(Config{Host: host, Port: 25, From: ok.From, TLS: "none"}); err != nil {
			t.Errorf("tls none on %s: %v", host, err)
		}
	}
}
