package approvals

import (
	"strings"
	"testing"
)

// TeamsEscape leaves no Markdown character unescaped: removing CommonMark's escapes gives
// the text back, and no link, emphasis or bare URL survives in the escaped form.
func TestTeamsEscape(t *testing.T) {
	for _, s := range []string{"[Click here](https://evil.example)", "*a* _b_ ~c~ `d` # e", `a\b`, "Approval needed: email"} {
		e := TeamsEscape(s)
		// Every Markdown character in the escaped form is a CommonMark escape (a backslash
		// and the character), and dropping the escapes gives the text back.
		var back strings.Builder
		for i := 0; i < len(e); i++ {
			if e[i] != '\\' {
				if strings.IndexByte(teamsMarkdown, e[i]) >= 0 {
					t.Errorf("TeamsEscape(%q) = %q: %q at %d is not escaped", s, e, e[i], i)
				}
				back.WriteByte(e[i])
				continue
			}
			if i+1 == len(e) || strings.IndexByte(teamsMarkdown, e[i+1]) < 0 {
				t.Errorf("TeamsEscape(%q) = %q: a stray backslash at %d", s, e, i)
				continue
			}
			i++
			back.WriteByte(e[i])
		}
		if back.String() != s {
			t.Errorf("TeamsEscape(%q) = %q, unescapes to %q", s, e, back.String())
		}
	}
}
