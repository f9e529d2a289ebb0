// The client of airlock's HTTP API: fetch only, no dependencies.
import { randomBytes } from 'node:crypto';
import { hashInput } from './canonical.js';
import { APIError, ApprovalNotFoundError, LeaseLifetimeExceededError, LeaseLostError, TransportError, VersionConflictError, errorFor } from './errors.js';
import { AgentRun } from './steps.js';

const RETRY_STATUSES = new Set([500, 502, 503, 504]);

/** newIdempotencyKey is a fresh random Idempotency-Key (128 bits, hex). */
export function newIdempotencyKey() {
	return randomBytes(16).toString('hex');
}

const enc = encodeURIComponent;
const runPath = (key, ...more) => '/v1/runs/' + [key, ...more].map(enc).join('/');
const effectPath = (id, ...more) => '/v1/effects/' + [id, ...more].map(enc).join('/');

/** put sets d[k] = v unless v is undefined or null. */
function put(d, k, v) {
	if (v !== undefined && v !== null) d[k] = v;
	return d;
}

const time = (s) => (s ? new Date(s) : null);

function sleep(ms, signal) {
	return new Promise((resolve, reject) => {
		if (signal?.aborted) return reject(signal.reason);
		const t = setTimeout(resolve, ms);
		signal?.addEventListener('abort', () => {
			clearTimeout(t);
			reject(signal.reason);
		}, { once: true });
	});
}

function claimOf(d) {
	return { ...d, claimed: !!d.claimed, reclaimed: !!d.reclaimed, lease_owner: d.lease_owner ?? '', lease_expires_at: time(d.lease_expires_at), raw: d };
}

function approvalOf(d) {
	return { id: d.approval_id ?? '', approve_url: d.approve_url ?? '', expires_at: time(d.expires_at), state: d.state ?? '', version: d.version ?? 0, raw: d };
}

function pendingApprovalOf(d) {
	return {
		...d,
		approver_roles: d.approver_roles ?? [],
		approver_subjects: d.approver_subjects ?? [],
		escalation_roles: d.escalation_roles ?? [],
		escalated_at: time(d.escalated_at),
		warned_at: time(d.warned_at),
		undecidable_since: time(d.undecidable_since),
		created_at: time(d.created_at),
		expires_at: time(d.expires_at),
		raw: d,
	};
}

function ledgerBody(key, l) {
	return {
		run_id: l.run_id || key,
		goal: l.goal ?? '',
		invariants: [...(l.invariants ?? [])],
		completed: (l.completed ?? []).map((s) => ({ step: s.step, evidence: s.evidence })),
		pending: [...(l.pending ?? [])],
		next_allowed_action: l.next_allowed_action ?? '',
		checkpoint_version: l.checkpoint_version ?? 0,
	};
}

/**
 * Client calls one airlock server.
 *
 * Every mutating call sends an Idempotency-Key, the same on each of its retries (after
 * no answer, a 5xx or 409 request_in_progress; `retries` times, pauses growing from
 * 200 ms, at least the answer's Retry-After, at most 5 s): airlock answers a retry of a
 * request that already committed from its record instead of running it again. Pass
 * `{idempotencyKey}` to pin it (derive it from the run key and the step's name), and
 * `{signal}` to abort a call.
 */
export class Client {
	constructor(baseURL, apiKey = '', { timeoutMs = 30000, retries = 2, fetch: f = globalThis.fetch } = {}) {
		this.baseURL = baseURL.replace(/\/+$/, '');
		this.apiKey = apiKey;
		this.timeoutMs = timeoutMs;
		this.retries = retries;
		this.fetch = f;
	}

	async #once(method, path, data, idem, signal) {
		const headers = { Accept: 'application/json' };
		if (data !== undefined) headers['Content-Type'] = 'application/json';
		if (this.apiKey) headers.Authorization = 'Bearer ' + this.apiKey;
		if (idem) headers['Idempotency-Key'] = idem;
		const timeout = AbortSignal.timeout(this.timeoutMs);
		const sig = signal ? AbortSignal.any([signal, timeout]) : timeout;
		let res, text;
		try {
			res = await this.fetch(this.baseURL + path, { method, headers, body: data, signal: sig });
			text = await res.text();
		} catch (e) {
			if (signal?.aborted) throw signal.reason;
			throw new TransportError(`airlock: ${method} ${path}: ${e?.cause?.code ?? e?.message ?? e}`, { cause: e });
		}
		let body = null;
		if (text !== '') {
			try {
				body = JSON.parse(text);
			} catch {
				body = text;
			}
		}
		return { status: res.status, body, headers: res.headers };
	}

	/** request sends one request (with retries) and returns {status, body} of a 2xx answer;
	 * it throws the APIError subclass of any other answer's code, or TransportError. */
	async request(method, path, body, { idempotencyKey, signal } = {}) {
		const data = body === undefined ? undefined : JSON.stringify(body);
		const idem = method === 'GET' ? '' : idempotencyKey || newIdempotencyKey();
		for (let attempt = 0; ; attempt++) {
			let a;
			try {
				a = await this.#once(method, path, data, idem, signal);
			} catch (e) {
				if (!(e instanceof TransportError) || attempt >= this.retries) throw e;
			}
			let retryAfter = 0;
			if (a) {
				if (a.status >= 200 && a.status <= 299) return { status: a.status, body: a.body };
				retryAfter = Number.parseInt(a.headers.get('retry-after') ?? '', 10) || 0;
				const err = errorFor(a.status, a.body, retryAfter);
				const retryable = RETRY_STATUSES.has(a.status) || err.code === 'request_in_progress';
				if (!retryable || attempt >= this.retries) throw err;
			}
			await sleep(Math.min(Math.max(200 * 2 ** attempt, retryAfter * 1000), 5000), signal);
		}
	}

	#post(path, body, opts) {
		return this.request('POST', path, body, opts);
	}

	// --- runs -----------------------------------------------------------------

	/** claim claims a key: claimed (201), or not (200). Give payload (hashed by airlock) or
	 * payload_hash. A different payload under the same key throws PayloadMismatchError. */
	async claim(key, { payload, payload_hash, trigger_source, lease_seconds, meta } = {}, opts) {
		const body = { key };
		put(body, 'payload', payload);
		put(body, 'payload_hash', payload_hash);
		put(body, 'trigger_source', trigger_source);
		put(body, 'lease_seconds', lease_seconds);
		put(body, 'meta', meta);
		return claimOf((await this.#post('/v1/runs/claim', body, opts)).body);
	}

	/** heartbeat extends the lease; LeaseLostError means this process no longer owns the run. */
	async heartbeat(key, lease_owner, version, { lease_seconds, meta } = {}, opts) {
		const body = put(put({ lease_owner, version }, 'lease_seconds', lease_seconds), 'meta', meta);
		const d = (await this.#post(runPath(key, 'heartbeat'), body, opts)).body;
		return { key: d.key, version: d.version, expires_at: time(d.lease_expires_at), started_at: time(d.lease_started_at), raw: d };
	}

	/** transition moves the run (compare-and-set on lease owner and version). `alert` (a
	 * reason, ≤ 200 characters; only with to 'failed_terminal', else InvalidFieldError)
	 * raises an alert workflow_gave_up with that reason: a client that gives up tells a person. */
	async transition(key, lease_owner, version, to, { result, alert, meta } = {}, opts) {
		const body = put(put(put({ lease_owner, version, to }, 'result', result), 'alert', alert), 'meta', meta);
		return (await this.#post(runPath(key, 'transition'), body, opts)).body;
	}

	async run(key, opts) {
		return (await this.request('GET', runPath(key), undefined, opts)).body;
	}

	/** events returns the run's events after an event id, and the `after` of the next page (0: last page). */
	async events(key, { after = 0, limit = 0 } = {}, opts) {
		const q = new URLSearchParams();
		if (after > 0) q.set('after', String(after));
		if (limit > 0) q.set('limit', String(limit));
		const qs = q.size ? '?' + q : '';
		const d = (await this.request('GET', runPath(key, 'events') + qs, undefined, opts)).body;
		return { events: d.events ?? [], next_after: d.next_after ?? 0 };
	}

	async validate(key, lease_owner, version, action_type, output, { meta } = {}, opts) {
		const body = put({ lease_owner, version, action_type, output }, 'meta', meta);
		return (await this.#post(runPath(key, 'validate'), body, opts)).body;
	}

	/** reportFailure reports a failure of a class and returns the policy's decision;
	 * retry_after_ms is in milliseconds (setTimeout's unit). */
	async reportFailure(key, lease_owner, version, failureClass, { detail, retry_after_ms, meta } = {}, opts) {
		const body = { lease_owner, version, class: failureClass };
		put(body, 'detail', detail);
		put(body, 'retry_after_ms', retry_after_ms);
		put(body, 'meta', meta);
		return (await this.#post(runPath(key, 'failures'), body, opts)).body;
	}

	async explain(key, opts) {
		return (await this.request('GET', runPath(key, 'explain'), undefined, opts)).body;
	}

	/** approvals lists the run's approvals with their status (from its explanation). */
	async approvals(key, opts) {
		return (await this.explain(key, opts)).approved?.approvals ?? [];
	}

	/** approvalStatus is one approval of the run: status pending, approved, rejected, expired, cancelled or window_closed. */
	async approvalStatus(key, approvalId, opts) {
		const a = (await this.approvals(key, opts)).find((x) => x.id === approvalId);
		if (!a) throw new ApprovalNotFoundError(404, 'approval_not_found', `run ${key} has no approval ${approvalId}`);
		return a;
	}

	/** listApprovals lists pending approvals of every run, newest first (GET /v1/approvals, an
	 * operator key); `undecidable` keeps those nobody known can decide. One keyset page of at
	 * most `limit` (0: the server's 50) after the cursor `after`; next_after is '' on the last. */
	async listApprovals({ undecidable = false, after = '', limit = 0 } = {}, opts) {
		const q = new URLSearchParams();
		if (undecidable) q.set('undecidable', 'true');
		if (limit) q.set('limit', String(limit));
		if (after) q.set('after', after);
		const qs = q.size ? '?' + q : '';
		const d = (await this.request('GET', '/v1/approvals' + qs, undefined, opts)).body;
		return { approvals: (d.approvals ?? []).map(pendingApprovalOf), next_after: d.next_after ?? '' };
	}

	// --- effects --------------------------------------------------------------

	/** queueEffect hands an effect to airlock's outbox; a gated type answers {approval} instead of {effect}. */
	async queueEffect(key, lease_owner, version, action_type, target, { payload, effect_id, gate, meta } = {}, opts) {
		const body = { lease_owner, version, action_type, target };
		put(body, 'payload', payload);
		put(body, 'effect_id', effect_id);
		put(body, 'gate', gate);
		put(body, 'meta', meta);
		const { status, body: d } = await this.#post(runPath(key, 'effects'), body, opts);
		if (status === 202) return { created: false, version: d.version, effect: null, approval: approvalOf(d), cancel_url: '', not_before: null, raw: d };
		return { created: !!d.created, version: d.version, effect: d.effect ?? null, approval: null, cancel_url: d.cancel_url ?? '', not_before: time(d.not_before), raw: d };
	}

	async cancelEffect(id, { reason, lease_owner } = {}, opts) {
		return (await this.#post(effectPath(id, 'cancel'), put({ reason }, 'lease_owner', lease_owner), opts)).body;
	}

	/** claimEffect leases one due effect of these types to an external worker, or returns null. */
	async claimEffect(types, { lease_seconds } = {}, opts) {
		const { status, body } = await this.#post('/v1/effects/claim', put({ types: [...types] }, 'lease_seconds', lease_seconds), opts);
		return status === 204 || !body ? null : body;
	}

	async completeEffect(id, lease_owner, { provider_id } = {}, opts) {
		return (await this.#post(effectPath(id, 'complete'), put({ lease_owner }, 'provider_id', provider_id), opts)).body;
	}

	async failEffect(id, lease_owner, { retryable, failureClass, retry_after_ms } = {}, opts) {
		const body = put(put({ lease_owner, retryable: !!retryable }, 'class', failureClass), 'retry_after_ms', retry_after_ms);
		return (await this.#post(effectPath(id, 'fail'), body, opts)).body;
	}

	async unknownEffect(id, lease_owner, { failureClass } = {}, opts) {
		return (await this.#post(effectPath(id, 'unknown'), put({ lease_owner }, 'class', failureClass), opts)).body;
	}

	// --- the work ledger ------------------------------------------------------

	async ledger(key, opts) {
		return (await this.request('GET', runPath(key, 'ledger'), undefined, opts)).body;
	}

	/** saveLedger stores the next checkpoint (compare-and-set on checkpoint_version) and returns its number. */
	async saveLedger(key, lease_owner, ledger, opts) {
		const d = (await this.request('PUT', runPath(key, 'ledger'), { lease_owner, ledger: ledgerBody(key, ledger) }, opts)).body;
		return d.checkpoint_version;
	}

	async ledgerSchema(opts) {
		return (await this.request('GET', '/v1/ledger.schema.json', undefined, opts)).body;
	}

	/**
	 * plan records the intent before performing an effect. `input` is what the effect will
	 * do (any JSON): a gated action's approval card shows it to the person who decides and
	 * the approval is bound to it (its hash is computed when input_hash is not given;
	 * airlock's privacy allow-list and payload retention apply). Give input_hash alone to
	 * keep the input to yourself. Exactly one of execute, confirmed (performed before:
	 * receipt, '' when an operator resolved it as sent without the provider's id) and
	 * approval holds.
	 */
	async plan(key, effectId, lease_owner, { action, target, input_hash, input, meta }, opts) {
		if (input !== undefined && !input_hash) input_hash = hashInput(input);
		if (!input_hash) throw new TypeError('plan: give input, or its input_hash');
		const body = put(put({ lease_owner, action, target, input_hash }, 'input', input), 'meta', meta);
		const { status, body: d } = await this.#post(runPath(key, 'ledger', 'effects', effectId, 'plan'), body, opts);
		if (status === 202) return { execute: false, confirmed: false, receipt: '', result: undefined, approval: approvalOf(d), raw: d };
		const execute = !!d.execute;
		const confirmed = !!d.confirmed || (!execute && !!d.receipt);
		if (!execute && !confirmed) throw new APIError(status, '', `plan ${effectId}: neither execute nor confirmed in the answer`);
		return { execute, confirmed, receipt: d.receipt ?? '', result: d.result, approval: null, raw: d };
	}

	/** confirm records that the planned effect happened, with the external system's id as receipt. */
	async confirm(key, effectId, lease_owner, receipt, { result } = {}, opts) {
		await this.#post(runPath(key, 'ledger', 'effects', effectId, 'confirm'), put({ lease_owner, receipt }, 'result', result), opts);
	}

	/** reconcile reports what a search found: cleared (nothing), confirmed (one) or unknown. */
	async reconcile(key, effectId, lease_owner, { found, undetermined } = {}, opts) {
		const body = undetermined ? { lease_owner, undetermined: true } : { lease_owner, found: [...(found ?? [])] };
		return (await this.#post(runPath(key, 'ledger', 'effects', effectId, 'reconcile'), body, opts)).body.status;
	}

	async resume(key, opts) {
		const d = (await this.request('GET', runPath(key, 'resume'), undefined, opts)).body;
		return { verdict: d.verdict, next_allowed_action: d.next_allowed_action ?? '', checkpoint_version: d.checkpoint_version ?? 0, reconcile: d.reconcile ?? [], reasons: d.reasons ?? [], raw: d };
	}

	async recordToolCall(key, call, opts) {
		await this.#post(runPath(key, 'ledger', 'calls'), call, opts);
	}

	// --- the step API -----------------------------------------------------------

	/**
	 * openRun claims the run `key` and keeps it: an AgentRun whose step() performs each side
	 * effect at most once (see steps.js). A live lease of another process is waited out for
	 * up to waitLeaseMs (default: the lease + 5 s), then RunBusyError; a run waiting for a
	 * person is waited on for up to waitApprovalMs (default 0), then ApprovalPendingError; a
	 * rejected run throws RejectedError with the approver's reason; a finished run opens
	 * with `finished` set.
	 */
	async openRun(key, payload, options = {}) {
		return new AgentRun(this, key, payload, options).open();
	}

	/** withRun opens the run, calls fn(run) and closes it (stops the heartbeats) however fn ends. */
	async withRun(key, payload, options, fn) {
		const run = await this.openRun(key, payload, options);
		try {
			return await fn(run);
		} finally {
			run.close();
		}
	}

	// --- leases ---------------------------------------------------------------

	/** keepLease heartbeats a claimed run until stop() or the lease is lost (see LeaseKeeper). */
	keepLease(claim, { lease_seconds, intervalMs } = {}) {
		if (!claim.claimed) throw new TypeError(`keepLease: run ${claim.key} was not claimed by this process`);
		return new LeaseKeeper(this, claim.key, claim.lease_owner, claim.version, lease_seconds, intervalMs);
	}

	/** withLease runs fn(lease) while the lease is kept; fn's calls should pass {signal: lease.signal}. */
	async withLease(claim, options, fn) {
		const lease = this.keepLease(claim, options);
		try {
			return await fn(lease);
		} finally {
			lease.stop();
		}
	}
}

/**
 * LeaseKeeper heartbeats a run every intervalMs (a third of the lease by default). A
 * heartbeat answered lease_lost, version_conflict or lease_lifetime_exceeded stops it and
 * aborts `signal` with that error: pass {signal: lease.signal} to the calls made under the
 * lease, and check() before acting. Other failures are retried at the next tick.
 */
export class LeaseKeeper {
	#ctl = new AbortController();
	#timer;
	#busy = false;

	constructor(client, key, lease_owner, version, lease_seconds, intervalMs) {
		if (!(lease_seconds >= 1)) throw new RangeError('lease_seconds must be at least 1');
		this.key = key;
		this.lease_owner = lease_owner;
		this.version = version;
		this.lease_seconds = lease_seconds;
		this.intervalMs = intervalMs ?? (lease_seconds * 1000) / 3;
		this.beats = 0;
		this.error = null;
		this.last = null;
		// One try per tick (ticks do not overlap: a slow answer skips the next ones), waiting
		// at most the lease: an answer after the lease ended would be moot anyway.
		this.client = new Client(client.baseURL, client.apiKey, { retries: 0, timeoutMs: lease_seconds * 1000, fetch: client.fetch });
		this.#timer = setInterval(() => this.#beat(), this.intervalMs);
	}

	/** signal is aborted (with the loss's error) when the lease is lost, and when stopped. */
	get signal() {
		return this.#ctl.signal;
	}

	get lost() {
		return this.error !== null;
	}

	async #beat() {
		if (this.#busy || this.#ctl.signal.aborted) return;
		this.#busy = true;
		try {
			this.last = await this.client.heartbeat(this.key, this.lease_owner, this.version, { lease_seconds: this.lease_seconds }, { signal: this.#ctl.signal });
			this.beats++;
		} catch (e) {
			this.#lose(e);
		} finally {
			this.#busy = false;
		}
	}

	#lose(e) {
		if (e instanceof LeaseLostError || e instanceof VersionConflictError || e instanceof LeaseLifetimeExceededError) {
			this.error = e;
			clearInterval(this.#timer);
			this.#ctl.abort(e);
		}
	}

	/**
	 * check throws the lease's loss (LeaseLostError, …) if it was lost. It reads only what
	 * the last heartbeat learnt: after a pause it can pass while the lease is already gone.
	 * Right before acting, await verify().
	 */
	check() {
		if (this.error) throw this.error;
	}

	/**
	 * verify asks airlock now whether this process still holds the lease: a heartbeat, which
	 * also renews it. It resolves to the renewed lease, or throws the loss (and marks the
	 * lease lost) or the request's error; either way, do not act. Await it right before each
	 * external effect, after plan answered execute.
	 */
	async verify() {
		this.check();
		try {
			this.last = await this.client.heartbeat(this.key, this.lease_owner, this.version, { lease_seconds: this.lease_seconds });
		} catch (e) {
			this.#lose(e);
			throw e;
		}
		this.beats++;
		return this.last;
	}

	stop() {
		clearInterval(this.#timer);
		if (!this.#ctl.signal.aborted) this.#ctl.abort(new Error('lease keeper stopped'));
	}
}
