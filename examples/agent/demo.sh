#!/usr/bin/env bash
# The example agent against a local airlock, as docs/agents.md tells it: one run to the
# end, then a run killed right after it created its draft and started again (it waits out
# the lease, looks the draft up, and does not create it twice). Everything lives in
# a temp directory (its database, policy, documents, logs): nothing is written into the
# repository. The binaries are built once (not `go run` per command); the server is
# waited for, and stopped when the script ends, fails or is interrupted (INT, TERM, HUP).
#
#   bash examples/agent/demo.sh                       # airlock on 127.0.0.1:8080
#   AIRLOCK_LISTEN=127.0.0.1:18080 bash examples/agent/demo.sh
#   AIRLOCK_BIN=./airlock AGENT_BIN=./agent bash examples/agent/demo.sh   # prebuilt
#   KEEP=1 bash examples/agent/demo.sh                # keep the temp directory
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LISTEN=${AIRLOCK_LISTEN:-127.0.0.1:8080}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/airlock-agent-demo.XXXXXX")
SERVER=
cleanup() {
	if [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null; then
		kill "$SERVER" 2>/dev/null || true
		wait "$SERVER" 2>/dev/null || true
		echo "demo: stopped airlock serve (pid $SERVER)"
	fi
	if [ -n "${KEEP:-}" ]; then echo "demo: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
say() { printf 'demo: %s\n' "$*"; }

# The address must be free: an airlock left running elsewhere would answer instead.
if (exec 3<>"/dev/tcp/${LISTEN%:*}/${LISTEN##*:}") 2>/dev/null; then
	echo "demo: something already listens on $LISTEN: stop it, or set AIRLOCK_LISTEN" >&2
	exit 1
fi

AIRLOCK=${AIRLOCK_BIN:-}
AGENT=${AGENT_BIN:-}
if [ -z "$AIRLOCK" ] || [ -z "$AGENT" ]; then
	say "building airlock and the agent (minutes the first time)"
	(cd "$ROOT" && go build -o "$WORK/airlock" ./cmd/airlock && go build -o "$WORK/agent" ./examples/agent)
	AIRLOCK=${AIRLOCK:-$WORK/airlock} AGENT=${AGENT:-$WORK/agent}
fi

cat >"$WORK/agent-policy.yaml" <<'YAML'
actions:
  create_internal_draft: {connector: worker, gate: none}
  annotate_draft: {connector: worker, gate: none}
  share_internal: {connector: worker, gate: none}
YAML
export AIRLOCK_DATABASE_URL="$WORK/airlock.db" AIRLOCK_LISTEN="$LISTEN" AIRLOCK_URL="http://$LISTEN"
"$AIRLOCK" serve --config "$WORK/agent-policy.yaml" >"$WORK/airlock.log" 2>&1 &
SERVER=$!
say "airlock serve (pid $SERVER) on $LISTEN; waiting until it is ready"
for i in $(seq 300); do
	curl -sf "http://$LISTEN/readyz" >/dev/null && break
	if ! kill -0 "$SERVER" 2>/dev/null || [ "$i" = 300 ]; then
		echo "demo: airlock serve did not start; the end of its log:" >&2
		tail -n 5 "$WORK/airlock.log" >&2
		exit 1
	fi
	sleep 0.1
done
AIRLOCK_API_KEY=$("$AIRLOCK" apikey create --name agent --scope runs 2>/dev/null)
export AIRLOCK_API_KEY
mkdir "$WORK/docs"

say "report-2026w48: claims, drafts, checks and shares (checkpoints 1-4), completes"
"$AGENT" --run-id report-2026w48 --docs "$WORK/docs" --lease 5s >"$WORK/agent-w48.log"
tail -n 1 "$WORK/agent-w48.log"

say "report-2026w49: killed right after it created its draft"
rc=0
AGENT_CRASH_AT=after_perform:draft "$AGENT" --run-id report-2026w49 --docs "$WORK/docs" --lease 5s >"$WORK/agent-w49a.log" 2>&1 || rc=$?
[ "$rc" = 137 ] || { echo "demo: the crashing agent exited $rc, not 137 (SIGKILL)" >&2; exit 1; }
say "report-2026w49 again: waits out the lease, looks the draft up (finds it), finishes"
"$AGENT" --run-id report-2026w49 --docs "$WORK/docs" --lease 5s >"$WORK/agent-w49b.log"
grep -o '"msg":"[^"]*reconcil[^"]*"' "$WORK/agent-w49b.log" | head -n 3 || true
tail -n 1 "$WORK/agent-w49b.log"

for run in report-2026w48 report-2026w49; do
	n=$(grep -l "\"run_id\": *\"$run\"" "$WORK"/docs/* | wc -l)
	state=$(curl -s -H "Authorization: Bearer $AIRLOCK_API_KEY" "http://$LISTEN/v1/runs/$run" | grep -o '"state":"[a-z_]*"' | head -n 1)
	echo "demo: $run: $n record(s), $state"
	[ "$n" = 3 ] && [ "$state" = '"state":"completed"' ] || { echo "demo: $run: want 3 records (draft, note, share) and completed" >&2; exit 1; }
done
say "ok: one record per step (draft, note, share), both runs completed"
