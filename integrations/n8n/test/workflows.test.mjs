// The shipped workflows import as they are documented (issue 24, 1): every credential a
// node names is in workflows/credentials.json with the same id and type and no secret,
// every workflow is imported inactive, and every placeholder URL in them is listed in
// docs/n8n.md's one table of what to set after import.
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { test } from 'node:test';

const dir = new URL('../workflows/', import.meta.url);
const creds = JSON.parse(readFileSync(new URL('credentials.json', dir), 'utf8'));
const workflows = readdirSync(dir)
	.filter((f) => f.endsWith('.json') && f !== 'credentials.json')
	.map((f) => ({ file: f, wf: JSON.parse(readFileSync(new URL(f, dir), 'utf8')) }));
const doc = readFileSync(new URL('../../../docs/n8n.md', import.meta.url), 'utf8');
const placeholders = doc.split('### What to set after import')[1]?.split('\n## ')[0] ?? '';

test('every credential a workflow names is in the template, empty', () => {
	assert.ok(workflows.length >= 3);
	const byId = new Map(creds.map((c) => [c.id, c]));
	for (const c of creds) {
		for (const [k, v] of Object.entries(c.data)) {
			if (/key|value|password|token/i.test(k)) assert.equal(v, '', `${c.id}.${k} holds a secret`);
		}
	}
	for (const { file, wf } of workflows) {
		for (const n of wf.nodes) {
			for (const [type, ref] of Object.entries(n.credentials ?? {})) {
				const c = byId.get(ref.id);
				assert.ok(c, `${file}: ${n.name} names credential ${ref.id}, which credentials.json lacks`);
				assert.equal(c.type, type, `${file}: ${n.name}: ${ref.id} is a ${c.type}, not a ${type}`);
				assert.equal(c.name, ref.name, `${file}: ${n.name}: ${ref.id}'s name`);
			}
		}
	}
});

test('workflows import inactive', () => {
	for (const { file, wf } of workflows) assert.equal(wf.active, false, `${file} would activate on import`);
});

test('every placeholder URL is in docs/n8n.md\'s table', () => {
	assert.ok(placeholders.length > 100, 'docs/n8n.md has no "What to set after import" section');
	const text = JSON.stringify([creds, workflows.map((w) => w.wf)]);
	const urls = new Set(text.match(/https?:\/\/[A-Za-z0-9.:-]+/g));
	assert.ok(urls.size >= 2);
	for (const u of urls) assert.ok(placeholders.includes(u), `${u} is not listed in docs/n8n.md's "What to set after import"`);
});

// ticket-path-http.json's Report Failure classifies the Model node's error in an
// expression; it must give the class, detail and Retry-After the node's Report Failure
// (class Auto, classifyError) gives for the same error (issue 24: a body that is not JSON
// was reported as transport_timeout). The expression is run through n8n-workflow's own
// expression pipeline (extended syntax, tournament, the sandbox's global context), as n8n
// 1.123 with the legacy engine runs it.
test('the HTTP workflow classifies a model error as the node\'s Auto does', async () => {
	const { classifyError } = await import('./harness.mjs');
	const require = createRequire(import.meta.url);
	const { Expression } = require('n8n-workflow');
	const proxy = require('n8n-workflow/dist/cjs/expression-evaluator-proxy.js');
	const { extendSyntax } = require('n8n-workflow/dist/cjs/extensions/expression-extension.js');
	const { extend, extendOptional } = require('n8n-workflow/dist/cjs/extensions/index.js');
	const { extendedFunctions } = require('n8n-workflow/dist/cjs/extensions/extended-functions.js');
	const sandbox = require('n8n-workflow/dist/cjs/expression-sandboxing.js');
	proxy.setErrorHandler((e) => { throw e; });
	const wf = workflows.find((w) => w.file === 'ticket-path-http.json').wf;
	const body = wf.nodes.find((n) => n.name === 'Report Failure').parameters.jsonBody;
	assert.ok(body.startsWith('='));
	const claim = { body: { key: 'ticket-1', lease_owner: 'owner-1', version: 3 }, statusCode: 201 };
	const evaluate = (error) => {
		// The error output's item: the Claim node's response (the paired input item) with
		// the Model node's error on top, as n8n's handleNodeErrorOutput merges them.
		const data = { $json: { ...claim, error }, $: (name) => { assert.equal(name, 'Claim'); return { item: { json: claim } }; } };
		Expression.initializeGlobalContext(data);
		Object.assign(data, { extend, extendOptional }, extendedFunctions);
		Object.defineProperty(data, sandbox.sanitizerName, { value: sandbox.sanitizer });
		return JSON.parse(proxy.evaluateExpression(extendSyntax(body.slice(1)), data));
	};
	const axiosErr = (status, headers = {}) => ({ message: `${status} - "{}"`, name: 'AxiosError', code: 'ERR_BAD_RESPONSE', status, statusCode: status, response: { status, statusText: 'x', headers } });
	const errors = [
		axiosErr(503), axiosErr(500), axiosErr(429, { 'retry-after': '7' }), axiosErr(429), axiosErr(503, { 'retry-after': '3' }),
		axiosErr(400), axiosErr(401), axiosErr(408),
		{ message: 'timeout of 2000ms exceeded', name: 'AxiosError', code: 'ECONNABORTED' },
		{ message: 'connect ECONNREFUSED 127.0.0.1:9', code: 'ECONNREFUSED' },
		{ message: '502 - "bad gateway"', name: 'AxiosError', code: 'ERR_BAD_RESPONSE' },
		{ message: 'Request failed with status code 404' },
		{ description: 'socket hang up: timed out' },
		// HTTP Request 4.2, a JSON content type with a body that does not parse: the node
		// puts the message string on the item (its autodetect's jsonParse error).
		'Invalid JSON in response body',
		'Response body is not valid JSON. Change "Response Format" to "Text"',
		{ message: 'something odd' }, 'something odd', undefined, null,
	];
	for (const err of errors) {
		const c = classifyError(err);
		const got = evaluate(err);
		const want = { lease_owner: 'owner-1', version: 3, class: c.class, detail: c.detail };
		if (c.retryAfterSeconds > 0) want.retry_after_ms = c.retryAfterSeconds * 1000;
		assert.deepEqual(got, want, JSON.stringify(err));
	}
	assert.equal(evaluate('Invalid JSON in response body').class, 'parse_failure');
});

// The ticket path's Claim key refuses a body without its id (issue 34, 6: a body without
// ticket_id became run ticket-undefined), and its Model node asks again with airlock's
// validation errors when it comes from Validate's Invalid output. Both expressions run
// through n8n-workflow's expression pipeline, as in the test above.
test('the ticket path keys on the id, refuses a body without one, and re-asks with the errors', () => {
	const require = createRequire(import.meta.url);
	const { Expression } = require('n8n-workflow');
	const proxy = require('n8n-workflow/dist/cjs/expression-evaluator-proxy.js');
	const { extendSyntax } = require('n8n-workflow/dist/cjs/extensions/expression-extension.js');
	const { extend, extendOptional } = require('n8n-workflow/dist/cjs/extensions/index.js');
	const { extendedFunctions } = require('n8n-workflow/dist/cjs/extensions/extended-functions.js');
	const sandbox = require('n8n-workflow/dist/cjs/expression-sandboxing.js');
	proxy.setErrorHandler((e) => { throw e; });
	const evaluate = (expr, data) => {
		assert.ok(expr.startsWith('={{'));
		Expression.initializeGlobalContext(data);
		Object.assign(data, { extend, extendOptional }, extendedFunctions);
		Object.defineProperty(data, sandbox.sanitizerName, { value: sandbox.sanitizer });
		return proxy.evaluateExpression(extendSyntax(expr.slice(1)), data);
	};
	const wf = workflows.find((w) => w.file === 'ticket-path.json').wf;
	const param = (name, p) => wf.nodes.find((n) => n.name === name).parameters[p];
	const key = param('Claim', 'key');
	for (const [body, want] of [
		[{ ticket_id: 42 }, 'ticket-42'],
		[{ ticket_id: 'T-7' }, 'ticket-T-7'],
		[{ ticket_id: 0 }, 'ticket-0'],
		[{ subject: 'no id' }, ''],
		[{ ticket_id: null }, ''],
		[{ ticket_id: '' }, ''],
	]) {
		assert.equal(evaluate(key, { $json: { body } }), want, JSON.stringify(body));
	}
	const webhook = { body: { ticket_id: 42, subject: 'Refund', text: 'Please refund order 42.' } };
	const $ = (name) => {
		assert.equal(name, 'Webhook');
		return { item: { json: webhook } };
	};
	const model = param('Model', 'jsonBody');
	const first = JSON.parse(evaluate(model, { $json: { claimed: true, key: 'ticket-42' }, $ }));
	assert.equal(first.messages.length, 2);
	assert.match(first.messages[1].content, /Please refund order 42/);
	const invalid = { valid: false, state: 'processing', errors: [{ pointer: '/label', keyword: 'enum', message: 'must be one of refund, shipping, other' }] };
	const again = JSON.parse(evaluate(model, { $json: invalid, $ }));
	assert.equal(again.messages.length, 3);
	assert.match(again.messages[2].content, /\/label: must be one of refund, shipping, other/);
	// The Validate node's Invalid output goes back to the Model; nothing ends the run quietly.
	assert.deepEqual(wf.connections.Validate.main[1].map((c) => c.node), ['Model']);
	assert.equal(wf.nodes.find((n) => n.name === 'Refused: Close Run').parameters.alertReason.startsWith('={{'), true);
});

// The worker drains what is due each tick: after each report it claims again, up to a
// bound, at the shipped schedule (issue 34, 5: one reply a minute).
test('the worker claims again after each report, up to 50 a tick, and reports a failed send by its error', () => {
	const wf = workflows.find((w) => w.file === 'worker.json').wf;
	const c = wf.connections;
	const next = 'Next Effect (Up to 50 a Tick)';
	assert.deepEqual(c['Report Sent'].main[0].map((x) => x.node), [next]);
	assert.deepEqual(c['Report Outcome (Auto)'].main[0].map((x) => x.node), [next]);
	assert.deepEqual(c[next].main[0].map((x) => x.node), ['Claim Effect']);
	assert.equal(wf.nodes.find((n) => n.name === next).parameters.output, '={{ $runIndex < 49 ? 0 : 1 }}');
	assert.deepEqual(c['Send Reply'].main[1].map((x) => x.node), ['Report Outcome (Auto)']);
	assert.equal(wf.nodes.find((n) => n.name === 'Report Outcome (Auto)').parameters.outcome, 'auto');
	assert.deepEqual(wf.nodes.find((n) => n.name === 'Every Minute').parameters.rule, { interval: [{ field: 'minutes', minutesInterval: 1 }] });
});
