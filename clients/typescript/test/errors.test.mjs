// The client's error classes are the server's error codes: no more, no fewer. The classes
// are generated (make generate) from the server's one list of codes,
// internal/errcodes/errcodes.go, which also writes the OpenAPI document's Error enum; a Go
// test holds that list to what the server answers. Here: the classes are exactly the
// enum's codes, so a hand edit of either, or a forgotten make generate, fails.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import * as airlock from '../index.js';
import { repo } from './harness.mjs';

function serverCodes() {
	const doc = JSON.parse(readFileSync(join(repo, 'internal', 'httpapi', 'openapi.json'), 'utf8'));
	const codes = doc.components.schemas.Error.properties.error.enum;
	assert.equal(new Set(codes).size, codes.length, 'a code is listed twice in the OpenAPI Error enum');
	return new Set(codes);
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
