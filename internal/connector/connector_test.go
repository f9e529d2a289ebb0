package connector_test

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/connector"
)

// TestSafeProviderID: whatever a provider answers, the id kept is valid UTF-8, printable,
// at most MaxProviderIDLen bytes, and says how it was altered; a good id is kept as is.
func TestSafeProviderID(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	tests := []struct {
		name, id, note string
	}{
		{"plain", "p-123", ""},
		{"empty", "", ""},
		{"unicode", "消息-1", ""},
		{"exactly the cap", strings.Repeat("a", connector.MaxProviderIDLen), ""},
		{"NUL", "a\x00b", connector.NoteProviderIDEscaped},
		{"not UTF-8", "h-\xff\xfe", connector.NoteProviderIDEscaped},
		{"control", "a\nb\tc", connector.NoteProviderIDEscaped},
		{"bidi override", "abc\u202edef", connector.NoteProviderIDEscaped},
		{"too long", long, connector.NoteProviderIDTruncated},
		{"too long once escaped", strings.Repeat("\x00", 100), connector.NoteProviderIDTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, note := connector.SafeProviderID(tt.id)
			if note != tt.note {
				t.Fatalf("note %q, want %q (id %q)", note, tt.note, got)
			}
			if note == "" && got != tt.id {
				t.Fatalf("a good id changed: %q → %q", tt.id, got)
			}
			if !utf8.ValidString(got) || len(got) > connector.MaxProviderIDLen || strings.ContainsRune(got, 0) {
				t.Fatalf("unsafe result %q (%d bytes)", got, len(got))
			}
			if again, n := connector.SafeProviderID(got); again != got || n != "" {
				t.Fatalf("the safe form is not stable: %q → %q (%s)", got, again, n)
			}
			if note == connector.NoteProviderIDEscaped {
				if back, err := strconv.Unquote(got); err != nil || back != tt.id {
					t.Fatalf("escaped form %q does not unquote to the id: %q %v", got, back, err)
				}
			}
		})
	}
}
