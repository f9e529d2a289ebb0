package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"

	"github.com/airlockhq/airlock/internal/slack"
)

// The Slack app's Request URLs: interactivity (decision buttons, the reject modal) and
// the /airlock slash command (linking). Each request is checked against the app's
// signing secret, its timestamp and the requests already seen before its body is read
// (slack.Service.Verify); what it asks is then done by internal/slack, whose decisions
// are the page's (approvals.DecideBy). Slack reads only a 200's body; a refusal of the
// request itself is the API's error JSON.

func (s *server) slackActions(w http.ResponseWriter, r *http.Request) error {
	return s.slackRequest(w, r, s.Slack.Interact)
}

func (s *server) slackCommands(w http.ResponseWriter, r *http.Request) error {
	return s.slackRequest(w, r, s.Slack.Command)
}

func (s *server) slackRequest(w http.ResponseWriter, r *http.Request, take func(context.Context, url.Values) (slack.Reply, error)) error {
	if s.Slack == nil {
		return slack.ErrNotConfigured
	}
	body, err := io.ReadAll(r.Body)
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return apiError(http.StatusRequestEntityTooLarge, "body_too_large", "the request body is too large")
	}
	if err != nil {
		return invalid("body", "cannot be read")
	}
	if err := s.Slack.Verify(r.Context(), r.Header.Get("X-Slack-Request-Timestamp"), r.Header.Get("X-Slack-Signature"), body); err != nil {
		s.Log.WarnContext(r.Context(), "slack request refused", "route", r.Pattern, "reason", err)
		return err
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return invalid("body", "is not a form")
	}
	reply, err := take(r.Context(), form)
	if err != nil {
		return err
	}
	if reply == nil {
		w.WriteHeader(http.StatusOK)
		return nil
	}
	writeJSONBytes(w, http.StatusOK, reply)
	return nil
}
