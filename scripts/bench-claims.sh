#!/usr/bin/env bash
# Usage: bash scripts/with-postgres.sh bash scripts/bench-claims.sh
#
# HTTP claims against the raw claim statement, on one PostgreSQL database:
#   1. `airlock migrate` on a fresh database;
#   2. pgbench, CLIENTS clients for SECONDS seconds, running the bare claim statement
#      (INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING, prepared, autocommit) on
#      random new keys against that schema;
#   3. `airlock serve` on the same database, with as many connections as pgbench
#      (pool_max_conns=CLIENTS), and `airlock bench claims` against it with the same
#      concurrency and duration (new keys only: --duplicate-every 0);
#   4. pgbench again (the machine drifts: the ratio uses the mean of both raw runs);
# then prints both throughputs and their ratio.
#
# Environment: AIRLOCK_TEST_DATABASE_URL (set by scripts/with-postgres.sh), BENCH_SECONDS
# (10), BENCH_CLIENTS (8), AIRLOCK_BIN (a prebuilt airlock to measure instead of building
# this tree's, e.g. an older commit's).
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

: "${AIRLOCK_TEST_DATABASE_URL:?run me under scripts/with-postgres.sh (or set AIRLOCK_TEST_DATABASE_URL)}"
SECONDS_=${BENCH_SECONDS:-10}
CLIENTS=${BENCH_CLIENTS:-8}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/airlock-bench.XXXXXX")
SERVE_PID=""
cleanup() {
	if [ -n "$SERVE_PID" ]; then
		kill -TERM "$SERVE_PID" 2>/dev/null || true
		wait "$SERVE_PID" 2>/dev/null || true
	fi
	if [ -n "${DBNAME:-}" ]; then
		psql -q "$AIRLOCK_TEST_DATABASE_URL" -c "DROP DATABASE IF EXISTS $DBNAME" >/dev/null 2>&1 || true
	fi
	rm -rf "$TMP"
}
trap cleanup EXIT

BIN=${AIRLOCK_BIN:-}
if [ -z "$BIN" ]; then
	go build -o "$TMP/airlock" ./cmd/airlock
	BIN="$TMP/airlock"
fi

# A fresh database for this run, so earlier rows do not weigh on either side.
DBNAME="bench_$(date +%s)_$$"
psql -q -v ON_ERROR_STOP=1 "$AIRLOCK_TEST_DATABASE_URL" -c "CREATE DATABASE $DBNAME" >/dev/null
DB_URL="${AIRLOCK_TEST_DATABASE_URL/\/postgres\?//$DBNAME?}"
[ "$DB_URL" != "$AIRLOCK_TEST_DATABASE_URL" ] || { echo "cannot derive a database URL from $AIRLOCK_TEST_DATABASE_URL" >&2; exit 1; }
export AIRLOCK_DATABASE_URL="$DB_URL"
"$BIN" migrate >/dev/null 2>&1

# 1. The raw statement: the bare one-statement claim (as in internal/runs/bench_test.go),
#    on a random new key per transaction, prepared, in autocommit.
# The seed's bare claim statement (also in internal/runs/bench_test.go), as pgbench runs it.
cp scripts/raw-claim.sql "$TMP/claim.sql"
# pgbench runs before and after the HTTP phase: this machine's speed drifts (shared
# cores, fsync rate), and the ratio uses the mean of the two.
raw_tps() {
	pgbench -n -M prepared -c "$CLIENTS" -j "$CLIENTS" -T "$SECONDS_" -f "$TMP/claim.sql" "$DB_URL" >"$TMP/pgbench.out" 2>&1 ||
		{ cat "$TMP/pgbench.out" >&2; exit 1; }
	sed -nE 's/^tps = ([0-9.]+).*without initial connection time.*/\1/p' "$TMP/pgbench.out"
}
RAW1=$(raw_tps)
[ -n "$RAW1" ] || { cat "$TMP/pgbench.out" >&2; exit 1; }

# 2. The same through airlock's HTTP API.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
AIRLOCK_API_KEY=$("$BIN" apikey create --name bench --scope runs 2>/dev/null)
export AIRLOCK_API_KEY
# The server gets as many database connections as pgbench has (pool_max_conns).
AIRLOCK_DATABASE_URL="$DB_URL&pool_max_conns=$CLIENTS" AIRLOCK_LISTEN="127.0.0.1:$PORT" AIRLOCK_LOG_LEVEL=warn \
	"$BIN" serve 2>"$TMP/serve.log" &
SERVE_PID=$!
for _ in $(seq 1 100); do
	curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
	sleep 0.1
done
curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null || { cat "$TMP/serve.log" >&2; exit 1; }
"$BIN" bench claims --url "http://127.0.0.1:$PORT" --concurrency "$CLIENTS" --duration "${SECONDS_}s" \
	--duplicate-every 0 >"$TMP/bench.out" 2>&1 || { cat "$TMP/bench.out" "$TMP/serve.log" >&2; exit 1; }
HTTP=$(sed -nE 's/^POST \/v1\/runs\/claim +[0-9]+ req +([0-9.]+) req\/s.*/\1/p' "$TMP/bench.out")
[ -n "$HTTP" ] || { cat "$TMP/bench.out" >&2; exit 1; }
kill -TERM "$SERVE_PID" 2>/dev/null || true
wait "$SERVE_PID" 2>/dev/null || true
SERVE_PID=""
RAW2=$(raw_tps)
[ -n "$RAW2" ] || { cat "$TMP/pgbench.out" >&2; exit 1; }

awk -v a="$RAW1" -v b="$RAW2" -v c="$CLIENTS" -v s="$SECONDS_" \
	'BEGIN { printf "pgbench, raw claim statement, %d clients, %ss: %.0f claims/s before, %.0f after the HTTP run\n", c, s, a, b }'
sed -n 's/^/airlock bench claims: /p' "$TMP/bench.out"
awk -v h="$HTTP" -v a="$RAW1" -v b="$RAW2" \
	'BEGIN { r = (a + b) / 2; printf "HTTP claim / raw statement: %.0f / %.0f = %.2f×\n", h, r, h / r }'
