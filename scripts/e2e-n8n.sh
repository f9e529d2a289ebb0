#!/usr/bin/env bash
# End-to-end: the shipped workflows (integrations/n8n/workflows: ticket-path.json and
# worker.json, on workflows/airlock.yaml) in a real n8n 1.123 with the airlock node,
# against a real airlock, exactly as imported: only the placeholders docs/n8n.md lists
# are filled in (the model's and the helpdesk's URLs, the credentials), no schedule and
# no node is edited. Not part of scripts/test.sh (installing n8n takes minutes, and the
# run waits out a lease and the worker's minute schedule: ~12 minutes).
#
#  1. 10 tickets x 10 concurrent deliveries: one run each, one approval, 9 duplicates,
#     nothing sent before a person approves; ana approves the 10 from airlock's
#     notification links and the worker, at its shipped every-minute schedule, sends all
#     10 in one tick (it drains what is due), each once; the runs complete.
#  2. Tickets that go wrong, each ending answered once or with an airlock alert: a
#     7-second model outage (500s: waited out and retried, then answered), a 429 with
#     Retry-After, a model call that times out, a body that is not JSON, a 400 (ends
#     failed_terminal, alert failure_not_retried), prose then a valid answer (asked again
#     with the validation errors), a wrong label twice (asked again, then
#     failed_terminal, alert validation_failed), an edited redelivery (alert
#     payload_mismatch) and a body without ticket_id (refused: no run ticket-undefined).
#  3. n8n is SIGKILLed with 5 tickets in flight (the model holds their calls); n8n is
#     started again, a redelivery while the lease lives is a duplicate, and the next
#     delivery after the lease lapsed (the documented resume, docs/n8n.md) takes each
#     run again; each gets exactly one reply once approved.
#  Last: every run ended (completed or failed_terminal), each failure with an alert.
#
# The model is a local OpenAI-compatible stand-in (no network); the node is installed as
# docs/n8n.md says (npm init + npm install <tarball> in ~/.n8n/nodes).
#
#   bash scripts/e2e-n8n.sh                 # installs n8n into a temp dir
#   N8N_E2E_DIR=/tmp/n8n-e2e bash scripts/e2e-n8n.sh   # reuse (or create) an install there
#   E2E_WORKFLOW=http bash scripts/e2e-n8n.sh           # ticket-path-http.json (plain HTTP Request nodes)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export GOTOOLCHAIN=local
N8N_VERSION=${N8N_VERSION:-1.123.81}
case "${E2E_WORKFLOW:-node}" in
node) WF_FILE=ticket-path.json WF_ID=airlockTicket001 HOOK=airlock-ticket ;;
http) WF_FILE=ticket-path-http.json WF_ID=airlockTicketHTTP HOOK=airlock-ticket-http ;;
*) echo "E2E_WORKFLOW must be node or http" >&2; exit 2 ;;
esac
DIR=${N8N_E2E_DIR:-}
OWN_DIR=
[ -n "$DIR" ] || { DIR=$(mktemp -d /tmp/n8n-e2e.XXXXXX); OWN_DIR=1; }
WORK=$(mktemp -d /tmp/airlock-n8n-e2e.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	[ -n "${KEEP:-}" ] || rm -rf "$WORK"
	[ -z "$OWN_DIR" ] || [ -n "${KEEP:-}" ] || rm -rf "$DIR" # an install this run made (about 1 GB)
}
trap cleanup EXIT
say() { printf '==> %s\n' "$*"; }
free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

# 1. n8n (workarounds in docs/n8n.md: xlsx override, no install scripts, sqlite3 rebuilt).
if [ ! -x "$DIR/node_modules/.bin/n8n" ]; then
	say "installing n8n $N8N_VERSION into $DIR (several minutes)"
	mkdir -p "$DIR"
	cat >"$DIR/package.json" <<JSON
{"name": "airlock-n8n-e2e", "private": true, "dependencies": {"n8n": "$N8N_VERSION"}, "overrides": {"xlsx": "0.18.5"}}
JSON
	(cd "$DIR" && npm install --ignore-scripts --no-audit --no-fund && npm rebuild sqlite3 --build-from-source)
fi
N8N="$DIR/node_modules/.bin/n8n"

# 2. The node package, built and installed as docs/n8n.md says: its own package.json in
# ~/.n8n/nodes (npm init), then npm install <tarball>.
say "building n8n-nodes-airlock"
(cd integrations/n8n && { [ -d node_modules ] || npm ci --ignore-scripts --no-audit --no-fund; } && npx tsc && node scripts/copy-static.mjs && npm pack --silent --pack-destination "$WORK" >/dev/null)
export N8N_USER_FOLDER="$WORK/n8n"
mkdir -p "$N8N_USER_FOLDER/.n8n/nodes"
say "npm init + npm install of the tarball in $N8N_USER_FOLDER/.n8n/nodes"
(cd "$N8N_USER_FOLDER/.n8n/nodes" && npm init -y && npm install --no-audit --no-fund "$WORK"/n8n-nodes-airlock-*.tgz) >"$WORK/nodes-install.log" 2>&1 ||
	{ cat "$WORK/nodes-install.log"; echo "e2e: npm install <tarball> failed"; exit 1; }
echo "installed in .n8n/nodes/node_modules: $(ls "$N8N_USER_FOLDER/.n8n/nodes/node_modules" | tr '\n' ' ')"
grep -q '"n8n-nodes-airlock"' "$N8N_USER_FOLDER/.n8n/nodes/package.json" || { echo "e2e: the package is not in ~/.n8n/nodes/package.json"; exit 1; }

# 3. airlock: SQLite, the shipped policy as it is (workflows/airlock.yaml: ticket_reply
# gated, sent by the worker), an approvals notification to a stand-in, and the keys.
say "starting airlock"
go build -o "$WORK/airlock" ./cmd/airlock
cp integrations/n8n/workflows/airlock.yaml "$WORK/airlock.yaml"
# A stand-in helpdesk (the worker's provider) and approvers' channel (airlock's approval
# notification): both record what they receive, with the time.
PPORT=$(free_port)
cat >"$WORK/provider.js" <<'JS'
const http = require("http"), fs = require("fs");
const [port, dir] = process.argv.slice(2);
let n = 0;
http.createServer((req, res) => {
  let body = "";
  req.on("data", (c) => (body += c));
  req.on("end", () => {
    const rec = { path: req.url, key: req.headers["idempotency-key"] || "", auth: req.headers.authorization || "", body, at: Date.now() };
    const notify = req.url === "/notify";
    fs.appendFileSync(dir + (notify ? "/notify.jsonl" : "/sent.jsonl"), JSON.stringify(rec) + "\n");
    res.setHeader("Content-Type", "application/json");
    res.end(notify ? "{}" : JSON.stringify({ id: "hd-" + ++n }));
  });
}).listen(port, "127.0.0.1");
JS
node "$WORK/provider.js" "$PPORT" "$WORK" &
PIDS+=($!)
# The model: an OpenAI-compatible stand-in; what it answers depends on the ticket (the
# order number in the prompt). Every call is recorded.
#   1-10, 108 and calls not listed: an answer at once
#   101: 500 for 7 s from its first call (an outage), then answers
#   102: 429 with Retry-After: 2, then answers
#   103: no answer within the Model node's 60 s timeout, then answers
#   104: a JSON content type with a body that is not JSON, then answers
#   105: 400 on every call
#   106: prose without JSON, then (asked again with the errors) a valid answer
#   107: a label outside the enum on every call
#   201-205: the first call is held 60 s (n8n is killed meanwhile), later calls answer
MPORT=$(free_port)
cat >"$WORK/model.js" <<'JS'
const http = require("http"), fs = require("fs");
const [port, dir] = process.argv.slice(2);
const calls = {}, first = {};
http.createServer((req, res) => {
  let body = "";
  req.on("data", (c) => (body += c));
  req.on("end", () => {
    const m = /order (\d+)/.exec(body);
    const t = m ? Number(m[1]) : 0;
    const n = (calls[t] = (calls[t] || 0) + 1);
    if (!first[t]) first[t] = Date.now();
    const reask = /was not accepted/.test(body);
    const content = (c) => { res.setHeader("Content-Type", "application/json");
      res.end(JSON.stringify({ choices: [{ message: { content: c } }] })); };
    const answer = () => content(JSON.stringify({ label: "refund", text: "We refunded ticket " + t + "." }));
    let what = "ok";
    if (t === 101 && Date.now() - first[t] < 7000) { what = "500"; res.statusCode = 500; res.end('{"error":{"message":"overloaded"}}'); }
    else if (t === 102 && n === 1) { what = "429"; res.statusCode = 429; res.setHeader("Retry-After", "2"); res.end('{"error":{"message":"slow down"}}'); }
    else if (t === 103 && n === 1) { what = "hang"; setTimeout(() => { try { answer(); } catch (e) {} }, 65000); }
    else if (t === 104 && n === 1) { what = "notjson"; res.setHeader("Content-Type", "application/json"); res.end("<html>upstream error</html>"); }
    else if (t === 105) { what = "400"; res.statusCode = 400; res.end('{"error":{"message":"bad request"}}'); }
    else if (t === 106 && n === 1) { what = "prose"; content("Sure! I will refund the order for you right away."); }
    else if (t === 107) { what = "badlabel"; content(JSON.stringify({ label: "angry", text: "No." })); }
    else if (t >= 201 && t <= 205 && n === 1) { what = "held"; setTimeout(() => { try { answer(); } catch (e) {} }, 60000); }
    else answer();
    fs.appendFileSync(dir + "/model.jsonl", JSON.stringify({ ticket: t, n, what, reask, at: Date.now() }) + "\n");
  });
}).listen(port, "127.0.0.1");
JS
node "$WORK/model.js" "$MPORT" "$WORK" &
PIDS+=($!)
printf 'notify: {webhook_url_env: APPROVALS_WEBHOOK}\n' >>"$WORK/airlock.yaml"
export APPROVALS_WEBHOOK="http://127.0.0.1:$PPORT/notify"
APORT=$(free_port)
export AIRLOCK_DATABASE_URL="$WORK/airlock.db" AIRLOCK_CONFIG="$WORK/airlock.yaml" AIRLOCK_LISTEN="127.0.0.1:$APORT" AIRLOCK_LOG_LEVEL=warn
"$WORK/airlock" migrate >/dev/null
KEY=$("$WORK/airlock" apikey create --name n8n --scope runs 2>/dev/null)
WKEY=$("$WORK/airlock" apikey create --name n8n-worker --scope worker --types ticket_reply 2>/dev/null)
APPROVER_PASSWORD="e2e-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
AIRLOCK_USER_PASSWORD="$APPROVER_PASSWORD" "$WORK/airlock" user add ana --role support-lead >/dev/null
"$WORK/airlock" serve 2>"$WORK/airlock.log" &
PIDS+=($!)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$APORT/readyz" >/dev/null && break; sleep 0.1; done

# 4. n8n: the credentials and the workflows as shipped, with the placeholders docs/n8n.md
# lists filled in (and nothing else), activated, started.
NPORT=$(free_port)
export N8N_PORT=$NPORT N8N_LISTEN_ADDRESS=127.0.0.1 N8N_EXPRESSION_ENGINE=legacy N8N_RUNNERS_ENABLED=false \
	N8N_DIAGNOSTICS_ENABLED=false N8N_SECURE_COOKIE=false N8N_PERSONALIZATION_ENABLED=false \
	N8N_VERSION_NOTIFICATIONS_ENABLED=false N8N_TEMPLATES_ENABLED=false N8N_COMMUNITY_PACKAGES_ENABLED=true \
	DB_SQLITE_POOL_SIZE=4 N8N_CONCURRENCY_PRODUCTION_LIMIT=-1
node -e '
const creds = require(process.argv[1]);
const [base, key, wkey] = process.argv.slice(3);
const fill = { airlockCred00001: { baseUrl: base, apiKey: key }, airlockCred00002: { baseUrl: base, apiKey: wkey },
  airlockHeader001: { value: "Bearer " + key }, modelHeaderAuth1: { value: "Bearer model-e2e" }, helpdeskHeader01: { value: "Bearer helpdesk-e2e" } };
for (const c of creds) { if (!fill[c.id]) throw new Error("template has an unexpected credential " + c.id); Object.assign(c.data, fill[c.id]); }
require("fs").writeFileSync(process.argv[2], JSON.stringify(creds));
' "$ROOT/integrations/n8n/workflows/credentials.json" "$WORK/cred.json" "http://127.0.0.1:$APORT" "$KEY" "$WKEY"
# The placeholders of docs/n8n.md's "What to set after import", each replaced as a
# string in the file (the model's and the helpdesk's base URLs, airlock's default
# address); the test fails if a replacement changed nothing.
node -e '
const fs = require("fs");
const [src, out, ...pairs] = process.argv.slice(1);
let text = fs.readFileSync(src, "utf8");
for (let i = 0; i < pairs.length; i += 2) {
  if (!text.includes(pairs[i])) continue;
  text = text.split(pairs[i]).join(pairs[i + 1]);
}
const wf = JSON.parse(text);
fs.writeFileSync(out, JSON.stringify([wf]));
' "$ROOT/integrations/n8n/workflows/$WF_FILE" "$WORK/workflow.json" \
	"https://api.openai.com" "http://127.0.0.1:$MPORT" "http://127.0.0.1:8080" "http://127.0.0.1:$APORT"
node -e '
const fs = require("fs");
const [src, out, from, to] = process.argv.slice(1);
const text = fs.readFileSync(src, "utf8");
if (!text.includes(from)) throw new Error("worker.json has no " + from);
fs.writeFileSync(out, JSON.stringify([JSON.parse(text.split(from).join(to))]));
' "$ROOT/integrations/n8n/workflows/worker.json" "$WORK/worker.json" "https://helpdesk.example.com/api/tickets/replies" "http://127.0.0.1:$PPORT/replies"
say "importing into n8n"
"$N8N" import:credentials --input="$WORK/cred.json" >"$WORK/import.log" 2>&1 || { cat "$WORK/import.log"; exit 1; }
"$N8N" import:workflow --input="$WORK/workflow.json" >>"$WORK/import.log" 2>&1 || { cat "$WORK/import.log"; exit 1; }
"$N8N" import:workflow --input="$WORK/worker.json" >>"$WORK/import.log" 2>&1 || { cat "$WORK/import.log"; exit 1; }
for id in "$WF_ID" airlockWorker001; do
	"$N8N" update:workflow --id="$id" --active=true >>"$WORK/import.log" 2>&1 || { cat "$WORK/import.log"; exit 1; }
done
N8N_PID=
start_n8n() {
	say "starting n8n on $NPORT"
	"$N8N" start >>"$WORK/n8n.log" 2>&1 &
	N8N_PID=$!
	PIDS+=($N8N_PID)
	local from
	from=$(wc -l <"$WORK/n8n.log")
	for i in $(seq 300); do
		curl -fs "http://127.0.0.1:$NPORT/healthz/readiness" >/dev/null 2>&1 &&
			tail -n +"$((from + 1))" "$WORK/n8n.log" | grep -q 'Activated workflow\|Editor is now accessible' && break
		[ "$i" = 300 ] && { echo "n8n did not start:"; tail -40 "$WORK/n8n.log"; exit 1; }
		sleep 1
	done
	sleep 2
}
: >"$WORK/n8n.log"
start_n8n
grep -i 'airlock\|error' "$WORK/n8n.log" | head -20 || true

URL="http://127.0.0.1:$NPORT/webhook/$HOOK"
AUTH=(-H "Authorization: Bearer $KEY")
api() { curl -s "${AUTH[@]}" "http://127.0.0.1:$APORT$1"; }
state() { api "/v1/runs/$1" | node -e 'let s="";process.stdin.on("data",c=>s+=c).on("end",()=>{try{console.log(JSON.parse(s).state||"none")}catch(e){console.log("none")}})'; }
post() { # ticket [text]: one delivery
	curl -s -o /dev/null -w '%{http_code}\n' -X POST "$URL" -H 'Content-Type: application/json' -H "X-Delivery: $1-$RANDOM" \
		-d "{\"ticket_id\": $1, \"subject\": \"Refund for order $1\", \"text\": \"${2:-Please refund order $1.}\"}"
}
sentlines() { [ -f "$WORK/sent.jsonl" ] && grep -c . "$WORK/sent.jsonl" || echo 0; }
n8n_execs() { # workflow id -> "total status=n ..." of finished executions
	(cd "$DIR" && node -e '
const db = new (require("sqlite3").Database)(process.argv[1]);
db.all("select status, count(*) n from execution_entity where workflowId = ? and status not in (\"new\", \"running\", \"waiting\") group by status order by status",
  [process.argv[2]], (e, r) => { if (e) throw e; console.log(r.reduce((t, x) => t + x.n, 0) + " " + r.map((x) => x.status + "=" + x.n).join(" ")); });
' "$N8N_USER_FOLDER/.n8n/database.sqlite" "$1")
}
fail=0
die_if_failed() {
	[ "$fail" = 0 ] && return 0
	echo "e2e: FAILED"; echo "--- n8n log"; tail -60 "$WORK/n8n.log"; echo "--- airlock log"; tail -20 "$WORK/airlock.log"; exit 1
}
# approve_all: ana signs in and approves every link airlock's notifications carried that
# she has not decided yet; prints how many she approved now.
JAR="$WORK/cookies"
ORIGIN=(-H "Origin: http://127.0.0.1:$APORT")
touch "$WORK/approved.txt"
approve_all() {
	local links code approved=0
	code=$(curl -s -o /dev/null -w '%{http_code}' -c "$JAR" -b "$JAR" "${ORIGIN[@]}" -X POST "http://127.0.0.1:$APORT/login" \
		--data-urlencode username=ana --data-urlencode "password=$APPROVER_PASSWORD")
	[ "$code" = 303 ] || [ "$code" = 302 ] || [ "$code" = 200 ] || echo "sign-in: $code" >&2
	links=$(grep -o 'http://127.0.0.1:'"$APORT"'/approve/[A-Za-z0-9_-]*' "$WORK/notify.jsonl" 2>/dev/null | sort -u || true)
	for link in $links; do
		grep -qxF "$link" "$WORK/approved.txt" && continue
		c=$(curl -s -o /dev/null -w '%{http_code}' -c "$JAR" -b "$JAR" "${ORIGIN[@]}" -X POST "$link" --data-urlencode decision=approve)
		if [ "$c" = 200 ]; then approved=$((approved + 1)); echo "$link" >>"$WORK/approved.txt"; else echo "approve $link: $c" >&2; fi
	done
	echo "$approved"
}
# wait_states SECONDS STATE KEY...: until every key is in STATE (or time is up).
wait_states() {
	local secs=$1 want=$2 k ok
	shift 2
	for _ in $(seq "$secs"); do
		ok=1
		for k in "$@"; do [ "$(state "$k")" = "$want" ] || { ok=0; break; }; done
		[ "$ok" = 1 ] && return 0
		sleep 1
	done
	return 1
}

# 5. Each of 10 tickets 10 times, all 100 at once, with a header that differs per delivery.
say "posting 10 tickets x 10 deliveries concurrently"
for t in $(seq 1 10); do
	for d in $(seq 1 10); do post "$t" & done
done >"$WORK/codes.txt"
while [ "$(wc -l <"$WORK/codes.txt")" -lt 100 ]; do sleep 0.2; done
echo "webhook answers: $(sort "$WORK/codes.txt" | uniq -c | tr '\n' ' ')"
for _ in $(seq 240); do
	out=$(n8n_execs "$WF_ID")
	[ "${out%% *}" -ge 100 ] && break
	sleep 0.5
done
execs=${out#* }
echo "n8n executions: $execs"
[ "$execs" = "success=100" ] || fail=1

say "checking airlock"
for t in $(seq 1 10); do
	run=$(api "/v1/runs/ticket-$t")
	events=$(api "/v1/runs/ticket-$t/events?limit=1000")
	summary=$(node -e '
const run = JSON.parse(process.argv[1]), ev = JSON.parse(process.argv[2]).events;
const n = (k) => ev.filter((e) => e.kind === k).length;
const kinds = [...new Set(ev.map((e) => e.kind))].join(",");
const claimed = ev.find((e) => e.kind === "claimed") || {};
const meta = claimed.meta || {};
const ok = run.state === "awaiting_human" && run.duplicates === 9 && run.reclaims === 0 && run.effects.length === 0 &&
  n("claimed") === 1 && n("approval_requested") === 1 && n("duplicate") === 9 && n("payload_mismatch") === 0 &&
  meta.source_url === "https://helpdesk.example.com/tickets/" + process.argv[3] && (meta.model || {}).name === "gpt-4o-mini";
console.log((ok ? "ok  " : "FAIL") + " ticket-" + process.argv[3] + ": state=" + run.state + " duplicates=" + run.duplicates +
  " claimed=" + n("claimed") + " approvals=" + n("approval_requested") + " duplicate_events=" + n("duplicate") +
  " mismatches=" + n("payload_mismatch") + " effects=" + run.effects.length + " meta=" + JSON.stringify(meta) + " events=[" + kinds + "]");
process.exit(ok ? 0 : 1);
' "$run" "$events" "$t") && echo "$summary" || { echo "$summary"; fail=1; }
done
lines=$("$WORK/airlock" effects list | grep -c . || true) # a header line, then one per effect
echo "effects in the outbox (any state): $((lines - 1)) (the gate holds every reply until a person approves)"
[ "$lines" = 1 ] || fail=1
echo "requests to the helpdesk before approval: $(sentlines)"
[ "$(sentlines)" = 0 ] || fail=1
die_if_failed
echo "e2e: OK: 10 tickets x 10 concurrent deliveries -> 10 runs, 10 approvals, 0 effects sent, 9 duplicates each"

# 6. ana approves the 10 from the notification links; the worker, every minute as
# shipped, sends them: all in one tick.
say "approving the 10 replies as ana (support-lead)"
approved=$(approve_all)
echo "approved: $approved"
[ "$approved" = 10 ] || fail=1
approved_at=$(date +%s%3N)
say "waiting for the worker (every minute, as shipped) to send them"
keys1=$(for t in $(seq 1 10); do printf 'ticket-%s ' "$t"; done)
# shellcheck disable=SC2086
wait_states 150 completed $keys1 || true
sleep 3 # a late duplicate send would show up here
sent=$(node -e '
const [file, since] = process.argv.slice(1);
const recs = require("fs").readFileSync(file, "utf8").trim().split("\n").map((l) => JSON.parse(l));
const keys = recs.map((r) => r.key);
const want = Array.from({ length: 10 }, (_, i) => "ticket-" + (i + 1) + "/reply-01");
const at = recs.map((r) => r.at);
const spread = Math.max(...at) - Math.min(...at);
const ok = recs.length === 10 && new Set(keys).size === 10 && want.every((k) => keys.includes(k)) &&
  recs.every((r) => r.auth === "Bearer helpdesk-e2e" && JSON.parse(r.body).label === "refund") && spread < 30000;
console.log((ok ? "ok  " : "FAIL") + " helpdesk received " + recs.length + " replies, " + new Set(keys).size + " distinct idempotency keys; first " +
  (Math.min(...at) - Number(since)) + " ms after the approvals, all 10 within " + spread + " ms (one worker tick drains what is due)");
process.exit(ok ? 0 : 1);
' "$WORK/sent.jsonl" "$approved_at" 2>&1) && echo "$sent" || { echo "$sent"; fail=1; }
done_runs=0
for t in $(seq 1 10); do [ "$(state "ticket-$t")" = completed ] && done_runs=$((done_runs + 1)); done
echo "runs completed: $done_runs/10"
[ "$done_runs" = 10 ] || fail=1
echo "worker executions: $(n8n_execs airlockWorker001)"
die_if_failed
echo "e2e: OK: after approval, the worker's first tick sent all 10 replies once each; 10 runs completed"

# 7. Tickets that go wrong (see the model stand-in above).
say "tickets that go wrong: 101-108, an edited redelivery of 108, a body without ticket_id"
for t in 101 102 103 104 105 106 107 108; do post "$t" >/dev/null; done
curl -s -o /dev/null -X POST "$URL" -H 'Content-Type: application/json' -d '{"subject": "No id", "text": "Please refund order 999."}'
wait_states 60 awaiting_human ticket-108 || true
echo "edited redelivery of 108: $(post 108 'Please refund order 108, and cancel my subscription.')"
# 101-104 and 106 end awaiting a person (the gate), 105 and 107 failed_terminal.
wait_states 150 awaiting_human ticket-101 ticket-102 ticket-103 ticket-104 ticket-106 || true
wait_states 30 failed_terminal ticket-105 ticket-107 || true
approved=$(approve_all)
echo "approved: $approved (101-104, 106, 108)"
[ "$approved" = 6 ] || fail=1
wait_states 150 completed ticket-101 ticket-102 ticket-103 ticket-104 ticket-106 ticket-108 || true
sleep 2
for t in 101 102 103 104 105 106 107 108; do
	run=$(api "/v1/runs/ticket-$t")
	events=$(api "/v1/runs/ticket-$t/events?limit=1000")
	summary=$(node -e '
const [runText, evText, t, modelLog, sentLog] = process.argv.slice(1);
const run = JSON.parse(runText), ev = JSON.parse(evText).events;
const fs = require("fs");
const lines = (f) => (fs.existsSync(f) ? fs.readFileSync(f, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l)) : []);
const calls = lines(modelLog).filter((c) => c.ticket === Number(t));
const sent = lines(sentLog).filter((r) => r.key === "ticket-" + t + "/reply-01");
const failures = ev.filter((e) => e.kind === "failure").map((e) => e.detail || {});
const alerts = ev.filter((e) => e.kind === "alert").map((e) => e.detail.alert);
const vals = ev.filter((e) => e.kind === "validation").map((e) => e.detail.valid);
const answered = run.state === "completed" && sent.length === 1 && run.effects.length === 1 && run.effects[0].state === "completed";
let ok, note = "";
switch (t) {
  case "101": { // an outage of 7 s: every failure a server_error retry, then answered
    ok = answered && failures.length >= 2 && failures.every((f) => f.class === "server_error" && f.decision === "retry") && alerts.length === 0;
    note = " outage calls " + calls.filter((c) => c.what === "500").length + " over " + (calls[calls.length - 1].at - calls[0].at) + " ms"; break; }
  case "102": case "103": case "104": {
    const want = { 102: "rate_limited", 103: "transport_timeout", 104: "parse_failure" }[t];
    const waited = calls.length === 2 ? calls[1].at - calls[0].at : -1;
    ok = answered && failures.length === 1 && failures[0].class === want && failures[0].decision === "retry" &&
      calls.length === 2 && waited >= failures[0].retry_after_ms;
    note = " model calls " + calls.map((c) => c.what).join(",") + " " + waited + " ms apart (wait " + (failures[0] || {}).retry_after_ms + " ms)"; break; }
  case "105":
    ok = run.state === "failed_terminal" && failures.length === 1 && failures[0].class === "client_error" && sent.length === 0 && alerts.includes("failure_not_retried"); break;
  case "106": // prose, then asked again with the errors: valid
    ok = answered && calls.length === 2 && calls[1].reask && vals.join(",") === "false,true"; note = " validations " + vals.join(","); break;
  case "107": // wrong twice: asked again, then airlock ends the run and alerts
    ok = run.state === "failed_terminal" && calls.length === 2 && calls[1].reask && vals.join(",") === "false,false" && sent.length === 0 && alerts.includes("validation_failed");
    note = " validations " + vals.join(","); break;
  case "108": // answered once; the edited redelivery refused and alerted
    ok = answered && ev.filter((e) => e.kind === "payload_mismatch").length === 1 && alerts.includes("payload_mismatch"); break;
}
console.log((ok ? "ok  " : "FAIL") + " ticket-" + t + ": state=" + run.state + " failures=" + JSON.stringify(failures.map((x) => x.class + ":" + x.decision)) +
  " alerts=" + JSON.stringify(alerts) + note + " sent=" + sent.length);
process.exit(ok ? 0 : 1);
' "$run" "$events" "$t" "$WORK/model.jsonl" "$WORK/sent.jsonl") && echo "$summary" || { echo "$summary"; fail=1; }
done
code=$(curl -s -o /dev/null -w '%{http_code}' "${AUTH[@]}" "http://127.0.0.1:$APORT/v1/runs/ticket-undefined")
echo "a body without ticket_id: GET /v1/runs/ticket-undefined -> $code; n8n executions of the ticket path: $(n8n_execs "$WF_ID")"
[ "$code" = 404 ] || fail=1
# The node refuses the empty key (one failed execution); the HTTP workflow sends it and
# airlock refuses it (400: its Alert: Claim Refused branch, a successful execution).
want_err=error=1
[ "$WF_FILE" = ticket-path.json ] || want_err=error=0
errs=$(n8n_execs "$WF_ID" | grep -o 'error=[0-9]*' || echo error=0)
[ "$errs" = "$want_err" ] || { echo "FAIL want $want_err executions (the body without ticket_id), got $errs"; fail=1; }
die_if_failed
echo "e2e: OK: an outage, a 429, a timeout and a body that is not JSON waited out and answered; prose asked again and answered; a 400 and a wrong label twice ended with alerts; an edited redelivery alerted; no run without an id"

# 8. n8n dies mid-execution: SIGKILL while 5 tickets wait on the model.
say "SIGKILL of n8n with 5 tickets in flight (201-205)"
for t in 201 202 203 204 205; do post "$t" >/dev/null; done
for _ in $(seq 60); do
	held=$(grep -c '"what":"held"' "$WORK/model.jsonl" || true)
	[ "$held" -ge 5 ] && break
	sleep 0.5
done
echo "model calls held: $held; runs: $(for t in 201 202 203 204 205; do printf '%s ' "$(state "ticket-$t")"; done)"
kill -KILL "$N8N_PID"
wait "$N8N_PID" 2>/dev/null || true
killed_at=$(date +%s)
sleep 1
start_n8n
echo "after the restart: $(for t in 201 202 203 204 205; do printf 'ticket-%s=%s ' "$t" "$(state "ticket-$t")"; done)"
# A redelivery while the dead execution's lease lives is a duplicate (no second run).
post 201 >/dev/null
sleep 3
dups=$(api /v1/runs/ticket-201 | node -e 'let s="";process.stdin.on("data",c=>s+=c).on("end",()=>{const r=JSON.parse(s);console.log(r.state+" duplicates="+r.duplicates+" lease_expires_at="+(r.lease||{}).expires_at)})')
echo "redelivery of 201 while its lease lives: $dups"
case "$dups" in "processing duplicates=1 "*) ;; *) echo "FAIL want processing with one duplicate"; fail=1 ;; esac
# The documented resume (docs/n8n.md): the next delivery after the lease lapsed.
until_ms=$(for t in 201 202 203 204 205; do api "/v1/runs/ticket-$t" | node -e 'let s="";process.stdin.on("data",c=>s+=c).on("end",()=>console.log(Date.parse((JSON.parse(s).lease||{}).expires_at)))'; done | sort -n | tail -1)
wait_s=$(( (until_ms - $(date +%s%3N)) / 1000 + 2 ))
say "waiting ${wait_s} s for the dead execution's leases to lapse, then redelivering"
[ "$wait_s" -gt 0 ] && sleep "$wait_s"
for t in 201 202 203 204 205; do post "$t" >/dev/null; done
wait_states 90 awaiting_human ticket-201 ticket-202 ticket-203 ticket-204 ticket-205 || true
approved=$(approve_all)
echo "approved: $approved (201-205)"
[ "$approved" = 5 ] || fail=1
wait_states 150 completed ticket-201 ticket-202 ticket-203 ticket-204 ticket-205 || true
sleep 3
for t in 201 202 203 204 205; do
	run=$(api "/v1/runs/ticket-$t")
	summary=$(node -e '
const [runText, t, sentLog] = process.argv.slice(1);
const run = JSON.parse(runText);
const sent = require("fs").readFileSync(sentLog, "utf8").trim().split("\n").map((l) => JSON.parse(l)).filter((r) => r.key === "ticket-" + t + "/reply-01");
const ok = run.state === "completed" && run.reclaims === 1 && sent.length === 1;
console.log((ok ? "ok  " : "FAIL") + " ticket-" + t + ": state=" + run.state + " reclaims=" + run.reclaims + " duplicates=" + run.duplicates + " replies=" + sent.length);
process.exit(ok ? 0 : 1);
' "$run" "$t" "$WORK/sent.jsonl") && echo "$summary" || { echo "$summary"; fail=1; }
done
echo "resumed $(( $(date +%s) - killed_at )) s after the SIGKILL; n8n executions of the ticket path: $(n8n_execs "$WF_ID")"
die_if_failed
echo "e2e: OK: after a SIGKILL with 5 tickets in flight, the next delivery after the lease lapsed resumed each; one reply each"

# 9. Nothing left behind, nothing silent: every run ended; each reply sent once; each run
# that ended without its reply has an alert.
say "checking that every run ended, each reply went once, each failure alerted"
final=$(node -e '
const [base, key, sentLog] = process.argv.slice(1);
(async () => {
  const get = async (p) => (await fetch(base + p, { headers: { Authorization: "Bearer " + key } })).json();
  const runs = (await get("/v1/runs?limit=500")).runs;
  const sent = require("fs").readFileSync(sentLog, "utf8").trim().split("\n").map((l) => JSON.parse(l).key);
  const by = {};
  let bad = [];
  for (const r of runs) {
    by[r.state] = (by[r.state] || 0) + 1;
    const n = sent.filter((k) => k === r.key + "/reply-01").length;
    if (r.state === "completed" && n !== 1) bad.push(r.key + " completed with " + n + " replies");
    if (r.state !== "completed") {
      const ev = (await get("/v1/runs/" + r.key + "/events?limit=1000")).events;
      const alerts = ev.filter((e) => e.kind === "alert").map((e) => e.detail.alert);
      if (r.state !== "failed_terminal") bad.push(r.key + " left " + r.state);
      else if (alerts.length === 0) bad.push(r.key + " failed_terminal without an alert");
      if (n !== 0) bad.push(r.key + " " + r.state + " with " + n + " replies");
    }
  }
  console.log(Object.keys(by).sort().map((k) => k + "=" + by[k]).join(" ") + " replies=" + sent.length + (bad.length ? " PROBLEMS: " + bad.join("; ") : ""));
  process.exit(bad.length ? 1 : 0);
})();
' "http://127.0.0.1:$APORT" "$KEY" "$WORK/sent.jsonl") && echo "ok   runs by state: $final" || { echo "FAIL runs by state: $final"; fail=1; }
want_runs="completed=21 failed_terminal=2 replies=21"
[ "$(echo "$final" | cut -d' ' -f1-3)" = "$want_runs" ] || { echo "FAIL want $want_runs"; fail=1; }
if [ "$fail" != 0 ]; then
	echo "--- n8n executions that did not succeed (id workflow status: last node, error)"
	(cd "$DIR" && node -e '
const db = new (require("sqlite3").Database)(process.argv[1]), { parse } = require("flatted");
db.all("select e.id, e.workflowId, e.status, e.startedAt, e.stoppedAt, d.data from execution_entity e left join execution_data d on d.executionId = e.id where e.status != \"success\" order by e.id", (err, rows) => {
  if (err) throw err;
  for (const r of rows) { let last = "", msg = "";
    try { const d = parse(r.data); last = d.resultData.lastNodeExecuted || ""; msg = (d.resultData.error || {}).message || ""; } catch (e) { msg = "(no data: " + e.message + ")"; }
    console.log("  " + r.id + " " + r.workflowId + " " + r.status + " " + r.startedAt + " .. " + r.stoppedAt + ": " + last + (msg ? ", " + msg : "")); } });
' "$N8N_USER_FOLDER/.n8n/database.sqlite") || true
fi
die_if_failed
echo "e2e: OK: the shipped workflows as imported: 23 tickets, 21 answered once each, 2 failed with alerts, an edited redelivery alerted, nothing left processing"
