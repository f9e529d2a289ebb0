// A real airlock for the client's tests: the binary built from this repository (or
// $AIRLOCK_BIN), migrated on a fresh database and served on a free port. SQLite always;
// PostgreSQL when AIRLOCK_TEST_DATABASE_URL is set (scripts/with-postgres.sh), on a fresh
// schema created with psql. Under CI=true a missing PostgreSQL fails instead of skipping.
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
export const repo = resolve(here, '../../..');

export const POLICY = `
actions:
  create_doc: {connector: worker, gate: none}
  crm_note: {connector: worker, gate: none}
  fx_note: {connector: worker, gate: none}
  share_doc:
    connector: worker
    gate: approve_before_act
    approvers: {roles: [support-lead]}
  post_update:
    connector: worker
    gate: approve_before_act
    approvers: {roles: [support-lead]}
    approval: {on_reject: skip_effect}
  legal_share:
    connector: worker
    gate: approve_before_act
    approvers: {roles: [legal]}
  digest:
    connector: worker
    gate: act_with_window
    reversible: true
    window: 1h
    approvers: {roles: [support-lead]}
  ticket_reply:
    connector: worker
    gate: none
    schema:
      type: object
      required: [label, text]
      additionalProperties: false
      properties:
        label: {enum: [refund, shipping, other]}
        text: {type: string, maxLength: 2000}
validation: {max_repairs: 2}
retry:
  server_error: {retry: business, max_attempts: 3, backoff: 1s, max_backoff: 2s}
`;

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

function freePort() {
	return new Promise((ok, fail) => {
		const s = createServer();
		s.once('error', fail);
		s.listen(0, '127.0.0.1', () => {
			const { port } = s.address();
			s.close(() => ok(port));
		});
	});
}

/** startAirlock serves airlock on backend with policy; returns {url, keys, approve, stop, run}. */
export async function startAirlock(backend = 'sqlite', policy = POLICY) {
	const dir = mkdtempSync(join(tmpdir(), 'airlock-ts-'));
	let db = join(dir, 'airlock.db');
	let schema = '';
	const pg = process.env.AIRLOCK_TEST_DATABASE_URL;
	if (backend === 'postgres') {
		schema = 'ts_' + randomBytes(6).toString('hex');
		execFileSync('psql', ['-q', '-v', 'ON_ERROR_STOP=1', pg, '-c', `CREATE SCHEMA ${schema}`], { stdio: ['ignore', 'ignore', 'inherit'] });
		db = pg + (pg.includes('?') ? '&' : '?') + 'search_path=' + schema;
	}
	writeFileSync(join(dir, 'airlock.yaml'), policy);
	const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('AIRLOCK_')));
	Object.assign(env, { AIRLOCK_DATABASE_URL: db, AIRLOCK_CONFIG: join(dir, 'airlock.yaml'), AIRLOCK_LOG_LEVEL: 'error' });
	const run = (args, extra = {}) => execFileSync(binary(), args, { env: { ...env, ...extra }, encoding: 'utf8' }).trim();
	run(['migrate']);
	const keys = {};
	for (const s of ['runs', 'worker', 'operator', 'admin']) keys[s] = run(['apikey', 'create', '--name', 'ts-' + s, '--scope', s]);
	run(['user', 'add', APPROVER[0], '--role', 'support-lead'], { AIRLOCK_USER_PASSWORD: APPROVER[1] });
	let proc, url;
	for (let attempt = 0; attempt < 5 && !url; attempt++) {
		const port = await freePort();
		proc = spawn(binary(), ['serve'], { env: { ...env, AIRLOCK_LISTEN: `127.0.0.1:${port}` }, stdio: ['ignore', 'ignore', 'inherit'] });
		const exited = new Promise((r) => proc.once('exit', () => r(false)));
		const ready = (async () => {
			for (let i = 0; i < 400; i++) {
				try {
					if ((await fetch(`http://127.0.0.1:${port}/readyz`)).ok) return true;
				} catch {}
				await new Promise((r) => setTimeout(r, 50));
			}
			return false;
		})();
		if (await Promise.race([ready, exited])) url = `http://127.0.0.1:${port}`;
		else proc.kill('SIGKILL');
	}
	if (!url) throw new Error('airlock did not start');
	// Should this process die before stop(), the server must not outlive it.
	const watchdog = spawn('sh', ['-c', 'while kill -0 "$0" 2>/dev/null; do sleep 0.5; done; kill "$1" 2>/dev/null', String(process.pid), String(proc.pid)], { stdio: 'ignore', detached: true });
	watchdog.unref();
	return {
		url,
		keys,
		env,
		dir,
		run,
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
			watchdog.kill();
			if (proc.exitCode === null) {
				proc.kill('SIGTERM');
				await new Promise((r) => proc.once('exit', r));
			}
			if (schema) {
				try {
					execFileSync('psql', ['-q', pg, '-c', `DROP SCHEMA ${schema} CASCADE`], { stdio: 'ignore' });
				} catch {}
			}
			rmSync(dir, { recursive: true, force: true });
		},
	};
}
