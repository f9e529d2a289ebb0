# Shortcuts; each target is one command you can also run by hand.
export GOTOOLCHAIN := local

# One version, stamped at build time: `airlock version`, openapi.json, the readiness log
# line and /metrics' airlock_build_info all show it. Override with make VERSION=v1.2.0.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -s -w -X github.com/airlockhq/airlock/internal/version.Version=$(VERSION)

.PHONY: build release test lint generate verify bench bench-outbox bench-cpu capacity
build:
	@echo "go build: the first build compiles the pure-Go SQLite driver, 2-4 minutes on two idle cores (up to ~15 on a busy machine), silently; later builds take seconds"
	CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o airlock ./cmd/airlock

# Static binaries for every platform we ship, the version stamped, and their checksums:
# dist/airlock_<version>_<os>_<arch> and dist/SHA256SUMS (check with sha256sum -c).
PLATFORMS := linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
release:
	rm -rf dist && mkdir -p dist
	set -e; for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; \
		echo "build $$os/$$arch"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags '$(LDFLAGS)' \
			-o dist/airlock_$(VERSION)_$${os}_$${arch} ./cmd/airlock; \
	done
	cd dist && sha256sum airlock_* > SHA256SUMS && cat SHA256SUMS

# The whole suite, PostgreSQL included (starts and stops a throwaway server).
test:
	bash scripts/test.sh

lint:
	bash scripts/lint.sh

# The files that list the error codes are written from internal/errcodes/errcodes.go:
# docs/errors.md's table, openapi.json's Error enum, the Python and TypeScript clients'
# error classes. verify writes nothing and fails when one is stale (lint and the test
# command run it too).
generate:
	go generate ./internal/errcodes/

verify:
	go run ./internal/errcodes/gen -check

# Claims, transitions, dispatch and event pages on both backends, each beside the raw SQL
# statement as a baseline (-p 1: one package's benchmarks at a time).
bench:
	bash scripts/with-postgres.sh go test -p 1 -run '^$$' -bench . -benchtime 2000x -count 3 ./internal/runs/ ./internal/effects/ ./internal/store/storetest/

# The outbox beside River, through the public API (docs/benchmarks.md: Benchmarking the outbox).
bench-outbox:
	bash scripts/bench-outbox.sh

# CPU per effect and per claim beside River and pgbench (docs/benchmarks.md: CPU per operation).
bench-cpu:
	bash scripts/bench-cpu.sh

# The capacity table (docs/benchmarks.md, first section), printed as markdown.
capacity:
	bash scripts/capacity.sh
