// The step API: a run handle (Client.openRun) and one call per side effect (AgentRun.step),
// with the work ledger's bookkeeping done for the agent.
import { AirlockError, EffectRejectedError, LedgerNotFoundError, ReconcileFirstError } from './errors.js';

/** The ledger's next_allowed_action once every declared step is done. */
export const DONE = 'done';

const NO_RECEIPT = "resolved as sent by an operator, without the provider's id";

/**
 * A person rejected a gated effect: reason is what the approver wrote, rejected_by who,
 * effect_id and approval_id which. Under approval.on_reject: end_run the run is over; under
 * skip_effect only that step is (recorded as settled without performing it; the next step
 * works). The server's effect_rejected answer is thrown as EffectRejectedError, an
 * APIError that is also `instanceof RejectedError`, its fields read from the details.
 */
export class RejectedError extends AirlockError {
	constructor(reason, rejected_by = '', effect_id = '', approval_id = '') {
		super(`airlock: rejected by ${rejected_by || 'a person'}: ${reason || '(no reason given)'}`);
		this.name = 'RejectedError';
		Object.assign(this, { reason, rejected_by, effect_id, approval_id });
	}

	static [Symbol.hasInstance](x) {
		return Function.prototype[Symbol.hasInstance].call(this, x) || (this === RejectedError && x instanceof EffectRejectedError);
	}
}

/** airlock cannot tell whether effect_id happened (or the run is parked): a person decides; do not act. */
export class NeedsPersonError extends AirlockError {
	constructor(effect_id, why) {
		super(`airlock: ${effect_id || 'the run'} needs a person: ${why}`);
		this.name = 'NeedsPersonError';
		Object.assign(this, { effect_id, why });
	}
}

/** A gated step waits for a person and the caller chose not to wait (longer). */
export class ApprovalPendingError extends AirlockError {
	constructor(effect_id, approval_id, approve_url = '', console_url = '') {
		super(`airlock: ${effect_id || 'the run'} waits for approval ${approval_id}${console_url ? ` (${console_url})` : ''}`);
		this.name = 'ApprovalPendingError';
		Object.assign(this, { effect_id, approval_id, approve_url, console_url, status: 'pending' });
	}
}

/** Another process holds the run's lease beyond the wait allowed. */
export class RunBusyError extends AirlockError {
	constructor(key, lease_expires_at) {
		super(`airlock: run ${key} is held by another process until ${lease_expires_at?.toISOString?.() ?? lease_expires_at}`);
		this.name = 'RunBusyError';
		Object.assign(this, { key, lease_expires_at });
	}
}

/** A step on a run that is already finished. */
export class RunFinishedError extends AirlockError {
	constructor(key, state, result) {
		super(`airlock: run ${key} is ${state}`);
		this.name = 'RunFinishedError';
		Object.assign(this, { key, state, result });
	}
}

const sleep = (ms) => new Promise((r) => setTimeout(r, Math.max(ms, 0)));

/**
 * AgentRun is a claimed run, kept: heartbeats in the background, key, lease owner and
 * version carried for every call. Get one from Client.openRun; close() it (or complete()
 * it) at the end. `signal` is aborted when the lease is lost: pass it to long work.
 */
export class AgentRun {
	constructor(client, key, payload, { goal, steps = [], invariants = [], lease_seconds = 30, waitLeaseMs, waitApprovalMs = 0, pollMs = 1000, meta } = {}) {
		Object.assign(this, { client, key, payload, goal: goal || `run ${key}`, steps: [...steps], invariants: [...invariants], lease_seconds, meta });
		this.waitLeaseMs = waitLeaseMs ?? (lease_seconds + 5) * 1000;
		this.waitApprovalMs = waitApprovalMs;
		this.pollMs = pollMs;
		this.lease_owner = '';
		this.version = 0;
		this.state = '';
		this.result = undefined;
		this.finished = false;
		this.reclaimed = false;
		this.lease = null;
		this.ledger = null;
	}

	/** The lease's signal (aborted on its loss), or an aborted one while no lease is held. */
	get signal() {
		return this.lease ? this.lease.signal : AbortSignal.abort(new Error('no lease held'));
	}

	async open() {
		const deadline = Date.now() + this.waitLeaseMs;
		for (;;) {
			const cl = await this.client.claim(this.key, { payload: this.payload, lease_seconds: this.lease_seconds, meta: this.meta });
			this.state = cl.state;
			this.version = cl.version;
			if (cl.claimed) {
				this.lease_owner = cl.lease_owner;
				this.reclaimed = cl.reclaimed;
				break;
			}
			if (cl.state === 'processing') {
				const left = deadline - Date.now();
				if (left <= 0 || !cl.lease_expires_at) throw new RunBusyError(this.key, cl.lease_expires_at);
				await sleep(Math.max(Math.min(cl.lease_expires_at.getTime() - Date.now() + 100, left), 50));
				continue;
			}
			if (cl.state === 'rejected') {
				const r = cl.result && typeof cl.result === 'object' ? cl.result : {};
				throw new RejectedError(...['reason', 'rejected_by', 'effect_id', 'approval_id'].map((f) => String(r[f] ?? '')));
			}
			if (cl.state === 'completed' || cl.state === 'failed_terminal') {
				this.finished = true;
				this.result = cl.result;
				return this;
			}
			if (cl.state === 'awaiting_human') {
				const pending = (await this.client.approvals(this.key)).filter((a) => a.status === 'pending');
				if (!pending.length) {
					const run = await this.client.run(this.key);
					throw new NeedsPersonError('', `the run is parked for a person (${run.park_reason || 'awaiting_human'})`);
				}
				const a = pending[pending.length - 1];
				await this.#await(a.effect_id, a.id, '', this.waitApprovalMs);
				continue;
			}
			throw new NeedsPersonError('', `the run is ${cl.state}`);
		}
		this.lease?.stop();
		this.lease = this.client.keepLease({ claimed: true, key: this.key, lease_owner: this.lease_owner, version: this.version }, { lease_seconds: this.lease_seconds });
		try {
			this.ledger = await this.#ledger();
		} catch (e) {
			this.close(); // no heartbeats left running behind a failed open
			throw e;
		}
		return this;
	}

	async #ledger() {
		try {
			return await this.client.ledger(this.key);
		} catch (e) {
			if (!(e instanceof LedgerNotFoundError)) throw e;
			await this.client.saveLedger(this.key, this.lease_owner, {
				goal: this.goal, invariants: this.invariants, completed: [], pending: [...this.steps],
				next_allowed_action: this.steps[0] ?? 'start', checkpoint_version: 1,
			});
			return this.client.ledger(this.key);
		}
	}

	async #await(effect_id, approval_id, approve_url, waitMs) {
		this.lease?.stop(); // the run waits for a person: this process holds no lease now
		this.lease = null;
		const console_url = `${this.client.baseURL}/console/approvals/${encodeURIComponent(approval_id)}`;
		const deadline = Date.now() + waitMs;
		for (;;) {
			const st = await this.client.approvalStatus(this.key, approval_id);
			// Decided: the next claim and plan tell which way (a rejection ends the run, or
			// answers this effect effect_rejected), with the approver's reason.
			if (st.status === 'approved' || st.status === 'rejected') return;
			if (st.status !== 'pending') throw new NeedsPersonError(effect_id, `its approval ${approval_id} is ${st.status}`);
			const left = deadline - Date.now();
			if (left <= 0) throw new ApprovalPendingError(st.effect_id || effect_id, approval_id, approve_url, console_url);
			await sleep(Math.min(this.pollMs, left));
		}
	}

	async #reclaim() {
		await this.open();
		if (this.finished) throw new RunFinishedError(this.key, this.state, this.result);
	}

	async #check() {
		if (!this.lease) await this.#reclaim();
		this.lease.check();
	}

	/** A seam for crash tests (replaced to kill the process at a boundary). */
	static hook(point, call) {}

	/**
	 * step performs one external effect at most once, whatever crashed before. It plans
	 * effectId with `input` (a gated action's card shows it), calls perform(call) only when
	 * airlock answers execute — right after asking airlock that the lease is still held —
	 * and confirms with the receipt perform resolves to (a non-empty string). A step
	 * performed before is answered from airlock's record without calling perform; one
	 * planned by a process that died before confirming is looked up: lookup(call) resolves
	 * to the receipts of the matching records (none: perform; one: it happened; several, or
	 * null when the search cannot tell: NeedsPersonError). A gated step waits up to
	 * waitApprovalMs (default: the run's) for the decision, then ApprovalPendingError; a
	 * rejection throws RejectedError with the approver's reason. Then the ledger records
	 * the step, once even across restarts (compare-and-set on checkpoint_version). Under
	 * approval.on_reject: skip_effect a rejected step is recorded too, as settled without
	 * performing (evidence `rejected://<approval id>`), and the run goes on with the next step.
	 */
	async step(effectId, action, target, input, perform, { lookup, waitApprovalMs } = {}) {
		if (this.finished) throw new RunFinishedError(this.key, this.state, this.result);
		const call = { key: this.key, effect_id: effectId, action, target, input, idempotency_key: `${this.key}/${effectId}`, signal: undefined };
		const wait = waitApprovalMs ?? this.waitApprovalMs;
		for (let i = 0; i < 8; i++) {
			await this.#check();
			call.signal = this.lease.signal;
			let plan;
			try {
				plan = await this.client.plan(this.key, effectId, this.lease_owner, { action, target, input, meta: this.meta });
			} catch (e) {
				if (e instanceof EffectRejectedError) {
					// approval.on_reject: skip_effect: this step is settled without performing it,
					// and the run goes on.
					e.effect_id ||= effectId;
					await this.#record(effectId, e.approval_id ? `rejected://${e.approval_id}` : 'rejected');
					throw e;
				}
				if (!(e instanceof ReconcileFirstError)) throw e;
				if (!lookup) throw new NeedsPersonError(effectId, 'it was planned and never confirmed, and the step has no lookup to search the external system');
				const found = await lookup(call);
				if (found === null || found === undefined) {
					await this.client.reconcile(this.key, effectId, this.lease_owner, { undetermined: true });
					throw new NeedsPersonError(effectId, 'the lookup could not tell whether it happened');
				}
				const status = await this.client.reconcile(this.key, effectId, this.lease_owner, { found: [...found] });
				if (status === 'unknown') throw new NeedsPersonError(effectId, `the lookup found ${found.length} matching records`);
				continue; // cleared: plan again executes; confirmed: plan again answers the receipt
			}
			if (plan.approval) {
				await this.#await(effectId, plan.approval.id, plan.approval.approve_url, wait);
				await this.#reclaim();
				continue;
			}
			if (plan.confirmed) {
				await this.#record(effectId, plan.receipt);
				return { effect_id: effectId, receipt: plan.receipt, replayed: true, result: plan.result, confirmed: true };
			}
			await this.lease.verify();
			AgentRun.hook('before_perform', call);
			const receipt = await perform(call);
			if (typeof receipt !== 'string' || receipt === '') throw new TypeError(`step ${effectId}: perform must resolve to the effect's receipt (a non-empty string)`);
			AgentRun.hook('after_perform', call);
			await this.client.confirm(this.key, effectId, this.lease_owner, receipt);
			AgentRun.hook('after_confirm', call);
			await this.#record(effectId, receipt);
			return { effect_id: effectId, receipt, replayed: false, result: undefined, confirmed: true };
		}
		throw new NeedsPersonError(effectId, "airlock's answers did not settle (planned again and again)");
	}

	async #record(effectId, receipt) {
		const l = this.ledger;
		if (l.completed.some((s) => s.step === effectId)) return; // recorded before a crash: not again
		l.completed.push({ step: effectId, evidence: receipt || NO_RECEIPT });
		l.pending = l.pending.filter((p) => p !== effectId);
		l.next_allowed_action = l.pending[0] ?? (this.steps.length ? DONE : 'continue');
		l.checkpoint_version += 1;
		await this.client.saveLedger(this.key, this.lease_owner, l);
	}

	/** complete records the ledger done and moves the run to completed with `result`. */
	async complete(result) {
		if (this.finished) throw new RunFinishedError(this.key, this.state, this.result);
		await this.#check();
		const l = this.ledger;
		if (l.next_allowed_action !== DONE || l.pending.length) {
			l.pending = [];
			l.next_allowed_action = DONE;
			l.checkpoint_version += 1;
			await this.client.saveLedger(this.key, this.lease_owner, l);
		}
		const t = await this.client.transition(this.key, this.lease_owner, this.version, 'completed', { result });
		this.close();
		Object.assign(this, { finished: true, state: 'completed', result });
		return t;
	}

	/** close stops the heartbeats (the lease then lapses unless the run was completed). */
	close() {
		this.lease?.stop();
	}
}
