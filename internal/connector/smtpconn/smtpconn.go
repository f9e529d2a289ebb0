// Package smtpconn is the SMTP connector: it sends an effect as one e-mail through a
// submission server and classifies what the SMTP conversation established.
//
// SMTP has no idempotency key the server honours, so the classification decides
// everything. A failure before the message content was handed over (connecting, TLS,
// EHLO, AUTH, MAIL FROM, RCPT TO, the DATA command) means nothing was accepted: a 4xx
// reply or a network error is Retryable, a 5xx reply is Refused. Once the content and
// its terminating "." have been written, only the server's final reply tells: 250 is
// Sent, 4xx Retryable, 5xx Refused, and no reply at all (timeout, dropped connection,
// garbled reply) is Ambiguous, because the server may already have queued the message.
//
// Every attempt of one effect carries the same Message-ID, derived from the effect id
// (unique across runs), so a resend, only ever by an operator, can be recognised.
// Results carry fixed classes only, never host names, addresses, credentials or server
// reply text.
package smtpconn

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	netmail "net/mail"
	"net/textproto"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/wneessen/go-mail"
	gosmtp "github.com/wneessen/go-mail/smtp"

	"github.com/airlockhq/airlock/internal/connector"
)

// DefaultTimeout bounds an attempt when Config.Timeout is zero.
const DefaultTimeout = 30 * time.Second

// Config configures one SMTP submission server.
type Config struct {
	Host string
	Port int
	// Username enables SMTP AUTH (PLAIN or LOGIN, whichever the server offers first
	// in that order). Password is already resolved by the caller from env or file.
	Username, Password string
	// From is the envelope sender and the header From.
	From string
	// TLS is "starttls" (default; the server must offer it), "tls" (implicit TLS) or
	// "none" (loopback hosts only: tests and a local relay).
	TLS string
	// Timeout bounds connecting and, again, the mail transaction; default 30s.
	Timeout time.Duration
	// MessageIDDomain is the right-hand side of derived Message-IDs; default: From's
	// domain.
	MessageIDDomain string
	// Targets, when set, fixes the recipient per target name in policy: the payload may
	// not name one, and the recipient is Targets[req.Target].
	Targets map[string]string
}

// Connector sends effects as e-mail. It is safe for concurrent use: each Send opens its
// own connection.
type Connector struct {
	cfg Config
	// tls overrides the TLS client configuration (tests trust their own CA); nil means
	// the system roots with ServerName = Host.
	tls *tls.Config
}

var _ connector.Connector = (*Connector)(nil)

// New validates cfg and returns a Connector. Errors name the offending field, never its
// value, since the value may be a secret or an internal host.
func New(cfg Config) (*Connector, error) {
	if cfg.Host == "" || strings.ContainsAny(cfg.Host, " \t\r\n/@[]") {
		return nil, errors.New("smtpconn: host is empty or malformed")
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, errors.New("smtpconn: port out of range")
	}
	from, err := netmail.ParseAddress(cfg.From)
	if err != nil {
		return nil, errors.New("smtpconn: from is not a valid address")
	}
	switch cfg.TLS {
	case "":
		cfg.TLS = "starttls"
	case "starttls", "tls":
	case "none":
		// Without TLS the whole conversation, credentials included, is in the clear.
		if ip := net.ParseIP(cfg.Host); cfg.Host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, errors.New(`smtpconn: tls "none" is only allowed for a loopback host`)
		}
	default:
		return nil, errors.New(`smtpconn: tls must be "starttls", "tls" or "none"`)
	}
	if cfg.Timeout < 0 {
		return nil, errors.New("smtpconn: timeout is negative")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MessageIDDomain == "" {
		cfg.MessageIDDomain = from.Address[strings.LastIndexByte(from.Address, '@')+1:]
	}
	if !validDomain(cfg.MessageIDDomain) {
		return nil, errors.New("smtpconn: message id domain is malformed")
	}
	for name, addr := range cfg.Targets {
		if _, err := netmail.ParseAddress(addr); err != nil {
			return nil, fmt.Errorf("smtpconn: target %q is not a valid address", name)
		}
	}
	return &Connector{cfg: cfg}, nil
}

// validDomain accepts a dot-atom domain (RFC 5322 id-right), enough for a Message-ID.
func validDomain(d string) bool {
	if d == "" || strings.HasPrefix(d, ".") || strings.HasSuffix(d, ".") || strings.Contains(d, "..") {
		return false
	}
	for _, r := range d {
		if !(r == '.' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// Idempotent is false: SMTP servers do not de-duplicate by Message-ID, so an Ambiguous
// send must never be repeated automatically.
func (c *Connector) Idempotent() bool { return false }

// MessageID returns the Message-ID (without angle brackets) that Send gives the effect
// effectID: the first 128 bits of its SHA-256 in hex, at MessageIDDomain. It is stable
// across attempts, so a resend carries the same Message-ID, and an operator can look for
// an Ambiguous send in the recipient's or the relay's logs.
func (c *Connector) MessageID(effectID string) string {
	sum := sha256.Sum256([]byte(effectID))
	return hex.EncodeToString(sum[:16]) + "@" + c.cfg.MessageIDDomain
}

// Send delivers req as one message over a fresh connection and classifies the outcome.
//
// ctx bounds connecting; its deadline, if sooner than Timeout, also bounds the
// conversation. Cancelling ctx without a deadline does not interrupt a conversation
// already under way: abandoning it after DATA would turn a clean outcome into an
// Ambiguous one.
func (c *Connector) Send(ctx context.Context, req connector.Request) connector.Result {
	msg, err := c.compose(req)
	if err != nil {
		return result(connector.Refused, err.Error())
	}
	timeout := c.cfg.Timeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	if ctx.Err() != nil || timeout <= 0 {
		return result(connector.Retryable, "timeout")
	}
	res := c.deliver(ctx, msg, timeout)
	if res.Outcome == connector.Sent {
		res.ProviderID = c.MessageID(req.EffectID)
	}
	return res
}

// refusal is a payload or request problem found before connecting; its text is the class.
type refusal string

func (r refusal) Error() string { return string(r) }

// compose validates the request and builds the message. Nothing is sent when it fails.
func (c *Connector) compose(req connector.Request) (*mail.Msg, error) {
	const invalid = refusal("invalid_payload")
	if req.EffectID == "" || strings.ContainsFunc(req.EffectID, unicode.IsControl) {
		// Without it every message would share one Message-ID; it also goes into a header.
		return nil, refusal("invalid_request")
	}
	p, err := ParseMail(req.Payload) // the rule the outbox applied when it was queued
	if err != nil {
		return nil, invalid
	}
	// The target is the recipient — what the card, the effect and the audit show — so the
	// mail goes nowhere else: the payload may repeat it, never add or change one.
	to := []string{req.Target}
	if len(c.cfg.Targets) > 0 {
		if p.To != nil {
			return nil, invalid // the recipient is fixed in policy, a payload may not redirect it
		}
		addr, ok := c.cfg.Targets[req.Target]
		if !ok {
			return nil, refusal("unknown_target")
		}
		to = []string{addr}
	} else {
		if p.To != nil && len(p.To) == 0 {
			return nil, invalid
		}
		for _, r := range p.To {
			if !SameAddress(r, req.Target) {
				return nil, invalid
			}
		}
		if !SameAddress(req.Target, req.Target) {
			return nil, refusal("invalid_target") // one bare address, nothing else
		}
	}

	m := mail.NewMsg()
	if err := m.From(c.cfg.From); err != nil {
		return nil, refusal("config") // unreachable: New validated From
	}
	if err := m.To(to...); err != nil {
		return nil, invalid
	}
	if p.ReplyTo != "" {
		if err := m.ReplyTo(p.ReplyTo); err != nil {
			return nil, invalid
		}
	}
	m.Subject(p.Subject) // go-mail encodes control characters, so no header injection
	m.SetMessageIDWithValue(c.MessageID(req.EffectID))
	// No header carries the effect id itself: it holds the run key, which the recipient
	// has no business seeing. The Message-ID is its hash.
	m.SetBodyString(mail.TypeTextPlain, p.Text)
	if p.HTML != "" {
		m.AddAlternativeString(mail.TypeTextHTML, p.HTML)
	}
	return m, nil
}

// deliver runs one SMTP conversation for msg.
func (c *Connector) deliver(ctx context.Context, msg *mail.Msg, timeout time.Duration) connector.Result {
	tlsConfig := &tls.Config{ServerName: c.cfg.Host, MinVersion: tls.VersionTLS12}
	if c.tls != nil {
		tlsConfig = c.tls.Clone()
	}

	// Our own dialer keeps hold of the raw connection, because go-mail leaves it open when
	// EHLO, STARTTLS or AUTH fail; it also joins host and port correctly for IPv6.
	var raw net.Conn
	defer func() {
		if raw != nil {
			_ = raw.Close()
		}
	}()
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(c.cfg.Host, strconv.Itoa(c.cfg.Port)))
		if err != nil {
			return nil, err
		}
		raw = conn
		if c.cfg.TLS != "tls" {
			return conn, nil
		}
		tc := tls.Client(conn, tlsConfig)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, err
		}
		return tc, nil
	}

	opts := []mail.Option{
		mail.WithPort(c.cfg.Port),
		mail.WithTimeout(timeout),
		mail.WithDialContextFunc(dial),
		mail.WithTLSConfig(tlsConfig),
		mail.WithoutNoop(), // a NOOP right after EHLO proves nothing
		mail.WithoutRset(), // one message per connection; a failed RSET would only add noise
	}
	switch c.cfg.TLS {
	case "starttls":
		opts = append(opts, mail.WithTLSPolicy(mail.TLSMandatory))
	case "tls":
		opts = append(opts, mail.WithSSL())
	case "none":
		opts = append(opts, mail.WithTLSPolicy(mail.NoTLS))
	}
	if c.cfg.Username != "" {
		// go-mail's PLAIN and LOGIN refuse to send credentials unencrypted except to
		// localhost, whatever the server advertises.
		opts = append(opts,
			mail.WithOpportunisticSMTPAuth(mail.SMTPAuthPlain, mail.SMTPAuthLogin),
			mail.WithUsername(c.cfg.Username), mail.WithPassword(c.cfg.Password))
	}
	client, err := mail.NewClient(c.cfg.Host, opts...)
	if err != nil {
		return result(connector.Retryable, "client") // only os.Hostname can fail here
	}

	session, err := client.DialToSMTPClientWithContext(ctx)
	if err != nil {
		return classifyConnect(err)
	}
	sendErr := client.SendWithSMTPClient(session, msg)
	_ = client.CloseWithSMTPClient(session) // QUIT; it changes nothing about the outcome
	if sendErr == nil || msg.IsDelivered() {
		return result(connector.Sent, "")
	}
	return classifySend(sendErr)
}

func result(o connector.Outcome, class string) connector.Result {
	return connector.Result{Outcome: o, Class: class}
}

// byReply classifies a failure that carries an SMTP reply code, for a phase in which the
// server had not accepted the message: 4xx is temporary, 5xx permanent.
func byReply(code int, class string) connector.Result {
	if code >= 500 && code < 600 {
		return result(connector.Refused, class)
	}
	return result(connector.Retryable, class) // 4xx, or an unexpected code before the message
}

// replyClass names a reply by its code only; the reply text may echo addresses.
func replyClass(code int) string { return "smtp_" + strconv.Itoa(code) }

// classifyConnect classifies a failure to connect, greet, EHLO, STARTTLS or AUTH. No mail
// transaction had begun, so nothing can have been sent. Only classes, never outcomes,
// depend on matching go-mail's untyped error texts.
func classifyConnect(err error) connector.Result {
	auth := isAuthError(err)
	var reply *textproto.Error
	if errors.As(err, &reply) {
		if auth {
			return byReply(reply.Code, "auth") // 535 bad credentials, 454 temporary
		}
		return byReply(reply.Code, replyClass(reply.Code))
	}
	var dnsErr *net.DNSError
	switch {
	case isTimeout(err):
		return result(connector.Retryable, "timeout")
	case errors.As(err, &dnsErr):
		return result(connector.Retryable, "dns")
	case errors.Is(err, syscall.ECONNREFUSED):
		return result(connector.Retryable, "connection_refused")
	case isTLSError(err):
		// Retryable rather than Refused: a middlebox, a pool member without TLS or a
		// certificate being rotated may clear up, and the retry cap bounds the rest.
		return result(connector.Retryable, "tls")
	case auth:
		// No usable mechanism, or it would send credentials unencrypted: a configuration
		// mismatch that retrying will not fix.
		return result(connector.Refused, "auth")
	}
	return result(connector.Retryable, "connection_lost")
}

// classifySend classifies a failed mail transaction from go-mail's SendError.
func classifySend(err error) connector.Result {
	var se *mail.SendError
	if !errors.As(err, &se) {
		return result(connector.Ambiguous, "unknown") // cannot tell how far it got
	}
	code := se.ErrorCode() // 4xx or 5xx from the server's reply, 0 when there was none
	switch se.Reason {
	case mail.ErrSMTPMailFrom, mail.ErrSMTPRcptTo, mail.ErrSMTPData:
		// Rejected before the server answered DATA with 354, so it holds no content.
		// With several recipients go-mail reports the code of the last one refused.
		if code != 0 {
			return byReply(code, replyClass(code))
		}
		return result(connector.Retryable, netClass(se))
	case mail.ErrWriteContent:
		// Writing the content failed before the terminating "." was handed to the
		// connection (it is written only when the data writer closes), and a server
		// must not deliver a message whose DATA never ended.
		return result(connector.Retryable, netClass(se))
	case mail.ErrSMTPDataClose:
		// The content and its terminator were handed over (go-mail ignores an error
		// writing the terminator and reads the reply); only the final reply tells.
		if code != 0 {
			return byReply(code, replyClass(code))
		}
		return result(connector.Ambiguous, netClass(se))
	case mail.ErrConnCheck:
		return result(connector.Retryable, "connection_lost") // before MAIL FROM
	case mail.ErrGetSender, mail.ErrGetRcpts, mail.ErrNoUnencoded:
		return result(connector.Refused, "invalid_payload") // go-mail refused the message itself
	}
	return result(connector.Ambiguous, "unknown") // ErrSMTPReset after a 250 is caught by IsDelivered
}

// netClass names a failure without a reply code.
func netClass(err error) string {
	if isTimeout(err) {
		return "timeout"
	}
	return "connection_lost"
}

func isTimeout(err error) bool {
	var ne net.Error
	if (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	// mail.SendError does not unwrap to its cause; its text carries the cause's.
	return strings.Contains(err.Error(), os.ErrDeadlineExceeded.Error())
}

func isTLSError(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		header   tls.RecordHeaderError
		alert    tls.AlertError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
	)
	if errors.As(err, &verify) || errors.As(err, &header) || errors.As(err, &alert) ||
		errors.As(err, &unknown) || errors.As(err, &hostname) {
		return true
	}
	// crypto/tls reports most handshake failures as plain errors prefixed "tls: ";
	// go-mail reports a missing STARTTLS as plain text.
	s := err.Error()
	return strings.Contains(s, "tls: ") || strings.Contains(s, "does not support STARTTLS")
}

func isAuthError(err error) bool {
	for _, target := range []error{
		mail.ErrPlainAuthNotSupported, mail.ErrLoginAuthNotSupported,
		mail.ErrNoSupportedAuthDiscovered, gosmtp.ErrUnencrypted, gosmtp.ErrWrongHostname,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	// go-mail v0.8.1 wraps AUTH failures as "SMTP AUTH failed: %w" and reports a server
	// without AUTH in plain text.
	s := err.Error()
	return strings.HasPrefix(s, "SMTP AUTH failed") || strings.HasPrefix(s, "server does not support SMTP AUTH")
}
