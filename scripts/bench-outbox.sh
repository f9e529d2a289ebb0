#!/usr/bin/env bash
# Usage: bash scripts/bench-outbox.sh
#
# The outbox benchmark: airlock's dispatcher beside River on one throwaway PostgreSQL
# (started by scripts/with-postgres.sh unless AIRLOCK_TEST_DATABASE_URL is set). It
# builds airlock and bench/river, then runs, each in a database of its own:
#   airlock, 1 and 2 dispatching instances, no-op and 50 ms provider (pre-filled queue)
#   airlock, idle enqueue → send-start latency (1 instance)
#   River, default and tuned, no-op and 50 ms jobs (pre-filled queue), idle latency
# and prints a table and the ratios airlock targets (airlock at least River's no-op rate,
# and a 50 ms provider kept busy on every dispatch slot). Everything binds to 127.0.0.1 and
# is stopped on exit. Sizes (environment):
#   BENCH_COUNT=5000          effects/jobs per no-op run
#   BENCH_SLEEP_COUNT=2000    effects/jobs per 50 ms run
#   BENCH_SLEEP=50ms          provider/job time of the slow runs (in ms)
#   BENCH_LATENCY_COUNT=200   latency samples
#   BENCH_LATENCY_GAP=100ms   a random pause below this between latency samples
#   BENCH_TIMEOUT=30s         a throughput run that has not finished by then reports how far it got
#   BENCH_CONCURRENCY=32      dispatch.concurrency written into the policy, if this build accepts it
#   BENCH_DISPATCH_INTERVAL, BENCH_DISPATCH_BATCH_SIZE   written into the policy when set
#   BENCH_PG_POOL=20          pool_max_conns of every airlock instance and of River
#   BENCH_ONLY=regex          run only the scenarios whose name matches (e.g. 'river|lat')
# shellcheck disable=SC2317 # functions run from traps
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF="$ROOT/scripts/bench-outbox.sh"

if [ -z "${AIRLOCK_TEST_DATABASE_URL:-}" ]; then
	exec bash "$ROOT/scripts/with-postgres.sh" bash "$SELF" "$@"
fi

log() { printf 'bench-outbox: %s\n' "$*" >&2; }
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

# start_instance NAME PORT POLICY DBURL: airlock serve in the background, its pid recorded.
start_instance() {
	"$BENCH_TMP/airlock" serve --listen "127.0.0.1:$2" --config "$3" --database-url "$4" \
		--log-level warn --migrate=false >"$BENCH_TMP/$1.log" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >>"$BENCH_TMP/pids"
	wait_ready "$2" "$pid" "$BENCH_TMP/$1.log"
}

# Called by `airlock bench effects --then` once the queue is full: start N dispatching
# instances and return when they are ready.
if [ "${1:-}" = "__start" ]; then
	n=$2 db=$3
	for i in $(seq 1 "$n"); do
		start_instance "dispatcher-$i-$RANDOM" "$(free_port)" "$BENCH_TMP/dispatch.yaml" "$db"
	done
	exit 0
fi

command -v curl >/dev/null || die "curl is needed"
command -v psql >/dev/null || die "psql is needed"

COUNT=${BENCH_COUNT:-5000}
SLEEP_COUNT=${BENCH_SLEEP_COUNT:-2000}
SLEEP=${BENCH_SLEEP:-50ms}
LAT_COUNT=${BENCH_LATENCY_COUNT:-200}
LAT_GAP=${BENCH_LATENCY_GAP:-100ms}
TIMEOUT=${BENCH_TIMEOUT:-30s}
CONCURRENCY=${BENCH_CONCURRENCY:-32}
POOL=${BENCH_PG_POOL:-20}
ONLY=${BENCH_ONLY:-.}
ADMIN_URL=$AIRLOCK_TEST_DATABASE_URL
RUN_ID="b$(date +%s)$RANDOM"

BENCH_TMP=$(mktemp -d "${TMPDIR:-/tmp}/airlock-bench.XXXXXX")
export BENCH_TMP
: >"$BENCH_TMP/pids"
: >"$BENCH_TMP/dbs"
FAILED=0

cleanup() {
	local rc=$?
	trap '' INT TERM HUP
	stop_instances
	drop_bench_dbs
	rm -rf "$BENCH_TMP"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# write_policy FILE DISABLED PROVIDER_PORT [CONCURRENCY]
write_policy() {
	{
		echo "actions:"
		echo "  bench:"
		echo "    connector: http"
		echo "    gate: none"
		echo "    http: {url: \"http://127.0.0.1:$3/send\", timeout: 10s}"
		echo "dispatch:"
		echo "  disabled: $2"
		[ -z "${4:-}" ] || echo "  concurrency: $4"
		[ -z "${BENCH_DISPATCH_INTERVAL:-}" ] || echo "  interval: $BENCH_DISPATCH_INTERVAL"
		[ -z "${BENCH_DISPATCH_BATCH_SIZE:-}" ] || echo "  batch_size: $BENCH_DISPATCH_BATCH_SIZE"
	} >"$1"
}

declare -A RES # "scenario field" → value

# parse_result SCENARIO FILE: keep the fields of its "result k=v…" line.
parse_result() {
	local line kv
	line=$(grep '^result ' "$2" | tail -n 1 || true)
	RES["$1 ran"]=1
	for kv in ${line#result }; do
		RES["$1 ${kv%%=*}"]=${kv#*=}
	done
}

# --- build ------------------------------------------------------------------
log "building airlock and bench/river"
(cd "$ROOT" && GOTOOLCHAIN=local go build -o "$BENCH_TMP/airlock" ./cmd/airlock)
(cd "$ROOT/bench/river" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -o "$BENCH_TMP/riverbench" .)
AIRLOCK="$BENCH_TMP/airlock"

# --- does this build's policy know dispatch.concurrency? ----------------------
CONC_WRITTEN=""
checkdb=$(newdb check)
write_policy "$BENCH_TMP/check.yaml" true 9 "$CONCURRENCY"
if out=$("$AIRLOCK" effects list --config "$BENCH_TMP/check.yaml" --database-url "$checkdb" 2>&1); then
	CONC_WRITTEN=$CONCURRENCY
	log "policy accepts dispatch.concurrency: writing concurrency: $CONCURRENCY"
elif grep -qi concurrency <<<"$out"; then
	log "this build's policy has no dispatch.concurrency (${out##*: }); running without it"
else
	die "policy check failed: $out"
fi
dropdb_ check

# airlock_throughput NAME INSTANCES PROVIDER_SLEEP COUNT
airlock_throughput() {
	want "$1" || return 0
	log "$1: $4 effects, $2 dispatching instance(s), provider sleep $3"
	local db key pport qport rc=0
	db=$(newdb "$1")
	key=$(AIRLOCK_DATABASE_URL=$db "$AIRLOCK" apikey create --name bench --scope runs 2>/dev/null)
	pport=$(free_port)
	qport=$(free_port)
	write_policy "$BENCH_TMP/queue.yaml" true "$pport" "$CONC_WRITTEN"
	write_policy "$BENCH_TMP/dispatch.yaml" false "$pport" "$CONC_WRITTEN"
	start_instance "queue-$1" "$qport" "$BENCH_TMP/queue.yaml" "$db"
	"$AIRLOCK" bench effects --url "http://127.0.0.1:$qport" --api-key "$key" \
		--provider-listen "127.0.0.1:$pport" --provider-sleep "$3" --count "$4" --concurrency 16 \
		--timeout "$TIMEOUT" --then "bash '$SELF' __start $2 '$db'" 2>&1 | tee "$BENCH_TMP/$1.out" || rc=$?
	stop_instances
	dropdb_ "$1"
	parse_result "$1" "$BENCH_TMP/$1.out"
	if grep -q DUPLICATES "$BENCH_TMP/$1.out" || ! grep -q '^result ' "$BENCH_TMP/$1.out"; then
		FAILED=1
	fi
	[ "$rc" -eq 0 ] || log "$1: exit $rc"
}

airlock_latency() {
	want "$1" || return 0
	log "$1: $LAT_COUNT single effects on an idle instance"
	local db key pport port rc=0
	db=$(newdb "$1")
	key=$(AIRLOCK_DATABASE_URL=$db "$AIRLOCK" apikey create --name bench --scope runs 2>/dev/null)
	pport=$(free_port)
	port=$(free_port)
	write_policy "$BENCH_TMP/dispatch.yaml" false "$pport" "$CONC_WRITTEN"
	start_instance "latency" "$port" "$BENCH_TMP/dispatch.yaml" "$db"
	"$AIRLOCK" bench effects --mode latency --url "http://127.0.0.1:$port" --api-key "$key" \
		--provider-listen "127.0.0.1:$pport" --count "$LAT_COUNT" --gap "$LAT_GAP" --timeout "$TIMEOUT" 2>&1 | tee "$BENCH_TMP/$1.out" || rc=$?
	stop_instances
	dropdb_ "$1"
	parse_result "$1" "$BENCH_TMP/$1.out"
	grep -q '^result ' "$BENCH_TMP/$1.out" || FAILED=1
	[ "$rc" -eq 0 ] || log "$1: exit $rc"
}

# river NAME MODE VARIANT SLEEP COUNT
river() {
	want "$1" || return 0
	log "$1: River $3, $2, $5 jobs, job sleep $4"
	local db rc=0
	db=$(newdb "$1")
	"$BENCH_TMP/riverbench" --database-url "$db" --mode "$2" --variant "$3" --sleep "$4" --count "$5" \
		--gap "$LAT_GAP" --timeout "$TIMEOUT" 2>&1 | tee "$BENCH_TMP/$1.out" || rc=$?
	dropdb_ "$1"
	parse_result "$1" "$BENCH_TMP/$1.out"
	grep -q '^result ' "$BENCH_TMP/$1.out" || FAILED=1
	[ "$rc" -eq 0 ] || log "$1: exit $rc"
}

STARTED=$(date +%s)
airlock_throughput airlock_1_noop 1 0s "$COUNT"
airlock_throughput airlock_2_noop 2 0s "$COUNT"
airlock_throughput airlock_1_sleep 1 "$SLEEP" "$SLEEP_COUNT"
airlock_throughput airlock_2_sleep 2 "$SLEEP" "$SLEEP_COUNT"
airlock_latency airlock_latency
river river_default_noop throughput default 0s "$COUNT"
river river_tuned_noop throughput tuned 0s "$COUNT"
river river_default_sleep throughput default "$SLEEP" "$SLEEP_COUNT"
river river_tuned_sleep throughput tuned "$SLEEP" "$SLEEP_COUNT"
river river_latency latency default 0s "$LAT_COUNT"

# --- report -----------------------------------------------------------------
get() { echo "${RES["$1 $2"]:-}"; }

# tp SCENARIO: "rate" column text for a throughput scenario.
tp() {
	[ -n "$(get "$1" ran)" ] || {
		echo "(not run)"
		return
	}
	local r; r=$(get "$1" rate)
	if [ -z "$r" ]; then
		echo "failed (see above)"
	elif [ "$(get "$1" finished)" = "true" ]; then
		printf '%s/s' "$(awk -v r="$r" 'BEGIN{printf "%.0f", r}')"
	else
		printf 'unfinished in %s: %s/%s, %s/s' "$TIMEOUT" "$(get "$1" completed)" "$(get "$1" count)" \
			"$(awk -v r="$(get "$1" from_start_rate)" 'BEGIN{printf "%.0f", r}')"
	fi
}

row() { printf '  %-44s %8s  %-38s %s\n' "$1" "$(get "$2" count)" "$(tp "$2")" "$(get "$2" duplicates)"; }

# ratio A B → A/B with 2 decimals ("n/a" if either is missing or B is 0).
# verdict VALUE OP TARGET

# Rates of runs that did not finish are what they achieved until the timeout.
rate_of() { [ "$(get "$1" finished)" = "true" ] && get "$1" rate || get "$1" from_start_rate; }

echo
echo "== outbox benchmark: $(date -u +%Y-%m-%d) $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores, $(($(date +%s) - STARTED))s =="
echo "   policy: dispatch.concurrency ${CONC_WRITTEN:-not supported by this build}${BENCH_DISPATCH_INTERVAL:+, interval $BENCH_DISPATCH_INTERVAL}${BENCH_DISPATCH_BATCH_SIZE:+, batch_size $BENCH_DISPATCH_BATCH_SIZE}; pool_max_conns $POOL"
echo "   throughput = first send (job start) → last completion, pre-filled queue"
printf '  %-44s %8s  %-38s %s\n' "throughput" "count" "rate" "dups"
row "airlock, 1 instance, no-op provider" airlock_1_noop
row "airlock, 2 instances, no-op provider" airlock_2_noop
row "airlock, 1 instance, $SLEEP provider" airlock_1_sleep
row "airlock, 2 instances, $SLEEP provider" airlock_2_sleep
row "River default (100 workers), no-op jobs" river_default_noop
row "River tuned, no-op jobs" river_tuned_noop
row "River default (100 workers), $SLEEP jobs" river_default_sleep
row "River tuned, $SLEEP jobs" river_tuned_sleep
printf '  %-44s %8s  %-10s %-10s\n' "idle latency" "samples" "p50" "p99"
for s in airlock_latency river_latency; do
	label="airlock enqueue response → send start"
	[ "$s" = airlock_latency ] || label="River insert → job start (default)"
	printf '  %-44s %8s  %-10s %-10s\n' "$label" "$(get $s count)" "$(get $s p50_ms)${RES["$s p50_ms"]:+ ms}" "$(get $s p99_ms)${RES["$s p99_ms"]:+ ms}"
done

a1n=$(rate_of airlock_1_noop)
a2n=$(rate_of airlock_2_noop)
a1s=$(rate_of airlock_1_sleep)
a2s=$(rate_of airlock_2_sleep)
rdn=$(rate_of river_default_noop)
rtn=$(rate_of river_tuned_noop)
conc=${CONC_WRITTEN:-1}
ideal=$(awk -v c="$conc" -v s="$SLEEP" 'BEGIN{ sub(/ms$/, "", s); printf "%.1f", 0.8 * c / (s / 1000) }')
r1=$(ratio "$a1n" "$rdn")
r1t=$(ratio "$a1n" "$rtn")
r2=$(ratio "$a1s" "$ideal")
r3=$(ratio "$a2s" "$a1s")
r3n=$(ratio "$a2n" "$a1n")
p50=$(get airlock_latency p50_ms)
echo
echo "targets"
printf '  %-62s %8s  %s\n' "no-op: airlock 1 instance / River default  (≥ 1.0)" "$r1" "$(verdict "$r1" ">=" 1.0)"
printf '  %-62s %8s  %s\n' "no-op: airlock 1 instance / River tuned    (for reference)" "$r1t" ""
v2=$(verdict "$r2" ">=" 1.0)
[ -n "$CONC_WRITTEN" ] || v2="n/a: no dispatch.concurrency"
printf '  %-62s %8s  %s\n' "$SLEEP: airlock 1 instance / (0.8 × $conc / $SLEEP = $ideal/s)  (≥ 1.0)" "$r2" "$v2"
printf '  %-62s %8s  %s\n' "idle enqueue → send start p50 ms  (≤ 20)" "${p50:-n/a}" "$(verdict "$p50" "<=" 20)"
printf '  %-62s %8s  %s\n' "$SLEEP: 2 instances / 1 instance  (≥ 1.6)" "$r3" "$(verdict "$r3" ">=" 1.6)"
printf '  %-62s %8s  %s\n' "no-op: 2 instances / 1 instance  (≥ 1.6)" "$r3n" "$(verdict "$r3n" ">=" 1.6)"
[ -n "$CONC_WRITTEN" ] || echo "  (this build has no dispatch.concurrency: the $SLEEP target is computed for sequential sends, concurrency 1)"

if [ "$FAILED" -ne 0 ]; then
	log "FAILED: a run found duplicates or did not produce a result (see above)"
	exit 1
fi
