#!/usr/bin/env bash
# Usage: bash scripts/bench-cpu.sh
#
# CPU per operation, airlock beside its baselines, in one run on one throwaway PostgreSQL
# (scripts/with-postgres.sh; or AIRLOCK_TEST_DATABASE_URL when the cluster runs on this
# machine and its data directory is readable: the postmaster's pid is read from it).
# Issue 23's table:
#
#   outbox  airlock (dispatch.concurrency C) against River (bench/river, its own module,
#           MaxWorkers C, River's default fetch settings) for C = 32 and 256, and airlock
#           at concurrency 500 against River tuned (500 workers, FetchCooldown 1 ms,
#           FetchPollInterval 50 ms). Both do the same work: one HTTP POST per effect/job
#           (JSON body, Idempotency-Key) to a local no-op provider in a process of its own,
#           from a pre-filled queue of BENCH_COUNT (3000). A key seen twice fails the run.
#   claims  airlock serve under `airlock bench claims` (new keys, BENCH_CLIENTS=8
#           connections and clients) against pgbench running the seed's raw claim
#           statement (prepared, autocommit), BENCH_SECONDS (10) each.
#
# CPU = user+sys time of the process doing the work (airlock serve from its start — its
# startup is included and printed apart —, the River program from client.Start, pgbench)
# plus the PostgreSQL cluster's: its postmaster, its live children and the children it
# reaped, from /proc before and after the drain (or the claims phase). Everything runs
# BENCH_PASSES (2) times, interleaved A/B. The machine is shared: CPU per operation is the
# robust figure; throughput ratios are as measured, compare them only within one run.
# Counts do not move with the load: WAL records, index entries (pg_walinspect) and buffer
# accesses per claim, and WAL records and index entries per effect (dispatcher start to
# stop).
#
# Environment: BENCH_COUNT (3000), BENCH_PASSES (2), BENCH_CLIENTS (8), BENCH_SECONDS
# (10), BENCH_PG_POOL (20: pool_max_conns of airlock and River in the outbox runs),
# BENCH_TIMEOUT (60s per drain), BENCH_IDEMPOTENT (0; 1: airlock's action type declares
# its provider idempotent, so the lease is also the begin-mark), BENCH_ONLY (regex of scenario names: a32 r32 a256 r256
# a500 r500 claims), AIRLOCK_BIN (a prebuilt airlock to measure instead of this tree's,
# e.g. an older commit's: it serves and migrates; the load comes from this tree's).
# shellcheck disable=SC2317 # functions run from traps
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF="$ROOT/scripts/bench-cpu.sh"

if [ -z "${AIRLOCK_TEST_DATABASE_URL:-}" ]; then
	exec bash "$ROOT/scripts/with-postgres.sh" bash "$SELF" "$@"
fi

log() { printf 'bench-cpu: %s\n' "$*" >&2; }
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

# Called by `airlock bench effects --then` once the queue is full.
if [ "${1:-}" = "__start" ]; then
	psql "$AIRLOCK_TEST_DATABASE_URL" -qAtX -c "SELECT pg_current_wal_insert_lsn()" >"$BENCH_TMP/drain.lsn"
	start_instance dispatcher "$(free_port)" "$BENCH_TMP/dispatch.yaml" "$2"
	exit 0
fi

command -v curl >/dev/null || die "curl is needed"
command -v psql >/dev/null || die "psql is needed"
command -v pgbench >/dev/null || die "pgbench is needed"
[ -r /proc/self/stat ] || die "this benchmark reads CPU times from /proc (Linux)"

COUNT=${BENCH_COUNT:-3000}
IDEMPOTENT=false
[ "${BENCH_IDEMPOTENT:-0}" = 0 ] || IDEMPOTENT=true
PASSES=${BENCH_PASSES:-2}
CLIENTS=${BENCH_CLIENTS:-8}
SECS=${BENCH_SECONDS:-10}
POOL=${BENCH_PG_POOL:-20}
TIMEOUT=${BENCH_TIMEOUT:-60s}
ONLY=${BENCH_ONLY:-.}
ADMIN_URL=$AIRLOCK_TEST_DATABASE_URL
RUN_ID="c$(date +%s)$RANDOM"

DATADIR=$(psql "$ADMIN_URL" -qAtX -c "SHOW data_directory")
PGPID=$(head -n 1 "$DATADIR/postmaster.pid" 2>/dev/null) || die "cannot read $DATADIR/postmaster.pid (the cluster must run on this machine)"
[ -r "/proc/$PGPID/stat" ] || die "postmaster $PGPID not visible in /proc"

BENCH_TMP=$(mktemp -d "${TMPDIR:-/tmp}/airlock-bench-cpu.XXXXXX")
export BENCH_TMP
: >"$BENCH_TMP/pids"
: >"$BENCH_TMP/dbs"
PROVIDER_PID=""
FAILED=0

cleanup() {
	local rc=$?
	trap '' INT TERM HUP
	stop_instances
	[ -z "$PROVIDER_PID" ] || kill -TERM "$PROVIDER_PID" 2>/dev/null || true
	drop_bench_dbs
	rm -rf "$BENCH_TMP"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# write_policy FILE DISABLED PROVIDER_PORT CONCURRENCY
write_policy() {
	cat >"$1" <<EOF
actions:
  bench:
    connector: http
    gate: none
    http: {url: "http://127.0.0.1:$3/send", timeout: 10s, idempotent: $IDEMPOTENT}
dispatch:
  disabled: $2
  concurrency: $4
EOF
}

declare -A RES # "scenario field" → value
get() { echo "${RES["$1 $2"]:-}"; }

# parse_result SCENARIO FILE: keep the fields of its last "result k=v…" line.
parse_result() {
	local line kv
	line=$(grep '^result ' "$2" | tail -n 1 || true)
	[ -n "$line" ] || {
		FAILED=1
		log "$1: no result line"
		return
	}
	for kv in ${line#result }; do
		RES["$1 ${kv%%=*}"]=${kv#*=}
	done
}

# --- build ------------------------------------------------------------------
log "building airlock and bench/river"
# The load generator (`airlock bench …`, never measured) is always this tree's; the
# measured airlock (serve, migrate) is AIRLOCK_BIN when set.
(cd "$ROOT" && GOTOOLCHAIN=local go build -o "$BENCH_TMP/airlock" ./cmd/airlock)
DRIVER="$BENCH_TMP/airlock"
AIRLOCK=${AIRLOCK_BIN:-$DRIVER}
(cd "$ROOT/bench/river" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -o "$BENCH_TMP/riverbench" .)
RIVER="$BENCH_TMP/riverbench"
export AIRLOCK

# airlock_drain NAME CONCURRENCY: queue COUNT effects through a non-dispatching instance,
# then start one dispatching instance and measure until all are completed.
airlock_drain() {
	want "${1%_*}" || return 0
	log "$1: airlock, $COUNT effects, dispatch.concurrency $2"
	local db key pport qport rc=0
	db=$(newdb "$1")
	AIRLOCK_DATABASE_URL=$db "$AIRLOCK" migrate >/dev/null 2>&1
	key=$(AIRLOCK_DATABASE_URL=$db "$AIRLOCK" apikey create --name bench --scope runs 2>/dev/null)
	pport=$(free_port)
	qport=$(free_port)
	write_policy "$BENCH_TMP/queue.yaml" true "$pport" "$2"
	write_policy "$BENCH_TMP/dispatch.yaml" false "$pport" "$2"
	start_instance queue "$qport" "$BENCH_TMP/queue.yaml" "$db"
	"$DRIVER" bench effects --url "http://127.0.0.1:$qport" --api-key "$key" \
		--provider-listen "127.0.0.1:$pport" --count "$COUNT" --concurrency 16 --timeout "$TIMEOUT" \
		--then "bash '$SELF' __start '$db'" --cpu-pg-pid "$PGPID" --cpu-pid-file "$BENCH_TMP/dispatcher.pid" \
		>"$BENCH_TMP/$1.out" 2>&1 || rc=$?
	stop_instances
	if [ -s "$BENCH_TMP/drain.lsn" ]; then
		wal_per_op "$1" "$(cat "$BENCH_TMP/drain.lsn")" "$COUNT"
		wal_breakdown "$1" "${RUN_ID}_$1" "$(cat "$BENCH_TMP/drain.lsn")" "$COUNT"
	fi
	rm -f "$BENCH_TMP/drain.lsn"
	dropdb_ "$1"
	parse_result "$1" "$BENCH_TMP/$1.out"
	if [ "$rc" -ne 0 ] || grep -q DUPLICATES "$BENCH_TMP/$1.out"; then
		FAILED=1
		tail -n 5 "$BENCH_TMP/$1.out" >&2
	fi
}

# river_drain NAME WORKERS [tuned]: the same with River and the provider in its own process.
river_drain() {
	want "${1%_*}" || return 0
	log "$1: River, $COUNT jobs, $2 workers${3:+, tuned}"
	local db pport rc=0
	db=$(newdb "$1")
	pport=$(free_port)
	"$RIVER" --mode provider --listen "127.0.0.1:$pport" >"$BENCH_TMP/$1.provider" 2>&1 &
	PROVIDER_PID=$!
	for _ in $(seq 1 50); do grep -q listening "$BENCH_TMP/$1.provider" && break; sleep 0.1; done
	local -a tuned=()
	[ -z "${3:-}" ] || tuned=(--variant tuned --fetch-cooldown 1ms --fetch-poll-interval 50ms)
	"$RIVER" --database-url "$db" --mode throughput "${tuned[@]}" --max-workers "$2" --count "$COUNT" \
		--post-url "http://127.0.0.1:$pport/send" --timeout "$TIMEOUT" --cpu-pg-pid "$PGPID" \
		>"$BENCH_TMP/$1.out" 2>&1 || rc=$?
	kill -TERM "$PROVIDER_PID" 2>/dev/null || true
	wait "$PROVIDER_PID" 2>/dev/null || true
	PROVIDER_PID=""
	dropdb_ "$1"
	parse_result "$1" "$BENCH_TMP/$1.out"
	local dups
	dups=$(sed -nE 's/.*duplicates=([0-9]+).*/\1/p' "$BENCH_TMP/$1.provider")
	RES["$1 duplicates"]=${dups:-?}
	if [ "$rc" -ne 0 ] || [ "${dups:-1}" != 0 ]; then
		FAILED=1
		tail -n 5 "$BENCH_TMP/$1.out" "$BENCH_TMP/$1.provider" >&2
	fi
}

# pg_ticks: the cluster's CPU so far, in seconds (postmaster + reaped + live children).
pg_cpu() {
	local p total=0 t
	for p in "$PGPID" $(cat /proc/"$PGPID"/task/*/children 2>/dev/null); do
		t=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 + $14 + $15 }' "/proc/$p/stat" 2>/dev/null) || continue
		total=$((total + ${t:-0}))
	done
	awk -v t="$total" 'BEGIN { printf "%.2f", t / 100 }'
}

# pg_children: how many processes the postmaster has now.
pg_children() { wc -w </proc/"$PGPID"/task/"$PGPID"/children; }

# pg_wait_children N: wait (up to 10 s) until the postmaster has at most N children (an
# autovacuum worker may hold it above N for a while).
pg_wait_children() {
	for _ in $(seq 1 100); do
		[ "$(pg_children)" -le "$1" ] && return 0
		sleep 0.1
	done
	log "backends still exiting after 10 s: the cluster's CPU may miss some"
}

# pg_work: the cluster's WAL records and the claims database's buffer accesses so far,
# "records blocks". Unlike CPU time these do not swing with the machine's load: they
# count the work PostgreSQL does per claim (rows and index entries written, pages read).
# Backends report them when they exit, so sample once the clients have disconnected.
pg_work() {
	sleep 0.5
	psql "$ADMIN_URL" -qAtX -F ' ' -c "SELECT (SELECT wal_records FROM pg_stat_wal),
		(SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = '${CLAIMS_DB_NAME}')"
}

# work_per_op NAME BEFORE AFTER N: WAL records and buffer accesses per operation.
work_per_op() {
	local -a a b
	read -r -a a <<<"$2"
	read -r -a b <<<"$3"
	RES["$1 wal_per_op"]=$(awk -v x="${a[0]}" -v y="${b[0]}" -v n="$4" 'BEGIN { if (n > 0) printf "%.1f", (y - x) / n }')
	RES["$1 blks_per_op"]=$(awk -v x="${a[1]}" -v y="${b[1]}" -v n="$4" 'BEGIN { if (n > 0) printf "%.1f", (y - x) / n }')
}

# wal_lsn: the cluster's WAL insert position now.
wal_lsn() { psql "$ADMIN_URL" -qAtX -c "SELECT pg_current_wal_insert_lsn()"; }

# wal_per_op NAME START_LSN N: the WAL records written since START_LSN per operation,
# read from the WAL itself (pg_walinspect, so no backend's unreported statistics are
# missed), and how many of them insert an index entry (a btree leaf insert, posting-list
# insert or leaf split: docs/benchmarks.md, "Index entries per claim and per effect").
# Nothing else writes to the cluster meanwhile.
wal_per_op() {
	local line
	line=$(psql "$ADMIN_URL" -qAtX -F ' ' -c "SELECT sum(count),
		coalesce(sum(count) FILTER (WHERE \"resource_manager/record_type\" IN
		  ('Btree/INSERT_LEAF', 'Btree/INSERT_POST', 'Btree/SPLIT_L', 'Btree/SPLIT_R')), 0)
		FROM pg_get_wal_stats_till_end_of_wal('$2', true)")
	RES["$1 walrec_per_op"]=$(awk -v x="${line%% *}" -v n="$3" 'BEGIN { if (n > 0) printf "%.1f", x / n }')
	RES["$1 idx_per_op"]=$(awk -v x="${line##* }" -v n="$3" 'BEGIN { if (n > 0) printf "%.1f", x / n }')
}

# wal_breakdown NAME DB START_LSN N: the WAL records written since START_LSN per
# operation, by relation of DB (relfilenode → name) and record type, into
# $BENCH_TMP/NAME.wal ("relation|type|per op" lines, most first). Records without a
# relation (commits, ...) are named by their type alone. Only pass 1 is broken down.
wal_breakdown() {
	[ "${1##*_}" = 1 ] || return 0
	local url
	url=$(dburl "$2")
	psql "$url" -qAtX -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS pg_walinspect" >/dev/null 2>&1 || return 0
	psql "$url" -qAtX -F '|' -c "WITH r AS (
		  SELECT resource_manager || '/' || record_type AS t, substring(block_ref FROM 'rel [0-9]+/[0-9]+/([0-9]+)') AS node
		  FROM pg_get_wal_records_info_till_end_of_wal('$3'))
		SELECT coalesce(c.relname, CASE WHEN r.node IS NULL THEN '-' ELSE '(other)' END), r.t,
		  round(count(*)::numeric / $4, 2)
		FROM r LEFT JOIN pg_class c ON c.relfilenode::text = r.node
		GROUP BY 1, 2 HAVING count(*)::numeric / $4 >= 0.05 ORDER BY 3 DESC, 1, 2" >"$BENCH_TMP/$1.wal" 2>/dev/null || true
}

# pays_for RELATION TYPE: what a WAL record of this relation and type pays for
# (docs/benchmarks.md, "WAL records per claim and per effect").
pays_for() {
	case "$1|$2" in
	workflow_runs\|Heap/INSERT*) echo "the run: the idempotency record itself (raw: the same)" ;;
	workflow_runs\|Heap/HEAP_CONFIRM) echo "ON CONFLICT: a second delivery waits for the first, then reads its row" ;;
	workflow_runs\|Heap/HOT_UPDATE*) echo "the run's chain head (0035; HOT) or its open-effect count" ;;
	workflow_runs\|Heap/LOCK) echo "the run's lock: a queue or an outcome group never interleaves with the run's transition" ;;
	workflow_runs_pkey\|*) echo "one run per key" ;;
	workflow_runs_state_created\|* | workflow_runs_key_bytes\|*) echo "GET /v1/runs and the console: newest first (one range per state), by state, by key prefix" ;;
	events\|Heap/INSERT*) echo "the event (the claim's, or the effect's outcome): the audit record, committed with what it records" ;;
	events_pkey\|*) echo "event ids unique; the events page's cursor" ;;
	events_run_key_xid_id\|*) echo "a run's events in commit order: no page skips an event in flight; explain, verify" ;;
	events_at\|*) echo "the report's counts (index-only) and the retention purge, oldest first" ;;
	event_chains*) echo "the chain head of a key with no run, or of a run chained before 0035" ;;
	effects\|Heap/UPDATE*) echo "a state change (lease: pending → sending; outcome): the version fence send-once rests on" ;;
	effects\|Heap/HOT_UPDATE*) echo "the begin-mark: written before the provider call, so a crash after it is unknown, never resent blind" ;;
	effects\|Heap/LOCK) echo "the outcome's row lock on its effect" ;;
	effects\|Heap/INSERT*) echo "the effect: the outbox row" ;;
	effects_pkey\|* | effects_run_effect\|*) echo "each state change is a new row version: an entry in every index it belongs to (partial indexes name the state: not HOT)" ;;
	effects_sending\|*) echo "the lapsed-lease sweep finds sending effects" ;;
	effects_purge_at\|*) echo "payload retention of settled effects" ;;
	effects_due\|*) echo "the lease finds due effects" ;;
	effect_count_deltas\|*) echo "counts per state without count(*): one row per state a statement changes" ;;
	-\|Transaction/COMMIT*) echo "durability: one commit per transaction (synchronous_commit=on)" ;;
	-\|Standby/RUNNING_XACTS | -\|XLOG/*) echo "the server's own bookkeeping (checkpoints, snapshots): not per operation" ;;
	*\|Heap2/* | *\|XLOG/FPI*) echo "page maintenance (pruning, visibility, full-page images after a checkpoint): load-dependent" ;;
	*\|Btree/SPLIT*) echo "an index page split (growth)" ;;
	*) echo "" ;;
	esac
}

# print_breakdown NAME [BASELINE_NAME]: NAME's WAL records per operation by relation and
# type, beside the baseline's, each with what it pays for.
print_breakdown() {
	[ -s "$BENCH_TMP/$1.wal" ] || return 0
	local rel typ n base
	while IFS='|' read -r rel typ n; do
		base=""
		[ -z "${2:-}" ] || base=$(awk -F'|' -v r="$rel" -v t="$typ" '$1 == r && $2 == t { print $3 }' "$BENCH_TMP/$2.wal" 2>/dev/null)
		printf '    %-30s %-22s %5s %5s  %s\n' "$rel" "$typ" "$n" "${base:-0}" "$(pays_for "$rel" "$typ")"
	done <"$BENCH_TMP/$1.wal"
	[ -z "${2:-}" ] || awk -F'|' 'NR == FNR { seen[$1 "|" $2] = 1; next } !(($1 "|" $2) in seen) {
		printf "    %-30s %-22s %5s %5s  (the baseline only)\n", $1, $2, 0, $3 }' "$BENCH_TMP/$1.wal" "$BENCH_TMP/$2.wal"
}

# claims_raw NAME: pgbench with the seed's claim statement; CPU = pgbench (times) + cluster.
claims_raw() {
	want claims || return 0
	log "$1: pgbench, raw claim statement, $CLIENTS clients, ${SECS}s"
	local pg0 pg1 t w0 w1 l0
	w0=$(pg_work)
	l0=$(wal_lsn)
	pg_wait_children "$PG_IDLE"
	pg0=$(pg_cpu)
	(
		pgbench -n -M prepared -c "$CLIENTS" -j "$CLIENTS" -T "$SECS" -f "$BENCH_TMP/claim.sql" "$CLAIMS_DB" >"$BENCH_TMP/$1.out" 2>&1
		times >"$BENCH_TMP/$1.times"
	) || {
		cat "$BENCH_TMP/$1.out" >&2
		die "pgbench failed"
	}
	# pgbench's backends exit after it does: sampled while one is exiting, a backend is
	# neither a live child nor yet in the postmaster's reaped time, and its CPU is lost
	# (a pass once read 0.00 ms per claim). Wait for them to be reaped.
	pg_wait_children "$PG_IDLE"
	pg1=$(pg_cpu)
	w1=$(pg_work)
	# times: line 2 is the children's user and sys time, e.g. "0m1.230s 0m0.450s".
	t=$(sed -n 2p "$BENCH_TMP/$1.times" | awk '{ n = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); n += a[1] * 60 + a[2] } printf "%.2f", n }')
	local tps n
	tps=$(sed -nE 's/^tps = ([0-9.]+).*without initial connection time.*/\1/p' "$BENCH_TMP/$1.out")
	n=$(sed -nE 's/^number of transactions actually processed: ([0-9]+).*/\1/p' "$BENCH_TMP/$1.out")
	RES["$1 rate"]=$tps
	RES["$1 cpu_process_s"]=$t
	RES["$1 cpu_pg_s"]=$(awk -v a="$pg0" -v b="$pg1" 'BEGIN { printf "%.2f", b - a }')
	RES["$1 cpu_us_per_op"]=$(awk -v a="$pg0" -v b="$pg1" -v t="$t" -v n="$n" 'BEGIN { printf "%.0f", (b - a + t) * 1e6 / n }')
	RES["$1 cpu_pg_us_per_op"]=$(awk -v a="$pg0" -v b="$pg1" -v n="$n" 'BEGIN { printf "%.0f", (b - a) * 1e6 / n }')
	RES["$1 cpu_process_us_per_op"]=$(awk -v t="$t" -v n="$n" 'BEGIN { printf "%.0f", t * 1e6 / n }')
	work_per_op "$1" "$w0" "$w1" "$n"
	wal_per_op "$1" "$l0" "$n"
	wal_breakdown "$1" "$CLAIMS_DB_NAME" "$l0" "$n"
}

# claims_http NAME: airlock serve (CLIENTS pool connections) under `airlock bench claims`.
claims_http() {
	want claims || return 0
	log "$1: airlock serve, HTTP claims, $CLIENTS clients, ${SECS}s"
	local port pid w0 w1 l0
	w0=$(pg_work)
	l0=$(wal_lsn)
	port=$(free_port)
	AIRLOCK_DATABASE_URL="$CLAIMS_DB&pool_max_conns=$CLIENTS" AIRLOCK_LISTEN="127.0.0.1:$port" AIRLOCK_LOG_LEVEL=warn \
		"$AIRLOCK" serve >"$BENCH_TMP/$1.log" 2>&1 </dev/null &
	pid=$!
	echo "$pid" >>"$BENCH_TMP/pids"
	wait_ready "$port" "$pid" "$BENCH_TMP/$1.log"
	AIRLOCK_API_KEY=$CLAIMS_KEY "$DRIVER" bench claims --url "http://127.0.0.1:$port" --concurrency "$CLIENTS" \
		--duration "${SECS}s" --duplicate-every 0 --baseline=false --cpu-pg-pid "$PGPID" --cpu-pid "$pid" \
		>"$BENCH_TMP/$1.out" 2>&1 || {
		cat "$BENCH_TMP/$1.out" >&2
		FAILED=1
	}
	stop_instances
	w1=$(pg_work)
	parse_result "$1" "$BENCH_TMP/$1.out"
	work_per_op "$1" "$w0" "$w1" "$(get "$1" requests)"
	wal_per_op "$1" "$l0" "$(get "$1" requests)"
	wal_breakdown "$1" "$CLAIMS_DB_NAME" "$l0" "$(get "$1" requests)"
}

# An idle instance's startup CPU (included in each airlock outbox figure above): start,
# wait ready, read. Printed so the reader can take it out.
startup_cpu() {
	local db port pid
	db=$(newdb startup)
	AIRLOCK_DATABASE_URL=$db "$AIRLOCK" migrate >/dev/null 2>&1
	port=$(free_port)
	write_policy "$BENCH_TMP/idle.yaml" false "$(free_port)" 32
	start_instance startup "$port" "$BENCH_TMP/idle.yaml" "$db"
	pid=$(cat "$BENCH_TMP/startup.pid")
	STARTUP=$(awk '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / 100 }' "/proc/$pid/stat")
	stop_instances
	dropdb_ startup
}

if want claims; then
	CLAIMS_DB=$(newdb claims "$CLIENTS")
	CLAIMS_DB_NAME="${RUN_ID}_claims"
	CLAIMS_DB=${CLAIMS_DB%&pool_max_conns=*}
	CLAIMS_DB=${CLAIMS_DB%\?pool_max_conns=*}
	AIRLOCK_DATABASE_URL=$CLAIMS_DB "$AIRLOCK" migrate >/dev/null 2>&1
	CLAIMS_KEY=$(AIRLOCK_DATABASE_URL=$CLAIMS_DB "$AIRLOCK" apikey create --name bench --scope runs 2>/dev/null)
	# The seed's claim statement (as in internal/store/storetest/bench_test.go and
	# scripts/bench-claims.sh), on a random new key per transaction.
	# The seed's bare claim statement (also in internal/runs/bench_test.go), as pgbench runs it.
	cp "$ROOT/scripts/raw-claim.sql" "$BENCH_TMP/claim.sql"
fi

psql "$ADMIN_URL" -qAtX -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS pg_walinspect" >/dev/null ||
	die "pg_walinspect (PostgreSQL's contrib modules) is needed to count WAL records and index entries"
STARTED=$(date +%s)
sleep 1 # the connections of the setup above exit
PG_IDLE=$(pg_children) # the cluster's own processes, no client connected
STARTUP=""
startup_cpu
for pass in $(seq 1 "$PASSES"); do
	airlock_drain "a32_$pass" 32
	river_drain "r32_$pass" 32
	airlock_drain "a256_$pass" 256
	river_drain "r256_$pass" 256
	airlock_drain "a500_$pass" 500
	river_drain "r500_$pass" 500 tuned
	claims_raw "claimsraw_$pass"
	claims_http "claimshttp_$pass"
done

# --- report -----------------------------------------------------------------
ms() { awk -v u="$1" 'BEGIN{ if (u=="") print "n/a"; else printf "%.2f", u/1000 }'; }
# cell SCENARIO: "total ms (PG x, process y), rate/s"
cell() {
	[ -n "$(get "$1" cpu_us_per_op)" ] || {
		echo "(not run)"
		return
	}
	printf '%s ms (PG %s, proc %s), %.0f/s' "$(ms "$(get "$1" cpu_us_per_op)")" "$(ms "$(get "$1" cpu_pg_us_per_op)")" \
		"$(ms "$(get "$1" cpu_process_us_per_op)")" "$(get "$1" rate)"
}

echo
echo "== CPU per operation: $(date -u '+%Y-%m-%d %H:%M') UTC, $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(($(date +%s) - STARTED))s, idempotent provider $IDEMPOTENT =="
echo "   measured airlock: ${AIRLOCK_BIN:-this tree} ($("$AIRLOCK" version 2>/dev/null | head -n 1 || true)); PostgreSQL $(psql "$ADMIN_URL" -qAtX -c 'SHOW server_version'); River v0.51.2"
echo "   CPU = user+sys of the process + the PostgreSQL cluster (postmaster, live and reaped children), /proc, before/after the drain"
echo "   outbox: $COUNT effects/jobs, pre-filled, one HTTP POST each to a local no-op provider; pool_max_conns $POOL"
echo "   airlock serve startup (included in each airlock figure): ${STARTUP:-?} s CPU = $(awk -v s="${STARTUP:-0}" -v n="$COUNT" 'BEGIN{printf "%.3f", s*1000/n}') ms per effect"
echo
printf '| %-36s | %-4s | %-44s | %-44s | %-9s | %-8s | %-10s |\n' "work" "pass" "airlock" "baseline" "CPU ratio" "PG ratio" "throughput"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' "--------------------------------------" "------" "----------------------------------------------" "----------------------------------------------" "-----------" "----------" "------------"
declare -A WORST_CPU WORST_PG WORST_TP
for spec in "a32 r32 outbox, concurrency 32 / 32 workers" "a256 r256 outbox, concurrency 256 / 256 workers" \
	"a500 r500 outbox, 500 / River tuned 500" "claimshttp claimsraw claims, 8 clients (pgbench)"; do
	read -r a b label <<<"$spec"
	for pass in $(seq 1 "$PASSES"); do
		[ -n "$(get "${a}_$pass" cpu_us_per_op)$(get "${b}_$pass" cpu_us_per_op)" ] || continue
		rc=$(ratio "$(get "${a}_$pass" cpu_us_per_op)" "$(get "${b}_$pass" cpu_us_per_op)")
		rp=$(ratio "$(get "${a}_$pass" cpu_pg_us_per_op)" "$(get "${b}_$pass" cpu_pg_us_per_op)")
		rt=$(ratio "$(get "${a}_$pass" rate)" "$(get "${b}_$pass" rate)")
		printf '| %-36s | %-4s | %-44s | %-44s | %-9s | %-8s | %-10s |\n' "$label" "$pass" "$(cell "${a}_$pass")" "$(cell "${b}_$pass")" "$rc×" "$rp×" "$rt×"
		WORST_CPU[$a]=$(awk -v w="${WORST_CPU[$a]:-0}" -v r="$rc" 'BEGIN{ print (r=="n/a" || r+0 > w+0) ? r : w }')
		WORST_PG[$a]=$(awk -v w="${WORST_PG[$a]:-0}" -v r="$rp" 'BEGIN{ print (r=="n/a" || r+0 > w+0) ? r : w }')
		WORST_TP[$a]=$(awk -v w="${WORST_TP[$a]:-999}" -v r="$rt" 'BEGIN{ print (r=="n/a" || r+0 < w+0) ? r : w }')
	done
done

if [ -n "$(get claimshttp_1 wal_per_op)" ]; then
	echo
	echo "PostgreSQL work per claim (counts, not times: they do not move with the machine's load)"
	for pass in $(seq 1 "$PASSES"); do
		printf '  pass %s: airlock %s WAL records (%s index entries), %s buffer accesses; raw statement %s WAL records (%s index entries), %s buffer accesses\n' "$pass" \
			"$(get "claimshttp_$pass" wal_per_op)" "$(get "claimshttp_$pass" idx_per_op)" "$(get "claimshttp_$pass" blks_per_op)" \
			"$(get "claimsraw_$pass" wal_per_op)" "$(get "claimsraw_$pass" idx_per_op)" "$(get "claimsraw_$pass" blks_per_op)"
	done
fi
if [ -s "$BENCH_TMP/claimshttp_1.wal" ]; then
	echo
	echo "Where a claim's WAL records go (pass 1; per claim: airlock, the raw statement) and what each pays for"
	print_breakdown claimshttp_1 claimsraw_1
fi
if [ -s "$BENCH_TMP/a32_1.wal" ]; then
	echo
	echo "Where an effect's WAL records go (pass 1, concurrency 32, dispatcher start to stop; per effect) and what each pays for"
	print_breakdown a32_1
fi
if [ -n "$(get a32_1 walrec_per_op)$(get a256_1 walrec_per_op)$(get a500_1 walrec_per_op)" ]; then
	echo
	echo "PostgreSQL work per effect, from the dispatcher's start to its stop (lease, begin-mark, outcome, events)"
	for pass in $(seq 1 "$PASSES"); do
		for a in a32 a256 a500; do
			[ -n "$(get "${a}_$pass" walrec_per_op)" ] || continue
			printf '  pass %s, concurrency %s: %s WAL records, %s index entries\n' "$pass" "${a#a}" \
				"$(get "${a}_$pass" walrec_per_op)" "$(get "${a}_$pass" idx_per_op)"
		done
	done
fi

echo
echo "targets (issue 23; worst pass)"
for a in a32 a256 a500; do
	[ -n "${WORST_CPU[$a]:-}" ] || continue
	printf '  %-58s %6s  %s\n' "outbox ${a#a}: CPU per effect / River's  (≤ 1.5)" "${WORST_CPU[$a]}" "$(verdict "${WORST_CPU[$a]}" "<=" 1.5)"
	printf '  %-58s %6s  %s\n' "outbox ${a#a}: PostgreSQL CPU per effect / River's  (≤ 2)" "${WORST_PG[$a]}" "$(verdict "${WORST_PG[$a]}" "<=" 2)"
	printf '  %-58s %6s  %s\n' "outbox ${a#a}: effects/s / River's jobs/s  (≥ 0.8, shared machine)" "${WORST_TP[$a]}" "$(verdict "${WORST_TP[$a]}" ">=" 0.8)"
done
if [ -n "${WORST_CPU[claimshttp]:-}" ]; then
	printf '  %-58s %6s  %s\n' "claims: CPU per claim / the raw statement's  (≤ 2)" "${WORST_CPU[claimshttp]}" "$(verdict "${WORST_CPU[claimshttp]}" "<=" 2)"
	printf '  %-58s %6s  %s\n' "claims: claims/s / the raw statement's  (≥ 0.7, shared machine)" "${WORST_TP[claimshttp]}" "$(verdict "${WORST_TP[claimshttp]}" ">=" 0.7)"
fi

if [ "$FAILED" -ne 0 ]; then
	log "FAILED: a run found duplicates, failed, or did not produce a result (see above)"
	exit 1
fi
