// A real airlock for the node's tests, and the part of n8n's execution context the node
// uses. airlock is built from this repository and started on a free port with SQLite and
// a policy file; nothing of airlock is stubbed. The context does what n8n 1.123 does for
// these calls (credentials as a Bearer header, returnFullResponse, ignoreHttpStatusErrors,
// node parameter defaults, $('Node').item.json.field expressions); the e2e script
// (scripts/e2e-n8n.sh) runs the node in a real n8n.
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const require = createRequire(import.meta.url);
const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, '../../..');

export const { Airlock, OUTPUTS, classifyError, classifySendError } = require('../dist/nodes/Airlock/Airlock.node.js');
export const { AirlockApi } = require('../dist/credentials/AirlockApi.credentials.js');

export const POLICY = `
actions:
  ticket_reply:
    connector: worker
    gate: approve_before_act
    approvers: {roles: [support-lead]}
    schema:
      type: object
      required: [label, text]
      additionalProperties: false
      properties:
        label: {enum: [refund, shipping, other]}
        text: {type: string, maxLength: 2000}
  crm_note:
    connector: worker
    gate: none
validation: {max_repairs: 2}
retry:
  server_error: {retry: business, max_attempts: 3, backoff: 1s, max_backoff: 2s}
`;

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

/** startAirlock builds airlock (or uses $AIRLOCK_BIN), migrates a fresh SQLite file,
 * creates API keys and serves on a free port. */
export async function startAirlock() {
	const dir = mkdtempSync(join(tmpdir(), 'airlock-n8n-test-'));
	let bin = process.env.AIRLOCK_BIN;
	if (!bin) {
		bin = join(dir, 'airlock');
		execFileSync('go', ['build', '-o', bin, './cmd/airlock'], {
			cwd: repo,
			env: { ...process.env, GOTOOLCHAIN: 'local' },
			stdio: ['ignore', 'inherit', 'inherit'],
		});
	}
	writeFileSync(join(dir, 'airlock.yaml'), POLICY);
	const port = await freePort();
	const env = {
		...process.env,
		AIRLOCK_DATABASE_URL: join(dir, 'airlock.db'),
		AIRLOCK_CONFIG: join(dir, 'airlock.yaml'),
		AIRLOCK_LISTEN: `127.0.0.1:${port}`,
		AIRLOCK_LOG_LEVEL: 'warn',
	};
	const run = (...args) => execFileSync(bin, args, { env, encoding: 'utf8' }).trim();
	run('migrate');
	const keys = {
		runs: run('apikey', 'create', '--name', 'n8n', '--scope', 'runs'),
		worker: run('apikey', 'create', '--name', 'n8n-worker', '--scope', 'worker'),
	};
	const proc = spawn(bin, ['serve'], { env, stdio: ['ignore', 'ignore', 'inherit'] });
	// Should the test process die before after() (the runner kills it, a closed pipe), the
	// server must not outlive it: a watchdog stops it once this process is gone.
	const watchdog = spawn('sh', ['-c', 'while kill -0 "$0" 2>/dev/null; do sleep 0.5; done; kill "$1" 2>/dev/null; rm -rf "$2"', String(process.pid), String(proc.pid), dir], { stdio: 'ignore', detached: true });
	watchdog.unref();
	const base = `http://127.0.0.1:${port}`;
	for (let i = 0; ; i++) {
		try {
			if ((await fetch(base + '/readyz')).ok) break;
		} catch {}
		if (i > 300) throw new Error('airlock did not become ready');
		await new Promise((r) => setTimeout(r, 50));
	}
	return {
		base,
		keys,
		async stop() {
			watchdog.kill();
			proc.kill('SIGTERM');
			await new Promise((r) => proc.once('exit', r));
			rmSync(dir, { recursive: true, force: true });
		},
	};
}

const node = new Airlock();

// The default of a parameter for an operation, as n8n fills in what the user left alone.
function defaultOf(name, operation) {
	for (const p of node.description.properties) {
		if (p.name !== name) continue;
		const ops = p.displayOptions?.show?.operation;
		if (!ops || ops.includes(operation)) return p.default;
	}
	return undefined;
}

// resolve evaluates the expression forms the node's defaults use:
// ={{ $('Node').item.json.field }}; anything else is returned as is.
function resolveExpr(v, nodes) {
	if (typeof v !== 'string' || !v.startsWith('=')) return v;
	const m = /^=\{\{ \$\('([^']+)'\)\.item\.json\.(\w+) \}\}$/.exec(v);
	if (!m) throw new Error(`the test context cannot evaluate ${v}`);
	if (!nodes[m[1]]) throw new Error(`ExpressionError: Referenced node is unexecuted: ${m[1]}`);
	return nodes[m[1]].json[m[2]];
}

/**
 * execute runs the node once, as n8n would, and returns its outputs by name.
 * opts: { params, items, apiKey, base, continueOnFail, executionId, runIndex, nodes }
 */
export async function execute(opts) {
	const params = opts.params;
	const operation = params.operation;
	const items = opts.items ?? [{ json: {} }];
	const requests = [];
	const ctx = {
		getInputData: () => items,
		getNodeParameter(name, i, fallback) {
			let v = name in params ? params[name] : defaultOf(name, operation);
			if (v === undefined) v = fallback;
			if (v === undefined) throw new Error(`Could not get parameter "${name}"`);
			return resolveExpr(v, opts.nodes ?? {});
		},
		getCredentials: async () => ({ baseUrl: opts.base + '/', apiKey: opts.apiKey }),
		getNode: () => ({ id: 'node-1', name: 'Airlock', type: 'n8n-nodes-airlock.airlock', typeVersion: 1, parameters: params }),
		getExecutionId: () => opts.executionId ?? String(Math.random()).slice(2),
		getWorkflowDataProxy: () => ({ $runIndex: opts.runIndex ?? 0 }),
		continueOnFail: () => opts.continueOnFail ?? false,
		helpers: {
			async httpRequestWithAuthentication(type, o) {
				if (type !== 'airlockApi') throw new Error('unexpected credential type ' + type);
				const cred = new AirlockApi();
				const headers = { ...o.headers };
				for (const [k, v] of Object.entries(cred.authenticate.properties.headers)) {
					headers[k] = v.replace('{{$credentials.apiKey}}', opts.apiKey).replace(/^=/, '');
				}
				requests.push({ method: o.method, url: o.url, headers, body: o.body });
				const res = await fetch(o.url, {
					method: o.method,
					headers,
					body: o.body === undefined ? undefined : JSON.stringify(o.body),
				});
				const text = await res.text();
				let body = text;
				if (o.json && text !== '') {
					try {
						body = JSON.parse(text);
					} catch {}
				}
				if (!o.ignoreHttpStatusErrors && res.status >= 400) throw new Error('Request failed with status code ' + res.status);
				return o.returnFullResponse ? { body, headers: Object.fromEntries(res.headers), statusCode: res.status, statusMessage: res.statusText } : body;
			},
		},
	};
	const out = await node.execute.call(ctx);
	const names = OUTPUTS[operation];
	if (out.length !== names.length) throw new Error(`${operation}: ${out.length} outputs, want ${names.length}`);
	const byName = {};
	names.forEach((n, i) => (byName[n] = out[i]));
	byName.requests = requests;
	return byName;
}

/** outputNames evaluates the node's outputs expression the way n8n does for a node's
 * parameters: the expression body is JavaScript over $parameter. */
export function outputNames(parameters) {
	const expr = node.description.outputs;
	if (typeof expr !== 'string' || !expr.startsWith('={{') || !expr.endsWith('}}')) throw new Error('outputs is not an expression');
	const fn = new Function('$parameter', 'return ' + expr.slice(3, -2));
	return fn(parameters).map((o) => {
		if (o.type !== 'main') throw new Error('not a main output');
		return o.displayName;
	});
}

export { node };
