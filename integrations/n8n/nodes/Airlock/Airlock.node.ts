import type {
	IDataObject,
	IExecuteFunctions,
	IHttpRequestMethods,
	IHttpRequestOptions,
	INodeExecutionData,
	INodeProperties,
	INodeType,
	INodeTypeDescription,
	JsonObject,
} from 'n8n-workflow';
import { NodeApiError, NodeConnectionTypes, NodeOperationError } from 'n8n-workflow';

/**
 * The named outputs of each operation, in order. A workflow branches on them instead of
 * on HTTP statuses. The node's `outputs` expression below is built from this table, so
 * the editor and execute() cannot disagree.
 */
export const OUTPUTS: Record<string, string[]> = {
	claim: ['Claimed', 'Duplicate', 'Conflict'],
	heartbeat: ['Success'],
	transition: ['Success'],
	validate: ['Valid', 'Invalid', 'Terminal'],
	reportFailure: ['Retry', 'Terminal', 'Reconcile'],
	queueEffect: ['Queued', 'Approval Requested', 'Refused'],
	recordUsage: ['Success'],
	getRun: ['Success'],
	claimEffect: ['Effect', 'None'],
	reportEffect: ['Success'],
};

// Evaluated by n8n (editor and engine) with the node's parameters. Kept free of "}}"
// except at its end: that sequence closes an n8n expression.
const outputsExpression = ('={{(' +
	JSON.stringify(OUTPUTS) +
	'[$parameter.operation] || ["Success"]).map(function (n) { return { type: "main", displayName: n }; })}}') as `={{${string}}}`;

const leaseOps = ['heartbeat', 'transition', 'validate', 'reportFailure', 'queueEffect', 'recordUsage'];

// Refusals of POST /effects that a workflow handles as an outcome rather than a bug:
// the policy, the kill switch or the budget said no.
const REFUSALS = new Set([
	'unknown_action_type',
	'invalid_target',
	'gate_too_weak',
	'not_validated',
	'effect_mismatch',
	'actions_disabled',
	'budget_exhausted',
	'approval_required',
]);

function show(operation: string[], extra: IDataObject = {}) {
	return { show: { operation, ...extra } };
}

const properties: INodeProperties[] = [
	{
		displayName: 'Operation',
		name: 'operation',
		type: 'options',
		noDataExpression: true,
		default: 'claim',
		options: [
			{ name: 'Claim Effect (Worker)', value: 'claimEffect', action: 'Claim a worker effect', description: 'Lease one queued effect of a worker action type' },
			{ name: 'Claim Run', value: 'claim', action: 'Claim a run', description: 'Take a run once under an idempotency key' },
			{ name: 'Get Run', value: 'getRun', action: 'Get a run', description: 'Read a run: state, result, effects' },
			{ name: 'Heartbeat', value: 'heartbeat', action: 'Extend the lease of a run', description: 'Extend the lease during a long step' },
			{ name: 'Queue Effect', value: 'queueEffect', action: 'Queue an effect', description: 'Queue a side effect in the outbox (or ask for approval)' },
			{ name: 'Record Usage', value: 'recordUsage', action: 'Record model usage', description: 'Add model calls and tokens to the run’s budget' },
			{ name: 'Report Effect Outcome (Worker)', value: 'reportEffect', action: 'Report a worker effect outcome', description: 'Complete, fail or mark unknown an effect this worker claimed' },
			{ name: 'Report Failure', value: 'reportFailure', action: 'Report a failure', description: 'Ask airlock whether to retry, stop or reconcile' },
			{ name: 'Transition', value: 'transition', action: 'Finish a run', description: 'Move the run to completed, failed_retryable or failed_terminal' },
			{ name: 'Validate Model Output', value: 'validate', action: 'Validate model output', description: 'Check the model’s answer against the action type’s schema' },
		],
	},

	// Claim Run
	{
		displayName: 'Key',
		name: 'key',
		type: 'string',
		required: true,
		default: '',
		placeholder: '={{ $json.body.ticket_id }}-{{ $json.body.event_id }}',
		description:
			'The idempotency key: something the upstream system issues once per business event. A Webhook trigger puts the request under $JSON.body.',
		displayOptions: show(['claim']),
	},
	{
		displayName: 'Payload',
		name: 'payloadSource',
		type: 'options',
		default: 'body',
		options: [
			{ name: 'Trigger Body', value: 'body', description: 'The input item’s body field (what a Webhook received), never its headers' },
			{ name: 'Custom JSON', value: 'json' },
		],
		description: 'What airlock hashes: a redelivery with the same payload is a duplicate, a different one a conflict',
		displayOptions: show(['claim']),
	},
	{
		displayName: 'Payload JSON',
		name: 'payload',
		type: 'json',
		default: '{}',
		displayOptions: show(['claim'], { payloadSource: ['json'] }),
	},
	{
		displayName: 'Trigger Source',
		name: 'triggerSource',
		type: 'string',
		default: '',
		placeholder: 'zendesk',
		description: 'Names the input schema airlock checks the payload against, if the policy has one',
		displayOptions: show(['claim']),
	},
	{
		displayName: 'Workflow Version',
		name: 'workflowVersion',
		type: 'string',
		default: '',
		placeholder: 'tickets@v7',
		displayOptions: show(['claim']),
	},
	{
		displayName: 'Lease Seconds',
		name: 'leaseSeconds',
		type: 'number',
		default: 0,
		description: 'How long the lease lasts; 0 uses airlock’s default (5 minutes)',
		displayOptions: show(['claim', 'heartbeat']),
	},

	// What the approval card and the Run page show: the source record and the model.
	{
		displayName: 'Source URL',
		name: 'sourceUrl',
		type: 'string',
		default: '',
		placeholder: "={{ 'https://helpdesk.example.com/tickets/' + $json.body.ticket_id }}",
		description:
			'A link to the source record (http or https): the approval card links it. Sent as meta.source_url.',
		displayOptions: show(['claim', 'validate', 'queueEffect']),
	},
	{
		displayName: 'Model',
		name: 'modelName',
		type: 'string',
		default: '',
		placeholder: 'gpt-4o-mini',
		description: 'The model that produced the output, for the Run page ("Which model?"). Sent as meta.model.name.',
		displayOptions: show(['claim', 'validate', 'queueEffect']),
	},

	// The run a lease operation acts on: carried from the Claim node's item.
	{
		displayName: 'Run Key',
		name: 'runKey',
		type: 'string',
		required: true,
		default: "={{ $('Claim').item.json.key }}",
		description: 'The claimed key; by default from the node named Claim (rename it here if yours is named differently)',
		displayOptions: show([...leaseOps, 'getRun']),
	},
	{
		displayName: 'Lease Owner',
		name: 'leaseOwner',
		type: 'string',
		required: true,
		default: "={{ $('Claim').item.json.lease_owner }}",
		description: 'The lease owner the claim returned',
		displayOptions: show(leaseOps),
	},
	{
		displayName: 'Version',
		name: 'version',
		type: 'string',
		required: true,
		default: "={{ $('Claim').item.json.version }}",
		description: 'The run version the claim returned',
		displayOptions: show(leaseOps),
	},

	// Transition
	{
		displayName: 'To',
		name: 'to',
		type: 'options',
		default: 'completed',
		options: [
			{ name: 'Completed', value: 'completed' },
			{ name: 'Failed (Retryable)', value: 'failed_retryable', description: 'The next delivery of the key may claim it again' },
			{ name: 'Failed (Terminal)', value: 'failed_terminal', description: 'The key never runs again' },
		],
		displayOptions: show(['transition']),
	},
	{
		displayName: 'Alert Reason',
		name: 'alertReason',
		type: 'string',
		default: '',
		placeholder: 'invalid model output',
		description:
			'With Failed (Terminal): raise an airlock alert with this reason (kind workflow_gave_up), so a person hears that this run ended without its answer. Empty: no alert.',
		displayOptions: show(['transition'], { to: ['failed_terminal'] }),
	},
	{
		displayName: 'Result',
		name: 'result',
		type: 'json',
		default: '{}',
		description: 'Stored on the run and returned to later duplicate claims',
		displayOptions: show(['transition']),
	},

	// Validate and Queue Effect
	{
		displayName: 'Action Type',
		name: 'actionType',
		type: 'string',
		required: true,
		default: '',
		placeholder: 'ticket_reply',
		description: 'An action type of airlock’s policy file',
		displayOptions: show(['validate', 'queueEffect']),
	},
	{
		displayName: 'Model Output',
		name: 'output',
		type: 'string',
		required: true,
		default: '={{ $json.choices[0].message.content }}',
		description:
			'The model’s answer: its text (airlock extracts the JSON from a code block or prose) or a JSON value',
		displayOptions: show(['validate']),
	},
	{
		displayName: 'Target',
		name: 'target',
		type: 'string',
		required: true,
		default: 'default',
		description: 'A target name the policy lists for the action type (for mail without targets: the recipient)',
		displayOptions: show(['queueEffect']),
	},
	{
		displayName: 'Payload',
		name: 'effectPayloadSource',
		type: 'options',
		default: 'validated',
		options: [
			{ name: 'Validated Model Output', value: 'validated', description: 'The run’s last validated value (action types with a schema)' },
			{ name: 'Custom JSON', value: 'json' },
		],
		displayOptions: show(['queueEffect']),
	},
	{
		displayName: 'Payload JSON',
		name: 'effectPayload',
		type: 'json',
		default: '{}',
		displayOptions: show(['queueEffect'], { effectPayloadSource: ['json'] }),
	},
	{
		displayName: 'Effect ID',
		name: 'effectId',
		type: 'string',
		default: '',
		description: 'A stable name for the effect within the run; empty derives it from action type and target',
		displayOptions: show(['queueEffect']),
	},
	{
		displayName: 'Gate',
		name: 'gate',
		type: 'options',
		default: '',
		options: [
			{ name: 'Policy Default', value: '' },
			{ name: 'Approve Before Act', value: 'approve_before_act' },
			{ name: 'Act With Window', value: 'act_with_window' },
			{ name: 'Approve by Exception', value: 'approve_by_exception' },
		],
		description: 'Ask for a stricter gate than the policy’s (never a weaker one)',
		displayOptions: show(['queueEffect']),
	},

	// Report Failure
	{
		displayName: 'Class',
		name: 'failureClass',
		type: 'options',
		default: 'transport_timeout',
		options: [
			{
				name: 'Auto (From the Input Item’s Error)',
				value: 'auto',
				description:
					'Classify the error an HTTP Request node (On Error → Continue using error output) put on the item: HTTP status, timeout, connection error, unparsable body',
			},
			{ name: 'Client Error', value: 'client_error' },
			{ name: 'Parse Failure', value: 'parse_failure' },
			{ name: 'Partial Success', value: 'partial_success' },
			{ name: 'Rate Limited', value: 'rate_limited' },
			{ name: 'Server Error', value: 'server_error' },
			{ name: 'Soft Failure', value: 'soft_failure' },
			{ name: 'Transport Timeout', value: 'transport_timeout' },
			{ name: 'Unknown Commit', value: 'unknown_commit' },
		],
		description: 'Auto reads the failed model call’s error: 429 → rate_limited (with its Retry-After), 5xx → server_error, other 4xx → client_error, timeout or no connection → transport_timeout, a body that is not JSON → parse_failure',
		displayOptions: show(['reportFailure']),
	},
	{
		displayName: 'Detail',
		name: 'detail',
		type: 'string',
		default: '',
		description: 'A short description; never the model’s output',
		displayOptions: show(['reportFailure']),
	},
	{
		displayName: 'Retry After (Seconds)',
		name: 'retryAfterSeconds',
		type: 'number',
		default: 0,
		description: 'The provider’s Retry-After, if it sent one (airlock takes milliseconds; the node converts)',
		displayOptions: show(['reportFailure']),
	},

	// Record Usage
	{
		displayName: 'Model Calls',
		name: 'modelCalls',
		type: 'number',
		default: 1,
		displayOptions: show(['recordUsage']),
	},
	{
		displayName: 'Tokens',
		name: 'tokens',
		type: 'number',
		default: 0,
		displayOptions: show(['recordUsage']),
	},
	{
		displayName: 'Action Type',
		name: 'usageActionType',
		type: 'string',
		default: '',
		description: 'Whose budget applies, if no action type was validated or queued yet',
		displayOptions: show(['recordUsage']),
	},

	// Worker
	{
		displayName: 'Action Types',
		name: 'types',
		type: 'string',
		required: true,
		default: '',
		placeholder: 'slack_digest, crm_note',
		description: 'Comma-separated worker action types to claim from',
		displayOptions: show(['claimEffect']),
	},
	{
		displayName: 'Lease Seconds',
		name: 'effectLeaseSeconds',
		type: 'number',
		default: 300,
		description: 'A worker that does not report within its lease leaves the effect unknown',
		displayOptions: show(['claimEffect']),
	},
	{
		displayName: 'Effect',
		name: 'effectUuid',
		type: 'string',
		required: true,
		default: "={{ $('Claim Effect').item.json.id }}",
		description: 'The claimed effect’s ID; by default from the node named Claim Effect',
		displayOptions: show(['reportEffect']),
	},
	{
		displayName: 'Effect Lease Owner',
		name: 'effectLeaseOwner',
		type: 'string',
		required: true,
		default: "={{ $('Claim Effect').item.json.lease_owner }}",
		displayOptions: show(['reportEffect']),
	},
	{
		displayName: 'Outcome',
		name: 'outcome',
		type: 'options',
		default: 'complete',
		options: [
			{
				name: 'Auto (From the Input Item’s Error)',
				value: 'auto',
				description:
					'Read the error the send node (On Error → Continue using error output) put on the item: what certainly did not leave (connection refused, DNS failure, TLS refused, 429, 503) is Not Sent and retryable; another 3xx/4xx is Not Sent; a timeout, a reset connection, another 5xx or anything unrecognised is Unknown',
			},
			{ name: 'Sent', value: 'complete', description: 'The provider accepted it' },
			{ name: 'Not Sent', value: 'fail', description: 'Definitely not performed' },
			{ name: 'Unknown', value: 'unknown', description: 'It may or may not have happened: a person reconciles it' },
		],
		displayOptions: show(['reportEffect']),
	},
	{
		displayName: 'Provider ID',
		name: 'providerId',
		type: 'string',
		default: '',
		displayOptions: show(['reportEffect'], { outcome: ['complete'] }),
	},
	{
		displayName: 'Retryable',
		name: 'retryable',
		type: 'boolean',
		default: false,
		displayOptions: show(['reportEffect'], { outcome: ['fail'] }),
	},
	{
		displayName: 'Error Class',
		name: 'errorClass',
		type: 'string',
		default: '',
		placeholder: 'http_503',
		description: 'With Auto: overrides the class read from the error',
		displayOptions: show(['reportEffect'], { outcome: ['fail', 'unknown', 'auto'] }),
	},
	{
		displayName: 'Retry After (Seconds)',
		name: 'effectRetryAfterSeconds',
		type: 'number',
		default: 0,
		displayOptions: show(['reportEffect'], { outcome: ['fail'], retryable: [true] }),
	},
];

export interface Classified {
	class: string;
	detail: string;
	retryAfterSeconds: number;
}

/**
 * classifyError maps the error an n8n HTTP Request node leaves on its error output
 * (`$json.error`) onto airlock's failure classes. In n8n 1.x that error is the request
 * helper's: an axios error with `status`/`statusCode`, `code` (ECONNABORTED on a timeout,
 * ECONNREFUSED…), `response.headers` and a message "503 - {…}"; after a round trip
 * through n8n's database only its JSON form (message, code, status) is left; a body
 * that does not parse is the string "Response body is not valid JSON…". Each form is
 * read. The detail names the status or code, never the provider's body.
 */
export function classifyError(error: unknown): Classified {
	const e = (typeof error === 'object' && error !== null ? error : {}) as IDataObject;
	const message = typeof error === 'string' ? error : str(e.message ?? e.description ?? '');
	const response = (e.response ?? {}) as IDataObject;
	let status = Number(e.status ?? e.statusCode ?? e.httpCode ?? response.status ?? 0) || 0;
	if (!status) {
		const m = /^(\d{3}) - |status code (\d{3})/.exec(message);
		if (m) status = Number(m[1] ?? m[2]);
	}
	const code = str(e.code ?? '');
	const headers = (response.headers ?? {}) as IDataObject;
	let retryAfterSeconds = 0;
	const ra = headers['retry-after'] ?? headers['Retry-After'];
	if (ra !== undefined) {
		const n = Number(ra);
		if (Number.isFinite(n) && n > 0) retryAfterSeconds = n;
		else if (!Number.isNaN(Date.parse(str(ra)))) retryAfterSeconds = Math.max(0, Math.ceil((Date.parse(str(ra)) - Date.now()) / 1000));
	}
	if (status === 429) return { class: 'rate_limited', detail: 'model HTTP 429', retryAfterSeconds };
	if (status === 408) return { class: 'transport_timeout', detail: 'model HTTP 408', retryAfterSeconds };
	if (status >= 500) return { class: 'server_error', detail: `model HTTP ${status}`, retryAfterSeconds };
	if (status >= 400) return { class: 'client_error', detail: `model HTTP ${status}`, retryAfterSeconds: 0 };
	if (/not valid JSON|Unexpected token|JSON\.parse|invalid json/i.test(message)) {
		return { class: 'parse_failure', detail: 'model answer is not JSON', retryAfterSeconds: 0 };
	}
	if (/^(ECONNABORTED|ETIMEDOUT|ESOCKETTIMEDOUT|ECONNRESET|ECONNREFUSED|ENOTFOUND|EAI_AGAIN|EHOSTUNREACH|ENETUNREACH|EPIPE)$/.test(code) || /timeout|timed out/i.test(message)) {
		return { class: 'transport_timeout', detail: code ? `model ${code}` : 'model timeout', retryAfterSeconds: 0 };
	}
	// Nothing recognisable: a transport failure is the safe guess (retried, bounded by
	// max_attempts), and the detail says it was a guess.
	return { class: 'transport_timeout', detail: 'model call failed (unclassified error)', retryAfterSeconds: 0 };
}

export interface SendOutcome {
	outcome: 'fail' | 'unknown';
	retryable: boolean;
	class: string;
	retryAfterSeconds: number;
}

// Errors raised before a byte of the request left: the provider cannot have acted.
const NOT_SENT_CODES: Record<string, string> = {
	ECONNREFUSED: 'connection_refused',
	ENOTFOUND: 'dns_failure',
	EAI_AGAIN: 'dns_failure',
	EHOSTUNREACH: 'host_unreachable',
	ENETUNREACH: 'network_unreachable',
	CERT_HAS_EXPIRED: 'tls_refused',
	DEPTH_ZERO_SELF_SIGNED_CERT: 'tls_refused',
	SELF_SIGNED_CERT_IN_CHAIN: 'tls_refused',
	UNABLE_TO_VERIFY_LEAF_SIGNATURE: 'tls_refused',
	ERR_TLS_CERT_ALTNAME_INVALID: 'tls_refused',
};

/**
 * classifySendError reads the error a worker's send node (an HTTP Request node, On Error
 * → Continue using error output) left on the item, as airlock's dispatcher judges its own
 * sends (docs/api.md, what the dispatcher does): a refused connection, a DNS failure, a
 * TLS refusal, 429 or 503 certainly did not act (Not Sent, retryable, with Retry-After);
 * another 3xx/4xx was refused (Not Sent); a timeout, a broken connection, another 5xx or
 * an error it does not recognise may have happened (Unknown: a person settles it).
 */
export function classifySendError(error: unknown): SendOutcome {
	const e = (typeof error === 'object' && error !== null ? error : {}) as IDataObject;
	const message = typeof error === 'string' ? error : str(e.message ?? e.description ?? '');
	const c = classifyError(error);
	let status = Number(e.status ?? e.statusCode ?? e.httpCode ?? ((e.response ?? {}) as IDataObject).status ?? 0) || 0;
	if (!status) {
		const m = /^(\d{3}) - |status code (\d{3})/.exec(message);
		if (m) status = Number(m[1] ?? m[2]);
	}
	let code = str(e.code ?? ((e.cause ?? {}) as IDataObject).code ?? '');
	if (!code) {
		// The JSON form of the error, after n8n stored it, may keep only the message.
		const m = /\b(ECONNREFUSED|ENOTFOUND|EAI_AGAIN|EHOSTUNREACH|ENETUNREACH)\b/.exec(message);
		if (m) code = m[1];
	}
	if (status === 429 || status === 503) {
		return { outcome: 'fail', retryable: true, class: `http_${status}`, retryAfterSeconds: c.retryAfterSeconds };
	}
	if (status >= 300 && status < 500) return { outcome: 'fail', retryable: false, class: `http_${status}`, retryAfterSeconds: 0 };
	if (status >= 500) return { outcome: 'unknown', retryable: false, class: `http_${status}`, retryAfterSeconds: 0 };
	if (NOT_SENT_CODES[code]) return { outcome: 'fail', retryable: true, class: NOT_SENT_CODES[code], retryAfterSeconds: 0 };
	if (/timeout|timed out|ECONNABORTED|ETIMEDOUT/i.test(code + ' ' + message)) {
		return { outcome: 'unknown', retryable: false, class: 'timeout', retryAfterSeconds: 0 };
	}
	if (code) return { outcome: 'unknown', retryable: false, class: code.toLowerCase().slice(0, 60), retryAfterSeconds: 0 };
	return { outcome: 'unknown', retryable: false, class: 'send_error', retryAfterSeconds: 0 };
}

interface Reply {
	status: number;
	body: IDataObject;
}

interface Outcome {
	output: number;
	json: IDataObject;
}

export class Airlock implements INodeType {
	description: INodeTypeDescription = {
		displayName: 'Airlock',
		name: 'airlock',
		icon: { light: 'file:airlock.svg', dark: 'file:airlock.dark.svg' },
		group: ['transform'],
		version: [1],
		subtitle: '={{$parameter["operation"]}}',
		description: 'Claim runs once, validate model output, queue effects behind approval gates',
		defaults: { name: 'Airlock' },
		inputs: [NodeConnectionTypes.Main],
		outputs: outputsExpression,
		usableAsTool: true,
		credentials: [{ name: 'airlockApi', required: true }],
		properties,
	};

	async execute(this: IExecuteFunctions): Promise<INodeExecutionData[][]> {
		const items = this.getInputData();
		const operation = this.getNodeParameter('operation', 0) as string;
		const out: INodeExecutionData[][] = (OUTPUTS[operation] ?? ['Success']).map(() => []);
		for (let i = 0; i < items.length; i++) {
			try {
				const o = await run(this, operation, i, items[i]);
				out[o.output].push({ json: o.json, pairedItem: { item: i } });
			} catch (error) {
				if (this.continueOnFail()) {
					// The error on the item sends it to the error output when "On Error" is
					// "Continue (using error output)"; with "Continue" it stays on the first output.
					const json: IDataObject = { error: error.message };
					if (error.airlock) Object.assign(json, error.airlock);
					out[0].push({ json, error, pairedItem: { item: i } });
					continue;
				}
				// Both constructors return an error of their own kind unchanged.
				if (error instanceof NodeApiError) throw new NodeApiError(this.getNode(), error as unknown as JsonObject);
				throw new NodeOperationError(this.getNode(), error as Error, { itemIndex: i });
			}
		}
		return out;
	}
}

async function run(ctx: IExecuteFunctions, op: string, i: number, item: INodeExecutionData): Promise<Outcome> {
	const p = (name: string, fallback?: unknown) => ctx.getNodeParameter(name, i, fallback);
	switch (op) {
		case 'claim': {
			const body: IDataObject = { key: str(p('key')).trim() };
			if (body.key === '' || /(^|[-_:.])(undefined|null|NaN)$/.test(str(body.key))) {
				throw new NodeOperationError(ctx.getNode(), `The key is "${str(body.key)}": the input has no id to claim under`, {
					itemIndex: i,
					description:
						'The Key expression found no id in the input (a body without its ticket_id?). Nothing was claimed: fix the sender, or the expression.',
				});
			}
			if (p('payloadSource') === 'json') {
				body.payload = json(ctx, i, p('payload'), 'Payload JSON') as IDataObject;
			} else {
				if (item.json.body === undefined) {
					throw new NodeOperationError(ctx.getNode(), 'The input item has no body field', {
						itemIndex: i,
						description:
							'Trigger Body hashes what a Webhook trigger received ($json.body). Put the Claim right after the Webhook, or choose Custom JSON.',
					});
				}
				body.payload = item.json.body;
			}
			opt(body, 'trigger_source', str(p('triggerSource', '')));
			opt(body, 'workflow_version', str(p('workflowVersion', '')));
			if (num(p('leaseSeconds', 0)) > 0) body.lease_seconds = num(p('leaseSeconds'));
			meta(ctx, i, body);
			const r = await call(ctx, i, 'POST', '/v1/runs/claim', body);
			if (r.status === 201) return { output: 0, json: r.body };
			if (r.status === 200) return { output: 1, json: { ...r.body, duplicate: true } };
			if (r.status === 409 && r.body.error === 'payload_mismatch') {
				return { output: 2, json: { key: body.key, conflict: true, code: r.body.error, message: r.body.message } };
			}
			throw fail(ctx, i, r);
		}
		case 'heartbeat': {
			const { key, body } = lease(ctx, i);
			if (num(p('leaseSeconds', 0)) > 0) body.lease_seconds = num(p('leaseSeconds'));
			const r = await call(ctx, i, 'POST', `/v1/runs/${enc(key)}/heartbeat`, body);
			if (r.status === 200) return { output: 0, json: carry(r.body, key, body) };
			throw fail(ctx, i, r);
		}
		case 'transition': {
			const { key, body } = lease(ctx, i);
			body.to = p('to');
			const result = json(ctx, i, p('result', '{}'), 'Result');
			if (result !== null && !(isObject(result) && Object.keys(result as object).length === 0)) {
				body.result = result as IDataObject;
			}
			if (body.to === 'failed_terminal') opt(body, 'alert', str(p('alertReason', '')).slice(0, 200));
			const r = await call(ctx, i, 'POST', `/v1/runs/${enc(key)}/transition`, body);
			if (r.status === 200) return { output: 0, json: { ...r.body, lease_owner: body.lease_owner } };
			throw fail(ctx, i, r);
		}
		case 'validate': {
			const { key, body } = lease(ctx, i);
			body.action_type = str(p('actionType'));
			body.output = p('output') as IDataObject;
			meta(ctx, i, body);
			const r = await call(ctx, i, 'POST', `/v1/runs/${enc(key)}/validate`, body);
			if (r.status === 200) {
				const j = carry(r.body, key, body);
				if (r.body.state === 'failed_terminal') return { output: 2, json: j };
				return { output: r.body.valid ? 0 : 1, json: j };
			}
			if (r.status === 429 && r.body.error === 'budget_exhausted') {
				return { output: 2, json: { key, state: 'failed_terminal', code: r.body.error, message: r.body.message } };
			}
			throw fail(ctx, i, r);
		}
		case 'reportFailure': {
			const { key, body } = lease(ctx, i);
			body.class = p('failureClass');
			opt(body, 'detail', str(p('detail', '')));
			let after = num(p('retryAfterSeconds', 0));
			if (body.class === 'auto') {
				const c = classifyError(item.json.error);
				body.class = c.class;
				if (!body.detail) body.detail = c.detail;
				if (after <= 0) after = c.retryAfterSeconds;
			}
			if (after > 0) body.retry_after_ms = Math.round(after * 1000);
			const r = await call(ctx, i, 'POST', `/v1/runs/${enc(key)}/failures`, body);
			if (r.status === 200) {
				const j = carry(r.body, key, body);
				switch (r.body.decision) {
					case 'retry':
						// A Wait node counts in seconds; airlock answers in milliseconds.
						j.wait_seconds = Math.ceil(num(r.body.retry_after_ms) / 1000);
						return { output: 0, json: j };
					case 'terminal':
						return { output: 1, json: j };
					case 'reconcile':
						return { output: 2, json: j };
				}
			}
			throw fail(ctx, i, r);
		}
		case 'queueEffect': {
			const { key, body } = lease(ctx, i);
			body.action_type = str(p('actionType'));
			body.target = str(p('target'));
			if (p('effectPayloadSource') === 'json') body.payload = json(ctx, i, p('effectPayload'), 'Payload JSON') as IDataObject;
			opt(body, 'effect_id', str(p('effectId', '')));
			opt(body, 'gate', str(p('gate', '')));
			meta(ctx, i, body);
			const r = await call(ctx, i, 'POST', `/v1/runs/${enc(key)}/effects`, body);
			if (r.status === 201 || r.status === 200) return { output: 0, json: carry(r.body, key, body) };
			if (r.status === 202) return { output: 1, json: { key, ...r.body } };
			if (REFUSALS.has(str(r.body.error))) {
				return { output: 2, json: { key, refused: true, code: r.body.error, message: r.body.message, status: r.status } };
			}
			throw fail(ctx, i, r);
		}
		case 'recordUsage': {
			const { key, body } = lease(ctx, i);
			body.model_calls = num(p('modelCalls', 0));
			body.tokens = num(p('tokens', 0));
			opt(body, 'action_type', str(p('usageActionType', '')));
			const r = await call(ctx, i, 'POST', `/v1/runs/${enc(key)}/usage`, body);
			if (r.status === 200) return { output: 0, json: carry(r.body, key, body) };
			throw fail(ctx, i, r);
		}
		case 'getRun': {
			const key = str(p('runKey'));
			const r = await call(ctx, i, 'GET', `/v1/runs/${enc(key)}`);
			if (r.status === 200) return { output: 0, json: r.body };
			throw fail(ctx, i, r);
		}
		case 'claimEffect': {
			const types = str(p('types'))
				.split(',')
				.map((t) => t.trim())
				.filter((t) => t !== '');
			const body: IDataObject = { types };
			if (num(p('effectLeaseSeconds', 0)) > 0) body.lease_seconds = num(p('effectLeaseSeconds'));
			const r = await call(ctx, i, 'POST', '/v1/effects/claim', body);
			if (r.status === 200) return { output: 0, json: r.body };
			if (r.status === 204) return { output: 1, json: { claimed: false } };
			throw fail(ctx, i, r);
		}
		case 'reportEffect': {
			let outcome = str(p('outcome'));
			const body: IDataObject = { lease_owner: str(p('effectLeaseOwner')) };
			if (outcome === 'auto') {
				const c = classifySendError(item.json.error);
				outcome = c.outcome;
				body.class = c.class;
				if (c.retryable) {
					body.retryable = true;
					if (c.retryAfterSeconds > 0) body.retry_after_ms = Math.round(Math.min(c.retryAfterSeconds, 3600) * 1000);
				}
			}
			if (outcome === 'complete') opt(body, 'provider_id', str(p('providerId', '')));
			if (outcome === 'fail' && p('retryable', false)) {
				body.retryable = true;
				const after = num(p('effectRetryAfterSeconds', 0));
				if (after > 0) body.retry_after_ms = Math.round(after * 1000);
			}
			if (outcome !== 'complete') opt(body, 'class', str(p('errorClass', '')));
			const r = await call(ctx, i, 'POST', `/v1/effects/${enc(str(p('effectUuid')))}/${outcome}`, body);
			if (r.status === 200) return { output: 0, json: r.body };
			throw fail(ctx, i, r);
		}
	}
	throw new NodeOperationError(ctx.getNode(), `Unknown operation "${op}"`, { itemIndex: i });
}

// lease reads the run key, lease owner and version a lease operation sends.
function lease(ctx: IExecuteFunctions, i: number): { key: string; body: IDataObject } {
	const key = str(ctx.getNodeParameter('runKey', i));
	const owner = str(ctx.getNodeParameter('leaseOwner', i));
	const raw = ctx.getNodeParameter('version', i);
	const version = Number(raw);
	if (key === '' || owner === '' || raw === '' || raw === undefined || !Number.isInteger(version)) {
		throw new NodeOperationError(ctx.getNode(), 'Run Key, Lease Owner and Version are needed', {
			itemIndex: i,
			description:
				"By default they come from the node named Claim ($('Claim').item.json). If your claim node has another name, edit the three fields.",
		});
	}
	return { key, body: { lease_owner: owner, version } };
}

// meta adds the optional source link and model name as the request's meta.
function meta(ctx: IExecuteFunctions, i: number, body: IDataObject) {
	const m: IDataObject = {};
	const source = str(ctx.getNodeParameter('sourceUrl', i, '')).trim();
	const model = str(ctx.getNodeParameter('modelName', i, '')).trim();
	if (source !== '') m.source_url = source;
	if (model !== '') m.model = { name: model };
	if (Object.keys(m).length > 0) body.meta = m;
}

// carry adds what the next airlock node needs to the item, so nodes can also chain on $json.
function carry(reply: IDataObject, key: string, body: IDataObject): IDataObject {
	return { key, lease_owner: body.lease_owner, ...reply };
}

async function call(
	ctx: IExecuteFunctions,
	i: number,
	method: IHttpRequestMethods,
	path: string,
	body?: IDataObject,
): Promise<Reply> {
	const creds = await ctx.getCredentials('airlockApi', i);
	const base = str(creds.baseUrl).replace(/\/+$/, '');
	const headers: IDataObject = { Accept: 'application/json' };
	const options: IHttpRequestOptions = {
		method,
		url: base + path,
		headers,
		json: true,
		returnFullResponse: true,
		ignoreHttpStatusErrors: true,
	};
	if (body !== undefined) {
		headers['Content-Type'] = 'application/json';
		options.body = body;
		const key = idempotencyKey(ctx, i);
		if (key !== '') headers['Idempotency-Key'] = key;
	}
	const res = (await ctx.helpers.httpRequestWithAuthentication.call(ctx, 'airlockApi', options)) as {
		statusCode: number;
		body: unknown;
	};
	let data = res.body;
	if (typeof res.body === 'string') {
		const text = res.body;
		try {
			data = text === '' ? {} : JSON.parse(text);
		} catch {
			data = { error: 'invalid_reply', message: text.slice(0, 200) };
		}
	}
	return { status: res.statusCode, body: isObject(data) ? (data as IDataObject) : {} };
}

/**
 * The same request of the same node run and item gets the same Idempotency-Key, so n8n's
 * "Retry On Fail" after a lost reply gets airlock's recorded answer (a claim keeps its
 * lease) instead of running again. A new execution, or the node running again in a loop,
 * makes a new key.
 */
function idempotencyKey(ctx: IExecuteFunctions, i: number): string {
	try {
		const exec = ctx.getExecutionId();
		if (!exec) return '';
		const proxy = ctx.getWorkflowDataProxy(i);
		return `n8n:${exec}:${ctx.getNode().id}:${proxy.$runIndex ?? 0}:${i}`;
	} catch {
		return '';
	}
}

function fail(ctx: IExecuteFunctions, i: number, r: Reply): NodeApiError {
	const code = str(r.body.error) || `http_${r.status}`;
	const message = str(r.body.message) || 'airlock answered ' + r.status;
	const hint: Record<string, string> = {
		lease_lost: 'Another execution owns this run now, or the lease expired: do not act.',
		version_conflict: 'The run moved on since this execution claimed it: do not act.',
		unauthenticated: 'Check the airlock API credential.',
		forbidden: 'The API key lacks the scope this operation needs.',
		store_unavailable:
			"airlock's database is unavailable for a moment (restart, failover, full disk). Safe to retry: turn on the node's Retry On Fail (a few seconds apart); the retry sends the same Idempotency-Key, so a request that did go through is not run twice.",
	};
	const err = new NodeApiError(ctx.getNode(), r.body as JsonObject, {
		message: `airlock ${code}: ${message}`,
		description: hint[code],
		httpCode: String(r.status),
		itemIndex: i,
	});
	// retryable: an outage of airlock (503) or of its database, or the same request still
	// running; sending the same request again is safe (same Idempotency-Key).
	const retryable = r.status === 503 || code === 'request_in_progress';
	(err as NodeApiError & { airlock: IDataObject }).airlock = { code, status: r.status, retryable };
	return err;
}

function json(ctx: IExecuteFunctions, i: number, v: unknown, field: string): unknown {
	if (typeof v !== 'string') return v ?? null;
	if (v.trim() === '') return null;
	try {
		return JSON.parse(v);
	} catch {
		throw new NodeOperationError(ctx.getNode(), `${field} is not valid JSON`, { itemIndex: i });
	}
}

function opt(body: IDataObject, name: string, v: string) {
	if (v !== '') body[name] = v;
}

function str(v: unknown): string {
	return v === undefined || v === null ? '' : String(v);
}

function num(v: unknown): number {
	const n = Number(v);
	return Number.isFinite(n) ? n : 0;
}

function enc(s: string): string {
	return encodeURIComponent(s);
}

function isObject(v: unknown): boolean {
	return typeof v === 'object' && v !== null && !Array.isArray(v);
}
