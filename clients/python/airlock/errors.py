"""Errors from airlock: one exception class per stable error code.

Every error answer of airlock's API is ``{"error": code, "message": ...}``; the code is
stable, the message is for people. :func:`error_for` turns an answer into the class of
its code (a subclass of :class:`APIError`), so callers can write
``except LeaseLostError:``. An answer that is not airlock's format (a proxy in between)
is a plain :class:`APIError` with ``code`` ``""``.

The classes between the "generated" markers are written by ``go generate
./internal/errcodes`` from the server's one list of codes (internal/errcodes/errcodes.go),
which also writes the OpenAPI document's Error enum and docs/errors.md's table; edit that
list, not the classes.
"""

from typing import Any, Dict, List, Optional, Type

__all__ = ["AirlockError", "TransportError", "APIError", "SchemaError", "error_for", "CODES", "RejectedError",
           "NeedsPersonError", "ApprovalPendingError", "RunBusyError", "RunFinishedError"]


class AirlockError(Exception):
    """Base of every error this client raises."""


class TransportError(AirlockError):
    """No answer from airlock (connection refused, reset, timed out), after the retries."""


class RejectedError(AirlockError):
    """A person rejected a gated effect: ``reason`` is what the approver wrote,
    ``rejected_by`` who, ``effect_id`` and ``approval_id`` which. Raised by
    :class:`airlock.AgentRun` (the step API): under ``approval.on_reject: end_run`` the
    run is over; under ``skip_effect`` only that step is — it is recorded as settled
    without being performed, and the next step works. The server's ``effect_rejected``
    answer is raised as :class:`EffectRejectedError`, which is both an :class:`APIError`
    and a RejectedError (its fields read from the answer's ``details``)."""

    reason = ""
    rejected_by = ""
    effect_id = ""
    approval_id = ""

    def __init__(self, reason: str, rejected_by: str = "", effect_id: str = "", approval_id: str = "") -> None:
        super().__init__(f"airlock: rejected by {rejected_by or 'a person'}: {reason or '(no reason given)'}")
        self.reason = reason
        self.rejected_by = rejected_by
        self.effect_id = effect_id
        self.approval_id = approval_id


class NeedsPersonError(AirlockError):
    """airlock cannot tell by itself whether ``effect_id`` happened (a lookup found
    several records, could not decide, or there is no lookup), or the run is parked for
    a person. The agent must not act on it; a person resolves it (the console's run page,
    or ``airlock effects resolve``) and a later start goes on."""

    def __init__(self, effect_id: str, why: str) -> None:
        super().__init__(f"airlock: {effect_id or 'the run'} needs a person: {why}")
        self.effect_id = effect_id
        self.why = why


class ApprovalPendingError(AirlockError):
    """A gated step waits for a person and the caller chose not to wait (longer):
    ``approval_id``, ``effect_id``, ``approve_url`` (the approver's link, when this
    process asked for the approval) and ``console_url`` (the console's page of it).
    Start the run again later: the step then performs once approved."""

    def __init__(self, effect_id: str, approval_id: str, approve_url: str = "", console_url: str = "") -> None:
        super().__init__(f"airlock: {effect_id or 'the run'} waits for approval {approval_id}"
                         + (f" ({console_url})" if console_url else ""))
        self.effect_id = effect_id
        self.approval_id = approval_id
        self.approve_url = approve_url
        self.console_url = console_url
        self.status = "pending"


class RunBusyError(AirlockError):
    """Another process holds the run's lease (until ``lease_expires_at``) beyond the wait
    the caller allowed."""

    def __init__(self, key: str, lease_expires_at: Any) -> None:
        super().__init__(f"airlock: run {key} is held by another process until {lease_expires_at}")
        self.key = key
        self.lease_expires_at = lease_expires_at


class RunFinishedError(AirlockError):
    """A step on a run that is already finished (``state`` completed or failed_terminal,
    ``result`` what it ended with)."""

    def __init__(self, key: str, state: str, result: Any) -> None:
        super().__init__(f"airlock: run {key} is {state}")
        self.key = key
        self.state = state
        self.result = result


class SchemaError:
    """One JSON Schema violation (invalid_ledger, invalid_input), located by a JSON pointer."""

    __slots__ = ("pointer", "keyword", "message")

    def __init__(self, pointer: str = "", keyword: str = "", message: str = "") -> None:
        self.pointer = pointer
        self.keyword = keyword
        self.message = message

    def __repr__(self) -> str:
        return f"SchemaError(pointer={self.pointer!r}, keyword={self.keyword!r}, message={self.message!r})"


class APIError(AirlockError):
    """An error answer from airlock.

    ``status`` is the HTTP status, ``code`` the stable machine-readable code
    ("lease_lost", "reconcile_first", ...), ``message`` the text for people, ``errors``
    the schema violations of invalid_ledger and invalid_input, ``retry_after`` the
    answer's Retry-After in seconds (0 when absent), ``details`` the answer's particulars
    (a dict; effect_rejected: effect_id, approval_id, rejected_by, reason).
    """

    code: str = ""

    def __init__(self, status: int, code: str, message: str, errors: Optional[List[SchemaError]] = None,
                 retry_after: float = 0, details: Optional[Dict[str, Any]] = None) -> None:
        # Not super(): a class that is also a RejectedError (EffectRejectedError) fills
        # that part from details, in error_for.
        AirlockError.__init__(self, f"airlock: {status} {code}: {message}")
        self.status = status
        if code or not type(self).code:
            self.code = code
        self.message = message
        self.errors: List[SchemaError] = errors or []
        self.retry_after = retry_after
        self.details: Dict[str, Any] = details or {}


# BEGIN generated by `go generate ./internal/errcodes` from internal/errcodes/errcodes.go: do not edit by hand
class MalformedJsonError(APIError):
    r"""400: the body is not one JSON object (empty, not JSON, or two values); the message says which"""

    code = "malformed_json"


class WrongTypeError(APIError):
    r"""400: a field (or the body) has the wrong JSON type; the message names the field"""

    code = "wrong_type"


class UnknownFieldError(APIError):
    r"""400: the body has a field this route does not take (names are case-sensitive: the message suggests the right one)"""

    code = "unknown_field"


class MissingFieldError(APIError):
    r"""400: a required field is missing; the message names it"""

    code = "missing_field"


class InvalidFieldError(APIError):
    r"""400: a field's value is wrong; the message names the field. Also, on every route, before authentication and the handler: a query that does not parse (a malformed `%`-escape, a `;`), or a query name or value, or a path value (`{key}`, `{id}` …), holding a NUL, invalid UTF-8, a control character or more than 2,000 characters; the message names the parameter (`query key_prefix: holds a NUL character`, `path key: …`)"""

    code = "invalid_field"


class DuplicateFieldError(APIError):
    r"""400: a field appears twice in one object (at any depth)"""

    code = "duplicate_field"


class InvalidUtf8Error(APIError):
    r"""400: the body is not valid UTF-8 or escapes a lone surrogate"""

    code = "invalid_utf8"


class NulCharacterError(APIError):
    r"""400: a string or object key anywhere in the body holds `\u0000` (PostgreSQL cannot store it; refused on both stores); the message names the field"""

    code = "nul_character"


class NestingTooDeepError(APIError):
    r"""400: the body nests objects and arrays more than 64 levels deep (the body's own object is the first); the message names where. Refused before the body is read further, in memory that does not grow with the depth"""

    code = "nesting_too_deep"


class InvalidIdempotencyKeyError(APIError):
    r"""400: the `Idempotency-Key` header is empty, too long, not visible ASCII, or given twice"""

    code = "invalid_idempotency_key"


class UnauthenticatedError(APIError):
    r"""401: no, unknown or revoked API key"""

    code = "unauthenticated"


class ForbiddenError(APIError):
    r"""403: the key lacks the route's scope"""

    code = "forbidden"


class NotFoundError(APIError):
    r"""404: no such route"""

    code = "not_found"


class MethodNotAllowedError(APIError):
    r"""405: the route does not take this method: see the `Allow` header"""

    code = "method_not_allowed"


class BodyTooLargeError(APIError):
    r"""413: the body is over `AIRLOCK_MAX_BODY_BYTES`"""

    code = "body_too_large"


class UnsupportedMediaTypeError(APIError):
    r"""415: send `Content-Type: application/json`"""

    code = "unsupported_media_type"


class RunNotFoundError(APIError):
    r"""404: no such run"""

    code = "run_not_found"


class PayloadMismatchError(APIError):
    r"""409: the key exists with another payload hash"""

    code = "payload_mismatch"


class LeaseLostError(APIError):
    r"""409: you do not hold a live lease (expired, taken over, released): do not act. A refused `confirm` or worker completion whose receipt shows a second performance is still recorded, as an alert `performed_twice` ([agents.md](agents.md#an-agent-paused-past-its-lease))"""

    code = "lease_lost"


class VersionConflictError(APIError):
    r"""409: the run moved on since the version you hold"""

    code = "version_conflict"


class LeaseLifetimeExceededError(APIError):
    r"""409: the lease cannot be renewed further"""

    code = "lease_lifetime_exceeded"


class EffectsOpenError(APIError):
    r"""409: `completed` refused while an effect is open or failed"""

    code = "effects_open"


class InvalidTransitionError(APIError):
    r"""422: not a state a client may move the run to"""

    code = "invalid_transition"


class EffectNotFoundError(APIError):
    r"""404: no such effect"""

    code = "effect_not_found"


class EffectMismatchError(APIError):
    r"""409: the effect id was queued with another payload, action type or target"""

    code = "effect_mismatch"


class NotResolvableError(APIError):
    r"""409: only `unknown` or `failed` effects are resolved"""

    code = "not_resolvable"


class EffectChangedError(APIError):
    r"""409: a resolve named the `version` it decided on, and the effect has moved on since (resolved by someone else, or queued, sent and unknown again): look at it again"""

    code = "effect_changed"


class UnknownActionTypeError(APIError):
    r"""422: the action type is not in the policy file (or not a worker type, for `/v1/effects/claim`)"""

    code = "unknown_action_type"


class InvalidTargetError(APIError):
    r"""422: not a target configured for the action type (clients never supply URLs)"""

    code = "invalid_target"


class InvisibleCharacterError(APIError):
    r"""422: an identity (`meta.requested_by`), a target or a provider id holds an invisible or bidirectional format character: Unicode category Cf (U+200B–U+200F, U+202A–U+202E, U+2060–U+2069, U+061C, the soft hyphen U+00AD, U+FEFF) or another default-ignorable code point (variation selectors, Hangul fillers); an identity also any blank but the plain space (NBSP U+00A0, U+1680, U+2000–U+200A, U+3000, the braille blank U+2800, U+1D159). Such text reads differently from what is compared and used"""

    code = "invisible_character"


class InvalidIdentityError(APIError):
    r"""422: `meta.requested_by` is not a usable name under PRECIS (RFC 8265's Nickname profile: e.g. an unassigned code point, a noncharacter, a zero-width joiner); see [approvals](approvals.md#look-alike-identities)"""

    code = "invalid_identity"


class ConfusableIdentityError(APIError):
    r"""422: `meta.requested_by` (on a claim, an effect request, a ledger plan or any lease call) reads like the name of a known person — a local account, a person seen by single sign-on, the person an API key acts for, an API key, an approver subject of the policy — without being that name (the same up to case, width and surrounding space): e.g. `ΑΝΑ` in Greek capitals, `ᴀɴᴀ`, `carI`, `a\u0301na` for `ana`. Nothing is written; the message does not say whose name it resembles. `airlock apikey create --on-behalf-of` refuses such a name the same way. See [approvals](approvals.md#look-alike-identities)"""

    code = "confusable_identity"


class InvalidSourceUrlError(APIError):
    r"""422: `meta.source_url` is not an absolute `http` or `https` URL with a host and without credentials (`javascript:`, `data:`, relative and scheme-relative links are refused): the approval card shows it as a link"""

    code = "invalid_source_url"


class ActionsDisabledError(APIError):
    r"""423: the kill switch holds this action type"""

    code = "actions_disabled"


class IdempotencyKeyReusedError(APIError):
    r"""422: the `Idempotency-Key` was used with another method, path or body"""

    code = "idempotency_key_reused"


class RequestInProgressError(APIError):
    r"""409: a request with this `Idempotency-Key` is still running; retry with the same key (`Retry-After`)"""

    code = "request_in_progress"


class GateTooWeakError(APIError):
    r"""422: the request asks for a weaker gate than the policy's"""

    code = "gate_too_weak"


class ReviewNotFoundError(APIError):
    r"""404: no such review of an auto-approval"""

    code = "review_not_found"


class DecisionNotAllowedError(APIError):
    r"""422: that decision is not allowed for this approval or review"""

    code = "decision_not_allowed"


class InvalidInputError(APIError):
    r"""422: the claim's payload fails its trigger source's schema (`errors` lists pointers)"""

    code = "invalid_input"


class NotValidatedError(APIError):
    r"""422: a type with a schema needs a passing validation first; a payload must equal the validated value"""

    code = "not_validated"


class UnsendablePayloadError(APIError):
    r"""422: the payload is one the action type's connector could never send, refused when the effect is queued (before any approval opens): for SMTP, a field other than `to`, `subject`, `text`, `html`, `reply_to` (e.g. `cc`, `headers`), no subject or text, a `reply_to` that is not a mail address; the message says which"""

    code = "unsendable_payload"


class NoSchemaError(APIError):
    r"""422: validate names an action type without a schema"""

    code = "no_schema"


class InvalidReplacementError(APIError):
    r"""422: the new key is the old one or the old one plus a suffix"""

    code = "invalid_replacement"


class NotFinishedError(APIError):
    r"""409: replacement refused: only a finished run with no open effects can be replaced"""

    code = "not_finished"


class AlreadyReplacedError(APIError):
    r"""409: replacement refused: the run has already been replaced"""

    code = "already_replaced"


class KeyInUseError(APIError):
    r"""409: replacement refused: the new key is already in use"""

    code = "key_in_use"


class NotParkedError(APIError):
    r"""409: unpark: the run is not parked for `unknown_commit` or `input_mismatch`"""

    code = "not_parked"


class ApprovalNotFoundError(APIError):
    r"""404: reissue: no approval has this id"""

    code = "approval_not_found"


class ApprovalNotPendingError(APIError):
    r"""409: reissue: the approval is decided, withdrawn or expired"""

    code = "approval_not_pending"


class NoLinkError(APIError):
    r"""409: reissue: the approval is a review, which has no link (decide it with `POST /v1/reviews/{id}`)"""

    code = "no_link"


class SlackNotConfiguredError(APIError):
    r"""404: the Slack routes (`/integrations/slack/actions`, `/integrations/slack/commands`): the policy has no `slack` section ([approvals.md](approvals.md#decisions-in-slack))"""

    code = "slack_not_configured"


class SlackSignatureInvalidError(APIError):
    r"""401: the Slack routes: the request is not signed with the Slack app's signing secret (or its body changed after signing); nothing in it was read"""

    code = "slack_signature_invalid"


class SlackRequestStaleError(APIError):
    r"""401: the Slack routes: the request's timestamp is more than five minutes from airlock's clock; nothing in it was read"""

    code = "slack_request_stale"


class SlackRequestReplayedError(APIError):
    r"""409: the Slack routes: this signed request was already taken (by any instance); nothing was done again"""

    code = "slack_request_replayed"


class SlackTeamRefusedError(APIError):
    r"""403: the Slack routes: the Slack workspace is not in `slack.team_ids`"""

    code = "slack_team_refused"


class ApprovalRequiredError(APIError):
    r"""409: the action type is gated and this path cannot open an approval (the approvals service is off for it)"""

    code = "approval_required"


class LedgerNotFoundError(APIError):
    r"""404: the run has no work ledger yet (save one with `PUT /v1/runs/{key}/ledger`)"""

    code = "ledger_not_found"


class InvalidLedgerError(APIError):
    r"""422: the ledger fails its schema (`GET /v1/ledger.schema.json`; `errors` lists pointers)"""

    code = "invalid_ledger"


class InvariantsChangedError(APIError):
    r"""409: a ledger save changes `invariants`, which cannot change once saved"""

    code = "invariants_changed"


class ReconcileFirstError(APIError):
    r"""409: plan: this effect was planned and never confirmed (or its outcome is unknown): search the external system and reconcile it first ([agents.md](agents.md))"""

    code = "reconcile_first"


class EffectRejectedError(APIError, RejectedError):
    r"""409: plan: a person rejected this very effect (same run, effect id and input) and its action type has `approval.on_reject: skip_effect`: it is not performed, the run goes on; the message names who rejected it and why, and `details` holds `effect_id`, `approval_id`, `rejected_by` and `reason` (the step APIs raise it as `RejectedError`)"""

    code = "effect_rejected"


class InputMismatchError(APIError):
    r"""409: plan: the effect id was planned with another input hash; the run stops for a person (`airlock runs unpark`)"""

    code = "input_mismatch"


class NotPlannedError(APIError):
    r"""409: confirm or reconcile: the effect is not `planned` (an `unknown` one is a person's to resolve)"""

    code = "not_planned"


class NotSettledError(APIError):
    r"""409: reconcile: the search found nothing, but the action type's `settle_window` has not passed since the effect was planned — a call made under that plan may still be in progress at the provider; search again after `Retry-After` seconds"""

    code = "not_settled"


class BudgetExhaustedError(APIError):
    r"""429: the run spent its budget; it is now `failed_terminal`"""

    code = "budget_exhausted"


class StoreUnavailableError(APIError):
    r"""503: airlock cannot use its database just now — see [Outages](#outages-503-store_unavailable) below; `Retry-After` says when to send the same request again. From `/readyz`: not ready (the body's `check` names what failed)"""

    code = "store_unavailable"


class SchemaOutdatedError(APIError):
    r"""503: (`/readyz`) migrations this binary needs are not applied: run `airlock migrate`"""

    code = "schema_outdated"


class WriterLevelBehindError(APIError):
    r"""503: this instance's binary implements a lower writer level than the database requires (a newer release's migration raised it): it refuses every write (any method but GET, HEAD and OPTIONS) and its background work, for good, and `/readyz` fails with `check: level`; reads go on. Send the request to an upgraded instance and replace this one ([deployment.md](deployment.md#upgrades-and-migrations))"""

    code = "writer_level_behind"


class InternalError(APIError):
    r"""500: a bug; the log has the request id (`X-Request-Id`)"""

    code = "internal"
# END generated


def _classes() -> Dict[str, Type[APIError]]:
    out: Dict[str, Type[APIError]] = {}
    for v in list(globals().values()):
        if isinstance(v, type) and issubclass(v, APIError) and v is not APIError:
            out[v.code] = v
    return out


_BY_CODE = _classes()

#: Every error code airlock answers, sorted.
CODES = tuple(sorted(_BY_CODE))

__all__ += [c.__name__ for c in _BY_CODE.values()]


def error_for(status: int, body: Any, retry_after: float = 0) -> APIError:
    """The exception for an error answer: ``body`` is its decoded JSON (or anything else)."""
    if isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"]:
        code = body["error"]
        errs = [SchemaError(e.get("pointer", ""), e.get("keyword", ""), e.get("message", ""))
                for e in body.get("errors") or [] if isinstance(e, dict)]
        cls = _BY_CODE.get(code, APIError)
        details = body.get("details") if isinstance(body.get("details"), dict) else {}
        err = cls(status, code, str(body.get("message", "")), errs, retry_after, details)
        if isinstance(err, RejectedError):
            for f in ("reason", "rejected_by", "effect_id", "approval_id"):
                setattr(err, f, str(details.get(f) or ""))
        return err
    msg = body if isinstance(body, str) else ""
    msg = msg.strip()
    if len(msg) > 200:
        msg = msg[:200] + "…"
    return APIError(status, "", msg or f"HTTP {status}", None, retry_after)
