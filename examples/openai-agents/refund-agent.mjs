// A refund agent on the OpenAI Agents SDK for JavaScript (@openai/agents) whose
// side-effecting tool goes through airlock (the client in clients/typescript):
//
//  - needsApproval is answered by airlock's gate: the tool's call is planned in the run's
//    ledger; an action type with a gate (issue_refund: approve_before_act) answers with an
//    approval, and the SDK run pauses on it (an interruption). The agent saves the SDK's
//    RunState and exits 3. A person approves on airlock's page; the next start claims the
//    run again, sees the approval in airlock, approves the interruption and resumes: the
//    tool runs once.
//  - execution is wrapped in plan/confirm: the refund is planned before, performed, and
//    confirmed with the payment system's id after. An agent killed at any point and
//    started again asks airlock how to resume; an effect planned but never confirmed is
//    looked up in the payment system (by its effect id) and reconciled, never repeated
//    blindly, and a confirmed call answers its receipt instead of running again.
//
// The model: no model is reachable here, so the agent is pointed (OPENAI_BASE_URL) at a
// local OpenAI-compatible server answering scripted tool calls (scripted-model.mjs). With
// a real model, drop OPENAI_BASE_URL and set OPENAI_API_KEY.
//
//   node refund-agent.mjs --ticket T-1 --order A-1001 --payments ./payments
//
// Environment: AIRLOCK_URL, AIRLOCK_API_KEY (runs scope), OPENAI_BASE_URL, OPENAI_API_KEY.
// Exit status: 0 done (or already done), 2 stopped for a person, 3 waiting for an approval,
// 1 any other error. AGENT_CRASH_AT=before_refund, after_refund or before_confirm makes it
// SIGKILL itself at that point (the restart test).
import { Agent, RunState, run, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled, tool } from '@openai/agents';
import { Client, ReconcileFirstError, hashInput } from 'airlock-client';
import OpenAI from 'openai';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { z } from 'zod';

const { values: opt } = parseArgs({
	options: {
		ticket: { type: 'string' },
		order: { type: 'string' },
		payments: { type: 'string' },
		state: { type: 'string' }, // where a paused SDK run is kept (default: <payments>/../<ticket>.runstate.json)
		lease: { type: 'string', default: '5' },
		wait: { type: 'string', default: '60' },
	},
});
if (!opt.ticket || !opt.order || !opt.payments) {
	console.error('usage: refund-agent.mjs --ticket T --order O --payments DIR');
	process.exit(1);
}
const LEASE = Number(opt.lease);
const KEY = `refund-${opt.ticket}`;
const STATE_FILE = opt.state ?? join(opt.payments, '..', `${KEY}.runstate.json`);
const airlock = new Client(process.env.AIRLOCK_URL ?? 'http://127.0.0.1:8080', process.env.AIRLOCK_API_KEY ?? '');

const log = (msg, fields = {}) => console.log(JSON.stringify({ time: new Date().toISOString(), msg, ...fields }));
class Stop extends Error {}
class Wait extends Error {}

function crashPoint(point) {
	// SIGKILL runs no cleanup and flushes nothing, as a power cut or an OOM kill would.
	if (process.env.AGENT_CRASH_AT === point) process.kill(process.pid, 'SIGKILL');
}

// --- the payment system: a directory of {id, run_id, effect_id, order_id, amount_cents} ---
mkdirSync(opt.payments, { recursive: true });
const payments = {
	refund(effectId, order_id, amount_cents) {
		const p = { id: 'pay-' + randomBytes(6).toString('hex'), run_id: KEY, effect_id: effectId, order_id, amount_cents };
		const tmp = join(opt.payments, '.' + p.id);
		writeFileSync(tmp, JSON.stringify(p));
		renameSync(tmp, join(opt.payments, p.id + '.json'));
		return p;
	},
	search(runId, effectId) {
		return readdirSync(opt.payments)
			.filter((f) => f.endsWith('.json'))
			.map((f) => JSON.parse(readFileSync(join(opt.payments, f), 'utf8')))
			.filter((p) => p.run_id === runId && p.effect_id === effectId);
	},
};
// Searches by action type, for reconciliation: the receipts of what the system holds.
const searches = { issue_refund: (item) => payments.search(item.run_id, item.effect_id).map((p) => 'payment://' + p.id) };

// --- the run, held under a lease --------------------------------------------------------
const session = { claim: null, lease: null };

async function claimWhenFree() {
	const deadline = Date.now() + Number(opt.wait) * 1000;
	for (;;) {
		const cl = await airlock.claim(KEY, { payload: { ticket: opt.ticket, order: opt.order }, trigger_source: 'refund-agent', lease_seconds: LEASE });
		if (cl.claimed || cl.state !== 'processing') return cl;
		const pause = cl.lease_expires_at ? Math.max(cl.lease_expires_at - Date.now() + 100, 50) : 100;
		if (Date.now() + pause > deadline) throw new Stop('another process holds the run');
		log('lease held elsewhere; waiting', { retry_in_ms: pause });
		await new Promise((r) => setTimeout(r, pause));
	}
}

async function reconcile(r) {
	for (const item of r.reconcile) {
		const search = searches[item.action];
		if (!search) throw new Stop(`no search is known for ${item.action}`);
		const found = search(item);
		const status = await airlock.reconcile(KEY, item.effect_id, session.claim.lease_owner, { found });
		log('reconciled', { effect_id: item.effect_id, found, status });
	}
}

// --- tools --------------------------------------------------------------------------------

const lookupOrder = tool({
	name: 'lookup_order',
	description: 'Look up an order (read only).',
	parameters: z.object({ order_id: z.string() }),
	execute: async ({ order_id }) => JSON.stringify({ order_id, amount_cents: 4200, currency: 'EUR', status: 'delivered' }),
});

/**
 * airlockTool wraps a side-effecting tool: needsApproval plans the call in airlock (an
 * approval for a gated action type pauses the SDK run); execute performs it only when
 * airlock's plan says execute, and confirms it with the receipt; a call confirmed before
 * answers its receipt and is not performed again.
 */
function airlockTool({ name, description, parameters, action, target, perform }) {
	const plans = new Map(); // effect id -> the plan needsApproval got
	const effectOf = (args) => ({ effectId: `${name}-${hashInput(args).slice(0, 16)}`, input_hash: hashInput(args) });
	async function plan(args) {
		const { effectId, input_hash } = effectOf(args);
		for (let tries = 0; ; tries++) {
			try {
				// input: the approval card shows the person the call's arguments (order, amount).
				const p = await airlock.plan(KEY, effectId, session.claim.lease_owner, { action, target, input_hash, input: args }, { signal: session.lease?.signal });
				log('planned', { tool: name, effect_id: effectId, execute: p.execute, receipt: p.receipt, approval: p.approval?.id });
				return p;
			} catch (e) {
				// A call planned before a crash: look it up first, then plan again.
				if (!(e instanceof ReconcileFirstError) || tries > 0) throw e;
				await reconcile(await airlock.resume(KEY));
			}
		}
	}
	return tool({
		name,
		description,
		parameters,
		needsApproval: async (_ctx, args) => {
			const p = await plan(args);
			plans.set(effectOf(args).effectId, p);
			if (p.approval) {
				// approve_url is a bearer secret: it goes to the approvers, not into logs.
				console.error(`approval needed for ${name}: ${p.approval.approve_url}`);
				return true;
			}
			return false;
		},
		execute: async (args) => {
			const { effectId } = effectOf(args);
			let p = plans.get(effectId);
			plans.delete(effectId);
			if (!p || p.approval) p = await plan(args); // resumed after the approval: plan again, now approved
			if (p.approval) throw new Wait(`approval ${p.approval.id} is still pending`);
			if (!p.execute) {
				log('confirmed before; not repeating it', { tool: name, effect_id: effectId, receipt: p.receipt });
				return p.receipt;
			}
			crashPoint('before_refund');
			const receipt = await perform(effectId, args);
			crashPoint('after_refund');
			log('performed', { tool: name, effect_id: effectId, receipt });
			crashPoint('before_confirm');
			await airlock.confirm(KEY, effectId, session.claim.lease_owner, receipt, {}, { signal: session.lease?.signal });
			return receipt;
		},
	});
}

const issueRefund = airlockTool({
	name: 'issue_refund',
	description: "Refund an order to the customer's card.",
	parameters: z.object({ order_id: z.string(), amount_cents: z.number().int() }),
	action: 'issue_refund', // an action type of airlock's policy: connector worker, gate approve_before_act
	target: 'payments',
	perform: async (effectId, { order_id, amount_cents }) => 'payment://' + payments.refund(effectId, order_id, amount_cents).id,
});

const agent = new Agent({
	name: 'Refund desk',
	instructions: 'Look the order up, then refund it in full. Answer with the payment receipt.',
	model: 'scripted',
	tools: [lookupOrder, issueRefund],
});

// --- the flow -------------------------------------------------------------------------------

async function main() {
	setTracingDisabled(true);
	setOpenAIAPI('chat_completions');
	setDefaultOpenAIClient(new OpenAI({ apiKey: process.env.OPENAI_API_KEY ?? 'unused', baseURL: process.env.OPENAI_BASE_URL }));

	const cl = await claimWhenFree();
	if (!cl.claimed) {
		if (cl.state === 'completed') return log('already completed', { result: cl.result });
		if (cl.state === 'rejected') throw new Stop(`rejected by ${cl.result?.rejected_by || 'a person'}: ${cl.result?.reason || '(no reason given)'}`);
		const r = await airlock.resume(KEY);
		if (r.verdict === 'wait') throw new Wait(r.reasons.join('; '));
		throw new Stop(`the run is ${cl.state}: ${r.reasons.join('; ')}`);
	}
	session.claim = cl;
	log('claimed', { key: KEY, reclaimed: cl.reclaimed, version: cl.version });
	return airlock.withLease(cl, { lease_seconds: LEASE }, async (lease) => {
		session.lease = lease;
		let r = await airlock.resume(KEY);
		log('resume', { verdict: r.verdict, next_allowed_action: r.next_allowed_action, checkpoint_version: r.checkpoint_version });
		if (r.verdict === 'reconcile') {
			await reconcile(r);
			r = await airlock.resume(KEY);
		}
		if (r.verdict !== 'continue') throw new Stop(r.reasons.join('; '));
		let ledger;
		if (r.checkpoint_version === 0) {
			ledger = { goal: `Resolve ticket ${opt.ticket}`, invariants: ['Refund at most the order amount', 'No refund without approval'], completed: [], pending: ['resolve_ticket'], next_allowed_action: 'resolve_ticket', checkpoint_version: 1 };
			await airlock.saveLedger(KEY, cl.lease_owner, ledger);
		} else {
			ledger = await airlock.ledger(KEY);
		}
		if (ledger.next_allowed_action === 'resolve_ticket') {
			const answer = await resolveTicket();
			ledger.completed.push({ step: 'resolve_ticket', evidence: answer });
			ledger.pending = [];
			ledger.next_allowed_action = 'done';
			ledger.checkpoint_version++;
			await airlock.saveLedger(KEY, cl.lease_owner, ledger);
			log('ledger saved', { checkpoint_version: ledger.checkpoint_version });
		}
		lease.stop(); // a transition ends the lease
		const t = await airlock.transition(KEY, cl.lease_owner, cl.version, 'completed', { result: { answer: ledger.completed.at(-1).evidence } });
		log('run completed', { state: t.state, answer: ledger.completed.at(-1).evidence });
	});
}

/** resolveTicket runs the SDK agent, or resumes its paused run after an approval. */
async function resolveTicket() {
	let result;
	if (existsSync(STATE_FILE)) {
		const state = await RunState.fromString(agent, readFileSync(STATE_FILE, 'utf8'));
		rmSync(STATE_FILE); // resumed once: a later crash starts the conversation over
		for (const item of state.getInterruptions()) {
			const approval = JSON.parse(readFileSync(STATE_FILE + '.approvals', 'utf8'))[item.rawItem.callId];
			const st = await airlock.approvalStatus(KEY, approval);
			log('approval', { tool: item.rawItem.name, approval_id: approval, status: st.status, approver: st.approver, reason: st.reason });
			if (st.status === 'approved') state.approve(item);
			else if (st.status === 'pending') throw new Wait(`approval ${approval} is pending`);
			else if (st.status === 'rejected') throw new Stop(`rejected by ${st.approver || 'a person'}: ${st.reason || '(no reason given)'}`);
			else state.reject(item);
		}
		result = await run(agent, state);
	} else {
		result = await run(agent, `Ticket ${opt.ticket}: please refund order ${opt.order}.`);
	}
	if (result.interruptions?.length) {
		// Paused on airlock's gate: keep the SDK's state and which approval each call waits for.
		const approvals = {};
		for (const item of result.interruptions) {
			const effectId = `${item.rawItem.name}-${hashInput(JSON.parse(item.rawItem.arguments)).slice(0, 16)}`;
			const a = (await airlock.approvals(KEY)).filter((x) => x.effect_id === effectId && x.status === 'pending').at(-1);
			approvals[item.rawItem.callId] = a?.id;
		}
		writeFileSync(STATE_FILE + '.approvals', JSON.stringify(approvals));
		writeFileSync(STATE_FILE, result.state.toString());
		throw new Wait('the run waits for a person’s approval');
	}
	return String(result.finalOutput);
}

try {
	await main();
	process.exit(0);
} catch (e) {
	if (e instanceof Wait) {
		log('waiting', { err: e.message });
		process.exit(3);
	}
	if (e instanceof Stop) {
		log('stopped', { err: e.message });
		process.exit(2);
	}
	log('failed', { err: String(e?.stack ?? e) });
	process.exit(1);
}
