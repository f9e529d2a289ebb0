// What `n8n-node build` does after tsc, without the CLI: copy icons next to the compiled
// nodes (the tests and the e2e script build with plain tsc).
import { cpSync, mkdirSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';

function walk(dir) {
	for (const e of readdirSync(dir, { withFileTypes: true })) {
		const p = join(dir, e.name);
		if (e.isDirectory()) walk(p);
		else if (/\.(svg|png)$/.test(e.name)) {
			mkdirSync(join('dist', dirname(p)), { recursive: true });
			cpSync(p, join('dist', p));
		}
	}
}
for (const d of ['nodes', 'credentials']) walk(d);
