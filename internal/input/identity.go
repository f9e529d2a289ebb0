package input

import (
	"strings"

	"go.mau.fi/util/confusable"
	"golang.org/x/text/cases"
	"golang.org/x/text/secure/precis"
	"golang.org/x/text/unicode/norm"
)

// maxIdentity bounds an identity: an e-mail address fits.
const maxIdentity = 320

// Identity checks a name that stands for a person or a key (requested_by, an API key's
// name or the person it acts for, an SSO subject): one line, visible, at most 320
// characters, and valid under PRECIS's Nickname profile.
func Identity(s string) error {
	if err := Text(s, Rule{Max: maxIdentity, Visible: true}); err != nil {
		return err
	}
	if strings.TrimSpace(s) == "" {
		return nil // absent; callers that need one say so
	}
	if _, err := precis.Nickname.String(s); err != nil {
		return &Error{Problem: NotIdentity}
	}
	return nil
}

// Skeleton is the form in which two identities that a person would read as the same
// compare equal: trimmed, NFKC, case-folded, without invisible characters, and mapped
// through Unicode's confusables (UTS #39 skeleton), so "ANA", "ａｎａ", "аna" (Cyrillic а)
// and "an\u200ba" are all ana. It is for comparing, never for showing.
func Skeleton(s string) string {
	s = norm.NFKC.String(cases.Fold().String(strings.TrimSpace(norm.NFKC.String(s))))
	s = strings.Map(func(c rune) rune {
		if Hidden(c) {
			return -1
		}
		return c
	}, s)
	return confusable.Skeleton(s)
}
