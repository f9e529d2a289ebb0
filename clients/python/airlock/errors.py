"""Errors from airlock: one exception class per stable error code.

Every error answer of airlock's API is ``{"error": code, "message": ...}``; the code is
stable, the message is for people. :func:`error_for` turns an answer into the class of
its code (a subclass of :class:`APIError`), so callers can write
``except LeaseLostError:``. An answer that is not airlock's format (a proxy in between)
is a plain :class:`APIError` with ``code`` ``""``.

The list of codes is kept equal to the server's (internal/httpapi/errors.go and the
OpenAPI document's Error enum) by a test in this repository.
"""

from typing import Any, Dict, List, Optional, Type

__all__ = ["AirlockError", "TransportError", "APIError", "SchemaError", "error_for", "CODES"]


class AirlockError(Exception):
    """Base of every error this client raises."""


class TransportError(AirlockError):
    """No answer from airlock (connection refused, reset, timed out), after the retries."""


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
    answer's Retry-After in seconds (0 when absent).
    """

    code: str = ""

    def __init__(self, status: int, code: str, message: str, errors: Optional[List[SchemaError]] = None,
                 retry_after: float = 0) -> None:
        super().__init__(f"airlock: {status} {code}: {message}")
        self.status = status
        if code or not type(self).code:
            self.code = code
        self.message = message
        self.errors: List[SchemaError] = errors or []
        self.retry_after = retry_after


class MalformedJsonError(APIError):
    code = "malformed_json"


class WrongTypeError(APIError):
    code = "wrong_type"


class UnknownFieldError(APIError):
    code = "unknown_field"


class DuplicateFieldError(APIError):
    code = "duplicate_field"


class InvalidUtf8Error(APIError):
    code = "invalid_utf8"


class NulCharacterError(APIError):
    code = "nul_character"


class NestingTooDeepError(APIError):
    code = "nesting_too_deep"


class InvisibleCharacterError(APIError):
    code = "invisible_character"


class InvalidIdentityError(APIError):
    code = "invalid_identity"


class ConfusableIdentityError(APIError):
    code = "confusable_identity"


class UnsendablePayloadError(APIError):
    code = "unsendable_payload"


class MissingFieldError(APIError):
    code = "missing_field"


class InvalidFieldError(APIError):
    code = "invalid_field"


class InvalidSourceUrlError(APIError):
    code = "invalid_source_url"


class BodyTooLargeError(APIError):
    code = "body_too_large"


class UnsupportedMediaTypeError(APIError):
    code = "unsupported_media_type"


class InvalidIdempotencyKeyError(APIError):
    code = "invalid_idempotency_key"


class IdempotencyKeyReusedError(APIError):
    code = "idempotency_key_reused"


class RequestInProgressError(APIError):
    code = "request_in_progress"


class UnauthenticatedError(APIError):
    code = "unauthenticated"


class ForbiddenError(APIError):
    code = "forbidden"


class NotFoundError(APIError):
    code = "not_found"


class MethodNotAllowedError(APIError):
    code = "method_not_allowed"


class RunNotFoundError(APIError):
    code = "run_not_found"


class PayloadMismatchError(APIError):
    code = "payload_mismatch"


class LeaseLostError(APIError):
    code = "lease_lost"


class VersionConflictError(APIError):
    code = "version_conflict"


class LeaseLifetimeExceededError(APIError):
    code = "lease_lifetime_exceeded"


class EffectsOpenError(APIError):
    code = "effects_open"


class InvalidTransitionError(APIError):
    code = "invalid_transition"


class StoreUnavailableError(APIError):
    code = "store_unavailable"


class WriterLevelBehindError(APIError):
    code = "writer_level_behind"


class SchemaOutdatedError(APIError):
    code = "schema_outdated"


class InternalError(APIError):
    code = "internal"


class UnknownActionTypeError(APIError):
    code = "unknown_action_type"


class InvalidTargetError(APIError):
    code = "invalid_target"


class ApprovalRequiredError(APIError):
    code = "approval_required"


class EffectMismatchError(APIError):
    code = "effect_mismatch"


class ActionsDisabledError(APIError):
    code = "actions_disabled"


class EffectNotFoundError(APIError):
    code = "effect_not_found"


class NotResolvableError(APIError):
    code = "not_resolvable"


class EffectChangedError(APIError):
    code = "effect_changed"


class InvalidInputError(APIError):
    code = "invalid_input"


class NotValidatedError(APIError):
    code = "not_validated"


class BudgetExhaustedError(APIError):
    code = "budget_exhausted"


class NoSchemaError(APIError):
    code = "no_schema"


class InvalidReplacementError(APIError):
    code = "invalid_replacement"


class NotFinishedError(APIError):
    code = "not_finished"


class AlreadyReplacedError(APIError):
    code = "already_replaced"


class KeyInUseError(APIError):
    code = "key_in_use"


class NotParkedError(APIError):
    code = "not_parked"


class ReviewNotFoundError(APIError):
    code = "review_not_found"


class DecisionNotAllowedError(APIError):
    code = "decision_not_allowed"


class GateTooWeakError(APIError):
    code = "gate_too_weak"


class LedgerNotFoundError(APIError):
    code = "ledger_not_found"


class InvariantsChangedError(APIError):
    code = "invariants_changed"


class ReconcileFirstError(APIError):
    code = "reconcile_first"


class InputMismatchError(APIError):
    code = "input_mismatch"


class NotPlannedError(APIError):
    code = "not_planned"


class EffectRejectedError(APIError):
    code = "effect_rejected"


class NotSettledError(APIError):
    code = "not_settled"


class InvalidLedgerError(APIError):
    code = "invalid_ledger"


class ApprovalNotFoundError(APIError):
    code = "approval_not_found"


class ApprovalNotPendingError(APIError):
    code = "approval_not_pending"


class NoLinkError(APIError):
    code = "no_link"


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
        return cls(status, code, str(body.get("message", "")), errs, retry_after)
    msg = body if isinstance(body, str) else ""
    msg = msg.strip()
    if len(msg) > 200:
        msg = msg[:200] + "…"
    return APIError(status, "", msg or f"HTTP {status}", None, retry_after)
