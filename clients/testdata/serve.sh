#!/usr/bin/env bash
# Usage: clients/testdata/serve.sh sqlite|postgres [POLICY_FILE]
#
# The one start-a-server helper of the client tests (clients/python/tests/harness.py,
# clients/typescript/test/harness.mjs): a real `airlock serve` ($AIRLOCK_BIN) on a fresh
# database — a SQLite file, or a fresh schema of $AIRLOCK_TEST_DATABASE_URL (created with
# psql) — migrated, with one API key per scope and an approver account (lead, role
# support-lead), on a free loopback port. POLICY_FILE defaults to policy.yaml beside this
# script. Once /readyz answers it prints one JSON line on stdout:
#
#   {"url": "http://127.0.0.1:PORT", "dir": "/tmp/…", "keys": {"runs": "…", "worker": "…", "operator": "…", "admin": "…"}}
#
# then runs until its stdin closes (the test process ended, or closed it) or it gets
# SIGTERM/SIGINT, and then stops airlock, drops the schema and removes the directory.
# serve's log is DIR/serve.log. On failure it prints the reason and the log's tail on
# stderr and exits non-zero without printing the JSON line.
set -euo pipefail

BACKEND=${1:?usage: serve.sh sqlite|postgres [POLICY_FILE]}
POLICY=${2:-$(cd "$(dirname "$0")" && pwd)/policy.yaml}
BIN=${AIRLOCK_BIN:?serve.sh: set AIRLOCK_BIN to an airlock binary (scripts/test-clients.sh builds one)}
APPROVER_PASSWORD='correct horse battery staple'

DIR=$(mktemp -d "${TMPDIR:-/tmp}/airlock-client.XXXXXX")
PG=${AIRLOCK_TEST_DATABASE_URL:-}
SCHEMA=""
PID=""
cleanup() {
	trap '' INT TERM
	if [ -n "$PID" ]; then
		kill -TERM "$PID" 2>/dev/null || true
		wait "$PID" 2>/dev/null || true
	fi
	[ -z "$SCHEMA" ] || psql -q "$PG" -c "DROP SCHEMA $SCHEMA CASCADE" >/dev/null 2>&1 || true
	rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
fail() {
	printf 'serve.sh: %s\n' "$1" >&2
	[ ! -f "$DIR/serve.log" ] || tail -n 40 "$DIR/serve.log" >&2
	exit 1
}

case "$BACKEND" in
sqlite) DB="$DIR/airlock.db" ;;
postgres)
	[ -n "$PG" ] || fail "postgres needs AIRLOCK_TEST_DATABASE_URL"
	SCHEMA="t_$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
	psql -q -v ON_ERROR_STOP=1 "$PG" -c "CREATE SCHEMA $SCHEMA" >/dev/null
	case "$PG" in *\?*) DB="$PG&search_path=$SCHEMA" ;; *) DB="$PG?search_path=$SCHEMA" ;; esac
	;;
*) fail "unknown backend $BACKEND (sqlite or postgres)" ;;
esac

# Only this server's settings: none of the caller's AIRLOCK_* variables leak in.
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep '^AIRLOCK_' || true)
export AIRLOCK_DATABASE_URL="$DB" AIRLOCK_CONFIG="$POLICY" AIRLOCK_LOG_LEVEL=info

"$BIN" migrate >"$DIR/setup.log" 2>&1 || { cat "$DIR/setup.log" >&2; fail "airlock migrate failed"; }
KEYS=""
for scope in runs worker operator admin; do
	key=$("$BIN" apikey create --name "client-$scope" --scope "$scope" 2>>"$DIR/setup.log") ||
		{ cat "$DIR/setup.log" >&2; fail "airlock apikey create failed"; }
	KEYS="$KEYS${KEYS:+, }\"$scope\": \"$key\""
done
AIRLOCK_USER_PASSWORD="$APPROVER_PASSWORD" "$BIN" user add lead --role support-lead >>"$DIR/setup.log" 2>&1 ||
	{ cat "$DIR/setup.log" >&2; fail "airlock user add failed"; }

# A free port: the first of up to five random ones that serve binds (the approval links
# carry it: AIRLOCK_PUBLIC_URL defaults to http://<listen>).
ADDR=""
for _ in 1 2 3 4 5; do
	port=$((20000 + RANDOM % 12000))
	AIRLOCK_LISTEN="127.0.0.1:$port" "$BIN" serve </dev/null >"$DIR/serve.log" 2>&1 &
	PID=$!
	for _ in $(seq 1 400); do
		if ! kill -0 "$PID" 2>/dev/null; then
			wait "$PID" 2>/dev/null || true
			PID=""
			break
		fi
		if grep -q '"msg":"airlock serving"' "$DIR/serve.log" && curl -fsS -o /dev/null "http://127.0.0.1:$port/readyz" 2>/dev/null; then
			ADDR="127.0.0.1:$port"
			break 2
		fi
		sleep 0.05
	done
	[ -z "$PID" ] || fail "airlock serve was not ready in 20 s"
done
[ -n "$ADDR" ] || fail "airlock serve did not start (five ports tried)"

printf '{"url": "http://%s", "dir": "%s", "keys": {%s}}\n' "$ADDR" "$DIR" "$KEYS"
# Until the caller closes our stdin (or ends, which closes it) or signals us.
while IFS= read -r _; do :; done || true
