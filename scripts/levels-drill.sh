#!/usr/bin/env bash
# Usage: scripts/levels-drill.sh [SECONDS_PER_PHASE] [WORKERS]
#
# The mixed-fleet drill (docs/testing.md#the-mixed-fleet-drill; issue 40): the previous
# release point (OLD, default 2e837c4: migrations up to 0012, before the writer level) is
# built from git and run beside this tree's binary on one throwaway PostgreSQL under load,
# following docs/deployment.md's upgrade procedure for a release before the writer level:
#
#   1. two OLD instances dispatch, on OLD's schema, under load; fault: one is SIGKILLed
#      mid-phase and restarted;
#   2. both are restarted drained (dispatch disabled, retention interval 8760h);
#   3. the new binary migrates (0013 … 0027: writer level 1);
#   4. a new instance starts dispatching beside the drained OLD ones (the mixed fleet);
#      faults: the new one is SIGKILLed and restarted, PostgreSQL is restarted
#      (PG_RESTART_MODE, default immediate: a crash and recovery), a drained OLD one is
#      SIGKILLed and restarted drained;
#   5. the OLD instances are stopped one by one, a second new instance starts; fault: it
#      is SIGKILLed mid-phase and restarted;
#   6. the new binary with its level forced below the database's (a test build,
#      AIRLOCK_TEST_WRITER_LEVEL=0) must refuse: its serve answers claims with 503
#      writer_level_behind, its purge refuses;
#   7. the load stops; every acknowledged effect must reach the provider exactly once.
#
# The action type "note" has an authoritative lookup and a provider that answers 500 to
# one send in two after storing it (the effect becomes unknown and is reconciled every
# second). One run in three queues a "gated" effect instead (approve_before_act, same
# provider and lookup): a local account with the approver role signs in and decides it
# through the approval page of whichever instance is up, throughout (one in four a
# rejection). Passes when 0 effects were stored twice, 0 acknowledged effects were lost,
# every approved effect was sent exactly once and none without an approval, every effect
# finished, and `airlock audit verify --all` reports every chain intact. The work
# directory (instance logs, the load's report, a dump of the database) is kept when it
# fails. Not part of scripts/test.sh.
# Needs PostgreSQL 15 (scripts/with-postgres.sh starts one) and the module cache or proxy
# for OLD's dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${AIRLOCK_TEST_DATABASE_URL:-}" ]; then
	exec scripts/with-postgres.sh "$0" "$@"
fi
export GOTOOLCHAIN=local
PHASE=${1:-8}
WORKERS=${2:-4}
OLD=${OLD:-2e837c4}
T0=$SECONDS
log() { printf 'levels-drill: [%3d s] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { log "error: $*"; KEEP=1; exit 1; }

PG_RESTART_MODE=${PG_RESTART_MODE:-immediate}
# How long the outbox may take after the load: a killed instance's claim on unknown
# effects for reconciliation lapses after 5 min (internal/effects/reconcile.go), and only
# then are they looked up again.
SETTLE=${SETTLE:-600s}
[ -n "${AIRLOCK_TEST_PG_RESTART:-}" ] || die "no AIRLOCK_TEST_PG_RESTART (scripts/with-postgres.sh exports it): cannot restart PostgreSQL"

W=$(mktemp -d /tmp/airlock-levels-XXXXXX)
PIDS=()
KEEP=0
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	git worktree remove --force "$W/old" 2>/dev/null || true
	if [ "$KEEP" -eq 1 ]; then
		rm -f "$W"/airlock-old "$W"/airlock-new "$W"/levels-load
		log "work directory kept: $W"
	else
		rm -rf "$W"
	fi
}
trap cleanup EXIT

log "building $OLD (the previous release point) and this tree (test build)"
git worktree add --detach "$W/old" "$OLD" >/dev/null 2>&1 || die "git worktree add $OLD"
(cd "$W/old" && CGO_ENABLED=0 go build -o "$W/airlock-old" ./cmd/airlock) || die "build $OLD"
CGO_ENABLED=0 go build -tags airlock_testhooks -o "$W/airlock-new" ./cmd/airlock || die "build this tree"
go build -o "$W/levels-load" ./scripts/levels-load || die "build levels-load"

export AIRLOCK_DATABASE_URL=$AIRLOCK_TEST_DATABASE_URL AIRLOCK_LOG_LEVEL=info
"$W/levels-load" -dir "$W" -workers "$WORKERS" -settle "$((${SETTLE%s} + 120))s" -approver drill-lead -password drill-lead-pw >"$W/report.txt" 2>"$W/load.err" &
LOAD=$!
PIDS+=("$LOAD")
for _ in $(seq 100); do [ -s "$W/provider.addr" ] && break; sleep 0.1; done
PROV=$(cat "$W/provider.addr")

# A lease of 10 s (default 2 min): the sends of a SIGKILLed dispatcher are taken over soon.
# The new binary's policy adds a settle window of 5 s (default: the send timeout + 2 min):
# the provider stores at once, so a "none" 5 s after a send is proof (OLD has no
# settle_window and refuses the field).
policy() { # policy FILE DISPATCH_DISABLED RETENTION_INTERVAL [SETTLE_WINDOW]
	local settle=""
	[ -z "${4:-}" ] || settle="
    settle_window: $4"
	cat >"$1" <<YAML
actions:
  note:
    connector: http
    gate: none
    http:
      url: http://$PROV/send
      timeout: 3s
      lookup_url: "http://$PROV/lookup?key={effect_id}"
      lookup_authoritative: true$settle
  gated:
    connector: http
    gate: approve_before_act
    http:
      url: http://$PROV/send
      timeout: 3s
      lookup_url: "http://$PROV/lookup?key={effect_id}"
      lookup_authoritative: true$settle
    approvers: {roles: [lead]}
    approval_ttl: 1h
dispatch:
  disabled: $2
  lease: 10s
  reconcile_interval: 1s
retention:
  interval: $3
YAML
}
policy "$W/dispatch.yaml" false 1h
policy "$W/drained.yaml" true 8760h
policy "$W/new.yaml" false 1h 5s

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
declare -A PID_OF PORT_OF
start() { # start NAME BINARY POLICY [ENV...]
	local name=$1 bin=$2 pol=$3
	shift 3
	local port=${PORT_OF[$name]:-$(free_port)}
	PORT_OF[$name]=$port
	env "$@" AIRLOCK_LISTEN=127.0.0.1:$port AIRLOCK_CONFIG="$pol" "$bin" serve >>"$W/$name.log" 2>&1 &
	PID_OF[$name]=$!
	PIDS+=("$!")
	for _ in $(seq 150); do
		curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	die "$name did not start: $(tail -5 "$W/$name.log")"
}
stop() { kill -TERM "${PID_OF[$1]}"; wait "${PID_OF[$1]}" 2>/dev/null || true; }
KILLS=0
crash() { # crash NAME BINARY POLICY: SIGKILL it mid-phase (sends and requests in flight), restart it
	local pid=${PID_OF[$1]}
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null || true
	KILLS=$((KILLS + 1))
	log "   fault: SIGKILL $1 (pid $pid); restarting it"
	start "$@"
}
RESTARTS=0
pg_restart() {
	log "   fault: PostgreSQL restart ($PG_RESTART_MODE) under load"
	bash -c "$AIRLOCK_TEST_PG_RESTART $PG_RESTART_MODE" >"$W/pg-restart.out" 2>&1 || die "PostgreSQL restart failed: $(cat "$W/pg-restart.out")"
	RESTARTS=$((RESTARTS + 1))
	log "   PostgreSQL is back"
}
urls() { local u=""; for n in "$@"; do u+="http://127.0.0.1:${PORT_OF[$n]} "; done; echo "$u" >"$W/urls.tmp"; mv "$W/urls.tmp" "$W/urls"; }
count() { psql "$AIRLOCK_TEST_DATABASE_URL" -Atc "$1"; }

"$W/airlock-old" migrate >/dev/null 2>"$W/migrate-old.err" || die "old migrate: $(cat "$W/migrate-old.err")"
KEY=$("$W/airlock-old" apikey create --name drill --scope runs,read 2>/dev/null)
[ -n "$KEY" ] || die "apikey create"
AIRLOCK_USER_PASSWORD=drill-lead-pw "$W/airlock-old" user add drill-lead --role lead >/dev/null 2>"$W/user.err" || die "user add: $(cat "$W/user.err")"
echo "$KEY" >"$W/key" # levels-load reads it when $W/go appears

log "1. two $OLD instances dispatching, on $OLD's schema (up to $(count 'SELECT max(version) FROM schema_migrations'))"
start old-a "$W/airlock-old" "$W/dispatch.yaml"
start old-b "$W/airlock-old" "$W/dispatch.yaml"
urls old-a old-b
touch "$W/go"
sleep "$((PHASE / 2))"
crash old-a "$W/airlock-old" "$W/dispatch.yaml"
sleep "$((PHASE / 2))"

log "2. drain: restart each $OLD instance with dispatch disabled and retention interval 8760h"
for n in old-a old-b; do
	stop "$n"
	start "$n" "$W/airlock-old" "$W/drained.yaml"
done
sleep 2

log "3. migrate with the new binary"
"$W/airlock-new" migrate 2>&1 | tail -1 >&2 || die "migrate refused"
log "   schema up to $(count 'SELECT max(version) FROM schema_migrations'), writer level $(count 'SELECT level FROM writer_level')"

log "4. a new instance dispatches beside the drained $OLD ones"
start new-c "$W/airlock-new" "$W/new.yaml"
urls old-a old-b new-c
sleep "$((PHASE / 3))"
crash new-c "$W/airlock-new" "$W/new.yaml"
sleep "$((PHASE / 3))"
pg_restart
sleep 2
crash old-b "$W/airlock-old" "$W/drained.yaml"
sleep "$((PHASE / 3))"

log "5. stop the $OLD instances one by one; a second new instance"
stop old-a
urls old-b new-c
start new-d "$W/airlock-new" "$W/new.yaml"
urls old-b new-c new-d
sleep "$((PHASE / 4))"
crash new-d "$W/airlock-new" "$W/new.yaml"
sleep "$((PHASE / 4))"
stop old-b
urls new-c new-d
sleep "$((PHASE / 2))"

log "6. the new binary with its level forced below the database's must refuse"
start low-e "$W/airlock-new" "$W/new.yaml" AIRLOCK_TEST_WRITER_LEVEL=0
code=$(curl -s -o "$W/low.json" -w '%{http_code}' -X POST -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
	-d '{"key":"low-level-claim","payload":{}}' "http://127.0.0.1:${PORT_OF[low-e]}/v1/runs/claim")
LOW_OK=1
if [ "$code" != 503 ] || ! grep -q writer_level_behind "$W/low.json"; then
	log "   FAIL: a claim through the low-level serve answered $code $(cat "$W/low.json")"
	LOW_OK=0
else
	log "   the low-level serve answered 503 $(grep -o 'writer_level_behind' "$W/low.json")"
fi
if AIRLOCK_TEST_WRITER_LEVEL=0 AIRLOCK_CONFIG="$W/new.yaml" "$W/airlock-new" purge >"$W/low-purge.out" 2>&1; then
	log "   FAIL: the low-level purge ran"
	LOW_OK=0
else
	log "   the low-level purge refused: $(grep -o 'refusing to write[^;]*' "$W/low-purge.out" | head -1)"
fi
stop low-e
log "   instances registered now: $(count "SELECT string_agg(role || ' level ' || level || ' ' || version, ', ') FROM instances")"

log "7. load over; waiting for every acknowledged effect to reach the provider"
touch "$W/stop"
for _ in $(seq 600); do [ -e "$W/decided" ] && break; sleep 1; done
log "   the approver has decided every open approval; waiting (up to $SETTLE) for every effect to finish"
# An effect whose last answer was a 500 waits for its next lookup (reconciliation backs
# off); one claimed for a lookup by a killed instance, or whose answer met PostgreSQL
# down, waits for that claim to lapse (5 min). The provider stays up meanwhile.
OPEN=1
for _ in $(seq "${SETTLE%s}"); do
	OPEN=$(count "SELECT count(*) FROM effects WHERE state NOT IN ('completed', 'cancelled', 'failed')") || OPEN=1
	[ "$OPEN" -eq 0 ] && break
	sleep 1
done
log "effects not finished in the database: $OPEN; by state: $(count "SELECT string_agg(state || ' ' || n, ', ') FROM (SELECT state, count(*) n FROM effects GROUP BY state) s")"
touch "$W/done"
LOAD_RC=0
wait "$LOAD" || LOAD_RC=$?
cat "$W/report.txt" >&2
VERIFY_RC=0
"$W/airlock-new" audit verify --all >"$W/verify.out" 2>&1 || VERIFY_RC=$?
log "audit verify --all (exit $VERIFY_RC): $(tail -1 "$W/verify.out")"
for n in new-c new-d; do stop "$n"; done
log "approvals in the database: $(count "SELECT coalesce(string_agg(coalesce(decision, 'undecided') || ' ' || n, ', '), 'none') FROM (SELECT decision, count(*) n FROM approvals GROUP BY decision) s")"
log "faults: $KILLS SIGKILLs (each restarted), $RESTARTS PostgreSQL restart ($PG_RESTART_MODE)"

if [ "$LOAD_RC" -ne 0 ] || [ "$VERIFY_RC" -ne 0 ] || [ "$LOW_OK" -ne 1 ] || [ "$OPEN" -ne 0 ]; then
	log "FAILED (load $LOAD_RC, audit verify $VERIFY_RC, low-level refusal ok=$LOW_OK, open effects $OPEN)"
	pg_dump "$AIRLOCK_TEST_DATABASE_URL" >"$W/db.sql" 2>/dev/null || true
	KEEP=1
	exit 1
fi
log "passed"
