#!/usr/bin/env bash
# Usage: bash scripts/capacity.sh          (≈ 6 minutes; prints a markdown table)
#
# What one database carries (issue 38): `airlock serve` on one PostgreSQL (a throwaway
# cluster from scripts/with-postgres.sh, or AIRLOCK_TEST_DATABASE_URL when the cluster
# runs on this machine) and on the embedded SQLite, under open-loop load at fixed
# offered rates (`airlock bench effects --mode rate`): arrivals every 1/rate s whatever
# the server answers, latencies from each arrival's scheduled time. Two workloads:
#
#   claims   each arrival claims a new run (POST /v1/runs/claim)
#   effects  each arrival claims a new run and queues one effect in it; the dispatcher
#            in the same serve sends it (one HTTP POST) to a local no-op provider in the
#            load generator's process; latency = queue request → provider arrival
#
# Per step (a fresh database each): the rate held (answered within the window plus
# CAPACITY_GRACE, per second of the window), p50/p99 latencies, CPU % (100 = one core) of
# PostgreSQL (postmaster + children) and of airlock serve, the machine's busy % (all
# cores, everything on it), and for PostgreSQL the WAL bytes/s and WAL fsyncs/s
# (pg_stat_wal: wal_bytes, wal_sync), for SQLite serve's bytes written to storage per
# second (/proc/PID/io). A step is held when ≥ 95% of the offered rate is answered with
# no arrival dropped and p99 under 1 s; once a step holds under half its rate, the higher
# rates of that workload are not run.
#
# Environment: CAPACITY_RATES ("100 500 1000 2000"), CAPACITY_SECONDS (10),
# CAPACITY_GRACE (5s), CAPACITY_BACKENDS ("postgres sqlite"), CAPACITY_WORKLOADS
# ("claims effects"), CAPACITY_PG_POOL (20: pool_max_conns), CAPACITY_CONNS (64: HTTP
# connections of the load generator), AIRLOCK_BIN (a prebuilt airlock to measure).
# Dispatch settings are the defaults (batch_size 32, concurrency 32, interval 500ms; a
# queued effect wakes the dispatcher at once).
# shellcheck disable=SC2317 # functions run from traps
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF="$ROOT/scripts/capacity.sh"
BACKENDS=${CAPACITY_BACKENDS:-postgres sqlite}

if [ -z "${AIRLOCK_TEST_DATABASE_URL:-}" ] && [[ $BACKENDS == *postgres* ]]; then
	exec bash "$ROOT/scripts/with-postgres.sh" bash "$SELF" "$@"
fi

log() { printf 'capacity: %s\n' "$*" >&2; }
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

command -v curl >/dev/null || die "curl is needed"
[ -r /proc/self/stat ] || die "this script reads CPU times from /proc (Linux)"

RATES=${CAPACITY_RATES:-100 500 1000 2000}
SECS=${CAPACITY_SECONDS:-10}
GRACE=${CAPACITY_GRACE:-5s}
WORKLOADS=${CAPACITY_WORKLOADS:-claims effects}
POOL=${CAPACITY_PG_POOL:-20}
CONNS=${CAPACITY_CONNS:-64}
ONLY=.
RUN_ID="cap$(date +%s)$RANDOM"
ADMIN_URL=${AIRLOCK_TEST_DATABASE_URL:-}

BENCH_TMP=$(mktemp -d "${TMPDIR:-/tmp}/airlock-capacity.XXXXXX")
export BENCH_TMP
: >"$BENCH_TMP/pids"
: >"$BENCH_TMP/dbs"

cleanup() {
	local rc=$?
	trap '' INT TERM HUP
	stop_instances
	[ -z "$ADMIN_URL" ] || drop_bench_dbs
	rm -rf "$BENCH_TMP"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

PGPID=""
if [ -n "$ADMIN_URL" ]; then
	command -v psql >/dev/null || die "psql is needed"
	DATADIR=$(psql "$ADMIN_URL" -qAtX -c "SHOW data_directory")
	PGPID=$(head -n 1 "$DATADIR/postmaster.pid" 2>/dev/null) || die "cannot read $DATADIR/postmaster.pid (the cluster must run on this machine)"
	PG_SETTINGS=$(psql "$ADMIN_URL" -qAtX -F '|' -c "SELECT split_part(current_setting('server_version'), ' ', 1), current_setting('fsync'),
		current_setting('synchronous_commit'), current_setting('wal_sync_method'), current_setting('shared_buffers'),
		current_setting('max_wal_size')")
fi

log "building airlock"
(cd "$ROOT" && GOTOOLCHAIN=local go build -o "$BENCH_TMP/airlock" ./cmd/airlock)
DRIVER="$BENCH_TMP/airlock"
AIRLOCK=${AIRLOCK_BIN:-$DRIVER}

# write_policy FILE PROVIDER_PORT: the bench action to the provider, default dispatch.
write_policy() {
	cat >"$1" <<EOF
actions:
  bench:
    connector: http
    gate: none
    http: {url: "http://127.0.0.1:$2/send", timeout: 10s}
EOF
}

# pg_wal: "wal_bytes wal_sync" of the cluster so far (backends report on exit: sample
# after serve stopped).
pg_wal() {
	sleep 0.5
	psql "$ADMIN_URL" -qAtX -F ' ' -c "SELECT wal_bytes, wal_sync FROM pg_stat_wal"
}

declare -A RES # "backend workload rate field" → value

# step BACKEND WORKLOAD RATE
step() {
	local backend=$1 workload=$2 r=$3 db url key port pid pport out rc=0 w0 w1 t0 t1 io0=0 io1=0
	local name="${backend}_${workload}_$r"
	log "$backend, $workload, $r/s for ${SECS}s"
	if [ "$backend" = postgres ]; then
		url=$(newdb "$name" "$POOL")
	else
		url="$BENCH_TMP/$name.db"
	fi
	AIRLOCK_DATABASE_URL=$url "$AIRLOCK" migrate >/dev/null 2>&1 || die "migrate $name failed"
	key=$(AIRLOCK_DATABASE_URL=$url "$AIRLOCK" apikey create --name bench --scope runs 2>/dev/null)
	port=$(free_port)
	pport=$(free_port)
	write_policy "$BENCH_TMP/policy.yaml" "$pport"
	AIRLOCK_DATABASE_URL=$url AIRLOCK_LISTEN="127.0.0.1:$port" AIRLOCK_CONFIG="$BENCH_TMP/policy.yaml" AIRLOCK_LOG_LEVEL=warn \
		"$AIRLOCK" serve --migrate=false >"$BENCH_TMP/$name.log" 2>&1 </dev/null &
	pid=$!
	echo "$pid" >>"$BENCH_TMP/pids"
	wait_ready "$port" "$pid" "$BENCH_TMP/$name.log"
	local -a extra=(--cpu-pid "$pid")
	[ "$backend" != postgres ] || extra+=(--cpu-pg-pid "$PGPID")
	[ "$workload" != claims ] || extra+=(--claims-only)
	[ "$backend" != postgres ] || w0=$(pg_wal)
	io0=$(awk '/^write_bytes/ { print $2 }' "/proc/$pid/io" 2>/dev/null || echo 0)
	t0=$(date +%s.%N)
	"$DRIVER" bench effects --mode rate --url "http://127.0.0.1:$port" --api-key "$key" --provider-listen "127.0.0.1:$pport" \
		--rate "$r" --duration "${SECS}s" --grace "$GRACE" --concurrency "$CONNS" "${extra[@]}" >"$BENCH_TMP/$name.out" 2>&1 || rc=$?
	t1=$(date +%s.%N)
	io1=$(awk '/^write_bytes/ { print $2 }' "/proc/$pid/io" 2>/dev/null || echo 0)
	stop_instances
	if [ "$rc" -ne 0 ]; then
		tail -n 5 "$BENCH_TMP/$name.out" >&2
		die "$name: the load generator failed"
	fi
	local line kv
	line=$(grep '^result ' "$BENCH_TMP/$name.out" | tail -n 1)
	for kv in ${line#result }; do
		RES["$name ${kv%%=*}"]=${kv#*=}
	done
	local el
	el=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
	if [ "$backend" = postgres ]; then
		w1=$(pg_wal)
		RES["$name wal_mb_s"]=$(awk -v a="${w0%% *}" -v b="${w1%% *}" -v t="$el" 'BEGIN { printf "%.1f", (b - a) / t / 1e6 }')
		RES["$name fsync_s"]=$(awk -v a="${w0##* }" -v b="${w1##* }" -v t="$el" 'BEGIN { printf "%.0f", (b - a) / t }')
		dropdb_ "$name"
	else
		RES["$name write_mb_s"]=$(awk -v a="$io0" -v b="$io1" -v t="$el" 'BEGIN { printf "%.1f", (b - a) / t / 1e6 }')
		rm -f "$url" "$url-wal" "$url-shm"
	fi
	RES["$name load"]=$(cut -d' ' -f1 /proc/loadavg)
}

# held NAME RATE WORKLOAD: "yes" when the step held its offered rate, "half" when it held
# under half of it, "no" otherwise.
held() {
	local c e d p99 s99
	c=$(get "$1" claims_rate)
	e=$(get "$1" effects_rate)
	d=$(get "$1" dropped)
	p99=$(get "$1" claim_p99_ms)
	s99=$(get "$1" send_p99_ms)
	awk -v c="$c" -v e="${e:-$c}" -v d="$d" -v p="$p99" -v s="${s99:-0}" -v r="$2" 'BEGIN {
		h = (e + 0 < c + 0) ? e : c
		if (h < r * 0.5) print "half"; else if (h >= r * 0.95 && d + 0 == 0 && p + 0 < 1000 && s + 0 < 1000) print "yes"; else print "no" }'
}
get() { echo "${RES["$1 $2"]:-}"; }

STARTED=$(date +%s)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for backend in $BACKENDS; do
	[ "$backend" != postgres ] || [ -n "$ADMIN_URL" ] || die "no PostgreSQL"
	for workload in $WORKLOADS; do
		stop=0
		for r in $RATES; do
			[ "$stop" -eq 0 ] || break
			step "$backend" "$workload" "$r"
			[ "$(held "${backend}_${workload}_$r" "$r")" != half ] || stop=1
		done
	done
done

# --- report -----------------------------------------------------------------
# fmt_ms MS: a latency; one at or past the window (an arrival dropped or abandoned counts
# at window + grace) prints as "> window".
fmt_ms() { awk -v v="$1" -v w="$SECS" 'BEGIN { if (v == "") print "—"; else if (v + 0 >= w * 1000) printf "> %d s", w; else if (v + 0 >= 100) printf "%.0f", v; else printf "%.1f", v }'; }
echo
echo "## Capacity: what one database carries"
echo
echo "$(date -u '+%Y-%m-%d %H:%M') UTC, $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), load average $LOAD0 at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end, $(($(date +%s) - STARTED)) s."
disk=$(df -P "$BENCH_TMP" | awk 'NR == 2 { print $1 }')
rota=$(lsblk -dno ROTA "$disk" 2>/dev/null | tr -d ' ' || true)
case "$rota" in
1) rota="reported rotational" ;;
0) rota="non-rotational" ;;
*) rota="kind unknown" ;;
esac
echo "Disk: $disk ($rota; $(df -PT "$BENCH_TMP" | awk 'NR == 2 { print $2 }')), the same disk for PostgreSQL's data and SQLite's file."
if [ -n "$ADMIN_URL" ]; then
	IFS='|' read -r v fs sc ws sb mw <<<"$PG_SETTINGS"
	echo "PostgreSQL $v on the same machine: fsync=$fs, synchronous_commit=$sc, wal_sync_method=$ws, shared_buffers=$sb, max_wal_size=$mw; airlock's pool_max_conns=$POOL."
fi
echo "SQLite: one file, WAL journal, synchronous=FULL (airlock's default). Dispatch: batch_size 32, concurrency 32 (defaults). Load: \`airlock bench effects --mode rate\`, $CONNS HTTP connections, ${SECS} s per step plus up to $GRACE grace, on the same cores; the provider answers at once."
echo
echo "| store | work | offered /s | held /s | p50 · p99 claim ms | p50 · p99 enqueue → provider ms | PostgreSQL CPU % | serve CPU % | load generator CPU % | machine busy % | WAL MB/s · fsyncs/s | held? |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for backend in $BACKENDS; do
	for workload in $WORKLOADS; do
		for r in $RATES; do
			n="${backend}_${workload}_$r"
			if [ -z "$(get "$n" offered)" ]; then
				echo "| $backend | $workload | $r | not run (saturated below) | | | | | | | | |"
				continue
			fi
			h=$(get "$n" claims_rate)
			sendcol="—"
			if [ "$workload" = effects ]; then
				h=$(get "$n" effects_rate)
				sendcol="$(fmt_ms "$(get "$n" send_p50_ms)") · $(fmt_ms "$(get "$n" send_p99_ms)")"
			fi
			if [ "$backend" = postgres ]; then
				io="$(get "$n" wal_mb_s) · $(get "$n" fsync_s)"
				pgc="$(get "$n" cpu_pg_pct)"
			else
				io="(disk writes $(get "$n" write_mb_s) MB/s)"
				pgc="—"
			fi
			v=$(held "$n" "$r")
			[ "$v" != half ] || v=no
			d=$(get "$n" dropped)
			[ "${d:-0}" = 0 ] || v="$v ($d dropped)"
			printf '| %s | %s | %s | %.0f | %s · %s | %s | %s | %s | %s | %s | %s | %s |\n' "$backend" "$workload" "$r" "$h" \
				"$(fmt_ms "$(get "$n" claim_p50_ms)")" "$(fmt_ms "$(get "$n" claim_p99_ms)")" "$sendcol" "$pgc" \
				"$(get "$n" cpu_serve_pct)" "$(get "$n" cpu_driver_pct)" "$(get "$n" cpu_machine_pct)" "$io" "$v"
		done
	done
done
echo
echo "Saturation (the first step not held, per store and work, and the busiest resource there):"
for backend in $BACKENDS; do
	for workload in $WORKLOADS; do
		last="" first=""
		for r in $RATES; do
			n="${backend}_${workload}_$r"
			[ -n "$(get "$n" offered)" ] || break
			if [ "$(held "$n" "$r")" = yes ]; then last=$r; else
				first=$r
				break
			fi
		done
		if [ -z "$first" ]; then
			echo "- $backend $workload: held every offered rate (up to ${last:-?}/s)."
			continue
		fi
		n="${backend}_${workload}_$first"
		m=$(get "$n" cpu_machine_pct)
		pgpart=""
		[ "$backend" != postgres ] || pgpart="PostgreSQL $(get "$n" cpu_pg_pct)%, "
		why="the machine's CPU ($m% of $(nproc) cores busy: ${pgpart}serve $(get "$n" cpu_serve_pct)%, the load generator $(get "$n" cpu_driver_pct)% — 100% is one core —, the rest other work on the machine)"
		[ "${m:-0}" -ge 90 ] || why="not CPU ($m% busy): waits — commits (fsync) and lock or pool queues"
		held_txt="held ${last}/s, not ${first}/s"
		[ -n "$last" ] || held_txt="held no offered rate (not ${first}/s)"
		echo "- $backend $workload: $held_txt; first resource: $why."
	done
done
