package apptest

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/emersion/go-smtp"
)

// MailServer is a real SMTP server on loopback for tests: it keeps every message it
// accepts, by Message-ID.
type MailServer struct {
	Port  int
	mu    sync.Mutex
	msgs  []string
	rcpts []string
}

// NewMailServer starts the server; it stops when t ends.
func NewMailServer(t testing.TB) *MailServer {
	ms := &MailServer{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ms.Port = ln.Addr().(*net.TCPAddr).Port
	srv := smtp.NewServer(mailBackend{ms})
	srv.Domain = "localhost"
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ms
}

// Recipients returns every envelope recipient accepted (RCPT TO), in order.
func (ms *MailServer) Recipients() []string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return append([]string(nil), ms.rcpts...)
}

// Messages returns the raw messages received.
func (ms *MailServer) Messages() []string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return append([]string(nil), ms.msgs...)
}

type mailBackend struct{ ms *MailServer }

func (b mailBackend) NewSession(*smtp.Conn) (smtp.Session, error) { return &mailSession{ms: b.ms}, nil }

type mailSession struct{ ms *MailServer }

func (s *mailSession) Mail(string, *smtp.MailOptions) error { return nil }
func (s *mailSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	if to == "bounce@example.com" {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
	}
	s.ms.mu.Lock()
	s.ms.rcpts = append(s.ms.rcpts, to)
	s.ms.mu.Unlock()
	return nil
}
func (s *mailSession) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return errors.New("read")
	}
	s.ms.mu.Lock()
	s.ms.msgs = append(s.ms.msgs, string(b))
	s.ms.mu.Unlock()
	return nil
}
func (s *mailSession) Reset()        {}
func (s *mailSession) Logout() error { return nil }
