// A refund agent on the OpenAI Agents SDK for JavaScript (@openai/agents) whose
// side-effecting tool goes through airlock's step API (the client in clients/typescript):
//
//  - the run is opened with client.withRun: claimed (a crashed process's lease waited out),
//    its lease kept, its ledger saved;
//  - the tool issue_refund is one run.step: planned with its arguments as input (the
//    approval card shows the order and the amount), gated by airlock (issue_refund:
//    approve_before_act), performed only once approved and only when airlock says execute,
//    confirmed with the payment system's id, answered from airlock's record when it was
//    performed before, and looked up in the payment system when a crash left it planned.
//
// A gated refund not yet decided ends the start with exit 3 and the approval link on
// stderr. After the approval the next start runs the conversation again: model calls are
// not side effects, and the refund's effect id is its arguments' hash, so the approved call
// is performed once (a model that asked for another refund would need another approval).
// A rejection stops the agent (exit 2) with the approver's reason.
//
// The model: no model is reachable here, so the agent is pointed (OPENAI_BASE_URL) at a
// local OpenAI-compatible server answering scripted tool calls (scripted-model.mjs). With
// a real model, drop OPENAI_BASE_URL and set OPENAI_API_KEY.
//
//   node refund-agent.mjs --ticket T-1 --order A-1001 --payments ./payments
//
// Environment: AIRLOCK_URL, AIRLOCK_API_KEY (runs scope), OPENAI_BASE_URL, OPENAI_API_KEY.
// Exit status: 0 done (or already done), 2 stopped for a person (rejected, or an outcome
// only a person can settle), 3 waiting for an approval, 1 any other error.
// AGENT_CRASH_AT=before_refund, after_refund or before_confirm makes it SIGKILL itself at
// that point (the restart test).
import { Agent, run, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled, tool } from '@openai/agents';
import { AgentRun, ApprovalPendingError, Client, NeedsPersonError, RejectedError, hashInput } from 'airlock-client';
import OpenAI from 'openai';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, readdirSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { z } from 'zod';

const { values: opt } = parseArgs({
	options: {
		ticket: { type: 'string' },
		order: { type: 'string' },
		payments: { type: 'string' },
		lease: { type: 'string', default: '5' },
		wait: { type: 'string', default: '60' },
	},
});
if (!opt.ticket || !opt.order || !opt.payments) {
	console.error('usage: refund-agent.mjs --ticket T --order O --payments DIR');
	process.exit(1);
}
const KEY = `refund-${opt.ticket}`;
const airlock = new Client(process.env.AIRLOCK_URL ?? 'http://127.0.0.1:8080', process.env.AIRLOCK_API_KEY ?? '');
const log = (msg, fields = {}) => console.log(JSON.stringify({ time: new Date().toISOString(), msg, ...fields }));

function crashPoint(point) {
	// SIGKILL runs no cleanup and flushes nothing, as a power cut or an OOM kill would.
	if (process.env.AGENT_CRASH_AT === point) process.kill(process.pid, 'SIGKILL');
}
AgentRun.hook = (point) => point === 'after_perform' && crashPoint('before_confirm'); // the step API's crash seam

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

// --- tools --------------------------------------------------------------------------------

const lookupOrder = tool({
	name: 'lookup_order',
	description: 'Look up an order (read only).',
	parameters: z.object({ order_id: z.string() }),
	execute: async ({ order_id }) => JSON.stringify({ order_id, amount_cents: 4200, currency: 'EUR', status: 'delivered' }),
});

/** airlockTool makes a side-effecting tool one run.step: see the top of this file. */
function airlockTool(agentRun, { name, description, parameters, action, target, perform }) {
	return tool({
		name,
		description,
		parameters,
		errorFunction: null, // an approval to wait for, a rejection or a lost lease ends the start: not the model's to handle
		execute: async (args) => {
			const effectId = `${name}-${hashInput(args).slice(0, 16)}`;
			const r = await agentRun.step(effectId, action, target, args, (call) => perform(call, args), {
				lookup: async (call) => {
					const found = payments.search(KEY, call.effect_id).map((p) => 'payment://' + p.id);
					log('looked up', { tool: name, effect_id: effectId, found });
					return found;
				},
			});
			log(r.replayed ? 'confirmed before; not repeating it' : 'performed', { tool: name, effect_id: effectId, receipt: r.receipt });
			return r.receipt;
		},
	});
}

function refundAgent(agentRun) {
	const issueRefund = airlockTool(agentRun, {
		name: 'issue_refund',
		description: "Refund an order to the customer's card.",
		parameters: z.object({ order_id: z.string(), amount_cents: z.number().int() }),
		action: 'issue_refund', // an action type of airlock's policy: connector worker, gate approve_before_act
		target: 'payments',
		perform: async (call, { order_id, amount_cents }) => {
			crashPoint('before_refund');
			const receipt = 'payment://' + payments.refund(call.effect_id, order_id, amount_cents).id;
			crashPoint('after_refund');
			return receipt;
		},
	});
	return new Agent({
		name: 'Refund desk',
		instructions: 'Look the order up, then refund it in full. Answer with the payment receipt.',
		model: 'scripted',
		tools: [lookupOrder, issueRefund],
	});
}

// --- the flow -------------------------------------------------------------------------------

async function main() {
	setTracingDisabled(true);
	setOpenAIAPI('chat_completions');
	setDefaultOpenAIClient(new OpenAI({ apiKey: process.env.OPENAI_API_KEY ?? 'unused', baseURL: process.env.OPENAI_BASE_URL }));
	const options = { goal: `Resolve ticket ${opt.ticket}`, invariants: ['Refund at most the order amount', 'No refund without approval'],
		lease_seconds: Number(opt.lease), waitLeaseMs: Number(opt.wait) * 1000 };
	const payload = { ticket: opt.ticket, order: opt.order };
	await airlock.withRun(KEY, payload, options, async (agentRun) => {
		if (agentRun.finished) return log('already completed', { result: agentRun.result });
		log('claimed', { key: KEY, reclaimed: agentRun.reclaimed, version: agentRun.version });
		const result = await run(refundAgent(agentRun), `Ticket ${opt.ticket}: please refund order ${opt.order}.`);
		const answer = String(result.finalOutput);
		await agentRun.complete({ answer });
		log('run completed', { state: 'completed', answer });
	});
}

/** cause finds an error of class C in e or its causes (the SDK wraps a tool's error). */
function cause(e, C) {
	for (let x = e; x; x = x.cause ?? x.error) if (x instanceof C) return x;
	return null;
}

try {
	await main();
	process.exit(0);
} catch (e) {
	const pending = cause(e, ApprovalPendingError);
	const rejected = cause(e, RejectedError);
	const person = cause(e, NeedsPersonError);
	if (pending) {
		// approve_url is a bearer secret: it goes to the approvers (stderr here), not into logs.
		if (pending.approve_url) console.error(`approval needed for ${pending.effect_id}: ${pending.approve_url}`);
		log('waiting', { approval_id: pending.approval_id, console_url: pending.console_url });
		process.exit(3);
	}
	if (rejected || person) {
		log('stopped', { err: (rejected ?? person).message, reason: rejected?.reason });
		process.exit(2);
	}
	log('failed', { err: String(e?.stack ?? e) });
	process.exit(1);
}
