#!/usr/bin/env bash
# End to end: the OpenAI Agents SDK example (examples/openai-agents) against a real airlock
# and a scripted OpenAI-compatible model (no model is reachable here; see
# examples/openai-agents/scripted-model.mjs). For each crash point, a refund ticket:
#   1. the agent runs; its gated tool (issue_refund) pauses the SDK run on airlock's
#      approval: exit 3, nothing refunded;
#   2. a person approves on airlock's page (signed in, as the browser would post);
#   3. the agent starts again, resumes the SDK run and is SIGKILLed at the crash point;
#   4. started again, it reconciles with the payment system and finishes.
# Each time exactly one refund exists for the ticket and the run is completed. Once, a start
# before the decision waits again, and a start after the end answers "already completed". Needs Go, node 20.3+ and npm (installs the example's
# dependencies on first use, ~25 s).
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
EX=examples/openai-agents
[ -d "$EX/node_modules" ] || (cd "$EX" && npm ci --no-audit --no-fund)
[ -d clients/typescript/node_modules ] || true # the client has no runtime dependencies

WORK=$(mktemp -d "${TMPDIR:-/tmp}/airlock-oa.XXXXXX")
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "test-openai-agents: FAIL: $*" >&2; [ ! -f "$WORK/agent.log" ] || tail -n 20 "$WORK/agent.log" >&2; exit 1; }

BIN=${AIRLOCK_BIN:-}
if [ -z "$BIN" ]; then
	go build -o "$WORK/airlock" ./cmd/airlock
	BIN="$WORK/airlock"
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 10000)); }
PORT=$(free_port)
MPORT=$(free_port)
cat >"$WORK/airlock.yaml" <<'YAML'
actions:
  issue_refund:
    connector: worker
    gate: approve_before_act
    approvers: {roles: [support-lead]}
YAML
export AIRLOCK_DATABASE_URL="$WORK/airlock.db" AIRLOCK_CONFIG="$WORK/airlock.yaml" AIRLOCK_LISTEN="127.0.0.1:$PORT" AIRLOCK_LOG_LEVEL=error
"$BIN" migrate 2>/dev/null
AIRLOCK_API_KEY=$("$BIN" apikey create --name refund-agent --scope runs 2>/dev/null)
AIRLOCK_USER_PASSWORD='correct horse battery staple' "$BIN" user add lead --role support-lead >/dev/null 2>&1
"$BIN" serve >"$WORK/serve.log" 2>&1 &
PIDS+=($!)
node "$EX/scripted-model.mjs" --port "$MPORT" >"$WORK/model.log" 2>&1 &
PIDS+=($!)
export AIRLOCK_URL="http://127.0.0.1:$PORT" AIRLOCK_API_KEY OPENAI_BASE_URL="http://127.0.0.1:$MPORT/v1"
for _ in $(seq 1 200); do curl -sf "$AIRLOCK_URL/readyz" >/dev/null && grep -q listening "$WORK/model.log" && break; sleep 0.1; done

agent() { # agent TICKET [CRASH_AT]: runs the agent, prints its exit status
	local rc=0
	AGENT_CRASH_AT=${2:-} node "$EX/refund-agent.mjs" --ticket "$1" --order "A-$1" --payments "$WORK/payments" --lease 2 \
		>>"$WORK/agent.log" 2>"$WORK/agent.err" || rc=$?
	cat "$WORK/agent.err" >>"$WORK/agent.log"
	echo "$rc"
}
refunds() { grep -l "\"run_id\":\"refund-$1\"" "$WORK"/payments/*.json 2>/dev/null | wc -l; }
approve() { # signs in as the approver and presses Approve on the link the agent printed
	local url
	url=$(grep -o "http://[^ ]*/approve/[^ ]*" "$WORK/agent.log" | tail -n 1 || true)
	[ -n "$url" ] || fail "no approval link"
	curl -sf -c "$WORK/cookies" -o /dev/null -H "Origin: $AIRLOCK_URL" -d username=lead -d 'password=correct horse battery staple' "$AIRLOCK_URL/login"
	curl -sf -b "$WORK/cookies" -o /dev/null -H "Origin: $AIRLOCK_URL" -d decision=approve "$url"
}
state() { curl -sf "$AIRLOCK_URL/v1/runs/refund-$1" -H "Authorization: Bearer $AIRLOCK_API_KEY" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }

start=$(date +%s)
for crash in none before_refund after_refund before_confirm; do
	t="T$RANDOM"
	[ "$(agent "$t")" = 3 ] || fail "$crash: the first start should pause on the approval (exit 3)"
	[ "$(refunds "$t")" = 0 ] || fail "$crash: refunded before the approval"
	[ "$(state "$t")" = awaiting_human ] || fail "$crash: the run should wait for a person"
	if [ "$crash" = none ]; then
		[ "$(agent "$t")" = 3 ] || fail "$crash: a start before the decision should wait again"
	fi
	approve
	if [ "$crash" = none ]; then
		[ "$(agent "$t")" = 0 ] || fail "$crash: the approved run should finish"
	else
		[ "$(agent "$t" "$crash")" = 137 ] || fail "$crash: the agent should have been SIGKILLed"
		[ "$(agent "$t")" = 0 ] || fail "$crash: the restarted agent should finish"
	fi
	[ "$(refunds "$t")" = 1 ] || fail "$crash: $(refunds "$t") refunds for ticket $t, want exactly 1"
	[ "$(state "$t")" = completed ] || fail "$crash: run not completed"
	if [ "$crash" = none ]; then
		[ "$(agent "$t")" = 0 ] || fail "$crash: a start after the end should answer already completed"
		grep -q '"already completed"' "$WORK/agent.log" || fail "$crash: no 'already completed'"
		[ "$(refunds "$t")" = 1 ] || fail "$crash: refunded again after the end"
	fi
	echo "test-openai-agents: $crash: paused on the approval, approved, 1 refund, completed"
done
grep -q '"status":"confirmed"' "$WORK/agent.log" || fail "no crash was reconciled as confirmed"
grep -q '"status":"cleared"' "$WORK/agent.log" || fail "no crash was reconciled as cleared"
echo "test-openai-agents: ok ($(($(date +%s) - start)) s)"
