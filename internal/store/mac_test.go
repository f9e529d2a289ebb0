package store_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
)

// TestAuditKeyNeverShown: the key's secret is in its file and nowhere else — not in any
// formatting of the key, not in the errors about a damaged file, not in a MAC.
func TestAuditKeyNeverShown(t *testing.T) {
	k, err := store.NewAuditKey()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "audit.key")
	if err := os.WriteFile(file, k.Encode(), 0o600); err != nil {
		t.Fatal(err)
	}
	encoded := strings.TrimSpace(strings.TrimPrefix(string(k.Encode()), "airlock-audit-key-v1:"))
	secret, err := base64.RawURLEncoding.DecodeString(encoded)
	if err != nil || len(secret) != 32 {
		t.Fatalf("key file: %v", err)
	}
	read, err := store.ReadAuditKey(file)
	if err != nil || read.ID() != k.ID() {
		t.Fatalf("read back: %v %v", read, err)
	}
	keyID, mac, err := k.Seal(store.EventInsertParams{RunKey: "r", Kind: "k", Actor: "a", Detail: []byte(`{"x": 1}`)})
	if err != nil {
		t.Fatal(err)
	}
	damaged := filepath.Join(t.TempDir(), "damaged.key")
	if err := os.WriteFile(damaged, []byte("airlock-audit-key-v1:"+encoded[:20]), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errDamaged := store.ReadAuditKey(damaged)
	plain := filepath.Join(t.TempDir(), "plain.key")
	if err := os.WriteFile(plain, []byte(encoded), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errPlain := store.ReadAuditKey(plain)
	if !errors.Is(errDamaged, store.ErrAuditKey) || !errors.Is(errPlain, store.ErrAuditKey) {
		t.Fatalf("damaged key files: %v / %v", errDamaged, errPlain)
	}
	shown := []string{fmt.Sprintf("%v %+v %#v %s %x %q", k, k, k, k, k, k), fmt.Sprint(*keyID, *mac),
		errDamaged.Error(), errPlain.Error(), fmt.Sprintf("%v", []*store.AuditKey{k}), fmt.Sprintf("%+v", store.NewKeyring(k))}
	for _, s := range shown {
		for _, leak := range []string{encoded, encoded[:20], encoded[20:], fmt.Sprintf("%x", secret), string(secret)} {
			if strings.Contains(s, leak) {
				t.Fatalf("the secret shows in %q", s)
			}
		}
	}
	if !strings.Contains(shown[0], "audit key "+k.ID()) {
		t.Fatalf("the key's id is not what it shows: %q", shown[0])
	}
}

// TestCanonicalJSON: the forms PostgreSQL's jsonb gives back for what airlock wrote
// (keys reordered, spaces dropped, numbers normalised, escapes resolved) are one.
func TestCanonicalJSON(t *testing.T) {
	for _, c := range []struct{ written, stored string }{
		{`{"b": 1, "a": [1.50, 1e2, -0.0]}`, `{"a": [1.50, 100, -0.0], "b": 1}`},
		{`{"s": "\u00fc<&>\"", "n": null, "t": true}`, `{"n": null, "s": "ü<&>\"", "t": true}`},
		{`{"a": 1, "a": 2}`, `{"a": 2}`},
	} {
		w, err1 := store.CanonicalJSON([]byte(c.written))
		s, err2 := store.CanonicalJSON([]byte(c.stored))
		if err1 != nil || err2 != nil || string(w) != string(s) {
			t.Fatalf("%s → %s, %s → %s (%v %v)", c.written, w, c.stored, s, err1, err2)
		}
	}
	a, _ := store.CanonicalJSON([]byte(`{"x": 1}`))
	b, _ := store.CanonicalJSON([]byte(`{"x": 2}`))
	if string(a) == string(b) {
		t.Fatal("different documents are one")
	}
}

// BenchmarkSeal is the Go side of an event's MAC: the canonical JSON and the HMAC.
func BenchmarkSeal(b *testing.B) {
	k, err := store.NewAuditKey()
	if err != nil {
		b.Fatal(err)
	}
	p := store.EventInsertParams{RunKey: "ticket-4711", Kind: "claimed", Version: 1, Actor: "apikey:n8n",
		Meta:   []byte(`{"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}`),
		Detail: []byte(`{"payload_hash":"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","lease_expires_at":"2026-12-02T04:51:22.123456Z"}`)}
	for b.Loop() {
		if _, _, err := k.Seal(p); err != nil {
			b.Fatal(err)
		}
	}
}
