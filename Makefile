# Shortcuts; each target is one command you can also run by hand.
export GOTOOLCHAIN := local

.PHONY: build test lint bench bench-outbox
build:
	go build -o airlock ./cmd/airlock

# The whole suite, PostgreSQL included (starts and stops a throwaway server).
test:
	bash scripts/test.sh

lint:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }
	go vet ./...

# Store benchmarks on both backends, each beside the raw SQL statement as a baseline.
bench:
	bash scripts/with-postgres.sh go test -run '^$$' -bench . -benchtime 2000x -count 3 ./internal/store/storetest/

# The outbox beside River, through the public API (README: Benchmarking the outbox).
bench-outbox:
	bash scripts/bench-outbox.sh
