// Types of the airlock client (index.js). Hand-written; `tsc --noEmit` checks them
// against test/types-check.ts in the test command.

// --- errors ---------------------------------------------------------------------

export declare class AirlockError extends Error {}
export declare class TransportError extends AirlockError {}

export interface SchemaError {
	pointer: string;
	keyword: string;
	message: string;
}

export declare class APIError extends AirlockError {
	static readonly code: string;
	constructor(status: number, code: string, message: string, errors?: SchemaError[], retryAfter?: number);
	/** The HTTP status. */
	readonly status: number;
	/** Stable, machine-readable: "lease_lost", "reconcile_first", … ("" when the answer was not airlock's). */
	readonly code: string;
	/** airlock's message, for people. */
	readonly apiMessage: string;
	/** Schema violations (invalid_ledger, invalid_input). */
	readonly errors: SchemaError[];
	/** The answer's Retry-After in seconds (0 when absent). */
	readonly retryAfter: number;
}

export class MalformedJsonError extends APIError { static readonly code: 'malformed_json'; readonly code: 'malformed_json'; }
export class WrongTypeError extends APIError { static readonly code: 'wrong_type'; readonly code: 'wrong_type'; }
export class UnknownFieldError extends APIError { static readonly code: 'unknown_field'; readonly code: 'unknown_field'; }
export class DuplicateFieldError extends APIError { static readonly code: 'duplicate_field'; readonly code: 'duplicate_field'; }
export class InvalidUtf8Error extends APIError { static readonly code: 'invalid_utf8'; readonly code: 'invalid_utf8'; }
export class NulCharacterError extends APIError { static readonly code: 'nul_character'; readonly code: 'nul_character'; }
export class NestingTooDeepError extends APIError { static readonly code: 'nesting_too_deep'; readonly code: 'nesting_too_deep'; }
export class InvisibleCharacterError extends APIError { static readonly code: 'invisible_character'; readonly code: 'invisible_character'; }
export class InvalidIdentityError extends APIError { static readonly code: 'invalid_identity'; readonly code: 'invalid_identity'; }
export class ConfusableIdentityError extends APIError { static readonly code: 'confusable_identity'; readonly code: 'confusable_identity'; }
export class UnsendablePayloadError extends APIError { static readonly code: 'unsendable_payload'; readonly code: 'unsendable_payload'; }
export class MissingFieldError extends APIError { static readonly code: 'missing_field'; readonly code: 'missing_field'; }
export class InvalidFieldError extends APIError { static readonly code: 'invalid_field'; readonly code: 'invalid_field'; }
export class InvalidSourceUrlError extends APIError { static readonly code: 'invalid_source_url'; readonly code: 'invalid_source_url'; }
export class BodyTooLargeError extends APIError { static readonly code: 'body_too_large'; readonly code: 'body_too_large'; }
export class UnsupportedMediaTypeError extends APIError { static readonly code: 'unsupported_media_type'; readonly code: 'unsupported_media_type'; }
export class InvalidIdempotencyKeyError extends APIError { static readonly code: 'invalid_idempotency_key'; readonly code: 'invalid_idempotency_key'; }
export class IdempotencyKeyReusedError extends APIError { static readonly code: 'idempotency_key_reused'; readonly code: 'idempotency_key_reused'; }
export class RequestInProgressError extends APIError { static readonly code: 'request_in_progress'; readonly code: 'request_in_progress'; }
export class UnauthenticatedError extends APIError { static readonly code: 'unauthenticated'; readonly code: 'unauthenticated'; }
export class ForbiddenError extends APIError { static readonly code: 'forbidden'; readonly code: 'forbidden'; }
export class NotFoundError extends APIError { static readonly code: 'not_found'; readonly code: 'not_found'; }
export class MethodNotAllowedError extends APIError { static readonly code: 'method_not_allowed'; readonly code: 'method_not_allowed'; }
export class RunNotFoundError extends APIError { static readonly code: 'run_not_found'; readonly code: 'run_not_found'; }
export class PayloadMismatchError extends APIError { static readonly code: 'payload_mismatch'; readonly code: 'payload_mismatch'; }
export class LeaseLostError extends APIError { static readonly code: 'lease_lost'; readonly code: 'lease_lost'; }
export class VersionConflictError extends APIError { static readonly code: 'version_conflict'; readonly code: 'version_conflict'; }
export class LeaseLifetimeExceededError extends APIError { static readonly code: 'lease_lifetime_exceeded'; readonly code: 'lease_lifetime_exceeded'; }
export class EffectsOpenError extends APIError { static readonly code: 'effects_open'; readonly code: 'effects_open'; }
export class InvalidTransitionError extends APIError { static readonly code: 'invalid_transition'; readonly code: 'invalid_transition'; }
export class StoreUnavailableError extends APIError { static readonly code: 'store_unavailable'; readonly code: 'store_unavailable'; }
export class WriterLevelBehindError extends APIError { static readonly code: 'writer_level_behind'; readonly code: 'writer_level_behind'; }
export class SchemaOutdatedError extends APIError { static readonly code: 'schema_outdated'; readonly code: 'schema_outdated'; }
export class InternalError extends APIError { static readonly code: 'internal'; readonly code: 'internal'; }
export class UnknownActionTypeError extends APIError { static readonly code: 'unknown_action_type'; readonly code: 'unknown_action_type'; }
export class InvalidTargetError extends APIError { static readonly code: 'invalid_target'; readonly code: 'invalid_target'; }
export class ApprovalRequiredError extends APIError { static readonly code: 'approval_required'; readonly code: 'approval_required'; }
export class EffectMismatchError extends APIError { static readonly code: 'effect_mismatch'; readonly code: 'effect_mismatch'; }
export class ActionsDisabledError extends APIError { static readonly code: 'actions_disabled'; readonly code: 'actions_disabled'; }
export class EffectNotFoundError extends APIError { static readonly code: 'effect_not_found'; readonly code: 'effect_not_found'; }
export class NotResolvableError extends APIError { static readonly code: 'not_resolvable'; readonly code: 'not_resolvable'; }
export class EffectChangedError extends APIError { static readonly code: 'effect_changed'; readonly code: 'effect_changed'; }
export class InvalidInputError extends APIError { static readonly code: 'invalid_input'; readonly code: 'invalid_input'; }
export class NotValidatedError extends APIError { static readonly code: 'not_validated'; readonly code: 'not_validated'; }
export class BudgetExhaustedError extends APIError { static readonly code: 'budget_exhausted'; readonly code: 'budget_exhausted'; }
export class NoSchemaError extends APIError { static readonly code: 'no_schema'; readonly code: 'no_schema'; }
export class InvalidReplacementError extends APIError { static readonly code: 'invalid_replacement'; readonly code: 'invalid_replacement'; }
export class NotFinishedError extends APIError { static readonly code: 'not_finished'; readonly code: 'not_finished'; }
export class AlreadyReplacedError extends APIError { static readonly code: 'already_replaced'; readonly code: 'already_replaced'; }
export class KeyInUseError extends APIError { static readonly code: 'key_in_use'; readonly code: 'key_in_use'; }
export class NotParkedError extends APIError { static readonly code: 'not_parked'; readonly code: 'not_parked'; }
export class ReviewNotFoundError extends APIError { static readonly code: 'review_not_found'; readonly code: 'review_not_found'; }
export class DecisionNotAllowedError extends APIError { static readonly code: 'decision_not_allowed'; readonly code: 'decision_not_allowed'; }
export class GateTooWeakError extends APIError { static readonly code: 'gate_too_weak'; readonly code: 'gate_too_weak'; }
export class LedgerNotFoundError extends APIError { static readonly code: 'ledger_not_found'; readonly code: 'ledger_not_found'; }
export class InvariantsChangedError extends APIError { static readonly code: 'invariants_changed'; readonly code: 'invariants_changed'; }
export class ReconcileFirstError extends APIError { static readonly code: 'reconcile_first'; readonly code: 'reconcile_first'; }
export class InputMismatchError extends APIError { static readonly code: 'input_mismatch'; readonly code: 'input_mismatch'; }
export class EffectRejectedError extends APIError { static readonly code: 'effect_rejected'; readonly code: 'effect_rejected'; }
export class NotPlannedError extends APIError { static readonly code: 'not_planned'; readonly code: 'not_planned'; }
export class NotSettledError extends APIError { static readonly code: 'not_settled'; readonly code: 'not_settled'; }
export class InvalidLedgerError extends APIError { static readonly code: 'invalid_ledger'; readonly code: 'invalid_ledger'; }
export class ApprovalNotFoundError extends APIError { static readonly code: 'approval_not_found'; readonly code: 'approval_not_found'; }
export class ApprovalNotPendingError extends APIError { static readonly code: 'approval_not_pending'; readonly code: 'approval_not_pending'; }
export class NoLinkError extends APIError { static readonly code: 'no_link'; readonly code: 'no_link'; }

export declare const ERROR_CLASSES: Readonly<Record<string, typeof APIError>>;
/** Every error code airlock answers, sorted. */
export declare const CODES: readonly string[];
export declare function errorFor(status: number, body: unknown, retryAfter?: number): APIError;

// --- canonical JSON -------------------------------------------------------------

/** RFC 8785 canonical JSON of v. */
export declare function canonicalJSON(v: unknown): string;
/** SHA-256 (lowercase hex) of v's canonical JSON: airlock's payload hash of v. */
export declare function hashInput(v: unknown): string;

// --- values ---------------------------------------------------------------------

export type State = 'processing' | 'completed' | 'failed_retryable' | 'failed_terminal' | 'awaiting_human' | 'approved' | 'rejected';
export type Verdict = 'continue' | 'reconcile' | 'wait' | 'stop';
export declare const STATES: Readonly<{ PROCESSING: 'processing'; COMPLETED: 'completed'; FAILED_RETRYABLE: 'failed_retryable'; FAILED_TERMINAL: 'failed_terminal'; AWAITING_HUMAN: 'awaiting_human'; APPROVED: 'approved'; REJECTED: 'rejected' }>;
export declare const VERDICTS: Readonly<{ CONTINUE: 'continue'; RECONCILE: 'reconcile'; WAIT: 'wait'; STOP: 'stop' }>;

export interface Meta {
	workflow_version?: string;
	trigger_source?: string;
	model?: { provider?: string; name?: string; revision?: string };
	provider_category?: string;
	requested_by?: string;
	/** The source record's link (http or https only; else 422 invalid_source_url), shown on the approval card. */
	source_url?: string;
}

/** Options of every call: a pinned Idempotency-Key (mutating calls) and an abort signal. */
export interface CallOptions {
	idempotencyKey?: string;
	signal?: AbortSignal;
}

export interface Claim {
	claimed: boolean;
	reclaimed: boolean;
	key: string;
	state: State;
	version: number;
	payload_hash: string;
	/** Only when claimed: the capability to act on the run. */
	lease_owner: string;
	/** When claimed: when this lease ends; on a duplicate while processing: when the holder's lease lapses. */
	lease_expires_at: Date | null;
	result?: unknown;
	raw: Record<string, unknown>;
}

export interface Lease {
	key: string;
	version: number;
	expires_at: Date | null;
	started_at: Date | null;
	raw: Record<string, unknown>;
}

export interface Transition {
	key: string;
	state: State;
	version: number;
}

export type EffectState = 'pending' | 'sending' | 'planned' | 'completed' | 'unknown' | 'failed' | 'cancelled';

export interface Effect {
	/** Addresses the effect under /v1/effects/{id}. */
	id: string;
	key: string;
	effect_id: string;
	action_type: string;
	target: string;
	executor: 'dispatcher' | 'worker' | 'agent';
	state: EffectState;
	payload_hash: string;
	provider_id?: string;
	attempts: number;
	version: number;
	not_before?: string;
	last_error_class?: string;
	created_at?: string;
	updated_at?: string;
}

export interface Run {
	key: string;
	state: State;
	version: number;
	payload_hash: string;
	result?: unknown;
	lease: { live?: boolean; started_at?: string; expires_at?: string };
	duplicates: number;
	reclaims: number;
	effects?: Effect[];
	park_reason?: string;
	[field: string]: unknown;
}

export interface Event {
	id: number;
	at: string;
	kind: string;
	version: number;
	actor: string;
	meta?: unknown;
	detail?: any;
}

export interface Validation {
	valid: boolean;
	repaired: boolean;
	errors?: SchemaError[];
	value?: unknown;
	state: State;
	version: number;
	repairs?: number;
}

export type FailureClass = 'transport_timeout' | 'rate_limited' | 'server_error' | 'client_error' | 'parse_failure' | 'soft_failure' | 'partial_success' | 'unknown_commit';

export interface FailureDecision {
	decision: 'retry' | 'terminal' | 'reconcile';
	level?: 'transport' | 'business' | 'write';
	/** Milliseconds (setTimeout's unit). */
	retry_after_ms?: number;
	attempts: number;
	max_attempts?: number;
	reason?: string;
	requeued?: number;
	state: State;
	version: number;
}

/** A pending human decision. approve_url carries a single-use secret: hand it to the approvers, never log it. */
export interface Approval {
	id: string;
	approve_url: string;
	expires_at: Date | null;
	state: string;
	version: number;
	raw: Record<string, unknown>;
}

export interface QueuedEffect {
	created: boolean;
	version: number;
	effect: Effect | null;
	/** Set (and effect null) when the run now waits for a person (202). */
	approval: Approval | null;
	/** act_with_window only. */
	cancel_url: string;
	not_before: Date | null;
	raw: Record<string, unknown>;
}

export interface WorkerEffect extends Effect {
	lease_owner: string;
	lease_expires_at: string;
	payload: unknown;
	/** Pass to the provider as its idempotency key: "<run key>/<effect id>". */
	idempotency_key: string;
}

export interface Step {
	step: string;
	evidence: string;
}

export interface LedgerEffect {
	effect_id: string;
	action: string;
	target: string;
	input_hash: string;
	status: 'planned' | 'confirmed' | 'unknown' | 'cleared';
	receipt?: string;
}

export interface Ledger {
	run_id?: string;
	goal: string;
	invariants: string[];
	completed: Step[];
	pending: string[];
	next_allowed_action: string;
	/** 1 on the first save, one more on each later one: a save is compare-and-set on it. */
	checkpoint_version: number;
	/** Derived by airlock; never sent. */
	effects?: LedgerEffect[];
}

export interface PlanRequest {
	action: string;
	target: string;
	input_hash: string;
	meta?: Meta;
}

/** Exactly one holds: execute (perform, then confirm), receipt (confirmed before: do not repeat), approval (wait). */
export interface Plan {
	execute: boolean;
	receipt: string;
	result?: unknown;
	approval: Approval | null;
	raw: Record<string, unknown>;
}

export interface ReconcileItem {
	effect_id: string;
	action: string;
	target: string;
	input_hash: string;
	run_id: string;
}

export interface Resume {
	verdict: Verdict;
	next_allowed_action: string;
	checkpoint_version: number;
	reconcile: ReconcileItem[];
	reasons: string[];
	raw: Record<string, unknown>;
}

export interface ApprovalStatus {
	id: string;
	mode: string;
	action_type: string;
	target: string;
	effect_id: string;
	requested_by: string;
	requested_at: string;
	expires_at: string;
	status: 'pending' | 'approved' | 'rejected' | 'expired' | 'cancelled' | 'window_closed';
	decision?: string;
	approver?: string;
	decided_at?: string;
	reason?: string;
}

/** One row of listApprovals (GET /v1/approvals): never the payload or the approve link's token. */
export interface PendingApproval {
	id: string;
	/** The run's key. */
	key: string;
	mode: string;
	action_type: string;
	target: string;
	requested_by: string;
	approver_roles: string[];
	approver_subjects: string[];
	/** Roles that may decide too once escalated_at is set. */
	escalation_roles: string[];
	escalated_at: Date | null;
	/** When the expiry warning went out (null: not yet, or never for this type). */
	warned_at: Date | null;
	/** Set while nobody known may decide it. */
	undecidable_since: Date | null;
	created_at: Date;
	expires_at: Date;
	/** The console's page of the approval, for signed-in people. */
	console_url: string;
	raw: Record<string, unknown>;
}

export interface Explanation {
	key: string;
	as_of: string;
	processed: { answer: string; claimed: boolean; state: State; version: number; [field: string]: unknown };
	sent: { answer: string; effects: Array<Record<string, unknown>> };
	approved: { answer: string; approvals: ApprovalStatus[]; [field: string]: unknown };
	model: { answer: string; [field: string]: unknown };
	timeline: Array<{ id: number; at: string; kind: string; actor?: string; version?: number; summary: string }>;
	timeline_truncated?: boolean;
}

export interface ToolCall {
	tool: string;
	upstream?: string;
	class: 'read' | 'effect' | 'unclassified';
	effect_id?: string;
	input_hash?: string;
	decision: string;
	action_type?: string;
}

// --- the client -----------------------------------------------------------------

export declare function newIdempotencyKey(): string;

export interface ClientOptions {
	/** Per request; default 30 000. */
	timeoutMs?: number;
	/** Resends after no answer, a 5xx or request_in_progress, with the same Idempotency-Key; default 2. */
	retries?: number;
	fetch?: typeof fetch;
}

export declare class Client {
	constructor(baseURL: string, apiKey?: string, options?: ClientOptions);
	readonly baseURL: string;
	apiKey: string;
	timeoutMs: number;
	retries: number;

	request(method: string, path: string, body?: unknown, opts?: CallOptions): Promise<{ status: number; body: any }>;

	claim(key: string, req?: { payload?: unknown; payload_hash?: string; trigger_source?: string; lease_seconds?: number; meta?: Meta }, opts?: CallOptions): Promise<Claim>;
	heartbeat(key: string, lease_owner: string, version: number, req?: { lease_seconds?: number; meta?: Meta }, opts?: CallOptions): Promise<Lease>;
	transition(key: string, lease_owner: string, version: number, to: 'completed' | 'failed_retryable' | 'failed_terminal', req?: { result?: unknown; meta?: Meta }, opts?: CallOptions): Promise<Transition>;
	run(key: string, opts?: CallOptions): Promise<Run>;
	events(key: string, page?: { after?: number; limit?: number }, opts?: CallOptions): Promise<{ events: Event[]; next_after: number }>;
	validate(key: string, lease_owner: string, version: number, action_type: string, output: unknown, req?: { meta?: Meta }, opts?: CallOptions): Promise<Validation>;
	reportFailure(key: string, lease_owner: string, version: number, failureClass: FailureClass, req?: { detail?: string; retry_after_ms?: number; meta?: Meta }, opts?: CallOptions): Promise<FailureDecision>;
	explain(key: string, opts?: CallOptions): Promise<Explanation>;
	approvals(key: string, opts?: CallOptions): Promise<ApprovalStatus[]>;
	approvalStatus(key: string, approvalId: string, opts?: CallOptions): Promise<ApprovalStatus>;
	/** Pending approvals of every run, newest first, one keyset page (an operator key); next_after '' on the last page. */
	listApprovals(page?: { undecidable?: boolean; after?: string; limit?: number }, opts?: CallOptions): Promise<{ approvals: PendingApproval[]; next_after: string }>;

	queueEffect(key: string, lease_owner: string, version: number, action_type: string, target: string, req?: { payload?: unknown; effect_id?: string; gate?: 'none' | 'approve_by_exception' | 'act_with_window' | 'approve_before_act'; meta?: Meta }, opts?: CallOptions): Promise<QueuedEffect>;
	cancelEffect(id: string, req: { reason: string; lease_owner?: string }, opts?: CallOptions): Promise<Effect>;
	claimEffect(types: Iterable<string>, req?: { lease_seconds?: number }, opts?: CallOptions): Promise<WorkerEffect | null>;
	completeEffect(id: string, lease_owner: string, req?: { provider_id?: string }, opts?: CallOptions): Promise<Effect>;
	failEffect(id: string, lease_owner: string, req: { retryable: boolean; failureClass?: string; retry_after_ms?: number }, opts?: CallOptions): Promise<Effect>;
	unknownEffect(id: string, lease_owner: string, req?: { failureClass?: string }, opts?: CallOptions): Promise<Effect>;

	ledger(key: string, opts?: CallOptions): Promise<Ledger>;
	saveLedger(key: string, lease_owner: string, ledger: Ledger, opts?: CallOptions): Promise<number>;
	ledgerSchema(opts?: CallOptions): Promise<Record<string, unknown>>;
	plan(key: string, effectId: string, lease_owner: string, req: PlanRequest, opts?: CallOptions): Promise<Plan>;
	confirm(key: string, effectId: string, lease_owner: string, receipt: string, req?: { result?: unknown }, opts?: CallOptions): Promise<void>;
	reconcile(key: string, effectId: string, lease_owner: string, req: { found?: string[]; undetermined?: boolean }, opts?: CallOptions): Promise<'cleared' | 'confirmed' | 'unknown'>;
	resume(key: string, opts?: CallOptions): Promise<Resume>;
	recordToolCall(key: string, call: ToolCall, opts?: CallOptions): Promise<void>;

	keepLease(claim: Claim, options: { lease_seconds: number; intervalMs?: number }): LeaseKeeper;
	withLease<T>(claim: Claim, options: { lease_seconds: number; intervalMs?: number }, fn: (lease: LeaseKeeper) => Promise<T>): Promise<T>;
}

/** Heartbeats a run until stop() or the lease is lost; then signal is aborted with the loss. */
export declare class LeaseKeeper {
	readonly key: string;
	readonly lease_owner: string;
	readonly version: number;
	readonly lease_seconds: number;
	readonly intervalMs: number;
	readonly beats: number;
	readonly error: APIError | null;
	readonly last: Lease | null;
	readonly signal: AbortSignal;
	readonly lost: boolean;
	/** Throws the loss a heartbeat found; reads no more than the last heartbeat learnt. */
	check(): void;
	/** A heartbeat now: resolves to the renewed lease or throws the loss. Await it right before acting. */
	verify(): Promise<Lease>;
	stop(): void;
}
