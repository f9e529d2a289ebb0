package store

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Each event airlock writes with an audit key configured carries a MAC (issue 33): an
// HMAC-SHA256, computed here in Go with a key the database never sees, so a row inserted
// or rewritten with SQL alone fails `airlock audit verify`. The MAC covers the event's
// content as airlock wrote it — a fresh random nonce, run key, kind, version, actor, meta
// and detail (JSON in a canonical form, so PostgreSQL's jsonb text verifies too) — and
// not its id or its time, which the database assigns as the row is inserted (its clock
// on PostgreSQL): those, and the order, are covered by the hash chain and the signed
// checkpoints. The nonce makes every MAC distinct, so a copy of a genuine row is found
// as a repeat. events.mac_key holds the key's id beside the MAC, so keys can rotate.

// AuditKey is a secret key for event MACs and checkpoint signatures. Its String and
// Format never show the secret.
type AuditKey struct {
	id     string
	secret []byte
}

// ID is the key's public id: a hash of the secret, stored beside each MAC.
func (k *AuditKey) ID() string { return k.id }

func (k *AuditKey) String() string { return "audit key " + k.id }

// GoString keeps %#v from printing the secret.
func (k *AuditKey) GoString() string { return k.String() }

// Format keeps every verb (%v, %+v, %s, %x …) from printing the secret.
func (k *AuditKey) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(k.String())) }

const auditKeyPrefix = "airlock-audit-key-v1:"

// NewAuditKey makes a key from 32 random bytes.
func NewAuditKey() (*AuditKey, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("new audit key: %w", err)
	}
	return auditKeyFrom(secret), nil
}

func auditKeyFrom(secret []byte) *AuditKey {
	sum := sha256.Sum256(append([]byte("airlock audit key id\x00"), secret...))
	return &AuditKey{id: hex.EncodeToString(sum[:8]), secret: secret}
}

// Encode is the key file's content.
func (k *AuditKey) Encode() []byte {
	return []byte(auditKeyPrefix + base64.RawURLEncoding.EncodeToString(k.secret) + "\n")
}

// ErrAuditKey is a key file that cannot be read or is not an audit key; its messages
// name the file, never its content.
var ErrAuditKey = errors.New("not an audit key file")

// ReadAuditKey reads a key file written by `airlock audit keygen`.
func ReadAuditKey(path string) (*AuditKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read audit key %s: %w", path, errors.Unwrap(err))
	}
	s := strings.TrimSpace(string(b))
	if !strings.HasPrefix(s, auditKeyPrefix) {
		return nil, fmt.Errorf("%w: %s (create one with `airlock audit keygen --out FILE`)", ErrAuditKey, path)
	}
	secret, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(s, auditKeyPrefix))
	if err != nil || len(secret) != 32 {
		return nil, fmt.Errorf("%w: %s is damaged (its key is not 32 bytes of base64)", ErrAuditKey, path)
	}
	return auditKeyFrom(secret), nil
}

// Sum is HMAC-SHA256 of msg under the key, with a purpose that separates its uses.
func (k *AuditKey) Sum(purpose string, msg []byte) []byte {
	m := hmac.New(sha256.New, k.secret)
	m.Write([]byte(purpose))
	m.Write([]byte{0})
	m.Write(msg)
	return m.Sum(nil)
}

// Keyring is the keys verify knows, by id: the current one and those kept from before
// a rotation.
type Keyring map[string]*AuditKey

// NewKeyring holds the keys.
func NewKeyring(keys ...*AuditKey) Keyring {
	r := Keyring{}
	for _, k := range keys {
		r[k.id] = k
	}
	return r
}

// Seal returns the mac_key and mac columns of an event airlock is about to insert
// (both nil without a key).
func (k *AuditKey) Seal(p EventInsertParams) (keyID, mac *string, err error) {
	if k == nil {
		return nil, nil, nil
	}
	nonce := make([]byte, 12)
	if _, err := rand.Read(nonce); err != nil {
		return nil, nil, fmt.Errorf("event mac: %w", err)
	}
	n := hex.EncodeToString(nonce)
	tag, err := k.eventTag(n, p.RunKey, p.Kind, p.Version, p.Actor, rawText(p.Meta), rawText(p.Detail))
	if err != nil {
		return nil, nil, fmt.Errorf("event mac (%s of %q): %w", p.Kind, p.RunKey, err)
	}
	id, m := k.id, n+":"+tag
	return &id, &m, nil
}

func rawText(b json.RawMessage) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

// eventTag is the MAC proper, over each field as its byte length, ':' and its bytes ('-'
// for absent meta or detail), as ChainHash spells them.
func (k *AuditKey) eventTag(nonce, runKey, kind string, version int64, actor string, meta, detail *string) (string, error) {
	var b bytes.Buffer
	field := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	optional := func(s *string) error {
		if s == nil {
			b.WriteByte('-')
			return nil
		}
		c, err := CanonicalJSON([]byte(*s))
		if err != nil {
			return err
		}
		field(string(c))
		return nil
	}
	field(nonce)
	field(runKey)
	field(kind)
	field(strconv.FormatInt(version, 10))
	field(actor)
	if err := optional(meta); err != nil {
		return "", err
	}
	if err := optional(detail); err != nil {
		return "", err
	}
	return hex.EncodeToString(k.Sum("airlock event mac v1", b.Bytes())), nil
}

// MACCheck is what CheckMAC found for one stored event.
type MACCheck int

const (
	MACValid    MACCheck = iota
	MACAbsent            // written without a key
	MACUnknown           // signed with a key the keyring does not hold
	MACMismatch          // the content, the MAC or its key id was changed
)

// CheckMAC checks a stored event's MAC against the keyring.
func (r Keyring) CheckMAC(e ChainEvent) MACCheck {
	if e.MACKey == nil && e.MAC == nil {
		return MACAbsent
	}
	if e.MACKey == nil || e.MAC == nil {
		return MACMismatch
	}
	k, ok := r[*e.MACKey]
	if !ok {
		return MACUnknown
	}
	nonce, tag, ok := strings.Cut(*e.MAC, ":")
	if !ok {
		return MACMismatch
	}
	want, err := k.eventTag(nonce, e.RunKey, e.Kind, e.Version, e.Actor, e.Meta, e.Detail)
	if err != nil || !hmac.Equal([]byte(want), []byte(tag)) {
		return MACMismatch
	}
	return MACValid
}

// CanonicalJSON re-encodes a JSON document so that the bytes airlock wrote and
// PostgreSQL's jsonb text of them agree: object keys sorted bytewise (the last of a
// repeated key kept, as jsonb does), no insignificant space, strings escaped minimally,
// numbers as exact rationals (jsonb writes 1e2 as 100).
func CanonicalJSON(doc []byte) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	var b bytes.Buffer
	if err := canonical(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func canonical(b *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case json.Number:
		r, ok := new(big.Rat).SetString(string(v))
		if !ok {
			return fmt.Errorf("canonical json: number %q", string(v))
		}
		b.WriteString(r.RatString())
	case string:
		e := json.NewEncoder(b)
		e.SetEscapeHTML(false)
		if err := e.Encode(v); err != nil {
			return err
		}
		b.Truncate(b.Len() - 1) // Encode's newline
	case []any:
		b.WriteByte('[')
		for i, x := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := canonical(b, x); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := canonical(b, k); err != nil {
				return err
			}
			b.WriteByte(':')
			if err := canonical(b, v[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("canonical json: %T", v)
	}
	return nil
}

// baseTag is a retention base's MAC: run key, link, hash and time.
func (k *AuditKey) baseTag(b ChainBase) string {
	var buf bytes.Buffer
	for _, f := range []string{b.RunKey, strconv.FormatInt(b.Seq, 10), b.Hash, strconv.FormatInt(b.AtMicros, 10)} {
		buf.WriteString(strconv.Itoa(len(f)))
		buf.WriteByte(':')
		buf.WriteString(f)
	}
	return hex.EncodeToString(k.Sum("airlock chain base v1", buf.Bytes()))
}

// CheckBase checks a head's retention base MAC against the keyring.
func (r Keyring) CheckBase(h ChainHead) MACCheck {
	if h.BaseMACKey == nil && h.BaseMAC == nil {
		return MACAbsent
	}
	if h.BaseMACKey == nil || h.BaseMAC == nil || h.BaseAt == nil {
		return MACMismatch
	}
	k, ok := r[*h.BaseMACKey]
	if !ok {
		return MACUnknown
	}
	want := k.baseTag(ChainBase{RunKey: h.RunKey, Seq: h.BaseSeq, Hash: h.BaseHash, AtMicros: h.BaseAt.UnixMicro()})
	if !hmac.Equal([]byte(want), []byte(*h.BaseMAC)) {
		return MACMismatch
	}
	return MACValid
}
