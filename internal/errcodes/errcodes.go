// Package errcodes is the one list of airlock's API error codes: each code, the HTTP
// status it is answered with and what it means. Everything else that lists the codes is
// generated from it by `go generate ./internal/errcodes` (make generate): the OpenAPI
// document's Error enum, docs/errors.md's table, and the Python and TypeScript clients'
// error classes. `make verify` (and TestGeneratedFilesAreCurrent in the test command)
// fails when one of them is stale; internal/httpapi's tests fail when the server answers
// a code that is not here, or with another status.
//
// To add a code: add its row here, answer it from internal/httpapi, run make generate.
package errcodes

//go:generate go run ./gen

// Code is one stable, machine-readable error code.
type Code struct {
	// Name is the code as it appears in an answer's "error" field.
	Name string
	// Status is the HTTP status the code is answered with.
	Status int
	// Meaning is docs/errors.md's explanation (Markdown; links are relative to docs/).
	Meaning string
}

// All is every code the API answers, in docs/errors.md's order: by what went wrong,
// from the request's shape to the server's state.
var All = []Code{
	{"malformed_json", 400, "the body is not one JSON object (empty, not JSON, or two values); the message says which"},
	{"wrong_type", 400, "a field (or the body) has the wrong JSON type; the message names the field"},
	{"unknown_field", 400, "the body has a field this route does not take (names are case-sensitive: the message suggests the right one)"},
	{"missing_field", 400, "a required field is missing; the message names it"},
	{"invalid_field", 400, "a field's value is wrong; the message names the field. Also, on every route, before authentication and the handler: a query that does not parse (a malformed `%`-escape, a `;`), or a query name or value, or a path value (`{key}`, `{id}` …), holding a NUL, invalid UTF-8, a control character or more than 2,000 characters; the message names the parameter (`query key_prefix: holds a NUL character`, `path key: …`)"},
	{"duplicate_field", 400, "a field appears twice in one object (at any depth)"},
	{"invalid_utf8", 400, "the body is not valid UTF-8 or escapes a lone surrogate"},
	{"nul_character", 400, "a string or object key anywhere in the body holds `\\u0000` (PostgreSQL cannot store it; refused on both stores); the message names the field"},
	{"nesting_too_deep", 400, "the body nests objects and arrays more than 64 levels deep (the body's own object is the first); the message names where. Refused before the body is read further, in memory that does not grow with the depth"},
	{"invalid_idempotency_key", 400, "the `Idempotency-Key` header is empty, too long, not visible ASCII, or given twice"},
	{"unauthenticated", 401, "no, unknown or revoked API key"},
	{"forbidden", 403, "the key lacks the route's scope"},
	{"not_found", 404, "no such route"},
	{"method_not_allowed", 405, "the route does not take this method: see the `Allow` header"},
	{"body_too_large", 413, "the body is over `AIRLOCK_MAX_BODY_BYTES`"},
	{"unsupported_media_type", 415, "send `Content-Type: application/json`"},
	{"run_not_found", 404, "no such run"},
	{"payload_mismatch", 409, "the key exists with another payload hash"},
	{"lease_lost", 409, "you do not hold a live lease (expired, taken over, released): do not act. A refused `confirm` or worker completion whose receipt shows a second performance is still recorded, as an alert `performed_twice` ([agents.md](agents.md#an-agent-paused-past-its-lease))"},
	{"version_conflict", 409, "the run moved on since the version you hold"},
	{"lease_lifetime_exceeded", 409, "the lease cannot be renewed further"},
	{"effects_open", 409, "`completed` refused while an effect is open or failed"},
	{"invalid_transition", 422, "not a state a client may move the run to"},
	{"effect_not_found", 404, "no such effect"},
	{"effect_mismatch", 409, "the effect id was queued with another payload, action type or target"},
	{"not_resolvable", 409, "only `unknown` or `failed` effects are resolved"},
	{"effect_changed", 409, "a resolve named the `version` it decided on, and the effect has moved on since (resolved by someone else, or queued, sent and unknown again): look at it again"},
	{"unknown_action_type", 422, "the action type is not in the policy file (or not a worker type, for `/v1/effects/claim`)"},
	{"invalid_target", 422, "not a target configured for the action type (clients never supply URLs)"},
	{"invisible_character", 422, "an identity (`meta.requested_by`), a target or a provider id holds an invisible or bidirectional format character: Unicode category Cf (U+200B–U+200F, U+202A–U+202E, U+2060–U+2069, U+061C, the soft hyphen U+00AD, U+FEFF) or another default-ignorable code point (variation selectors, Hangul fillers); an identity also any blank but the plain space (NBSP U+00A0, U+1680, U+2000–U+200A, U+3000, the braille blank U+2800, U+1D159). Such text reads differently from what is compared and used"},
	{"invalid_identity", 422, "`meta.requested_by` is not a usable name under PRECIS (RFC 8265's Nickname profile: e.g. an unassigned code point, a noncharacter, a zero-width joiner); see [approvals](approvals.md#look-alike-identities)"},
	{"confusable_identity", 422, "`meta.requested_by` (on a claim, an effect request, a ledger plan or any lease call) reads like the name of a known person — a local account, a person seen by single sign-on, the person an API key acts for, an API key, an approver subject of the policy — without being that name (the same up to case, width and surrounding space): e.g. `ΑΝΑ` in Greek capitals, `ᴀɴᴀ`, `carI`, `a\\u0301na` for `ana`. Nothing is written; the message does not say whose name it resembles. `airlock apikey create --on-behalf-of` refuses such a name the same way. See [approvals](approvals.md#look-alike-identities)"},
	{"invalid_source_url", 422, "`meta.source_url` is not an absolute `http` or `https` URL with a host and without credentials (`javascript:`, `data:`, relative and scheme-relative links are refused): the approval card shows it as a link"},
	{"actions_disabled", 423, "the kill switch holds this action type"},
	{"idempotency_key_reused", 422, "the `Idempotency-Key` was used with another method, path or body"},
	{"request_in_progress", 409, "a request with this `Idempotency-Key` is still running; retry with the same key (`Retry-After`)"},
	{"gate_too_weak", 422, "the request asks for a weaker gate than the policy's"},
	{"review_not_found", 404, "no such review of an auto-approval"},
	{"decision_not_allowed", 422, "that decision is not allowed for this approval or review"},
	{"invalid_input", 422, "the claim's payload fails its trigger source's schema (`errors` lists pointers)"},
	{"not_validated", 422, "a type with a schema needs a passing validation first; a payload must equal the validated value"},
	{"unsendable_payload", 422, "the payload is one the action type's connector could never send, refused when the effect is queued (before any approval opens): for SMTP, a field other than `to`, `subject`, `text`, `html`, `reply_to` (e.g. `cc`, `headers`), no subject or text, a `reply_to` that is not a mail address; the message says which"},
	{"no_schema", 422, "validate names an action type without a schema"},
	{"invalid_replacement", 422, "the new key is the old one or the old one plus a suffix"},
	{"not_finished", 409, "replacement refused: only a finished run with no open effects can be replaced"},
	{"already_replaced", 409, "replacement refused: the run has already been replaced"},
	{"key_in_use", 409, "replacement refused: the new key is already in use"},
	{"not_parked", 409, "unpark: the run is not parked for `unknown_commit` or `input_mismatch`"},
	{"approval_not_found", 404, "reissue: no approval has this id"},
	{"approval_not_pending", 409, "reissue: the approval is decided, withdrawn or expired"},
	{"no_link", 409, "reissue: the approval is a review, which has no link (decide it with `POST /v1/reviews/{id}`)"},
	{"slack_not_configured", 404, "the Slack routes (`/integrations/slack/actions`, `/integrations/slack/commands`): the policy has no `slack` section ([approvals.md](approvals.md#decisions-in-slack))"},
	{"slack_signature_invalid", 401, "the Slack routes: the request is not signed with the Slack app's signing secret (or its body changed after signing); nothing in it was read"},
	{"slack_request_stale", 401, "the Slack routes: the request's timestamp is more than five minutes from airlock's clock; nothing in it was read"},
	{"slack_request_replayed", 409, "the Slack routes: this signed request was already taken (by any instance); nothing was done again"},
	{"slack_team_refused", 403, "the Slack routes: the Slack workspace is not in `slack.team_ids`"},
	{"approval_required", 409, "the action type is gated and this path cannot open an approval (the approvals service is off for it)"},
	{"ledger_not_found", 404, "the run has no work ledger yet (save one with `PUT /v1/runs/{key}/ledger`)"},
	{"invalid_ledger", 422, "the ledger fails its schema (`GET /v1/ledger.schema.json`; `errors` lists pointers)"},
	{"invariants_changed", 409, "a ledger save changes `invariants`, which cannot change once saved"},
	{"reconcile_first", 409, "plan: this effect was planned and never confirmed (or its outcome is unknown): search the external system and reconcile it first ([agents.md](agents.md))"},
	{"effect_rejected", 409, "plan: a person rejected this very effect (same run, effect id and input) and its action type has `approval.on_reject: skip_effect`: it is not performed, the run goes on; the message names who rejected it and why, and `details` holds `effect_id`, `approval_id`, `rejected_by` and `reason` (the step APIs raise it as `RejectedError`)"},
	{"input_mismatch", 409, "plan: the effect id was planned with another input hash; the run stops for a person (`airlock runs unpark`)"},
	{"not_planned", 409, "confirm or reconcile: the effect is not `planned` (an `unknown` one is a person's to resolve)"},
	{"not_settled", 409, "reconcile: the search found nothing, but the action type's `settle_window` has not passed since the effect was planned — a call made under that plan may still be in progress at the provider; search again after `Retry-After` seconds"},
	{"budget_exhausted", 429, "the run spent its budget; it is now `failed_terminal`"},
	{"store_unavailable", 503, "airlock cannot use its database just now — see [Outages](#outages-503-store_unavailable) below; `Retry-After` says when to send the same request again. From `/readyz`: not ready (the body's `check` names what failed)"},
	{"schema_outdated", 503, "(`/readyz`) migrations this binary needs are not applied: run `airlock migrate`"},
	{"writer_level_behind", 503, "this instance's binary implements a lower writer level than the database requires (a newer release's migration raised it): it refuses every write (any method but GET, HEAD and OPTIONS) and its background work, for good, and `/readyz` fails with `check: level`; reads go on. Send the request to an upgraded instance and replace this one ([deployment.md](deployment.md#upgrades-and-migrations))"},
	{"internal", 500, "a bug; the log has the request id (`X-Request-Id`)"},
}

// ByName returns the code named name.
func ByName(name string) (Code, bool) {
	for _, c := range All {
		if c.Name == name {
			return c, true
		}
	}
	return Code{}, false
}
