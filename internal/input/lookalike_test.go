package input

import (
	"sort"
	"strings"
	"testing"

	"go.mau.fi/util/confusable"
	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

// lookalikeClasses are what an attacker types for a Latin letter, class by class (issue
// 33 item 2), written out by hand from the scripts' charts — not derived from the tables
// under test. Keys are the letters they imitate: capitals imitate capitals, small letters
// small ones.
var lookalikeClasses = map[string]map[rune]rune{
	"greek capitals":     {'A': 'Α', 'B': 'Β', 'E': 'Ε', 'H': 'Η', 'I': 'Ι', 'K': 'Κ', 'M': 'Μ', 'N': 'Ν', 'O': 'Ο', 'P': 'Ρ', 'T': 'Τ', 'X': 'Χ', 'Y': 'Υ', 'Z': 'Ζ'},
	"cyrillic capitals":  {'A': 'А', 'B': 'В', 'C': 'С', 'E': 'Е', 'H': 'Н', 'K': 'К', 'M': 'М', 'O': 'О', 'P': 'Р', 'T': 'Т', 'X': 'Х', 'S': 'Ѕ', 'I': 'І', 'J': 'Ј'},
	"cyrillic small":     {'a': 'а', 'c': 'с', 'e': 'е', 'o': 'о', 'p': 'р', 'x': 'х', 'y': 'у', 'i': 'і', 'j': 'ј', 's': 'ѕ'},
	"lisu":               {'A': 'ꓮ', 'B': 'ꓐ', 'C': 'ꓚ', 'D': 'ꓓ', 'E': 'ꓰ', 'F': 'ꓝ', 'G': 'ꓖ', 'H': 'ꓧ', 'I': 'ꓲ', 'J': 'ꓙ', 'K': 'ꓗ', 'L': 'ꓡ', 'M': 'ꓟ', 'N': 'ꓠ', 'O': 'ꓳ', 'P': 'ꓑ', 'R': 'ꓣ', 'S': 'ꓢ', 'T': 'ꓔ', 'U': 'ꓴ', 'V': 'ꓦ', 'W': 'ꓪ', 'X': 'ꓫ', 'Y': 'ꓬ', 'Z': 'ꓜ'},
	"cherokee":           {'A': 'Ꭺ', 'B': 'Ᏼ', 'C': 'Ꮯ', 'D': 'Ꭰ', 'E': 'Ꭼ', 'G': 'Ꮐ', 'H': 'Ꮋ', 'J': 'Ꭻ', 'K': 'Ꮶ', 'L': 'Ꮮ', 'M': 'Ꮇ', 'P': 'Ꮲ', 'R': 'Ꭱ', 'S': 'Ꮪ', 'T': 'Ꭲ', 'V': 'Ꮩ', 'W': 'Ꮃ', 'Z': 'Ꮓ'},
	"coptic":             {'A': 'Ⲁ', 'B': 'Ⲃ', 'E': 'Ⲉ', 'H': 'Ⲏ', 'I': 'Ⲓ', 'K': 'Ⲕ', 'M': 'Ⲙ', 'N': 'Ⲛ', 'O': 'Ⲟ', 'P': 'Ⲣ', 'C': 'Ⲥ', 'T': 'Ⲧ', 'X': 'Ⲭ', 'Z': 'Ⲍ'},
	"canadian syllabics": {'A': 'ᗅ', 'B': 'ᗷ', 'C': 'ᑕ', 'D': 'ᗪ', 'J': 'ᒍ', 'L': 'ᒪ', 'P': 'ᑭ', 'S': 'ᔕ', 'U': 'ᑌ', 'V': 'ᐯ'},
	"small capitals":     {'a': 'ᴀ', 'b': 'ʙ', 'c': 'ᴄ', 'd': 'ᴅ', 'e': 'ᴇ', 'g': 'ɢ', 'h': 'ʜ', 'i': 'ɪ', 'j': 'ᴊ', 'k': 'ᴋ', 'l': 'ʟ', 'm': 'ᴍ', 'n': 'ɴ', 'o': 'ᴏ', 'p': 'ᴘ', 'r': 'ʀ', 't': 'ᴛ', 'u': 'ᴜ', 'v': 'ᴠ', 'w': 'ᴡ', 'y': 'ʏ', 'z': 'ᴢ'},
	"fullwidth":          {'a': 'ａ', 'b': 'ｂ', 'c': 'ｃ', 'e': 'ｅ', 'l': 'ｌ', 'n': 'ｎ', 'o': 'ｏ', 'r': 'ｒ', 's': 'ｓ', 'd': 'ｄ'},
	"capital I for l":    {'l': 'I'},
	"digit 1 for l":      {'l': '1'},
}

// knownNames stand for every known account: local accounts, SSO subjects, the people
// keys act for.
var knownNames = []string{"ana", "bob", "carl", "lead", "lead2", "ops", "intern", "maria.lopez", "sam@example.com", "dave-ops", "support-lead"}

// lookalikeVariants are the variants of name in each class: the whole name in the
// class's case with every letter it has replaced, and the name with one letter replaced.
// Blanks and combining marks are classes of their own.
func lookalikeVariants(name string) map[string][]string {
	out := map[string][]string{}
	add := func(class, v string) {
		if v != name {
			out[class] = append(out[class], v)
		}
	}
	for class, m := range lookalikeClasses {
		upper := false
		for k := range m {
			upper = k >= 'A' && k <= 'Z'
			break
		}
		base := name
		if upper {
			base = strings.ToUpper(name)
		}
		all, one := []rune(base), []rune(base)
		changed, first := false, true
		for i, c := range all {
			if r, ok := m[c]; ok {
				all[i], changed = r, true
				if first {
					one[i], first = r, false
				}
			}
		}
		if changed {
			add(class, string(all))
			add(class, string(one))
		}
	}
	rs := []rune(name)
	mid := len(rs) / 2
	for _, b := range []rune{'\u2800', 0x1D159, '\u00a0', '\u1680', '\u3000', '\u2002'} {
		add("blanks", string(rs[:mid])+string(b)+string(rs[mid:]))
		add("blanks", name+string(b))
	}
	for _, mark := range []rune{'\u0301', '\u0307', '\u0323', '\u0332', '\u0338', '\u0335', '\u0300'} {
		add("combining marks", string(rs[:1])+string(mark)+string(rs[1:]))
		add("combining marks", name+string(mark))
	}
	return out
}

// oldSkeleton is the comparison before issue 33: case folding before the skeleton.
func oldSkeleton(s string) string {
	s = norm.NFKC.String(cases.Fold().String(strings.TrimSpace(norm.NFKC.String(s))))
	s = strings.Map(func(c rune) rune {
		if Hidden(c) {
			return -1
		}
		return c
	}, s)
	return confusable.Skeleton(s)
}

// Every variant of every known name, in every class, is that person (SameIdentity); the
// names themselves stay apart. The log gives the count per class caught before (the old
// comparison) and now.
func TestLookAlikeVariantsAreThePerson(t *testing.T) {
	type count struct{ total, before, now int }
	counts := map[string]*count{}
	for _, name := range knownNames {
		for class, vs := range lookalikeVariants(name) {
			if counts[class] == nil {
				counts[class] = &count{}
			}
			for _, v := range vs {
				c := counts[class]
				c.total++
				if oldSkeleton(v) == oldSkeleton(name) {
					c.before++
				}
				if SameIdentity(v, name) {
					c.now++
				} else {
					t.Errorf("%s: %q (%U) is not %q: %q vs %q", class, v, []rune(v), name, Skeletons(v), Skeletons(name))
				}
			}
		}
	}
	var classes []string
	for c := range counts {
		classes = append(classes, c)
	}
	sort.Strings(classes)
	total := count{}
	for _, class := range classes {
		c := counts[class]
		t.Logf("%-20s %3d variants: %3d caught before, %3d now", class, c.total, c.before, c.now)
		total.total, total.before, total.now = total.total+c.total, total.before+c.before, total.now+c.now
	}
	t.Logf("%-20s %3d variants: %3d caught before, %3d now", "all", total.total, total.before, total.now)
	for i, a := range knownNames {
		for _, b := range knownNames[i+1:] {
			if SameIdentity(a, b) {
				t.Errorf("%q and %q are distinct people but compare the same", a, b)
			}
		}
	}
	for _, pair := range [][2]string{{"cari", "carl"}, {"ana", "anna"}, {"ana", "ana2"}, {"bob", "rob"}, {"АНА", "ana"}} {
		if SameIdentity(pair[0], pair[1]) {
			t.Errorf("%q and %q compare the same", pair[0], pair[1])
		}
	}
}
