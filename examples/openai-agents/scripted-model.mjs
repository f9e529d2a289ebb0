// A stand-in for a model: a small OpenAI-compatible server (POST /v1/chat/completions)
// that answers with scripted tool calls. No model is reachable from this machine, and a
// test must not depend on one; the agent under test talks to this server through the
// OpenAI Agents SDK exactly as it would talk to api.openai.com.
//
// The script is stateless: it reads the conversation it is sent and answers the next step,
// so a restarted agent that starts the conversation over gets the same calls again.
//   1. no tool result yet            -> call lookup_order({order_id})
//   2. lookup_order's result          -> call issue_refund({order_id, amount_cents})
//   3. issue_refund's result          -> a final answer quoting it
//
//   node scripted-model.mjs [--port N]     # prints "scripted model listening on URL"
import { createServer } from 'node:http';

function answer(messages) {
	const user = messages.find((m) => m.role === 'user');
	const order = /order ([A-Z0-9-]+)/.exec(typeof user?.content === 'string' ? user.content : JSON.stringify(user?.content ?? ''))?.[1] ?? 'A-1';
	const results = new Map();
	const names = new Map();
	for (const m of messages) {
		for (const tc of m.tool_calls ?? []) names.set(tc.id, tc.function.name);
		if (m.role === 'tool') results.set(names.get(m.tool_call_id), typeof m.content === 'string' ? m.content : JSON.stringify(m.content));
	}
	const call = (name, args) => ({ role: 'assistant', content: null, tool_calls: [{ id: `call_${name}_${order}`, type: 'function', function: { name, arguments: JSON.stringify(args) } }] });
	if (!results.has('lookup_order')) return [call('lookup_order', { order_id: order }), 'tool_calls'];
	if (!results.has('issue_refund')) {
		const amount = JSON.parse(results.get('lookup_order')).amount_cents;
		return [call('issue_refund', { order_id: order, amount_cents: amount }), 'tool_calls'];
	}
	return [{ role: 'assistant', content: `Refund for order ${order}: ${results.get('issue_refund')}` }, 'stop'];
}

export function startScriptedModel(port = 0) {
	let n = 0;
	const server = createServer((req, res) => {
		let body = '';
		req.on('data', (c) => (body += c));
		req.on('end', () => {
			if (req.method !== 'POST' || !req.url.endsWith('/chat/completions')) {
				res.writeHead(404, { 'Content-Type': 'application/json' });
				return res.end(JSON.stringify({ error: { message: `the scripted model serves POST /v1/chat/completions, not ${req.method} ${req.url}` } }));
			}
			const r = JSON.parse(body);
			const [message, finish_reason] = answer(r.messages ?? []);
			n++;
			res.writeHead(200, { 'Content-Type': 'application/json' });
			res.end(JSON.stringify({ id: `chatcmpl-scripted-${n}`, object: 'chat.completion', created: Math.floor(Date.now() / 1000), model: r.model ?? 'scripted',
				choices: [{ index: 0, message, finish_reason, logprobs: null }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }));
		});
	});
	return new Promise((ok) => server.listen(port, '127.0.0.1', () => ok({ url: `http://127.0.0.1:${server.address().port}/v1`, close: () => server.close() })));
}

if (import.meta.url === `file://${process.argv[1]}`) {
	const i = process.argv.indexOf('--port');
	const m = await startScriptedModel(i > 0 ? Number(process.argv[i + 1]) : 0);
	console.log(`scripted model listening on ${m.url}`);
}
