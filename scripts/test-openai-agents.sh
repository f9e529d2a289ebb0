#!/usr/bin/env bash
# End to end: the OpenAI Agents SDK example (examples/openai-agents) against a real airlock
# and a scripted OpenAI-compatible model (no model is reachable here; see
# examples/openai-agents/scripted-model.mjs). For each crash point, a refund ticket:
#   1. the agent runs; its gated tool (issue_refund, one run.step) waits on airlock's
#      approval: exit 3, nothing refunded;
#   2. a person approves on airlock's page (signed in, as the browser would post);
#   3. the agent starts again, runs the conversation again and is SIGKILLed at the crash point;
#   4. started again, its step looks the refund up in the payment system and finishes.
# Each time exactly one refund exists for the ticket and the run is completed. Once, a start
# before the decision waits again, the card shows the order and the amount, and a start after
# the end answers "already completed"; a rejected ticket stops with the approver's reason. Needs Go, node 20.3+ and npm (installs the example's
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
	AGENT_CRASH_AT=${2:-} node "$EX/refund-agent.mjs" --ticket "$1" --order "A-$1" --payments "$WORK/payments" --lease 5 \
		>>"$WORK/$1.log" 2>"$WORK/$1.err" || rc=$?
	cat "$WORK/$1.err" >>"$WORK/$1.log"
	echo "$rc"
}
refunds() { grep -l "\"run_id\":\"refund-$1\"" "$WORK"/payments/*.json 2>/dev/null | wc -l; }
approve() { # approve TICKET: signs in as the approver and presses Approve on the link the agent printed
	local url
	url=$(grep -o "http://[^ ]*/approve/[^ ]*" "$WORK/$1.log" | tail -n 1 || true)
	[ -n "$url" ] || { echo "no approval link"; return 1; }
	curl -sf -c "$WORK/$1.cookies" -o /dev/null -H "Origin: $AIRLOCK_URL" -d username=lead -d 'password=correct horse battery staple' "$AIRLOCK_URL/login"
	curl -sf -b "$WORK/$1.cookies" -o /dev/null -H "Origin: $AIRLOCK_URL" -d decision=approve "$url"
}
reject() { # reject TICKET REASON: signs in and presses Reject with a reason
	local url
	url=$(grep -o "http://[^ ]*/approve/[^ ]*" "$WORK/$1.log" | tail -n 1 || true)
	[ -n "$url" ] || { echo "no approval link"; return 1; }
	curl -sf -c "$WORK/$1.cookies" -o /dev/null -H "Origin: $AIRLOCK_URL" -d username=lead -d 'password=correct horse battery staple' "$AIRLOCK_URL/login"
	curl -sf -b "$WORK/$1.cookies" -o /dev/null -H "Origin: $AIRLOCK_URL" -d decision=reject --data-urlencode "reason=$2" "$url"
}
card() { # card TICKET: the approval page the approver sees
	local url
	url=$(grep -o "http://[^ ]*/approve/[^ ]*" "$WORK/$1.log" | tail -n 1 || true)
	curl -sf -c "$WORK/$1.cookies" -o /dev/null -H "Origin: $AIRLOCK_URL" -d username=lead -d 'password=correct horse battery staple' "$AIRLOCK_URL/login"
	curl -sf -b "$WORK/$1.cookies" "$url"
}
state() { curl -sf "$AIRLOCK_URL/v1/runs/refund-$1" -H "Authorization: Bearer $AIRLOCK_API_KEY" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }

# scenario CRASH: one ticket through the approval and a crash at CRASH; prints what went
# wrong (nothing when all is well).
scenario() {
	local crash=$1 t="T-$1"
	[ "$(agent "$t")" = 3 ] || { echo "the first start should pause on the approval (exit 3)"; return; }
	[ "$(refunds "$t")" = 0 ] || { echo "refunded before the approval"; return; }
	[ "$(state "$t")" = awaiting_human ] || { echo "the run should wait for a person"; return; }
	if [ "$crash" = none ]; then
		[ "$(agent "$t")" = 3 ] || { echo "a start before the decision should wait again"; return; }
		# The card shows the tool call's arguments: the order and the amount.
		card "$t" >"$WORK/$t.card.html" || { echo "no approval card"; return; }
		# (the scripted model reads the order "A-T-" from "order A-T-none": its pattern stops at lowercase)
		grep -q 'order_id&#34;: &#34;A-T-' "$WORK/$t.card.html" || { echo "the approval card does not show the order"; return; }
		grep -q 'amount_cents&#34;: 4200' "$WORK/$t.card.html" || { echo "the approval card does not show the amount"; return; }
	fi
	if [ "$crash" = reject ]; then
		reject "$t" "order already refunded by phone" || return
		[ "$(agent "$t")" = 2 ] || { echo "a rejected run should stop (exit 2)"; return; }
		grep -q "order already refunded by phone" "$WORK/$t.log" || { echo "the approver's reason did not reach the agent"; return; }
		[ "$(refunds "$t")" = 0 ] || { echo "refunded although rejected"; return; }
		return
	fi
	approve "$t" || return
	if [ "$crash" = none ]; then
		[ "$(agent "$t")" = 0 ] || { echo "the approved run should finish"; return; }
	else
		[ "$(agent "$t" "$crash")" = 137 ] || { echo "the agent should have been SIGKILLed"; return; }
		[ "$(agent "$t")" = 0 ] || { echo "the restarted agent should finish"; return; }
	fi
	[ "$(refunds "$t")" = 1 ] || { echo "$(refunds "$t") refunds, want exactly 1"; return; }
	[ "$(state "$t")" = completed ] || { echo "run not completed"; return; }
	if [ "$crash" = none ]; then
		[ "$(agent "$t")" = 0 ] || { echo "a start after the end should answer already completed"; return; }
		grep -q '"already completed"' "$WORK/$t.log" || { echo "no 'already completed'"; return; }
		[ "$(refunds "$t")" = 1 ] || { echo "refunded again after the end"; return; }
	fi
}

start=$(date +%s)
CRASHES=(none reject before_refund after_refund before_confirm)
# The crash points run at once, each on its own ticket: the SDK's load and the lease waits overlap.
for crash in "${CRASHES[@]}"; do
	scenario "$crash" >"$WORK/$crash.result" 2>&1 &
	PIDS+=($!)
done
wait "${PIDS[@]:2}" || true
failed=0
for crash in "${CRASHES[@]}"; do
	if [ -s "$WORK/$crash.result" ]; then
		echo "test-openai-agents: FAIL: $crash: $(cat "$WORK/$crash.result")" >&2
		tail -n 20 "$WORK/T-$crash.log" >&2 || true
		failed=1
	else
		if [ "$crash" = reject ]; then
			echo "test-openai-agents: reject: paused on the approval, rejected, the reason reached the agent, 0 refunds"
		else
			echo "test-openai-agents: $crash: paused on the approval, approved, 1 refund, completed"
		fi
	fi
done
[ "$failed" = 0 ] || exit 1
cat "$WORK"/T-*.log >"$WORK/agent.log"
grep -q '"msg":"looked up".*"found":\["payment://' "$WORK/agent.log" || fail "no crash was looked up and found (confirmed)"
grep -q '"msg":"looked up".*"found":\[\]' "$WORK/agent.log" || fail "no crash was looked up and not found (cleared)"
echo "test-openai-agents: ok ($(($(date +%s) - start)) s)"
