package slack

import "testing"

// TestSignMatchesSlacksExample signs the example request of Slack's "Verifying requests
// from Slack" page with its example secret and timestamp: the signature must be the one
// that page shows.
func TestSignMatchesSlacksExample(t *testing.T) {
	const (
		secret = "8f742231b10e8888abcd99yyyzzz85a5"
		ts     = "1531420618"
		body   = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
		want   = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
	)
	if got := Sign(secret, ts, []byte(body)); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if got := Sign(secret, ts, []byte(body+"x")); got == want {
		t.Fatal("a changed body signs the same")
	}
}
