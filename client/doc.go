// Package client is a small Go client for airlock's HTTP API, written for developers of
// long-running agents that touch the outside world and must survive being stopped.
//
// # Steps
//
// Most agents need two calls: [Client.OpenRun] claims the run and keeps its lease
// (heartbeats; [AgentRun.Context] is cancelled when the lease is lost), and
// [AgentRun.Step] performs one side effect at most once — it plans the effect with its
// input (what a gated action's approval card shows), performs it only when airlock says
// execute, confirms it with the receipt perform returns, answers a replay from airlock's
// record, runs the step's [Lookup] when a crashed attempt left it planned, waits for (or
// hands back) a gated step's approval, and records the step in the ledger once. A
// rejection is a [*RejectedError] with the approver's reason; an effect nobody can settle
// by a lookup is a [*NeedsPersonError]; a pending approval the caller did not wait out is
// an [*ApprovalPendingError] with its console link. docs/agents.md shows a complete agent.
// The calls below are what a step does; they stay for agents that need them.
//
// # The flow
//
// An agent works on one run, named by an idempotency key its caller issued once
// ("report-2026w48"). It keeps its resumable state — the work ledger — in airlock, and
// asks airlock, every time it starts, what it may do next:
//
//  1. Claim the key ([Client.Claim]). claimed:true gives a lease_owner: the capability
//     to act on the run until the lease expires. claimed:false means someone else holds
//     a live lease, or the run is finished or waiting for a person: do not act. A
//     process that restarts after a crash claims again once its old lease has expired
//     (use short leases, and [Client.Heartbeat] while working).
//  2. Ask for the resume verdict ([Client.Resume]) and follow it (below). A new run has
//     no ledger yet: save the first one ([Client.SaveLedger], checkpoint 1) with the
//     goal, the invariants (which may never change afterwards), the pending steps and
//     next_allowed_action.
//  3. Around every external effect (a document created, a message sent), record the
//     intent before and the receipt after: [Client.Plan], perform the effect, then
//     [Client.Confirm] with the external system's id as receipt (see [Plan]).
//  4. After every step, save the ledger with checkpoint_version + 1. A save is
//     compare-and-set: version_conflict or lease_lost means another process owns the
//     run now, and this one must stop.
//  5. At the end, [Client.Transition] the run to "completed".
//
// The resume verdicts:
//
//   - continue: go on from next_allowed_action (none yet: save the first ledger).
//   - reconcile: effects were planned but never confirmed — the process stopped between
//     plan and confirm, and may or may not have performed them. Search the external
//     system for each (by run id or effect id), report what was found with
//     [Client.Reconcile], and ask again. Never perform them again blindly.
//   - wait: a person's approval is pending; exit and claim again later.
//   - stop: a person must decide (an outcome is unknown, a search found several
//     candidates, the run started but has no ledger): exit without acting. An agent
//     never restarts a run from scratch.
//
// Every mutating call sends an Idempotency-Key, and [Client.Retries] resends it
// unchanged after a transport error, a 5xx or request_in_progress: airlock answers a
// retry of a call that already committed from its record (a claim whose reply was lost
// still returns its lease). [WithIdempotencyKey] pins the key, so a process that restarts
// and repeats a step within 24 hours gets the first answer back.
//
// Errors from airlock are [*APIError] values carrying the API's stable code; test them
// with [IsCode]. Input hashes given to [Client.Plan] must be stable: compute them with
// [HashInput] from the effect's input, never from values that change between attempts.
//
// The agent under examples/agent in airlock's repository is a complete program on the
// step API ([Client.OpenRun], [AgentRun.Step]), with a test that kills it at every step
// boundary and checks that each of its external effects happens exactly once.
package client
