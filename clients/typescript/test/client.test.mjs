// The client against a real airlock, on SQLite and (when given) PostgreSQL.
import assert from 'node:assert/strict';
import { createConnection, createServer } from 'node:net';
import { after, before, describe, test } from 'node:test';
import * as airlock from '../index.js';
import { Client, hashInput } from '../index.js';
import { backends, startAirlock, unique } from './harness.mjs';

// Payloads whose canonical form differs from a naive sorted stringify: key order by UTF-16
// code units, numbers as ECMAScript prints them, strings escaped only where RFC 8785 says.
const TRICKY = [
	{ b: 1, a: 2, aa: [3, 2, 1] },
	{ '\ue000': 'private use', '\u{1F600}': 'emoji', z: 'é ü 日本' },
	{ n: [1.0, 100, 1e21, 1e20, 1e-7, 1e-6, 0.1, 2 ** 53 + 1, -0, 123456789.125, 5e-324, 1.7976931348623157e308] },
	{ s: 'tab\there "quoted" back\\slash \u0001 \u001f \u007f </script> \u2028' },
	{ nested: { deep: [{ y: null, x: true }, false, []], empty: {} } },
	[],
	'just a string',
	-12.5,
];

/** A TCP proxy that loses answers on purpose: per request, by plan, "pass", "drop" (forward,
 * then close before the answer: committed, reply lost) or "503" (store_unavailable). */
function lossyProxy(upstream) {
	const { hostname, port } = new URL(upstream);
	const p = { plan: [], seen: [] };
	const server = createServer((conn) => {
		let buf = Buffer.alloc(0);
		const onData = (chunk) => {
			buf = Buffer.concat([buf, chunk]);
			const end = buf.indexOf('\r\n\r\n');
			if (end < 0) return;
			const head = buf.subarray(0, end).toString('latin1').split('\r\n');
			const headers = {};
			for (const line of head.slice(1)) {
				const i = line.indexOf(':');
				headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
			}
			const length = Number(headers['content-length'] ?? 0);
			if (buf.length < end + 4 + length) return;
			conn.off('data', onData);
			const [method, path] = head[0].split(' ');
			p.seen.push({ method, path, headers });
			const mode = p.plan.shift() ?? 'pass';
			if (mode === '503') {
				const body = '{"error":"store_unavailable","message":"test: the database is away"}';
				conn.end(`HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
				return;
			}
			const req = Buffer.concat([Buffer.from(head[0] + '\r\n' + head.slice(1).filter((l) => !/^connection:/i.test(l)).join('\r\n') + '\r\nConnection: close\r\n\r\n', 'latin1'), buf.subarray(end + 4)]);
			const up = createConnection({ host: hostname, port: Number(port) }, () => up.write(req));
			const answer = [];
			up.on('data', (c) => answer.push(c));
			up.on('end', () => (mode === 'drop' ? conn.destroy() : conn.end(Buffer.concat(answer))));
			up.on('error', () => conn.destroy());
		};
		conn.on('data', onData);
		conn.on('error', () => {});
	});
	return new Promise((ok) =>
		server.listen(0, '127.0.0.1', () => {
			p.url = `http://127.0.0.1:${server.address().port}`;
			p.close = () => new Promise((r) => server.close(r));
			ok(p);
		}),
	);
}

for (const backend of backends()) {
	describe(`client on ${backend}`, () => {
		let srv;
		before(async () => {
			srv = await startAirlock(backend);
		});
		after(() => srv?.stop());
		const client = (scope = 'runs', o) => new Client(srv.url, srv.keys[scope], o);
		async function claimed(prefix = 'run', lease_seconds = 30) {
			const c = client();
			const key = unique(prefix);
			const cl = await c.claim(key, { payload: { key }, lease_seconds });
			assert.ok(cl.claimed);
			return { c, key, cl };
		}

		test('claim, duplicate, mismatch, heartbeat, transition', async () => {
			const c = client();
			const key = unique('ticket');
			const cl = await c.claim(key, { payload: { ticket: 42 }, lease_seconds: 30, trigger_source: 'ts-test', meta: { workflow_version: 'v1' } });
			assert.equal(cl.claimed, true);
			assert.equal(cl.version, 1);
			assert.equal(cl.payload_hash, hashInput({ ticket: 42 }));
			assert.ok(cl.lease_expires_at instanceof Date);
			const dup = await c.claim(key, { payload: { ticket: 42 } });
			assert.equal(dup.claimed, false);
			assert.equal(dup.state, 'processing');
			assert.ok(dup.lease_expires_at, 'a duplicate while processing says when the lease lapses');
			await assert.rejects(c.claim(key, { payload: { ticket: 43 } }), (e) => e instanceof airlock.PayloadMismatchError && e.status === 409);
			const lease = await c.heartbeat(key, cl.lease_owner, cl.version, { lease_seconds: 60 });
			assert.equal(lease.version, 1, 'a heartbeat moves the lease, not the version');
			assert.ok(lease.expires_at > cl.lease_expires_at);
			await assert.rejects(c.heartbeat(key, 'not-the-owner', 1), airlock.LeaseLostError);
			await assert.rejects(c.transition(key, cl.lease_owner, 9, 'completed'), airlock.VersionConflictError);
			const t = await c.transition(key, cl.lease_owner, 1, 'completed', { result: { reply_id: 'r-1' } });
			assert.equal(t.state, 'completed');
			const again = await c.claim(key, { payload: { ticket: 42 } });
			assert.deepEqual([again.claimed, again.state, again.result], [false, 'completed', { reply_id: 'r-1' }]);
			const run = await c.run(key);
			assert.equal(run.duplicates, 2);
			const { events, next_after } = await c.events(key);
			assert.ok(events.some((e) => e.kind === 'claimed'));
			assert.equal(next_after, 0);
			const page = await c.events(key, { limit: 1 });
			assert.equal(page.next_after, page.events[0].id);
			assert.equal((await c.explain(key)).processed.state, 'completed');
		});

		test('transition with alert tells a person (workflow_gave_up)', async () => {
			// alert on failed_terminal raises workflow_gave_up with the reason; with any other
			// state the server refuses it (invalid_field) and writes nothing.
			const { c, key, cl } = await claimed('gaveup');
			const alerts = async (k) => (await c.events(k)).events.filter((e) => e.kind === 'alert').map((e) => e.detail);
			for (const to of ['completed', 'failed_retryable']) {
				await assert.rejects(c.transition(key, cl.lease_owner, cl.version, to, { alert: 'no' }), (e) => e instanceof airlock.InvalidFieldError && e.status === 400);
			}
			assert.deepEqual(await alerts(key), [], 'a refused transition wrote an alert');
			const t = await c.transition(key, cl.lease_owner, cl.version, 'failed_terminal', { result: { reason: 'invalid_model_output' }, alert: 'invalid model output after 2 repairs' });
			assert.equal(t.state, 'failed_terminal');
			const got = await alerts(key);
			assert.equal(got.length, 1, JSON.stringify(got));
			assert.deepEqual([got[0].alert, got[0].reason], ['workflow_gave_up', 'invalid model output after 2 repairs']);
			// Without alert a failed_terminal stays silent.
			const q = await claimed('gaveup-quiet');
			await q.c.transition(q.key, q.cl.lease_owner, q.cl.version, 'failed_terminal');
			assert.deepEqual(await alerts(q.key), []);
		});

		test("the payload hash is the server's", async () => {
			const c = client();
			for (const p of TRICKY) {
				const key = unique('hash');
				const cl = await c.claim(key, { payload: p });
				assert.equal(cl.payload_hash, hashInput(p), airlock.canonicalJSON(p));
				assert.equal((await c.claim(key, { payload_hash: hashInput(p) })).claimed, false);
			}
		});

		test('typed errors from the server', async () => {
			const c = client();
			await assert.rejects(c.run(unique('missing')), (e) => e instanceof airlock.RunNotFoundError && e.status === 404 && e.code === 'run_not_found');
			await assert.rejects(new Client(srv.url, 'not-a-key').run('x'), airlock.UnauthenticatedError);
			await assert.rejects(client('worker').claim(unique('w'), { payload: {} }), airlock.ForbiddenError);
			const { key, cl } = await claimed();
			await assert.rejects(c.ledger(key), airlock.LedgerNotFoundError);
			await assert.rejects(c.plan(key, 'e1', cl.lease_owner, { action: 'no_such_type', target: 't', input_hash: hashInput(1) }), airlock.UnknownActionTypeError);
			await assert.rejects(c.saveLedger(key, cl.lease_owner, { goal: '', invariants: [], completed: [], pending: [], next_allowed_action: 'x', checkpoint_version: 1 }), (e) => e instanceof airlock.InvalidLedgerError && e.errors.length > 0 && e.errors[0].pointer.startsWith('/'));
		});

		test('a lost reply is retried with the same key', async () => {
			const proxy = await lossyProxy(srv.url);
			try {
				const c = new Client(proxy.url, srv.keys.runs);
				const key = unique('lost');
				proxy.plan.push('drop');
				const cl = await c.claim(key, { payload: { n: 1 }, lease_seconds: 30 });
				assert.equal(cl.claimed, true, 'the retry is answered from the first request’s record, not as a duplicate');
				const [a, b] = proxy.seen.slice(-2);
				assert.equal(a.headers['idempotency-key'], b.headers['idempotency-key']);
				proxy.plan.push('503');
				const t0 = Date.now();
				await c.heartbeat(key, cl.lease_owner, cl.version);
				assert.ok(Date.now() - t0 >= 900, 'the retry waits the answer’s Retry-After');
				proxy.plan.push('drop');
				assert.equal((await c.transition(key, cl.lease_owner, cl.version, 'completed')).state, 'completed');
				const bare = new Client(proxy.url, srv.keys.runs, { retries: 0 });
				const key2 = unique('lost');
				proxy.plan.push('drop');
				await assert.rejects(bare.claim(key2, { payload: { n: 2 } }), airlock.TransportError);
				assert.equal((await bare.claim(key2, { payload: { n: 2 } })).claimed, false, 'a fresh key makes the retry a duplicate');
			} finally {
				await proxy.close();
			}
		});

		test('every mutating call sends its own Idempotency-Key', async () => {
			const proxy = await lossyProxy(srv.url);
			try {
				const c = new Client(proxy.url, srv.keys.runs);
				const w = new Client(proxy.url, srv.keys.worker);
				const key = unique('idem');
				const cl = await c.claim(key, { payload: { key } });
				const o = cl.lease_owner;
				await c.heartbeat(key, o, 1);
				await c.validate(key, o, 1, 'ticket_reply', { label: 'refund', text: 'ok' });
				await c.queueEffect(key, o, 1, 'fx_note', 'default', { payload: { n: 1 }, effect_id: 'n1' });
				const q = await c.queueEffect(key, o, 1, 'digest', 'team', { payload: { d: 1 }, effect_id: 'd1' });
				await c.cancelEffect(q.effect.id, { reason: 'test', lease_owner: o });
				const we = await w.claimEffect(['fx_note']);
				await w.completeEffect(we.id, we.lease_owner, { provider_id: 'p-1' });
				await c.saveLedger(key, o, { goal: 'g', invariants: [], completed: [], pending: ['a'], next_allowed_action: 'a', checkpoint_version: 1 });
				await c.plan(key, 'doc-1', o, { action: 'create_doc', target: 'docs', input_hash: hashInput('d') });
				await c.confirm(key, 'doc-1', o, 'doc://1');
				await c.recordToolCall(key, { tool: 'create_doc', class: 'effect', decision: 'allowed', effect_id: 'doc-1' });
				await c.reportFailure(key, o, 1, 'transport_timeout');
				await c.transition(key, o, 1, 'completed');
				const mutating = proxy.seen.filter((r) => r.method !== 'GET');
				assert.ok(mutating.length >= 14);
				for (const r of mutating) assert.ok(r.headers['idempotency-key'], `${r.method} ${r.path} sent no Idempotency-Key`);
				assert.equal(new Set(mutating.map((r) => r.headers['idempotency-key'])).size, mutating.length);
			} finally {
				await proxy.close();
			}
		});

		test('a pinned key gets the first answer back', async () => {
			const c = client();
			const key = unique('pinned');
			const first = await c.claim(key, { payload: { p: 1 } }, { idempotencyKey: key + '/claim' });
			const second = await c.claim(key, { payload: { p: 1 } }, { idempotencyKey: key + '/claim' });
			assert.equal(second.claimed, true);
			assert.equal(second.lease_owner, first.lease_owner);
			await assert.rejects(c.claim(key, { payload: { p: 2 } }, { idempotencyKey: key + '/claim' }), airlock.IdempotencyKeyReusedError);
		});

		test('validate and report a failure', async () => {
			const { c, key, cl } = await claimed('val');
			const v = await c.validate(key, cl.lease_owner, 1, 'ticket_reply', 'Here: ```json\n{"label": "refund", "text": "We refunded you."}\n```');
			assert.equal(v.valid, true);
			assert.deepEqual(v.value, { label: 'refund', text: 'We refunded you.' });
			await assert.rejects(c.validate(key, cl.lease_owner, v.version, 'crm_note', {}), airlock.NoSchemaError);
			let d = await c.reportFailure(key, cl.lease_owner, v.version, 'rate_limited', { retry_after_ms: 1500 });
			assert.deepEqual([d.decision, d.level], ['retry', 'transport']);
			assert.ok(d.retry_after_ms >= 1500);
			d = await c.reportFailure(key, cl.lease_owner, d.version, 'server_error');
			assert.deepEqual([d.decision, d.level, d.state], ['retry', 'business', 'failed_retryable']);
			const again = await c.claim(key, { payload: { key } });
			assert.ok(again.claimed && again.reclaimed);
			const bad = await c.validate(key, again.lease_owner, again.version, 'ticket_reply', { label: 'nope', text: 'x' });
			assert.equal(bad.valid, false);
			assert.ok(bad.errors.length > 0);
		});

		test('effects: queue, worker claim, complete, fail, unknown', async () => {
			const { c, key, cl } = await claimed('fx');
			const w = client('worker');
			const o = cl.lease_owner;
			const q = await c.queueEffect(key, o, 1, 'crm_note', 'default', { payload: { note: 'Refund' }, effect_id: 'n1' });
			assert.equal(q.created, true);
			assert.deepEqual([q.effect.state, q.effect.effect_id], ['pending', 'n1']);
			assert.equal((await c.queueEffect(key, o, 1, 'crm_note', 'default', { payload: { note: 'Refund' }, effect_id: 'n1' })).created, false);
			await assert.rejects(c.queueEffect(key, o, 1, 'crm_note', 'default', { payload: { note: 'other' }, effect_id: 'n1' }), airlock.EffectMismatchError);
			await c.queueEffect(key, o, 1, 'crm_note', 'second', { payload: { note: '2' }, effect_id: 'n2' });
			await c.queueEffect(key, o, 1, 'crm_note', 'third', { payload: { note: '3' }, effect_id: 'n3' });
			const got = {};
			for (let i = 0; i < 3; i++) {
				const we = await w.claimEffect(['crm_note'], { lease_seconds: 60 });
				got[we.effect_id] = we;
			}
			assert.equal(await w.claimEffect(['crm_note']), null, 'nothing more is due');
			assert.equal(got.n1.idempotency_key, `${key}/n1`);
			assert.deepEqual(got.n1.payload, { note: 'Refund' });
			const done = await w.completeEffect(got.n1.id, got.n1.lease_owner, { provider_id: 'crm-77' });
			assert.deepEqual([done.state, done.provider_id], ['completed', 'crm-77']);
			await assert.rejects(w.completeEffect(got.n2.id, 'not-the-lease'), airlock.LeaseLostError);
			assert.equal((await w.failEffect(got.n2.id, got.n2.lease_owner, { retryable: false, failureClass: 'http_400' })).state, 'failed');
			assert.equal((await w.unknownEffect(got.n3.id, got.n3.lease_owner, { failureClass: 'timeout' })).state, 'unknown');
			await assert.rejects(c.transition(key, o, 1, 'completed'), airlock.EffectsOpenError);
			const states = Object.fromEntries((await c.run(key)).effects.map((e) => [e.effect_id, e.state]));
			assert.deepEqual(states, { n1: 'completed', n2: 'failed', n3: 'unknown' });
		});

		test('cancel a windowed effect', async () => {
			const { c, key, cl } = await claimed('win');
			const q = await c.queueEffect(key, cl.lease_owner, 1, 'digest', 'team', { payload: { digest: 1 }, effect_id: 'd1' });
			assert.ok(q.not_before instanceof Date);
			assert.ok(q.cancel_url.includes('/'));
			await assert.rejects(c.cancelEffect(q.effect.id, { reason: 'nope', lease_owner: 'someone-else' }), airlock.LeaseLostError);
			assert.equal((await c.cancelEffect(q.effect.id, { reason: 'changed my mind', lease_owner: cl.lease_owner })).state, 'cancelled');
		});

		test('a queued approval and its status', async () => {
			const { c, key, cl } = await claimed('appr');
			const q = await c.queueEffect(key, cl.lease_owner, 1, 'share_doc', 'team', { payload: { doc: 1 }, effect_id: 's1' });
			assert.equal(q.effect, null);
			assert.ok(q.approval.approve_url.includes('/approve/'));
			assert.equal((await c.approvalStatus(key, q.approval.id)).status, 'pending');
			assert.equal(await srv.approve(q.approval.approve_url), 200);
			const st = await c.approvalStatus(key, q.approval.id);
			assert.deepEqual([st.status, st.approver], ['approved', 'lead']);
			await assert.rejects(c.approvalStatus(key, 'nope'), airlock.ApprovalNotFoundError);
		});

		test('listApprovals: keyset pages, undecidable, no token, operators only', async () => {
			const made = [];
			for (const action of ['share_doc', 'legal_share', 'legal_share']) {
				const { c, key, cl } = await claimed('list');
				const q = await c.queueEffect(key, cl.lease_owner, cl.version, action, 'team', { payload: { doc: key }, effect_id: 'e1' });
				assert.ok(q.approval);
				made.push({ key, approval: q.approval });
			}
			const keys = new Set(made.map((m) => m.key));
			const op = client('operator');
			const seen = [];
			let after = '';
			for (let pages = 0; ; pages++) {
				assert.ok(pages < 100, 'the pages never end');
				const page = await op.listApprovals({ limit: 1, after });
				assert.ok(page.approvals.length <= 1);
				seen.push(...page.approvals);
				after = page.next_after;
				if (!after) break;
			}
			assert.equal(new Set(seen.map((a) => a.id)).size, seen.length, 'no row on two pages');
			const mine = seen.filter((a) => keys.has(a.key));
			assert.deepEqual(mine.map((a) => a.key), made.map((m) => m.key).reverse(), 'newest first over pages');
			for (const [i, row] of mine.entries()) {
				const m = made[made.length - 1 - i];
				assert.deepEqual([row.id, row.mode, row.target], [m.approval.id, 'approve_before_act', 'team']);
				assert.ok(row.console_url.endsWith('/console/approvals/' + m.approval.id), row.console_url);
				assert.ok(row.created_at instanceof Date && row.expires_at > row.created_at);
				assert.ok(!JSON.stringify(row.raw).includes(m.approval.approve_url.split('/').pop()), 'no approval token in the list');
			}
			const byKey = Object.fromEntries(mine.map((a) => [a.key, a]));
			assert.deepEqual(byKey[made[0].key].approver_roles, ['support-lead']);
			assert.equal(byKey[made[0].key].undecidable_since, null);
			assert.deepEqual(byKey[made[1].key].approver_roles, ['legal']);
			assert.ok(byKey[made[1].key].undecidable_since instanceof Date);

			const stuck = await op.listApprovals({ undecidable: true, limit: 500 });
			assert.equal(stuck.next_after, '');
			assert.deepEqual(stuck.approvals.filter((a) => keys.has(a.key)).map((a) => a.key), [made[2].key, made[1].key], 'only the legal ones, newest first');
			assert.ok(stuck.approvals.every((a) => a.undecidable_since instanceof Date));
			const first = await op.listApprovals({ undecidable: true, limit: 1 });
			assert.notEqual(first.next_after, '');
			const second = await op.listApprovals({ undecidable: true, limit: 1, after: first.next_after });
			assert.deepEqual([...first.approvals, ...second.approvals].map((a) => a.key), stuck.approvals.slice(0, 2).map((a) => a.key));

			await assert.rejects(client('runs').listApprovals(), airlock.ForbiddenError);
			for (const bad of [{ limit: 501 }, { limit: -1 }, { after: 'x' }]) {
				await assert.rejects(op.listApprovals(bad), airlock.InvalidFieldError, JSON.stringify(bad));
			}
		});

		test('ledger: plan, confirm, crash, reconcile', async () => {
			const { c, key, cl } = await claimed('ledger');
			const o = cl.lease_owner;
			assert.equal((await c.resume(key)).verdict, 'continue');
			const l0 = { goal: 'Draft the report', invariants: ['never email customers'], completed: [], pending: ['draft', 'review'], next_allowed_action: 'draft', checkpoint_version: 1 };
			assert.equal(await c.saveLedger(key, o, l0), 1);
			await assert.rejects(c.saveLedger(key, o, l0), airlock.VersionConflictError);
			const l = await c.ledger(key);
			assert.deepEqual([l.run_id, l.checkpoint_version], [key, 1]);
			await assert.rejects(c.saveLedger(key, o, { ...l, invariants: ['anything goes'], checkpoint_version: 2 }), airlock.InvariantsChangedError);
			const h = hashInput({ title: 'Report', body: 'figures' });
			const req = { action: 'create_doc', target: 'docs', input_hash: h };
			assert.equal((await c.plan(key, 'doc-1', o, req)).execute, true);
			const r = await c.resume(key); // the process "crashed" between plan and confirm
			assert.equal(r.verdict, 'reconcile');
			assert.deepEqual(r.reconcile.map((i) => [i.effect_id, i.input_hash, i.run_id]), [['doc-1', h, key]]);
			await assert.rejects(c.plan(key, 'doc-1', o, req), airlock.ReconcileFirstError);
			assert.equal(await c.reconcile(key, 'doc-1', o, { found: [] }), 'cleared');
			assert.equal((await c.plan(key, 'doc-1', o, req)).execute, true);
			await c.confirm(key, 'doc-1', o, 'doc://1', { result: { url: 'https://docs/1' } });
			const again = await c.plan(key, 'doc-1', o, req);
			assert.deepEqual([again.execute, again.receipt, again.result], [false, 'doc://1', { url: 'https://docs/1' }]);
			await c.plan(key, 'doc-2', o, { ...req, input_hash: hashInput('two') });
			assert.equal(await c.reconcile(key, 'doc-2', o, { found: ['doc://a', 'doc://b'] }), 'unknown');
			assert.equal((await c.resume(key)).verdict, 'stop');
			await assert.rejects(c.plan(key, 'doc-1', o, { ...req, input_hash: hashInput('other') }), airlock.InputMismatchError);
		});

		test('a gated plan waits, then executes once', async () => {
			const { c, key, cl } = await claimed('gated');
			const req = { action: 'share_doc', target: 'team', input_hash: hashInput({ share: 'doc://1' }) };
			const p = await c.plan(key, 'share-1', cl.lease_owner, req);
			assert.equal(p.execute, false);
			assert.ok(p.approval);
			assert.equal((await c.resume(key)).verdict, 'wait');
			await srv.approve(p.approval.approve_url);
			const cl2 = await c.claim(key, { payload: { key } });
			assert.ok(cl2.claimed && cl2.reclaimed);
			assert.equal((await c.plan(key, 'share-1', cl2.lease_owner, req)).execute, true);
			await c.confirm(key, 'share-1', cl2.lease_owner, 'share://1');
			assert.equal((await c.plan(key, 'share-1', cl2.lease_owner, req)).receipt, 'share://1');
		});

		test('keepLease renews, and stops on loss', async () => {
			const { c, key, cl } = await claimed('lease', 1);
			await c.withLease(cl, { lease_seconds: 1, intervalMs: 200 }, async (lease) => {
				await new Promise((r) => setTimeout(r, 1600)); // past the 1 s lease
				lease.check();
				assert.ok(lease.beats > 3);
				await c.saveLedger(key, cl.lease_owner, { goal: 'g', invariants: [], completed: [], pending: ['a'], next_allowed_action: 'a', checkpoint_version: 1 }, { signal: lease.signal });
			});
			const other = await claimed('lease', 1);
			const lease = other.c.keepLease(other.cl, { lease_seconds: 1, intervalMs: 200 });
			try {
				await other.c.reportFailure(other.key, other.cl.lease_owner, 1, 'server_error');
				assert.ok((await other.c.claim(other.key, { payload: { key: other.key } })).reclaimed);
				await new Promise((resolve) => lease.signal.addEventListener('abort', resolve, { once: true }));
				assert.ok(lease.lost);
				assert.throws(() => lease.check(), airlock.LeaseLostError);
				assert.ok(lease.signal.reason instanceof airlock.LeaseLostError);
			} finally {
				lease.stop();
			}
		});

		test('verify asks airlock before acting', async () => {
			const { c, key, cl } = await claimed('verify', 1);
			// No heartbeat between (interval 60 s): the keeper's view goes stale, as in a pause.
			const lease = c.keepLease(cl, { lease_seconds: 1, intervalMs: 60000 });
			try {
				const renewed = await lease.verify(); // held: renewed for another lease_seconds
				assert.ok(renewed.expires_at);
				await new Promise((r) => setTimeout(r, 1300)); // paused past the lease
				const other = await c.claim(key, { payload: { key }, lease_seconds: 30 });
				assert.ok(other.reclaimed);
				lease.check(); // the keeper has not seen it
				await assert.rejects(lease.verify(), airlock.LeaseLostError);
				assert.ok(lease.lost);
				assert.throws(() => lease.check(), airlock.LeaseLostError);
			} finally {
				lease.stop();
			}
		});
	});
}
