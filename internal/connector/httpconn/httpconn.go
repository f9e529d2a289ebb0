// Package httpconn is the HTTP connector: it POSTs an effect's payload to a target named
// in the policy file and classifies what happened into a connector.Outcome.
//
// The classification errs on the side of Ambiguous: once a connection to the provider
// has been obtained, any failure may have come after the provider acted, so only
// failures before that point (DNS, refused connection, TLS, dial timeout) and explicit
// "not performed" replies (429, 503, 3xx, other 4xx) are reported as not sent.
//
// Nothing this package returns — Result fields and error messages — contains host names,
// URLs, the token or response bodies, because results end up in events and logs. The
// package never logs.
package httpconn

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/tracing"
)

const (
	// DefaultTarget is the target name of a single-URL configuration; a Request with an
	// empty Target is sent to it.
	DefaultTarget = "default"
	// Placeholder is replaced by the query-escaped effect id in Config.LookupURL.
	Placeholder = "{effect_id}"

	defaultTimeout = 10 * time.Second
	defaultIDField = "id"
	maxBody        = 64 << 10 // of a send response: only the provider id is wanted
	maxLookupBody  = 1 << 20  // a lookup may list several records
	maxRetryAfter  = time.Hour
)

// Config configures a Connector. It comes from the policy file: clients pick a target
// name, never a URL.
type Config struct {
	// Targets maps a target name to an absolute http(s) URL. A single-URL configuration
	// uses the name DefaultTarget.
	Targets map[string]string
	// Idempotent reports that the provider honours the Idempotency-Key header, so an
	// Ambiguous send may be repeated (and net/http may replay it on a broken connection).
	Idempotent bool
	// Token is the resolved secret. It is sent as "Authorization: Bearer <token>", or as
	// the raw value of TokenHeader when that is set.
	Token       string
	TokenHeader string
	// Timeout bounds a whole request, reading the response included; default 10s.
	Timeout time.Duration
	// LookupURL is optional; Placeholder is replaced by the effect id and a GET is
	// expected to return JSON: an array of objects, or {"results": [...]} / {"data": [...]}.
	LookupURL string
	// LookupAuthoritative reports that "none found" proves the effect was not performed.
	LookupAuthoritative bool
	// IDField is the top-level JSON field holding the provider id, in a 2xx send
	// response and in each lookup result; default "id".
	IDField string
	// Client is optional (tests). Its transport must honour net/http/httptrace, as
	// *http.Transport does: classification depends on the GotConn callback. Redirects are
	// never followed, whatever its CheckRedirect says. A send goes straight to its
	// Transport (http.DefaultTransport if nil): the client's Jar and Timeout are not used
	// for sends (the connector's Timeout bounds them).
	Client *http.Client
}

// Connector sends effects over HTTP. It implements connector.Connector and
// connector.Lookup; HasLookup reports whether lookups are actually configured.
type Connector struct {
	targets       map[string]string
	idempotent    bool
	token         string
	tokenHeader   string
	timeout       time.Duration
	lookupURL     string
	authoritative bool
	idField       string
	client        *http.Client      // lookups
	transport     http.RoundTripper // sends: the client's transport
}

var (
	_ connector.Connector = (*Connector)(nil)
	_ connector.Lookup    = (*Connector)(nil)
)

// New validates cfg and returns a Connector. Errors name the offending field but never
// echo a URL or the token.
func New(cfg Config) (*Connector, error) {
	if len(cfg.Targets) == 0 {
		return nil, errors.New("httpconn: targets: at least one target is required")
	}
	targets := make(map[string]string, len(cfg.Targets))
	for name, raw := range cfg.Targets {
		if err := checkURL(raw); err != nil {
			return nil, fmt.Errorf("httpconn: target %q: %w", name, err)
		}
		targets[name] = raw
	}
	if cfg.LookupURL != "" {
		if !strings.Contains(cfg.LookupURL, Placeholder) {
			return nil, fmt.Errorf("httpconn: lookup_url: must contain %s", Placeholder)
		}
		if err := checkURL(strings.ReplaceAll(cfg.LookupURL, Placeholder, "x")); err != nil {
			return nil, fmt.Errorf("httpconn: lookup_url: %w", err)
		}
	}
	if cfg.Timeout < 0 {
		return nil, errors.New("httpconn: timeout: must not be negative")
	}
	if cfg.TokenHeader != "" && !validHeaderName(cfg.TokenHeader) {
		return nil, errors.New("httpconn: token_header: not a valid header name")
	}
	if hasCTL(cfg.Token) {
		// net/http would refuse every request; say so now, without echoing the token.
		return nil, errors.New("httpconn: token: contains control characters")
	}

	c := &Connector{
		targets:       targets,
		idempotent:    cfg.Idempotent,
		token:         cfg.Token,
		tokenHeader:   cfg.TokenHeader,
		timeout:       cmp.Or(cfg.Timeout, defaultTimeout),
		lookupURL:     cfg.LookupURL,
		authoritative: cfg.LookupAuthoritative,
		idField:       cmp.Or(cfg.IDField, defaultIDField),
	}
	if cfg.Client != nil {
		cl := *cfg.Client // a copy, so the caller's client keeps its redirect policy
		c.client = &cl
	} else {
		c.client = &http.Client{Transport: newTransport()}
	}
	// A redirect is the provider declining this URL; following it would send the effect
	// somewhere the policy file does not name.
	c.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	// A send never follows a redirect and sets no cookie, and its deadline is its
	// context's: http.Client would add nothing but a copy of the request's headers (kept
	// for redirects) and its wrapping of errors, so sends go to the transport directly.
	c.transport = cmp.Or[http.RoundTripper](c.client.Transport, http.DefaultTransport)
	return c, nil
}

// newTransport is http.DefaultTransport's configuration, built afresh so no other code
// shares (or replaces) it. The request timeout is applied per request via the context.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:             http.ProxyFromEnvironment,
		DialContext:       (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2: true,
		MaxIdleConns:      1024,
		// The dispatcher sends up to dispatch.concurrency requests to one provider at once:
		// keep that many connections alive instead of net/http's 2 per host.
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
	}
}

// Idempotent reports Config.Idempotent.
func (c *Connector) Idempotent() bool { return c.idempotent }

// Authoritative reports Config.LookupAuthoritative.
func (c *Connector) Authoritative() bool { return c.authoritative }

// HasLookup reports whether a lookup URL is configured; without one Lookup always fails.
func (c *Connector) HasLookup() bool { return c.lookupURL != "" }

// Send POSTs req.Payload to the target named by req.Target and classifies the result.
func (c *Connector) Send(ctx context.Context, req connector.Request) connector.Result {
	target := req.Target
	if target == "" {
		target = DefaultTarget
	}
	u, ok := c.targets[target]
	if !ok {
		return refused("unknown_target")
	}
	// Invalid JSON is a caller bug that retrying cannot fix. Requiring it also keeps the
	// body non-empty: an empty body would be http.NoBody, which net/http treats as
	// replayable whatever GetBody says.
	if !json.Valid(req.Payload) {
		return refused("invalid_payload")
	}
	// net/http rejects such header values before connecting; that would otherwise look
	// like a retryable connection failure.
	if req.EffectID == "" || hasCTL(req.EffectID) || hasCTL(req.RunKey) || hasCTL(req.ActionType) {
		return refused("invalid_request")
	}

	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel() // after the body has been read: the timeout covers it too
	var tr tracer
	ctx = httptrace.WithClientTrace(ctx, tr.clientTrace())

	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(req.Payload))
	if err != nil {
		return refused("invalid_request") // unreachable: the URL was checked by New
	}
	// The trace of the request that queued the effect (W3C traceparent), so the
	// provider's spans join it: agent → airlock → provider.
	tracing.InjectHeader(ctx, hr.Header)
	if !c.idempotent {
		// With GetBody set and an Idempotency-Key header, net/http considers the POST
		// replayable and silently resends it when a reused connection breaks after the
		// request was written. Only a provider that honours the key may see that.
		hr.GetBody = nil
	}
	// The keys are canonical already; the four values share one backing array.
	vals := [...]string{"application/json", req.EffectID, req.RunKey, req.ActionType}
	v := vals[:]
	hr.Header["Content-Type"] = v[0:1:1]
	hr.Header["Idempotency-Key"] = v[1:2:2]
	hr.Header["X-Airlock-Run-Key"] = v[2:3:3]
	hr.Header["X-Airlock-Action-Type"] = v[3:4:4]
	c.authorize(hr.Header)

	resp, err := c.transport.RoundTrip(hr)
	if err != nil {
		class := tr.class(caller, err)
		if tr.sent() {
			return connector.Result{Outcome: connector.Ambiguous, Class: class}
		}
		return connector.Result{Outcome: connector.Retryable, Class: class}
	}
	defer drainClose(resp.Body)
	return c.classify(resp)
}

// classify maps a response to a Result. Only a 2xx body is read.
func (c *Connector) classify(resp *http.Response) connector.Result {
	code := resp.StatusCode
	class := "http_" + strconv.Itoa(code)
	switch {
	case code >= 200 && code < 300:
		id, note := c.providerID(resp)
		return connector.Result{Outcome: connector.Sent, ProviderID: id, Note: note}
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		return connector.Result{
			Outcome:    connector.Retryable,
			RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()),
			Class:      class,
		}
	case code == http.StatusConflict && c.idempotent:
		// A provider that honours Idempotency-Key answers 409 while a request with the
		// same key is still in progress (Stripe, the IETF Idempotency-Key draft): the
		// first one may yet succeed, so this is no refusal. Asked again later, the
		// provider answers with the first request's outcome.
		return connector.Result{Outcome: connector.Retryable, Class: class,
			RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	case code >= 300 && code < 500:
		return refused(class)
	default:
		// 5xx other than 503 may come after the provider acted; so may a status outside
		// 2xx–5xx (e.g. 101), which no provider should send to a POST.
		return connector.Result{Outcome: connector.Ambiguous, Class: class}
	}
}

// providerID reads the id from the JSON body's IDField, else from X-Provider-Id. The
// status already proves the send, so a body that fails to read or parse is no error, and
// an id no store could keep as it is (bytes that are not UTF-8, a NUL or another control
// character, too long) is not dropped but kept in connector.SafeProviderID's form, with
// its note: an id as given is preferred, the body's over the header's.
func (c *Connector) providerID(resp *http.Response) (string, string) {
	body, readErr := readBody(resp, maxBody)
	var buf [2]string
	candidates := buf[:0]
	if id, ok := idText(member(body, c.idField)); ok {
		candidates = append(candidates, id)
	}
	if id := resp.Header.Get("X-Provider-Id"); id != "" {
		candidates = append(candidates, id)
	}
	for _, id := range candidates {
		if validID(id) {
			return id, ""
		}
	}
	if len(candidates) > 0 {
		return connector.SafeProviderID(candidates[0])
	}
	if readErr != nil {
		return "", connector.NoteProviderIDUnread
	}
	return "", ""
}

// LookupError is the error returned by Lookup. It holds only a fixed class such as
// "http_500", "connection_refused" or "invalid_response", never a URL, host or body.
type LookupError struct {
	Class string
}

func (e *LookupError) Error() string { return "lookup: " + e.Class }

// Lookup asks the provider for the records carrying req.EffectID and returns their ids.
// Only a 2xx with an empty list means none were found: a 404 may be a wrong lookup path,
// and with an authoritative lookup "none" lets the effect be sent again. Any failure is a
// *LookupError, which the caller must not read as "none found".
func (c *Connector) Lookup(ctx context.Context, req connector.Request) ([]string, error) {
	if c.lookupURL == "" {
		return nil, &LookupError{Class: "not_configured"}
	}
	if req.EffectID == "" {
		// An empty key could match every record, or none; neither answers the question.
		return nil, &LookupError{Class: "invalid_request"}
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var tr tracer
	ctx = httptrace.WithClientTrace(ctx, tr.clientTrace())

	u := strings.ReplaceAll(c.lookupURL, Placeholder, url.QueryEscape(req.EffectID))
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, &LookupError{Class: "invalid_request"}
	}
	hr.Header.Set("Accept", "application/json")
	c.authorize(hr.Header)

	resp, err := c.client.Do(hr)
	if err != nil {
		return nil, &LookupError{Class: tr.class(caller, err)}
	}
	defer drainClose(resp.Body)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, &LookupError{Class: "http_" + strconv.Itoa(resp.StatusCode)}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxLookupBody+1))
	if err != nil {
		return nil, &LookupError{Class: tr.class(caller, err)}
	}
	if len(body) > maxLookupBody {
		return nil, &LookupError{Class: "response_too_large"}
	}
	ids, ok := parseLookup(body, c.idField)
	if !ok {
		return nil, &LookupError{Class: "invalid_response"}
	}
	return ids, nil
}

// parseLookup accepts [...], {"results": [...]} or {"data": [...]}, each element an
// object whose idField is a string or number. Anything else fails rather than being
// skipped: a record we cannot identify must not turn into "none found".
func parseLookup(body []byte, idField string) ([]string, bool) {
	items, ok := jsonArray(body)
	if !ok {
		var obj map[string]json.RawMessage
		if json.Unmarshal(body, &obj) != nil {
			return nil, false
		}
		raw, found := obj["results"]
		if !found {
			raw, found = obj["data"]
		}
		if !found {
			return nil, false
		}
		if items, ok = jsonArray(raw); !ok {
			return nil, false
		}
	}
	var ids []string
	for _, item := range items {
		var obj map[string]json.RawMessage
		if json.Unmarshal(item, &obj) != nil {
			return nil, false
		}
		id, ok := idValue(obj[idField])
		if !ok {
			return nil, false
		}
		ids = append(ids, id)
	}
	return ids, true
}

// jsonArray decodes raw only if it is an array, so that null is not read as empty.
func jsonArray(raw []byte) ([]json.RawMessage, bool) {
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '[' {
		return nil, false
	}
	var items []json.RawMessage
	return items, json.Unmarshal(raw, &items) == nil
}

// idValue returns a JSON string or number as text, keeping numbers exact, if it is a
// valid id.
func idValue(raw json.RawMessage) (string, bool) {
	id, ok := idText(raw)
	return id, ok && validID(id)
}

// member is the raw value of body's top-level member name, as json.Unmarshal into a
// map[string]json.RawMessage finds it — the last of duplicates; nil if body is not a JSON
// object or has no such member — without building the map: a reply's few members are
// walked in place. A key written with an escape, or not UTF-8 (json.Unmarshal would have
// decoded or replaced its bytes), sends the whole body through json.Unmarshal instead.
func member(body []byte, name string) json.RawMessage {
	if !json.Valid(body) {
		return nil
	}
	i := skipSpace(body, 0)
	if body[i] != '{' {
		return nil // an array, a string, a number, true, false, null: no member
	}
	var found json.RawMessage
	for i = skipSpace(body, i+1); body[i] == '"'; i = skipSpace(body, i+1) {
		end := i + 1
		for body[end] != '"' {
			if body[end] == '\\' || body[end] >= utf8.RuneSelf {
				return memberSlow(body, name)
			}
			end++
		}
		key := body[i+1 : end]
		i = skipSpace(body, end+1) + 1 // past the colon
		i = skipSpace(body, i)
		start := i
		i = skipValue(body, i)
		if string(key) == name {
			found = body[start:i:i]
		}
		if i = skipSpace(body, i); body[i] == '}' {
			break
		}
		// body[i] is the comma before the next member
	}
	return found
}

// memberSlow is member by json.Unmarshal into a map.
func memberSlow(body []byte, name string) json.RawMessage {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return nil
	}
	return obj[name]
}

// skipSpace returns the index of the first byte at or after i that is not JSON
// whitespace. body is valid JSON, so one always follows where this is called.
func skipSpace(body []byte, i int) int {
	for i < len(body) && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the index just past the JSON value starting at i, in valid JSON.
func skipValue(body []byte, i int) int {
	depth := 0
	for ; i < len(body); i++ {
		switch b := body[i]; b {
		case '"':
			for i++; body[i] != '"'; i++ {
				if body[i] == '\\' {
					i++
				}
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return i + 1
			}
			if depth < 0 {
				return i // the end of the enclosing object: a scalar ended here
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
	}
	return i
}

// readBody reads up to limit bytes of a response body (what it read until an error), in
// one allocation of the body's size when its length is announced.
func readBody(resp *http.Response, limit int64) ([]byte, error) {
	if n := resp.ContentLength; n >= 0 && n <= limit {
		body := make([]byte, n)
		got, err := io.ReadFull(resp.Body, body)
		return body[:got], err
	}
	return io.ReadAll(io.LimitReader(resp.Body, limit))
}

// idText returns a non-empty JSON string or number as text, keeping numbers exact.
func idText(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 {
		return "", false
	}
	if raw[0] == '"' { // the usual id: a string, decoded without the any and Decoder
		var id string
		if json.Unmarshal(raw, &id) != nil {
			return "", false
		}
		return id, id != ""
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return "", false
	}
	var id string
	switch v := v.(type) {
	case string:
		id = v
	case json.Number:
		id = v.String()
	default:
		return "", false
	}
	return id, id != ""
}

// validID keeps ids that can safely go into events and every store as they are.
func validID(id string) bool {
	safe, _ := connector.SafeProviderID(id)
	return id != "" && safe == id
}

func (c *Connector) authorize(h http.Header) {
	switch {
	case c.token == "":
	case c.tokenHeader != "":
		h.Set(c.tokenHeader, c.token)
	default:
		h.Set("Authorization", "Bearer "+c.token)
	}
}

// tracer records, via httptrace, how far a request got. Callbacks may run on transport
// goroutines, even after Do has returned (a dial continues in the background).
type tracer struct {
	gotConn   atomic.Bool
	tlsFailed atomic.Bool
}

func (t *tracer) clientTrace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		// From here on request bytes may reach the provider. net/http calls GotConn on
		// the goroutine running Do, so it is visible when Do returns.
		GotConn: func(httptrace.GotConnInfo) { t.gotConn.Store(true) },
		TLSHandshakeDone: func(_ tls.ConnectionState, err error) {
			if err != nil {
				t.tlsFailed.Store(true)
			}
		},
	}
}

// sent reports whether the request may have been (partly) written.
func (t *tracer) sent() bool { return t.gotConn.Load() }

// class names a transport error without any of its text, which holds the URL and host.
func (t *tracer) class(caller context.Context, err error) string {
	sent := t.sent()
	var dnsErr *net.DNSError
	switch {
	case errors.Is(caller.Err(), context.Canceled):
		return "canceled"
	case !sent && errors.As(err, &dnsErr):
		return "dns"
	case !sent && t.tlsFailed.Load():
		return "tls"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused"
	case isTimeout(err):
		if sent {
			return "timeout"
		}
		return "connect_timeout"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection_reset"
	case !sent:
		return "connect_failed" // e.g. network unreachable, proxy failure
	default:
		return "transport"
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// parseRetryAfter reads Retry-After as delay-seconds or an HTTP-date, capped at
// maxRetryAfter; absent, invalid or past values give 0.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	// An overflowing number parses as ±MaxInt64 with ErrRange: capped, or 0 if negative.
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if secs > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter
		}
		d = time.Duration(secs) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		d = at.Sub(now)
	}
	return min(max(d, 0), maxRetryAfter)
}

func refused(class string) connector.Result {
	return connector.Result{Outcome: connector.Refused, Class: class}
}

// drainClose lets a small unread body be consumed so the connection can be reused.
func drainClose(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, maxBody))
	_ = body.Close()
}

func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("invalid URL") // url.Error would echo the URL
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("URL must be absolute http or https")
	}
	if u.Host == "" {
		return errors.New("URL has no host")
	}
	if u.User != nil {
		return errors.New("URL must not embed credentials; use the token")
	}
	return nil
}

// hasCTL reports bytes net/http refuses in header values.
func hasCTL(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return true
		}
	}
	return false
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0) {
			return false
		}
	}
	return s != ""
}
