# Shortcuts; each target is one command you can also run by hand.
export GOTOOLCHAIN := local

# One version, stamped at build time: `airlock version`, openapi.json, the readiness log
# line and /metrics' airlock_build_info all show it. Override with make VERSION=v1.2.0.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -s -w -X github.com/airlockhq/airlock/internal/version.Version=$(VERSION)

.PHONY: build release test lint bench bench-outbox
build:
	CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o airlock ./cmd/airlock

# The whole suite, PostgreSQL included (starts and stops a throwaway server).
test:
	bash scripts/test.sh

lint:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }
	go vet ./...

# Store benchmarks on both backends, each beside the raw SQL statement as a baseline.
bench:
	bash scripts/with-postgres.sh go test -run '^$$' -bench . -benchtime 2000x -count 3 ./internal/store/storetest/

# The outbox beside River, through the public API (docs/benchmarks.md: Benchmarking the outbox).
bench-outbox:
	bash scripts/bench-outbox.sh
