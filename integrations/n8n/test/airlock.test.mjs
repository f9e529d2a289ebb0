// Every operation and named output of the airlock node against a real airlock binary.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { AirlockApi, classifyError, classifySendError, execute, node, OUTPUTS, outputNames, startAirlock } from './harness.mjs';

let srv;
let seq = 0;
const uniq = (p) => `${p}-${process.pid}-${++seq}`;

before(async () => {
	srv = await startAirlock();
});
after(async () => {
	await srv?.stop();
});

const runs = (params, extra = {}) => execute({ base: srv.base, apiKey: srv.keys.runs, params, ...extra });
const worker = (params, extra = {}) => execute({ base: srv.base, apiKey: srv.keys.worker, params, ...extra });

// webhook is what n8n's Webhook trigger emits: the request under body, its headers beside it.
const webhook = (body, headers = { 'user-agent': 'zendesk' }) => ({ json: { headers, params: {}, query: {}, body } });

async function claim(key, body = { ticket: key }) {
	const r = await runs({ operation: 'claim', key }, { items: [webhook(body)] });
	assert.equal(r.Claimed.length, 1, JSON.stringify(r));
	return r.Claimed[0];
}

// lease is the three parameters a lease operation gets from the Claim node's item.
const lease = (c) => ({ runKey: c.json.key, leaseOwner: c.json.lease_owner, version: String(c.json.version) });

describe('description', () => {
	test('each operation has its named outputs, and the node is usable as a tool', () => {
		for (const [op, names] of Object.entries(OUTPUTS)) {
			assert.deepEqual(outputNames({ operation: op }), names, op);
		}
		assert.deepEqual(outputNames({ operation: 'claim' }), ['Claimed', 'Duplicate', 'Conflict']);
		assert.deepEqual(outputNames({ operation: 'queueEffect' }), ['Queued', 'Approval Requested', 'Refused']);
		const ops = node.description.properties.find((p) => p.name === 'operation').options.map((o) => o.value);
		assert.deepEqual([...ops].sort(), Object.keys(OUTPUTS).sort());
		assert.equal(node.description.usableAsTool, true);
	});

	test('the credential sends the key as Bearer and its test request needs a valid key', async () => {
		const cred = new AirlockApi();
		assert.equal(cred.authenticate.properties.headers.Authorization, '=Bearer {{$credentials.apiKey}}');
		assert.equal(cred.test.request.baseURL, '={{$credentials.baseUrl}}');
		const url = srv.base + cred.test.request.url;
		const ok = await fetch(url, { method: cred.test.request.method, headers: { Authorization: 'Bearer ' + srv.keys.runs } });
		assert.equal(ok.status, 200);
		assert.deepEqual(await ok.json(), { name: 'n8n', scopes: ['runs'] });
		assert.equal((await fetch(url, { headers: { Authorization: 'Bearer wrong' } })).status, 401);
	});
});

describe('claim', () => {
	test('claimed, then duplicate with the earlier state and result, then conflict', async () => {
		const key = uniq('T');
		const c = await claim(key, { ticket: 1, subject: 'Refund' });
		assert.equal(c.json.claimed, true);
		assert.equal(c.json.version, 1);
		assert.match(c.json.lease_owner, /.+/);
		assert.deepEqual(c.pairedItem, { item: 0 });

		// A redelivery whose headers differ is the same payload: only the body is hashed.
		const dup = await runs({ operation: 'claim', key }, { items: [webhook({ subject: 'Refund', ticket: 1 }, { 'x-delivery': '2' })] });
		assert.equal(dup.Claimed.length, 0);
		assert.equal(dup.Duplicate.length, 1);
		assert.equal(dup.Duplicate[0].json.claimed, false);
		assert.equal(dup.Duplicate[0].json.duplicate, true);
		assert.equal(dup.Duplicate[0].json.state, 'processing');
		assert.equal(dup.Duplicate[0].json.lease_owner, undefined);

		await runs({ ...lease(c), operation: 'transition', to: 'completed', result: '{"reply_id":"r-1"}' });
		const done = await runs({ operation: 'claim', key }, { items: [webhook({ ticket: 1, subject: 'Refund' })] });
		assert.equal(done.Duplicate[0].json.state, 'completed');
		assert.deepEqual(done.Duplicate[0].json.result, { reply_id: 'r-1' });

		const conflict = await runs({ operation: 'claim', key }, { items: [webhook({ ticket: 1, subject: 'Other' })] });
		assert.equal(conflict.Conflict.length, 1);
		assert.equal(conflict.Conflict[0].json.code, 'payload_mismatch');
		assert.equal(conflict.Conflict[0].json.key, key);
	});

	test('custom JSON payload, trigger source and lease seconds are sent', async () => {
		const key = uniq('C');
		const r = await runs({ operation: 'claim', key, payloadSource: 'json', payload: '{"a":1}', triggerSource: 'zendesk', workflowVersion: 'w@1', leaseSeconds: 30 });
		assert.equal(r.Claimed.length, 1);
		assert.deepEqual(r.requests[0].body, { key, payload: { a: 1 }, trigger_source: 'zendesk', workflow_version: 'w@1', lease_seconds: 30 });
		const exp = Date.parse(r.Claimed[0].json.lease_expires_at) - Date.now();
		assert.ok(exp > 0 && exp <= 31_000, `lease ends in ${exp} ms`);
	});

	test('an item without body is refused before any request', async () => {
		await assert.rejects(runs({ operation: 'claim', key: uniq('N') }, { items: [{ json: { ticket: 1 } }] }), /no body field/);
	});

	test('several items are claimed each, paired with their item', async () => {
		const a = uniq('M'), b = uniq('M');
		const r = await runs({ operation: 'claim', key: a }, { items: [webhook({ n: 1 })] });
		const items = [webhook({ n: 1 }), webhook({ n: 2 })];
		const r2 = await execute({ base: srv.base, apiKey: srv.keys.runs, params: { operation: 'claim', key: b }, items });
		assert.equal(r.Claimed.length, 1);
		// Same key b for both items: the first claims, the second (another payload) conflicts.
		assert.equal(r2.Claimed.length, 1);
		assert.equal(r2.Conflict.length, 1);
		assert.deepEqual(r2.Conflict[0].pairedItem, { item: 1 });
	});

	test('a retried node run (same execution, node, run and item) gets the same lease back', async () => {
		const key = uniq('I');
		const first = await runs({ operation: 'claim', key }, { items: [webhook({ i: 1 })], executionId: 'exec-1' });
		const retry = await runs({ operation: 'claim', key }, { items: [webhook({ i: 1 })], executionId: 'exec-1' });
		assert.equal(retry.Claimed.length, 1);
		assert.equal(retry.Claimed[0].json.lease_owner, first.Claimed[0].json.lease_owner);
		assert.match(retry.requests[0].headers['Idempotency-Key'], /^n8n:exec-1:node-1:0:0$/);
		const other = await runs({ operation: 'claim', key }, { items: [webhook({ i: 1 })], executionId: 'exec-2' });
		assert.equal(other.Duplicate.length, 1);
	});
});

describe('lease operations', () => {
	test('lease owner and version are carried from the node named Claim by default', async () => {
		const c = await claim(uniq('D'));
		const r = await runs({ operation: 'heartbeat' }, { nodes: { Claim: c }, items: [{ json: { unrelated: true } }] });
		assert.equal(r.Success.length, 1);
		assert.equal(r.requests[0].body.lease_owner, c.json.lease_owner);
		assert.equal(r.requests[0].body.version, 1);
		assert.equal(r.Success[0].json.key, c.json.key);
		assert.ok(r.Success[0].json.lease_expires_at);
		const t = await runs({ operation: 'transition', to: 'failed_retryable' }, { nodes: { Claim: c } });
		assert.equal(t.Success[0].json.state, 'failed_retryable');
		assert.equal(t.Success[0].json.version, 2);
	});

	test('without a Claim node the lease operations say what they need', async () => {
		await assert.rejects(runs({ operation: 'heartbeat' }), /Referenced node is unexecuted: Claim/);
		await assert.rejects(runs({ operation: 'heartbeat', runKey: 'k', leaseOwner: '', version: '1' }), /Run Key, Lease Owner and Version are needed/);
	});

	test("an airlock error is an n8n error with airlock's code and message", async () => {
		const c = await claim(uniq('E'));
		const bad = { ...lease(c), operation: 'heartbeat', leaseOwner: 'not-the-owner' };
		await assert.rejects(runs(bad), (err) => {
			assert.equal(err.constructor.name, 'NodeApiError');
			assert.match(err.message, /^airlock lease_lost: /);
			assert.equal(err.httpCode, '409');
			assert.match(err.description, /do not act/);
			return true;
		});
		const stale = { ...lease(c), operation: 'transition', to: 'completed', version: '7' };
		await assert.rejects(runs(stale), /airlock version_conflict/);
	});

	test('continue on fail puts the error on the first output, with the code, and goes on', async () => {
		const c = await claim(uniq('F'));
		const items = [{ json: {} }, { json: {} }];
		const r = await execute({
			base: srv.base, apiKey: srv.keys.runs, continueOnFail: true, items,
			params: { ...lease(c), operation: 'heartbeat', leaseOwner: 'nobody' },
		});
		assert.equal(r.Success.length, 2);
		for (const [i, it] of r.Success.entries()) {
			assert.equal(it.json.code, 'lease_lost');
			assert.equal(it.json.status, 409);
			assert.match(it.json.error, /airlock lease_lost/);
			assert.ok(it.error, 'the error rides on the item (error output)');
			assert.deepEqual(it.pairedItem, { item: i });
		}
	});

	test('transition stores its result; an empty result is not sent', async () => {
		const c = await claim(uniq('R'));
		const r = await runs({ ...lease(c), operation: 'transition', to: 'completed', result: '{}' });
		assert.equal(r.requests[0].body.result, undefined);
		assert.equal(r.Success[0].json.state, 'completed');
		const c2 = await claim(uniq('R'));
		await runs({ ...lease(c2), operation: 'transition', to: 'failed_terminal', result: '{"reason":"spam"}' });
		const g = await runs({ operation: 'getRun', runKey: c2.json.key });
		assert.equal(g.Success[0].json.state, 'failed_terminal');
		assert.deepEqual(g.Success[0].json.result, { reason: 'spam' });
	});

	test('record usage adds model calls and tokens', async () => {
		const c = await claim(uniq('U'));
		const r = await runs({ ...lease(c), operation: 'recordUsage', modelCalls: 2, tokens: 1500 });
		assert.equal(r.Success[0].json.model_calls, 2);
		assert.equal(r.Success[0].json.tokens, 1500);
		const g = await runs({ operation: 'getRun', runKey: c.json.key });
		assert.equal(g.Success[0].json.tokens, 1500);
	});
});

describe('validate', () => {
	const good = 'Here it is:\n```json\n{"label":"refund","text":"We refunded you."}\n```';
	test('valid (text with a code block), invalid with repairs left, then terminal', async () => {
		const c = await claim(uniq('V'));
		const v = await runs({ ...lease(c), operation: 'validate', actionType: 'ticket_reply', output: good });
		assert.equal(v.Valid.length, 1);
		assert.deepEqual(v.Valid[0].json.value, { label: 'refund', text: 'We refunded you.' });

		const c2 = await claim(uniq('V'));
		const bad = { ...lease(c2), operation: 'validate', actionType: 'ticket_reply', output: { label: 'nonsense', text: 'x' } };
		const inv = await runs(bad);
		assert.equal(inv.Invalid.length, 1);
		assert.equal(inv.Invalid[0].json.state, 'processing');
		assert.ok(inv.Invalid[0].json.errors.length > 0);
		const term = await runs(bad);
		assert.equal(term.Terminal.length, 1);
		assert.equal(term.Terminal[0].json.state, 'failed_terminal');
	});

	test('the default model output is the OpenAI-compatible reply text', async () => {
		const c = await claim(uniq('O'));
		const item = { json: { choices: [{ message: { content: '{"label":"other","text":"ok"}' } }] } };
		const p = { ...lease(c), operation: 'validate', actionType: 'ticket_reply' };
		const n = node.description.properties.find((x) => x.name === 'output');
		assert.equal(n.default, '={{ $json.choices[0].message.content }}');
		const v = await runs({ ...p, output: item.json.choices[0].message.content }, { items: [item] });
		assert.equal(v.Valid.length, 1);
	});
});

describe('report failure', () => {
	test('retry with the wait in seconds, terminal, reconcile', async () => {
		const c = await claim(uniq('P'));
		const r = await runs({ ...lease(c), operation: 'reportFailure', failureClass: 'rate_limited', retryAfterSeconds: 3, detail: '429' });
		assert.equal(r.requests[0].body.retry_after_ms, 3000);
		assert.equal(r.Retry.length, 1);
		assert.equal(r.Retry[0].json.decision, 'retry');
		assert.ok(r.Retry[0].json.wait_seconds >= 3);
		assert.equal(r.Retry[0].json.wait_seconds, Math.ceil(r.Retry[0].json.retry_after_ms / 1000));

		const t = await runs({ ...lease(c), operation: 'reportFailure', failureClass: 'client_error' });
		assert.equal(t.Terminal.length, 1);
		assert.equal(t.Terminal[0].json.state, 'failed_terminal');

		// A business-level retry releases the run: the item says so, the next delivery reclaims it.
		const cb = await claim(uniq('P'));
		const b = await runs({ ...lease(cb), operation: 'reportFailure', failureClass: 'server_error' });
		assert.equal(b.Retry.length, 1);
		assert.equal(b.Retry[0].json.level, 'business');
		assert.equal(b.Retry[0].json.state, 'failed_retryable');

		const c2 = await claim(uniq('P'));
		const u = await runs({ ...lease(c2), operation: 'reportFailure', failureClass: 'unknown_commit' });
		assert.equal(u.Reconcile.length, 1);
		assert.equal(u.Reconcile[0].json.state, 'awaiting_human');
	});
});

describe('report failure: classes from the model call\'s error', () => {
	// The shapes n8n 1.123's HTTP Request node leaves on its error output (an axios error
	// from n8n's request helper, or its JSON form after n8n stored the execution).
	const axiosErr = (status, headers = {}) => ({ message: `${status} - "{}"`, name: 'AxiosError', code: 'ERR_BAD_RESPONSE', status, statusCode: status, response: { status, statusText: 'x', headers } });
	test('each error maps onto its class', () => {
		for (const [err, cls, after] of [
			[axiosErr(503), 'server_error', 0],
			[axiosErr(500), 'server_error', 0],
			[axiosErr(429, { 'retry-after': '7' }), 'rate_limited', 7],
			[axiosErr(400), 'client_error', 0],
			[axiosErr(401), 'client_error', 0],
			[axiosErr(408), 'transport_timeout', 0],
			[{ message: 'timeout of 2000ms exceeded', name: 'AxiosError', code: 'ECONNABORTED' }, 'transport_timeout', 0],
			[{ message: 'connect ECONNREFUSED 127.0.0.1:9', code: 'ECONNREFUSED' }, 'transport_timeout', 0],
			[{ message: '502 - "bad gateway"', name: 'AxiosError', code: 'ERR_BAD_RESPONSE' }, 'server_error', 0],
			[{ message: 'Request failed with status code 404' }, 'client_error', 0],
			['Response body is not valid JSON. Change "Response Format" to "Text"', 'parse_failure', 0],
			['Invalid JSON in response body', 'parse_failure', 0], // HTTP Request 4.2's autodetect, a JSON content type
			[{ message: 'something odd' }, 'transport_timeout', 0],
			[undefined, 'transport_timeout', 0],
		]) {
			const c = classifyError(err);
			assert.equal(c.class, cls, JSON.stringify(err));
			assert.equal(c.retryAfterSeconds, after, JSON.stringify(err));
			assert.doesNotMatch(c.detail, /bad gateway|\{/, 'the detail never carries the provider body');
		}
	});
	test('Auto sends the class, detail and Retry-After of the item\'s error', async () => {
		const c = await claim(uniq('A'));
		const r = await runs({ ...lease(c), operation: 'reportFailure', failureClass: 'auto' }, { items: [{ json: { error: axiosErr(429, { 'retry-after': '2' }) } }] });
		assert.equal(r.requests[0].body.class, 'rate_limited');
		assert.equal(r.requests[0].body.detail, 'model HTTP 429');
		assert.equal(r.requests[0].body.retry_after_ms, 2000);
		assert.equal(r.Retry.length, 1);
		assert.ok(r.Retry[0].json.wait_seconds >= 2);
		const t = await runs({ ...lease(c), operation: 'reportFailure', failureClass: 'auto' }, { items: [{ json: { error: axiosErr(400) } }] });
		assert.equal(t.requests[0].body.class, 'client_error');
		assert.equal(t.Terminal.length, 1);
	});
});

describe('queue effect', () => {
	test('approval requested for a gated type, with the link; nothing queued', async () => {
		const c = await claim(uniq('Q'));
		await runs({ ...lease(c), operation: 'validate', actionType: 'ticket_reply', output: '{"label":"refund","text":"Done."}' });
		const q = await runs({ ...lease(c), operation: 'queueEffect', actionType: 'ticket_reply', target: 'customer' });
		assert.equal(q.requests[0].body.payload, undefined, 'the validated value is queued, no payload sent');
		assert.equal(q['Approval Requested'].length, 1);
		const a = q['Approval Requested'][0].json;
		assert.match(a.approve_url, /\/approve\/[A-Za-z0-9_-]{40,}$/);
		assert.equal(a.state, 'awaiting_human');
		assert.equal(a.key, c.json.key);
		const g = await runs({ operation: 'getRun', runKey: c.json.key });
		assert.deepEqual(g.Success[0].json.effects, []);
	});

	test('queued for an ungated type, and the worker claims it, completes it, then finds none', async () => {
		const c = await claim(uniq('W'));
		const q = await runs({ ...lease(c), operation: 'queueEffect', actionType: 'crm_note', effectPayloadSource: 'json', effectPayload: '{"note":"hi"}', effectId: 'note-1' });
		assert.equal(q.Queued.length, 1);
		assert.equal(q.Queued[0].json.created, true);
		assert.equal(q.Queued[0].json.effect.effect_id, 'note-1');

		const e = await worker({ operation: 'claimEffect', types: 'crm_note' });
		assert.equal(e.Effect.length, 1);
		const eff = e.Effect[0];
		assert.deepEqual(eff.json.payload, { note: 'hi' });
		assert.equal(eff.json.idempotency_key, `${c.json.key}/note-1`);
		const done = await worker({ operation: 'reportEffect', outcome: 'complete', providerId: 'crm-9' }, { nodes: { 'Claim Effect': eff } });
		assert.equal(done.Success[0].json.state, 'completed');
		assert.equal(done.Success[0].json.provider_id, 'crm-9');

		const none = await worker({ operation: 'claimEffect', types: 'crm_note' });
		assert.equal(none.None.length, 1);
		assert.deepEqual(none.None[0].json, { claimed: false });

		const t = await runs({ ...lease(c), operation: 'transition', to: 'completed' });
		assert.equal(t.Success[0].json.state, 'completed');
	});

	test('a worker reports a retryable failure and an unknown outcome', async () => {
		const c = await claim(uniq('X'));
		await runs({ ...lease(c), operation: 'queueEffect', actionType: 'crm_note', effectPayloadSource: 'json', effectPayload: '{"n":1}' });
		const e = await worker({ operation: 'claimEffect', types: 'crm_note', effectLeaseSeconds: 60 });
		const f = await worker({ operation: 'reportEffect', outcome: 'fail', retryable: true, errorClass: 'http_503', effectRetryAfterSeconds: 1 }, { nodes: { 'Claim Effect': e.Effect[0] } });
		assert.equal(f.requests[0].body.retry_after_ms, 1000);
		assert.equal(f.Success[0].json.state, 'pending');
		let e2;
		for (let i = 0; i < 50; i++) {
			e2 = await worker({ operation: 'claimEffect', types: 'crm_note' });
			if (e2.Effect.length) break;
			await new Promise((r) => setTimeout(r, 100));
		}
		const u = await worker({ operation: 'reportEffect', outcome: 'unknown', errorClass: 'timeout' }, { nodes: { 'Claim Effect': e2.Effect[0] } });
		assert.equal(u.Success[0].json.state, 'unknown');
	});

	test('refused: unknown action type, bad target, payload mismatch', async () => {
		const c = await claim(uniq('Z'));
		const base = { ...lease(c), operation: 'queueEffect', effectPayloadSource: 'json', effectPayload: '{"n":1}' };
		const u = await runs({ ...base, actionType: 'launch_rockets' });
		assert.equal(u.Refused.length, 1);
		assert.equal(u.Refused[0].json.code, 'unknown_action_type');
		assert.equal(u.Refused[0].json.status, 422);
		await runs({ ...base, actionType: 'crm_note', effectId: 'e1' });
		const m = await runs({ ...base, actionType: 'crm_note', effectId: 'e1', effectPayload: '{"n":2}' });
		assert.equal(m.Refused[0].json.code, 'effect_mismatch');
		const nv = await runs({ ...lease(c), operation: 'queueEffect', actionType: 'ticket_reply' });
		assert.equal(nv.Refused[0].json.code, 'not_validated');
	});

	test('a key without the runs scope is an error, not a refusal', async () => {
		const c = await claim(uniq('S'));
		await assert.rejects(
			execute({ base: srv.base, apiKey: srv.keys.worker, params: { ...lease(c), operation: 'queueEffect', actionType: 'crm_note', effectPayloadSource: 'json', effectPayload: '{}' } }),
			/airlock forbidden/,
		);
	});
});

// Issue 34: nothing the ticket path or the worker gives up on is silent, and the card and
// the Run page know the source record and the model.
const events = async (key) => {
	const r = await fetch(`${srv.base}/v1/runs/${encodeURIComponent(key)}/events?limit=1000`, { headers: { Authorization: 'Bearer ' + srv.keys.runs } });
	assert.equal(r.status, 200);
	return (await r.json()).events;
};

describe('meta, keys and give-up alerts', () => {
	test('source URL and model are sent as meta on claim, validate and queue, and recorded', async () => {
		const key = uniq('MT');
		const m = { sourceUrl: 'https://helpdesk.example.com/tickets/7', modelName: 'gpt-4o-mini' };
		const want = { source_url: 'https://helpdesk.example.com/tickets/7', model: { name: 'gpt-4o-mini' } };
		const c = await runs({ operation: 'claim', key, ...m }, { items: [webhook({ ticket_id: 7 })] });
		assert.deepEqual(c.requests[0].body.meta, want);
		const v = await runs({ ...lease(c.Claimed[0]), operation: 'validate', actionType: 'ticket_reply', output: '{"label":"refund","text":"Done."}', ...m });
		assert.deepEqual(v.requests[0].body.meta, want);
		const q = await runs({ ...lease(c.Claimed[0]), operation: 'queueEffect', actionType: 'ticket_reply', target: 'default', ...m });
		assert.deepEqual(q.requests[0].body.meta, want);
		assert.equal(q['Approval Requested'].length, 1);
		const evs = await events(key);
		for (const kind of ['claimed', 'validation']) {
			const e = evs.find((x) => x.kind === kind);
			assert.deepEqual(e?.meta, want, `${kind} event: ${JSON.stringify(e)}`);
		}
		// Left empty, no meta is sent at all.
		const bare = await runs({ operation: 'claim', key: uniq('MT') }, { items: [webhook({ ticket_id: 8 })] });
		assert.equal(bare.requests[0].body.meta, undefined);
	});

	test('a key the expression could not fill (empty, ticket-undefined) is refused before any request', async () => {
		for (const key of ['', '  ', 'ticket-undefined', 'ticket-null']) {
			await assert.rejects(runs({ operation: 'claim', key }, { items: [webhook({ subject: 'no id' })] }), /no id to claim under/, JSON.stringify(key));
		}
		const r = await fetch(`${srv.base}/v1/runs/ticket-undefined`, { headers: { Authorization: 'Bearer ' + srv.keys.runs } });
		assert.equal(r.status, 404);
	});

	test('failed_terminal with an alert reason raises workflow_gave_up; without one, none', async () => {
		const c = await claim(uniq('GU'));
		const t = await runs({ ...lease(c), operation: 'transition', to: 'failed_terminal', alertReason: 'the policy refused the reply: unknown_action_type', result: '{"reason":"x"}' });
		assert.equal(t.requests[0].body.alert, 'the policy refused the reply: unknown_action_type');
		assert.equal(t.Success[0].json.state, 'failed_terminal');
		const alerts = (await events(c.json.key)).filter((e) => e.kind === 'alert').map((e) => e.detail);
		assert.deepEqual(alerts, [{ alert: 'workflow_gave_up', reason: 'the policy refused the reply: unknown_action_type' }]);
		// The reason is only sent with failed_terminal.
		const c2 = await claim(uniq('GU'));
		const done = await runs({ ...lease(c2), operation: 'transition', to: 'completed', alertReason: 'ignored' });
		assert.equal(done.requests[0].body.alert, undefined);
	});

	test('a payload mismatch (an edited redelivery) is alerted by airlock', async () => {
		const key = uniq('PM');
		await claim(key, { ticket_id: 1, text: 'refund' });
		const m = await runs({ operation: 'claim', key }, { items: [webhook({ ticket_id: 1, text: 'refund and cancel' })] });
		assert.equal(m.Conflict.length, 1);
		const alerts = (await events(key)).filter((e) => e.kind === 'alert').map((e) => e.detail.alert);
		assert.deepEqual(alerts, ['payload_mismatch']);
	});

	test('the validation errors are on the Invalid item, for the model to be asked again', async () => {
		const c = await claim(uniq('RA'));
		const inv = await runs({ ...lease(c), operation: 'validate', actionType: 'ticket_reply', output: 'Sure, I will refund you.' });
		assert.equal(inv.Invalid.length, 1);
		assert.equal(inv.Invalid[0].json.repairs, 1);
		assert.ok(inv.Invalid[0].json.errors.some((e) => e.message), JSON.stringify(inv.Invalid[0].json.errors));
		// The second invalid answer uses the last repair: airlock ends the run and alerts.
		const term = await runs({ ...lease(c), operation: 'validate', actionType: 'ticket_reply', output: '{"label":"angry","text":"x"}' });
		assert.equal(term.Terminal.length, 1);
		const alerts = (await events(c.json.key)).filter((e) => e.kind === 'alert').map((e) => e.detail.alert);
		assert.deepEqual(alerts, ['validation_failed']);
	});
});

describe('worker: Auto outcome from the send node\'s error', () => {
	const axiosErr = (status, headers = {}) => ({ message: `${status} - "{}"`, name: 'AxiosError', code: 'ERR_BAD_RESPONSE', status, statusCode: status, response: { status, statusText: 'x', headers } });
	test('what certainly did not leave is not sent and retryable; what may have left is unknown', () => {
		for (const [err, outcome, retryable, cls, after] of [
			[{ message: 'connect ECONNREFUSED 127.0.0.1:9', code: 'ECONNREFUSED' }, 'fail', true, 'connection_refused', 0],
			[{ message: 'getaddrinfo ENOTFOUND helpdesk.invalid', code: 'ENOTFOUND' }, 'fail', true, 'dns_failure', 0],
			[{ message: 'getaddrinfo EAI_AGAIN helpdesk.example.com', code: 'EAI_AGAIN' }, 'fail', true, 'dns_failure', 0],
			[{ message: 'connect ECONNREFUSED 127.0.0.1:9' }, 'fail', true, 'connection_refused', 0], // its JSON form, message only
			[{ message: 'certificate has expired', code: 'CERT_HAS_EXPIRED' }, 'fail', true, 'tls_refused', 0],
			[axiosErr(429, { 'retry-after': '9' }), 'fail', true, 'http_429', 9],
			[axiosErr(503), 'fail', true, 'http_503', 0],
			[axiosErr(400), 'fail', false, 'http_400', 0],
			[axiosErr(401), 'fail', false, 'http_401', 0],
			[axiosErr(500), 'unknown', false, 'http_500', 0],
			[axiosErr(502), 'unknown', false, 'http_502', 0],
			[{ message: 'timeout of 30000ms exceeded', code: 'ECONNABORTED' }, 'unknown', false, 'timeout', 0],
			[{ message: 'socket hang up', code: 'ECONNRESET' }, 'unknown', false, 'econnreset', 0],
			[{ message: 'something odd' }, 'unknown', false, 'send_error', 0],
			[undefined, 'unknown', false, 'send_error', 0],
		]) {
			const c = classifySendError(err);
			assert.deepEqual([c.outcome, c.retryable, c.class, c.retryAfterSeconds], [outcome, retryable, cls, after], JSON.stringify(err));
		}
	});

	test('Auto reports a refused connection as not sent (pending again) and a 502 as unknown', async () => {
		const c = await claim(uniq('WA'));
		await runs({ ...lease(c), operation: 'queueEffect', actionType: 'crm_note', effectPayloadSource: 'json', effectPayload: '{"n":1}' });
		const e = await worker({ operation: 'claimEffect', types: 'crm_note', effectLeaseSeconds: 60 });
		const refused = { json: { error: { message: 'connect ECONNREFUSED 127.0.0.1:9', code: 'ECONNREFUSED' } } };
		const f = await worker({ operation: 'reportEffect', outcome: 'auto' }, { items: [refused], nodes: { 'Claim Effect': e.Effect[0] } });
		assert.match(f.requests[0].url, /\/fail$/);
		assert.equal(f.requests[0].body.retryable, true);
		assert.equal(f.requests[0].body.class, 'connection_refused');
		assert.equal(f.Success[0].json.state, 'pending');
		let e2;
		for (let i = 0; i < 100; i++) {
			e2 = await worker({ operation: 'claimEffect', types: 'crm_note' });
			if (e2.Effect.length) break;
			await new Promise((r) => setTimeout(r, 100));
		}
		assert.equal(e2.Effect.length, 1, 'the effect came back to be sent again');
		const u = await worker({ operation: 'reportEffect', outcome: 'auto' }, { items: [{ json: { error: axiosErr(502) } }], nodes: { 'Claim Effect': e2.Effect[0] } });
		assert.match(u.requests[0].url, /\/unknown$/);
		assert.equal(u.requests[0].body.class, 'http_502');
		assert.equal(u.Success[0].json.state, 'unknown');
	});
});
