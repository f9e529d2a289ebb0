package input

import (
	"slices"
	"strings"
	"unicode"

	"go.mau.fi/util/confusable"
	"golang.org/x/text/cases"
	"golang.org/x/text/secure/precis"
	"golang.org/x/text/unicode/norm"
)

// maxIdentity bounds an identity: an e-mail address fits.
const maxIdentity = 320

// Identity checks a name that stands for a person or a key (requested_by, an API key's
// name or the person it acts for, an SSO subject): one line, visible, at most 320
// characters, no blank but the plain space (U+0020), and valid under PRECIS's Nickname
// profile.
func Identity(s string) error {
	if err := Text(s, Rule{Max: maxIdentity, Visible: true}); err != nil {
		return err
	}
	if strings.TrimSpace(s) == "" {
		return nil // absent; callers that need one say so
	}
	for _, c := range s {
		if c != ' ' && Blank(c) {
			return &Error{Problem: Invisible, Rune: c}
		}
	}
	if _, err := precis.Nickname.String(s); err != nil {
		return &Error{Problem: NotIdentity}
	}
	return nil
}

// Blank reports a character that shows as empty space or nothing: Unicode's white space
// (the space, NBSP U+00A0, U+1680, U+2000–U+200A, U+3000 …), the braille blank U+2800,
// the musical null notehead U+1D159, the Hangul fillers, and every Hidden character.
// A name with one reads as the name without it.
func Blank(c rune) bool {
	switch c {
	case 0x2800, 0x1D159, 0x3164, 0xFFA0, 0x115F, 0x1160, 0x2062, 0x2063, 0x2064:
		return true
	}
	return unicode.IsSpace(c) || unicode.Is(unicode.White_Space, c) || Hidden(c)
}

// comparable is s as a person reads it, before any look-alike mapping: NFKC (fullwidth
// and compatibility forms), then decomposed with every combining mark dropped (an
// accent, a dot, an overlay on an ASCII letter does not make another name: "ána",
// "a\u0332na" and "ana" read alike) and every blank dropped (see Blank).
func comparable(s string) string {
	s = norm.NFD.String(norm.NFKC.String(s))
	return strings.Map(func(c rune) rune {
		if Blank(c) || unicode.In(c, unicode.Mn, unicode.Me) {
			return -1
		}
		return c
	}, s)
}

//go:generate go run gen_lookalikes.go

// skeleton is UTS #39's skeleton of s, with the look-alikes Unicode's confusables leave
// out mapped before and after it (lookalikes_table.go: small capitals, Coptic), and
// combining marks and blanks dropped again (some prototypes carry an overlay mark: ¢ is
// c̸).
func skeleton(s string) string {
	return comparable(extra(confusable.Skeleton(extra(comparable(s)))))
}

// extra maps s through lookalikes.
func extra(s string) string {
	if !strings.ContainsFunc(s, func(c rune) bool { _, ok := lookalikes[c]; return ok }) {
		return s
	}
	var b strings.Builder
	for _, c := range s {
		if m, ok := lookalikes[c]; ok {
			b.WriteString(m)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

var fold = cases.Fold()

// Skeletons are the forms under which two identities that a person could read as the
// same compare equal; two identities are one person when their Skeletons share a form
// (SameIdentity). The UTS #39 prototypes are case-sensitive (Greek capital Ν is N, small
// ν is v; capital I is l), so case folding first loses look-alikes. The forms:
//   - the skeleton, folded, and the skeleton again (ΑΝΑ → ANA → ana; ВОВ → BOB → bob;
//     carI → carl);
//   - folded first (CARI → cari: a name in capitals is the person in small letters);
//   - every non-Latin letter read as the Latin capital it looks like — an I-shaped
//     capital as I, not l — then folded (ΙΝΤΕRΝ → INTERN → intern).
//
// All start from NFKC with combining marks and blanks dropped. They are for comparing,
// never for showing.
func Skeletons(s string) []string {
	c := comparable(s)
	forms := []string{skeleton(fold.String(skeleton(c)))}
	for _, f := range []string{skeleton(fold.String(c)), skeleton(fold.String(latinCapitals(c)))} {
		if !slices.Contains(forms, f) {
			forms = append(forms, f)
		}
	}
	return forms
}

// latinCapitals replaces each letter outside ASCII that reads as one Latin capital (its
// skeleton is that capital, or l for a letter that is not small: Ι, І, ꓲ, Ⲓ) with it.
func latinCapitals(s string) string {
	return strings.Map(func(c rune) rune {
		if c < 0x80 || !unicode.IsLetter(c) {
			return c
		}
		k := []rune(skeleton(string(c)))
		switch {
		case len(k) != 1:
		case k[0] >= 'A' && k[0] <= 'Z':
			return k[0]
		case k[0] == 'l' && !unicode.IsLower(c):
			return 'I'
		}
		return c
	}, s)
}

// Skeleton is the first of Skeletons: the form an identity is filed under.
func Skeleton(s string) string { return Skeletons(s)[0] }

// SameIdentity reports whether a and b could be read as one name: a form of Skeletons
// in common. An empty name is nobody's.
func SameIdentity(a, b string) bool {
	sa, sb := Skeletons(a), Skeletons(b)
	if sa[0] == "" || sb[0] == "" {
		return false
	}
	return slices.ContainsFunc(sa, func(x string) bool { return slices.Contains(sb, x) })
}

// Exact is the form in which two identities are the same name as typed: NFKC, trimmed,
// case-folded. A declared identity that is SameIdentity with a known one but not Exact
// with it is a look-alike (confusable_identity).
func Exact(s string) string {
	return norm.NFKC.String(fold.String(strings.TrimSpace(norm.NFKC.String(s))))
}
