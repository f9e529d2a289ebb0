// The shipped workflows import as they are documented (issue 24, 1): every credential a
// node names is in workflows/credentials.json with the same id and type and no secret,
// every workflow is imported inactive, and every placeholder URL in them is listed in
// docs/n8n.md's one table of what to set after import.
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
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
