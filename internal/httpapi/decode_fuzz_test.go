package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/validation"
)

// fuzzBody has a field of every kind the routes' bodies have.
type fuzzBody struct {
	Key      string            `json:"key"`
	Version  int64             `json:"version"`
	Enabled  *bool             `json:"enabled"`
	Types    []string          `json:"types"`
	Payload  json.RawMessage   `json:"payload"`
	Meta     *runs.Meta        `json:"meta"`
	Labels   map[string]int    `json:"labels"`
	Nested   []map[string]any  `json:"nested"`
	Any      any               `json:"any"`
	Strings  map[string]string `json:"strings"`
	Seconds  *int64            `json:"lease_seconds"`
	Embedded struct {
		Name string `json:"name"`
	} `json:"embedded"`
}

// knownCodes are the error codes openapi.json lists: the only ones a client may see.
var knownCodes = sync.OnceValue(func() map[string]bool {
	m := regexp.MustCompile(`"error":\s*\{[^}]*"enum":\s*\[([^\]]*)\]`).FindSubmatch(openAPI)
	out := map[string]bool{}
	for _, c := range regexp.MustCompile(`"([a-z_0-9]+)"`).FindAllSubmatch(m[1], -1) {
		out[string(c[1])] = true
	}
	return out
})

// FuzzDecode: whatever the body, decode never panics, refuses with a documented 4xx
// code, allocates in proportion to the body (never to the square of its depth), and
// what it accepts is JSON that is valid UTF-8, holds no NUL and nests at most maxDepth
// levels. `go test` runs the seed corpus (testdata/fuzz/FuzzDecode and the seeds
// below); see docs/testing.md to fuzz for longer.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"key":"k","version":1,"enabled":true,"types":["a"],"payload":{"a":[1,{"b":null}]},"meta":{"requested_by":"ana","model":{"name":"m"}},"labels":{"x":1},"nested":[{"a":1}],"any":[[]],"strings":{"a":"b"},"lease_seconds":5,"embedded":{"name":"n"}}`,
		`{"KEY":"k"}`, `{"meta":{"Requested_By":"x"}}`, `{"key":"a","key":"b"}`, `{"payload":"\u0000"}`,
		`{"payload":"\ud800"}`, `{"version":1e999}`, `{"version":"1"}`, `[]`, `null`, `{} {}`, `{"labels":{"a":"b"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest("POST", "/", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		var v fuzzBody
		err := decode(req, &v)
		runtime.ReadMemStats(&m1)
		// The body is read, scanned, walked and decoded: a small multiple of its size.
		if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > uint64(64*len(body))+4<<20 {
			t.Fatalf("decoding %d bytes allocated %d bytes", len(body), alloc)
		}
		if err != nil {
			var ae *Error
			if !errors.As(err, &ae) {
				t.Fatalf("not an API error: %v", err)
			}
			if !knownCodes()[ae.Code] || ae.Status < 400 || ae.Status >= 500 {
				t.Fatalf("%d %s is not a documented client error", ae.Status, ae.Code)
			}
			if !utf8.ValidString(ae.Message) {
				t.Fatalf("the message is not valid UTF-8: %q", ae.Message)
			}
			return
		}
		switch {
		case !utf8.Valid(body), !json.Valid(body):
			t.Fatal("accepted a body that is not valid UTF-8 JSON")
		case validation.Depth(body) > maxDepth:
			t.Fatalf("accepted a body %d levels deep", validation.Depth(body))
		case bytes.Contains(body, []byte(`\u0000`)) && !bytes.Contains(body, []byte(`\\u0000`)):
			t.Fatal("accepted a NUL character")
		}
		if _, err := json.Marshal(v); err != nil {
			t.Fatalf("accepted a value that does not encode again: %v", err)
		}
	})
}

// A body over the limit is refused with 413 whatever it holds.
func TestDecodeBodyLimit(t *testing.T) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/", strings.NewReader(strings.Repeat("[", 5000)))
	req.Header.Set("Content-Type", "application/json")
	req.Body = http.MaxBytesReader(rec, req.Body, 4096)
	var ae *Error
	if err := decode(req, &fuzzBody{}); !errors.As(err, &ae) || ae.Code != "body_too_large" {
		t.Fatalf("decode = %v; want body_too_large", err)
	}
}
