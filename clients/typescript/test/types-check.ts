// Compiled (never run) by `tsc --noEmit`: the declarations in index.d.ts describe a usable
// API. A wrong type here, or a declaration that does not parse, fails the test command.
import { Client, LeaseLostError, ReconcileFirstError, APIError, hashInput, RejectedError, ApprovalPendingError, NeedsPersonError, type AgentRun, type StepCall, type StepResult, type Claim, type Ledger, type Plan, type PendingApproval } from '../index.js';

async function agent(c: Client): Promise<string> {
	const claim: Claim = await c.claim('report-1', { payload: { week: 48 }, lease_seconds: 30 });
	if (!claim.claimed) return claim.state;
	return c.withLease(claim, { lease_seconds: 30 }, async (lease) => {
		const r = await c.resume(claim.key, { signal: lease.signal });
		if (r.verdict === 'reconcile') {
			for (const item of r.reconcile) await c.reconcile(claim.key, item.effect_id, claim.lease_owner, { found: [] });
		}
		const l: Ledger = { goal: 'g', invariants: [], completed: [], pending: ['a'], next_allowed_action: 'a', checkpoint_version: 1 };
		const cp: number = await c.saveLedger(claim.key, claim.lease_owner, l, { idempotencyKey: claim.key + '/cp1' });
		let plan: Plan;
		try {
			plan = await c.plan(claim.key, 'e1', claim.lease_owner, { action: 'create_doc', target: 'docs', input_hash: hashInput({ a: 1 }) });
		} catch (e) {
			if (e instanceof ReconcileFirstError || e instanceof LeaseLostError) return e.code;
			if (e instanceof APIError) return String(e.status);
			throw e;
		}
		if (plan.approval) return plan.approval.approve_url;
		if (plan.execute) await c.confirm(claim.key, 'e1', claim.lease_owner, 'doc://1', { result: { ok: true } });
		lease.check();
		const t = await c.transition(claim.key, claim.lease_owner, claim.version, 'completed');
		return `${t.state} ${cp} ${plan.receipt}`;
	});
}

async function giveUp(c: Client, claim: Claim): Promise<string> {
	const t = await c.transition(claim.key, claim.lease_owner, claim.version, 'failed_terminal', { result: { reason: 'invalid_model_output' }, alert: 'invalid model output after 2 repairs' });
	return t.state;
}

async function stuck(op: Client): Promise<string[]> {
	const out: string[] = [];
	let after = '';
	do {
		const page: { approvals: PendingApproval[]; next_after: string } = await op.listApprovals({ undecidable: true, limit: 100, after });
		for (const a of page.approvals) out.push(`${a.key} ${a.approver_roles.join(',')} ${a.undecidable_since?.toISOString() ?? ''} ${a.expires_at.getTime()}`);
		after = page.next_after;
	} while (after);
	return out;
}

void agent;
void stuck;

async function steps(c: Client): Promise<string> {
	try {
		return await c.withRun('onboard-1', { customer: 'alice' }, { steps: ['draft', 'share'], lease_seconds: 30, waitApprovalMs: 60_000 }, async (run: AgentRun) => {
			if (run.finished) return String(run.result);
			const doc: StepResult = await run.step('draft', 'create_doc', 'docs', { title: 't' }, async (s: StepCall) => `doc-${s.idempotency_key}`, { lookup: async () => [] });
			await run.step('share', 'share_doc', 'team', { doc: doc.receipt }, async () => 'share-1', { lookup: async () => null });
			await run.complete({ doc: doc.receipt });
			return doc.receipt;
		});
	} catch (e) {
		if (e instanceof RejectedError) return e.reason;
		if (e instanceof ApprovalPendingError) return e.console_url;
		if (e instanceof NeedsPersonError) return e.effect_id;
		throw e;
	}
}

void steps;
