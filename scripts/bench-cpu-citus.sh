#!/usr/bin/env bash
# Usage: bash scripts/bench-cpu-citus.sh
#
# CPU per claim and per effect on Citus (a coordinator and its workers) beside one plain
# PostgreSQL, in one run, passes alternated Citus / plain (issue 36, item 6). The sibling of
# scripts/bench-cpu.sh, with its two airlock workloads and nothing else:
#
#   claims   airlock serve (BENCH_CLIENTS=8 pool connections) under `airlock bench claims`
#            (new keys, BENCH_CLIENTS clients), BENCH_SECONDS (10);
#   effects  BENCH_COUNT (500) effects queued through a non-dispatching instance, then one
#            dispatching instance (dispatch.concurrency 32) drains them, one HTTP POST each
#            to a local no-op provider; measured from the dispatcher's start to the drain's end.
#
# CPU = user+sys of the airlock serve process doing the work (the dispatcher from its
# start, so its startup is included, as in bench-cpu.sh) plus every node's cluster
# (postmaster, live and reaped children, from /proc) — on Citus the coordinator's and each
# worker's, summed. Every node must run on this machine with a readable data directory.
# Each workload runs in a schema of its own (`search_path` in the URL), so nothing needs
# a database created on every Citus node.
#
# Clusters: by default scripts/with-citus.sh starts a coordinator and two workers and
# scripts/with-postgres.sh one plain PostgreSQL (fsync turned off on it, as with-citus.sh
# does on its nodes). Or point at running ones: BENCH_CITUS_URL (a coordinator; its
# workers are read from pg_dist_node) and AIRLOCK_TEST_DATABASE_URL (the plain one).
# Environment: BENCH_COUNT (500), BENCH_PASSES (2), BENCH_CLIENTS (8), BENCH_SECONDS (10),
# BENCH_TIMEOUT (300s per drain: at 32 shards Citus drained 3–17 effects/s here),
# BENCH_ONLY (regex: claims effects), CITUS_SHARD_COUNT (with-citus.sh's).
# shellcheck disable=SC2317 # functions run from traps
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF="$ROOT/scripts/bench-cpu-citus.sh"

if [ "${1:-}" = "__plain" ]; then
	shift
	export BENCH_STARTED_PLAIN=1
elif [ "${1:-}" = "__citus" ]; then
	# Inside with-citus.sh: the coordinator is ours; now start the plain one beside it.
	export BENCH_CITUS_URL=$AIRLOCK_TEST_DATABASE_URL
	unset AIRLOCK_TEST_DATABASE_URL
	exec bash "$ROOT/scripts/with-postgres.sh" bash "$SELF" __plain
elif [ -z "${BENCH_CITUS_URL:-}" ]; then
	[ -z "${AIRLOCK_TEST_DATABASE_URL:-}" ] || {
		echo "bench-cpu-citus: AIRLOCK_TEST_DATABASE_URL is set but BENCH_CITUS_URL is not" >&2
		exit 1
	}
	exec bash "$ROOT/scripts/with-citus.sh" bash "$SELF" __citus
elif [ -z "${AIRLOCK_TEST_DATABASE_URL:-}" ] && [ "${1:-}" != "__start" ]; then
	exec bash "$ROOT/scripts/with-postgres.sh" bash "$SELF" __plain
fi

log() { printf 'bench-cpu-citus: %s\n' "$*" >&2; }
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

# nodes_cpu PIDS…: the clusters' CPU so far, in clock ticks (each postmaster, its reaped
# children and its live ones).
nodes_cpu() {
	local root p total=0 t
	for root in "$@"; do
		for p in "$root" $(cat /proc/"$root"/task/*/children 2>/dev/null); do
			t=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 + $14 + $15 }' "/proc/$p/stat" 2>/dev/null) || continue
			total=$((total + ${t:-0}))
		done
	done
	echo "$total"
}

# proc_cpu PID: a process's own CPU so far, in clock ticks.
proc_cpu() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }

# Called by `airlock bench effects --then` once the queue is full: the drain starts here.
if [ "${1:-}" = "__start" ]; then
	# shellcheck disable=SC2086 # the postmasters' pids, one word each
	nodes_cpu $PG_PIDS >"$BENCH_TMP/drain.pg0"
	start_instance dispatcher "$(free_port)" "$BENCH_TMP/dispatch.yaml" "$2"
	exit 0
fi

command -v curl >/dev/null || die "curl is needed"
command -v psql >/dev/null || die "psql is needed"
[ -r /proc/self/stat ] || die "this benchmark reads CPU times from /proc (Linux)"

COUNT=${BENCH_COUNT:-500}
PASSES=${BENCH_PASSES:-2}
CLIENTS=${BENCH_CLIENTS:-8}
SECS=${BENCH_SECONDS:-10}
TIMEOUT=${BENCH_TIMEOUT:-300s}
ONLY=${BENCH_ONLY:-.}
CITUS_URL=$BENCH_CITUS_URL
PLAIN_URL=$AIRLOCK_TEST_DATABASE_URL
RUN_ID="cc$(date +%s)$RANDOM"

# postmaster HOST PORT URL: the pid of the node's postmaster, from its data directory.
postmaster_of() {
	local dir pid
	dir=$(psql "$1" -qAtX -c "SHOW data_directory") || die "cannot reach $1"
	pid=$(head -n 1 "$dir/postmaster.pid" 2>/dev/null) || die "cannot read $dir/postmaster.pid (every node must run on this machine)"
	[ -r "/proc/$pid/stat" ] || die "postmaster $pid not visible in /proc"
	echo "$pid"
}
# with_port URL PORT: URL with its port replaced (the workers share the coordinator's host and user).
with_port() { sed -E "s#^(postgres(ql)?://[^/]*:)[0-9]+/#\1$2/#" <<<"$1"; }

[ "$(psql "$CITUS_URL" -qAtX -c "SELECT count(*) FROM pg_extension WHERE extname = 'citus'")" = 1 ] ||
	die "BENCH_CITUS_URL has no citus extension"
CITUS_PIDS=$(postmaster_of "$CITUS_URL")
WORKER_PORTS=$(psql "$CITUS_URL" -qAtX -c "SELECT nodeport FROM pg_dist_node WHERE noderole = 'primary' AND groupid <> 0 ORDER BY nodeport")
for p in $WORKER_PORTS; do
	CITUS_PIDS="$CITUS_PIDS $(postmaster_of "$(with_port "$CITUS_URL" "$p")")"
done
NWORKERS=$(wc -w <<<"$WORKER_PORTS")
[ "$NWORKERS" -ge 1 ] || die "the coordinator has no workers"
PLAIN_PIDS=$(postmaster_of "$PLAIN_URL")
if [ "${BENCH_STARTED_PLAIN:-}" = 1 ]; then
	# Ours, throwaway: as with-citus.sh's nodes (fsync off), so the disk is not what differs.
	psql "$PLAIN_URL" -qAtX -c "ALTER SYSTEM SET fsync = off" -c "SELECT pg_reload_conf()" >/dev/null
fi

BENCH_TMP=$(mktemp -d "${TMPDIR:-/tmp}/airlock-bench-cpu-citus.XXXXXX")
export BENCH_TMP
: >"$BENCH_TMP/pids"
: >"$BENCH_TMP/schemas"
FAILED=0

cleanup() {
	local rc=$?
	trap '' INT TERM HUP
	stop_instances
	local line
	while read -r line; do
		psql "${line%% *}" -qAtX -c "SET client_min_messages = warning" -c "DROP SCHEMA IF EXISTS ${line##* } CASCADE" >/dev/null 2>&1 || true
	done <"$BENCH_TMP/schemas"
	rm -rf "$BENCH_TMP"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# newschema BASEURL NAME: create schema NAME there and print a URL using it.
newschema() {
	psql "$1" -qAtX -v ON_ERROR_STOP=1 -c "CREATE SCHEMA $2" >/dev/null
	echo "$1 $2" >>"$BENCH_TMP/schemas"
	local sep="?"
	[[ $1 != *\?* ]] || sep="&"
	echo "$1${sep}search_path=$2"
}
dropschema() { psql "$1" -qAtX -c "SET client_min_messages = warning" -c "DROP SCHEMA IF EXISTS $2 CASCADE" >/dev/null 2>&1 || true; }

# write_policy FILE DISABLED PROVIDER_PORT
write_policy() {
	cat >"$1" <<EOF
actions:
  bench:
    connector: http
    gate: none
    http: {url: "http://127.0.0.1:$3/send", timeout: 10s}
dispatch:
  disabled: $2
  concurrency: 32
EOF
}

declare -A RES # "name field" → value

# record NAME OPS PG_TICKS PROC_TICKS RATE
record() {
	RES["$1 ops"]=$2
	RES["$1 rate"]=$5
	RES["$1 pg_us"]=$(awk -v t="$3" -v n="$2" 'BEGIN { if (n > 0) printf "%.0f", t * 1e4 / n }')
	RES["$1 proc_us"]=$(awk -v t="$4" -v n="$2" 'BEGIN { if (n > 0) printf "%.0f", t * 1e4 / n }')
	RES["$1 us"]=$(awk -v a="$3" -v b="$4" -v n="$2" 'BEGIN { if (n > 0) printf "%.0f", (a + b) * 1e4 / n }')
}
field() { { grep '^result ' "$1" || true; } | tail -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# claims NAME BASEURL PIDS
claims() {
	want claims || return 0
	log "$1: HTTP claims, $CLIENTS clients, ${SECS}s"
	local url key port pid pg0 pg1 p0 p1 n schema="${RUN_ID}_$1"
	url=$(newschema "$2" "$schema")
	AIRLOCK_DATABASE_URL=$url "$AIRLOCK" migrate >"$BENCH_TMP/$1.migrate" 2>&1 || {
		tail -n 5 "$BENCH_TMP/$1.migrate" >&2
		die "$1: migrate failed"
	}
	key=$(AIRLOCK_DATABASE_URL=$url "$AIRLOCK" apikey create --name bench --scope runs 2>/dev/null)
	port=$(free_port)
	AIRLOCK_DATABASE_URL="$url&pool_max_conns=$CLIENTS" AIRLOCK_LISTEN="127.0.0.1:$port" AIRLOCK_LOG_LEVEL=warn \
		"$AIRLOCK" serve >"$BENCH_TMP/$1.log" 2>&1 </dev/null &
	pid=$!
	echo "$pid" >>"$BENCH_TMP/pids"
	wait_ready "$port" "$pid" "$BENCH_TMP/$1.log"
	sleep 1
	# shellcheck disable=SC2086
	pg0=$(nodes_cpu $3)
	p0=$(proc_cpu "$pid")
	AIRLOCK_API_KEY=$key "$AIRLOCK" bench claims --url "http://127.0.0.1:$port" --concurrency "$CLIENTS" \
		--duration "${SECS}s" --duplicate-every 0 --baseline=false --cpu-pg-pid "${3%% *}" --cpu-pid "$pid" \
		>"$BENCH_TMP/$1.out" 2>&1 || {
		tail -n 5 "$BENCH_TMP/$1.out" >&2
		FAILED=1
	}
	p1=$(proc_cpu "$pid")
	stop_instances
	sleep 1 # the instance's backends exit and are reaped
	# shellcheck disable=SC2086
	pg1=$(nodes_cpu $3)
	n=$(field "$BENCH_TMP/$1.out" requests) # its own CPU fields count one postmaster: unused
	record "$1" "${n:-0}" $((pg1 - pg0)) $((p1 - p0)) "$(field "$BENCH_TMP/$1.out" rate)"
	dropschema "$2" "$schema"
}

# effects NAME BASEURL PIDS
effects() {
	want effects || return 0
	log "$1: $COUNT effects, dispatch.concurrency 32"
	local url key qport pport rc=0 pg1 p1 schema="${RUN_ID}_$1"
	url=$(newschema "$2" "$schema")
	AIRLOCK_DATABASE_URL=$url "$AIRLOCK" migrate >"$BENCH_TMP/$1.migrate" 2>&1 || {
		tail -n 5 "$BENCH_TMP/$1.migrate" >&2
		die "$1: migrate failed"
	}
	key=$(AIRLOCK_DATABASE_URL=$url "$AIRLOCK" apikey create --name bench --scope runs 2>/dev/null)
	qport=$(free_port)
	pport=$(free_port)
	write_policy "$BENCH_TMP/queue.yaml" true "$pport"
	write_policy "$BENCH_TMP/dispatch.yaml" false "$pport"
	start_instance queue "$qport" "$BENCH_TMP/queue.yaml" "$url&pool_max_conns=20"
	PG_PIDS=$3 "$AIRLOCK" bench effects --url "http://127.0.0.1:$qport" --api-key "$key" \
		--provider-listen "127.0.0.1:$pport" --count "$COUNT" --concurrency 16 --timeout "$TIMEOUT" \
		--then "bash '$SELF' __start '$url&pool_max_conns=20'" >"$BENCH_TMP/$1.out" 2>&1 || rc=$?
	p1=$(proc_cpu "$(cat "$BENCH_TMP/dispatcher.pid")")
	# shellcheck disable=SC2086
	pg1=$(nodes_cpu $3)
	stop_instances
	if [ "$rc" -ne 0 ] || [ "$(field "$BENCH_TMP/$1.out" duplicates)" != 0 ] || [ "$(field "$BENCH_TMP/$1.out" finished)" != true ]; then
		FAILED=1
		tail -n 5 "$BENCH_TMP/$1.out" >&2
	fi
	record "$1" "$(field "$BENCH_TMP/$1.out" completed)" $((pg1 - $(cat "$BENCH_TMP/drain.pg0"))) "$p1" "$(field "$BENCH_TMP/$1.out" rate)"
	dropschema "$2" "$schema"
}

log "building airlock"
(cd "$ROOT" && GOTOOLCHAIN=local go build -o "$BENCH_TMP/airlock" ./cmd/airlock)
AIRLOCK="$BENCH_TMP/airlock"
export AIRLOCK PG_PIDS=""

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
STARTED=$(date +%s)
for pass in $(seq 1 "$PASSES"); do
	claims "citus_claims_$pass" "$CITUS_URL" "$CITUS_PIDS"
	claims "plain_claims_$pass" "$PLAIN_URL" "$PLAIN_PIDS"
	effects "citus_effects_$pass" "$CITUS_URL" "$CITUS_PIDS"
	effects "plain_effects_$pass" "$PLAIN_URL" "$PLAIN_PIDS"
done

ms() { awk -v u="$1" 'BEGIN{ if (u=="") print "n/a"; else printf "%.2f", u/1000 }'; }
cell() {
	[ -n "${RES["$1 us"]:-}" ] || {
		echo "(not run)"
		return
	}
	printf '%s ms (DB %s, airlock %s), %.0f/s' "$(ms "${RES["$1 us"]}")" "$(ms "${RES["$1 pg_us"]}")" \
		"$(ms "${RES["$1 proc_us"]}")" "${RES["$1 rate"]:-0}"
}

echo
echo "== CPU per operation, Citus beside plain PostgreSQL: $(date -u '+%Y-%m-%d %H:%M') UTC, $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores, load $LOAD0 at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end, $(($(date +%s) - STARTED))s =="
echo "   Citus $(psql "$CITUS_URL" -qAtX -c "SELECT extversion FROM pg_extension WHERE extname = 'citus'"): coordinator + $NWORKERS workers, shard_count $(psql "$CITUS_URL" -qAtX -c 'SHOW citus.shard_count'), fsync $(psql "$CITUS_URL" -qAtX -c 'SHOW fsync'); plain PostgreSQL $(psql "$PLAIN_URL" -qAtX -c 'SHOW server_version'), fsync $(psql "$PLAIN_URL" -qAtX -c 'SHOW fsync')"
echo "   CPU = user+sys of the airlock serve doing the work + every node's cluster (Citus: coordinator and workers summed), /proc"
echo "   claims: $CLIENTS clients, ${SECS}s; effects: $COUNT, pre-filled, dispatch.concurrency 32, one HTTP POST each to a local no-op provider (dispatcher startup included)"
echo
printf '| %-8s | %-4s | %-40s | %-40s | %-9s | %-8s | %-10s |\n' "work" "pass" "Citus" "plain PostgreSQL" "CPU ratio" "DB ratio" "throughput"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' "----------" "------" "------------------------------------------" "------------------------------------------" "-----------" "----------" "------------"
for w in claims effects; do
	for pass in $(seq 1 "$PASSES"); do
		c="citus_${w}_$pass" p="plain_${w}_$pass"
		[ -n "${RES["$c us"]:-}${RES["$p us"]:-}" ] || continue
		printf '| %-8s | %-4s | %-40s | %-40s | %-9s | %-8s | %-10s |\n' "$w" "$pass" "$(cell "$c")" "$(cell "$p")" \
			"$(ratio "${RES["$c us"]:-}" "${RES["$p us"]:-}")×" "$(ratio "${RES["$c pg_us"]:-}" "${RES["$p pg_us"]:-}")×" \
			"$(ratio "${RES["$c rate"]:-}" "${RES["$p rate"]:-}")×"
	done
done

if [ "$FAILED" -ne 0 ]; then
	log "FAILED: a run failed, found duplicates or did not finish (see above)"
	exit 1
fi
