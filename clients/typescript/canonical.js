// The JSON Canonicalization Scheme (RFC 8785) and the hash airlock compares. JavaScript
// already prints numbers as RFC 8785 asks (ECMAScript's Number.prototype.toString, which
// JSON.stringify uses) and compares strings by UTF-16 code units, so canonical JSON is
// JSON.stringify with object keys sorted by the default sort.
import { createHash } from 'node:crypto';

function write(v, out) {
	if (v === null) return void out.push('null');
	switch (typeof v) {
		case 'boolean':
			return void out.push(v ? 'true' : 'false');
		case 'string':
			return void out.push(JSON.stringify(v));
		case 'number':
			if (!Number.isFinite(v)) throw new TypeError(`canonical JSON has no representation for ${v}`);
			return void out.push(JSON.stringify(v)); // -0 prints as 0
		case 'bigint':
			throw new TypeError('canonical JSON: a BigInt is not an IEEE 754 double; convert it to a Number or a string');
		case 'object': {
			if (typeof v.toJSON === 'function') return write(v.toJSON(), out);
			if (Array.isArray(v)) {
				out.push('[');
				v.forEach((item, i) => {
					if (i) out.push(',');
					write(item === undefined || typeof item === 'function' ? null : item, out);
				});
				return void out.push(']');
			}
			out.push('{');
			let first = true;
			for (const k of Object.keys(v).sort()) {
				const item = v[k];
				if (item === undefined || typeof item === 'function' || typeof item === 'symbol') continue;
				if (!first) out.push(',');
				first = false;
				out.push(JSON.stringify(k), ':');
				write(item, out);
			}
			return void out.push('}');
		}
	}
	throw new TypeError(`canonical JSON: cannot encode ${typeof v}`);
}

/** canonicalJSON is v in RFC 8785 canonical form (a string; UTF-8 when hashed). */
export function canonicalJSON(v) {
	const out = [];
	write(v, out);
	return out.join('');
}

/** hashInput is SHA-256, lowercase hex, of v's canonical JSON: airlock's payload hash of v.
 * Hash only what defines the effect, never a timestamp or a random id. */
export function hashInput(v) {
	return createHash('sha256').update(canonicalJSON(v), 'utf8').digest('hex');
}
