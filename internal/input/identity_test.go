package input

import (
	"strings"
	"testing"
)

func TestIdentityAndSkeleton(t *testing.T) {
	for _, ok := range []string{"ana", "Ana López", "ana@example.com", "apikey:n8n", "console:lead", "аna", ""} {
		if err := Identity(ok); err != nil {
			t.Errorf("Identity(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"an\u200ba", "an\u00ada", "ana\u202e", "ana\u200d", "ana\ufffe", "a\tb", strings.Repeat("a", 321),
		"an\u2800a", "ana\u2800", "an\U0001D159a", "an\u00a0a", "an\u1680a", "an\u3000a"} {
		if err := Identity(bad); err == nil {
			t.Errorf("Identity(%q) passed", bad)
		}
	}
	// Each look-alike of ana is ana; other people are not.
	for _, same := range []string{"ana", " ANA ", "ａｎａ", "\u0430na", "\u0430n\u0430", "an\u200ba", "an\u00ada", "Ana", "an a", "ΑΝΑ", "ꓮꓠꓮ", "ᎪnᎪ", "ᴀɴᴀ", "ⲀⲚⲀ", "ána"} {
		if !SameIdentity(same, "ana") {
			t.Errorf("Skeleton(%q) = %q, not ana's %q", same, Skeleton(same), Skeleton("ana"))
		}
	}
	// Blanks are dropped: "an a" reads too close to ana to tell two people apart by.
	for _, other := range []string{"anna", "ana2", "bob", "ava"} {
		if SameIdentity(other, "ana") {
			t.Errorf("Skeleton(%q) equals ana's", other)
		}
	}
	// A skeleton of a skeleton-ready form is stable: stored normalised names still match.
	if Skeleton(Skeleton("\u0410NA")) != Skeleton("ana") {
		t.Error("Skeleton is not idempotent")
	}
}
