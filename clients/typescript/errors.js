// Errors from airlock: one class per stable error code (generated from the server's
// list; test/errors.test.mjs keeps it equal to internal/httpapi's codes).

/** Base of every error this client throws. */
export class AirlockError extends Error {}

/** No answer from airlock (connection refused, reset, timed out), after the retries. */
export class TransportError extends AirlockError {}

/** An error answer from airlock: {"error": code, "message": …}. */
export class APIError extends AirlockError {
	static code = '';
	constructor(status, code, message, errors = [], retryAfter = 0) {
		super(`airlock: ${status} ${code}: ${message}`);
		this.name = new.target.name;
		this.status = status;
		this.code = code;
		this.apiMessage = message;
		this.errors = errors;
		this.retryAfter = retryAfter;
	}
}

export class MalformedJsonError extends APIError { static code = 'malformed_json'; }
export class WrongTypeError extends APIError { static code = 'wrong_type'; }
export class UnknownFieldError extends APIError { static code = 'unknown_field'; }
export class DuplicateFieldError extends APIError { static code = 'duplicate_field'; }
export class InvalidUtf8Error extends APIError { static code = 'invalid_utf8'; }
export class NulCharacterError extends APIError { static code = 'nul_character'; }
export class NestingTooDeepError extends APIError { static code = 'nesting_too_deep'; }
export class InvisibleCharacterError extends APIError { static code = 'invisible_character'; }
export class InvalidIdentityError extends APIError { static code = 'invalid_identity'; }
export class ConfusableIdentityError extends APIError { static code = 'confusable_identity'; }
export class UnsendablePayloadError extends APIError { static code = 'unsendable_payload'; }
export class MissingFieldError extends APIError { static code = 'missing_field'; }
export class InvalidFieldError extends APIError { static code = 'invalid_field'; }
export class InvalidSourceUrlError extends APIError { static code = 'invalid_source_url'; }
export class BodyTooLargeError extends APIError { static code = 'body_too_large'; }
export class UnsupportedMediaTypeError extends APIError { static code = 'unsupported_media_type'; }
export class InvalidIdempotencyKeyError extends APIError { static code = 'invalid_idempotency_key'; }
export class IdempotencyKeyReusedError extends APIError { static code = 'idempotency_key_reused'; }
export class RequestInProgressError extends APIError { static code = 'request_in_progress'; }
export class UnauthenticatedError extends APIError { static code = 'unauthenticated'; }
export class ForbiddenError extends APIError { static code = 'forbidden'; }
export class NotFoundError extends APIError { static code = 'not_found'; }
export class MethodNotAllowedError extends APIError { static code = 'method_not_allowed'; }
export class RunNotFoundError extends APIError { static code = 'run_not_found'; }
export class PayloadMismatchError extends APIError { static code = 'payload_mismatch'; }
export class LeaseLostError extends APIError { static code = 'lease_lost'; }
export class VersionConflictError extends APIError { static code = 'version_conflict'; }
export class LeaseLifetimeExceededError extends APIError { static code = 'lease_lifetime_exceeded'; }
export class EffectsOpenError extends APIError { static code = 'effects_open'; }
export class InvalidTransitionError extends APIError { static code = 'invalid_transition'; }
export class StoreUnavailableError extends APIError { static code = 'store_unavailable'; }
export class WriterLevelBehindError extends APIError { static code = 'writer_level_behind'; }
export class SchemaOutdatedError extends APIError { static code = 'schema_outdated'; }
export class InternalError extends APIError { static code = 'internal'; }
export class UnknownActionTypeError extends APIError { static code = 'unknown_action_type'; }
export class InvalidTargetError extends APIError { static code = 'invalid_target'; }
export class ApprovalRequiredError extends APIError { static code = 'approval_required'; }
export class EffectMismatchError extends APIError { static code = 'effect_mismatch'; }
export class ActionsDisabledError extends APIError { static code = 'actions_disabled'; }
export class EffectNotFoundError extends APIError { static code = 'effect_not_found'; }
export class NotResolvableError extends APIError { static code = 'not_resolvable'; }
export class EffectChangedError extends APIError { static code = 'effect_changed'; }
export class InvalidInputError extends APIError { static code = 'invalid_input'; }
export class NotValidatedError extends APIError { static code = 'not_validated'; }
export class BudgetExhaustedError extends APIError { static code = 'budget_exhausted'; }
export class NoSchemaError extends APIError { static code = 'no_schema'; }
export class InvalidReplacementError extends APIError { static code = 'invalid_replacement'; }
export class NotFinishedError extends APIError { static code = 'not_finished'; }
export class AlreadyReplacedError extends APIError { static code = 'already_replaced'; }
export class KeyInUseError extends APIError { static code = 'key_in_use'; }
export class NotParkedError extends APIError { static code = 'not_parked'; }
export class ReviewNotFoundError extends APIError { static code = 'review_not_found'; }
export class DecisionNotAllowedError extends APIError { static code = 'decision_not_allowed'; }
export class GateTooWeakError extends APIError { static code = 'gate_too_weak'; }
export class LedgerNotFoundError extends APIError { static code = 'ledger_not_found'; }
export class InvariantsChangedError extends APIError { static code = 'invariants_changed'; }
export class ReconcileFirstError extends APIError { static code = 'reconcile_first'; }
export class InputMismatchError extends APIError { static code = 'input_mismatch'; }
export class EffectRejectedError extends APIError { static code = 'effect_rejected'; }
export class NotPlannedError extends APIError { static code = 'not_planned'; }
export class NotSettledError extends APIError { static code = 'not_settled'; }
export class InvalidLedgerError extends APIError { static code = 'invalid_ledger'; }
export class ApprovalNotFoundError extends APIError { static code = 'approval_not_found'; }
export class ApprovalNotPendingError extends APIError { static code = 'approval_not_pending'; }
export class NoLinkError extends APIError { static code = 'no_link'; }
export const ERROR_CLASSES = { malformed_json: MalformedJsonError, wrong_type: WrongTypeError, unknown_field: UnknownFieldError, duplicate_field: DuplicateFieldError, invalid_utf8: InvalidUtf8Error, nul_character: NulCharacterError, nesting_too_deep: NestingTooDeepError, invisible_character: InvisibleCharacterError, invalid_identity: InvalidIdentityError, confusable_identity: ConfusableIdentityError, unsendable_payload: UnsendablePayloadError, missing_field: MissingFieldError, invalid_field: InvalidFieldError, invalid_source_url: InvalidSourceUrlError, body_too_large: BodyTooLargeError, unsupported_media_type: UnsupportedMediaTypeError, invalid_idempotency_key: InvalidIdempotencyKeyError, idempotency_key_reused: IdempotencyKeyReusedError, request_in_progress: RequestInProgressError, unauthenticated: UnauthenticatedError, forbidden: ForbiddenError, not_found: NotFoundError, method_not_allowed: MethodNotAllowedError, run_not_found: RunNotFoundError, payload_mismatch: PayloadMismatchError, lease_lost: LeaseLostError, version_conflict: VersionConflictError, lease_lifetime_exceeded: LeaseLifetimeExceededError, effects_open: EffectsOpenError, invalid_transition: InvalidTransitionError, store_unavailable: StoreUnavailableError, writer_level_behind: WriterLevelBehindError, schema_outdated: SchemaOutdatedError, internal: InternalError, unknown_action_type: UnknownActionTypeError, invalid_target: InvalidTargetError, approval_required: ApprovalRequiredError, effect_mismatch: EffectMismatchError, actions_disabled: ActionsDisabledError, effect_not_found: EffectNotFoundError, not_resolvable: NotResolvableError, effect_changed: EffectChangedError, invalid_input: InvalidInputError, not_validated: NotValidatedError, budget_exhausted: BudgetExhaustedError, no_schema: NoSchemaError, invalid_replacement: InvalidReplacementError, not_finished: NotFinishedError, already_replaced: AlreadyReplacedError, key_in_use: KeyInUseError, not_parked: NotParkedError, review_not_found: ReviewNotFoundError, decision_not_allowed: DecisionNotAllowedError, gate_too_weak: GateTooWeakError, ledger_not_found: LedgerNotFoundError, invariants_changed: InvariantsChangedError, reconcile_first: ReconcileFirstError, input_mismatch: InputMismatchError, effect_rejected: EffectRejectedError, not_planned: NotPlannedError, not_settled: NotSettledError, invalid_ledger: InvalidLedgerError, approval_not_found: ApprovalNotFoundError, approval_not_pending: ApprovalNotPendingError, no_link: NoLinkError };

/** Every error code airlock answers, sorted. */
export const CODES = Object.freeze(Object.keys(ERROR_CLASSES).sort());

/** errorFor turns an error answer (its decoded JSON body, or text) into the class of its code. */
export function errorFor(status, body, retryAfter = 0) {
	if (body && typeof body === 'object' && typeof body.error === 'string' && body.error !== '') {
		const Cls = Object.hasOwn(ERROR_CLASSES, body.error) ? ERROR_CLASSES[body.error] : APIError;
		const errors = Array.isArray(body.errors) ? body.errors.filter((e) => e && typeof e === 'object') : [];
		return new Cls(status, body.error, String(body.message ?? ''), errors, retryAfter);
	}
	let msg = typeof body === 'string' ? body.trim() : '';
	if (msg.length > 200) msg = msg.slice(0, 200) + '…';
	return new APIError(status, '', msg || `HTTP ${status}`, [], retryAfter);
}
