// Runs a script with a SIGKILL at one step boundary: AGENT_CRASH_AT=POINT:EFFECT_ID kills the
// process the first time AgentRun reaches POINT (before_perform, after_perform, after_confirm)
// of that step; AGENT_CRASH_MARK is a file written first, so a restarted process runs on.
import { existsSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { AgentRun } from '../index.js';

AgentRun.hook = (point, call) => {
	const mark = process.env.AGENT_CRASH_MARK ?? '';
	if (process.env.AGENT_CRASH_AT === `${point}:${call.effect_id}` && !existsSync(mark)) {
		writeFileSync(mark, '');
		process.kill(process.pid, 'SIGKILL');
	}
};
const [script, ...args] = process.argv.slice(2);
process.argv = [process.argv[0], script, ...args];
await import(pathToFileURL(script).href);
