#!/usr/bin/env bash
# The Python and TypeScript clients (clients/) against a real airlock: builds the binary
# once, runs the Python tests (unittest) and the TypeScript tests (tsc --noEmit, node
# --test) on SQLite, and again inside scripts/with-postgres.sh on PostgreSQL (each suite
# runs both stores when AIRLOCK_TEST_DATABASE_URL is set; each starts its servers with
# clients/testdata/serve.sh and clients/testdata/policy.yaml). Needs Go, curl, psql,
# python3 (3.9+), node (20.3+) and npm (the TypeScript dev dependencies: typescript, @types/node; the OpenAI
# Agents SDK example's dependencies). Last, the OpenAI Agents SDK example end to end
# (scripts/test-openai-agents.sh, SQLite) with the same binary.
#
#   scripts/test-clients.sh            # both clients, SQLite and PostgreSQL
#   CLIENTS_PG=0 scripts/test-clients.sh   # SQLite only (quick)
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

BIN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/airlock-clients.XXXXXX")
trap 'rm -rf "$BIN_DIR"' EXIT
go build -o "$BIN_DIR/airlock" ./cmd/airlock
export AIRLOCK_BIN="$BIN_DIR/airlock"

if [ ! -d clients/typescript/node_modules ]; then
	(cd clients/typescript && npm ci --no-audit --no-fund)
fi

run_suites() {
	(cd clients/python && python3 -m unittest discover -s tests -t tests)
	(cd clients/typescript && node_modules/.bin/tsc --noEmit -p . && node --test test/*.test.mjs)
}

if [ "${CLIENTS_PG:-1}" = 0 ]; then
	run_suites
else
	# with-postgres.sh exports AIRLOCK_TEST_DATABASE_URL: each suite then runs on both stores.
	export -f run_suites
	scripts/with-postgres.sh bash -c run_suites
fi

scripts/test-openai-agents.sh
