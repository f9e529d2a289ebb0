// Plan input, every plan answer, rejections' reasons and the step API against a real
// airlock on SQLite and (when given) PostgreSQL; the onboarding example killed at every
// step boundary.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as airlock from '../index.js';
import { Client, hashInput } from '../index.js';
import { backends, repo, startAirlock, unique } from './harness.mjs';

const EXAMPLE = join(repo, 'clients', 'typescript', 'examples', 'onboard.mjs');
const CRASH = join(repo, 'clients', 'typescript', 'test', 'crash.mjs');
const POINTS = ['before_perform', 'after_perform', 'after_confirm'];
const STEPS = ['draft', 'crm', 'share'];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** approver decides every approval the run's plans open, after a moment, with `decision`. */
function approving(c, srv, decision = 'approve', reason = '') {
	const plan = c.plan.bind(c);
	c.plan = async (...a) => {
		const p = await plan(...a);
		if (p.approval) setTimeout(() => srv.approve(p.approval.approve_url, decision, reason), 300);
		return p;
	};
	return c;
}

for (const backend of backends()) {
	describe(`steps on ${backend}`, () => {
		let srv;
		const client = (scope = 'runs') => new Client(srv.url, srv.keys[scope]);
		const effectOf = async (key, id) => (await client().run(key)).effects.find((e) => e.effect_id === id);
		before(async () => {
			srv = await startAirlock(backend);
		});
		after(() => srv?.stop());

		test('plan input reaches the approval card', async () => {
			const c = client();
			const key = unique('input');
			const cl = await c.claim(key, { payload: { k: key }, lease_seconds: 30 });
			const refund = { order: 'A-1042', amount_jpy: 4800 };
			const p = await c.plan(key, 'refund-1', cl.lease_owner, { action: 'share_doc', target: 'team', input: refund });
			assert.ok(p.approval);
			const page = await srv.page(p.approval.approve_url);
			assert.match(page, /A-1042/);
			assert.match(page, /4800/);
			await assert.rejects(c.plan(key, 'refund-2', cl.lease_owner, { action: 'share_doc', target: 'team', input_hash: hashInput({ other: 1 }), input: refund }), airlock.InvalidFieldError);
		});

		test('sent without a provider id is a confirmed answer', async () => {
			const c = client();
			const key = unique('noid');
			const cl = await c.claim(key, { payload: { k: key }, lease_seconds: 30 });
			const doc = { title: 'Q4' };
			assert.equal((await c.plan(key, 'doc-1', cl.lease_owner, { action: 'create_doc', target: 'docs', input: doc })).execute, true);
			assert.equal(await c.reconcile(key, 'doc-1', cl.lease_owner, { undetermined: true }), 'unknown');
			const e = await effectOf(key, 'doc-1');
			await client('operator').request('POST', `/v1/effects/${e.id}/resolve`, { outcome: 'sent', no_provider_id: true, note: 'seen in the docs app', version: e.version });
			const p = await c.plan(key, 'doc-1', cl.lease_owner, { action: 'create_doc', target: 'docs', input: doc });
			assert.deepEqual([p.execute, p.confirmed, p.receipt, p.approval], [false, true, '', null]);
			await c.saveLedger(key, cl.lease_owner, { goal: 'g', invariants: [], completed: [], pending: ['doc-1'], next_allowed_action: 'doc-1', checkpoint_version: 1 });
			await c.transition(key, cl.lease_owner, cl.version, 'failed_retryable');
			await c.withRun(key, { k: key }, { steps: ['doc-1'] }, async (run) => {
				const r = await run.step('doc-1', 'create_doc', 'docs', doc, async () => assert.fail('performed again'));
				assert.deepEqual([r.receipt, r.replayed, r.confirmed], ['', true, true]);
			});
			assert.deepEqual((await c.ledger(key)).completed.map((s) => s.step), ['doc-1']);
		});

		test("a rejection's reason reaches the agent", async () => {
			const c = client();
			const key = unique('reject');
			let pending;
			await c.withRun(key, { k: key }, { lease_seconds: 5 }, async (run) => {
				pending = await run.step('share', 'share_doc', 'team', { doc: 'doc://1' }, async () => assert.fail('performed')).catch((e) => e);
			});
			assert.ok(pending instanceof airlock.ApprovalPendingError, String(pending));
			assert.ok(pending.approve_url);
			assert.ok(pending.console_url.endsWith('/console/approvals/' + pending.approval_id));
			// A restarted agent whose run still waits learns which approval, and where to see it.
			const again = await c.openRun(key, { k: key }).catch((e) => e);
			assert.ok(again instanceof airlock.ApprovalPendingError, String(again));
			assert.deepEqual([again.approval_id, again.effect_id, again.console_url], [pending.approval_id, 'share', pending.console_url]);
			assert.equal(await srv.approve(pending.approve_url, 'reject', 'not before legal has read it'), 200);
			const rej = await c.openRun(key, { k: key }).catch((e) => e);
			assert.ok(rej instanceof airlock.RejectedError, String(rej));
			assert.deepEqual([rej.reason, rej.rejected_by, rej.effect_id, rej.approval_id], ['not before legal has read it', 'lead', 'share', pending.approval_id]);

			const key2 = unique('reject-wait');
			const c2 = approving(client(), srv, 'reject', 'wrong team');
			const err = await c2.withRun(key2, { k: key2 }, { lease_seconds: 5 }, (run) =>
				run.step('share', 'share_doc', 'team', { doc: 'doc://2' }, async () => assert.fail('performed'), { waitApprovalMs: 20000 })).catch((e) => e);
			assert.ok(err instanceof airlock.RejectedError, String(err));
			assert.deepEqual([err.reason, err.effect_id], ['wrong team', 'share']);
		});

		test('a skip_effect rejection is a RejectedError and the run goes on', async () => {
			// The step throws RejectedError (who, why, which, from the answer's details),
			// records the step as settled without performing it, and the next step works; a
			// later start answers the same, and a waiting step too.
			const c = client();
			const key = unique('skip');
			const steps = ['a', 'post', 'b'];
			let pending;
			await c.withRun(key, { k: key }, { steps, lease_seconds: 5 }, async (run) => {
				await run.step('a', 'create_doc', 'docs', { n: 1 }, async () => 'r-a');
				pending = await run.step('post', 'post_update', 'team', { text: 'hello' }, async () => assert.fail('performed')).catch((e) => e);
			});
			assert.ok(pending instanceof airlock.ApprovalPendingError, String(pending));
			assert.equal(await srv.approve(pending.approve_url, 'reject', 'not this week'), 200);
			// The low-level call: the generated class, also a RejectedError, filled from details.
			const cl = await c.claim(key, { payload: { k: key }, lease_seconds: 30 });
			const low = await c.plan(key, 'post', cl.lease_owner, { action: 'post_update', target: 'team', input: { text: 'hello' } }).catch((e) => e);
			assert.ok(low instanceof airlock.EffectRejectedError && low instanceof airlock.RejectedError && low instanceof airlock.APIError, String(low));
			assert.deepEqual(low.details, { effect_id: 'post', approval_id: pending.approval_id, rejected_by: 'lead', reason: 'not this week' });
			assert.ok(!(new airlock.LeaseLostError(409, 'lease_lost', 'x') instanceof airlock.RejectedError));
			await c.transition(key, cl.lease_owner, cl.version, 'failed_retryable');
			for (let i = 0; i < 2; i++) { // a second start answers the same and records the step once
				await c.withRun(key, { k: key }, { steps, lease_seconds: 5 }, async (run) => {
					const e = await run.step('post', 'post_update', 'team', { text: 'hello' }, async () => assert.fail('performed')).catch((x) => x);
					assert.ok(e instanceof airlock.RejectedError, String(e));
					assert.deepEqual([e.reason, e.rejected_by, e.effect_id, e.approval_id, e.code], ['not this week', 'lead', 'post', pending.approval_id, 'effect_rejected']);
					assert.equal(run.ledger.next_allowed_action, 'b');
				});
			}
			await c.withRun(key, { k: key }, { steps, lease_seconds: 5 }, async (run) => {
				assert.equal((await run.step('b', 'crm_note', 'crm', { n: 2 }, async () => 'r-b')).receipt, 'r-b');
				await run.complete();
			});
			assert.deepEqual((await c.ledger(key)).completed.map((s) => [s.step, s.evidence]), [['a', 'r-a'], ['post', 'rejected://' + pending.approval_id], ['b', 'r-b']]);

			const key2 = unique('skip-wait');
			const c2 = approving(client(), srv, 'reject', 'wrong channel');
			await c2.withRun(key2, { k: key2 }, { steps: ['post', 'b'], lease_seconds: 5 }, async (run) => {
				const e = await run.step('post', 'post_update', 'team', { text: 'hi' }, async () => assert.fail('performed'), { waitApprovalMs: 20000 }).catch((x) => x);
				assert.ok(e instanceof airlock.RejectedError, String(e));
				assert.deepEqual([e.reason, e.effect_id], ['wrong channel', 'post']);
				assert.ok(e.approval_id);
				assert.equal((await run.step('b', 'crm_note', 'crm', { n: 3 }, async () => 'r-b2')).receipt, 'r-b2');
				await run.complete();
			});
			assert.equal((await c.run(key2)).state, 'completed');
		});

		test('steps wait for an approval, then perform once', async () => {
			const c = approving(client(), srv);
			const key = unique('steps');
			const done = [];
			const perform = async (s) => {
				done.push(s.effect_id);
				assert.equal(s.idempotency_key, `${key}/${s.effect_id}`);
				return 'r-' + s.effect_id;
			};
			await c.withRun(key, { k: key }, { steps: ['a', 'b', 'share'], lease_seconds: 5, waitApprovalMs: 20000 }, async (run) => {
				assert.equal(run.ledger.next_allowed_action, 'a');
				assert.equal((await run.step('a', 'create_doc', 'docs', { n: 1 }, perform)).replayed, false);
				assert.equal((await run.step('a', 'create_doc', 'docs', { n: 1 }, perform)).replayed, true);
				await run.step('b', 'crm_note', 'crm', { n: 2 }, perform);
				const before = run.lease_owner;
				const r = await run.step('share', 'share_doc', 'team', { n: 3 }, perform);
				assert.deepEqual([r.receipt, r.replayed], ['r-share', false]);
				assert.notEqual(run.lease_owner, before, 'the run was claimed again after the approval');
				await run.complete({ ok: true });
			});
			assert.deepEqual(done, ['a', 'b', 'share']);
			const l = await c.ledger(key);
			assert.deepEqual(l.completed.map((s) => [s.step, s.evidence]), [['a', 'r-a'], ['b', 'r-b'], ['share', 'r-share']]);
			assert.deepEqual([l.pending, l.next_allowed_action], [[], airlock.DONE]);
			assert.equal((await c.run(key)).state, 'completed');
			const again = await c.openRun(key, { k: key });
			assert.equal(again.finished, true);
			assert.deepEqual(again.result, { ok: true });
			await assert.rejects(again.step('a', 'create_doc', 'docs', { n: 1 }, perform), airlock.RunFinishedError);
		});

		test('reconcile calls lookup', async () => {
			const c = client();
			for (const [found, want] of [[[], 'performed'], [['r-old'], 'r-old'], [['x', 'y'], airlock.NeedsPersonError], [null, airlock.NeedsPersonError], [undefined, 'nolookup']]) {
				const key = unique('lookup');
				const cl = await c.claim(key, { payload: { k: key }, lease_seconds: 1 });
				assert.equal((await c.plan(key, 'e', cl.lease_owner, { action: 'create_doc', target: 'docs', input: { n: 1 } })).execute, true);
				await sleep(1200); // the process "died" after planning: its lease lapses
				await c.withRun(key, { k: key }, { lease_seconds: 5 }, async (run) => {
					const opts = want === 'nolookup' ? {} : { lookup: async () => found };
					const out = await run.step('e', 'create_doc', 'docs', { n: 1 }, async () => 'performed', opts).catch((e) => e);
					if (typeof want === 'string' && want !== 'nolookup') assert.equal(out.receipt, want);
					else {
						assert.ok(out instanceof airlock.NeedsPersonError, String(out));
						assert.equal(out.effect_id, 'e');
					}
				});
			}
		});

		test('a held run is waited out, or refused', async () => {
			const c = client();
			const key = unique('busy');
			await c.claim(key, { payload: { k: key }, lease_seconds: 2 });
			await assert.rejects(c.openRun(key, { k: key }, { waitLeaseMs: 0 }), airlock.RunBusyError);
			const t0 = Date.now();
			await c.withRun(key, { k: key }, { waitLeaseMs: 10000 }, async (run) => assert.equal(run.reclaimed, true));
			assert.ok(Date.now() - t0 > 500);
		});

		test('a lost lease stops the steps', async () => {
			const c = client();
			const key = unique('lost');
			const run = await c.openRun(key, { k: key }, { lease_seconds: 1 });
			run.lease.stop(); // heartbeats stop (a paused process): the lease lapses, another takes it
			await sleep(1300);
			assert.equal((await c.claim(key, { payload: { k: key }, lease_seconds: 30 })).claimed, true);
			await assert.rejects(run.step('e', 'create_doc', 'docs', { n: 1 }, async () => assert.fail('performed after losing the lease')), airlock.LeaseLostError);
		});

		test('the example, killed at every step boundary, performs each effect once', async () => {
			for (const step of STEPS) {
				for (const point of POINTS) {
					const base = mkdtempSync(join(tmpdir(), 'onboard-ts-'));
					const provider = join(base, 'provider');
					mkdirSync(provider);
					const key = unique('onboard');
					const runExample = (crash = '') => spawnSync(process.execPath, [CRASH, EXAMPLE, key, provider], {
						env: { ...process.env, AIRLOCK_URL: srv.url, AIRLOCK_API_KEY: srv.keys.runs, AGENT_CRASH_AT: crash, AGENT_CRASH_MARK: join(base, 'crashed') },
						encoding: 'utf8', timeout: 120000,
					});
					const outcomes = [];
					for (let i = 0; i < 8; i++) {
						const p = runExample(`${point}:${step}`);
						if (p.signal === 'SIGKILL') { outcomes.push('killed'); continue; }
						const m = /waiting for approval \S+: (\S+)/.exec(p.stderr);
						if (m) { outcomes.push('pending'); assert.equal(await srv.approve(m[1]), 200); continue; }
						assert.equal(p.status, 0, p.stderr);
						outcomes.push('completed');
						break;
					}
					const what = `${step} ${point}: ${outcomes}`;
					assert.equal(outcomes.at(-1), 'completed', what);
					assert.ok(outcomes.includes('killed'), what);
					const records = readdirSync(provider).map((f) => JSON.parse(readFileSync(join(provider, f), 'utf8')));
					assert.deepEqual(records.map((r) => r.effect).sort(), [...STEPS].sort(), what);
					const c = client();
					assert.deepEqual((await c.ledger(key)).completed.map((s) => s.step), STEPS, what);
					const run = await c.run(key);
					assert.equal(run.state, 'completed');
					assert.deepEqual(Object.fromEntries(run.effects.map((e) => [e.effect_id, e.state])), { draft: 'completed', crm: 'completed', share: 'completed' });
					const p = runExample();
					assert.equal(p.status, 0, p.stderr);
					assert.equal(readdirSync(provider).length, 3);
					rmSync(base, { recursive: true, force: true });
				}
			}
		});
	});
}
