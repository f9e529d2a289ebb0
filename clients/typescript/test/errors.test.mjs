// The client's error classes are the server's error codes: no more, no fewer. The codes
// come from internal/httpapi's source (every `http.Status…, "code"` and `Code: "…"`) and
// from the OpenAPI document's Error enum, so a code added to the server without a class
// here fails this test.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import * as airlock from '../index.js';
import { repo } from './harness.mjs';

const httpapi = join(repo, 'internal', 'httpapi');

function serverCodes() {
	const codes = new Set();
	for (const f of readdirSync(httpapi)) {
		if (!f.endsWith('.go') || f.endsWith('_test.go')) continue;
		const src = readFileSync(join(httpapi, f), 'utf8');
		for (const m of src.matchAll(/http\.Status[A-Za-z]+,\s*"([a-z_]+)"/g)) codes.add(m[1]);
		for (const m of src.matchAll(/Code:\s*"([a-z_]+)"/g)) codes.add(m[1]);
	}
	const doc = JSON.parse(readFileSync(join(httpapi, 'openapi.json'), 'utf8'));
	for (const c of doc.components.schemas.Error.properties.error.enum) codes.add(c);
	return codes;
}

test('one class per server code', () => {
	const want = serverCodes();
	assert.ok(want.size > 40);
	assert.deepEqual([...airlock.CODES].filter((c) => !want.has(c)), [], 'classes for codes the server never answers');
	assert.deepEqual([...want].filter((c) => !airlock.CODES.includes(c)).sort(), [], 'server codes without a class in errors.js');
});

test('classes are exported, declared and named for their code', () => {
	const dts = readFileSync(new URL('../index.d.ts', import.meta.url), 'utf8');
	for (const code of airlock.CODES) {
		const name = code.split('_').map((p) => p[0].toUpperCase() + p.slice(1)).join('') + 'Error';
		const Cls = airlock[name];
		assert.equal(Cls.code, code);
		const e = airlock.errorFor(409, { error: code, message: 'm' });
		assert.ok(e instanceof Cls && e instanceof airlock.APIError);
		assert.deepEqual([e.status, e.code, e.apiMessage, e.name], [409, code, 'm', name]);
		assert.ok(dts.includes(`export class ${name} extends APIError { static readonly code: '${code}';`), `index.d.ts declares ${name}`);
	}
	const other = airlock.errorFor(502, '<html>bad gateway</html>');
	assert.equal(other.constructor, airlock.APIError);
	assert.equal(other.code, '');
});
