// docs/agents-typescript.md's walkthrough, run as written: its ```sh walkthrough blocks in
// order in one bash, with its ```js walkthrough blocks saved as walkthrough.mjs, against the
// built binary (its fixed port 8080 becomes a free one).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { binary, repo } from './harness.mjs';

const blocks = (doc, lang) => [...doc.matchAll(new RegExp('```' + lang + ' walkthrough\\n([\\s\\S]*?)```', 'g'))].map((m) => m[1]);
const freePort = () => new Promise((ok) => { const s = createServer(); s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => ok(port)); }); });

test('the walkthrough of docs/agents-typescript.md runs', async () => {
	const doc = readFileSync(join(repo, 'docs', 'agents-typescript.md'), 'utf8');
	const sh = blocks(doc, 'sh');
	const js = blocks(doc, 'js');
	assert.ok(sh.length >= 2 && js.length >= 4);
	const dir = mkdtempSync(join(tmpdir(), 'airlock-ts-doc-'));
	try {
		symlinkSync(binary(), join(dir, 'airlock'));
		symlinkSync(join(repo, 'clients'), join(dir, 'clients'));
		const listen = `127.0.0.1:${await freePort()}`;
		writeFileSync(join(dir, 'walkthrough.mjs'), js.join('\n').replaceAll('127.0.0.1:8080', listen));
		const script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + sh.join('\n').replaceAll('127.0.0.1:8080', listen) + '\nwait\n';
		const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('AIRLOCK_')));
		env.AIRLOCK_LISTEN = listen; // serve's default is 127.0.0.1:8080
		const p = spawnSync('bash', ['-c', script], { cwd: dir, env, encoding: 'utf8', timeout: 120000 });
		const out = p.stdout + p.stderr;
		assert.equal(p.status, 0, `the walkthrough failed:\n${out}`);
		const lines = p.stdout.split('\n').map((l) => l.trim());
		assert.ok(lines.includes('killed (exit 137)'), out);
		assert.ok(lines.includes('claimed, reclaimed: true verdict: reconcile'), out);
		assert.ok(lines.includes('reconciled share-draft-01 -> confirmed'), out);
		assert.ok(lines.some((l) => l.startsWith('already confirmed: doc://')), out);
		assert.ok(lines.includes('completed'), out);
		assert.equal(lines.filter((l) => l !== '').at(-1), '1', 'exactly one document: ' + out);
	} finally {
		rmSync(dir, { recursive: true, force: true });
	}
});

test('docs/agents-typescript.md shows the step agent as it is tested', () => {
	const doc = readFileSync(join(repo, 'docs', 'agents-typescript.md'), 'utf8');
	const src = readFileSync(join(repo, 'clients', 'typescript', 'examples', 'onboard.mjs'), 'utf8');
	assert.ok(doc.includes('```js\n' + src + '```'), 'the doc does not show examples/onboard.mjs as it is');
	assert.ok(src.split('\n').length - 1 < 40, 'the step agent is under 40 lines');
});
