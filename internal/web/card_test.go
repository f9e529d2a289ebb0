package web

import (
	"strings"
	"testing"
)

func TestHTMLText(t *testing.T) {
	tests := []struct{ in, want string }{
		{"<p>Dear Ana,</p><p>your <b>refund</b>.</p>", "Dear Ana,\n\nyour refund."},
		{"a<script>steal()</script>b<style>p{}</style>c", "abc"},
		{"<img src=x onerror=alert(1)>hi", "hi"},
		{"x &lt;y&gt; &amp; z", "x <y> & z"}, // text, escaped again by the template
		{"<title>t</title><body>b</body>", "b"},
		{"unclosed <script>never shown", "unclosed"},
	}
	for _, tt := range tests {
		if got := htmlText(tt.in); got != tt.want {
			t.Errorf("htmlText(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestLinkable(t *testing.T) {
	for s, want := range map[string]bool{
		"https://support.example.com/t/1": true, "http://x.example/a?b=c": true,
		"javascript:alert(1)": false, "JAVASCRIPT:alert(1)": false, "data:text/html,x": false,
		"//evil.example/x": false, "/t/1": false, "https://u:p@x.example/": false, "": false, "https://": false,
	} {
		if got := linkable(s); got != want {
			t.Errorf("linkable(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestShownURLHidesQueryAndUser(t *testing.T) {
	got := shownURL("https://u:secret@api.example.com/v1/notes?api_key=s3cr3t")
	if strings.Contains(got, "secret") || strings.Contains(got, "s3cr3t") || !strings.HasPrefix(got, "https://api.example.com/v1/notes") {
		t.Fatalf("shownURL = %q", got)
	}
}

func TestAnswerHTML(t *testing.T) {
	got := string(answerHTML("unknown: <b>x</b> — check, then `airlock effects resolve`"))
	want := "unknown: &lt;b&gt;x&lt;/b&gt; — check, then <code>airlock effects resolve</code>"
	if got != want {
		t.Fatalf("answerHTML = %q, want %q", got, want)
	}
}
