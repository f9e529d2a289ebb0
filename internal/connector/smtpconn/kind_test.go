package smtpconn

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/connector"
)

// The recipient rules refuse a payload's "to" as a field of the payload (the API answers
// 400 invalid_field on payload.to), and only when it would send elsewhere.
func TestCheckDestinationNamesTheField(t *testing.T) {
	open, fixed := &Section{}, &Section{Targets: map[string]string{"alice": "Alice <alice@example.com>"}}
	for _, tc := range []struct {
		s       *Section
		target  string
		payload string
		refused bool
	}{
		{open, "alice@example.com", `{"subject":"s","text":"t"}`, false},
		{open, "alice@example.com", `{"to":"alice@EXAMPLE.com","subject":"s","text":"t"}`, false},
		{open, "alice@example.com", `{"to":["alice@example.com","bob@example.com"],"subject":"s","text":"t"}`, true},
		{open, "alice@example.com", `{"to":[],"subject":"s","text":"t"}`, true},
		{fixed, "alice", `{"to":"alice@example.com","subject":"s","text":"t"}`, true},
		{fixed, "alice", `{"subject":"s","text":"t"}`, false},
	} {
		err := tc.s.CheckDestination(tc.target, []byte(tc.payload))
		var fe *connector.PayloadFieldError
		if tc.refused != (err != nil) || (err != nil && (!errors.As(err, &fe) || fe.Field != "to")) {
			t.Errorf("CheckDestination(%s, %s) = %#v", tc.target, tc.payload, err)
		}
	}
}

// Validation reports each field under the section's path, as the policy file shows it.
func TestSectionValidate(t *testing.T) {
	var got []string
	s := &Section{Port: 70000, From: "not an address", TLS: "ssl", Targets: map[string]string{"x": "nope"}, PasswordEnv: "P"}
	s.Validate(connector.NewCheck("actions.m.smtp", func(field, msg string) { got = append(got, field+": "+msg) },
		func(what, env, file string) string { return "pw" }))
	want := "actions.m.smtp.host: required; actions.m.smtp.port: required: 1 to 65535; " +
		"actions.m.smtp.from: must be an email address; actions.m.smtp.tls: must be starttls, tls or none; " +
		"actions.m.smtp.targets.x: must be an email address; actions.m.smtp.username: required with a password"
	if strings.Join(got, "; ") != want {
		t.Fatalf("got  %s\nwant %s", strings.Join(got, "; "), want)
	}
}
