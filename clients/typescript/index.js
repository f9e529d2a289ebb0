// airlock: a client of airlock's HTTP API for agents written in TypeScript or JavaScript.
// ESM, fetch only (Node.js 20+), no dependencies. Types: index.d.ts.
export * from './errors.js';
export * from './canonical.js';
export * from './client.js';

export const STATES = Object.freeze({ PROCESSING: 'processing', COMPLETED: 'completed', FAILED_RETRYABLE: 'failed_retryable', FAILED_TERMINAL: 'failed_terminal', AWAITING_HUMAN: 'awaiting_human', APPROVED: 'approved', REJECTED: 'rejected' });
export const VERDICTS = Object.freeze({ CONTINUE: 'continue', RECONCILE: 'reconcile', WAIT: 'wait', STOP: 'stop' });
export { AgentRun, DONE, RejectedError, NeedsPersonError, ApprovalPendingError, RunBusyError, RunFinishedError } from './steps.js';
