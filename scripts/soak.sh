#!/usr/bin/env bash
# Usage: bash scripts/soak.sh [DURATION] [SEEDS]
#
# The long run of the fault-injecting harness (cmd/airlock/harness_test.go): every seed
# runs for DURATION (default 5m) on PostgreSQL (3 instances) and SQLite (2 processes on one
# file), and on PostgreSQL the server itself is restarted now and then (pg_ctl restart
# -m fast and -m immediate) besides the faults of the short run (those include the slow
# providers, clean stops and agents paused past their lease: docs/testing.md, "The
# fault-injecting harness"). It uses a throwaway
# PostgreSQL of its own and leaves nothing running. A failing run prints its seed:
#   AIRLOCK_HARNESS_SEEDS=<seed> AIRLOCK_HARNESS_DURATION=<d> bash scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
export AIRLOCK_HARNESS_DURATION="${1:-${AIRLOCK_HARNESS_DURATION:-5m}}"
export AIRLOCK_HARNESS_SEEDS="${2:-${AIRLOCK_HARNESS_SEEDS:-1,2,3,4,5}}"
# shellcheck disable=SC2016 # expanded inside with-postgres.sh's environment
exec scripts/with-postgres.sh bash -c 'AIRLOCK_HARNESS_PG_RESTART="$AIRLOCK_TEST_PG_RESTART" exec go test -count=1 -timeout 0 -v -run "^TestHarness$" ./cmd/airlock/'
