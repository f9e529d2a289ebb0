#!/usr/bin/env bash
# Usage: scripts/with-postgres.sh CMD [ARGS...]
#
# Starts a throwaway PostgreSQL cluster on a free 127.0.0.1 port, runs CMD with
#   AIRLOCK_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable
#   AIRLOCK_TEST_PG_RESTART=<command that restarts the cluster; append fast|immediate>
# exported, then stops the cluster and removes its files. Exits with CMD's exit code.
# If AIRLOCK_TEST_DATABASE_URL is already set, CMD runs against that server instead.
# The cluster's start and stop are scripts/lib/cluster.sh's, shared with with-citus.sh.
# shellcheck disable=SC2317 # cleanup runs from a trap
set -euo pipefail

LOG_NAME=with-postgres
# shellcheck source=scripts/lib/cluster.sh
. "$(dirname "$0")/lib/cluster.sh"

[ "$#" -gt 0 ] || die "usage: $0 CMD [ARGS...]"

if [ -n "${AIRLOCK_TEST_DATABASE_URL:-}" ]; then
	exec "$@"
fi

# --- locate PostgreSQL server binaries --------------------------------------
install_postgres() {
	command -v apt-get >/dev/null 2>&1 ||
		die "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found and apt-get is unavailable; install them, or set AIRLOCK_TEST_DATABASE_URL"
	local -a sudo=()
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null 2>&1 ||
			die "PostgreSQL server binaries not found; install the 'postgresql' package (needs root)"
		sudo=(sudo)
	fi
	log "PostgreSQL server binaries not found; installing package 'postgresql'"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql ||
		{ "${sudo[@]}" apt-get update && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql; } ||
		die "apt-get install postgresql failed"
}

if ! BINDIR=$(find_bindir); then
	install_postgres
	BINDIR=$(find_bindir) || die "PostgreSQL installed, but no initdb found via pg_config --bindir or /usr/lib/postgresql/*/bin"
fi
check_server_user

PORT=""
CLEANED=0
cleanup() {
	local rc=$?
	[ "$CLEANED" -eq 0 ] || return 0
	CLEANED=1
	trap '' INT TERM HUP
	if [ -n "$TMP" ] && [ -d "$TMP" ]; then
		if [ -f "$TMP/data/postmaster.pid" ]; then
			log "stopping PostgreSQL on 127.0.0.1:$PORT and removing $TMP"
			stop_cluster "$TMP/data"
		fi
		rm -rf "$TMP"
	fi
	exit "$rc"
}
trap_signals cleanup

# --- create the cluster and start it on a free port -------------------------
make_tmp airlock-pg
SERVER_LOG="$TMP/server.log"
log "creating a throwaway PostgreSQL cluster in $TMP (initdb: a few seconds)"
init_cluster "$TMP/data"
start_cluster "$TMP/data" "$SERVER_LOG" "-c listen_addresses=127.0.0.1 -k '$TMP/sock' -c max_connections=300" || exit 1
log "started it on 127.0.0.1:$PORT"
ready=0
for _ in $(seq 1 100); do
	if "$BINDIR/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres; then
		ready=1
		break
	fi
	sleep 0.1
done
[ "$ready" -eq 1 ] || { tail -n 40 "$SERVER_LOG" >&2; die "PostgreSQL on 127.0.0.1:$PORT does not answer"; }

export AIRLOCK_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$PORT/postgres?sslmode=disable"
# A command that restarts this cluster: append the shutdown mode (fast | immediate). The
# soak (scripts/soak.sh) uses it to restart PostgreSQL under load.
PG_CTL="$BINDIR/pg_ctl"
[ "$AS_ROOT" -eq 0 ] || PG_CTL="runuser -u postgres -- $BINDIR/pg_ctl"
export AIRLOCK_TEST_PG_RESTART="cd '$TMP' && $PG_CTL -D '$TMP/data' -l '$SERVER_LOG' -w -t 60 restart -m"
log "$("$BINDIR/postgres" --version) ready on 127.0.0.1:$PORT (data in $TMP)"

# --- run the command --------------------------------------------------------
run_command "$@"
