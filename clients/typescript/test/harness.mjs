// A real airlock for the client's tests: the binary built from this repository (or
// $AIRLOCK_BIN), started by clients/testdata/serve.sh (the start-a-server helper the
// Python tests share) with clients/testdata/policy.yaml. SQLite always; PostgreSQL when
// AIRLOCK_TEST_DATABASE_URL is set (scripts/with-postgres.sh), on a fresh schema. Under
// CI=true a missing PostgreSQL fails instead of skipping.
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createInterface } from 'node:readline';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
export const repo = resolve(here, '../../..');

const testdata = join(repo, 'clients', 'testdata');
/** POLICY is the client tests' one policy file. */
export const POLICY = join(testdata, 'policy.yaml');

export const APPROVER = ['lead', 'correct horse battery staple'];

let built;
/** binary is $AIRLOCK_BIN, or airlock built once per test process. */
export function binary() {
	if (process.env.AIRLOCK_BIN) return process.env.AIRLOCK_BIN;
	if (built) return built;
	const dir = mkdtempSync(join(tmpdir(), 'airlock-ts-bin-'));
	built = join(dir, 'airlock');
	execFileSync('go', ['build', '-o', built, './cmd/airlock'], { cwd: repo, env: { ...process.env, GOTOOLCHAIN: 'local' }, stdio: ['ignore', 'inherit', 'inherit'] });
	process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
	return built;
}

/** backends are the stores to test: sqlite, and postgres when a test database is given. */
export function backends() {
	if (process.env.AIRLOCK_TEST_DATABASE_URL) return ['sqlite', 'postgres'];
	if (process.env.CI === 'true') throw new Error('AIRLOCK_TEST_DATABASE_URL is not set: under CI the PostgreSQL tests must run (scripts/test-clients.sh)');
	return ['sqlite'];
}

export const unique = (prefix) => `${prefix}-${randomBytes(4).toString('hex')}`;

/** startAirlock serves airlock (serve.sh) on backend with the policy file; returns {url, keys, dir, approve, page, stop}. */
export async function startAirlock(backend = 'sqlite', policy = POLICY) {
	// serve.sh stops airlock and removes its database when its stdin closes: when stop()
	// closes it, or when this process dies before stop().
	const proc = spawn(join(testdata, 'serve.sh'), [backend, policy], { env: { ...process.env, AIRLOCK_BIN: binary() }, stdio: ['pipe', 'pipe', 'inherit'] });
	const exited = new Promise((r) => proc.once('exit', r));
	const lines = createInterface({ input: proc.stdout });
	const first = await Promise.race([new Promise((r) => lines.once('line', r)), exited.then(() => null)]);
	lines.close();
	if (!first) throw new Error("airlock did not start (serve.sh's reason is on stderr)");
	const { url, dir, keys } = JSON.parse(first);
	return {
		url,
		keys,
		dir,
		/** approve decides on the page as a signed-in person would (Origin set: airlock refuses cross-site posts). */
		async approve(approveURL, decision = 'approve', reason = '') {
			const headers = { Origin: url, 'Content-Type': 'application/x-www-form-urlencoded' };
			const login = await fetch(url + '/login', { method: 'POST', headers, body: new URLSearchParams({ username: APPROVER[0], password: APPROVER[1] }), redirect: 'manual' });
			const cookie = login.headers.getSetCookie().map((c) => c.split(';')[0]).join('; ');
			const form = new URLSearchParams({ decision });
			if (reason) form.set('reason', reason);
			const res = await fetch(approveURL, { method: 'POST', headers: { ...headers, Cookie: cookie }, body: form, redirect: 'manual' });
			await res.text();
			return res.status;
		},
		/** page is the approval page as the signed-in approver sees it. */
		async page(approveURL) {
			const headers = { Origin: url, 'Content-Type': 'application/x-www-form-urlencoded' };
			const login = await fetch(url + '/login', { method: 'POST', headers, body: new URLSearchParams({ username: APPROVER[0], password: APPROVER[1] }), redirect: 'manual' });
			const cookie = login.headers.getSetCookie().map((c) => c.split(';')[0]).join('; ');
			return (await fetch(approveURL, { headers: { Cookie: cookie } })).text();
		},
		async stop() {
			if (proc.exitCode === null) {
				proc.stdin.end();
				await exited;
			}
		},
	};
}
