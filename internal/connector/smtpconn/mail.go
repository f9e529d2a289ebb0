package smtpconn

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/mail"
	"strings"
)

// Mail is the payload of an SMTP effect, the one shape the SMTP connector sends: ParseMail
// reads it for the connector at send time and for the outbox at queue time, so a
// payload that can never be sent is refused before anyone approves it.
type Mail struct {
	To      MailTo `json:"to"`
	Subject string `json:"subject"`
	Text    string `json:"text"`
	HTML    string `json:"html"`
	ReplyTo string `json:"reply_to"`
}

// MailTo is "to" as one address or a list of addresses.
type MailTo []string

func (r *MailTo) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*r = MailTo{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("to: want an address or a list of addresses")
	}
	*r = many
	return nil
}

// ParseMail reads an SMTP effect's payload: one JSON object with only the fields Mail
// has, a subject and a text, and a reply_to that is a mail address. The error says what
// makes the payload unsendable.
func ParseMail(payload json.RawMessage) (Mail, error) {
	var m Mail
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return Mail{}, fmt.Errorf("field %s is not sent by the mail connector (it sends to, subject, text, html and reply_to)", name)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Mail{}, fmt.Errorf("%s must be a string", te.Field)
		}
		if strings.HasPrefix(err.Error(), "to: ") {
			return Mail{}, err
		}
		return Mail{}, errors.New("a mail payload is a JSON object with subject and text")
	}
	if _, err := dec.Token(); err != io.EOF {
		return Mail{}, errors.New("a mail payload is one JSON object")
	}
	if m.Subject == "" || m.Text == "" {
		return Mail{}, errors.New("a mail needs a subject and a text")
	}
	if m.ReplyTo != "" {
		if _, err := mail.ParseAddress(m.ReplyTo); err != nil {
			return Mail{}, errors.New("reply_to is not a mail address")
		}
	}
	return m, nil
}

// SameAddress reports whether a and b are the same bare mail address (the domain
// compared without case).
func SameAddress(a, b string) bool {
	pa, err1 := mail.ParseAddress(a)
	pb, err2 := mail.ParseAddress(b)
	if err1 != nil || err2 != nil || pa.Name != "" || pb.Name != "" {
		return false
	}
	la, da, _ := strings.Cut(pa.Address, "@")
	lb, db, _ := strings.Cut(pb.Address, "@")
	return la == lb && strings.EqualFold(da, db)
}
