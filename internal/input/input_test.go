package input

import (
	"errors"
	"strings"
	"testing"
)

func TestText(t *testing.T) {
	for _, c := range []struct {
		s    string
		r    Rule
		want Problem
	}{
		{"plain", Rule{Max: 10}, ""},
		{"Zoë 👨\u200d👩\u200d👧", Rule{Max: 20}, ""}, // a ZWJ emoji is fine in free text
		{"two\r\nlines\t", Rule{Multiline: true}, ""},
		{"two\nlines", Rule{}, Control},
		{"a\x00b", Rule{Multiline: true}, NUL},
		{"a\xffb", Rule{}, InvalidUTF8},
		{"\x1b[31m", Rule{}, Control},
		{"a\u0085b", Rule{}, Control}, // C1
		{strings.Repeat("é", 11), Rule{Max: 10}, TooLong},
		{strings.Repeat("é", 10), Rule{Max: 10}, ""}, // characters, not bytes
		{"an\u200ba", Rule{Visible: true}, Invisible},
		{"an\u00ada", Rule{Visible: true}, Invisible},
		{"\u202egnp.exe", Rule{Visible: true}, Invisible},
		{"x\u2066y\u2069", Rule{Visible: true}, Invisible},
		{"x\u200ey", Rule{Visible: true}, Invisible},
		{"x\u061cy", Rule{Visible: true}, Invisible},
		{"x\ufeff", Rule{Visible: true}, Invisible},
		{"x\ufe0f", Rule{Visible: true}, Invisible},
		{"\u202egnp.exe", Rule{}, ""}, // free text may hold format characters
	} {
		err := Text(c.s, c.r)
		var e *Error
		switch {
		case c.want == "" && err != nil:
			t.Errorf("Text(%q, %+v) = %v; want nil", c.s, c.r, err)
		case c.want != "" && (!errors.As(err, &e) || e.Problem != c.want):
			t.Errorf("Text(%q, %+v) = %v; want %s", c.s, c.r, err, c.want)
		}
	}
}

func TestShown(t *testing.T) {
	for in, want := range map[string]string{
		"slack":            "slack",
		"\u202ekcals":      "⟨U+202E⟩kcals",
		"an\u200ba\u00ad":  "an⟨U+200B⟩a⟨U+00AD⟩",
		"Zoë, line\nbreak": "Zoë, line\nbreak",
	} {
		if got := Shown(in); got != want {
			t.Errorf("Shown(%q) = %q, want %q", in, got, want)
		}
	}
}
