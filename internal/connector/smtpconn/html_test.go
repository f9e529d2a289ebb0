package smtpconn

import "testing"

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
