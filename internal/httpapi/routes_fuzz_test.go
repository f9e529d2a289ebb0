package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/airlocktest"
	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/input"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// lastLog keeps only whether a request logged a failure: a fuzz run sends millions of
// requests, and the harness's buffer would keep every line.
type lastLog struct {
	mu     sync.Mutex
	failed string
}

func (l *lastLog) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"msg":"panic serving request"`)) || bytes.Contains(p, []byte(`"msg":"request failed"`)) {
		l.mu.Lock()
		l.failed = string(p)
		l.mu.Unlock()
	}
	return len(p), nil
}

func (l *lastLog) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.failed
	l.failed = ""
	return s
}

// routeByName finds a route by "METHOD /pattern"; any other name picks one by its hash,
// so every input reaches some route.
func routeByName(name string) httpapi.Route {
	for _, rt := range httpapi.Routes {
		if rt.Method+" "+rt.Pattern == name {
			return rt
		}
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return httpapi.Routes[int(h.Sum32()%uint32(len(httpapi.Routes)))]
}

var wildcard = regexp.MustCompile(`\{[a-z_]+\}`)

// routeSeeds are valid bodies, so the fuzzer starts from requests that get past the
// decoder; %[1]s is a live lease owner, %[2]d its version.
var routeSeeds = map[string]string{
	"POST /v1/runs/claim":                                      `{"key":"fz-2","payload":{"ticket":1},"trigger_source":"t","meta":{"requested_by":"ana"}}`,
	"POST /v1/runs/{key}/heartbeat":                            `{"lease_owner":"%[1]s","version":%[2]d,"lease_seconds":30}`,
	"POST /v1/runs/{key}/transition":                           `{"lease_owner":"%[1]s","version":%[2]d,"to":"completed","result":{"ok":true}}`,
	"POST /v1/runs/{key}/validate":                             `{"lease_owner":"%[1]s","version":%[2]d,"action_type":"reply","output":"{\"label\":\"x\"}"}`,
	"POST /v1/runs/{key}/failures":                             `{"lease_owner":"%[1]s","version":%[2]d,"class":"timeout","detail":"d"}`,
	"POST /v1/runs/{key}/usage":                                `{"lease_owner":"%[1]s","version":%[2]d,"model_calls":1,"tokens":10}`,
	"POST /v1/runs/{key}/replace":                              `{"new_key":"fz-9","reason":"r"}`,
	"POST /v1/runs/{key}/unpark":                               `{"to":"processing","reason":"r"}`,
	"PUT /v1/runs/{key}/ledger":                                `{"lease_owner":"%[1]s","ledger":{"goal":"g"}}`,
	"POST /v1/runs/{key}/ledger/effects/{effect_id}/plan":      `{"lease_owner":"%[1]s","action":"note","target":"default","input_hash":"sha256:00"}`,
	"POST /v1/runs/{key}/ledger/effects/{effect_id}/confirm":   `{"lease_owner":"%[1]s","receipt":"r","result":{"a":1}}`,
	"POST /v1/runs/{key}/ledger/effects/{effect_id}/reconcile": `{"lease_owner":"%[1]s","found":["p-1"]}`,
	"POST /v1/runs/{key}/ledger/calls":                         `{"tool":"t","decision":"read"}`,
	"POST /v1/runs/{key}/effects":                              `{"lease_owner":"%[1]s","version":%[2]d,"action_type":"note","target":"default","payload":{"t":"x"}}`,
	"POST /v1/runs/{key}/evidence":                             `{"name":"score","value":0.9}`,
	"POST /v1/effects/{id}/cancel":                             `{"reason":"r","lease_owner":"%[1]s"}`,
	"POST /v1/effects/claim":                                   `{"types":["task"],"lease_seconds":30}`,
	"POST /v1/effects/{id}/complete":                           `{"lease_owner":"%[1]s","provider_id":"p-1"}`,
	"POST /v1/effects/{id}/fail":                               `{"lease_owner":"%[1]s","retryable":true,"class":"c","retry_after_ms":10}`,
	"POST /v1/effects/{id}/unknown":                            `{"lease_owner":"%[1]s","class":"timeout"}`,
	"POST /v1/effects/{id}/resolve":                            `{"outcome":"sent","provider_id":"p-1","note":"checked"}`,
	"POST /v1/approvals/{id}/reissue":                          `{}`,
	"POST /v1/reviews/{id}":                                    `{"decision":"confirm","note":"n"}`,
	"PUT /v1/admin/kill-switch":                                `{"enabled":true,"reason":"r","scope":"global"}`,
}

// FuzzRoutes drives the real API handler, every route of the routes table, with fuzzed
// path values, queries and bodies, under each kind of key. Whatever comes in: no 5xx
// (except /readyz's deliberate 503), no panic, and every error is JSON with a code the
// OpenAPI document lists. `go test` runs the seed corpus: testdata/fuzz/FuzzRoutes holds
// the hostile bodies (airlocktest.HostileBodies) for every body-taking route.
func FuzzRoutes(f *testing.F) {
	h := newHarness(f, storetest.Backends[0])
	logs := &lastLog{}
	handler := h.handler(func(d *httpapi.Deps) {
		d.MaxBodyBytes = 1 << 20 // the server's default, so the 1 MB seeds are read
		d.Log = slog.New(slog.NewJSONHandler(logs, nil))
	})
	_, evaluator, err := apikeys.Create(context.Background(), h.env.Store, "fz-eval", []string{apikeys.ScopeEvaluator}, h.env.Clock.Now())
	if err != nil {
		f.Fatal(err)
	}
	keys := []string{"", h.readKey, h.runsKey, h.adminKy, h.workerKey, h.operatorKey, evaluator, "alk_nope"}
	owner, version := h.claim("fz-1")
	for _, rt := range httpapi.Routes {
		name := rt.Method + " " + rt.Pattern
		body := fmt.Sprintf(routeSeeds[name], owner, version)
		f.Add(name, uint8(3), "fz-1", "", []byte(body))
		f.Add(name, uint8(2|8), "fz-1", "after=-1_%00&key=%00", []byte(body))
	}
	// The listing parameters that answered 500 on PostgreSQL (issue 33 item 4).
	for _, q := range []string{"key_prefix=%00", "action_type=a%ffb", "after=%c0%80", "state=%1b", "key_prefix=%zz", "a;b=c", "%00=1"} {
		f.Add("GET /v1/runs", uint8(1), "", q, []byte(nil))
		f.Add("GET /v1/approvals", uint8(1), "", q, []byte(nil))
	}
	known := map[string]bool{}
	var doc struct {
		Components struct {
			Schemas struct {
				Error struct {
					Properties struct {
						Error struct {
							Enum []string `json:"enum"`
						} `json:"error"`
					} `json:"properties"`
				} `json:"Error"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPIDoc(), &doc); err != nil {
		f.Fatal(err)
	}
	for _, c := range doc.Components.Schemas.Error.Properties.Error.Enum {
		known[c] = true
	}

	// flags: bits 0–2 pick the key, bit 3 sends an Idempotency-Key, bit 4 a wrong
	// content type.
	f.Fuzz(func(t *testing.T, route string, flags uint8, arg, query string, body []byte) {
		rt := routeByName(route)
		path := wildcard.ReplaceAllLiteralString(rt.Pattern, url.PathEscape(arg))
		req, err := http.NewRequest(rt.Method, "http://airlock.test"+path, bytes.NewReader(body))
		if err != nil {
			return
		}
		req.URL.RawQuery = query
		if k := keys[int(flags&7)%len(keys)]; k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
		if flags&8 != 0 {
			req.Header.Set("Idempotency-Key", "fz-"+arg)
		}
		ct := "application/json"
		if flags&16 != 0 {
			ct = "text/plain"
		}
		req.Header.Set("Content-Type", ct)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		res := rec.Result()
		if failed := logs.take(); failed != "" {
			t.Fatalf("%s %s: the server logged a failure: %.600s", rt.Method, path, failed)
		}
		if res.StatusCode >= 500 && !(rt.Pattern == "/readyz" && res.StatusCode == http.StatusServiceUnavailable) {
			t.Fatalf("%s %s: %d %.300s", rt.Method, path, res.StatusCode, rec.Body.String())
		}
		// One text rule before any handler: a query that does not parse or holds a NUL,
		// invalid UTF-8 or a control character is 400 invalid_field on every route (unless
		// the mux redirected an unclean path first).
		if _, err := input.Params(query, false); err != nil && (res.StatusCode < 300 || res.StatusCode >= 400 || res.StatusCode == http.StatusNotModified) {
			var e struct {
				Error string `json:"error"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &e)
			if res.StatusCode != http.StatusBadRequest || e.Error != "invalid_field" {
				t.Fatalf("%s %s?%s: %d %.300s; want 400 invalid_field", rt.Method, path, query, res.StatusCode, rec.Body.String())
			}
		}
		if res.StatusCode < 400 {
			if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") && !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s %s: %d with a body that is not JSON", rt.Method, path, res.StatusCode)
			}
			return
		}
		var e struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || !known[e.Error] {
			t.Fatalf("%s %s: %d %.300s: not a documented error", rt.Method, path, res.StatusCode, rec.Body.String())
		}
	})
}

// TestWriteFuzzSeeds writes the hostile bodies into the fuzz targets' seed corpora
// (testdata/fuzz/…): AIRLOCK_WRITE_FUZZ_SEEDS=1 go test -run TestWriteFuzzSeeds
// ./internal/httpapi/ after changing airlocktest.HostileBodies.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("AIRLOCK_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set AIRLOCK_WRITE_FUZZ_SEEDS=1 to rewrite the seed corpora")
	}
	name := func(s string) string {
		return strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(s), "-"), "-")
	}
	write := func(dir, file string, values ...string) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		content := "go test fuzz v1\n" + strings.Join(values, "\n") + "\n"
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, hb := range airlocktest.HostileBodies() {
		write("testdata/fuzz/FuzzDecode", name(hb.Name), fmt.Sprintf("[]byte(%q)", hb.Body))
		write("testdata/fuzz/FuzzClaimDecode", name(hb.Name), fmt.Sprintf("[]byte(%q)", hb.Body))
		for _, rt := range httpapi.Routes {
			// Every body-taking route gets the small ones; the large ones (the sizes that took
			// a server down) go to the route of the report and to claim, to keep the corpus
			// small. The process test sends all of them to every route.
			big := len(hb.Body) > 64<<10 && rt.Pattern != "/v1/effects/{id}/cancel" && rt.Pattern != "/v1/runs/claim"
			if rt.Method == "GET" || big {
				continue
			}
			write("testdata/fuzz/FuzzRoutes", name(hb.Name)+"-"+name(rt.Method+" "+rt.Pattern),
				fmt.Sprintf("string(%q)", rt.Method+" "+rt.Pattern), "byte('\\x03')", `string("fz-1")`, `string("")`, fmt.Sprintf("[]byte(%q)", hb.Body))
		}
	}
	// Hostile path values and queries, on the routes that read them.
	for i, arg := range []string{"\x00", "a\xffb", "\u202eexe.", "..", strings.Repeat("k", 5000), "a/b"} {
		for _, rt := range []string{"GET /v1/runs/{key}", "GET /v1/runs/{key}/events", "POST /v1/effects/{id}/resolve", "GET /v1/runs/{key}/resume"} {
			write("testdata/fuzz/FuzzRoutes", fmt.Sprintf("path-%d-%s", i, name(rt)),
				fmt.Sprintf("string(%q)", rt), "byte('\\x03')", fmt.Sprintf("string(%q)", arg), fmt.Sprintf("string(%q)", "after="+url.QueryEscape(arg)+"&limit=99999999999999999999"), `[]byte("{}")`)
		}
	}
}
