package httpapi

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// claimSeeds are bodies a client sends (the first acceptedSeeds) and bodies decode
// refuses or the fast path leaves to it, for both claim tests.
var claimSeeds = []string{
	`{"key":"k","payload":{"a":1}}`,
	` {"key" : "order-1" , "payload" : {"id":1,"lines":[{"sku":"a","qty":2.5e1},null,true,false,"x\n\"y\"\u00e9\ud83d\ude00"]}} ` + "\n",
	`{"key":"k","payload_hash":"abc","trigger_source":"n8n","workflow_version":"v2","lease_seconds":30}`,
	`{"key":"k","payload":[],"meta":{"workflow_version":"1","trigger_source":"t","model":{"provider":"p","name":"n","revision":"r"},"provider_category":"c","requested_by":"ana@example.com","source_url":"https://example.com/x?a=1&b=<2>"}}`,
	`{"key":"k","payload":{},"meta":{},"lease_seconds":-0}`,
	`{"key":"k","payload":"héllo wörld"}`,
	`{"key":"k","payload":{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"a ":11}}`,
	`{"key":"k","payload":{"a":{"x":1},"b":{"x":2}}}`,
	`{"key":"k","payload":null}`,
	`{"key":"k","payload":-0.5E-3}`, `{}`,
	`{"key":"k","payload":` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `}`,
	// Refused, or left to decode:
	`{"key":"k","payload":{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"c":11}}`,
	`{"key":"k","key":"k"}`, `{"KEY":"k"}`, `{"Key":"k","payload":1}`, `{"key":"k","extra":1}`,
	`{"key":"k","payload":{"a":1,"a":2}}`, `{"key":"k","payload":{"a":1,"\u0061":2}}`,
	`{"key":"k","payload":"\u0000"}`, `{"key":"k","payload":"\ud800"}`, `{"key":"k","payload":"\udc00\ud800"}`,
	`{"key":"k\u0041","payload":1}`, `{"key":"k\n","payload":1}`, `{"key":1}`, `{"key":null}`,
	`{"key":"k","lease_seconds":1.5}`, `{"key":"k","lease_seconds":1e3}`, `{"key":"k","lease_seconds":"5"}`,
	`{"key":"k","lease_seconds":99999999999999999999}`, `{"key":"k","lease_seconds":null}`, `{"key":"k","lease_seconds":012}`,
	`{"key":"k","meta":null}`, `{"key":"k","meta":{"model":null}}`, `{"key":"k","meta":{"Model":{}}}`,
	`{"key":"k","meta":{"requested_by":"a","requested_by":"b"}}`, `{"key":"k","meta":[]}`, `{"key":"k","meta":{"model":{"name":1}}}`,
	`{"key":"k","payload":1} {}`, `{"key":"k","payload":1}x`, `{"key":"k","payload":01}`, `{"key":"k","payload":1.}`,
	`{"key":"k","payload":tru}`, `{"key":"k","payload":[1,]}`, `{"key":"k","payload":{"a":1,}}`, `{"key":"k",}`,
	`{"key":"k","payload":"\x"}`, `{"key":"k","payload":"\u12"}`, "{\"key\":\"k\",\"payload\":\"a\x01\"}",
	"{\"key\":\"k\xff\"}", "\ufeff{\"key\":\"k\"}", ``, ` `, `null`, `[]`, `"k"`, `{`, `{"key":"k"`,
	`{"key":"k","payload":` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`,
	`{"key":"k","payload":` + strings.Repeat(`{"a":`, maxDepth) + `1` + strings.Repeat("}", maxDepth) + `}`,
}

const acceptedSeeds = 12

// decodeBoth decodes body with the fast path and with decode's strict path.
func decodeBoth(body []byte) (fast claimRequest, fastOK bool, slow claimRequest, slowErr error) {
	fastOK = fastClaim(body, &fast)
	req := httptest.NewRequest("POST", "/v1/runs/claim", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	slowErr = decode(req, &slow)
	return fast, fastOK, slow, slowErr
}

// FuzzClaimDecode: the claim's fast path accepts only what decode accepts, as the same
// value; everything else it leaves to decode. `go test` runs the seeds.
func FuzzClaimDecode(f *testing.F) {
	for _, s := range claimSeeds {
		f.Add([]byte(s))
	}
	// testdata/fuzz/FuzzClaimDecode holds the hostile bodies (see TestWriteFuzzSeeds).
	// Claim-shaped hostile bodies, which the fast path reads to their end.
	f.Add([]byte(`{"key":"k","payload":"` + strings.Repeat("a", 1_000_000) + `"}`))
	f.Add([]byte(`{"key":"k","payload":[-0,1e-400,-1e-400,1e999999999],"meta":{"requested_by":"an` + "\u200b" + `a"}}`))
	f.Add([]byte(`{"key":"k","payload":` + strings.Repeat("9", 100_000) + `}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		fast, ok, slow, err := decodeBoth(body)
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("the fast path accepted %q, which decode refuses: %v", body, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: the fast path read %+v, decode %+v", body, fast, slow)
		}
	})
}

// The fast path is taken for what clients send (else it would be dead code that only
// looks fast), and a body it does not take still gets decode's answer through the route.
func TestClaimDecodeFastPath(t *testing.T) {
	for _, s := range claimSeeds[:acceptedSeeds] {
		fast, ok, slow, err := decodeBoth([]byte(s))
		if !ok || err != nil {
			t.Fatalf("%q: fast path %v, decode %v; both should accept it", s, ok, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: the fast path read %+v, decode %+v", s, fast, slow)
		}
	}
	for _, s := range claimSeeds[acceptedSeeds:] {
		if _, ok, _, _ := decodeBoth([]byte(s)); ok {
			t.Errorf("%q: taken by the fast path; it should be left to decode", s)
		}
	}
	// Through decodeClaim, a refused body gets decode's code.
	for body, code := range map[string]string{
		`{"key":"k","key":"k"}`: "duplicate_field", `{"KEY":"k"}`: "unknown_field", `{"key":"k","payload":"\u0000"}`: "nul_character",
		`{"key":"k","lease_seconds":1.5}`: "wrong_type", `{"key":"k"} {}`: "malformed_json", "{\"key\":\"\xff\"}": "invalid_utf8",
	} {
		req := httptest.NewRequest("POST", "/v1/runs/claim", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		var v claimRequest
		ae, ok := decodeClaim(req, &v).(*Error)
		if !ok || ae.Code != code {
			t.Errorf("%q: %v; want %s", body, ae, code)
		}
	}
}

// The claim's answer is the bytes json.Marshal writes, whatever the values; values the
// hand encoder does not spell are left to json.Marshal.
func TestClaimResponseEncoding(t *testing.T) {
	at := time.Date(2026, 12, 1, 18, 0, 0, 123456789, time.UTC)
	zoned := at.In(time.FixedZone("x", 5*3600+1800))
	far := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	rnd := rand.New(rand.NewPCG(1, 2))
	plain, other := []rune("aZ09._:@+=~- /"), []rune("\"\\<>&\u2028é\x7f\x01\n")
	word := func() string { // mostly plain, sometimes a character json.Marshal escapes
		var sb strings.Builder
		for range rnd.IntN(6) {
			if rnd.IntN(20) == 0 {
				sb.WriteRune(other[rnd.IntN(len(other))])
			} else {
				sb.WriteRune(plain[rnd.IntN(len(plain))])
			}
		}
		return sb.String()
	}
	cases := []claimResponse{
		{Claimed: true, Key: "k", State: store.StateProcessing, Version: 1, PayloadHash: "ab", LeaseOwner: "o", LeaseExpiresAt: &at},
		{Claimed: true, Reclaimed: true, Key: "k", State: store.StateProcessing, Version: 9, PayloadHash: "ab", LeaseOwner: "o", LeaseExpiresAt: &zoned},
		{Key: "k", State: store.StateCompleted, Version: -3, PayloadHash: "ab", Result: json.RawMessage(`{"a": 1}`)},
		{Key: "k", State: store.StateProcessing, LeaseExpiresAt: &far},
		{},
	}
	for range 500 {
		cases = append(cases, claimResponse{Claimed: rnd.IntN(2) == 0, Reclaimed: rnd.IntN(2) == 0, Key: word(),
			State: store.State(word()), Version: rnd.Int64() - rnd.Int64(), PayloadHash: word(), LeaseOwner: word()})
	}
	hand := 0
	for _, c := range cases {
		want, wantErr := json.Marshal(c)
		got, ok := appendClaimResponse(nil, &c)
		if !ok {
			continue
		}
		hand++
		if wantErr != nil || !bytes.Equal(got, want) {
			t.Fatalf("%+v:\n hand      %s\n json.Marshal %s (%v)", c, got, want, wantErr)
		}
	}
	if hand < 50 {
		t.Fatalf("the hand encoder wrote only %d of %d answers", hand, len(cases))
	}
	// Left to json.Marshal: a result, a string to escape, a time past year 9999.
	for _, c := range []claimResponse{cases[2], cases[3], {Key: "<"}, {LeaseOwner: "é"}} {
		if _, ok := appendClaimResponse(nil, &c); ok {
			t.Errorf("%+v: written by hand; json.Marshal should write it", c)
		}
	}
	rec := httptest.NewRecorder()
	writeClaimJSON(rec, 201, &cases[0])
	want, _ := json.Marshal(cases[0])
	if got := rec.Body.String(); got != string(want)+"\n" || rec.Code != 201 || rec.Header().Get("Content-Type") != "application/json" ||
		rec.Header().Get("Cache-Control") != "no-store" || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("writeClaimJSON: %d %v %q", rec.Code, rec.Header(), got)
	}
}
