#!/usr/bin/env bash
# The project's lint: gofmt, go vet, generated files current (make verify) and staticcheck
# with its default checks (bugs, simple and style checks, unused code: what River's lint
# runs that applies to us). staticcheck is built from the Go module proxy at a pinned
# version, outside go.mod (~1 minute the first time, cached after).
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
# Files generated from one source (the error codes: OpenAPI enum, docs/errors.md, the
# clients' classes) are current: make verify.
go run ./internal/errcodes/gen -check
GOFLAGS=-mod=mod go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
# The Go client is a module of its own (client/go.mod): ./... above does not reach it.
(cd client && go vet ./... && GOFLAGS=-mod=mod go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...)
