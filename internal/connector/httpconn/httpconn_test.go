package httpconn

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/connector"
)

const (
	secretToken    = "TOKEN-SECRET-4242"
	secretBody     = "RESPONSE-SECRET"
	secretHostURL  = "http://secret-host-name.invalid:1/"
	secretHostName = "secret-host-name"
)

func testRequest(effectID string) connector.Request {
	return connector.Request{
		EffectID:   effectID,
		RunKey:     "run-1",
		ActionType: "crm_note",
		Payload:    json.RawMessage(`{"note":"hello"}`),
	}
}

func mustNew(t *testing.T, cfg Config) *Connector {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// server starts an httptest server. Its Close waits for running handlers, so a channel
// that blocked handlers wait on must be closed by a cleanup registered after it.
func server(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// hijack takes the connection from a handler after the request body was read.
func hijack(t *testing.T, w http.ResponseWriter, r *http.Request) net.Conn {
	t.Helper()
	_, _ = io.ReadAll(r.Body)
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return nil
	}
	return conn
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// blockingDial is a transport whose dials hang until the test ends, signalling on dialing
// when they start: a connection is never obtained.
func blockingDial(t *testing.T, dialing chan<- struct{}) *http.Client {
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if dialing != nil {
				dialing <- struct{}{}
			}
			<-done // the transport detaches dials from the request's cancellation
			return nil, errors.New("dial released")
		},
	}}
}

// sha16 is the first 16 hex digits of s's SHA-256 (a truncated provider id's suffix).
func sha16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

func TestSendClassifiesResponses(t *testing.T) {
	pad := strings.Repeat("x", maxBody)
	tests := []struct {
		name    string
		idField string
		handler http.HandlerFunc
		want    connector.Result
	}{
		{"200 string id", "", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `{"id":"p-123","note":"`+secretBody+`"}`)
		}, connector.Result{Outcome: connector.Sent, ProviderID: "p-123"}},
		{"201 numeric id kept exact", "", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"id":12345678901234567890}`)
		}, connector.Result{Outcome: connector.Sent, ProviderID: "12345678901234567890"}},
		{"202 custom id field", "message_id", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprint(w, `{"id":"wrong","message_id":"m-9"}`)
		}, connector.Result{Outcome: connector.Sent, ProviderID: "m-9"}},
		{"200 id from header when body has none", "", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Provider-Id", "h-1")
			fmt.Fprint(w, `{"ok":true}`)
		}, connector.Result{Outcome: connector.Sent, ProviderID: "h-1"}},
		{"200 whose body breaks off before its id", "", func(w http.ResponseWriter, r *http.Request) {
			conn := hijack(t, w, r)
			if conn == nil {
				return
			}
			fmt.Fprint(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ok\":tr")
			conn.Close()
		}, connector.Result{Outcome: connector.Sent, Note: connector.NoteProviderIDUnread}},
		{"409 is a refusal for a type that is not idempotent", "", status(http.StatusConflict, ""),
			connector.Result{Outcome: connector.Refused, Class: "http_409"}},
		{"200 id not string or number", "", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Provider-Id", "h-2")
			fmt.Fprint(w, `{"id":{"nested":"x"}}`)
		}, connector.Result{Outcome: connector.Sent, ProviderID: "h-2"}},
		// An id no store keeps as it is (a control byte): the send happened, so it is kept
		// escaped.
		{"200 id with control bytes", "", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `{"id":"a\nb"}`)
		}, connector.Result{Outcome: connector.Sent, ProviderID: `"a\nb"`, Note: connector.NoteProviderIDEscaped}},
		{"200 id with a NUL", "", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `{"id":"a\u0000b"}`)
		}, connector.Result{Outcome: connector.Sent, ProviderID: `"a\x00b"`, Note: connector.NoteProviderIDEscaped}},
		{"200 header id not UTF-8", "", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Provider-Id", "h-\xff\xfe")
			fmt.Fprint(w, `{"ok":true}`)
		}, connector.Result{Outcome: connector.Sent, ProviderID: `"h-\xff\xfe"`, Note: connector.NoteProviderIDEscaped}},
		{"200 a valid header id before an escaped body id", "", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Provider-Id", "h-4")
			fmt.Fprint(w, `{"id":"a\u0000b"}`)
		}, connector.Result{Outcome: connector.Sent, ProviderID: "h-4"}},
		{"200 id too long", "", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `{"id":"`+strings.Repeat("i", 300)+`"}`)
		}, connector.Result{Outcome: connector.Sent, ProviderID: strings.Repeat("i", 256-len("…sha256:")-16) + "…sha256:" + sha16(strings.Repeat("i", 300)),
			Note: connector.NoteProviderIDTruncated}},
		{"200 non-JSON body", "", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, secretBody)
		}, connector.Result{Outcome: connector.Sent}},
		{"200 body beyond 64 KiB is not parsed", "", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Provider-Id", "h-3")
			fmt.Fprint(w, `{"id":"early","pad":"`+pad+`"}`)
		}, connector.Result{Outcome: connector.Sent, ProviderID: "h-3"}},
		{"204 no content", "", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		}, connector.Result{Outcome: connector.Sent}},
		{"302 not followed", "", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/elsewhere" {
				t.Error("redirect was followed")
			}
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		}, connector.Result{Outcome: connector.Refused, Class: "http_302"}},
		{"307 not followed", "", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", secretHostURL)
			w.WriteHeader(http.StatusTemporaryRedirect)
		}, connector.Result{Outcome: connector.Refused, Class: "http_307"}},
		{"400", "", status(http.StatusBadRequest, ""), connector.Result{Outcome: connector.Refused, Class: "http_400"}},
		{"401", "", status(http.StatusUnauthorized, ""), connector.Result{Outcome: connector.Refused, Class: "http_401"}},
		{"409", "", status(http.StatusConflict, ""), connector.Result{Outcome: connector.Refused, Class: "http_409"}},
		{"429 with Retry-After seconds", "", status(http.StatusTooManyRequests, "7"),
			connector.Result{Outcome: connector.Retryable, RetryAfter: 7 * time.Second, Class: "http_429"}},
		{"429 Retry-After capped", "", status(http.StatusTooManyRequests, "86400"),
			connector.Result{Outcome: connector.Retryable, RetryAfter: time.Hour, Class: "http_429"}},
		{"503 without Retry-After", "", status(http.StatusServiceUnavailable, ""),
			connector.Result{Outcome: connector.Retryable, Class: "http_503"}},
		{"500", "", status(http.StatusInternalServerError, ""), connector.Result{Outcome: connector.Ambiguous, Class: "http_500"}},
		{"502", "", status(http.StatusBadGateway, ""), connector.Result{Outcome: connector.Ambiguous, Class: "http_502"}},
		{"504", "", status(http.StatusGatewayTimeout, ""), connector.Result{Outcome: connector.Ambiguous, Class: "http_504"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := server(t, tt.handler)
			c := mustNew(t, Config{Targets: map[string]string{DefaultTarget: srv.URL}, IDField: tt.idField, Token: secretToken})
			got := c.Send(t.Context(), testRequest("eff-1"))
			if got != tt.want {
				t.Errorf("Send = %+v, want %+v", got, tt.want)
			}
			assertClean(t, fmt.Sprintf("%+v", got), srv.URL)
		})
	}
}

// status replies code with a body that must never surface, and Retry-After if given.
func status(code int, retryAfter string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(code)
		fmt.Fprint(w, `{"id":"p-1","error":"`+secretBody+`"}`)
	}
}

func TestSendRefusesBadRequestsWithoutSending(t *testing.T) {
	var hits atomic.Int32
	srv := server(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	c := mustNew(t, Config{Targets: map[string]string{"crm": srv.URL}})
	tests := []struct {
		name   string
		modify func(*connector.Request)
		class  string
	}{
		{"unknown target", func(r *connector.Request) { r.Target = "other" }, "unknown_target"},
		{"URL as target", func(r *connector.Request) { r.Target = srv.URL }, "unknown_target"},
		{"empty target without default", func(r *connector.Request) { r.Target = "" }, "unknown_target"},
		{"empty payload", func(r *connector.Request) { r.Payload = nil }, "invalid_payload"},
		{"invalid JSON", func(r *connector.Request) { r.Payload = json.RawMessage(`{"a":`) }, "invalid_payload"},
		{"empty effect id", func(r *connector.Request) { r.EffectID = "" }, "invalid_request"},
		{"newline in run key", func(r *connector.Request) { r.RunKey = "a\r\nX-Evil: 1" }, "invalid_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := testRequest("eff-1")
			req.Target = "crm"
			tt.modify(&req)
			got := c.Send(t.Context(), req)
			if want := (connector.Result{Outcome: connector.Refused, Class: tt.class}); got != want {
				t.Errorf("Send = %+v, want %+v", got, want)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("server got %d requests, want 0", n)
	}
}

func TestSendRequestShape(t *testing.T) {
	tests := []struct {
		name                  string
		token, tokenHeader    string
		wantHeader, wantValue string
		target                string
		targets               map[string]string
		wantPath              string
	}{
		{name: "bearer token, default target", token: secretToken,
			wantHeader: "Authorization", wantValue: "Bearer " + secretToken,
			targets: map[string]string{DefaultTarget: "/default"}, wantPath: "/default"},
		{name: "custom token header", token: secretToken, tokenHeader: "X-Api-Key",
			wantHeader: "X-Api-Key", wantValue: secretToken,
			target: "b", targets: map[string]string{"a": "/a", "b": "/b"}, wantPath: "/b"},
		{name: "no token", wantHeader: "Authorization", wantValue: "",
			target: "a", targets: map[string]string{"a": "/a"}, wantPath: "/a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make(chan *http.Request, 1)
			gotBody := make(chan string, 1)
			srv := server(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got <- r
				gotBody <- string(b)
			})
			targets := map[string]string{}
			for name, path := range tt.targets {
				targets[name] = srv.URL + path
			}
			c := mustNew(t, Config{Targets: targets, Token: tt.token, TokenHeader: tt.tokenHeader})
			req := testRequest("eff-7")
			req.Target = tt.target
			if res := c.Send(t.Context(), req); res.Outcome != connector.Sent {
				t.Fatalf("Send = %+v", res)
			}
			r := <-got
			if r.Method != http.MethodPost || r.URL.Path != tt.wantPath {
				t.Errorf("request = %s %s, want POST %s", r.Method, r.URL.Path, tt.wantPath)
			}
			if body := <-gotBody; body != string(req.Payload) {
				t.Errorf("body = %q, want %q", body, req.Payload)
			}
			for h, want := range map[string]string{
				"Content-Type":          "application/json",
				"Idempotency-Key":       "eff-7",
				"X-Airlock-Run-Key":     "run-1",
				"X-Airlock-Action-Type": "crm_note",
				tt.wantHeader:           tt.wantValue,
			} {
				if v := r.Header.Get(h); v != want {
					t.Errorf("header %s = %q, want %q", h, v, want)
				}
			}
		})
	}
}

func TestSendTransportErrors(t *testing.T) {
	tests := []struct {
		name string
		// setup returns the config and a context for Send.
		setup func(t *testing.T) (Config, context.Context)
		want  connector.Result
	}{
		{"dns failure", func(t *testing.T) (Config, context.Context) {
			// A transport without a proxy, so an HTTP_PROXY in the environment cannot
			// turn the DNS failure into a proxy reply.
			return Config{Targets: map[string]string{DefaultTarget: secretHostURL},
				Client: &http.Client{Transport: &http.Transport{}}}, t.Context()
		}, connector.Result{Outcome: connector.Retryable, Class: "dns"}},

		{"connection refused", func(t *testing.T) (Config, context.Context) {
			return Config{Targets: map[string]string{DefaultTarget: "http://" + closedAddr(t) + "/"}}, t.Context()
		}, connector.Result{Outcome: connector.Retryable, Class: "connection_refused"}},

		{"tls untrusted certificate", func(t *testing.T) (Config, context.Context) {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				t.Error("request reached the server")
			}))
			srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the expected handshake failure
			srv.StartTLS()
			t.Cleanup(srv.Close)
			return Config{Targets: map[string]string{DefaultTarget: srv.URL}}, t.Context()
		}, connector.Result{Outcome: connector.Retryable, Class: "tls"}},

		{"tls to a plain HTTP server", func(t *testing.T) (Config, context.Context) {
			srv := server(t, func(w http.ResponseWriter, r *http.Request) { t.Error("request reached the server") })
			return Config{Targets: map[string]string{DefaultTarget: "https://" + srv.Listener.Addr().String()}}, t.Context()
		}, connector.Result{Outcome: connector.Retryable, Class: "tls"}},

		{"dial timeout", func(t *testing.T) (Config, context.Context) {
			return Config{Targets: map[string]string{DefaultTarget: "http://198.51.100.1/"},
				Timeout: 200 * time.Millisecond, Client: blockingDial(t, nil)}, t.Context()
		}, connector.Result{Outcome: connector.Retryable, Class: "connect_timeout"}},

		{"caller cancels before connecting", func(t *testing.T) (Config, context.Context) {
			dialing := make(chan struct{})
			ctx, cancel := context.WithCancel(t.Context())
			go func() { <-dialing; cancel() }()
			return Config{Targets: map[string]string{DefaultTarget: "http://198.51.100.1/"},
				Client: blockingDial(t, dialing)}, ctx
		}, connector.Result{Outcome: connector.Retryable, Class: "canceled"}},

		{"timeout waiting for the response", func(t *testing.T) (Config, context.Context) {
			done := make(chan struct{})
			srv := server(t, func(w http.ResponseWriter, r *http.Request) { <-done })
			t.Cleanup(func() { close(done) }) // runs before srv.Close, which waits for handlers
			return Config{Targets: map[string]string{DefaultTarget: srv.URL}, Timeout: 200 * time.Millisecond}, t.Context()
		}, connector.Result{Outcome: connector.Ambiguous, Class: "timeout"}},

		{"caller cancels after the request arrived", func(t *testing.T) (Config, context.Context) {
			done := make(chan struct{})
			ctx, cancel := context.WithCancel(t.Context())
			srv := server(t, func(w http.ResponseWriter, r *http.Request) {
				cancel()
				<-done
			})
			t.Cleanup(func() { close(done) })
			return Config{Targets: map[string]string{DefaultTarget: srv.URL}}, ctx
		}, connector.Result{Outcome: connector.Ambiguous, Class: "canceled"}},

		{"connection closed after the request was read", func(t *testing.T) (Config, context.Context) {
			srv := server(t, func(w http.ResponseWriter, r *http.Request) {
				if conn := hijack(t, w, r); conn != nil {
					conn.Close()
				}
			})
			return Config{Targets: map[string]string{DefaultTarget: srv.URL}}, t.Context()
		}, connector.Result{Outcome: connector.Ambiguous, Class: "connection_reset"}},

		{"connection reset after the request was read", func(t *testing.T) (Config, context.Context) {
			srv := server(t, func(w http.ResponseWriter, r *http.Request) {
				if conn := hijack(t, w, r); conn != nil {
					_ = conn.(*net.TCPConn).SetLinger(0) // close with RST
					conn.Close()
				}
			})
			return Config{Targets: map[string]string{DefaultTarget: srv.URL}}, t.Context()
		}, connector.Result{Outcome: connector.Ambiguous, Class: "connection_reset"}},

		{"malformed response", func(t *testing.T) (Config, context.Context) {
			srv := server(t, func(w http.ResponseWriter, r *http.Request) {
				if conn := hijack(t, w, r); conn != nil {
					fmt.Fprint(conn, secretBody+" garbage\r\n\r\n")
					conn.Close()
				}
			})
			return Config{Targets: map[string]string{DefaultTarget: srv.URL}}, t.Context()
		}, connector.Result{Outcome: connector.Ambiguous, Class: "transport"}},

		{"2xx headers then body timeout is still sent", func(t *testing.T) (Config, context.Context) {
			done := make(chan struct{})
			srv := server(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Provider-Id", "h-9")
				w.WriteHeader(http.StatusOK)
				fmt.Fprint(w, `{"id":`)
				w.(http.Flusher).Flush()
				<-done
			})
			t.Cleanup(func() { close(done) })
			return Config{Targets: map[string]string{DefaultTarget: srv.URL}, Timeout: 200 * time.Millisecond}, t.Context()
		}, connector.Result{Outcome: connector.Sent, ProviderID: "h-9"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, ctx := tt.setup(t)
			cfg.Token = secretToken
			c := mustNew(t, cfg)
			got := c.Send(ctx, testRequest("eff-1"))
			if got != tt.want {
				t.Errorf("Send = %+v, want %+v", got, tt.want)
			}
			assertClean(t, fmt.Sprintf("%+v", got))
		})
	}
}

// TestNonIdempotentSendIsNeverReplayed breaks a kept-alive connection after the server
// has read the second request on it. net/http replays a POST carrying an Idempotency-Key
// when it can rewind the body; the connector must prevent that unless the provider is
// configured as idempotent. The idempotent case shows the harness really triggers it.
func TestNonIdempotentSendIsNeverReplayed(t *testing.T) {
	tests := []struct {
		idempotent     bool
		want           connector.Result
		wantDeliveries int
		wantConns      int32
	}{
		{false, connector.Result{Outcome: connector.Ambiguous, Class: "connection_reset"}, 1, 1},
		{true, connector.Result{Outcome: connector.Sent, ProviderID: "p-eff-2"}, 2, 2},
	}
	type connKey struct{}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("idempotent=%v", tt.idempotent), func(t *testing.T) {
			var (
				mu         sync.Mutex
				deliveries = map[string]int{}
				conns      atomic.Int32
			)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				key := r.Header.Get("Idempotency-Key")
				mu.Lock()
				deliveries[key]++
				mu.Unlock()
				if r.Context().Value(connKey{}).(*atomic.Int32).Add(1) == 2 {
					if conn := hijack(t, w, r); conn != nil {
						conn.Close() // the request was read: it may have been performed
					}
					return
				}
				fmt.Fprintf(w, `{"id":"p-%s"}`, key)
			}))
			srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
				conns.Add(1)
				return context.WithValue(ctx, connKey{}, new(atomic.Int32))
			}
			srv.Start()
			t.Cleanup(srv.Close)

			c := mustNew(t, Config{Targets: map[string]string{DefaultTarget: srv.URL}, Idempotent: tt.idempotent})
			if got := c.Send(t.Context(), testRequest("eff-1")); got.Outcome != connector.Sent {
				t.Fatalf("first Send = %+v", got)
			}
			if got := c.Send(t.Context(), testRequest("eff-2")); got != tt.want {
				t.Errorf("second Send = %+v, want %+v", got, tt.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if n := deliveries["eff-2"]; n != tt.wantDeliveries {
				t.Errorf("eff-2 delivered %d times, want %d", n, tt.wantDeliveries)
			}
			if n := conns.Load(); n != tt.wantConns {
				t.Errorf("%d connections, want %d (the second send must reuse the first)", n, tt.wantConns)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"120", 2 * time.Minute},
		{" 5 ", 5 * time.Second},
		{"3600", time.Hour},
		{"3601", time.Hour},
		{"99999999999999999999", time.Hour}, // overflows int64
		{"-99999999999999999999", 0},
		{"9223372036854775807", time.Hour},
		{"-5", 0},
		{"1.5", 0},
		{"soon", 0},
		{date(90 * time.Second), 90 * time.Second},
		{date(3 * time.Hour), time.Hour},
		{date(-time.Minute), 0},
		{now.Add(30 * time.Second).Format(time.RFC850), 30 * time.Second},
	}
	for _, tt := range tests {
		if got := parseRetryAfter(tt.in, now); got != tt.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestRetryAfterHTTPDate(t *testing.T) {
	at := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	srv := server(t, status(http.StatusServiceUnavailable, at))
	c := mustNew(t, Config{Targets: map[string]string{DefaultTarget: srv.URL}})
	got := c.Send(t.Context(), testRequest("eff-1"))
	// The date has one-second resolution and some time passes before it is parsed.
	if got.Outcome != connector.Retryable || got.Class != "http_503" ||
		got.RetryAfter < 85*time.Second || got.RetryAfter > 90*time.Second {
		t.Errorf("Send = %+v, want retryable http_503 after ~90s", got)
	}
}

func TestLookup(t *testing.T) {
	tests := []struct {
		name    string
		idField string
		code    int
		body    string
		want    []string
		wantErr string
	}{
		{name: "array", body: `[{"id":"a"},{"id":"b"}]`, want: []string{"a", "b"}},
		{name: "results wrapper", body: `{"results":[{"id":"a","x":1}]}`, want: []string{"a"}},
		{name: "data wrapper numeric ids", body: `{"data":[{"id":7}]}`, want: []string{"7"}},
		{name: "custom id field", idField: "ref", body: `[{"id":"no","ref":"r-1"}]`, want: []string{"r-1"}},
		{name: "empty array", body: `[]`},
		{name: "empty results", body: `{"results":[]}`},
		{name: "404 is not proof of absence", code: http.StatusNotFound, body: secretBody, wantErr: "lookup: http_404"},
		{name: "500", code: http.StatusInternalServerError, body: secretBody, wantErr: "lookup: http_500"},
		{name: "403", code: http.StatusForbidden, body: secretBody, wantErr: "lookup: http_403"},
		{name: "302", code: http.StatusFound, wantErr: "lookup: http_302"},
		{name: "not JSON", body: secretBody, wantErr: "lookup: invalid_response"},
		{name: "object without results", body: `{"items":[]}`, wantErr: "lookup: invalid_response"},
		{name: "null results", body: `{"results":null}`, wantErr: "lookup: invalid_response"},
		{name: "null", body: `null`, wantErr: "lookup: invalid_response"},
		{name: "record without id", body: `[{"id":"a"},{"name":"` + secretBody + `"}]`, wantErr: "lookup: invalid_response"},
		{name: "record not an object", body: `["a"]`, wantErr: "lookup: invalid_response"},
		{name: "too large", body: `[` + strings.Repeat(`{"id":"a"},`, maxLookupBody/10) + `{"id":"a"}]`,
			wantErr: "lookup: response_too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := make(chan *http.Request, 1)
			srv := server(t, func(w http.ResponseWriter, r *http.Request) {
				select {
				case seen <- r:
				default:
					t.Error("more than one request")
				}
				if tt.code == http.StatusFound {
					http.Redirect(w, r, "/elsewhere", tt.code)
					return
				}
				if tt.code != 0 {
					w.WriteHeader(tt.code)
				}
				fmt.Fprint(w, tt.body)
			})
			c := mustNew(t, Config{
				Targets:   map[string]string{DefaultTarget: srv.URL},
				LookupURL: srv.URL + "/search?key=" + Placeholder, IDField: tt.idField, Token: secretToken,
			})
			ids, err := c.Lookup(t.Context(), testRequest("eff 1&x=y"))
			r := <-seen
			if key, auth := r.URL.Query().Get("key"), r.Header.Get("Authorization"); r.Method != http.MethodGet ||
				key != "eff 1&x=y" || auth != "Bearer "+secretToken {
				t.Errorf("request: %s key %q auth %q", r.Method, key, auth)
			}
			if tt.wantErr != "" {
				var le *LookupError
				if err == nil || err.Error() != tt.wantErr || !errors.As(err, &le) {
					t.Fatalf("Lookup = %v, %v; want error %q", ids, err, tt.wantErr)
				}
				assertClean(t, err.Error(), srv.URL)
				return
			}
			if err != nil || fmt.Sprint(ids) != fmt.Sprint(tt.want) {
				t.Errorf("Lookup = %q, %v; want %q", ids, err, tt.want)
			}
		})
	}
}

func TestLookupFailures(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		req     connector.Request
		wantErr string
	}{
		{"not configured", Config{}, testRequest("eff-1"), "lookup: not_configured"},
		{"empty effect id", Config{LookupURL: "http://127.0.0.1:1/?k=" + Placeholder}, testRequest(""), "lookup: invalid_request"},
		{"connection refused", Config{LookupURL: "http://" + closedAddr(t) + "/?k=" + Placeholder},
			testRequest("eff-1"), "lookup: connection_refused"},
		{"dns", Config{LookupURL: secretHostURL + "?k=" + Placeholder, Client: &http.Client{Transport: &http.Transport{}}},
			testRequest("eff-1"), "lookup: dns"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Targets = map[string]string{DefaultTarget: "http://127.0.0.1:1/"}
			tt.cfg.Token = secretToken
			c := mustNew(t, tt.cfg)
			if c.HasLookup() != (tt.cfg.LookupURL != "") {
				t.Errorf("HasLookup = %v", c.HasLookup())
			}
			ids, err := c.Lookup(t.Context(), tt.req)
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Lookup = %v, %v; want error %q", ids, err, tt.wantErr)
			}
			assertClean(t, err.Error())
		})
	}
}

// TestNothingLeaks plants a token, a distinctive host name and response bodies and
// checks that no Result field and no Lookup error carries any of them.
func TestNothingLeaks(t *testing.T) {
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/garbage":
			if conn := hijack(t, w, r); conn != nil {
				fmt.Fprint(conn, "HTTP/1.1 "+secretBody+"\r\n\r\n")
				conn.Close()
			}
			return
		case "/redirect":
			w.Header().Set("Location", secretHostURL)
			w.WriteHeader(http.StatusFound)
		default:
			code := map[string]int{"/200": 200, "/400": 400, "/429": 429, "/500": 500, "/503": 503}[r.URL.Path]
			w.Header().Set("X-Provider-Id", "p-header") // the designated id: returned as is
			w.Header().Set("Retry-After", secretBody)
			w.WriteHeader(code)
		}
		fmt.Fprint(w, `{"error":"`+secretBody+`","id":{"x":"`+secretBody+`"}}`)
	})
	targets := map[string]string{
		"dns":     secretHostURL,
		"refused": "http://" + closedAddr(t) + "/",
	}
	for _, p := range []string{"200", "400", "429", "500", "503", "garbage", "redirect"} {
		targets[p] = srv.URL + "/" + p
	}
	c := mustNew(t, Config{
		Targets: targets, Token: secretToken,
		LookupURL: srv.URL + "/500?k=" + Placeholder,
		Client:    &http.Client{Transport: &http.Transport{}}, // no proxy: see the dns case above
	})
	for name := range targets {
		req := testRequest("eff-1")
		req.Target = name
		res := c.Send(t.Context(), req)
		if res.Outcome == 0 {
			t.Errorf("%s: no outcome", name)
		}
		assertClean(t, fmt.Sprintf("%s: %+v", name, res), srv.URL)
	}
	_, err := c.Lookup(t.Context(), testRequest("eff-1"))
	assertClean(t, fmt.Sprint(err), srv.URL)
	dnsLookup := mustNew(t, Config{Targets: targets, Token: secretToken, LookupURL: secretHostURL + "?k=" + Placeholder,
		Client: &http.Client{Transport: &http.Transport{}}})
	_, err = dnsLookup.Lookup(t.Context(), testRequest("eff-1"))
	assertClean(t, fmt.Sprint(err), srv.URL)
}

// assertClean fails if s holds the token, a host, a URL or response text.
func assertClean(t *testing.T, s string, urls ...string) {
	t.Helper()
	for _, bad := range append([]string{secretToken, secretHostName, secretBody, "127.0.0.1", "http://", "https://"}, urls...) {
		if strings.Contains(s, bad) {
			t.Errorf("%q leaks %q", s, bad)
		}
	}
}

func TestNew(t *testing.T) {
	ok := map[string]string{DefaultTarget: "https://api.example.com/v1/notes"}
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // substring; "" means valid
	}{
		{"minimal", Config{Targets: ok}, ""},
		{"full", Config{Targets: map[string]string{"a": "http://a.example/", "b": "https://b.example:8443/x?y=1"},
			Idempotent: true, Token: "t", TokenHeader: "X-Api-Key", Timeout: time.Second,
			LookupURL: "https://a.example/search?key=" + Placeholder, LookupAuthoritative: true, IDField: "ref"}, ""},
		{"no targets", Config{}, "targets"},
		{"relative URL", Config{Targets: map[string]string{"a": "/notes"}}, `target "a"`},
		{"ftp URL", Config{Targets: map[string]string{"a": "ftp://x.example/"}}, "http or https"},
		{"no host", Config{Targets: map[string]string{"a": "http:///x"}}, "no host"},
		{"unparsable URL", Config{Targets: map[string]string{"a": "http://x.example/%zz"}}, "invalid URL"},
		{"credentials in URL", Config{Targets: map[string]string{"a": "https://user:" + secretToken + "@x.example/"}}, "credentials"},
		{"lookup without placeholder", Config{Targets: ok, LookupURL: "https://x.example/search"}, "lookup_url"},
		{"lookup not http", Config{Targets: ok, LookupURL: "file:///" + Placeholder}, "lookup_url"},
		{"negative timeout", Config{Targets: ok, Timeout: -time.Second}, "timeout"},
		{"bad token header", Config{Targets: ok, Token: "t", TokenHeader: "X Api"}, "token_header"},
		{"token with newline", Config{Targets: ok, Token: secretToken + "\n"}, "token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if c.Idempotent() != tt.cfg.Idempotent || c.Authoritative() != tt.cfg.LookupAuthoritative ||
					c.HasLookup() != (tt.cfg.LookupURL != "") {
					t.Errorf("accessors disagree with config")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New error = %v, want one mentioning %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), secretToken) || strings.Contains(err.Error(), "example") {
				t.Errorf("New error %q echoes the URL or token", err)
			}
		})
	}
}

func TestClientRedirectPolicyNotMutated(t *testing.T) {
	client := &http.Client{}
	mustNew(t, Config{Targets: map[string]string{DefaultTarget: "http://x.example/"}, Client: client})
	if client.CheckRedirect != nil {
		t.Error("New changed the caller's client")
	}
}

// member finds in place what json.Unmarshal into a map finds: the same bytes, or none.
func FuzzMemberIsTheMapsValue(f *testing.F) {
	for _, body := range []string{
		`{"id":"x"}`, `{"id":42}`, ` { "id" : "a b" , "n" : 1 } `, `{"a":{"id":"inner"},"id":"outer"}`,
		`{"id":"first","id":"last"}`, `{"x":[1,{"id":2},"]"],"id":-1.5e3}`, `{"x":"q\"}\\","id":"y"}`,
		`{"i\u0064":"escaped key"}`, `{"id":null}`, `{"id":true,"z":false}`, `{}`, `[]`, `[{"id":"x"}]`,
		`"id"`, `null`, `12`, ``, `{"id":`, `{"id":"x"} trailing`, "{\"\xffid\":\"bad key\"}",
		"{\"id\":\"\xff\"}", `{"é":"x","id":"ok"}`, "{\"id\"\t:\n\"x\"\r}", `{"":"empty","id":""}`,
		`{"a":[[[]]],"id":{"deep":[{"id":"no"}]}}`,
	} {
		f.Add([]byte(body), "id")
	}
	f.Add([]byte(`{"data":{"id":"x"},"data2":1}`), "data")
	f.Add([]byte(`{"\ufffd":"replaced"}`), "\ufffd")
	f.Add([]byte("{\"\xff\":\"replaced\"}"), "\ufffd")
	f.Fuzz(func(t *testing.T, body []byte, name string) {
		got, want := member(body, name), memberSlow(body, name)
		if string(got) != string(want) || (got == nil) != (want == nil) {
			t.Fatalf("member(%q, %q) = %q, json.Unmarshal into a map gives %q", body, name, got, want)
		}
	})
}

// An idempotent provider answers 409 while a request with the same key is in progress:
// retried (after its Retry-After), never a refusal.
func TestInProgressIsRetryableForIdempotentTypes(t *testing.T) {
	srv := server(t, status(http.StatusConflict, "7"))
	c := mustNew(t, Config{Targets: map[string]string{DefaultTarget: srv.URL}, Idempotent: true})
	got := c.Send(context.Background(), testRequest("e-409"))
	want := connector.Result{Outcome: connector.Retryable, Class: "http_409", RetryAfter: 7 * time.Second}
	if got != want {
		t.Fatalf("Send = %+v, want %+v", got, want)
	}
}
