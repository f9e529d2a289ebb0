package airlocktest

import "strings"

// Hostile is one request body no client should send, that every route must refuse
// with a 4xx, in bounded memory.
type Hostile struct {
	Name string
	Body []byte
}

// HostileBodies are the nastiest bodies airlock has been sent: deep nesting
// at the sizes that took a server down, NUL, invalid UTF-8 and lone surrogates, huge
// numbers, duplicate keys and a 1 MB string. The fuzz targets' seed corpora and the
// process test that sends them to a running `airlock serve` both use this list.
func HostileBodies() []Hostile {
	deep := func(n int, open string) []byte { return []byte(strings.Repeat(open, n)) }
	closed := func(n int) []byte { return []byte(strings.Repeat("[", n) + strings.Repeat("]", n)) }
	nested := func(n int) []byte {
		return []byte(`{"key":"k","payload":` + strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) + `}`)
	}
	return []Hostile{
		{"open arrays 60 KB", deep(60_000, "[")},
		{"open arrays 100 KB", deep(100_000, "[")},
		{"open arrays 1 MB", deep(1_000_000, "[")},
		{"closed arrays 100 KB", closed(50_000)},
		{"open objects 60 KB", deep(12_000, `{"a":`)},
		{"nested payload 100 KB", nested(16_000)},
		{"open arrays in a field", []byte(`{"key":"k","payload":` + strings.Repeat("[", 100_000))},
		{"raw NUL", []byte("{\"key\":\"k\x00\",\"payload\":1}")},
		{"escaped NUL", []byte(`{"key":"k","payload":{"a":"\u0000"}}`)},
		{"NUL in a key", []byte(`{"key":"k","payload":{"\u0000":1},"reason":"\u0000"}`)},
		{"invalid UTF-8", []byte("{\"key\":\"k\xff\",\"reason\":\"\xc0\xaf\"}")},
		{"lone surrogate", []byte(`{"key":"k","payload":"\ud800","reason":"\udfff"}`)},
		{"huge exponent", []byte(`{"key":"k","payload":1e999999999,"version":1e999999999,"lease_seconds":1e400}`)},
		{"100,000 digits", []byte(`{"key":"k","version":` + strings.Repeat("9", 100_000) + `,"payload":` + strings.Repeat("9", 100_000) + `}`)},
		{"negative zero and tiny", []byte(`{"key":"k","payload":[-0,1e-400,-1e-400],"version":-0}`)},
		{"duplicate keys", []byte(`{"key":"a","key":"b","payload":{"x":1,"x":2},"reason":"r","reason":"s"}`)},
		{"1 MB string", []byte(`{"key":"k","payload":"` + strings.Repeat("a", 1_000_000) + `","reason":"` + strings.Repeat("b", 40_000) + `"}`)},
		{"bidi and zero-width text", []byte(`{"key":"k","payload":1,"meta":{"requested_by":"an\u200ba"},"reason":"\u202egnp.exe","provider_id":"\u2066x"}`)},
		{"control characters", []byte("{\"key\":\"k\",\"reason\":\"a\\u0007b\",\"provider_id\":\"\\u001b[31m\",\"note\":\"\\r\"}")},
		{"not JSON", []byte("\xef\xbb\xbf{} trailing")},
	}
}
