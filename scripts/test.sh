#!/usr/bin/env bash
# The project's test command: gofmt check, go vet, then go test -race against a
# throwaway PostgreSQL (see scripts/with-postgres.sh). Extra args go to go test.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "gofmt: these files need formatting (run gofmt -w):" >&2
	echo "$unformatted" >&2
	exit 1
fi

go vet ./...

scripts/with-postgres.sh go test -race -count=1 ./... "$@"

# airlock mcp end to end: real MCP servers from npm and a TypeScript SDK client (15–35 s;
# skips without node/npm, fails under CI=true).
scripts/test-mcp-e2e.sh
