#!/usr/bin/env bash
# Usage: scripts/bench-scale.sh
#
# The benchmark of cost as data grows: claim, duplicate claim, heartbeat, transition,
# dispatch, explain, report, the /metrics effect counts and purge on PostgreSQL holding
# generated history,
# beside the same operations on an empty database, in one run (TestScale in
# internal/scale). Starts a throwaway PostgreSQL (scripts/with-postgres.sh)
# unless AIRLOCK_TEST_DATABASE_URL is set; generating needs a superuser.
#
#   AIRLOCK_SCALE_RUNS        runs of history, each with one sent effect (default 10000000)
#   AIRLOCK_SCALE_EVENTS      events of history (default 50000000)
#   AIRLOCK_SCALE_ITERATIONS  calls per median (default 200)
#
# The defaults are the issue's full size: on a 2-core machine generating them takes
# about an hour and ~25 GB of disk; AIRLOCK_SCALE_RUNS=1000000 AIRLOCK_SCALE_EVENTS=5000000
# takes a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
export AIRLOCK_SCALE_RUNS="${AIRLOCK_SCALE_RUNS:-10000000}"
export AIRLOCK_SCALE_EVENTS="${AIRLOCK_SCALE_EVENTS:-50000000}"
exec bash scripts/with-postgres.sh go test -count=1 -timeout 6h -run '^TestScale$' -v ./internal/scale/
