package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/runs"
)

// The claim is the API's hottest route: its body is read and its answer written here in
// one pass over the bytes, without reflection. Neither is a second set of rules.
//
// decodeClaim's fast path accepts only the shapes clients send: the fields of
// claimRequest, each given once and spelled exactly, with strings free of escapes and
// control characters, lease_seconds a whole number, meta and meta.model objects, and any
// payload holding no NUL escape, no duplicate key (keys free of escapes) and no container
// deeper than maxDepth. Anything else — every body decode would refuse among them — goes
// to decode's strict path, which refuses it with its code or accepts it as it always did.
// So the fast path never answers what decode would not, and gives the same value
// (FuzzClaimDecode checks both against each other).

// decodeClaim is decode for claimRequest.
func decodeClaim(r *http.Request, req *claimRequest) error {
	raw, err := readJSON(r)
	if err != nil {
		return err
	}
	if fastClaim(raw, req) {
		return nil
	}
	*req = claimRequest{}
	return decodeRaw(raw, req)
}

// fastClaim decodes raw into req when it is a body of the shapes above; false leaves req
// partly set, for the caller to reset.
func fastClaim(raw []byte, req *claimRequest) bool {
	if !utf8.Valid(raw) || loneSurrogate(raw) {
		return false
	}
	s := scanner{b: raw}
	s.ws()
	ok := s.fields(claimFields, func(name string) bool {
		switch name {
		case "key":
			return s.plainString(&req.Key)
		case "payload":
			start := s.i
			if !s.value(2) {
				return false
			}
			req.Payload = json.RawMessage(raw[start:s.i:s.i])
			return true
		case "payload_hash":
			return s.plainString(&req.PayloadHash)
		case "trigger_source":
			return s.plainString(&req.TriggerSource)
		case "workflow_version":
			return s.plainString(&req.WorkflowVersion)
		case "lease_seconds":
			n, ok := s.integer()
			req.LeaseSeconds = &n
			return ok
		default: // meta
			req.Meta = &runs.Meta{}
			return s.meta(req.Meta)
		}
	})
	if !ok {
		return false
	}
	s.ws()
	return s.i == len(raw)
}

// scanner reads one JSON text from b at i; every method returns false (and stops) at
// anything the fast path leaves to decode.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// The members fastClaim reads, as claimRequest, runs.Meta and runs.Model spell them.
var (
	claimFields = []string{"key", "payload", "payload_hash", "trigger_source", "workflow_version", "lease_seconds", "meta"}
	metaFields  = []string{"workflow_version", "trigger_source", "model", "provider_category", "requested_by", "source_url"}
	modelFields = []string{"provider", "name", "revision"}
)

// fields reads an object whose members are among names (as spelled there), each at most
// once, calling read with the name at its value; an unknown or repeated member is
// decode's to answer.
func (s *scanner) fields(names []string, read func(name string) bool) bool {
	var seen uint64
	return s.object(func(key []byte) bool {
		for i, name := range names {
			if string(key) == name {
				if seen&(1<<i) != 0 {
					return false
				}
				seen |= 1 << i
				return read(name)
			}
		}
		return false
	})
}

// object reads an object whose keys hold no escape, calling member with each key, the
// scanner at the key's value (after the colon and any space); member reads the value.
func (s *scanner) object(member func(key []byte) bool) bool {
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return false
	}
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return true
	}
	for {
		key, ok := s.rawString()
		if !ok {
			return false
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		s.ws()
		if !member(key) {
			return false
		}
		s.ws()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.ws()
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

// rawString reads a string with no escape and no control character: its bytes, as they
// are (valid UTF-8: fastClaim checked the whole body).
func (s *scanner) rawString() ([]byte, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	start := s.i + 1
	for j := start; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			return s.b[start:j], true
		case c == '\\' || c < 0x20:
			return nil, false
		}
	}
	return nil, false
}

func (s *scanner) plainString(dst *string) bool {
	b, ok := s.rawString()
	*dst = string(b)
	return ok
}

// integer reads a number that is a whole int64, as encoding/json reads one into *int64.
func (s *scanner) integer() (int64, bool) {
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	digits := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	if s.i == digits || (s.b[digits] == '0' && s.i-digits > 1) {
		return 0, false
	}
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case '.', 'e', 'E': // a fraction or an exponent: decode's (wrong_type) to answer
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(s.b[start:s.i]), 10, 64)
	return n, err == nil
}

func (s *scanner) meta(m *runs.Meta) bool {
	return s.fields(metaFields, func(name string) bool {
		switch name {
		case "workflow_version":
			return s.plainString(&m.WorkflowVersion)
		case "trigger_source":
			return s.plainString(&m.TriggerSource)
		case "model":
			m.Model = &runs.Model{}
			return s.model(m.Model)
		case "provider_category":
			return s.plainString(&m.ProviderCategory)
		case "requested_by":
			return s.plainString(&m.RequestedBy)
		default: // source_url
			return s.plainString(&m.SourceURL)
		}
	})
}

func (s *scanner) model(m *runs.Model) bool {
	return s.fields(modelFields, func(name string) bool {
		switch name {
		case "provider":
			return s.plainString(&m.Provider)
		case "name":
			return s.plainString(&m.Name)
		default: // revision
			return s.plainString(&m.Revision)
		}
	})
}

// value reads any JSON value; level is the nesting level a container here would have
// (the body's own object is level 1).
func (s *scanner) value(level int) bool {
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		if level > maxDepth {
			return false
		}
		// Duplicate keys are refused at any depth: the first few keys are compared in
		// place, a bigger object's in a set.
		var few [8][]byte
		n := 0
		var many map[string]struct{}
		return s.object(func(key []byte) bool {
			if many != nil {
				if _, dup := many[string(key)]; dup {
					return false
				}
				many[string(key)] = struct{}{}
			} else {
				for _, k := range few[:n] {
					if string(k) == string(key) {
						return false
					}
				}
				if n < len(few) {
					few[n] = key
					n++
				} else {
					many = make(map[string]struct{}, 2*len(few))
					for _, k := range few {
						many[string(k)] = struct{}{}
					}
					many[string(key)] = struct{}{}
				}
			}
			return s.value(level + 1)
		})
	case c == '[':
		if level > maxDepth {
			return false
		}
		s.i++
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.i++
			return true
		}
		for {
			if !s.value(level + 1) {
				return false
			}
			s.ws()
			if s.i >= len(s.b) {
				return false
			}
			switch s.b[s.i] {
			case ',':
				s.i++
				s.ws()
			case ']':
				s.i++
				return true
			default:
				return false
			}
		}
	case c == '"':
		return s.anyString()
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return false
}

func (s *scanner) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

// anyString reads a string value, escapes included, but not \u0000 (a NUL: decode
// refuses it); lone surrogates were refused for the whole body first.
func (s *scanner) anyString() bool {
	for j := s.i + 1; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if j+1 >= len(s.b) {
				return false
			}
			switch s.b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j++
			case 'u':
				if j+6 > len(s.b) {
					return false
				}
				v, err := strconv.ParseUint(string(s.b[j+2:j+6]), 16, 16)
				if err != nil || v == 0 {
					return false
				}
				j += 5
			default:
				return false
			}
		}
	}
	return false
}

// number reads a number by JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() bool {
	digits := func() int {
		start := s.i
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
		return s.i - start
	}
	if s.b[s.i] == '-' {
		s.i++
	}
	if s.i < len(s.b) && s.b[s.i] == '0' {
		s.i++
	} else if digits() == 0 {
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}

// writeClaimJSON is writeJSON for the claim's answer: the same bytes json.Marshal
// writes, appended by hand when every string is plain printable ASCII that needs no
// escape (keys, hashes, owners and states are) and there is no result to compact; any
// other answer goes through writeJSON.
func writeClaimJSON(w http.ResponseWriter, status int, resp *claimResponse) {
	b, ok := appendClaimResponse(make([]byte, 0, 256), resp)
	if !ok {
		writeJSON(w, status, resp)
		return
	}
	writeJSONBytes(w, status, append(b, '\n'))
}

func appendClaimResponse(b []byte, r *claimResponse) ([]byte, bool) {
	if r.Result != nil {
		return nil, false
	}
	ok := true
	str := func(b []byte, s string) []byte {
		for i := 0; i < len(s); i++ {
			if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				ok = false
			}
		}
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	b = append(b, `{"claimed":`...)
	b = strconv.AppendBool(b, r.Claimed)
	if r.Reclaimed {
		b = append(b, `,"reclaimed":true`...)
	}
	b = append(b, `,"key":`...)
	b = str(b, r.Key)
	b = append(b, `,"state":`...)
	b = str(b, string(r.State))
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, r.Version, 10)
	b = append(b, `,"payload_hash":`...)
	b = str(b, r.PayloadHash)
	if r.LeaseOwner != "" {
		b = append(b, `,"lease_owner":`...)
		b = str(b, r.LeaseOwner)
	}
	if r.LeaseExpiresAt != nil {
		// Time.MarshalJSON is AppendText in quotes, refusing the same times.
		b = append(b, `,"lease_expires_at":"`...)
		var err error
		if b, err = r.LeaseExpiresAt.AppendText(b); err != nil {
			return nil, false
		}
		b = append(b, '"')
	}
	return append(b, '}'), ok
}
