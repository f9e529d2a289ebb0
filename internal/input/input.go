// Package input holds airlock's rules for text that a person or a client gives it: the
// free text of notes, reasons and provider ids, identities (who asked, who approves,
// an API key's name, an SSO subject) and targets. The API, the console's query
// parameters and forms, and the domain services all check text here, so each rule is
// written once and every store sees the same text.
//
// Text is refused, never repaired: a NUL (PostgreSQL cannot store it), invalid UTF-8,
// a control character, too many characters. Identities and targets must also be free
// of invisible and bidirectional format characters (a zero-width space, a soft hyphen,
// a right-to-left override): two names that look alike must not compare different,
// and a target must read on the approval card as it will be used. Identities must be
// valid under PRECIS (RFC 8265's Nickname profile, golang.org/x/text/secure/precis),
// and two identities are the same person when their Skeletons are equal.
package input

import (
	"fmt"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Problem names what is wrong with a text; each is stable (the API's codes and the
// pages' messages are chosen by it).
type Problem string

const (
	InvalidUTF8 Problem = "invalid_utf8"
	NUL         Problem = "nul_character"
	Control     Problem = "control_character"
	TooLong     Problem = "too_long"
	// Invisible: a format character (Unicode category Cf: bidirectional controls, zero-
	// width characters, the soft hyphen) or another default-ignorable code point.
	Invisible Problem = "invisible_character"
	// NotIdentity: an identity PRECIS refuses for another reason (unassigned code points,
	// noncharacters, a zero-width joiner outside its context).
	NotIdentity Problem = "invalid_identity"
)

// Error is a refused text.
type Error struct {
	Problem Problem
	Max     int  // TooLong: the cap, in characters
	Rune    rune // Control, Invisible: the first offending character
}

func (e *Error) Error() string {
	switch e.Problem {
	case InvalidUTF8:
		return "is not valid UTF-8"
	case NUL:
		return "holds a NUL character"
	case Control:
		return fmt.Sprintf("holds a control character (%U)", e.Rune)
	case TooLong:
		return fmt.Sprintf("is longer than %d characters", e.Max)
	case Invisible:
		return fmt.Sprintf("holds an invisible or bidirectional format character (%U); type the text without it", e.Rune)
	case NotIdentity:
		return "is not a usable name (PRECIS refuses it)"
	}
	return string(e.Problem)
}

// Rule is what a piece of text may hold.
type Rule struct {
	Max       int  // characters; 0 for no cap
	Multiline bool // tab, CR and LF allowed (a reason, a note)
	// Visible refuses invisible and bidirectional format characters (identities,
	// targets, ids): text that must read as it is compared and used.
	Visible bool
}

// Text checks s against r; nil when it passes.
func Text(s string, r Rule) error {
	if !utf8.ValidString(s) {
		return &Error{Problem: InvalidUTF8}
	}
	if r.Max > 0 && utf8.RuneCountInString(s) > r.Max {
		return &Error{Problem: TooLong, Max: r.Max}
	}
	for _, c := range s {
		switch {
		case c == 0:
			return &Error{Problem: NUL}
		case r.Multiline && (c == '\t' || c == '\n' || c == '\r'):
		case unicode.IsControl(c):
			return &Error{Problem: Control, Rune: c}
		case r.Visible && Hidden(c):
			return &Error{Problem: Invisible, Rune: c}
		}
	}
	return nil
}

// Hidden reports a character that does not show, or that changes how the text around
// it shows: Unicode's format characters (Cf: U+200B–U+200F, U+202A–U+202E,
// U+2060–U+2069, U+061C, U+00AD, U+FEFF …) and the other default-ignorable code points
// (variation selectors, the Hangul fillers, U+034F, U+115F …).
func Hidden(c rune) bool {
	return unicode.Is(unicode.Cf, c) || unicode.Is(unicode.Other_Default_Ignorable_Code_Point, c) ||
		unicode.Is(unicode.Variation_Selector, c) || c == 0x115F || c == 0x1160 || c == 0x3164 || c == 0xFFA0
}

// Shown is s for a page where a person decides on it: every hidden character (see
// Hidden) is written out as ⟨U+202E⟩, so a right-to-left override or a zero-width space
// stored before it was refused cannot make a target, a name or a draft read as another.
func Shown(s string) string {
	if !strings.ContainsFunc(s, Hidden) {
		return s
	}
	var b strings.Builder
	for _, c := range s {
		if Hidden(c) {
			fmt.Fprintf(&b, "⟨%U⟩", c)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// maxParam bounds a query parameter's name or value: none of airlock's is longer than a
// reason.
const maxParam = 2000

// Params checks a query string or a form body (application/x-www-form-urlencoded) as
// every route's text must be: it parses, and each name and value is valid UTF-8 without
// NUL or control characters, at most 2,000 characters (Multiline allows line breaks and
// tabs in values, for a posted reason). field names what was refused ("" for a query
// that does not parse); nil when everything passes.
func Params(raw string, multiline bool) (field string, err error) {
	q, perr := url.ParseQuery(raw)
	if perr != nil {
		return "", perr
	}
	for k, vs := range q {
		if err := Text(k, Rule{Max: maxParam}); err != nil {
			return "parameter name", err
		}
		for _, v := range vs {
			if err := Text(v, Rule{Max: maxParam, Multiline: multiline}); err != nil {
				return k, err
			}
		}
	}
	return "", nil
}
