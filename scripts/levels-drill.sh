#!/usr/bin/env bash
# Usage: scripts/levels-drill.sh [SECONDS_PER_PHASE] [WORKERS]
#
# The mixed-fleet drill (docs/testing.md#the-mixed-fleet-drill; issue 40): the previous
# release point (OLD, default 2e837c4: migrations up to 0012, before the writer level) is
# built from git and run beside this tree's binary on one throwaway PostgreSQL under load,
# following docs/deployment.md's upgrade procedure for a release before the writer level:
#
#   1. two OLD instances dispatch, on OLD's schema, under load;
#   2. both are restarted drained (dispatch disabled, retention interval 8760h);
#   3. the new binary migrates (0013 … 0027: writer level 1);
#   4. a new instance starts dispatching beside the drained OLD ones (the mixed fleet);
#   5. the OLD instances are stopped one by one, a second new instance starts;
#   6. the new binary with its level forced below the database's (a test build,
#      AIRLOCK_TEST_WRITER_LEVEL=0) must refuse: its serve answers claims with 503
#      writer_level_behind, its purge refuses;
#   7. the load stops; every acknowledged effect must reach the provider exactly once.
#
# The action type has an authoritative lookup and a provider that answers 500 to one send
# in two after storing it (the effect becomes unknown and is reconciled every second).
# Passes when 0 effects were stored twice, 0 acknowledged effects were lost, and
# `airlock audit verify --all` reports every chain intact. Not part of scripts/test.sh.
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
die() { log "error: $*"; exit 1; }

W=$(mktemp -d /tmp/airlock-levels-XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	git worktree remove --force "$W/old" 2>/dev/null || true
	rm -rf "$W"
}
trap cleanup EXIT

log "building $OLD (the previous release point) and this tree (test build)"
git worktree add --detach "$W/old" "$OLD" >/dev/null 2>&1 || die "git worktree add $OLD"
(cd "$W/old" && CGO_ENABLED=0 go build -o "$W/airlock-old" ./cmd/airlock) || die "build $OLD"
CGO_ENABLED=0 go build -tags airlock_testhooks -o "$W/airlock-new" ./cmd/airlock || die "build this tree"
go build -o "$W/levels-load" ./scripts/levels-load || die "build levels-load"

export AIRLOCK_DATABASE_URL=$AIRLOCK_TEST_DATABASE_URL AIRLOCK_LOG_LEVEL=info
"$W/levels-load" -dir "$W" -workers "$WORKERS" -settle 120s >"$W/report.txt" 2>"$W/load.err" &
LOAD=$!
PIDS+=("$LOAD")
for _ in $(seq 100); do [ -s "$W/provider.addr" ] && break; sleep 0.1; done
PROV=$(cat "$W/provider.addr")

policy() { # policy FILE DISPATCH_DISABLED RETENTION_INTERVAL
	cat >"$1" <<YAML
actions:
  note:
    connector: http
    gate: none
    http:
      url: http://$PROV/send
      lookup_url: "http://$PROV/lookup?key={effect_id}"
      lookup_authoritative: true
dispatch:
  disabled: $2
  reconcile_interval: 1s
retention:
  interval: $3
YAML
}
policy "$W/dispatch.yaml" false 1h
policy "$W/drained.yaml" true 8760h

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
urls() { local u=""; for n in "$@"; do u+="http://127.0.0.1:${PORT_OF[$n]} "; done; echo "$u" >"$W/urls.tmp"; mv "$W/urls.tmp" "$W/urls"; }
count() { psql "$AIRLOCK_TEST_DATABASE_URL" -Atc "$1"; }

"$W/airlock-old" migrate >/dev/null 2>"$W/migrate-old.err" || die "old migrate: $(cat "$W/migrate-old.err")"
KEY=$("$W/airlock-old" apikey create --name drill --scope runs,read 2>/dev/null)
[ -n "$KEY" ] || die "apikey create"
echo "$KEY" >"$W/key" # levels-load reads it when $W/go appears

log "1. two $OLD instances dispatching, on $OLD's schema (up to $(count 'SELECT max(version) FROM schema_migrations'))"
start old-a "$W/airlock-old" "$W/dispatch.yaml"
start old-b "$W/airlock-old" "$W/dispatch.yaml"
urls old-a old-b
touch "$W/go"
sleep "$PHASE"

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
start new-c "$W/airlock-new" "$W/dispatch.yaml"
urls old-a old-b new-c
sleep "$PHASE"

log "5. stop the $OLD instances one by one; a second new instance"
stop old-a
urls old-b new-c
start new-d "$W/airlock-new" "$W/dispatch.yaml"
urls old-b new-c new-d
sleep "$((PHASE / 2))"
stop old-b
urls new-c new-d
sleep "$((PHASE / 2))"

log "6. the new binary with its level forced below the database's must refuse"
start low-e "$W/airlock-new" "$W/dispatch.yaml" AIRLOCK_TEST_WRITER_LEVEL=0
code=$(curl -s -o "$W/low.json" -w '%{http_code}' -X POST -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
	-d '{"key":"low-level-claim","payload":{}}' "http://127.0.0.1:${PORT_OF[low-e]}/v1/runs/claim")
LOW_OK=1
if [ "$code" != 503 ] || ! grep -q writer_level_behind "$W/low.json"; then
	log "   FAIL: a claim through the low-level serve answered $code $(cat "$W/low.json")"
	LOW_OK=0
else
	log "   the low-level serve answered 503 $(grep -o 'writer_level_behind' "$W/low.json")"
fi
if AIRLOCK_TEST_WRITER_LEVEL=0 AIRLOCK_CONFIG="$W/dispatch.yaml" "$W/airlock-new" purge >"$W/low-purge.out" 2>&1; then
	log "   FAIL: the low-level purge ran"
	LOW_OK=0
else
	log "   the low-level purge refused: $(grep -o 'refusing to write[^;]*' "$W/low-purge.out" | head -1)"
fi
stop low-e
log "   instances registered now: $(count "SELECT string_agg(role || ' level ' || level || ' ' || version, ', ') FROM instances")"

log "7. load over; waiting for every acknowledged effect to reach the provider"
touch "$W/stop"
LOAD_RC=0
wait "$LOAD" || LOAD_RC=$?
cat "$W/report.txt" >&2
# An effect whose last answer was a 500 waits for its next lookup (reconciliation backs off).
OPEN=1
for _ in $(seq 120); do
	OPEN=$(count "SELECT count(*) FROM effects WHERE state NOT IN ('completed', 'cancelled', 'failed')")
	[ "$OPEN" -eq 0 ] && break
	sleep 1
done
log "effects not finished in the database: $OPEN; by state: $(count "SELECT string_agg(state || ' ' || n, ', ') FROM (SELECT state, count(*) n FROM effects GROUP BY state) s")"
VERIFY_RC=0
"$W/airlock-new" audit verify --all >"$W/verify.out" 2>&1 || VERIFY_RC=$?
log "audit verify --all (exit $VERIFY_RC): $(tail -1 "$W/verify.out")"
for n in new-c new-d; do stop "$n"; done

if [ "$LOAD_RC" -ne 0 ] || [ "$VERIFY_RC" -ne 0 ] || [ "$LOW_OK" -ne 1 ] || [ "$OPEN" -ne 0 ]; then
	log "FAILED (load $LOAD_RC, audit verify $VERIFY_RC, low-level refusal ok=$LOW_OK, open effects $OPEN)"
	exit 1
fi
log "passed"
