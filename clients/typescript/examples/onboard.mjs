// Onboard a customer: three side effects, one of them gated, each done exactly once however
// often this process is killed. Usage: node onboard.mjs RUN_KEY PROVIDER_DIR (AIRLOCK_URL, AIRLOCK_API_KEY).
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ApprovalPendingError, Client, RejectedError } from 'airlock-client';

const c = new Client(process.env.AIRLOCK_URL, process.env.AIRLOCK_API_KEY);
const [key, provider] = process.argv.slice(2); // the run; a directory playing the external system

// The external system: one record per call; the receipt is its id.
async function write(call) {
	const id = `${call.action}-${process.hrtime.bigint()}`;
	writeFileSync(join(provider, id), JSON.stringify({ run: call.key, effect: call.effect_id, input: call.input }));
	return id;
}
// Its search: the ids of the records this effect may have left.
async function find(call) {
	const mine = (id) => { const r = JSON.parse(readFileSync(join(provider, id), 'utf8')); return r.run === call.key && r.effect === call.effect_id; };
	return readdirSync(provider).sort().filter(mine);
}

const options = { goal: 'Onboard alice', steps: ['draft', 'crm', 'share'], lease_seconds: 2, waitApprovalMs: Number(process.env.WAIT_APPROVAL_MS ?? 0) };
try {
	const result = await c.withRun(key, { customer: 'alice' }, options, async (run) => {
		if (run.finished) return run.result;
		const doc = await run.step('draft', 'create_doc', 'docs', { title: 'Welcome, Alice' }, write, { lookup: find });
		await run.step('crm', 'crm_note', 'crm', { customer: 'alice', note: 'onboarding' }, write, { lookup: find });
		await run.step('share', 'share_doc', 'team', { doc: doc.receipt, with: 'alice@example.com' }, write, { lookup: find });
		await run.complete({ doc: doc.receipt });
		return run.result;
	});
	console.log(JSON.stringify({ state: 'completed', result }));
} catch (e) {
	if (e instanceof ApprovalPendingError) console.error(`waiting for approval ${e.approval_id}: ${e.approve_url || e.console_url}`);
	else if (e instanceof RejectedError) console.error(`rejected by ${e.rejected_by}: ${e.reason}`);
	else throw e;
	process.exitCode = 3;
}
